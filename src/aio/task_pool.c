/*
 * Task pool implementation. Each task runs in its own coroutine; a small
 * heap record carries its function to the coroutine. Finishing a task
 * wakes every slot waiter (each re-checks, so two waiters on the last slot
 * both proceed) and, when the pool becomes idle, every all-waiter.
 */
#include "aio/task_pool.h"

#include <assert.h>
#include <stdlib.h>

struct QkTaskPool {
    int max_busy;
    int busy;
    int status;
    QkCoQueue slot_waiters;
    QkCoQueue all_waiters;
};

typedef struct Task {
    QkTaskPool *pool;
    QkTaskFn *fn;
    void *opaque;
} Task;

QkTaskPool *qk_task_pool_new(int max_busy)
{
    QkTaskPool *p = calloc(1, sizeof(*p));
    if (!p) {
        return NULL;
    }
    p->max_busy = max_busy > 0 ? max_busy : 1;
    return p;
}

void qk_task_pool_free(QkTaskPool *pool)
{
    if (pool) {
        assert(pool->busy == 0);
        free(pool);
    }
}

static void coroutine_fn task_entry(void *opaque)
{
    Task t = *(Task *)opaque;
    free(opaque);
    int r = t.fn(t.opaque);
    QkTaskPool *p = t.pool;
    if (r < 0 && p->status == 0) {
        p->status = r;
    }
    p->busy--;
    qk_co_queue_wake_all(&p->slot_waiters);
    if (p->busy == 0) {
        qk_co_queue_wake_all(&p->all_waiters);
    }
}

void coroutine_fn qk_task_pool_wait_slot(QkTaskPool *pool)
{
    while (pool->busy >= pool->max_busy) {
        qk_co_queue_wait(&pool->slot_waiters);
    }
}

void coroutine_fn qk_task_pool_wait_all(QkTaskPool *pool)
{
    while (pool->busy > 0) {
        qk_co_queue_wait(&pool->all_waiters);
    }
}

void coroutine_fn qk_task_pool_start(QkTaskPool *pool, QkTaskFn *fn, void *opaque)
{
    qk_task_pool_wait_slot(pool);
    Task *t = malloc(sizeof(*t));
    if (!t) {
        abort();
    }
    *t = (Task){pool, fn, opaque};
    pool->busy++;
    /* Run it until it first yields; the starter continues afterwards. */
    qk_coroutine_enter(qk_coroutine_create(task_entry, t));
}

int qk_task_pool_status(const QkTaskPool *pool) { return pool->status; }
bool qk_task_pool_empty(const QkTaskPool *pool) { return pool->busy == 0; }
int qk_task_pool_busy(const QkTaskPool *pool) { return pool->busy; }
int qk_task_pool_max(const QkTaskPool *pool) { return pool->max_busy; }

void qk_task_pool_set_max(QkTaskPool *pool, int max_busy)
{
    pool->max_busy = max_busy > 0 ? max_busy : 1;
    qk_co_queue_wake_all(&pool->slot_waiters);
}
