/* Event loop: an iteration that ran anything does not block after it.
 * 1. A completion reaped just before the loop would block ends the
 *    iteration. A reap runs the finished request's coroutine, which may
 *    complete what the caller of qk_loop_run_once waits for; blocking
 *    after that with nothing left in flight would wait forever (a test
 *    once hung in CI this way, 96 writes into the same clusters, once in
 *    many runs).
 * 2. A coroutine that ran from the ready list may finish what the caller
 *    waits for while another request stays in flight for good (a
 *    driver's completion reader): qk_co_run must return, not wait for
 *    that request. */
#include "qktest.h"
#include "aio/aio.h"
#include "aio/loop.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int pfd[2];
static bool done;
static ssize_t got;

static void coroutine_fn pipe_reader(void *opaque)
{
    char *buf = opaque;
    struct iovec iov = {buf, 1};
    got = qk_co_host_preadv(pfd[0], &iov, 1, UINT64_MAX);
    done = true;
}

static void hung(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: qk_loop_run_once blocked after it had run what its caller waited for\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(1);
}

static int lfd[2];
static bool long_done;

/* Stays in flight until the end of the test. */
static void coroutine_fn long_reader(void *opaque)
{
    char *buf = opaque;
    struct iovec iov = {buf, 1};
    qk_co_host_preadv(lfd[0], &iov, 1, UINT64_MAX);
    long_done = true;
}

static void coroutine_fn finisher(void *opaque)
{
    (void)opaque;
}

static void coroutine_fn waker(void *opaque)
{
    /* Runs later from the ready list, as a completion reader's wake does. */
    qk_coroutine_wake(qk_coroutine_create(finisher, opaque));
    qk_coroutine_wake(qk_coroutine_self());
    qk_coroutine_yield();
}

int main(void)
{
    signal(SIGALRM, hung);
    QkLoop *loop = qk_loop_get();
    for (int round = 0; round < 20; round++) {
        QK_CHECK_EQ(pipe(pfd), 0);
        done = false;
        got = 0;
        char buf[1] = {0};
        qk_coroutine_enter(qk_coroutine_create(pipe_reader, buf));
        /* Submits the read; nothing can complete it yet. */
        qk_loop_run_once(loop, false);
        QK_CHECK(!done);
        /* The completion is ready before the next iteration starts, so its
         * first reap (ahead of any wait) is the one that finds it. */
        QK_CHECK_EQ(write(pfd[1], "y", 1), 1);
        usleep(20000);
        alarm(10);
        qk_loop_run_once(loop, true);
        alarm(0);
        QK_CHECK(done);
        QK_CHECK_EQ(got, 1);
        QK_CHECK_EQ(buf[0], 'y');
        close(pfd[0]);
        close(pfd[1]);
    }
    /* 2: a request left in flight for good. */
    QK_CHECK_EQ(pipe(lfd), 0);
    char lbuf[1] = {0};
    qk_coroutine_enter(qk_coroutine_create(long_reader, lbuf));
    for (int round = 0; round < 20; round++) {
        alarm(10);
        qk_co_run(waker, NULL);
        alarm(0);
    }
    QK_CHECK_EQ(write(lfd[1], "z", 1), 1);
    /* Until the reader has returned, not only until its byte landed. */
    while (!long_done) {
        qk_loop_run_once(loop, true);
    }
    QK_CHECK_EQ(lbuf[0], 'z');
    close(lfd[0]);
    close(lfd[1]);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
