/*
 * The asynchronous public API (qk_async_*, qk_queue_*): an image owned by
 * an engine thread that runs its requests as coroutines on its own event
 * loop, and queues through which other threads submit requests and collect
 * completions.
 *
 * Hand-offs are batched both ways: qk_queue_do_io() moves a queue's whole
 * pending list to the engine's inbox under one lock and writes the
 * engine's eventfd only when the inbox was empty; the engine appends
 * finished requests to their queue's done list and writes the queue's
 * eventfd (at the end of the loop iteration) only when that list was
 * empty. So a burst of N requests costs
 * one wake-up each way, not N. Request structures are recycled per queue
 * by the queue's own thread; the engine never allocates or frees them.
 *
 * An inline image (QK_ASYNC_INLINE) has no engine thread: the thread that
 * opened it runs the engine's loop inside qk_queue_do_io(), so requests
 * start and finish without a hand-off between threads. On two cores the
 * hand-off costs a quarter of the IOPS (bench/async_api.sh). Its queues'
 * completion descriptors are epoll sets holding the queue's eventfd, the
 * loop's own descriptor and a timerfd for the loop's next timer: whatever
 * would let the engine make progress wakes the program, which then calls
 * qk_queue_do_io().
 */
#include "qcowkit/qcowkit.h"
#include "aio/loop.h"
#include "block/api_int.h"
#include "block/block.h"
#include "util/iov.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_QUEUES 64
#define MAX_IOV 1024
#define INLINE_IOV 4

typedef enum { AOP_READ, AOP_WRITE, AOP_ZERO, AOP_DISCARD, AOP_FLUSH } AOp;

typedef struct AReq {
    QkQueue *q;
    AOp op;
    uint64_t off, len;
    int flags;
    int ret;
    void *user_data;
    struct iovec *iov;
    int iovcnt;
    struct iovec inline_iov[INLINE_IOV];
    struct AReq *next;
} AReq;

struct QkQueue {
    QkAsyncImage *img;
    int done_fd;                  /* eventfd: done list went non-empty */
    int poll_fd;                  /* inline: epoll set the program watches */
    bool kick_pending;            /* engine: a write of done_fd is scheduled */
    bool fd_kicked;               /* inline: done_fd may be readable */
    pthread_mutex_t lock;         /* done list */
    AReq *done_head, *done_tail;
    /* The owning thread's alone: */
    AReq *pend_head, *pend_tail;  /* enqueued, not handed over */
    unsigned outstanding;
    AReq *spare;                  /* recycled requests */
};

struct QkAsyncImage {
    pthread_t thread;
    int wake_fd;                  /* eventfd: inbox went non-empty, or stop */
    pthread_mutex_t lock;         /* inbox, stop, open handshake */
    pthread_cond_t opened_cond;
    AReq *in_head, *in_tail;
    bool stop;
    bool opened;                  /* the open finished (bs set, or open_ret < 0) */
    int open_ret;
    char open_msg[sizeof(((QkError *)0)->msg)];
    int close_ret;
    /* Open parameters, read by the engine. */
    char *filename;
    char *format;
    int flags;
    /* Inline images: the opening thread, its loop, the timer's fd, the
     * queue inside qk_queue_do_io (its completions need no wake-up) and
     * whether a completion arrived since do_io last looked. */
    bool inline_mode;
    pthread_t owner;
    QkLoop *loop;
    int timer_fd;
    bool timer_armed;
    QkQueue *active;
    bool progress;
    /* The engine thread's alone: */
    QkBlock *bs;
    unsigned in_flight;
    QkCoroutine *idle_waiter;     /* the dispatcher waiting for in_flight == 0 */
    uint64_t size;
    int nqueues;
    QkQueue queues[];
};

static void list_append(AReq **head, AReq **tail, AReq *r)
{
    r->next = NULL;
    if (*tail) {
        (*tail)->next = r;
    } else {
        *head = r;
    }
    *tail = r;
}

