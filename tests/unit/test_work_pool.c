/* Worker threads for CPU work: jobs run off the loop thread, several at
 * once, every coroutine resumes after its own job, and a loop keeps
 * running other coroutines meanwhile. */
#include "qktest.h"
#include "aio/loop.h"
#include "aio/work_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define NJOBS 64

static pthread_t loop_thread;
static atomic_int running, most;
static int on_loop_thread, done, ticks, ticker_done;

typedef struct Job {
    int in, out;
} Job;

static void job_fn(void *opaque)
{
    Job *j = opaque;
    if (pthread_equal(pthread_self(), loop_thread)) {
        on_loop_thread++;
    }
    int now = atomic_fetch_add(&running, 1) + 1;
    int m = atomic_load(&most);
    while (now > m && !atomic_compare_exchange_weak(&most, &m, now)) {
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    j->out = j->in * 3 + 1;
    atomic_fetch_sub(&running, 1);
}

static void coroutine_fn one(void *opaque)
{
    Job *j = opaque;
    qk_co_run_in_thread(job_fn, j);
    QK_CHECK_EQ(j->out, j->in * 3 + 1);
    done++;
}

static void coroutine_fn ticker(void *opaque)
{
    (void)opaque;
    while (done < NJOBS) {
        ticks++;
        qk_co_sleep_ns(500000);
    }
    ticker_done = 1;
}

static void coroutine_fn main_co(void *opaque)
{
    (void)opaque;
    static Job jobs[NJOBS];
    qk_coroutine_enter(qk_coroutine_create(ticker, NULL));
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].in = i;
        qk_coroutine_enter(qk_coroutine_create(one, &jobs[i]));
    }
    /* The ticker too must end before the loop does. */
    while (done < NJOBS || !ticker_done) {
        qk_co_sleep_ns(1000000);
    }
}

int main(void)
{
    loop_thread = pthread_self();
    qk_work_pool_set_threads(4);
    qk_co_run(main_co, NULL);
    QK_CHECK_EQ(done, NJOBS);
    QK_CHECK_EQ(on_loop_thread, 0);
    /* 64 jobs of 2 ms on 4 threads: parallel, and the loop ran meanwhile. */
    fprintf(stderr, "most jobs at once: %d, loop ticks: %d\n", atomic_load(&most), ticks);
    QK_CHECK(atomic_load(&most) >= 2);
    QK_CHECK(atomic_load(&most) <= 4);
    QK_CHECK(ticks >= 2); /* a timer fired while jobs ran (few under load) */
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
