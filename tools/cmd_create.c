/*
 * qcowkit create: makes a new qcow2 or raw image, with qemu-img create's
 * options, its "Formatting ..." line and its error wording.
 *
 * Owns option parsing (-o lists) and the checks qemu-img makes before it
 * writes anything; the image itself is written by the block layer.
 */
#include "cmd.h"
#include "util/size.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the user said, as strings where qemu-img echoes them back. */
typedef struct CreateArgs {
    QkCreateOptions o;
    const char *fmt;
    const char *filename;
    const char *prealloc;      /* as given, NULL when not given */
    const char *compat;        /* as given, NULL when not given */
    const char *compression;   /* as given */
    const char *lazy;          /* as given ("off" by default) */
    bool cluster_size_set;
} CreateArgs;

static const char *const qcow2_opts_help =
    "Supported qcow2 options:\n"
    "  backing_file=<str>     - File name of a base image\n"
    "  backing_fmt=<str>      - Image format of the base image\n"
    "  cluster_size=<size>    - qcow2 cluster size\n"
    "  compat=<str>           - Compatibility level (v2 [0.10] or v3 [1.1])\n"
    "  compression_type=<str> - Compression method used for image cluster compression\n"
    "  extended_l2=<bool (on/off)> - Extended L2 tables\n"
    "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
    "  preallocation=<str>    - Preallocation mode (allowed values: off, metadata, falloc, full)\n"
    "  refcount_bits=<num>    - Width of a reference count entry in bits\n"
    "  size=<size>            - Virtual disk size\n";

static const char *const raw_opts_help =
    "Supported raw options:\n"
    "  preallocation=<str>    - Preallocation mode (allowed values: off, falloc, full)\n"
    "  size=<size>            - Virtual disk size\n";

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

static int parse_opt_size(const char *name, const char *v, uint64_t *out)
{
    if (qk_parse_size(v, out) < 0) {
        qk_tool_error("Parameter '%s' expects a non-negative number below 2^64", name);
        return -1;
    }
    return 0;
}

static bool is_qcow2(const CreateArgs *a)
{
    return strcmp(a->fmt, "qcow2") == 0;
}

/* One name=value of an -o list. Syntax errors only; meaning is checked later
 * (after the "Formatting" line, where qemu-img checks it too). */
static int apply_opt(CreateArgs *a, char *kv)
{
    char *eq = strchr(kv, '=');
    const char *name = kv;
    const char *v = "on";
    if (eq) {
        *eq = '\0';
        v = eq + 1;
    }
    uint64_t n;
    bool q = is_qcow2(a);
    if (strcmp(name, "size") == 0) {
        if (parse_opt_size(name, v, &n) < 0) {
            return -1;
        }
        a->o.size = n;
        a->o.size_set = true;
    } else if (strcmp(name, "preallocation") == 0) {
        a->prealloc = v;
    } else if (q && strcmp(name, "cluster_size") == 0) {
        if (parse_opt_size(name, v, &n) < 0) {
            return -1;
        }
        a->o.cluster_size = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
        a->cluster_size_set = true;
    } else if (q && strcmp(name, "refcount_bits") == 0) {
        if (qk_parse_uint(v, &n) < 0) {
            qk_tool_error("Parameter '%s' expects a number", name);
            return -1;
        }
        a->o.refcount_bits = n > 1024 ? 1024 : (uint32_t)n;
    } else if (q && strcmp(name, "lazy_refcounts") == 0) {
        if (qk_tool_parse_bool(name, v, &a->o.lazy_refcounts) < 0) {
            return -1;
        }
        a->lazy = v;
    } else if (q && strcmp(name, "extended_l2") == 0) {
        if (qk_tool_parse_bool(name, v, &a->o.extended_l2) < 0) {
            return -1;
        }
    } else if (q && strcmp(name, "compat") == 0) {
        a->compat = v;
    } else if (q && strcmp(name, "compression_type") == 0) {
        a->compression = v;
    } else if (q && strcmp(name, "backing_file") == 0) {
        a->o.backing_file = v;
    } else if (q && strcmp(name, "backing_fmt") == 0) {
        a->o.backing_fmt = v;
    } else {
        qk_tool_error("%s: Invalid parameter '%s'", a->filename, name);
        return -1;
    }
    return 0;
}

