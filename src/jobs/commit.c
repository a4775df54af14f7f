/*
 * Commit: copies what the layers of an image above a base hold into the
 * base (qemu-img commit). Only ranges some layer above the base has
 * allocated are read (block status across the chain); zero ranges become
 * zero writes; the copy runs as several coroutines, each taking the next
 * slice of the image. The base is flushed before the caller may empty the
 * top (its data must be durable in the base before the top lets go).
 *
 * Owns the copy loop and its progress count; opening the images and
 * emptying the top are the caller's.
 */
#include "jobs/commit.h"
#include "jobs/slices.h"
#include "aio/coroutine.h"
#include "aio/loop.h"
#include "common/checked.h"
#include "util/iov.h"
#include "jobs/throttle.h"

#include <errno.h>
#include <stdlib.h>

#define SLICE (4u << 20)
#define MAX_IO (1u << 20)

typedef struct CommitRun {
    QkBlock *top, *base;
    int base_depth;
    uint64_t size;
    uint64_t done;
    int ret;
    QkRateLimit limit;
    const QkCommitOptions *opts;
} CommitRun;

/* With -r, waits until n more bytes may be copied (every worker charges
 * the one bucket, so the rate is the whole copy's). */
static void coroutine_fn throttle(CommitRun *c, uint64_t n)
{
    qk_co_throttle(&c->limit, n);
}

/* Copies [off, off+len), where some layer above the base has data. */
static int coroutine_fn copy_range(CommitRun *c, uint64_t off, uint64_t len, void *buf)
{
    while (len) {
        uint64_t n;
        int depth = 0;
        int st = qk_co_block_status_above(c->top, off, QK_MIN(len, (uint64_t)MAX_IO), &n, &depth);
        if (st < 0) {
            return st;
        }
        if (n == 0) {
            return -EIO;
        }
        int r = 0;
        /* Held above the base, or zeros because a layer above the base
         * ends here (a shorter backing file hides what lies below it). */
        if ((st & (QK_BS_ALLOCATED | QK_BS_ZERO)) && depth < c->base_depth) {
            throttle(c, n);
            if ((st & QK_BS_ZERO) && !(st & QK_BS_DATA)) {
                r = qk_co_pwrite_zeroes(c->base, off, n, 0);
            } else {
                r = qk_co_pread(c->top, off, n, buf, 0);
                if (r == 0) {
                    r = qk_co_pwrite(c->base, off, n, buf, 0);
                }
            }
        }
        if (r < 0) {
            return r;
        }
        off += n;
        len -= n;
        c->done += n;
        if (c->opts->progress) {
            c->opts->progress(c->done, c->size, c->opts->opaque);
        }
    }
    return 0;
}

static int coroutine_fn copy_slice(void *opaque, uint64_t off, uint64_t len, void *buf)
{
    return copy_range(opaque, off, len, buf);
}

int coroutine_fn qk_co_commit_copy(QkBlock *top, int base_depth, QkBlock *base,
                                   const QkCommitOptions *opts)
{
    int64_t size = qk_block_length(top);
    int64_t bsize = qk_block_length(base);
    if (size < 0) {
        return (int)size;
    }
    if (bsize < 0) {
        return (int)bsize;
    }
    CommitRun c = {
        .top = top, .base = base, .base_depth = base_depth, .size = (uint64_t)size,
        .opts = opts,
    };
    /* Little burst credit: a limit should hold from the start. */
    qk_ratelimit_init(&c.limit, opts->rate, 100 * 1000 * 1000);
    /* A base smaller than the top grows to take all of it, as QEMU does. */
    if (bsize < size) {
        QkError err = {0};
        int r = qk_co_truncate(base, (uint64_t)size, QK_PREALLOC_OFF, &err);
        if (r < 0) {
            return r;
        }
    }
    c.ret = qk_co_run_slices(c.size, SLICE, opts->workers, MAX_IO, qk_block_buf_align(top),
                             copy_slice, &c);
    if (c.ret == 0) {
        c.ret = qk_co_flush(base);
    }
    return c.ret;
}
