/*
 * io_uring backend. Requests queued during one loop iteration are
 * submitted together, so a burst of coroutines costs one system call.
 * Operations io_uring cannot do on this kernel (ftruncate) run inline.
 */
#include "aio/backend.h"
#include "aio/coroutine.h"
#include "aio/uring_writer.h"
#include "util/tunables.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RING_ENTRIES 256
/* Buffered reads io_uring can do without blocking run inside
 * io_uring_enter on the loop thread: a 1 MiB copy from the page cache holds
 * the loop (and every NBD request behind it) for a millisecond or more.
 * Reads (and O_DIRECT writes) from async_min bytes on go straight to the
 * kernel's workers; below it running inline is cheaper than the
 * hand-off. Buffered writes from async_min_write bytes on go to the
 * backend's writer threads (uring_writer.c), which copy them into the
 * page cache on the other CPU while the loop prepares the next requests;
 * if the kernel cannot post its results (no IORING_OP_MSG_RING) they go to
 * io_uring's workers instead (IOSQE_ASYNC). The two sizes (128 KiB and
 * 4 KiB by default), the writer threads and the ring's setup flags are
 * tunables (util/tunables.h), so the trade-offs can be measured.
 *
 * Requests go to the kernel every submit_batch SQEs (each as it is queued
 * by default) rather than all at the loop's next io_uring_enter: when 32
 * completions come in together, the first request re-issued no longer
 * waits in the ring while the other 31 coroutines run, and the device gets
 * a steadier stream (4k random writes at depth 32 on an allocated image,
 * cache=none: 12-18% less time in two A/B runs with batches of 8). Batches
 * of 1 did better still once the loop's own costs fell (3 alternating
 * rounds against 8: 4k random writes at depth 8 +13%, at depth 32 +6%,
 * reads at depth 128 +6%; `qcowkit serve` under fio's nbd engine, 4k
 * random reads at depth 32: 74-77K IOPS against 60-61K), so that is the
 * default. A request that continues the previous one does not end a
 * batch, so a sequential stream still reaches the block layer in one
 * piece and merges (4k sequential writes at depth 128 took 26% longer
 * when batches of 8 cut it up), up to seq_max bytes (256 KiB by default):
 * merged into one request of 512 KiB to 4 MiB, a deep stream
 * kept this disk busy with one request at a time while the loop prepared
 * the next, where pieces of 256 KiB keep several at the device (5
 * alternating runs, cache=none: 4k writes at depth 128 390K -> 452K IOPS,
 * 4k reads 331K -> 364K, 64k reads at depth 32 20.8K -> 23.8K). */

/* One writer thread per file written (by descriptor), so writes to
 * different files run side by side as before and one file's slow write
 * (dirty-page throttling) does not hold up another's; files past
 * MAX_WRITERS go to io-wq. */
#define MAX_WRITERS 8

typedef struct WriterSlot {
    int fd;
    QkUringWriter *w;
    QkAioReq *head, *tail; /* for the writer, not handed over yet */
} WriterSlot;

typedef struct Uring {
    struct io_uring ring;
    size_t async_min;       /* reads */
    size_t async_min_write;
    unsigned submit_batch;  /* SQEs that go to the kernel at once; 0: no limit */
    int last_fd;            /* the last read or write prepared, */
    QkAioOp last_op;        /* to tell a sequential stream */
    uint64_t last_end;
    size_t seq_max;         /* a sequential run ends a batch at this many bytes; 0: never */
    size_t seq_bytes;       /* bytes of the current run not yet submitted */
    QkAioReq *overflow_head, *overflow_tail; /* waiting for a free SQE */
    unsigned queued;    /* SQEs prepared but not submitted */
    unsigned in_flight; /* submitted, not completed */
    bool use_writer; /* buffered writes go to writer threads */
    WriterSlot writers[MAX_WRITERS];
    unsigned nwriters;
} Uring;

static size_t req_len(const QkAioReq *req)
{
    size_t len = 0;
    for (int i = 0; i < req->iovcnt; i++) {
        len += req->iov[i].iov_len;
    }
    return len;
}

/* Hands the prepared SQEs to the kernel; what it did not take stays
 * queued. Returns io_uring_submit's result. */
static int submit_queued(Uring *u)
{
    int r = io_uring_submit(&u->ring);
    if (r > 0) {
        u->in_flight += (unsigned)r;
        u->queued -= (unsigned)r;
    }
    if (u->queued == 0) {
        u->seq_bytes = 0;
    }
    return r;
}

