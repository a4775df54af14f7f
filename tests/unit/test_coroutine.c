/* Coroutines, wake-ups, queues, mutex, timers, pooled stack reuse. */
#include "qktest.h"
#include "aio/co_sync.h"
#include "aio/loop.h"

#include <string.h>

static int trace[64];
static int ntrace;

static void coroutine_fn ping(void *opaque)
{
    int id = *(int *)opaque;
    trace[ntrace++] = id;
    qk_coroutine_yield();
    trace[ntrace++] = id + 10;
}

static QkCoQueue q = QK_CO_QUEUE_INIT;
static int woken;

static void coroutine_fn waiter(void *opaque)
{
    (void)opaque;
    qk_co_queue_wait(&q);
    woken++;
}

static QkCoMutex mtx;
static int in_section, max_in_section, sections;

static void coroutine_fn locker(void *opaque)
{
    (void)opaque;
    for (int i = 0; i < 5; i++) {
        qk_co_mutex_lock(&mtx);
        in_section++;
        if (in_section > max_in_section) {
            max_in_section = in_section;
        }
        qk_co_sleep_ns(1000);
        in_section--;
        sections++;
        qk_co_mutex_unlock(&mtx);
    }
}

static int deep(int n)
{
    volatile char pad[1024];
    memset((char *)pad, n, sizeof(pad));
    return n == 0 ? pad[0] : deep(n - 1) + 1;
}

static bool done_main;
static int64_t slept_ns;

static void coroutine_fn main_co(void *opaque)
{
    (void)opaque;
    int64_t t0 = qk_clock_ns();
    qk_co_sleep_ns(2000000);
    slept_ns = qk_clock_ns() - t0;
    /* Deep recursion on a coroutine stack works (128 KiB of frames). */
    QK_CHECK_EQ(deep(100), 100);
    done_main = true;
}

int main(void)
{
    int a = 1, b = 2;
    QkCoroutine *ca = qk_coroutine_create(ping, &a);
    QkCoroutine *cb = qk_coroutine_create(ping, &b);
    qk_coroutine_enter(ca);
    qk_coroutine_enter(cb);
    QK_CHECK(!qk_in_coroutine());
    qk_coroutine_enter(ca);
    qk_coroutine_enter(cb);
    QK_CHECK_EQ(ntrace, 4);
    QK_CHECK_EQ(trace[0], 1);
    QK_CHECK_EQ(trace[1], 2);
    QK_CHECK_EQ(trace[2], 11);
    QK_CHECK_EQ(trace[3], 12);

    /* Wake-all wakes exactly the queued waiters, from the loop. */
    QkLoop *loop = qk_loop_get();
    for (int i = 0; i < 5; i++) {
        qk_coroutine_enter(qk_coroutine_create(waiter, NULL));
    }
    QK_CHECK_EQ(woken, 0);
    QK_CHECK(qk_co_queue_wake_one(&q));
    qk_loop_run_once(loop, false);
    QK_CHECK_EQ(woken, 1);
    qk_co_queue_wake_all(&q);
    QK_CHECK_EQ(woken, 1); /* waking does not switch immediately */
    qk_loop_run_once(loop, false);
    QK_CHECK_EQ(woken, 5);
    QK_CHECK(!qk_co_queue_wake_one(&q));

    /* Mutex: mutual exclusion across yields. */
    qk_co_mutex_init(&mtx);
    for (int i = 0; i < 4; i++) {
        qk_coroutine_enter(qk_coroutine_create(locker, NULL));
    }
    while (sections < 20) {
        qk_loop_run_once(loop, true);
    }
    QK_CHECK_EQ(max_in_section, 1);

    qk_co_run(main_co, NULL);
    QK_CHECK(done_main);
    QK_CHECK(slept_ns >= 2000000);

    /* Many short-lived coroutines reuse pooled stacks. */
    for (int i = 0; i < 10000; i++) {
        int x = i;
        ntrace = 0;
        QkCoroutine *c = qk_coroutine_create(ping, &x);
        qk_coroutine_enter(c);
        qk_coroutine_enter(c);
        if (ntrace != 2) {
            QK_CHECK_EQ(ntrace, 2);
            break;
        }
    }
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
