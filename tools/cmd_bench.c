/*
 * qcowkit bench: qemu-img bench compatible request generator and our
 * headline performance tool. `depth` coroutines each issue requests back to
 * back into one aligned buffer of their own; nothing is allocated per
 * request. The buffers are slices of one region that asks for transparent
 * huge pages, as a VM's RAM does under QEMU; --plain-buffers allocates
 * each separately, as qemu-img bench does. Latency goes into a fixed
 * log-linear histogram (two clock reads and one increment per request) so
 * percentiles cost nothing at run time.
 */
#include "cmd.h"
#include "common/checked.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char *const usage_text =
    "Usage: qcowkit bench [-c COUNT] [-d DEPTH] [-s SIZE] [-o OFFSET] [-S STEP] [-w]\n"
    "                     [-t CACHE] [-n] [-i AIO] [-f FMT] [-U] [-q]\n"
    "                     [--flush-interval N] [--no-drain] [--pattern BYTE]\n"
    "                     [--output=human|json] [--strict-alloc-deps]\n"
    "                     [--cache-size SIZE] [--plain-buffers] FILE\n"
    "\n"
    "Sends COUNT requests of SIZE bytes, DEPTH in parallel, starting at OFFSET\n"
    "and advancing by STEP (wrapping inside the image). Reads unless -w.\n"
    "Defaults as qemu-img bench: -c 75000 -d 64 -s 4K -S SIZE -o 0 -t writeback.\n"
    "  -n                native AIO: needs -t none or -t directsync\n"
    "  -i AIO            threads, io_uring or native\n"
    "  --flush-interval  flush after every N writes (N >= DEPTH); in-flight writes\n"
    "                    drain first unless --no-drain\n"
    "  --pattern BYTE    fill written data with BYTE (default 0)\n"
    "  --output=json     print {requests, bytes_each, depth, seconds, iops,\n"
    "                    mb_per_s (10^6 bytes), latency_us {p50, p90, p99, max}}\n"
    "  --strict-alloc-deps  qcow2: every write to a cluster being allocated waits\n"
    "  --cache-size SIZE qcow2: metadata cache (L2 tables and refcount blocks) of at\n"
    "                    most SIZE bytes, as qemu's cache-size (default: enough\n"
    "                    L2 tables to map the whole image, up to 32 MiB)\n"
    "  --plain-buffers   allocate each request buffer on its own (default: slices\n"
    "                    of one region advised to use huge pages, as guest RAM is)\n"
    "  -q                do not print the two summary lines\n";

/* Latency histogram: 64 sub-buckets per power of two of nanoseconds,
 * i.e. under 1.6% error, in 32 KiB whatever the request count. */
#define SUB_BITS 6
#define HUGE_PAGE (2u << 20)
#define NBUCKETS (64 << SUB_BITS)

typedef struct Bench {
    QkBlock *bs;
    bool write;
    uint64_t count;
    uint64_t size;
    uint64_t step;
    uint64_t image_size;
    uint64_t flush_interval;
    bool drain;
    int pattern;

    uint64_t issued;
    uint64_t next_offset;
    unsigned in_flight;
    uint64_t since_flush;
    bool draining;
    QkCoQueue gate;             /* workers waiting for a drain+flush to end */
    QkCoQueue drained;          /* the flusher waiting for in_flight == 0 */
    int error;
    int running;                /* workers not yet finished */
    bool done;

    uint64_t hist[NBUCKETS];
    uint64_t max_ns;
} Bench;

typedef struct Worker {
    Bench *b;
    void *buf;
} Worker;

static unsigned bucket_of(uint64_t ns)
{
    if (ns < (1u << SUB_BITS)) {
        return (unsigned)ns;
    }
    unsigned msb = 63 - (unsigned)__builtin_clzll(ns);
    unsigned sub = (unsigned)(ns >> (msb - SUB_BITS)) & ((1u << SUB_BITS) - 1);
    return ((msb - SUB_BITS + 1) << SUB_BITS) | sub;
}

/* Middle of a bucket, in ns. */
static double bucket_value(unsigned i)
{
    unsigned hi = i >> SUB_BITS, sub = i & ((1u << SUB_BITS) - 1);
    if (hi == 0) {
        return sub;
    }
    unsigned msb = hi + SUB_BITS - 1;
    double lo = (double)((1ULL << msb) | ((uint64_t)sub << (msb - SUB_BITS)));
    return lo + (double)(1ULL << (msb - SUB_BITS)) / 2;
}