static int apply_opt_list(CreateArgs *a, char *list)
{
    char *save = NULL;
    bool any = false;
    for (char *kv = strtok_r(list, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        if (apply_opt(a, kv) < 0) {
            return -1;
        }
        any = true;
    }
    if (!any) {
        qk_tool_error("Invalid option list: %s", list);
        return -1;
    }
    return 0;
}

static void print_formatting(const CreateArgs *a)
{
    const QkCreateOptions *o = &a->o;
    printf("Formatting '%s', fmt=%s", a->filename, a->fmt);
    if (!is_qcow2(a)) {
        printf(" size=%" PRIu64, o->size);
        if (a->prealloc) {
            printf(" preallocation=%s", a->prealloc);
        }
        printf("\n");
        return;
    }
    printf(" cluster_size=%u extended_l2=%s", o->cluster_size ? o->cluster_size : 65536,
           o->extended_l2 ? "on" : "off");
    if (a->prealloc) {
        printf(" preallocation=%s", a->prealloc);
    }
    printf(" compression_type=%s size=%" PRIu64, a->compression, o->size);
    if (o->backing_file) {
        printf(" backing_file=%s", o->backing_file);
    }
    if (o->backing_fmt) {
        printf(" backing_fmt=%s", o->backing_fmt);
    }
    if (a->compat) {
        printf(" compat=%s", a->compat);
    }
    printf(" lazy_refcounts=%s refcount_bits=%u\n", a->lazy, o->refcount_bits ? o->refcount_bits : 16);
    fflush(stdout);
}

static int parse_prealloc(const char *s, bool qcow2, QkPrealloc *p)
{
    static const char *const names[] = {"off", "metadata", "falloc", "full"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0 && (qcow2 || i != QK_PREALLOC_METADATA)) {
            *p = (QkPrealloc)i;
            return 0;
        }
    }
    return -1;
}

/* The semantic checks qemu-img makes once it has printed "Formatting". */
static int validate(CreateArgs *a)
{
    QkCreateOptions *o = &a->o;
    const char *f = a->filename;
    if (a->prealloc && parse_prealloc(a->prealloc, is_qcow2(a), &o->prealloc) < 0) {
        qk_tool_error("%s: Parameter 'preallocation' does not accept value '%s'", f, a->prealloc);
        return -1;
    }
    if (!is_qcow2(a)) {
        return 0;
    }
    if (a->compat) {
        if (strcmp(a->compat, "0.10") == 0 || strcmp(a->compat, "v2") == 0) {
            o->compat = 2;
        } else if (strcmp(a->compat, "1.1") == 0 || strcmp(a->compat, "v3") == 0) {
            o->compat = 3;
        } else {
            qk_tool_error("%s: Parameter 'version' does not accept value '%s'", f, a->compat);
            return -1;
        }
    }
    if (strcmp(a->compression, "zlib") == 0) {
        o->compression_type = 0;
    } else if (strcmp(a->compression, "zstd") == 0) {
        o->compression_type = 1;
    } else {
        qk_tool_error("%s: Parameter 'compression-type' does not accept value '%s'", f, a->compression);
        return -1;
    }
    uint32_t cs = o->cluster_size ? o->cluster_size : 65536;
    if (a->cluster_size_set && (cs < 512 || cs > (2u << 20) || (cs & (cs - 1)))) {
        qk_tool_error("%s: Cluster size must be a power of two between 512 and 2048k", f);
        return -1;
    }
    uint32_t rb = o->refcount_bits ? o->refcount_bits : 16;
    if (rb > 64 || (rb & (rb - 1)) || rb == 0) {
        qk_tool_error("%s: Refcount width must be a power of two and may not exceed 64 bits", f);
        return -1;
    }
    const char *v3 = "compatibility level 1.1 and above (use version=v3 or greater)";
    if (o->compat == 2) {
        if (o->lazy_refcounts) {
            qk_tool_error("%s: Lazy refcounts only supported with %s", f, v3);
            return -1;
        }
        if (rb != 16) {
            qk_tool_error("%s: Different refcount widths than 16 bits require %s", f,
                          "compatibility level 1.1 or above (use version=v3 or greater)");
            return -1;
        }
        if (o->compression_type != 0) {
            qk_tool_error("%s: Non-zlib compression type is only supported with %s", f, v3);
            return -1;
        }
        if (o->extended_l2) {
            qk_tool_error("%s: Extended L2 entries are only supported with %s", f, v3);
            return -1;
        }
    }
    if (o->extended_l2 && cs < 16384) {
        qk_tool_error("%s: Extended L2 entries are only supported with cluster sizes of at least 16384 bytes", f);
        return -1;
    }
    if (o->backing_fmt && !o->backing_file) {
        qk_tool_error("%s: Backing format cannot be used without backing file", f);
        return -1;
    }
    if (o->backing_file && o->prealloc != QK_PREALLOC_OFF && !o->extended_l2) {
        qk_tool_error("%s: Backing file and preallocation can only be used at the same time if extended_l2 is on", f);
        return -1;
    }
    return 0;
}

