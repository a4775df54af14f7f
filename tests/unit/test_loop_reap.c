/* Event loop: a completion reaped just before the loop would block ends
 * the iteration. A reap runs the finished request's coroutine, which may
 * complete what the caller of qk_loop_run_once waits for; blocking after
 * that with nothing left in flight would wait forever (a test once hung
 * in CI this way, 96 writes into the same clusters, once in many runs). */
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
    static const char msg[] = "FAIL: qk_loop_run_once blocked after its reap finished the last request\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(1);
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
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