static double percentile_us(const Bench *b, uint64_t total, double p)
{
    if (total == 0) {
        return 0;
    }
    uint64_t rank = (uint64_t)(p * (double)total + 0.5);
    rank = rank == 0 ? 1 : rank;
    uint64_t seen = 0;
    for (unsigned i = 0; i < NBUCKETS; i++) {
        seen += b->hist[i];
        if (seen >= rank) {
            double v = bucket_value(i);
            return (v > (double)b->max_ns ? (double)b->max_ns : v) / 1000.0;
        }
    }
    return (double)b->max_ns / 1000.0;
}

/* Flushes after every flush_interval completed writes. With drain (the
 * default) no new request starts until everything in flight completed and
 * the flush returned, as qemu-img bench does. */
static int coroutine_fn maybe_flush(Bench *b)
{
    if (!b->flush_interval || ++b->since_flush < b->flush_interval) {
        return 0;
    }
    b->since_flush = 0;
    if (!b->drain) {
        return qk_co_flush(b->bs);
    }
    b->draining = true;
    while (b->in_flight > 0) {
        qk_co_queue_wait(&b->drained);
    }
    int r = qk_co_flush(b->bs);
    b->draining = false;
    qk_co_queue_wake_all(&b->gate);
    return r;
}

static void coroutine_fn worker_entry(void *opaque)
{
    Worker *w = opaque;
    Bench *b = w->b;
    QkIov qiov;
    qk_iov_init_buf(&qiov, w->buf, b->size);
    while (b->issued < b->count && !b->error) {
        while (b->draining) {
            qk_co_queue_wait(&b->gate);
        }
        if (b->issued >= b->count || b->error) {
            break;
        }
        uint64_t off = b->next_offset;
        b->issued++;
        b->next_offset += b->step;
        /* Modulo the image size, as qemu-img 7.2 to 10.0 do, so that both
         * tools visit the same offsets in the same order (the disk serves
         * some orders faster than others: 4k random writes took 15% longer
         * when only the modulus differed). Where that would pass the end
         * of the image (those qemu-img versions then fail with EIO) the
         * offset wraps inside the range a request fits in, as later
         * qemu-img versions wrap every offset. */
        if (b->image_size > 0) {
            b->next_offset %= b->image_size;
        }
        if (b->next_offset + b->size > b->image_size) {
            b->next_offset = b->image_size > b->size ? b->next_offset % (b->image_size - b->size) : 0;
        }

        b->in_flight++;
        int64_t t0 = qk_clock_ns();
        int r;
        if (off + b->size > b->image_size) {
            r = -EIO;
        } else if (b->write) {
            r = qk_co_pwritev(b->bs, off, b->size, &qiov, 0, 0);
        } else {
            r = qk_co_preadv(b->bs, off, b->size, &qiov, 0, 0);
        }
        uint64_t ns = (uint64_t)(qk_clock_ns() - t0);
        b->in_flight--;
        b->hist[bucket_of(ns)]++;
        if (ns > b->max_ns) {
            b->max_ns = ns;
        }
        if (b->draining && b->in_flight == 0) {
            qk_co_queue_wake_all(&b->drained);
        }
        if (r == 0 && b->write) {
            r = maybe_flush(b);
        }
        if (r < 0 && !b->error) {
            b->error = r;
        }
    }
    if (--b->running == 0) {
        b->done = true;
    }
}

typedef struct BenchArgs {
    uint64_t count, depth, size, offset, step, flush_interval;
    bool write, step_set, quiet, json, native, drain;
    int pattern;
    const char *fmt;
    const char *cache;
    const char *aio;
    bool strict;
    bool force_share;
    bool plain_buffers;
    uint64_t cache_size;
} BenchArgs;

