/*
 * VM-state writer and reader (see vmstate.h for the contract).
 * Owns: stream buffering, the buffer free list, read-ahead slots. Knows the
 * block layer only through the sink/source function and in-flight counts.
 */
#include "block/vmstate.h"
#include "aio/task_pool.h"
#include "block/block.h"
#include "common/checked.h"
#include "util/iov.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define BUF_ALIGN 4096

typedef struct Buf {
    struct Buf *next;
    char *data;
} Buf;

struct QkVmStateWriter {
    QkBlock *bs;
    QkVmStateIo *sink;
    QkTaskPool *pool;
    uint64_t buf_size;
    bool unbuffered;
    Buf *free_bufs;
    Buf *cur;             /* buffer being filled */
    uint64_t cur_start;   /* stream position of cur->data[0] */
    uint64_t cur_len;     /* bytes filled */
    uint64_t cur_cap;     /* bytes until the next aligned boundary */
    int error;
    uint64_t mem, peak_mem;
};

typedef struct WriteTask {
    QkVmStateWriter *w;
    Buf *buf;
    uint64_t pos;
    uint64_t len;
} WriteTask;

int coroutine_fn qk_co_save_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    if (!bs->drv->co_save_vmstate) {
        return -ENOTSUP;
    }
    if (bs->no_guest_data) {
        return -ENOMEDIUM;
    }
    return bs->drv->co_save_vmstate(bs, qiov, pos);
}

int coroutine_fn qk_co_load_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    if (!bs->drv->co_load_vmstate) {
        return -ENOTSUP;
    }
    if (bs->no_guest_data) {
        return -ENOMEDIUM;
    }
    return bs->drv->co_load_vmstate(bs, qiov, pos);
}

/* 2 MiB by default: the size of a huge page, so each buffer gets one
 * (qk_io_buf_alloc) and its direct request reaches the disk whole. With
 * 1 MiB buffers on scattered 4 KiB pages, saving a 2 GiB stream with
 * cache=none took 3.13-3.33 s and loading it 1.32-1.45 s; with 2 MiB
 * buffers in huge pages 1.63-1.71 s and 0.31-0.36 s (bench/vmstate_gen,
 * page cache dropped, 3 runs alternating, 2026-12-05). Plain 2 MiB
 * buffers were no faster than 1 MiB ones. */
#define DEFAULT_BUF_SIZE (2u << 20)

static uint64_t pick_buf_size(const QkVmStateOptions *o)
{
    uint64_t sz = o && o->buf_size ? o->buf_size : DEFAULT_BUF_SIZE;
    if (o && !o->buf_size && o->cluster_size > sz) {
        sz = o->cluster_size;
    }
    return qk_align_up(sz, BUF_ALIGN);
}

QkVmStateWriter *qk_vmstate_writer_new(QkBlock *bs, const QkVmStateOptions *opts, QkVmStateIo *sink)
{
    QkVmStateWriter *w = calloc(1, sizeof(*w));
    if (!w) {
        return NULL;
    }
    w->bs = bs;
    w->sink = sink ? sink : qk_co_save_vmstate;
    w->buf_size = pick_buf_size(opts);
    w->unbuffered = opts && opts->unbuffered;
    w->pool = qk_task_pool_new(opts && opts->workers > 0 ? opts->workers : 4);
    if (!w->pool) {
        free(w);
        return NULL;
    }
    return w;
}

static Buf *buf_get(QkVmStateWriter *w)
{
    Buf *b = w->free_bufs;
    if (b) {
        w->free_bufs = b->next;
        return b;
    }
    b = malloc(sizeof(*b));
    if (!b) {
        return NULL;
    }
    b->data = qk_io_buf_alloc(BUF_ALIGN, w->buf_size);
    if (!b->data) {
        free(b);
        return NULL;
    }
    w->mem += w->buf_size;
    if (w->mem > w->peak_mem) {
        w->peak_mem = w->mem;
    }
    return b;
}

static void buf_put(QkVmStateWriter *w, Buf *b)
{
    b->next = w->free_bufs;
    w->free_bufs = b;
}

static int coroutine_fn write_task(void *opaque)
{
    WriteTask *t = opaque;
    QkVmStateWriter *w = t->w;
    QkIov q;
    qk_iov_init_buf(&q, t->buf->data, t->len);
    int r = w->sink(w->bs, &q, t->pos);
    buf_put(w, t->buf);
    if (r < 0 && !w->error) {
        w->error = r;
    }
    qk_block_dec_in_flight(w->bs);
    free(t);
    return r;
}

