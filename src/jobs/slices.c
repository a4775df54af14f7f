/*
 * Parallel passes over an image in slices (see slices.h). Owns the work
 * hand-out (each worker takes the next slice not taken), the buffers and
 * waiting for the workers to finish.
 */
#include "jobs/slices.h"
#include "aio/co_sync.h"
#include "common/checked.h"
#include "util/iov.h"

#include <errno.h>
#include <stdlib.h>

typedef struct SliceRun {
    uint64_t size, slice;
    uint64_t next;      /* first byte no worker has taken yet */
    size_t buf_size, align;
    QkSliceFn *fn;
    void *opaque;
    int ret;
    int running;
    QkCoQueue finished; /* the caller, until running is 0 */
} SliceRun;

static void coroutine_fn worker(void *opaque)
{
    SliceRun *w = opaque;
    void *buf = qk_aligned_alloc(w->align, w->buf_size);
    if (!buf && w->ret == 0) {
        w->ret = -ENOMEM;
    }
    while (buf && w->ret == 0 && w->next < w->size) {
        uint64_t off = w->next;
        uint64_t len = QK_MIN(w->slice, w->size - off);
        w->next += len;
        int r = w->fn(w->opaque, off, len, buf);
        if (r < 0 && w->ret == 0) {
            w->ret = r;
        }
    }
    free(buf);
    if (--w->running == 0) {
        qk_co_queue_wake_all(&w->finished);
    }
}

int coroutine_fn qk_co_run_slices(uint64_t size, uint64_t slice, int workers, size_t buf_size,
                                  size_t align, QkSliceFn *fn, void *opaque)
{
    SliceRun w = {
        .size = size, .slice = slice, .buf_size = buf_size, .align = align,
        .fn = fn, .opaque = opaque,
    };
    workers = QK_MAX(1, QK_MIN(workers, 64));
    w.running = workers;
    for (int i = 0; i < workers; i++) {
        qk_coroutine_enter(qk_coroutine_create(worker, &w));
    }
    while (w.running) {
        qk_co_queue_wait(&w.finished);
    }
    return w.ret;
}
