/*
 * Thread-pool backend: worker threads run blocking preadv/pwritev/
 * fdatasync/fallocate/ftruncate and hand results back through a completion
 * list and an eventfd the loop watches. Workers are started on demand up to
 * a limit and exit after being idle for a while. A second, low-priority
 * pool (nice 19, few workers) serves background coroutines: the CPU time
 * of their copies then goes to them only when nobody else wants it.
 */
#include "aio/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 64
#define MAX_BG_WORKERS 4
#define BG_NICE 19
#define IDLE_SECONDS 10

typedef struct Threads {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    QkAioReq *todo_head, *todo_tail;
    QkAioReq *done;        /* LIFO of completed requests */
    QkAioReq *reaped;      /* taken from done in order, not completed yet (reap's max) */
    QkAioReq *local_head, *local_tail; /* queued this iteration, not yet handed over */
    unsigned workers, idle, max_workers;
    int nice;              /* of every worker; 0: the loop thread's */
    unsigned in_flight;    /* loop-thread view */
    bool stopping;
    int efd;
} Threads;

static int64_t run_one(QkAioReq *r)
{
    ssize_t n;
    switch (r->op) {
    case QK_AIO_READ:
        /* UINT64_MAX: a descriptor without offsets (see aio.h). */
        n = r->off == UINT64_MAX ? readv(r->fd, r->iov, r->iovcnt) : preadv(r->fd, r->iov, r->iovcnt, (off_t)r->off);
        break;
    case QK_AIO_WRITE:
        n = pwritev(r->fd, r->iov, r->iovcnt, (off_t)r->off);
        if (n > 0 && r->write_behind) {
            /* A hint: a failure here shows up at the next flush. */
            (void)sync_file_range(r->fd, (off_t)r->off, n, SYNC_FILE_RANGE_WRITE);
        }
        break;
    case QK_AIO_FDATASYNC:
        n = fdatasync(r->fd);
        break;
    case QK_AIO_FALLOCATE:
        n = fallocate(r->fd, r->mode, (off_t)r->off, (off_t)r->len);
        break;
    case QK_AIO_FTRUNCATE:
        n = ftruncate(r->fd, (off_t)r->len);
        break;
    default:
        n = -1;
        errno = EINVAL;
    }
    return n < 0 ? -errno : n;
}

static void *worker(void *arg)
{
    Threads *t = arg;
    if (t->nice) {
        /* Linux applies a nice value per thread (0: the calling thread). */
        (void)setpriority(PRIO_PROCESS, 0, t->nice);
    }
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->todo_head && !t->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += IDLE_SECONDS;
            t->idle++;
            int r = pthread_cond_timedwait(&t->cond, &t->lock, &ts);
            t->idle--;
            if (r == ETIMEDOUT && !t->todo_head) {
                goto out;
            }
        }
        if (t->stopping && !t->todo_head) {
            break;
        }
        QkAioReq *r = t->todo_head;
        t->todo_head = r->next;
        if (!t->todo_head) {
            t->todo_tail = NULL;
        }
        pthread_mutex_unlock(&t->lock);
        r->result = run_one(r);
        pthread_mutex_lock(&t->lock);
        /* Only the first completion of a batch needs to wake the loop: it
         * takes the whole list under the lock. */
        bool was_empty = t->done == NULL;
        r->next = t->done;
        t->done = r;
        if (was_empty) {
            uint64_t one = 1;
            ssize_t w = write(t->efd, &one, sizeof(one));
            (void)w;
        }
    }
out:
    t->workers--;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

static void threads_queue(void *st, QkAioReq *req)
{
    Threads *t = st;
    qk_aio_list_append(&t->local_head, &t->local_tail, req);
    t->in_flight++;
}

static unsigned threads_submit(void *st)
{
    Threads *t = st;
    if (!t->local_head) {
        return t->in_flight;
    }
    unsigned n = 0;
    for (QkAioReq *r = t->local_head; r; r = r->next) {
        n++;
    }
    pthread_mutex_lock(&t->lock);
    if (t->todo_tail) {
        t->todo_tail->next = t->local_head;
    } else {
        t->todo_head = t->local_head;
    }
    t->todo_tail = t->local_tail;
    /* Start workers while there is more queued work than idle workers. */
    unsigned want = n > t->idle ? n - t->idle : 0;
    while (want-- && t->workers < t->max_workers) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        if (pthread_create(&th, &attr, worker, t) == 0) {
            t->workers++;
        }
        pthread_attr_destroy(&attr);
    }
    if (n == 1) {
        pthread_cond_signal(&t->cond);
    } else {
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->lock);
    t->local_head = t->local_tail = NULL;
    return t->in_flight;
}

static unsigned threads_reap(void *st, unsigned max)
{
    Threads *t = st;
    uint64_t v;
    if (!t->reaped) {
        if (read(t->efd, &v, sizeof(v)) < 0 && errno == EAGAIN) {
            return 0;
        }
        pthread_mutex_lock(&t->lock);
        QkAioReq *list = t->done;
        t->done = NULL;
        pthread_mutex_unlock(&t->lock);
        t->reaped = qk_aio_list_reverse(list);
    }
    /* What max leaves stays in reaped: the eventfd was read already, so
     * only this list remembers it (the loop reaps again before it sleeps). */
    unsigned n = 0;
    while (t->reaped && (!max || n < max)) {
        QkAioReq *r = t->reaped;
        t->reaped = r->next;
        t->in_flight--;
        n++;
        qk_aio_complete(r, r->result);
    }
    return n;
}

static void threads_destroy(void *st)
{
    Threads *t = st;
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_cond_broadcast(&t->cond);
    while (t->workers) {
        pthread_cond_wait(&t->cond, &t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    close(t->efd);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t);
}

static void *threads_new(QkAioBackend *ops, int *errno_out, int nice, unsigned max_workers)
{
    Threads *t = calloc(1, sizeof(*t));
    if (!t) {
        *errno_out = ENOMEM;
        return NULL;
    }
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        *errno_out = errno;
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->nice = nice;
    t->max_workers = max_workers;
    ops->name = nice ? "background threads" : "threads";
    ops->queue = threads_queue;
    ops->submit = threads_submit;
    ops->reap = threads_reap;
    ops->wait = NULL;
    ops->submit_wait = NULL;
    ops->destroy = threads_destroy;
    ops->event_fd = t->efd;
    return t;
}

void *qk_threads_backend_new(QkAioBackend *ops, int *errno_out)
{
    return threads_new(ops, errno_out, 0, MAX_WORKERS);
}

void *qk_threads_backend_new_background(QkAioBackend *ops, int *errno_out)
{
    return threads_new(ops, errno_out, BG_NICE, MAX_BG_WORKERS);
}
