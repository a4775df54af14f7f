/*
 * qcowkit check: runs the qcow2 driver's consistency check (and, with -r,
 * repair) and reports it with qemu-img check's wording, JSON keys and exit
 * codes: 0 clean, 1 the check could not complete, 2 corruptions, 3 only
 * leaks, 63 the format has no check.
 */
#include "cmd.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit check [-f FMT] [--output=human|json] [-r leaks|all] [-q] [-U] FILE\n"
    "\n"
    "Checks a qcow2 image's metadata for consistency.\n"
    "  -r leaks     repair leaked clusters\n"
    "  -r all       repair leaks and errors\n"
    "  -q           quiet: print nothing but problems\n"
    "Exit status: 0 no errors, 1 the check could not complete, 2 corruptions,\n"
    "3 leaked clusters only, 63 the format does not support checks.\n";

#define EXIT_NO_CHECK 63

typedef struct CheckRun {
    QkBlock *bs;
    int fix;
    QkCheckResult res;
    QkError err;
    int ret;
} CheckRun;

static void report_line(void *opaque, const char *line)
{
    (void)opaque;
    fflush(stdout);
    fprintf(stderr, "%s\n", line);
}

static void coroutine_fn check_entry(void *opaque)
{
    CheckRun *c = opaque;
    c->ret = qk_qcow2_co_check(c->bs, c->fix, &c->res, report_line, NULL, &c->err);
}

static void print_human(const QkCheckResult *r)
{
    if (!r->corruptions && !r->leaks && !r->check_errors) {
        printf("No errors were found on the image.\n");
    } else {
        if (r->corruptions) {
            printf("\n%d errors were found on the image.\n"
                   "Data may be corrupted, or further writes to the image may corrupt it.\n",
                   r->corruptions);
        }
        if (r->leaks) {
            printf("\n%d leaked clusters were found on the image.\n"
                   "This means waste of disk space, but no harm to data.\n", r->leaks);
        }
        if (r->check_errors) {
            printf("\n%d internal errors have occurred during the check.\n", r->check_errors);
        }
    }
    if (r->total_clusters && r->allocated_clusters) {
        double alloc = (double)r->allocated_clusters;
        printf("%" PRIu64 "/%" PRIu64 " = %0.2f%% allocated, %0.2f%% fragmented, "
               "%0.2f%% compressed clusters\n",
               r->allocated_clusters, r->total_clusters, alloc * 100.0 / (double)r->total_clusters,
               (double)r->fragmented_clusters * 100.0 / alloc,
               (double)r->compressed_clusters * 100.0 / alloc);
    }
    if (r->image_end_offset) {
        printf("Image end offset: %" PRIu64 "\n", r->image_end_offset);
    }
}

static void set_nonzero(json_t *o, const char *key, uint64_t v)
{
    if (v) {
        json_object_set_new(o, key, json_integer((json_int_t)v));
    }
}

/* Keys in the order qemu-img prints them; counters only when non-zero. */
static void print_json(const QkCheckResult *r, const char *filename, const char *format)
{
    json_t *o = json_object();
    set_nonzero(o, "image-end-offset", r->image_end_offset);
    set_nonzero(o, "compressed-clusters", r->compressed_clusters);
    set_nonzero(o, "total-clusters", r->total_clusters);
    set_nonzero(o, "corruptions-fixed", (uint64_t)r->corruptions_fixed);
    set_nonzero(o, "corruptions", (uint64_t)r->corruptions);
    json_object_set_new(o, "check-errors", json_integer(r->check_errors));
    set_nonzero(o, "leaks", (uint64_t)r->leaks);
    set_nonzero(o, "leaks-fixed", (uint64_t)r->leaks_fixed);
    set_nonzero(o, "allocated-clusters", r->allocated_clusters);
    json_object_set_new(o, "filename", json_string(filename));
    json_object_set_new(o, "format", json_string(format));
    set_nonzero(o, "fragmented-clusters", r->fragmented_clusters);
    qk_tool_print_json(o);
    json_decref(o);
}

static int run(int argc, char **argv)
{
    enum { OPT_OUTPUT = 256 };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"format", required_argument, NULL, 'f'},
        {"repair", required_argument, NULL, 'r'},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL;
    bool json = false, quiet = false;
    CheckRun c = {0};
    int flags = QK_OPEN_CHECK | QK_OPEN_NO_BACKING, opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":f:r:qhU", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f': fmt = optarg; break;
        case 'q': quiet = true; break;
        case 'U': flags |= QK_OPEN_FORCE_SHARE; break;
        case 'r':
            if (strcmp(optarg, "leaks") == 0) {
                c.fix = QK_CHECK_FIX_LEAKS;
            } else if (strcmp(optarg, "all") == 0) {
                c.fix = QK_CHECK_FIX_LEAKS | QK_CHECK_FIX_ERRORS;
            } else {
                return qk_tool_bad_usage("check", "Unknown option value for -r (expecting 'leaks' or 'all'): %s",
                                         optarg);
            }
            flags |= QK_OPEN_RDWR;
            break;
        case OPT_OUTPUT:
            if (qk_tool_parse_output("check", optarg, &json) < 0) {
                return 1;
            }
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("check", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("check", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("check", "Expecting one image file name");
    }
    const char *filename = argv[optind];
    QkError err = {0};
    c.bs = qk_tool_open(filename, fmt, flags, &err);
    if (!c.bs) {
        qk_tool_error("Could not open '%s': %s", filename, err.msg);
        return 1;
    }
    if (!qk_block_is_qcow2(c.bs)) {
        qk_block_close(c.bs);
        qk_tool_error("This image format does not support checks");
        return EXIT_NO_CHECK;
    }
    qk_co_run(check_entry, &c);
    const char *format = qk_block_format_name(c.bs);
    int status;
    if (c.ret < 0) {
        qk_tool_error("Check failed: %s", c.err.msg[0] ? c.err.msg : strerror(-c.ret));
        status = 1;
    } else {
        const QkCheckResult *r = &c.res;
        if (r->leaks_fixed || r->corruptions_fixed) {
            if (!json && !quiet) {
                printf("The following inconsistencies were found and repaired:\n\n"
                       "    %d leaked clusters\n    %d corruptions\n\n"
                       "Double checking the fixed image now...\n",
                       r->leaks_fixed, r->corruptions_fixed);
            }
        }
        if (json) {
            print_json(r, filename, format);
        } else if (!quiet) {
            print_human(r);
        }
        status = r->check_errors ? 1 : r->corruptions ? 2 : r->leaks ? 3 : 0;
        if (r->check_errors) {
            qk_tool_error("Check failed");
        }
    }
    fflush(stdout);
    int cr = qk_block_close(c.bs);
    if (cr < 0) {
        qk_tool_error("%s: closing the image failed: %s", filename, strerror(-cr));
        status = 1;
    }
    return status;
}

const QkCommand qk_cmd_check = {
    .name = "check",
    .summary = "check (and repair) an image's metadata",
    .usage = usage_text,
    .run = run,
};
