/*
 * qcowkit rebase: moves an image onto another backing file (qemu-img
 * rebase). Safe mode first writes into the image every range whose
 * content would change with the new backing file (jobs/rebase.c), flushes
 * it, and only then records the new backing file; -u only records it.
 * Same flags, messages and exit codes as qemu-img.
 *
 * One deliberate difference: on an image that has no backing file yet,
 * safe mode keeps the guest's view (what the image does not hold reads as
 * zeros before and must afterwards), where qemu-img only writes the header
 * and lets the new backing file show through.
 *
 * Owns argument handling, opening the images and the order of the steps;
 * every check that can fail runs before the first write.
 */
#include "cmd.h"
#include "progress.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit rebase [-q] [-f FMT] [-t CACHE] [-T SRC_CACHE] [-p] [-u] [-c] [-U] -b BACKING [-F BACKING_FMT] FILE\n"
    "\n"
    "Changes the backing file of FILE to BACKING (\"\" for none). Unless -u,\n"
    "every range whose content would change is first copied into FILE, so the\n"
    "guest sees the same data afterwards. BACKING is relative to FILE's\n"
    "directory, as it is recorded.\n"
    "  -f FMT        format of FILE (default: probed)\n"
    "  -t CACHE      cache mode for FILE: none, writeback (default), writethrough,\n"
    "                directsync, unsafe\n"
    "  -T SRC_CACHE  cache mode for the backing files (default: writeback)\n"
    "  -b BACKING    the new backing file\n"
    "  -F FMT        its format (required with a backing file)\n"
    "  -u            unsafe: only change the name in the header (the old and the\n"
    "                new backing file need not exist)\n"
    "  -c            write the clusters copied into FILE compressed (qcow2)\n"
    "  -U            open the new backing file even if another process writes it\n"
    "  -p            show progress on stderr\n"
    "  -q            quiet\n";

typedef struct RebaseCmd {
    QkBlock *top, *nb;
    const char *backing, *backing_fmt;
    bool unsafe, compress;
    QkProgress progress;
    QkError err;
    bool copied;        /* the copy succeeded: a failure is the header's */
    int ret;
} RebaseCmd;

static void coroutine_fn rebase_co(void *opaque)
{
    RebaseCmd *c = opaque;
    if (!c->unsafe) {
        /* Four pieces of 1 MiB in flight per file: within read-ahead's
         * reach. Faster with -T none too: 0.70 s, where eight workers on
         * 4 MiB slices took 0.81 s (see jobs/rebase.c). */
        QkRebaseOptions o = {.workers = 4, .compress = c->compress, .progress = qk_progress_report,
                             .opaque = &c->progress};
        c->ret = qk_co_rebase_copy(c->top, c->nb, &o);
        if (c->ret < 0) {
            return;
        }
    }
    c->copied = true;
    /* The data copied is flushed: the header may point elsewhere now. */
    const char *name = c->backing[0] ? c->backing : NULL;
    c->ret = qk_co_change_backing(c->top, name, name ? c->backing_fmt : NULL, &c->err);
}

static int change_error(const RebaseCmd *c, const char *msg)
{
    qk_tool_error("Could not change the backing file to '%s': %s", c->backing, msg);
    return 1;
}

