/*
 * qcowkit create: makes a new qcow2 or raw image, with qemu-img create's
 * options, its "Formatting ..." line and its error wording.
 *
 * Owns option parsing (-o lists) and the checks qemu-img makes before it
 * writes anything; the image itself is written by the block layer.
 */
#include "cmd.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the user said, as strings where qemu-img echoes them back. */
typedef struct CreateArgs {
    QkToolCreateOpts c;
    const char *fmt;
    const char *filename;
} CreateArgs;

static const char *const usage_text =
    "Usage: qcowkit create [-q] [-f FMT] [-b BACKING -F BACKING_FMT] [-o OPTIONS] FILE [SIZE]\n"
    "\n"
    "Creates a new image FILE of SIZE bytes (k, M, G, T suffixes allowed).\n"
    "  -f FMT        qcow2 or raw (default raw)\n"
    "  -b BACKING    backing file; SIZE defaults to its size\n"
    "  -F FMT        format of the backing file (required with -b)\n"
    "  -o OPTIONS    comma-separated name=value list; '-o help' lists them:\n"
    "                cluster_size, refcount_bits, lazy_refcounts, compat,\n"
    "                preallocation, backing_file, backing_fmt, extended_l2,\n"
    "                compression_type, size\n"
    "  -q            quiet: do not print the \"Formatting\" line\n";

static bool is_qcow2(const CreateArgs *a)
{
    return strcmp(a->fmt, "qcow2") == 0;
}

static void print_formatting(const CreateArgs *a)
{
    const QkCreateOptions *o = &a->c.o;
    printf("Formatting '%s', fmt=%s", a->filename, a->fmt);
    if (!is_qcow2(a)) {
        printf(" size=%" PRIu64, o->size);
        if (a->c.prealloc) {
            printf(" preallocation=%s", a->c.prealloc);
        }
        printf("\n");
        return;
    }
    printf(" cluster_size=%u extended_l2=%s", o->cluster_size ? o->cluster_size : 65536,
           o->extended_l2 ? "on" : "off");
    if (a->c.prealloc) {
        printf(" preallocation=%s", a->c.prealloc);
    }
    printf(" compression_type=%s size=%" PRIu64, a->c.compression, o->size);
    if (o->backing_file) {
        printf(" backing_file=%s", o->backing_file);
    }
    if (o->backing_fmt) {
        printf(" backing_fmt=%s", o->backing_fmt);
    }
    if (a->c.compat) {
        printf(" compat=%s", a->c.compat);
    }
    if (o->data_file) {
        printf(" data_file=%s", o->data_file);
    }
    if (a->c.data_file_raw) {
        printf(" data_file_raw=%s", a->c.data_file_raw);
    }
    printf(" lazy_refcounts=%s refcount_bits=%u\n", a->c.lazy, o->refcount_bits ? o->refcount_bits : 16);
    fflush(stdout);
}

/* Opens the backing file the way the new image will (relative to it), to
 * check it and to learn its size. */
static int probe_backing(CreateArgs *a, uint64_t *size)
{
    char *path = qk_block_backing_path(a->filename, a->c.o.backing_file);
    QkError err = {0};
    QkBlock *bs = qk_tool_open(path ? path : a->c.o.backing_file, a->c.o.backing_fmt, QK_OPEN_FORCE_SHARE, &err);
    free(path);
    if (!bs) {
        qk_tool_error("%s: Could not open backing image: %s", a->filename, err.msg);
        return -1;
    }
    *size = (uint64_t)qk_block_length(bs);
    qk_block_close(bs);
    return 0;
}

