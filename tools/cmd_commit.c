/*
 * qcowkit commit: writes what an image holds above its base into the base
 * (qemu-img commit): into its backing file, then empties the image unless
 * -d; or with -b into a deeper image of its chain (the image is then left
 * as it is, as with qemu-img). Same messages and exit codes.
 *
 * Owns argument handling, finding the base and the order of the steps
 * (copy, base flushed, only then the top emptied); the copy is
 * jobs/commit.c's.
 */
#include "cmd.h"
#include "progress.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit commit [-q] [-f FMT] [-t CACHE] [-b BASE] [-r RATE] [-d] [-p] FILE\n"
    "\n"
    "Commits the changes recorded in FILE into its backing file, then empties\n"
    "FILE (unless -d). With -b, commits FILE and every image between it and\n"
    "BASE into BASE, leaving them as they are (-d implied).\n"
    "  -f FMT     format of FILE (default: probed)\n"
    "  -t CACHE   none, writeback (default), writethrough, directsync, unsafe\n"
    "  -b BASE    an image of FILE's backing chain to commit into\n"
    "  -r RATE    copy at most RATE bytes per second (64M: 64 MiB/s)\n"
    "  -d         do not empty FILE afterwards\n"
    "  -p         show progress on stderr\n"
    "  -q         quiet: do not print \"Image committed.\"\n";

typedef struct CommitCmd {
    QkBlock *top, *base;
    int depth;
    bool drop;
    uint64_t rate;
    QkProgress progress;
    const char *what;
    int ret;
} CommitCmd;

/* Is B (the backing file of ABOVE) the base NAME names? NAME matches the
 * backing file name ABOVE records, or, relative to ABOVE's directory, the
 * same file as B. */
static bool base_is(QkBlock *above, QkBlock *b, const char *name)
{
    const char *recorded = qk_block_backing_file(above);
    if (recorded && strcmp(recorded, name) == 0) {
        return true;
    }
    char *path = qk_block_backing_path(qk_block_filename(above), name);
    bool same = path && qk_tool_same_file(qk_block_filename(b), path);
    free(path);
    return same;
}

static void coroutine_fn commit_co(void *opaque)
{
    CommitCmd *c = opaque;
    c->what = "Block job failed";
    QkCommitOptions o = {.workers = 8, .rate = c->rate, .progress = qk_progress_report, .opaque = &c->progress};
    c->ret = qk_co_commit_copy(c->top, c->depth, c->base, &o);
    if (c->ret == 0 && c->drop) {
        /* The base's copy is durable (flushed above) before the top lets go. */
        c->what = "Could not empty the image";
        c->ret = qk_co_make_empty(c->top);
    }
}

static int run_commit(int argc, char **argv)
{
    const char *fmt = NULL, *cache = NULL, *base_name = NULL;
    bool quiet = false, keep = false, progress = false;
    uint64_t rate = 0;
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":f:t:b:r:dpqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            fmt = optarg;
            break;
        case 't':
            cache = optarg;
            break;
        case 'b':
            base_name = optarg;
            break;
        case 'r':
            if (qk_tool_cvtnum("rate limit", optarg, 0, INT64_MAX, &rate) < 0) {
                return 1;
            }
            break;
        case 'd':
            keep = true;
            break;
        case 'p':
            progress = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            return qk_tool_bad_usage("commit", "missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_bad_usage("commit", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("commit", "Expecting one image file name");
    }
    const char *filename = argv[optind];
    int flags = QK_OPEN_RDWR;
    if (cache && qk_cache_mode_parse(cache, &flags) < 0) {
        qk_tool_error("Invalid cache option: %s", cache);
        return 1;
    }
    QkError err = {0};
    CommitCmd c = {.drop = !keep && !base_name, .rate = rate};
    c.top = qk_tool_open(filename, fmt, flags, &err);
    if (!c.top) {
        qk_tool_error("Could not open '%s': %s", filename, err.msg);
        return 1;
    }
    int ret = 1;
    QkBlock *b = qk_block_backing(c.top);
    if (!b) {
        qk_tool_error("Image does not have a backing file");
        goto out;
    }
    c.depth = 1;
    if (base_name) {
        /* As qemu-img finds it: a relative name is relative to the
         * directory of the image that has the candidate as its backing
         * file, not to the current directory. */
        QkBlock *above = c.top;
        while (b && !base_is(above, b, base_name)) {
            above = b;
            b = qk_block_backing(b);
            c.depth++;
        }
        if (!b) {
            qk_tool_error("Did not find '%s' in the backing chain of '%s'", base_name, filename);
            goto out;
        }
    }
    /* The chain holds the base read-only: the copy writes through a
     * read-write node of its own. The chain's node never reads what the
     * copy writes (only ranges held above the base are read). The node
     * opens with the base's own backing files: a partial write into it
     * copies the rest of its cluster from them, and a zero write must
     * hide them. A guessed format is guessed again, so a raw base keeps
     * its first sector protected while written. */
    QkOpenOptions bo = {.flags = ((flags | QK_OPEN_RDWR | QK_OPEN_TAKE_OVER) & ~QK_OPEN_NO_BACKING),
                        .format = qk_block_format_probed(b) ? NULL : qk_block_format_name(b)};
    c.base = qk_block_open(qk_block_filename(b), &bo, &err);
    if (!c.base) {
        qk_tool_error("Could not open '%s': %s", qk_block_filename(b), err.msg);
        goto out;
    }
    qk_progress_init(&c.progress, stdout, progress && !quiet);
    qk_progress_update(&c.progress, 0, 1);
    qk_co_run(commit_co, &c);
    if (c.ret == 0) {
        qk_progress_finish(&c.progress);
    }
    int cr = qk_block_close(c.base);
    if (c.ret == 0 && cr < 0) {
        c.ret = cr;
        c.what = "Could not write the base image";
    }
    if (c.ret < 0) {
        qk_tool_error("%s: %s", c.what, strerror(-c.ret));
        goto out;
    }
    ret = 0;
out:
    return qk_tool_close_written(c.top, ret, quiet, "Image committed.");
}

const QkCommand qk_cmd_commit = {
    .name = "commit",
    .summary = "commit an image's changes into its backing file",
    .usage = usage_text,
    .run = run_commit,
};