static int parse_args(int argc, char **argv, BenchArgs *a, const char **filename)
{
    enum { OPT_FLUSH = 256, OPT_NO_DRAIN, OPT_PATTERN, OPT_OUTPUT, OPT_STRICT, OPT_CACHE_SIZE, OPT_PLAIN };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"flush-interval", required_argument, NULL, OPT_FLUSH},
        {"no-drain", no_argument, NULL, OPT_NO_DRAIN},
        {"pattern", required_argument, NULL, OPT_PATTERN},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"strict-alloc-deps", no_argument, NULL, OPT_STRICT},
        {"plain-buffers", no_argument, NULL, OPT_PLAIN},
        {"force-share", no_argument, NULL, 'U'},
        {"cache-size", required_argument, NULL, OPT_CACHE_SIZE},
        {NULL, 0, NULL, 0},
    };
    bool flush_set = false;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":c:d:f:ni:o:qs:S:t:wUh", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            if (qk_parse_uint(optarg, &a->count) < 0 || a->count > INT32_MAX) {
                qk_tool_error("Invalid request count specified");
                return -1;
            }
            break;
        case 'd':
            if (qk_parse_uint(optarg, &a->depth) < 0 || a->depth == 0 || a->depth > 65536) {
                qk_tool_error("Invalid queue depth specified");
                return -1;
            }
            break;
        case 'f': a->fmt = optarg; break;
        case 'n': a->native = true; break;
        case 'i': a->aio = optarg; break;
        case 'o':
            if (qk_tool_cvtnum("offset", optarg, 0, INT64_MAX, &a->offset) < 0) {
                return -1;
            }
            break;
        case 'q': a->quiet = true; break;
        case 's':
            if (qk_tool_cvtnum("buffer size", optarg, 0, INT32_MAX, &a->size) < 0) {
                return -1;
            }
            break;
        case 'S':
            if (qk_tool_cvtnum("step_size", optarg, 0, INT32_MAX, &a->step) < 0) {
                return -1;
            }
            a->step_set = true;
            break;
        case 't': a->cache = optarg; break;
        case 'w': a->write = true; break;
        case 'U': a->force_share = true; break;
        case OPT_FLUSH:
            if (qk_parse_uint(optarg, &a->flush_interval) < 0 || a->flush_interval > INT32_MAX) {
                qk_tool_error("Invalid flush interval specified");
                return -1;
            }
            flush_set = true;
            break;
        case OPT_NO_DRAIN: a->drain = false; break;
        case OPT_PATTERN: {
            uint64_t p;
            if (qk_parse_uint(optarg, &p) < 0 || p > 255) {
                qk_tool_error("Invalid pattern byte specified");
                return -1;
            }
            a->pattern = (int)p;
            break;
        }
        case OPT_OUTPUT:
            if (qk_tool_parse_output("bench", optarg, &a->json) < 0) {
                return -1;
            }
            break;
        case OPT_STRICT: a->strict = true; break;
        case OPT_PLAIN: a->plain_buffers = true; break;
        case OPT_CACHE_SIZE:
            if (qk_tool_size(optarg, &a->cache_size) < 0 || a->cache_size == 0) {
                qk_tool_size_error("cache size");
                return -1;
            }
            break;
        case 'h': fputs(usage_text, stdout); return 1;
        case ':':
            qk_tool_bad_usage("bench", "missing argument for option '%s'", argv[optind - 1]);
            return -1;
        default:
            qk_tool_bad_usage("bench", "unrecognized option '%s'", argv[optind - 1]);
            return -1;
        }
    }
    if (optind != argc - 1) {
        qk_tool_bad_usage("bench", "Expecting one image file name");
        return -1;
    }
    *filename = argv[optind];
    if (flush_set && !a->write) {
        qk_tool_error("--flush-interval is only available in write tests");
        return -1;
    }
    if (flush_set && a->flush_interval < a->depth) {
        qk_tool_error("Flush interval can't be smaller than depth");
        return -1;
    }
    if (!a->step_set) {
        a->step = a->size;
    }
    return 0;
}

static void print_json(const Bench *b, const BenchArgs *a, double secs)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < NBUCKETS; i++) {
        n += b->hist[i];
    }
    json_t *o = json_object();
    json_object_set_new(o, "requests", json_integer((json_int_t)a->count));
    json_object_set_new(o, "bytes_each", json_integer((json_int_t)a->size));
    json_object_set_new(o, "depth", json_integer((json_int_t)a->depth));
    json_object_set_new(o, "seconds", json_real(secs));
    json_object_set_new(o, "iops", json_real(secs > 0 ? (double)a->count / secs : 0));
    json_object_set_new(o, "mb_per_s",
                        json_real(secs > 0 ? (double)a->count * (double)a->size / secs / 1e6 : 0));
    json_t *lat = json_object();
    json_object_set_new(lat, "p50", json_real(percentile_us(b, n, 0.50)));
    json_object_set_new(lat, "p90", json_real(percentile_us(b, n, 0.90)));
    json_object_set_new(lat, "p99", json_real(percentile_us(b, n, 0.99)));
    json_object_set_new(lat, "max", json_real((double)b->max_ns / 1000.0));
    json_object_set_new(o, "latency_us", lat);
    qk_tool_print_json(o);
    json_decref(o);
}

