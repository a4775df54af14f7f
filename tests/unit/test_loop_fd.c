/* Event loop: fd readiness waits (read, write, timeout, cancel) and
 * callbacks scheduled with qk_loop_call_soon. */
#include "qktest.h"
#include "aio/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

static int pfd[2];
static int read_result = 1, got_byte, timeout_result, cancel_result;
static int cb_count;

static void coroutine_fn reader(void *opaque)
{
    (void)opaque;
    read_result = qk_co_wait_fd(pfd[0], POLLIN, -1);
    char c;
    if (read(pfd[0], &c, 1) == 1) {
        got_byte = c;
    }
}

static void coroutine_fn timeouter(void *opaque)
{
    (void)opaque;
    int64_t t0 = qk_clock_ns();
    timeout_result = qk_co_wait_fd(pfd[0], POLLIN, 3000000);
    QK_CHECK(qk_clock_ns() - t0 >= 3000000);
}

static void coroutine_fn canceled(void *opaque)
{
    (void)opaque;
    cancel_result = qk_co_wait_fd(pfd[0], POLLIN, -1);
}

static void cb(void *opaque)
{
    (*(int *)opaque)++;
}

static void coroutine_fn writer_then(void *opaque)
{
    (void)opaque;
    qk_co_sleep_ns(1000000);
    QK_CHECK_EQ(qk_co_wait_fd(pfd[1], POLLOUT, -1), POLLOUT);
    QK_CHECK_EQ(write(pfd[1], "x", 1), 1);
}

static void coroutine_fn main_co(void *opaque)
{
    (void)opaque;
    qk_coroutine_enter(qk_coroutine_create(reader, NULL));
    qk_coroutine_enter(qk_coroutine_create(writer_then, NULL));
    while (!got_byte) {
        qk_co_sleep_ns(200000);
    }
    QK_CHECK_EQ(read_result, POLLIN);
    QK_CHECK_EQ(got_byte, 'x');

    qk_coroutine_enter(qk_coroutine_create(timeouter, NULL));
    while (!timeout_result) {
        qk_co_sleep_ns(500000);
    }
    QK_CHECK_EQ(timeout_result, -ETIMEDOUT);

    qk_coroutine_enter(qk_coroutine_create(canceled, NULL));
    qk_loop_cancel_fd_wait(qk_loop_get(), pfd[0]);
    qk_co_sleep_ns(100000);
    QK_CHECK_EQ(cancel_result, -ECANCELED);

    qk_loop_call_soon(qk_loop_get(), cb, &cb_count);
    qk_loop_call_soon(qk_loop_get(), cb, &cb_count);
    QK_CHECK_EQ(cb_count, 0);
    qk_co_sleep_ns(100000);
    QK_CHECK_EQ(cb_count, 2);
}

int main(void)
{
    QK_CHECK_EQ(pipe2(pfd, O_NONBLOCK), 0);
    qk_co_run(main_co, NULL);
    close(pfd[0]);
    close(pfd[1]);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
