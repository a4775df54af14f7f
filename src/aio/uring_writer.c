/*
 * The io_uring backend's page-cache writer: one thread that runs buffered
 * writes one after another (merging sequential runs into one pwritev) and
 * tells the loop when results are ready with a single completion on the
 * loop's ring (IORING_OP_MSG_RING from a small ring of its own), after which
 * the loop takes the finished list.
 *
 * Why not io_uring's own workers: ext4 cannot take buffered writes without
 * blocking, so io_uring hands each one to io-wq. Sent with IOSQE_ASYNC, a
 * burst of them to one file wakes up to eight workers that then queue on the
 * inode lock (perf, 4k random writes at depth 32: 10-12% of all samples in
 * rwsem_spin_on_owner, most of the rest in wake-ups and context switches);
 * sent without it, each write first fails its non-blocking try on the loop
 * thread. The copy into the page cache is serial per file anyway; one
 * thread that takes the whole queue at once does it without the fight, and
 * the loop wakes once per batch instead of once per write.
 */
#include "aio/uring_writer.h"
#include "aio/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* A full completion queue: wait this long before posting the results again. */
#define MSG_RETRY_NS (100 * 1000)
/* The writer thread only copies and calls pwritev: a small stack will do. */
#define WRITER_STACK (64 * 1024)

/* Most finished writes per wake-up of the loop. */
#define NOTIFY_EVERY 16
/* Buffers in one merged write. */
#define MERGE_IOV 64
#define WRITER_RING_ENTRIES 4

struct QkUringWriter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    QkAioReq *head, *tail; /* handed over by the loop, not yet started */
    bool sleeping;
    bool stopping;
    unsigned outstanding; /* handed over, not finished; atomic */
    pthread_t thread;
    int target_fd;     /* the loop's ring */
    uint64_t tag;      /* user_data of the "results ready" message: this
                          writer's address with the low bit set */
    QkAioReq *done;    /* finished, newest first; atomic */
    bool notified;     /* a message is on its way and the loop has not
                          taken the list since; atomic */
    struct io_uring ring;
};

static void push_done(QkUringWriter *w, QkAioReq *req)
{
    QkAioReq *old = __atomic_load_n(&w->done, __ATOMIC_RELAXED);
    /* Acquire as well: after seeing a list the loop emptied, the exchange
     * on `notified` in notify() must see the loop's reset that came before
     * (otherwise a result could wait for a message nobody sends). */
    do {
        req->next = old;
    } while (!__atomic_compare_exchange_n(&w->done, &old, req, true, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
}

/* Retires the completions on the writer's ring. Only a message that
 * failed posts one (success is skipped); returns whether one did. */
static bool message_failed(QkUringWriter *w)
{
    bool failed = false;
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&w->ring, &cqe) == 0) {
        failed |= cqe->res < 0;
        io_uring_cqe_seen(&w->ring, cqe);
    }
    return failed;
}

/* Tells the loop that results are waiting, unless a message it has not
 * acted on is already on its way: one wake-up of the loop thread covers
 * every write that finished before it runs (waking a thread on the other
 * CPU is the expensive part; a message per write cost more than the
 * writes). The message's own completion is skipped on success; a failure
 * (the loop's completion queue and overflow list full) is retried after a
 * pause. */
static void notify(QkUringWriter *w)
{
    if (__atomic_exchange_n(&w->notified, true, __ATOMIC_ACQ_REL)) {
        return;
    }
    for (;;) {
        /* No free entry: an earlier message is still queued (its submit
         * was refused); submitting again sends that one. */
        struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
        if (sqe) {
            io_uring_prep_msg_ring(sqe, w->target_fd, 0, w->tag, 0);
            io_uring_sqe_set_flags(sqe, IOSQE_CQE_SKIP_SUCCESS);
        }
        int r = io_uring_submit(&w->ring);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
            abort(); /* a broken ring is not recoverable */
        }
        if (r >= 1 && !message_failed(w)) {
            return;
        }
        struct timespec ts = {0, MSG_RETRY_NS};
        nanosleep(&ts, NULL);
    }
}

/* Starts the writeback of what [first, last] wrote (n bytes from
 * first->off) when one of them asks for it. This thread then waits only
 * while the disk's queue is full, which paces a stream at the disk's speed
 * instead of letting it pile up dirty pages for one long flush. A hint: a
 * failure shows up at the next flush. */
static void write_behind(const QkAioReq *first, const QkAioReq *last, ssize_t n)
{
    if (n <= 0) {
        return;
    }
    for (const QkAioReq *r = first;; r = r->next) {
        if (r->write_behind) {
            (void)sync_file_range(first->fd, (off_t)first->off, n, SYNC_FILE_RANGE_WRITE);
            return;
        }
        if (r == last) {
            return;
        }
    }
}

/* One system call per write costs about a quarter of the writer's time
 * here, so a single buffer goes through pwrite (no iovec to copy in) and
 * the most common pattern that can be merged, writes that continue one
 * another in the same file (sequential streams), goes through one pwritev. */
