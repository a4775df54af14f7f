/*
 * The worker threads behind qk_co_run_in_thread(). A job carries an
 * eventfd; the coroutine reads it through its loop's backend, so the wait
 * is an ordinary asynchronous read (io_uring polls the descriptor, the
 * thread backend blocks one of its own threads), and the worker's write
 * to it is the completion. Eventfds are kept for reuse. Threads start on
 * demand up to the limit and stay for the life of the process.
 */
#include "aio/work_pool.h"
#include "aio/aio.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_THREADS 64
#define MAX_SPARE_FDS 64
/* A read at this offset uses the descriptor's own position (eventfds
 * have none), see aio.c. */
#define NO_OFFSET UINT64_MAX

typedef struct Job {
    void (*fn)(void *);
    void *arg;
    int efd;
    struct Job *next;
} Job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static Job *head, *tail;
static unsigned threads, idle, limit;
static int spare[MAX_SPARE_FDS];
static unsigned nspare;

void qk_work_pool_set_threads(unsigned n)
{
    pthread_mutex_lock(&lock);
    limit = n > MAX_THREADS ? MAX_THREADS : n;
    pthread_mutex_unlock(&lock);
}

static unsigned max_threads(void)
{
    if (limit) {
        return limit;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (unsigned)n;
}

static void *worker(void *opaque)
{
    (void)opaque;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!head) {
            idle++;
            pthread_cond_wait(&cond, &lock);
            idle--;
        }
        Job *j = head;
        head = j->next;
        if (!head) {
            tail = NULL;
        }
        pthread_mutex_unlock(&lock);
        j->fn(j->arg);
        uint64_t one = 1;
        /* Cannot fail on a valid eventfd short of overflow, which one
         * write per job never reaches. */
        while (write(j->efd, &one, sizeof(one)) < 0 && errno == EINTR) {
        }
        pthread_mutex_lock(&lock);
    }
    return NULL;
}

/* Queues j, starting a thread if none is idle and the limit allows.
 * Returns false when no thread exists to run it. */
static bool queue_job(Job *j)
{
    pthread_mutex_lock(&lock);
    if (!idle && threads < max_threads()) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, worker, NULL) == 0) {
            threads++;
        }
        pthread_attr_destroy(&a);
    }
    bool ok = threads > 0;
    if (ok) {
        j->next = NULL;
        if (tail) {
            tail->next = j;
        } else {
            head = j;
        }
        tail = j;
        pthread_cond_signal(&cond);
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

static int take_fd(void)
{
    pthread_mutex_lock(&lock);
    int fd = nspare ? spare[--nspare] : -1;
    pthread_mutex_unlock(&lock);
    return fd >= 0 ? fd : eventfd(0, EFD_CLOEXEC);
}

static void give_fd(int fd)
{
    pthread_mutex_lock(&lock);
    if (nspare < MAX_SPARE_FDS) {
        spare[nspare++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&lock);
    if (fd >= 0) {
        close(fd);
    }
}

void coroutine_fn qk_co_run_in_thread(void (*fn)(void *), void *arg)
{
    Job j = {.fn = fn, .arg = arg, .efd = take_fd()};
    if (j.efd < 0 || !queue_job(&j)) {
        if (j.efd >= 0) {
            give_fd(j.efd);
        }
        fn(arg); /* no thread or descriptor: the loop does the work */
        return;
    }
    uint64_t v;
    struct iovec iov = {.iov_base = &v, .iov_len = sizeof(v)};
    ssize_t n;
    do {
        n = qk_co_host_preadv(j.efd, &iov, 1, NO_OFFSET);
    } while (n == -EINTR || n == -EAGAIN);
    if (n != (ssize_t)sizeof(v)) {
        /* The job is queued and will write: a descriptor in an unknown
         * state is not reused. Wait for the worker the blocking way. */
        while (read(j.efd, &v, sizeof(v)) < 0 && errno == EINTR) {
        }
        close(j.efd);
        return;
    }
    give_fd(j.efd);
}
