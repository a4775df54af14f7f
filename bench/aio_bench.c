/*
 * Micro-benchmarks for the runtime: coroutine switch cost, and 4 KiB random
 * reads at a given depth through the block layer (raw over file) on the
 * current aio backend. Prints one JSON object per run for the bench scripts.
 *   qk-aio-bench switch [N]
 *   qk-aio-bench randread FILE DEPTH SECONDS
 */
#include "aio/loop.h"
#include "block/block.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void coroutine_fn bounce(void *opaque)
{
    long n = *(long *)opaque;
    for (long i = 0; i < n; i++) {
        qk_coroutine_yield();
    }
}

static int bench_switch(long n)
{
    QkCoroutine *co = qk_coroutine_create(bounce, &n);
    int64_t t0 = qk_clock_ns();
    for (long i = 0; i <= n; i++) {
        qk_coroutine_enter(co);
    }
    int64_t t1 = qk_clock_ns();
    /* Each iteration is two switches (enter and yield). */
    printf("{\"test\":\"switch\",\"switches\":%ld,\"ns_per_switch\":%.2f}\n",
           2 * n, (double)(t1 - t0) / (2.0 * (double)n));
    return 0;
}

typedef struct RR {
    QkBlock *bs;
    uint64_t size;
    int64_t deadline;
    uint64_t ops;
    int active;
    int err;
    uint64_t seed;
} RR;

static void coroutine_fn reader(void *opaque)
{
    RR *rr = opaque;
    void *buf = qk_aligned_alloc(4096, 4096);
    uint64_t blocks = rr->size / 4096;
    uint64_t x = rr->seed++ * 0x9E3779B97F4A7C15ULL + 1;
    while (qk_clock_ns() < rr->deadline) {
        for (int k = 0; k < 64; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            int r = qk_co_pread(rr->bs, (x % blocks) * 4096, 4096, buf, 0);
            if (r < 0) {
                rr->err = r;
                goto out;
            }
            rr->ops++;
        }
    }
out:
    free(buf);
    rr->active--;
}

static int bench_randread(const char *file, int depth, double seconds)
{
    QkError err = {0};
    QkOpenOptions o = {.format = "raw"};
    QkBlock *bs = qk_block_open(file, &o, &err);
    if (!bs) {
        fprintf(stderr, "qk-aio-bench: %s\n", err.msg);
        return 1;
    }
    RR rr = {.bs = bs, .size = bs->size, .seed = 1};
    QkLoop *loop = qk_loop_get();
    int64_t t0 = qk_clock_ns();
    rr.deadline = t0 + (int64_t)(seconds * 1e9);
    rr.active = depth;
    for (int i = 0; i < depth; i++) {
        qk_coroutine_enter(qk_coroutine_create(reader, &rr));
    }
    while (rr.active) {
        qk_loop_run_once(loop, true);
    }
    double el = (double)(qk_clock_ns() - t0) / 1e9;
    printf("{\"test\":\"randread\",\"backend\":\"%s\",\"depth\":%d,\"iops\":%.0f}\n",
           qk_loop_backend_name(loop), depth, (double)rr.ops / el);
    qk_block_close(bs);
    return rr.err ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "switch") == 0) {
        return bench_switch(argc > 2 ? atol(argv[2]) : 10000000);
    }
    if (argc >= 5 && strcmp(argv[1], "randread") == 0) {
        return bench_randread(argv[2], atoi(argv[3]), atof(argv[4]));
    }
    fprintf(stderr, "usage: qk-aio-bench switch [N] | randread FILE DEPTH SECONDS\n");
    return 1;
}
