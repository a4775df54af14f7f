/*
 * Parallel passes over an image in slices (see slices.h). Owns the work
 * hand-out (each worker takes the next slice not taken), the buffers and
 * waiting for the workers to finish. The workers' buffers are slots of
 * one region in huge pages (qk_io_buf_alloc): with -t/-T none a direct
 * request from a buffer on scattered 4 KiB pages reaches the disk split.
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
    char *region;       /* one buf_size slot per worker */
    int slots_taken;
    QkSliceFn *fn;
    void *opaque;
    int ret;
    int running;
    QkCoQueue finished; /* the caller, until running is 0 */
} SliceRun;

static void coroutine_fn worker(void *opaque)
{
    SliceRun *w = opaque;
    void *buf = w->region + (size_t)w->slots_taken++ * w->buf_size;
    while (w->ret == 0 && w->next < w->size) {
        uint64_t off = w->next;
        uint64_t len = QK_MIN(w->slice, w->size - off);
        w->next += len;
        int r = w->fn(w->opaque, off, len, buf);
        if (r < 0 && w->ret == 0) {
            w->ret = r;
        }
    }
    if (--w->running == 0) {
        qk_co_queue_wake_all(&w->finished);
    }
}

int coroutine_fn qk_co_run_slices(uint64_t size, uint64_t slice, int workers, size_t buf_size,
                                  size_t align, QkSliceFn *fn, void *opaque)
{
    if (align < sizeof(void *)) {
        align = sizeof(void *);
    }
    if (align & (align - 1)) {
        return -EINVAL;
    }
    SliceRun w = {
        .size = size, .slice = slice, .buf_size = qk_align_up(buf_size, align), .align = align,
        .fn = fn, .opaque = opaque,
    };
    workers = QK_MAX(1, QK_MIN(workers, 64));
    w.region = qk_io_buf_alloc(align, w.buf_size * (size_t)workers);
    if (!w.region) {
        return -ENOMEM;
    }
    w.running = workers;
    for (int i = 0; i < workers; i++) {
        qk_coroutine_enter(qk_coroutine_create(worker, &w));
    }
    while (w.running) {
        qk_co_queue_wait(&w.finished);
    }
    free(w.region);
    return w.ret;
}