/* Hands the current buffer to the pool (waits for a slot first). */
static void coroutine_fn submit_cur(QkVmStateWriter *w)
{
    if (!w->cur) {
        return;
    }
    if (w->cur_len == 0) {
        buf_put(w, w->cur);
        w->cur = NULL;
        return;
    }
    WriteTask *t = malloc(sizeof(*t));
    if (!t) {
        w->error = w->error ? w->error : -ENOMEM;
        buf_put(w, w->cur);
        w->cur = NULL;
        return;
    }
    *t = (WriteTask){w, w->cur, w->cur_start, w->cur_len};
    w->cur = NULL;
    /* Count it before waiting for a slot so a drain that starts now waits too. */
    qk_block_inc_in_flight(w->bs);
    qk_task_pool_start(w->pool, write_task, t);
}

/* Starts a new buffer at stream position pos, ending at the next multiple
 * of the buffer size so later buffers are aligned. */
static int coroutine_fn start_buf(QkVmStateWriter *w, uint64_t pos)
{
    /* Take a buffer only once a slot is free: bounds memory to workers + 1. */
    qk_task_pool_wait_slot(w->pool);
    w->cur = buf_get(w);
    if (!w->cur) {
        return -ENOMEM;
    }
    w->cur_start = pos;
    w->cur_len = 0;
    w->cur_cap = w->buf_size - pos % w->buf_size;
    return 0;
}

static int coroutine_fn write_direct(QkVmStateWriter *w, uint64_t pos, const void *buf, size_t len)
{
    QkIov q;
    qk_iov_init_buf(&q, (void *)buf, len);
    qk_block_inc_in_flight(w->bs);
    int r = w->sink(w->bs, &q, pos);
    qk_block_dec_in_flight(w->bs);
    return r;
}

int coroutine_fn qk_vmstate_write(QkVmStateWriter *w, uint64_t pos, const void *buf, size_t len)
{
    if (w->error) {
        return w->error;
    }
    if (len == 0) {
        return 0;
    }
    if (w->unbuffered) {
        int r = write_direct(w, pos, buf, len);
        if (r < 0) {
            w->error = r;
        }
        return r;
    }
    if (w->cur && pos != w->cur_start + w->cur_len) {
        /* Out of sequence: the buffered bytes go first, all of them on disk,
         * then this piece directly, so overlapping data lands in order. */
        submit_cur(w);
        qk_task_pool_wait_all(w->pool);
        if (w->error) {
            return w->error;
        }
        int r = write_direct(w, pos, buf, len);
        if (r < 0) {
            w->error = r;
        }
        return r;
    }
    const char *p = buf;
    while (len > 0) {
        if (!w->cur) {
            int r = start_buf(w, pos);
            if (r < 0) {
                w->error = r;
                return r;
            }
        }
        size_t n = (size_t)QK_MIN((uint64_t)len, w->cur_cap - w->cur_len);
        memcpy(w->cur->data + w->cur_len, p, n);
        w->cur_len += n;
        p += n;
        pos += n;
        len -= n;
        if (w->cur_len == w->cur_cap) {
            submit_cur(w);
            if (w->error) {
                return w->error;
            }
        }
    }
    return 0;
}

int coroutine_fn qk_vmstate_writer_flush(QkVmStateWriter *w)
{
    submit_cur(w);
    qk_task_pool_wait_all(w->pool);
    return w->error ? w->error : qk_task_pool_status(w->pool);
}

uint64_t qk_vmstate_writer_peak_memory(const QkVmStateWriter *w)
{
    return w->peak_mem;
}

void qk_vmstate_writer_free(QkVmStateWriter *w)
{
    if (!w) {
        return;
    }
    if (w->cur) {
        buf_put(w, w->cur);
    }
    while (w->free_bufs) {
        Buf *b = w->free_bufs;
        w->free_bufs = b->next;
        free(b->data);
        free(b);
    }
    qk_task_pool_free(w->pool);
    free(w);
}

/* ---- reader ---- */

typedef struct Slot {
    uint64_t chunk;       /* chunk index held, or UINT64_MAX */
    bool ready;
    int error;
    uint64_t len;
    char *data;
    QkCoQueue waiters;
} Slot;

struct QkVmStateReader {
    QkBlock *bs;
    QkVmStateIo *source;
    QkTaskPool *pool;
    uint64_t size;
    uint64_t buf_size;
    int nslots;
    Slot *slots;
    uint64_t next_prefetch; /* next chunk to request */
};

typedef struct ReadTask {
    QkVmStateReader *r;
    Slot *slot;
} ReadTask;

