/*
 * qcowkit dd: copies part of an image into a new one (qemu-img dd):
 * operands bs=, count=, skip=, if=, of=; the output is created in format
 * -O (raw by default) with the size qemu-img gives it, including its
 * arithmetic for count with skip (the copy ends at count*bs of the input,
 * not count blocks past the skip). Same messages and exit codes.
 *
 * Owns operand parsing and the size rules; the copy skips ranges the
 * input knows to be zeros (the new output already reads as zeros there)
 * and runs as parallel slices (jobs/slices.c).
 */
#include "cmd.h"
#include "common/checked.h"

#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit dd [-U] [-f FMT] [-O OUTPUT_FMT] [bs=BLOCK_SIZE] [count=BLOCKS] [skip=BLOCKS] if=INPUT of=OUTPUT\n"
    "\n"
    "Copies INPUT from block SKIP on into a new image OUTPUT (replaced if it\n"
    "exists), up to block COUNT of INPUT. Sizes take k, M, G, T, P, E suffixes.\n"
    "  -f FMT         format of INPUT (default: probed)\n"
    "  -O FMT         format of OUTPUT: raw (default) or qcow2\n"
    "  -U             open INPUT even if another process uses it\n"
    "  bs=N           block size (default 512)\n"
    "  count=N        copy only up to block N of INPUT\n"
    "  skip=N         start at block N of INPUT\n";

#define MAX_IO (1u << 20)

typedef struct DdRun {
    QkBlock *in, *out;
    uint64_t start;   /* first input byte copied (output byte 0) */
    uint64_t end;     /* input byte the copy stops at */
    int ret;
} DdRun;

/* Copies output range [off, off+len) from the input at off+start. */
static int coroutine_fn copy_slice(void *opaque, uint64_t off, uint64_t len, void *buf)
{
    DdRun *d = opaque;
    while (len) {
        uint64_t n = 0;
        int depth = 0;
        uint64_t src = d->start + off;
        int st = qk_co_block_status_above(d->in, src, QK_MIN(len, (uint64_t)MAX_IO), &n, &depth);
        if (st < 0) {
            return st;
        }
        if (n == 0) {
            return -EIO;
        }
        /* The output is new: it reads as zeros until written. */
        if (!(st & QK_BS_ZERO) && ((st & QK_BS_DATA) || (st & QK_BS_ALLOCATED))) {
            int r = qk_co_pread(d->in, src, n, buf, 0);
            if (r == 0) {
                r = qk_co_pwrite(d->out, off, n, buf, 0);
            }
            if (r < 0) {
                return r;
            }
        }
        off += n;
        len -= n;
    }
    return 0;
}

static void coroutine_fn dd_co(void *opaque)
{
    DdRun *d = opaque;
    uint64_t len = d->end - d->start;
    d->ret = qk_co_run_slices(len, 4u << 20, 8, MAX_IO, QK_MAX(4096u, QK_MAX(qk_block_mem_alignment(d->in), qk_block_mem_alignment(d->out))),
                              copy_slice, d);
    if (d->ret == 0) {
        d->ret = qk_co_flush(d->out);
    }
}

static int run_dd(int argc, char **argv)
{
    const char *fmt = NULL, *out_fmt = "raw", *in_name = NULL, *out_name = NULL;
    int in_flags = 0;
    uint64_t bs = 512, count = 0, skip = 0;
    bool have_count = false, have_skip = false;
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":f:O:Uh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            fmt = optarg;
            break;
        case 'O':
            out_fmt = optarg;
            break;
        case 'U':
            in_flags |= QK_OPEN_FORCE_SHARE;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            return qk_tool_bad_usage("dd", "missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_bad_usage("dd", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t kl = eq ? (size_t)(eq - a) : strlen(a);
        const char *v = eq ? eq + 1 : "";
        if (eq && kl == 2 && strncmp(a, "bs", 2) == 0) {
            if (qk_tool_cvtnum("bs", v, 1, INT_MAX, &bs) < 0) {
                return 1;
            }
        } else if (eq && kl == 5 && strncmp(a, "count", 5) == 0) {
            if (qk_tool_cvtnum("count", v, 0, INT64_MAX, &count) < 0) {
                return 1;
            }
            have_count = true;
        } else if (eq && kl == 4 && strncmp(a, "skip", 4) == 0) {
            if (qk_tool_cvtnum("skip", v, 0, INT64_MAX, &skip) < 0) {
                return 1;
            }
            have_skip = true;
        } else if (eq && kl == 2 && strncmp(a, "if", 2) == 0) {
            in_name = v;
        } else if (eq && kl == 2 && strncmp(a, "of", 2) == 0) {
            out_name = v;
        } else {
            qk_tool_error("unrecognized operand %.*s", (int)kl, a);
            return 1;
        }
    }
    if (!in_name || !out_name) {
        qk_tool_error("Must specify both input and output files");
        return 1;
    }
    QkError err = {0};
    QkBlock *in = qk_tool_open(in_name, fmt, in_flags, &err);
    if (!in) {
        qk_tool_error("Could not open '%s': %s", in_name, err.msg);
        return 1;
    }
    int ret = 1;
    QkBlock *out = NULL;
    if (!qk_format_is_image(out_fmt)) {
        qk_tool_error("Unknown file format");
        goto done;
    }
    int64_t isz = qk_block_length(in);
    if (isz < 0) {
        qk_tool_error("%s: error while reading image size: %s", in_name, strerror((int)-isz));
        goto done;
    }
    /* qemu-img's arithmetic: count bounds the input end, skip moves the
     * start; a start past the end gives an empty output (and a message,
     * exit 0). */
    uint64_t end = (uint64_t)isz;
    if (have_count && count <= INT64_MAX / bs && count * bs < end) {
        end = count * bs;
    }
    uint64_t start = 0;
    bool past_end = false;
    if (have_skip) {
        if (skip > INT64_MAX / bs || skip * bs > end) {
            past_end = true;
            start = end;
        } else {
            start = skip * bs;
        }
    }
    QkCreateOptions co = {.format = out_fmt, .size = end - start, .size_set = true};
    if (qk_block_create(out_name, &co, &err) < 0) {
        qk_tool_error("%s: error while creating output image: %s", out_name, err.msg);
        goto done;
    }
    QkOpenOptions oo = {.flags = QK_OPEN_RDWR, .format = out_fmt};
    out = qk_block_open(out_name, &oo, &err);
    if (!out) {
        qk_tool_error("Could not open '%s': %s", out_name, err.msg);
        goto done;
    }
    if (past_end) {
        qk_tool_error("%s: cannot skip to specified offset", in_name);
        ret = 0;
        goto done;
    }
    DdRun d = {.in = in, .out = out, .start = start, .end = end};
    qk_co_run(dd_co, &d);
    if (d.ret < 0) {
        qk_tool_error("error while copying: %s", strerror(-d.ret));
        goto done;
    }
    ret = 0;
done:
    if (out) {
        int r = qk_block_close(out);
        if (ret == 0 && r < 0) {
            qk_tool_error("error while writing to output image file: %s", strerror(-r));
            ret = 1;
        }
    }
    qk_block_close(in);
    return ret;
}

const QkCommand qk_cmd_dd = {
    .name = "dd",
    .summary = "copy part of an image into a new image",
    .usage = usage_text,
    .run = run_dd,
};