static int run(int argc, char **argv)
{
    CreateArgs a = {.fmt = "raw", .c = {.compression = "zlib", .lazy = "off"}};
    bool quiet = false, unsafe = false;
    char *opt_lists[32];
    int nlists = 0;
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":f:b:F:o:qhu", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': a.fmt = optarg; break;
        case 'b': a.c.o.backing_file = optarg; break;
        case 'F': a.c.o.backing_fmt = optarg; break;
        case 'q': quiet = true; break;
        case 'u': unsafe = a.c.o.backing_unchecked = true; break; /* the backing file is not opened */
        case 'o':
            if (nlists == (int)(sizeof(opt_lists) / sizeof(opt_lists[0]))) {
                return qk_tool_bad_usage("create", "too many -o options");
            }
            opt_lists[nlists++] = optarg;
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("create", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("create", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (strcmp(a.fmt, "qcow2") != 0 && strcmp(a.fmt, "raw") != 0) {
        const char *name = optind < argc ? argv[optind] : "";
        qk_tool_error("%s: Unknown file format '%s'", name, a.fmt);
        return 1;
    }
    if (qk_tool_opt_lists_want_help(opt_lists, nlists)) {
        qk_tool_create_opts_help(is_qcow2(&a), is_qcow2(&a) ? "qcow2 " : "raw ");
        return 0;
    }
    if (optind >= argc) {
        return qk_tool_bad_usage("create", "Expecting image file name");
    }
    a.filename = argv[optind++];
    a.c.o.format = a.fmt;
    char prefix[4096];
    snprintf(prefix, sizeof(prefix), "%s: ", a.filename);
    /* -b and -F win over backing_file and backing_fmt in -o, as in qemu-img. */
    const char *cli_backing = a.c.o.backing_file, *cli_backing_fmt = a.c.o.backing_fmt;
    for (int i = 0; i < nlists; i++) {
        if (qk_tool_create_opts_parse(&a.c, is_qcow2(&a), opt_lists[i], prefix) < 0) {
            return 1;
        }
    }
    if (cli_backing) {
        a.c.o.backing_file = cli_backing;
    }
    if (cli_backing_fmt) {
        a.c.o.backing_fmt = cli_backing_fmt;
    }
    if (optind < argc && a.c.o.size_set) {
        qk_tool_error("%s: The image size must be specified only once", a.filename);
        return 1;
    }
    if (optind < argc) {
        const char *s = argv[optind++];
        if (qk_tool_cvtnum("image size", s, 0, INT64_MAX, &a.c.o.size) < 0) {
            return 1;
        }
        a.c.o.size_set = true;
    }
    if (optind < argc) {
        return qk_tool_bad_usage("create", "Unexpected argument: %s", argv[optind]);
    }
    if (a.c.o.backing_file && !is_qcow2(&a)) {
        qk_tool_error("%s: Backing file not supported for file format '%s'", a.filename, a.fmt);
        return 1;
    }
    if (a.c.o.backing_file && !a.c.o.backing_fmt) {
        qk_tool_error("%s: Backing file specified without backing format", a.filename);
        return 1;
    }
    if (!a.c.o.size_set && (!a.c.o.backing_file || unsafe)) {
        qk_tool_error("%s: Image creation needs a size parameter", a.filename);
        return 1;
    }
    if (a.c.o.backing_file) {
        uint64_t bsize = 0;
        if (!qk_format_known(a.c.o.backing_fmt)) {
            qk_tool_error("%s: Unknown driver '%s'", a.filename, a.c.o.backing_fmt);
            return 1;
        }
        if (!unsafe && probe_backing(&a, &bsize) < 0) {
            return 1;
        }
        if (!a.c.o.size_set) {
            a.c.o.size = bsize;
            a.c.o.size_set = true;
        }
    }
    if (!quiet) {
        print_formatting(&a);
    }
    char why[1024];
    const char *msg = qk_tool_create_opts_check(&a.c, is_qcow2(&a), why, sizeof(why));
    if (msg) {
        qk_tool_error("%s: %s", a.filename, msg);
        return 1;
    }
    QkError err = {0};
    if (qk_block_create(a.filename, &a.c.o, &err) < 0) {
        qk_tool_error("%s: %s", a.filename, err.msg);
        return 1;
    }
    return 0;
}

const QkCommand qk_cmd_create = {
    .name = "create",
    .summary = "create a new qcow2 or raw image",
    .usage = usage_text,
    .run = run,
};