static void kick(int fd)
{
    uint64_t one = 1;
    /* EAGAIN: the counter is at its maximum, the reader is woken anyway. */
    while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

static void drain_fd(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) < 0 && errno == EINTR) {
    }
}

/* ---- engine thread ---- */

/* Writes a queue's eventfd. An inline queue remembers it did, so its
 * do_io reads the descriptor back only then: all its kicks come from
 * the owning thread. */
static void kick_queue(QkQueue *q)
{
    q->fd_kicked = true;
    kick(q->done_fd);
}

static void kick_done(void *opaque)
{
    QkQueue *q = opaque;
    q->kick_pending = false;
    kick(q->done_fd);
}

/* The queue's descriptor is written once per loop iteration at most,
 * after every completion the iteration reaped: a burst of completions
 * wakes the caller once. */
static void complete(AReq *r)
{
    QkQueue *q = r->q;
    pthread_mutex_lock(&q->lock);
    bool was_empty = !q->done_head;
    list_append(&q->done_head, &q->done_tail, r);
    pthread_mutex_unlock(&q->lock);
    q->img->progress = true;
    if (q->img->inline_mode) {
        /* Directly, not from a callback: one still queued on the thread's
         * loop when the image closes would outlive the queue. The queue
         * inside do_io needs none. */
        if (was_empty && q->img->active != q) {
            kick_queue(q);
        }
        return;
    }
    if (was_empty && !q->kick_pending) {
        q->kick_pending = true;
        qk_loop_call_soon(qk_loop_get(), kick_done, q);
    }
}

static void coroutine_fn req_co(void *opaque)
{
    AReq *r = opaque;
    QkAsyncImage *a = r->q->img;
    QkIov qiov;
    switch (r->op) {
    case AOP_READ:
    case AOP_WRITE:
        qiov = (QkIov){.iov = r->iov, .niov = r->iovcnt, .nalloc = r->iovcnt, .size = r->len};
        r->ret = r->op == AOP_READ ? qk_co_preadv(a->bs, r->off, r->len, &qiov, 0, 0)
                                   : qk_co_pwritev(a->bs, r->off, r->len, &qiov, 0, 0);
        break;
    case AOP_ZERO:
        r->ret = qk_co_pwrite_zeroes(a->bs, r->off, r->len, r->flags);
        break;
    case AOP_DISCARD:
        r->ret = qk_co_pdiscard(a->bs, r->off, r->len);
        break;
    case AOP_FLUSH:
        r->ret = qk_co_flush(a->bs);
        break;
    }
    r->ret = qk_api_error(a->bs, r->ret);
    complete(r);
    if (--a->in_flight == 0 && a->idle_waiter) {
        QkCoroutine *w = a->idle_waiter;
        a->idle_waiter = NULL;
        qk_coroutine_wake(w);
    }
}

static void coroutine_fn wait_idle(QkAsyncImage *a)
{
    while (a->in_flight) {
        a->idle_waiter = qk_coroutine_self();
        qk_coroutine_yield();
    }
}

/* Takes the inbox and starts a coroutine per request, until told to stop;
 * then waits for the requests in flight. */
static void coroutine_fn dispatcher(void *opaque)
{
    QkAsyncImage *a = opaque;
    for (;;) {
        pthread_mutex_lock(&a->lock);
        AReq *list = a->in_head;
        a->in_head = a->in_tail = NULL;
        bool stop = a->stop;
        pthread_mutex_unlock(&a->lock);
        while (list) {
            AReq *r = list;
            list = list->next;
            a->in_flight++;
            qk_coroutine_wake(qk_coroutine_create(req_co, r));
        }
        if (stop) {
            break;
        }
        int ev = qk_co_wait_fd(a->wake_fd, POLLIN, -1);
        if (ev > 0) {
            drain_fd(a->wake_fd);
        }
    }
    wait_idle(a);
}

static void coroutine_fn idle_co(void *opaque)
{
    wait_idle(opaque);
}