QkVmStateReader *qk_vmstate_reader_new(QkBlock *bs, uint64_t size, const QkVmStateOptions *opts,
                                       QkVmStateIo *source)
{
    QkVmStateReader *r = calloc(1, sizeof(*r));
    if (!r) {
        return NULL;
    }
    r->bs = bs;
    r->source = source ? source : qk_co_load_vmstate;
    r->size = size;
    r->buf_size = pick_buf_size(opts);
    int workers = opts && opts->workers > 0 ? opts->workers : 4;
    r->nslots = workers + 1;
    r->pool = qk_task_pool_new(workers);
    r->slots = calloc((size_t)r->nslots, sizeof(Slot));
    if (!r->pool || !r->slots) {
        qk_task_pool_free(r->pool);
        free(r->slots);
        free(r);
        return NULL;
    }
    for (int i = 0; i < r->nslots; i++) {
        r->slots[i].chunk = UINT64_MAX;
        qk_co_queue_init(&r->slots[i].waiters);
    }
    return r;
}

static int coroutine_fn read_task(void *opaque)
{
    ReadTask t = *(ReadTask *)opaque;
    free(opaque);
    Slot *s = t.slot;
    QkIov q;
    qk_iov_init_buf(&q, s->data, s->len);
    int ret = t.r->source(t.r->bs, &q, s->chunk * t.r->buf_size);
    s->error = ret < 0 ? ret : 0;
    s->ready = true;
    qk_block_dec_in_flight(t.r->bs);
    qk_co_queue_wake_all(&s->waiters);
    return ret < 0 ? ret : 0;
}

static Slot *slot_of(QkVmStateReader *r, uint64_t chunk)
{
    return &r->slots[chunk % (uint64_t)r->nslots];
}

/* Requests chunk into its slot unless the slot is busy with a chunk that
 * a reader may still need. */
static void coroutine_fn request_chunk(QkVmStateReader *r, uint64_t chunk)
{
    Slot *s = slot_of(r, chunk);
    if (s->chunk == chunk) {
        return;
    }
    while (s->chunk != UINT64_MAX && !s->ready) {
        qk_co_queue_wait(&s->waiters); /* a previous read into this slot */
    }
    if (!s->data) {
        s->data = qk_io_buf_alloc(BUF_ALIGN, r->buf_size);
        if (!s->data) {
            s->chunk = chunk;
            s->ready = true;
            s->error = -ENOMEM;
            return;
        }
    }
    s->chunk = chunk;
    s->ready = false;
    s->error = 0;
    s->len = QK_MIN(r->buf_size, r->size - chunk * r->buf_size);
    ReadTask *t = malloc(sizeof(*t));
    if (!t) {
        s->ready = true;
        s->error = -ENOMEM;
        return;
    }
    *t = (ReadTask){r, s};
    qk_block_inc_in_flight(r->bs);
    qk_task_pool_start(r->pool, read_task, t);
}

int64_t coroutine_fn qk_vmstate_read(QkVmStateReader *r, uint64_t pos, void *buf, size_t len)
{
    if (pos >= r->size) {
        return 0;
    }
    len = (size_t)QK_MIN((uint64_t)len, r->size - pos);
    uint64_t nchunks = QK_DIV_ROUND_UP(r->size, r->buf_size);
    size_t done = 0;
    while (done < len) {
        uint64_t chunk = (pos + done) / r->buf_size;
        /* Keep the pool busy with the chunks after this one. */
        if (r->next_prefetch <= chunk || r->next_prefetch > chunk + (uint64_t)r->nslots) {
            r->next_prefetch = chunk;
        }
        while (r->next_prefetch < nchunks && r->next_prefetch < chunk + (uint64_t)r->nslots) {
            request_chunk(r, r->next_prefetch++);
        }
        request_chunk(r, chunk);
        Slot *s = slot_of(r, chunk);
        while (!s->ready) {
            qk_co_queue_wait(&s->waiters);
        }
        if (s->chunk != chunk) {
            continue; /* recycled while we slept: ask again */
        }
        if (s->error) {
            return s->error;
        }
        uint64_t in = (pos + done) - chunk * r->buf_size;
        size_t n = (size_t)QK_MIN((uint64_t)(len - done), s->len - in);
        memcpy((char *)buf + done, s->data + in, n);
        done += n;
    }
    return (int64_t)done;
}

void coroutine_fn qk_vmstate_reader_close(QkVmStateReader *r)
{
    if (!r) {
        return;
    }
    qk_task_pool_wait_all(r->pool);
    qk_task_pool_free(r->pool);
    for (int i = 0; i < r->nslots; i++) {
        free(r->slots[i].data);
    }
    free(r->slots);
    free(r);
}