static int run(int argc, char **argv)
{
    BenchArgs a = {.count = 75000, .depth = 64, .size = 4096, .drain = true};
    const char *filename;
    int r = parse_args(argc, argv, &a, &filename);
    if (r != 0) {
        return r > 0 ? 0 : 1;
    }
    QkOpenOptions o = {.flags = a.write ? QK_OPEN_RDWR : 0, .format = a.fmt,
                       .strict_alloc_deps = a.strict, .cache_size = a.cache_size};
    if (a.force_share) {
        o.flags |= QK_OPEN_FORCE_SHARE;
    }
    if (a.cache && qk_cache_mode_parse(a.cache, &o.flags) < 0) {
        qk_tool_error("Invalid cache mode");
        return 1;
    }
    if (a.aio) {
        if (strcmp(a.aio, "native") == 0) {
            a.native = true;
        } else if (qk_set_aio_backend(a.aio) < 0) {
            qk_tool_error("Invalid aio option: %s", a.aio);
            return 1;
        }
    }
    if (a.native && !(o.flags & QK_OPEN_NOCACHE)) {
        qk_tool_error("Could not open '%s': aio=native was specified, but it requires "
                      "cache.direct=on, which was not specified.", filename);
        return 1;
    }
    QkError err = {0};
    Bench *b = calloc(1, sizeof(*b));
    Worker *w = calloc(a.depth, sizeof(*w));
    char *region = NULL; /* the buffers' region, unless --plain-buffers */
    size_t region_len = 0;
    if (!b || !w) {
        qk_tool_error("out of memory");
        free(b);
        free(w);
        return 1;
    }
    int ret = 1;
    b->bs = qk_block_open(filename, &o, &err);
    if (!b->bs) {
        qk_tool_error("Could not open '%s': %s", filename, err.msg);
        goto out;
    }
    qk_tool_warn_guessed_raw(b->bs, o.flags);
    *b = (Bench){.bs = b->bs, .write = a.write, .count = a.count, .size = a.size, .step = a.step,
                 .image_size = (uint64_t)qk_block_length(b->bs), .flush_interval = a.flush_interval,
                 .drain = a.drain, .pattern = a.pattern, .next_offset = a.offset,
                 .running = (int)a.depth};
    size_t align = qk_block_mem_alignment(b->bs) > 4096 ? qk_block_mem_alignment(b->bs) : 4096;
    size_t slice = qk_align_up(a.size ? a.size : 1, align);
    if (!a.plain_buffers) {
        region_len = qk_align_up(slice * a.depth, HUGE_PAGE);
        region = qk_aligned_alloc(HUGE_PAGE, region_len);
        if (!region) {
            qk_tool_error("out of memory");
            goto close;
        }
        /* Advice only: without huge pages the region works the same. A
         * request in one huge page is one segment for the device, so
         * sequential requests merge into larger ones. */
        (void)madvise(region, region_len, MADV_HUGEPAGE);
    }
    for (uint64_t i = 0; i < a.depth; i++) {
        w[i].b = b;
        w[i].buf = region ? region + i * slice : qk_aligned_alloc(align, a.size ? a.size : 1);
        if (!w[i].buf) {
            qk_tool_error("out of memory");
            goto close;
        }
        if (a.write) {
            /* Reads leave the buffers untouched, so a deep queue of large
             * reads does not make them all resident up front. */
            memset(w[i].buf, a.pattern, a.size);
        }
    }
    if (!a.quiet && !a.json) {
        printf("Sending %" PRIu64 " %s requests, %" PRIu64 " bytes each, %" PRIu64
               " in parallel (starting at offset %" PRIu64 ", step size %" PRIu64 ")\n",
               a.count, a.write ? "write" : "read", a.size, a.depth, a.offset, a.step);
        fflush(stdout);
    }
    int64_t t0 = qk_clock_ns();
    QkLoop *loop = qk_loop_get();
    for (uint64_t i = 0; i < a.depth; i++) {
        qk_coroutine_enter(qk_coroutine_create(worker_entry, &w[i]));
    }
    qk_loop_run_until(loop, &b->done);
    double secs = (double)(qk_clock_ns() - t0) / 1e9;
    if (b->error) {
        qk_tool_error("Failed request: %s", strerror(-b->error));
        goto close;
    }
    if (a.json) {
        print_json(b, &a, secs);
    } else if (!a.quiet) {
        printf("Run completed in %.3f seconds.\n", secs);
    }
    ret = 0;
close:
    if (qk_block_close(b->bs) < 0 && ret == 0) {
        qk_tool_error("closing the image failed: its last writes may be lost");
        ret = 1;
    }
out:
    if (region) {
        free(region);
    } else {
        for (uint64_t i = 0; i < a.depth; i++) {
            free(w[i].buf);
        }
    }
    free(w);
    free(b);
    return ret;
}

const QkCommand qk_cmd_bench = {
    .name = "bench",
    .summary = "measure request throughput (qemu-img bench compatible)",
    .usage = usage_text,
    .run = run,
};