static void coroutine_fn final_flush(void *opaque)
{
    QkAsyncImage *a = opaque;
    a->close_ret = qk_co_flush(a->bs);
}

/* Opens the image on the calling thread's loop (under a->lock, since an
 * engine thread's caller waits on opened_cond). */
static void open_block(QkAsyncImage *a)
{
    QkError err = {0};
    QkLoop *loop;
    int lr = qk_loop_try_get(&loop);
    if (lr < 0) {
        /* Out of descriptors or threads for the loop: an open error. */
        pthread_mutex_lock(&a->lock);
        a->open_ret = lr;
        snprintf(a->open_msg, sizeof(a->open_msg), "Could not set up an event loop: %s", strerror(-lr));
        a->opened = true;
        pthread_cond_signal(&a->opened_cond);
        pthread_mutex_unlock(&a->lock);
        return;
    }
    QkOpenOptions o = {.format = a->format};
    if (a->flags & QK_IMAGE_RDWR) {
        o.flags |= QK_OPEN_RDWR;
    }
    if (a->flags & QK_IMAGE_NOCACHE) {
        o.flags |= QK_OPEN_NOCACHE;
    }
    QkBlock *bs = qk_block_open(a->filename, &o, &err);
    pthread_mutex_lock(&a->lock);
    a->bs = bs;
    if (bs) {
        int64_t len = qk_block_length(bs);
        a->size = len > 0 ? (uint64_t)len : 0;
    } else {
        a->open_ret = err.code < 0 ? err.code : -EIO;
        snprintf(a->open_msg, sizeof(a->open_msg), "%s", err.msg);
    }
    a->opened = true;
    pthread_cond_signal(&a->opened_cond);
    pthread_mutex_unlock(&a->lock);
}

/* Once nothing is in flight: the final flush, then the close. */
static void close_block(QkAsyncImage *a)
{
    a->close_ret = 0;
    if (!a->bs->read_only) {
        qk_co_run(final_flush, a);
    }
    /* Closing writes back what the flush could not (metadata, the
     * dirty bit): its error is the caller's too. */
    int cr = qk_block_close(a->bs);
    if (a->close_ret == 0) {
        a->close_ret = cr;
    }
    a->bs = NULL;
}

static void *engine_main(void *opaque)
{
    QkAsyncImage *a = opaque;
    open_block(a);
    if (a->bs) {
        qk_co_run(dispatcher, a);
        close_block(a);
    }
    qk_loop_destroy_current();
    return NULL;
}

/* ---- the caller's side ---- */

static void queue_destroy(QkQueue *q)
{
    for (AReq *r = q->spare, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    for (AReq *r = q->done_head, *n; r; r = n) {
        n = r->next;
        if (r->iov != r->inline_iov) {
            free(r->iov);
        }
        free(r);
    }
    if (q->done_fd >= 0) {
        close(q->done_fd);
    }
    if (q->poll_fd >= 0) {
        close(q->poll_fd);
    }
    pthread_mutex_destroy(&q->lock);
}

static void async_free(QkAsyncImage *a, int nq)
{
    if (a->inline_mode && a->loop) {
        qk_loop_unpin(a->loop);
    }
    for (int i = 0; i < nq; i++) {
        queue_destroy(&a->queues[i]);
    }
    if (a->wake_fd >= 0) {
        close(a->wake_fd);
    }
    if (a->timer_fd >= 0) {
        close(a->timer_fd);
    }
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->opened_cond);
    free(a->filename);
    free(a->format);
    free(a);
}

static void set_err(char *errbuf, size_t errlen, const char *msg)
{
    if (errbuf && errlen) {
        snprintf(errbuf, errlen, "%s", msg);
    }
}

/* An inline queue's descriptor: its eventfd (completions left behind by a
 * do_io with a small MAX, or finished by another queue's do_io), the
 * loop's descriptor (I/O completions to reap, watched fds) and the
 * image's timerfd (the loop's next timer). */