static int run_rebase(int argc, char **argv)
{
    const char *fmt = NULL, *cache = NULL, *src_cache = NULL;
    bool quiet = false, progress = false;
    RebaseCmd c = {0};
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    bool force_share = false;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":f:t:T:b:F:upcUqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            fmt = optarg;
            break;
        case 't':
            cache = optarg;
            break;
        case 'T':
            src_cache = optarg;
            break;
        case 'b':
            c.backing = optarg;
            break;
        case 'F':
            c.backing_fmt = optarg;
            break;
        case 'u':
            c.unsafe = true;
            break;
        case 'p':
            progress = true;
            break;
        case 'c':
            c.compress = true;
            break;
        case 'U':
            force_share = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            return qk_tool_bad_usage("rebase", "missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_bad_usage("rebase", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("rebase", "Expecting one image file name");
    }
    const char *filename = argv[optind];
    if (!c.unsafe && !c.backing) {
        qk_tool_error("Must specify backing file (-b) or use unsafe mode (-u)");
        fprintf(stderr, "Try '%s --help' for more information\n", qk_progname);
        return 1;
    }
    if (c.compress && c.unsafe) {
        qk_tool_error("Compression can't be used with unsafe rebase");
        return 1;
    }
    int flags = QK_OPEN_RDWR, src_flags = 0;
    if (cache && qk_cache_mode_parse(cache, &flags) < 0) {
        qk_tool_error("Invalid cache option: %s", cache);
        return 1;
    }
    if (src_cache && qk_cache_mode_parse(src_cache, &src_flags) < 0) {
        qk_tool_error("Invalid source cache option: %s", src_cache);
        return 1;
    }
    if (c.backing_fmt && !qk_format_known(c.backing_fmt)) {
        qk_tool_error("Invalid format name: '%s'", c.backing_fmt);
        return 1;
    }
    if (c.unsafe) {
        flags |= QK_OPEN_NO_BACKING;
    }
    /* As in qemu-img, -U reaches only the new backing file, the one file
     * opened for this command alone; FILE is written and its own chain
     * keeps the usual locks. */
    if (force_share) {
        src_flags |= QK_OPEN_FORCE_SHARE;
    }
    if (!c.backing) {
        c.backing = "";
    }
    int ret = 1;
    c.top = qk_tool_open(filename, fmt, flags, &c.err);
    if (!c.top) {
        qk_tool_error("Could not open '%s': %s", filename, c.err.msg);
        return 1;
    }
    /* Everything that can refuse refuses here, before any write. */
    if (c.compress && !qk_block_can_compress(c.top)) {
        qk_tool_error("Compression not supported for this file format");
        goto out;
    }
    if (!qk_block_can_change_backing(c.top)) {
        change_error(&c, "Operation not supported");
        goto out;
    }
    if (c.backing[0] && !c.backing_fmt) {
        change_error(&c, "backing format must be specified");
        goto out;
    }
    char *path = c.backing[0] ? qk_block_backing_path(filename, c.backing) : NULL;
    if (c.backing[0] && !path) {
        change_error(&c, "out of memory");
        goto out;
    }
    if (path && !c.unsafe) {
        QkOpenOptions o = {.flags = src_flags, .format = c.backing_fmt};
        QkError e = {0};
        c.nb = qk_block_open(path, &o, &e);
        if (!c.nb) {
            qk_tool_error("Could not open new backing file '%s': %s", path, e.msg);
            free(path);
            goto out;
        }
    }
    /* An image must not end up in its own backing chain: every later
     * open would fail (and a safe rebase would compare it with itself). */
    QkBlock *top_file = qk_block_file(c.top);
    bool loops = path && qk_tool_same_file(path, top_file ? qk_block_filename(top_file) : filename);
    for (QkBlock *b = c.nb; b && !loops; b = qk_block_backing(b)) {
        QkBlock *f = qk_block_file(b);
        loops = f && top_file && qk_tool_same_file(qk_block_filename(f), qk_block_filename(top_file));
    }
    free(path);
    if (loops) {
        change_error(&c, "the image would be in its own backing chain");
        goto out;
    }
    qk_progress_init(&c.progress, stdout, progress && !quiet);
    qk_progress_update(&c.progress, 0, 1);
    qk_co_run(rebase_co, &c);
    if (c.ret == 0) {
        qk_progress_finish(&c.progress);
        ret = 0;
    } else if (c.copied) {
        change_error(&c, c.err.msg);
    } else {
        qk_tool_error("Could not copy the data: %s", strerror(-c.ret));
    }
out:
    if (c.nb) {
        qk_block_close(c.nb);
    }
    return qk_tool_close_written(c.top, ret, true, "");
}

const QkCommand qk_cmd_rebase = {
    .name = "rebase",
    .summary = "move an image onto another backing file",
    .usage = usage_text,
    .run = run_rebase,
};