static bool prep(Uring *u, QkAioReq *req)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        return false;
    }
    switch (req->op) {
    case QK_AIO_READ:
        io_uring_prep_readv(sqe, req->fd, req->iov, req->iovcnt, req->off);
        break;
    case QK_AIO_WRITE:
        io_uring_prep_writev(sqe, req->fd, req->iov, req->iovcnt, req->off);
        break;
    case QK_AIO_FDATASYNC:
        io_uring_prep_fsync(sqe, req->fd, IORING_FSYNC_DATASYNC);
        break;
    case QK_AIO_FALLOCATE:
        io_uring_prep_fallocate(sqe, req->fd, req->mode, req->off, req->len);
        break;
    default:
        abort();
    }
    size_t min = req->op == QK_AIO_READ                 ? u->async_min
                 : req->op == QK_AIO_WRITE && !req->direct ? u->async_min_write
                 : req->op == QK_AIO_WRITE                 ? u->async_min
                                                           : 0;
    if (min && req_len(req) >= min) {
        io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    }
    io_uring_sqe_set_data(sqe, req);
    u->queued++;
    /* A request that continues the last one stays queued: the block
     * layer merges what one io_uring_enter brings in together. */
    bool rw = req->op == QK_AIO_READ || req->op == QK_AIO_WRITE;
    bool continues = rw && req->fd == u->last_fd && req->op == u->last_op && req->off == u->last_end;
    if (rw) {
        u->last_fd = req->fd;
        u->last_op = req->op;
        u->last_end = req->off + req_len(req);
        u->seq_bytes = (continues ? u->seq_bytes : 0) + req_len(req);
    }
    bool run_full = continues && u->seq_max && u->seq_bytes >= u->seq_max;
    if ((u->submit_batch && u->queued >= u->submit_batch && !continues) || run_full) {
        submit_queued(u); /* a failure is the loop's next submit's to report */
    }
    return true;
}

/* The writer for req's file, started on its first buffered write so that
 * loops and files that never make one pay nothing; NULL sends the write
 * to io-wq (no IORING_OP_MSG_RING, no thread, or too many files). The
 * writer's results message carries its address with the low bit set,
 * which no request address has. */
static WriterSlot *writer_for(Uring *u, const QkAioReq *req)
{
    for (unsigned i = 0; i < u->nwriters; i++) {
        if (u->writers[i].fd == req->fd) {
            return &u->writers[i];
        }
    }
    if (u->nwriters == 0 && !qk_uring_writer_usable()) {
        u->use_writer = false;
        return NULL;
    }
    if (u->nwriters == MAX_WRITERS) {
        return NULL;
    }
    WriterSlot *ws = &u->writers[u->nwriters];
    int e = 0;
    ws->w = qk_uring_writer_new(u->ring.ring_fd, &e);
    if (!ws->w) {
        u->use_writer = false; /* out of threads: stop trying */
        return NULL;
    }
    ws->fd = req->fd;
    ws->head = ws->tail = NULL;
    u->nwriters++;
    return ws;
}

static void uring_queue(void *st, QkAioReq *req)
{
    Uring *u = st;
    if (req->op == QK_AIO_FTRUNCATE) {
        /* The submitter has not yielded yet: complete it from the loop. */
        int r = ftruncate(req->fd, (off_t)req->len);
        req->result = r < 0 ? -errno : 0;
        qk_coroutine_wake(req->co);
        return;
    }
    if (u->use_writer && req->op == QK_AIO_WRITE && !req->direct &&
        req_len(req) >= u->async_min_write) {
        WriterSlot *ws = writer_for(u, req);
        if (ws) {
            qk_aio_list_append(&ws->head, &ws->tail, req);
            return;
        }
    }
    if (u->overflow_head || !prep(u, req)) {
        qk_aio_list_append(&u->overflow_head, &u->overflow_tail, req);
    }
}

static void push_writers(Uring *u)
{
    for (unsigned i = 0; i < u->nwriters; i++) {
        WriterSlot *ws = &u->writers[i];
        if (ws->head) {
            u->in_flight += qk_uring_writer_push(ws->w, ws->head, ws->tail);
            ws->head = ws->tail = NULL;
        }
    }
}