static int make_poll_set(QkQueue *q)
{
    q->poll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (q->poll_fd < 0) {
        return -errno;
    }
    int fds[3] = {q->done_fd, qk_loop_poll_fd(q->img->loop), q->img->timer_fd};
    for (int i = 0; i < 3; i++) {
        struct epoll_event ev = {.events = EPOLLIN};
        if (epoll_ctl(q->poll_fd, EPOLL_CTL_ADD, fds[i], &ev) < 0) {
            return -errno;
        }
    }
    return 0;
}

QkAsyncImage *qk_async_open(const char *filename, const char *format, int flags, int nqueues,
                            char *errbuf, size_t errlen)
{
    if (!filename) {
        set_err(errbuf, errlen, "no file name given");
        return NULL;
    }
    if (nqueues < 1 || nqueues > MAX_QUEUES) {
        set_err(errbuf, errlen, "invalid argument (nqueues must be 1 to 64)");
        return NULL;
    }
    if (flags & ~(QK_IMAGE_RDWR | QK_IMAGE_NOCACHE | QK_ASYNC_INLINE)) {
        set_err(errbuf, errlen, "invalid argument (unknown flags)");
        return NULL;
    }
    QkAsyncImage *a = calloc(1, sizeof(*a) + (size_t)nqueues * sizeof(QkQueue));
    if (!a) {
        set_err(errbuf, errlen, "out of memory");
        return NULL;
    }
    a->timer_fd = -1;
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->opened_cond, NULL);
    int nq = 0;
    a->inline_mode = (flags & QK_ASYNC_INLINE) != 0;
    a->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    a->filename = strdup(filename);
    a->format = format ? strdup(format) : NULL;
    a->flags = flags;
    a->nqueues = nqueues;
    bool ok = a->wake_fd >= 0 && a->filename && (!format || a->format);
    if (ok && a->inline_mode) {
        a->owner = pthread_self();
        int lr = qk_loop_try_get(&a->loop);
        if (lr < 0) {
            char m[128];
            snprintf(m, sizeof(m), "Could not set up an event loop: %s", strerror(-lr));
            set_err(errbuf, errlen, m);
            a->loop = NULL;
            async_free(a, 0);
            return NULL;
        }
        /* The image keeps the loop: the thread's exit must not free it. */
        qk_loop_pin(a->loop);
        a->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
        ok = a->timer_fd >= 0;
    }
    for (; ok && nq < nqueues; nq++) {
        QkQueue *q = &a->queues[nq];
        q->img = a;
        q->poll_fd = -1;
        pthread_mutex_init(&q->lock, NULL);
        q->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        ok = q->done_fd >= 0 && (!a->inline_mode || make_poll_set(q) == 0);
    }
    if (!ok) {
        /* An eventfd, the timerfd or a queue's epoll set (inline). */
        char m[128];
        snprintf(m, sizeof(m), "Could not create the image's event descriptors: %s",
                 strerror(errno ? errno : ENOMEM));
        set_err(errbuf, errlen, m);
        async_free(a, nq);
        return NULL;
    }
    if (a->inline_mode) {
        open_block(a);
        if (!a->bs) {
            set_err(errbuf, errlen, a->open_msg);
            async_free(a, nq);
            return NULL;
        }
        return a;
    }
    if (pthread_create(&a->thread, NULL, engine_main, a) != 0) {
        set_err(errbuf, errlen, "Could not start the engine thread");
        async_free(a, nq);
        return NULL;
    }
    pthread_mutex_lock(&a->lock);
    while (!a->opened) {
        pthread_cond_wait(&a->opened_cond, &a->lock);
    }
    bool opened = a->bs != NULL;
    pthread_mutex_unlock(&a->lock);
    if (!opened) {
        pthread_join(a->thread, NULL);
        set_err(errbuf, errlen, a->open_msg);
        async_free(a, nq);
        return NULL;
    }
    return a;
}

