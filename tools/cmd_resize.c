/*
 * qcowkit resize: changes an image's virtual size the way `qemu-img resize`
 * does: absolute or relative (+SIZE, -SIZE) sizes, --shrink required to
 * make an image smaller, --preallocation for the new area, and qemu-img's
 * messages and exit codes (0 done, 1 anything else).
 *
 * Owns argument handling and the checks qemu-img makes before it touches
 * the image; the size change itself is the format driver's (qcow2:
 * src/qcow2/resize.c).
 */
#include "cmd.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit resize [-f FMT] [--shrink] [--preallocation=MODE] [-q] FILE [+|-]SIZE\n"
    "\n"
    "Changes the virtual size of FILE to SIZE, or by SIZE with + or -\n"
    "(k, M, G, T, P, E suffixes allowed; a negative size needs '--' before it,\n"
    "or may come first as the last argument: 'resize FILE -- -1G').\n"
    "  -f FMT              qcow2 or raw (default: probed)\n"
    "  --shrink            allow making the image smaller: data past the new end is lost\n"
    "  --preallocation=M   off (default), metadata (qcow2), falloc or full: how the\n"
    "                      new area is allocated (growing only)\n"
    "  -q                  quiet: do not print \"Image resized.\"\n";

static const char *const size_help =
    "Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\n"
    "and exabytes, respectively.\n";

typedef struct ResizeRun {
    QkBlock *bs;
    uint64_t size;
    QkPrealloc prealloc;
    QkError err;
    int ret;
} ResizeRun;

static void coroutine_fn resize_co(void *opaque)
{
    ResizeRun *r = opaque;
    r->ret = qk_co_truncate(r->bs, r->size, r->prealloc, &r->err);
}

static int parse_prealloc(const char *s, QkPrealloc *p)
{
    static const char *const names[] = {"off", "metadata", "falloc", "full"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *p = (QkPrealloc)i;
            return 0;
        }
    }
    return -1;
}

/* "[+|-]SIZE": *sign is +1, -1 or 0 (absolute). */
static int parse_size_arg(const char *arg, int *sign, uint64_t *n)
{
    *sign = arg[0] == '+' ? 1 : arg[0] == '-' ? -1 : 0;
    int r = qk_tool_size(*sign ? arg + 1 : arg, n);
    if (r == -ERANGE) {
        qk_tool_error("Value '%s' is out of range for parameter 'size'", *sign ? arg + 1 : arg);
        return -1;
    }
    if (r < 0) {
        qk_tool_error("Parameter 'size' expects a non-negative number below 2^64");
        fputs(size_help, stderr);
        return -1;
    }
    return 0;
}

static int run_resize(int argc, char **argv)
{
    /* The size goes before option parsing, as qemu-img takes it, so that
     * "-1G" is a size and not an option. */
    if (argc < 3) {
        return qk_tool_usage_error("%s", "Not enough arguments");
    }
    const char *size_arg = argv[argc - 1];
    argc--;
    const char *fmt = NULL;
    bool quiet = false, shrink = false;
    QkPrealloc prealloc = QK_PREALLOC_OFF;
    bool prealloc_set = false;
    enum { OPT_SHRINK = 256, OPT_PREALLOC };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"shrink", no_argument, NULL, OPT_SHRINK},
        {"preallocation", required_argument, NULL, OPT_PREALLOC},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":f:qh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            fmt = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case OPT_SHRINK:
            shrink = true;
            break;
        case OPT_PREALLOC:
            if (parse_prealloc(optarg, &prealloc) < 0) {
                qk_tool_error("Invalid preallocation mode '%s'", optarg);
                return 1;
            }
            prealloc_set = true;
            break;
        case ':':
            return qk_tool_usage_error("missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_usage_error("%s", "Expecting image file name and size");
    }
    const char *filename = argv[optind];
    int sign;
    uint64_t n;
    if (parse_size_arg(size_arg, &sign, &n) < 0) {
        return 1;
    }

    QkError err = {0};
    QkBlock *bs = qk_tool_open(filename, fmt, QK_OPEN_RDWR, &err);
    if (!bs) {
        qk_tool_error("Could not open '%s': %s", filename, err.msg);
        return 1;
    }
    int ret = 1;
    int64_t cur = qk_block_length(bs);
    uint64_t size = n;
    if (cur < 0) {
        qk_tool_error("Could not get the image's size: %s", strerror((int)-cur));
        goto out;
    }
    if (sign > 0) {
        size = (uint64_t)cur + n;
        if (size < n) {
            size = UINT64_MAX; /* refused below */
        }
    } else if (sign < 0) {
        size = n >= (uint64_t)cur ? 0 : (uint64_t)cur - n;
    }
    if (size == 0 || size > INT64_MAX) {
        qk_tool_error("New image size must be positive");
        goto out;
    }
    if (prealloc_set && prealloc != QK_PREALLOC_OFF && size <= (uint64_t)cur) {
        qk_tool_error("Preallocation can only be used for growing images");
        goto out;
    }
    if (size < (uint64_t)cur && !shrink) {
        qk_tool_error("Use the --shrink option to perform a shrink operation.");
        fprintf(stderr, "%s: warning: Shrinking an image will delete all data beyond the shrunken image's end. "
                        "Before performing such an operation, make sure there is no important data there.\n",
                qk_progname);
        goto out;
    }
    if (prealloc == QK_PREALLOC_METADATA && strcmp(qk_block_format_name(bs), "qcow2") != 0) {
        qk_tool_error("Unsupported preallocation mode: metadata");
        goto out;
    }
    ResizeRun r = {.bs = bs, .size = size, .prealloc = prealloc};
    qk_co_run(resize_co, &r);
    if (r.ret < 0) {
        qk_tool_error("%s", r.err.msg[0] ? r.err.msg : strerror(-r.ret));
        goto out;
    }
    ret = 0;
out:
    return qk_tool_close_written(bs, ret, quiet, "Image resized.");
}

const QkCommand qk_cmd_resize = {
    .name = "resize",
    .summary = "change an image's virtual size (grow, or shrink with --shrink)",
    .usage = usage_text,
    .run = run_resize,
};