static unsigned uring_submit(void *st)
{
    Uring *u = st;
    push_writers(u);
    for (;;) {
        if (u->queued) {
            int r = submit_queued(u);
            if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR) {
                abort(); /* a broken ring is not recoverable */
            }
        }
        /* Move overflow into freed SQEs. */
        bool moved = false;
        while (u->overflow_head && prep(u, u->overflow_head)) {
            u->overflow_head = u->overflow_head->next;
            moved = true;
        }
        if (!u->overflow_head) {
            u->overflow_tail = NULL;
        }
        if (!moved) {
            break;
        }
    }
    return u->in_flight + u->queued;
}

static unsigned uring_reap(void *st, unsigned max)
{
    Uring *u = st;
    unsigned n = 0;
    struct io_uring_cqe *cqe;
    while ((!max || n < max) && io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        QkAioReq *req = io_uring_cqe_get_data(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        if ((uintptr_t)req & 1) { /* a writer's results */
            QkUringWriter *w = (QkUringWriter *)((uintptr_t)req & ~(uintptr_t)1);
            for (QkAioReq *r = qk_uring_writer_take(w), *next; r; r = next) {
                next = r->next;
                u->in_flight--;
                n++;
                qk_aio_complete(r, r->result);
            }
            continue;
        }
        u->in_flight--;
        n++;
        qk_aio_complete(req, res);
    }
    return n;
}

static void uring_wait(void *st, int64_t timeout_ns)
{
    Uring *u = st;
    struct io_uring_cqe *cqe;
    if (timeout_ns < 0) {
        io_uring_wait_cqe(&u->ring, &cqe);
    } else {
        struct __kernel_timespec ts = {
            .tv_sec = timeout_ns / 1000000000LL,
            .tv_nsec = timeout_ns % 1000000000LL,
        };
        io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
    }
}

static unsigned uring_submit_wait(void *st, int64_t timeout_ns)
{
    Uring *u = st;
    if (!u->queued || u->overflow_head) {
        /* Nothing new, or more than the ring holds: the plain path. */
        unsigned n = uring_submit(st);
        if (n) {
            uring_wait(st, timeout_ns);
        }
        return n;
    }
    push_writers(u);
    struct __kernel_timespec ts;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
    }
    struct io_uring_cqe *cqe;
    int r = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, timeout_ns >= 0 ? &ts : NULL, NULL);
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        abort(); /* a broken ring is not recoverable */
    }
    /* The return value is the wait's when that failed; what the kernel
     * took is what left the submission ring. */
    unsigned left = io_uring_sq_ready(&u->ring);
    u->in_flight += u->queued - left;
    u->queued = left;
    return u->in_flight + u->queued;
}

static void uring_destroy(void *st)
{
    Uring *u = st;
    for (unsigned i = 0; i < u->nwriters; i++) {
        qk_uring_writer_free(u->writers[i].w);
    }
    io_uring_queue_exit(&u->ring);
    free(u);
}

void *qk_uring_backend_new(QkAioBackend *ops, int *errno_out)
{
    Uring *u = calloc(1, sizeof(*u));
    if (!u) {
        *errno_out = ENOMEM;
        return NULL;
    }
    unsigned flags = qk_tunable(QK_TUNE_URING_COOP) ? IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG : 0;
    int r = io_uring_queue_init(RING_ENTRIES, &u->ring, flags);
    if (r == -EINVAL && flags) {
        r = io_uring_queue_init(RING_ENTRIES, &u->ring, 0);
    }
    if (r < 0) {
        *errno_out = -r;
        free(u);
        return NULL;
    }
    u->async_min = (size_t)qk_tunable(QK_TUNE_URING_ASYNC_MIN);
    u->async_min_write = (size_t)qk_tunable(QK_TUNE_URING_ASYNC_MIN_WRITE);
    u->submit_batch = (unsigned)qk_tunable(QK_TUNE_URING_SUBMIT_BATCH);
    u->seq_max = (size_t)qk_tunable(QK_TUNE_URING_SEQ_MAX);
    u->last_fd = -1;
    u->use_writer = u->async_min_write && qk_tunable(QK_TUNE_URING_WRITER);
    ops->name = "io_uring";
    ops->queue = uring_queue;
    ops->submit = uring_submit;
    ops->reap = uring_reap;
    ops->wait = uring_wait;
    ops->submit_wait = uring_submit_wait;
    ops->destroy = uring_destroy;
    ops->event_fd = u->ring.ring_fd;
    return u;
}