int qk_async_close(QkAsyncImage *a)
{
    if (!a) {
        return 0;
    }
    if (a->inline_mode) {
        if (!pthread_equal(pthread_self(), a->owner)) {
            return -EPERM; /* its loop is another thread's: nothing touched */
        }
        /* Requests started finish on this thread's loop; the loop stays,
         * it is the thread's. */
        qk_co_run(idle_co, a);
        close_block(a);
    } else {
        pthread_mutex_lock(&a->lock);
        a->stop = true;
        pthread_mutex_unlock(&a->lock);
        kick(a->wake_fd);
        pthread_join(a->thread, NULL);
    }
    /* Requests enqueued but never handed over are dropped with their
     * queue, unrun (qcowkit.h says so). */
    int r = a->close_ret;
    for (int i = 0; i < a->nqueues; i++) {
        QkQueue *q = &a->queues[i];
        for (AReq *p = q->pend_head, *n; p; p = n) {
            n = p->next;
            if (p->iov != p->inline_iov) {
                free(p->iov);
            }
            free(p);
        }
    }
    async_free(a, a->nqueues);
    return r;
}

uint64_t qk_async_size(const QkAsyncImage *a)
{
    return a ? a->size : 0;
}

QkQueue *qk_async_queue(QkAsyncImage *a, int i)
{
    return a && i >= 0 && i < a->nqueues ? &a->queues[i] : NULL;
}

int qk_queue_completion_fd(QkQueue *q)
{
    if (!q) {
        return -EINVAL;
    }
    return q->img->inline_mode ? q->poll_fd : q->done_fd;
}

unsigned qk_queue_outstanding(const QkQueue *q)
{
    return q ? q->outstanding : 0;
}

static AReq *req_get(QkQueue *q)
{
    AReq *r = q->spare;
    if (r) {
        q->spare = r->next;
    } else {
        r = malloc(sizeof(*r));
    }
    return r;
}

static void req_put(QkQueue *q, AReq *r)
{
    if (r->iov != r->inline_iov) {
        free(r->iov);
    }
    r->iov = NULL;
    r->next = q->spare;
    q->spare = r;
}

static int enqueue(QkQueue *q, AOp op, uint64_t off, uint64_t len, const struct iovec *iov, int iovcnt,
                   int flags, void *user_data)
{
    if (!q) {
        return -EINVAL;
    }
    if (op == AOP_READ || op == AOP_WRITE) {
        if (iovcnt < 0 || iovcnt > MAX_IOV || (iovcnt && !iov)) {
            return -EINVAL;
        }
        len = 0;
        for (int i = 0; i < iovcnt; i++) {
            if (len + iov[i].iov_len < len) {
                return -EINVAL;
            }
            len += iov[i].iov_len;
        }
    }
    uint64_t end;
    if (op != AOP_FLUSH && (__builtin_add_overflow(off, len, &end) || end > q->img->size)) {
        return -EINVAL;
    }
    AReq *r = req_get(q);
    if (!r) {
        return -ENOMEM;
    }
    *r = (AReq){.q = q, .op = op, .off = off, .len = len, .flags = flags, .user_data = user_data,
                .iovcnt = iovcnt};
    r->iov = r->inline_iov;
    if (iovcnt > INLINE_IOV) {
        r->iov = malloc((size_t)iovcnt * sizeof(*iov));
        if (!r->iov) {
            r->iov = r->inline_iov;
            req_put(q, r);
            return -ENOMEM;
        }
    }
    if (iovcnt) {
        memcpy(r->iov, iov, (size_t)iovcnt * sizeof(*iov));
    }
    list_append(&q->pend_head, &q->pend_tail, r);
    q->outstanding++;
    return 0;
}

int qk_queue_readv(QkQueue *q, uint64_t off, const struct iovec *iov, int iovcnt, void *user_data)
{
    return enqueue(q, AOP_READ, off, 0, iov, iovcnt, 0, user_data);
}

int qk_queue_writev(QkQueue *q, uint64_t off, const struct iovec *iov, int iovcnt, void *user_data)
{
    return enqueue(q, AOP_WRITE, off, 0, iov, iovcnt, 0, user_data);
}

