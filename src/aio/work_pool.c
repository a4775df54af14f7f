/*
 * The worker threads behind qk_co_run_in_thread(). A job carries a
 * thread event (aio/thread_event.h): the coroutine waits for it through
 * its loop's backend, and the worker's signal is the completion. Threads
 * start on demand up to the limit and stay for the life of the process.
 */
#include "aio/work_pool.h"
#include "aio/thread_event.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 64

typedef struct Job {
    void (*fn)(void *);
    void *arg;
    QkThreadEvent done;
    struct Job *next;
} Job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static Job *head, *tail;
static unsigned threads, idle, limit;

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
        qk_thread_event_signal(&j->done);
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

void coroutine_fn qk_co_run_in_thread(void (*fn)(void *), void *arg)
{
    Job j = {.fn = fn, .arg = arg};
    if (qk_thread_event_init(&j.done) < 0) {
        fn(arg); /* no descriptor: the loop does the work */
        return;
    }
    if (!queue_job(&j)) {
        qk_thread_event_destroy(&j.done);
        fn(arg); /* no thread: the loop does the work */
        return;
    }
    qk_co_thread_event_wait(&j.done);
}
