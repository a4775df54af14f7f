/*
 * qcowkit mirror: one-shot copy of an image through the mirror job. Creates
 * the destination (like `qemu-img convert`) when it does not exist, copies,
 * completes and reports progress on stderr with -p. With nobody writing the
 * source this is a sparse-aware parallel copy; its point is to exercise the
 * same job the daemon runs under live writes.
 */
#include "cmd.h"
#include "progress.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct MirrorCmd {
    const char *src, *dst, *fmt, *out_fmt;
    const char *src_cache, *dst_cache; /* -T, -t; NULL: defaults */
    bool progress;
    QkMirrorOptions o;
    int ret;
} MirrorCmd;

static void coroutine_fn mirror_co(void *opaque)
{
    MirrorCmd *c = opaque;
    QkError err = {0};
    c->ret = 1;
    QkOpenOptions so = {.flags = 0, .format = c->fmt};
    if (c->src_cache && qk_cache_mode_parse(c->src_cache, &so.flags) < 0) {
        qk_tool_error("Invalid source cache option: %s", c->src_cache);
        return;
    }
    int dummy = 0;
    if (c->dst_cache && qk_cache_mode_parse(c->dst_cache, &dummy) < 0) {
        qk_tool_error("Invalid cache mode '%s'", c->dst_cache); /* before DST is created */
        return;
    }
    QkBlock *src = qk_co_block_open(c->src, &so, &err);
    if (!src) {
        qk_tool_error("%s", err.msg);
        return;
    }
    struct stat sb;
    bool created = false;
    if (!qk_block_is_remote(c->dst) && stat(c->dst, &sb) != 0) {
        QkCreateOptions co = {.format = c->out_fmt ? c->out_fmt : "qcow2",
                              .size = (uint64_t)qk_block_length(src), .size_set = true};
        if (qk_co_block_create(c->dst, &co, &err) < 0) {
            qk_tool_error("Could not create '%s': %s", c->dst, err.msg);
            qk_co_block_close(src);
            return;
        }
        created = true;
    }
    QkOpenOptions to = {.flags = QK_OPEN_RDWR, .format = c->out_fmt};
    const char *used;
    QkBlock *dst = qk_mirror_open_target(c->dst, &to, c->dst_cache, &used, &err);
    if (!dst) {
        qk_tool_error("%s", err.msg);
        qk_co_block_close(src);
        return;
    }
    c->o.target_is_zero = created;
    QkJob *job = qk_mirror_start(NULL, src, dst, &c->o, &err);
    if (!job) {
        qk_tool_error("%s", err.msg);
        qk_co_block_close(dst);
        qk_co_block_close(src);
        return;
    }
    QkProgress p;
    qk_progress_init(&p, stderr, c->progress);
    qk_progress_update(&p, 0, 1);
    bool completing = false;
    while (!qk_job_is_finished(job)) {
        if (qk_job_state(job) == QK_JOB_READY && !completing) {
            completing = qk_mirror_complete(job, false, &err) == 0;
        }
        uint64_t done, total;
        qk_job_progress(job, &done, &total);
        qk_progress_update(&p, done, total);
        qk_co_sleep_ns(20 * 1000000LL);
    }
    if (qk_job_state(job) == QK_JOB_COMPLETED) {
        qk_progress_finish(&p);
        c->ret = 0;
    } else {
        if (c->progress) {
            fputc('\n', stderr);
        }
        qk_tool_error("%s", qk_job_state(job) == QK_JOB_FAILED ? qk_job_error(job) : "mirror was cancelled");
    }
    qk_job_free(job);
    int cr = qk_co_block_close(dst);
    qk_co_block_close(src);
    if (cr < 0) {
        qk_tool_error("closing '%s' failed: %s", c->dst, strerror(-cr));
        c->ret = 1;
    }
}

