/* Task pool: slot and all waiters, error keeping, bounded concurrency. */
#include "qktest.h"
#include "aio/loop.h"
#include "aio/task_pool.h"

#include <errno.h>

static int busy_now, busy_max, finished;

typedef struct Job {
    int64_t sleep_ns;
    int ret;
} Job;

static int coroutine_fn job_fn(void *opaque)
{
    Job *j = opaque;
    busy_now++;
    if (busy_now > busy_max) {
        busy_max = busy_now;
    }
    qk_co_sleep_ns(j->sleep_ns);
    busy_now--;
    finished++;
    return j->ret;
}

/* --- two waiters on the last slot both wake --- */
static QkTaskPool *pool1;
static int slot_waiters_woken, all_waiters_woken;

static void coroutine_fn slot_waiter(void *opaque)
{
    (void)opaque;
    qk_task_pool_wait_slot(pool1);
    slot_waiters_woken++;
}

static void coroutine_fn all_waiter(void *opaque)
{
    QkTaskPool *p = opaque;
    qk_task_pool_wait_all(p);
    QK_CHECK(qk_task_pool_empty(p));
    all_waiters_woken++;
}

static Job long_job = {3000000, 0};

static void coroutine_fn starter_two_waiters(void *opaque)
{
    (void)opaque;
    pool1 = qk_task_pool_new(1);
    qk_task_pool_start(pool1, job_fn, &long_job);
    /* Both wait for the only (busy) slot; one finish must wake both. */
    qk_coroutine_enter(qk_coroutine_create(slot_waiter, NULL));
    qk_coroutine_enter(qk_coroutine_create(slot_waiter, NULL));
    /* Two all-waiters, neither of them the creator. */
    qk_coroutine_enter(qk_coroutine_create(all_waiter, pool1));
    qk_coroutine_enter(qk_coroutine_create(all_waiter, pool1));
    QK_CHECK_EQ(slot_waiters_woken, 0);
    while (slot_waiters_woken < 2 || all_waiters_woken < 2) {
        qk_co_sleep_ns(100000);
    }
    QK_CHECK_EQ(qk_task_pool_status(pool1), 0);
    qk_task_pool_free(pool1);
}

/* --- first error kept, later tasks still finish --- */
static Job err_jobs[6] = {
    {1000000, 0}, {2000000, -EIO}, {3000000, -ENOSPC}, {4000000, 0}, {500000, 0}, {5000000, -EPERM},
};

static void coroutine_fn errors_co(void *opaque)
{
    (void)opaque;
    finished = 0;
    QkTaskPool *p = qk_task_pool_new(6);
    for (int i = 0; i < 6; i++) {
        qk_task_pool_start(p, job_fn, &err_jobs[i]);
    }
    qk_task_pool_wait_all(p);
    QK_CHECK_EQ(finished, 6);
    QK_CHECK_EQ(qk_task_pool_status(p), -EIO); /* -EIO finished first */
    qk_task_pool_free(p);
}

/* --- sizes 1..64: never more than max busy, and max is reached --- */
static void coroutine_fn sizes_co(void *opaque)
{
    (void)opaque;
    static Job jobs[200];
    for (int n = 1; n <= 64; n = n < 8 ? n + 1 : n * 2) {
        busy_now = busy_max = finished = 0;
        QkTaskPool *p = qk_task_pool_new(n);
        int total = n * 3 > 200 ? 200 : n * 3;
        for (int i = 0; i < total; i++) {
            jobs[i].sleep_ns = 100000 + (i % 5) * 50000;
            jobs[i].ret = 0;
            qk_task_pool_start(p, job_fn, &jobs[i]);
            QK_CHECK(qk_task_pool_busy(p) <= n);
        }
        qk_task_pool_wait_all(p);
        QK_CHECK_EQ(finished, total);
        QK_CHECK_EQ(busy_max, n);
        QK_CHECK_EQ(qk_task_pool_busy(p), 0);
        qk_task_pool_free(p);
    }
}

/* --- a task that finishes without yielding --- */
static int coroutine_fn instant(void *opaque)
{
    (*(int *)opaque)++;
    return 0;
}

static void coroutine_fn instant_co(void *opaque)
{
    (void)opaque;
    int count = 0;
    QkTaskPool *p = qk_task_pool_new(2);
    for (int i = 0; i < 100; i++) {
        qk_task_pool_start(p, instant, &count);
    }
    qk_task_pool_wait_all(p);
    qk_task_pool_wait_slot(p);
    QK_CHECK_EQ(count, 100);
    qk_task_pool_free(p);
}

int main(void)
{
    qk_co_run(starter_two_waiters, NULL);
    QK_CHECK_EQ(slot_waiters_woken, 2);
    QK_CHECK_EQ(all_waiters_woken, 2);
    qk_co_run(errors_co, NULL);
    qk_co_run(sizes_co, NULL);
    qk_co_run(instant_co, NULL);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