int qk_queue_write_zeroes(QkQueue *q, uint64_t off, uint64_t len, int flags, void *user_data)
{
    if (flags & ~QK_ZERO_UNMAP) {
        return -EINVAL;
    }
    return enqueue(q, AOP_ZERO, off, len, NULL, 0, (flags & QK_ZERO_UNMAP) ? QK_REQ_MAY_UNMAP : 0, user_data);
}

int qk_queue_discard(QkQueue *q, uint64_t off, uint64_t len, void *user_data)
{
    return enqueue(q, AOP_DISCARD, off, len, NULL, 0, 0, user_data);
}

int qk_queue_flush(QkQueue *q, void *user_data)
{
    return enqueue(q, AOP_FLUSH, 0, 0, NULL, 0, 0, user_data);
}

static void hand_over(QkQueue *q)
{
    if (!q->pend_head) {
        return;
    }
    QkAsyncImage *a = q->img;
    pthread_mutex_lock(&a->lock);
    bool was_empty = !a->in_head;
    if (a->in_tail) {
        a->in_tail->next = q->pend_head;
    } else {
        a->in_head = q->pend_head;
    }
    a->in_tail = q->pend_tail;
    pthread_mutex_unlock(&a->lock);
    q->pend_head = q->pend_tail = NULL;
    if (was_empty) {
        kick(a->wake_fd);
    }
}

/* Moves up to max finished requests into out. Completions left behind
 * (more than max were waiting) write the descriptor again: it was reset
 * before collecting, and the engine writes it only when the list goes
 * from empty to non-empty, so without this a program waiting on it would
 * never hear of them. */
static int collect(QkQueue *q, QkCompletion *out, int max)
{
    pthread_mutex_lock(&q->lock);
    if (max <= 0) {
        bool left = q->done_head != NULL;
        pthread_mutex_unlock(&q->lock);
        if (left) {
            kick_queue(q);
        }
        return 0;
    }
    AReq *list = q->done_head;
    int n = 0;
    AReq *last = NULL;
    for (AReq *r = list; r && n < max; r = r->next) {
        last = r;
        n++;
    }
    if (last) {
        q->done_head = last->next;
        if (!q->done_head) {
            q->done_tail = NULL;
        }
        last->next = NULL;
    }
    bool left = q->done_head != NULL;
    pthread_mutex_unlock(&q->lock);
    if (left) {
        kick_queue(q);
    }
    int i = 0;
    for (AReq *r = last ? list : NULL, *next; r; r = next) {
        next = r->next;
        out[i++] = (QkCompletion){.user_data = r->user_data, .ret = r->ret};
        req_put(q, r);
    }
    q->outstanding -= (unsigned)i;
    return i;
}

/* ---- inline images: the engine runs in qk_queue_do_io ---- */

/* Runs what the loop can do without waiting (submits queued I/O, reaps
 * finished I/O, runs what that woke), then arms the timerfd for the
 * loop's next timer. Work still left after many rounds (something keeps
 * waking itself) keeps the queue's descriptor readable. */
static void pump(QkQueue *q)
{
    QkAsyncImage *a = q->img;
    int rounds = 0;
    while (qk_loop_run_once(a->loop, false)) {
        if (++rounds == 64) {
            kick_queue(q);
            break;
        }
    }
    int64_t next = qk_loop_next_timer_ns(a->loop);
    if (next >= 0 || a->timer_armed) {
        struct itimerspec its = {0};
        if (next >= 0) {
            next = next ? next : 1; /* all zero would disarm it */
            its.it_value.tv_sec = next / 1000000000LL;
            its.it_value.tv_nsec = next % 1000000000LL;
        }
        timerfd_settime(a->timer_fd, 0, &its, NULL);
        a->timer_armed = next >= 0;
    }
}

static void start_inline(QkQueue *q)
{
    QkAsyncImage *a = q->img;
    AReq *list = q->pend_head;
    q->pend_head = q->pend_tail = NULL;
    while (list) {
        AReq *r = list;
        list = list->next;
        a->in_flight++;
        /* Runs to its first wait: its I/O is queued, submitted below. */
        qk_coroutine_enter(qk_coroutine_create(req_co, r));
    }
}