static const char usage_text[] =
    "Usage: qcowkit mirror [-f FMT] [-O FMT] [-p] [--speed N] [--granularity N]\n"
    "                      [--buf-size N] [--max-in-flight N]\n"
    "                      [--mode background|write-blocking] [--rescan-per-chunk]\n"
    "                      [--copy-priority low|normal] [-t CACHE] [-T SRC_CACHE]\n"
    "                      SRC DST\n"
    "\n"
    "Copies SRC to DST with the mirror job (the daemon's live migration copy):\n"
    "allocated data is copied, zeroes are written as zeroes, and the copy completes\n"
    "once the dirty set is empty. DST is created (default qcow2, same size) when it\n"
    "does not exist.\n"
    "\n"
    "  -f FMT               format of SRC (probed by default)\n"
    "  -O FMT               format of DST (qcow2 when created, probed otherwise)\n"
    "  -p                   show progress on stderr\n"
    "  -t CACHE             cache mode of DST: none (O_DIRECT, the default for a\n"
    "                       local file; writeback where the file system has no\n"
    "                       O_DIRECT), writeback, writethrough, directsync, unsafe\n"
    "  -T SRC_CACHE         cache mode of SRC (default writeback)\n"
    "  --speed N            limit the copy to N bytes per second\n"
    "  --granularity N      dirty-tracking chunk (power of two; default: DST's\n"
    "                       cluster size clamped to 4k..64k)\n"
    "  --buf-size N         copy buffers in flight together (default 16M)\n"
    "  --max-in-flight N    copies at once (default 16)\n"
    "  --mode MODE          background (default) or write-blocking\n"
    "  --rescan-per-chunk   the slow walk (restart and drain per chunk), for comparison\n"
    "  --copy-priority P    CPU priority of the copy's I/O: normal (default) or low\n"
    "                       (yields the CPUs to other work, and may starve the copy)\n";

static int run(int argc, char **argv)
{
    enum { OPT_SPEED = 256, OPT_GRAN, OPT_BUF, OPT_MODE, OPT_RESCAN, OPT_INFLIGHT, OPT_PRIO };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"speed", required_argument, NULL, OPT_SPEED},
        {"granularity", required_argument, NULL, OPT_GRAN},
        {"buf-size", required_argument, NULL, OPT_BUF},
        {"max-in-flight", required_argument, NULL, OPT_INFLIGHT},
        {"mode", required_argument, NULL, OPT_MODE},
        {"rescan-per-chunk", no_argument, NULL, OPT_RESCAN},
        {"copy-priority", required_argument, NULL, OPT_PRIO},
        {NULL, 0, NULL, 0},
    };
    MirrorCmd c = {0};
    uint64_t v;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "hf:O:pt:T:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case 'f':
            c.fmt = optarg;
            break;
        case 'O':
            c.out_fmt = optarg;
            break;
        case 'p':
            c.progress = true;
            break;
        case 't':
            c.dst_cache = optarg;
            break;
        case 'T':
            c.src_cache = optarg;
            break;
        case OPT_SPEED:
            if (qk_tool_parse_size(optarg, "speed", &c.o.speed) < 0) {
                return 1;
            }
            break;
        case OPT_GRAN:
            if (qk_tool_parse_size(optarg, "granularity", &c.o.granularity) < 0) {
                return 1;
            }
            break;
        case OPT_BUF:
            if (qk_tool_parse_size(optarg, "buffer size", &c.o.buf_size) < 0) {
                return 1;
            }
            break;
        case OPT_INFLIGHT:
            if (qk_tool_parse_size(optarg, "max in flight", &v) < 0 || v == 0 || v > 1024) {
                qk_tool_error("--max-in-flight must be between 1 and 1024");
                return 1;
            }
            c.o.max_in_flight = (int)v;
            break;
        case OPT_MODE:
            if (qk_mirror_mode_parse(optarg, &c.o.mode) < 0) {
                qk_tool_error("Invalid mode '%s' (use background or write-blocking)", optarg);
                return 1;
            }
            break;
        case OPT_RESCAN:
            c.o.rescan_per_chunk = true;
            break;
        case OPT_PRIO:
            if (qk_mirror_priority_parse(optarg, &c.o.copy_priority) < 0) {
                qk_tool_error("Invalid copy priority '%s' (use low, normal or auto)", optarg);
                return 1;
            }
            break;
        default:
            return qk_tool_bad_usage("mirror", "invalid option");
        }
    }
    if (argc - optind != 2) {
        return qk_tool_bad_usage("mirror", "expecting a source and a destination");
    }
    c.src = argv[optind];
    c.dst = argv[optind + 1];
    qk_co_run(mirror_co, &c);
    return c.ret;
}

const QkCommand qk_cmd_mirror = {
    .name = "mirror",
    .summary = "copy an image with the mirror job",
    .usage = usage_text,
    .run = run,
};