/* Opens the backing file the way the new image will (relative to it), to
 * check it and to learn its size. */
static int probe_backing(CreateArgs *a, uint64_t *size)
{
    char *path = qk_block_backing_path(a->filename, a->o.backing_file);
    QkError err = {0};
    QkBlock *bs = qk_tool_open(path ? path : a->o.backing_file, a->o.backing_fmt, QK_OPEN_FORCE_SHARE, &err);
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
    CreateArgs a = {.fmt = "raw", .compression = "zlib", .lazy = "off"};
    bool quiet = false;
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
        case 'b': a.o.backing_file = optarg; break;
        case 'F': a.o.backing_fmt = optarg; break;
        case 'q': quiet = true; break;
        case 'u': break; /* qemu-img's "unsafe": the backing is only opened when needed */
        case 'o':
            if (nlists == (int)(sizeof(opt_lists) / sizeof(opt_lists[0]))) {
                return qk_tool_bad_usage("create", "too many -o options");
            }
            opt_lists[nlists++] = optarg;
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("create", "option '%s' needs an argument", argv[optind - 1]);
        default: return qk_tool_bad_usage("create", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (strcmp(a.fmt, "qcow2") != 0 && strcmp(a.fmt, "raw") != 0) {
        const char *name = optind < argc ? argv[optind] : "";
        qk_tool_error("%s: Unknown file format '%s'", name, a.fmt);
        return 1;
    }
    for (int i = 0; i < nlists; i++) {
        if (strcmp(opt_lists[i], "help") == 0 || strcmp(opt_lists[i], "?") == 0) {
            fputs(is_qcow2(&a) ? qcow2_opts_help : raw_opts_help, stdout);
            return 0;
        }
    }
    if (optind >= argc) {
        return qk_tool_bad_usage("create", "Expecting image file name");
    }
    a.filename = argv[optind++];
    a.o.format = a.fmt;
    for (int i = 0; i < nlists; i++) {
        if (apply_opt_list(&a, opt_lists[i]) < 0) {
            return 1;
        }
    }
    if (optind < argc) {
        const char *s = argv[optind++];
        if (qk_parse_size(s, &a.o.size) < 0) {
            qk_tool_error("Invalid image size specified. You may use k, M, G, T, P or E suffixes "
                          "for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.");
            return 1;
        }
        if (a.o.size > INT64_MAX) {
            qk_tool_error("Invalid image size specified. Must be between 0 and 9223372036854775807.");
            return 1;
        }
        a.o.size_set = true;
    }
    if (optind < argc) {
        return qk_tool_bad_usage("create", "Unexpected argument: %s", argv[optind]);
    }
    if (a.o.backing_file && !is_qcow2(&a)) {
        qk_tool_error("%s: Backing file not supported for file format '%s'", a.filename, a.fmt);
        return 1;
    }
    if (a.o.backing_file && !a.o.backing_fmt) {
        qk_tool_error("%s: Backing file specified without backing format", a.filename);
        return 1;
    }
    if (!a.o.size_set && !a.o.backing_file) {
        qk_tool_error("%s: Image creation needs a size parameter", a.filename);
        return 1;
    }
    if (a.o.backing_file) {
        uint64_t bsize;
        if (!qk_block_find_driver(a.o.backing_fmt)) {
            qk_tool_error("%s: Unknown driver '%s'", a.filename, a.o.backing_fmt);
            return 1;
        }
        if (probe_backing(&a, &bsize) < 0) {
            return 1;
        }
        if (!a.o.size_set) {
            a.o.size = bsize;
            a.o.size_set = true;
        }
    }
    if (!quiet) {
        print_formatting(&a);
    }
    if (validate(&a) < 0) {
        return 1;
    }
    QkError err = {0};
    if (qk_block_create(a.filename, &a.o, &err) < 0) {
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