/* When a wait of timeout_ns (> 0) from now ends; a timeout too long to
 * add (INT64_MAX for "forever") ends at the end of time. */
static int64_t deadline_after(int64_t timeout_ns)
{
    int64_t now = qk_clock_ns();
    return timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
}

/* poll()'s timeout for left (> 0) nanoseconds: rounded up to whole
 * milliseconds, at most INT_MAX (a longer wait just polls again). */
static int poll_ms(int64_t left)
{
    int64_t ms = left / 1000000 + (left % 1000000 != 0);
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* When blocking without a time limit, the loop's own wait does the work:
 * io_uring submits what the new requests queued and waits for their
 * completions in one system call, as `qcowkit bench` does. */
static int do_io_inline(QkQueue *q, QkCompletion *out, int min, int max, int64_t timeout_ns)
{
    QkAsyncImage *a = q->img;
    if (!pthread_equal(pthread_self(), a->owner)) {
        return -EPERM;
    }
    if (q->fd_kicked) {
        q->fd_kicked = false;
        drain_fd(q->done_fd);
    }
    if (a->timer_armed) {
        drain_fd(a->timer_fd);
    }
    a->active = q;
    start_inline(q);
    if (timeout_ns >= 0 || min == 0) {
        pump(q);
    }
    int64_t deadline = timeout_ns > 0 ? deadline_after(timeout_ns) : 0;
    int n = 0;
    for (;;) {
        n += collect(q, out + n, max - n);
        if ((n >= min && (n > 0 || min == 0)) || timeout_ns == 0) {
            break;
        }
        if (timeout_ns < 0) {
            a->progress = false;
            qk_loop_run_until(a->loop, &a->progress);
            continue;
        }
        int64_t left = deadline - qk_clock_ns();
        if (left <= 0) {
            break;
        }
        struct pollfd p = {.fd = q->poll_fd, .events = POLLIN};
        if (poll(&p, 1, poll_ms(left)) < 0 && errno != EINTR) {
            a->active = NULL;
            return n > 0 ? n : -errno;
        }
        if (a->timer_armed) {
            drain_fd(a->timer_fd);
        }
        pump(q);
    }
    /* What the last completions queued (a metadata update after a data
     * write) goes to the kernel now, or the descriptor would never fire. */
    pump(q);
    a->active = NULL;
    pthread_mutex_lock(&q->lock);
    bool left = q->done_head != NULL;
    pthread_mutex_unlock(&q->lock);
    if (left) {
        kick_queue(q);
    }
    return n;
}

int qk_queue_do_io(QkQueue *q, QkCompletion *out, int min, int max, int64_t timeout_ns)
{
    if (!q || min < 0 || min > max || (max > 0 && !out) || (unsigned)min > q->outstanding) {
        return -EINVAL;
    }
    if (q->img->inline_mode) {
        return do_io_inline(q, out, min, max, timeout_ns);
    }
    hand_over(q);
    int64_t deadline = timeout_ns > 0 ? deadline_after(timeout_ns) : 0;
    int n = 0;
    for (;;) {
        /* Reset the descriptor first: a completion arriving after the
         * collect below writes it again, so it is never missed. */
        drain_fd(q->done_fd);
        n += collect(q, out + n, max - n);
        if (n >= min && (n > 0 || min == 0)) {
            return n;
        }
        if (timeout_ns == 0) {
            return n;
        }
        int ms = -1;
        if (timeout_ns > 0) {
            int64_t left = deadline - qk_clock_ns();
            if (left <= 0) {
                return n;
            }
            ms = poll_ms(left);
        }
        struct pollfd p = {.fd = q->done_fd, .events = POLLIN};
        if (poll(&p, 1, ms) < 0 && errno != EINTR) {
            return n > 0 ? n : -errno;
        }
    }
}