static QkAioReq *write_some(QkAioReq *list)
{
    QkAioReq *last = list;
    int iovcnt = list->iovcnt;
    uint64_t end = list->off;
    for (int i = 0; i < list->iovcnt; i++) {
        end += list->iov[i].iov_len;
    }
    while (last->next && last->next->fd == list->fd && last->next->off == end &&
           iovcnt + last->next->iovcnt <= MERGE_IOV) {
        last = last->next;
        iovcnt += last->iovcnt;
        for (int i = 0; i < last->iovcnt; i++) {
            end += last->iov[i].iov_len;
        }
    }
    ssize_t n;
    if (last == list) {
        n = list->iovcnt == 1 ? pwrite(list->fd, list->iov[0].iov_base, list->iov[0].iov_len, (off_t)list->off)
                              : pwritev(list->fd, list->iov, list->iovcnt, (off_t)list->off);
        list->result = n < 0 ? -errno : n;
        write_behind(list, list, n);
        return list->next;
    }
    struct iovec iov[MERGE_IOV];
    int k = 0;
    for (QkAioReq *r = list;; r = r->next) {
        for (int i = 0; i < r->iovcnt; i++) {
            iov[k++] = r->iov[i];
        }
        if (r == last) {
            break;
        }
    }
    n = pwritev(list->fd, iov, k, (off_t)list->off);
    write_behind(list, last, n);
    /* Hand each request its share. A request the merged write did not
     * reach (it failed, or stopped short before it) is written on its own,
     * so it gets the result it would have had alone. */
    int64_t left = n < 0 ? 0 : n;
    for (QkAioReq *r = list;; r = r->next) {
        int64_t len = 0;
        for (int i = 0; i < r->iovcnt; i++) {
            len += (int64_t)r->iov[i].iov_len;
        }
        if (left > 0) {
            r->result = left < len ? left : len;
            left -= r->result;
        } else {
            ssize_t m = pwritev(r->fd, r->iov, r->iovcnt, (off_t)r->off);
            r->result = m < 0 ? -errno : m;
        }
        if (r == last) {
            break;
        }
    }
    return last->next;
}

static void *writer_main(void *arg)
{
    QkUringWriter *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->head && !w->stopping) {
            w->sleeping = true;
            pthread_cond_wait(&w->cond, &w->lock);
            w->sleeping = false;
        }
        if (!w->head) {
            break;
        }
        QkAioReq *list = w->head;
        w->head = w->tail = NULL;
        pthread_mutex_unlock(&w->lock);
        unsigned pending = 0;
        while (list) {
            QkAioReq *first = list;
            list = write_some(first);
            unsigned done = 0;
            for (QkAioReq *r = first, *next; r != list; r = next) {
                next = r->next;
                push_done(w, r);
                done++;
            }
            pending += done;
            unsigned outstanding = __atomic_sub_fetch(&w->outstanding, done, __ATOMIC_RELAXED);
            /* Wake the loop once half of what it handed over is done, so it
             * refills the queue while the rest is written instead of both
             * threads taking turns to sleep. This includes the queue's end
             * (nothing outstanding: push counts before it appends). */
            if (pending >= NOTIFY_EVERY || pending >= outstanding) {
                notify(w);
                pending = 0;
            }
        }
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

QkAioReq *qk_uring_writer_take(QkUringWriter *w)
{
    /* Cleared first: a result pushed after the exchange below then sends
     * a new message. */
    __atomic_store_n(&w->notified, false, __ATOMIC_RELEASE);
    return qk_aio_list_reverse(__atomic_exchange_n(&w->done, NULL, __ATOMIC_ACQ_REL));
}

bool qk_uring_writer_usable(void)
{
    struct io_uring_probe *p = io_uring_get_probe();
    if (!p) {
        return false;
    }
    bool ok = io_uring_opcode_supported(p, IORING_OP_MSG_RING);
    io_uring_free_probe(p);
    return ok;
}

QkUringWriter *qk_uring_writer_new(int target_ring_fd, int *errno_out)
{
    QkUringWriter *w = calloc(1, sizeof(*w));
    if (!w) {
        *errno_out = ENOMEM;
        return NULL;
    }
    int r = io_uring_queue_init(WRITER_RING_ENTRIES, &w->ring, 0);
    if (r < 0) {
        *errno_out = -r;
        free(w);
        return NULL;
    }
    w->target_fd = target_ring_fd;
    w->tag = (uint64_t)(uintptr_t)w | 1;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WRITER_STACK);
    r = pthread_create(&w->thread, &attr, writer_main, w);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        io_uring_queue_exit(&w->ring);
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
        *errno_out = r;
        return NULL;
    }
    return w;
}

unsigned qk_uring_writer_push(QkUringWriter *w, QkAioReq *head, QkAioReq *tail)
{
    tail->next = NULL;
    unsigned n = 0;
    for (QkAioReq *r = head; r; r = r->next) {
        n++;
    }
    __atomic_add_fetch(&w->outstanding, n, __ATOMIC_RELAXED);
    pthread_mutex_lock(&w->lock);
    if (w->tail) {
        w->tail->next = head;
    } else {
        w->head = head;
    }
    w->tail = tail;
    bool wake = w->sleeping;
    pthread_mutex_unlock(&w->lock);
    if (wake) {
        pthread_cond_signal(&w->cond);
    }
    return n;
}

void qk_uring_writer_free(QkUringWriter *w)
{
    if (!w) {
        return;
    }
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    io_uring_queue_exit(&w->ring);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
}
