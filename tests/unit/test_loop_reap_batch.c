/* Completions in batches while a coroutine waits on a descriptor
 * (loop-reap-batch), on both backends:
 * 1. A backend's reap runs at most the number of completions it is asked
 *    for and keeps the rest for the next reap; none is lost or run twice.
 * 2. The loop uses that: when 32 reads (of pipes, so that they finish
 *    only when the test says) have finished and another pipe became
 *    readable at the same time, the coroutine waiting on that pipe runs
 *    after the first batch of 8 completions, not after all 32 (an NBD
 *    server reads its next requests between batches of replies). At 0
 *    the loop runs all 32 first, which shows that 2 can fail. */
#include "qktest.h"
#include "aio/aio.h"
#include "aio/backend.h"
#include "aio/loop.h"
#include "util/tunables.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NREQ 32
#define BLK 4096

static int file_fd;
static int pfd[2];
static int rfd[NREQ][2];    /* the reads' pipes */
static int pipe_seen_at = -1;
static int reads_done;     /* reads whose coroutine has run */

/* ---- 1: the backends' reap ---- */

static QkAioReq reqs[NREQ];
static struct iovec iovs[NREQ];
static uint8_t bufs[NREQ][BLK];
static int ran[NREQ];

static void coroutine_fn on_complete(void *opaque)
{
    QkAioReq *r = opaque;
    ran[r - reqs]++;
}

static void backend_reap(void *(*make)(QkAioBackend *, int *), const char *what)
{
    QkAioBackend ops;
    int e = 0;
    void *st = make(&ops, &e);
    if (!st) {
        QK_TEST_SKIP("no backend here");
    }
    memset(ran, 0, sizeof(ran));
    for (int i = 0; i < NREQ; i++) {
        iovs[i] = (struct iovec){.iov_base = bufs[i], .iov_len = BLK};
        reqs[i] = (QkAioReq){.op = QK_AIO_READ, .fd = file_fd, .iov = &iovs[i], .iovcnt = 1,
                             .off = (uint64_t)i * BLK, .len = BLK};
        reqs[i].co = qk_coroutine_create(on_complete, &reqs[i]);
        ops.queue(st, &reqs[i]);
    }
    ops.submit(st);
    /* Reads of a cached file: long done after this. */
    usleep(300 * 1000);
    unsigned total = 0, calls = 0;
    for (int tries = 0; total < NREQ && tries < 1000; tries++) {
        unsigned n = ops.reap(st, 8);
        if (n == 0) {
            usleep(10 * 1000);
            continue;
        }
        if (calls++ == 0) {
            QK_CHECK_EQ(n, 8u); /* everything was ready: exactly the batch */
        }
        QK_CHECK(n <= 8);
        total += n;
    }
    QK_CHECK_EQ(total, (unsigned)NREQ);
    QK_CHECK_EQ(ops.reap(st, 8), 0u);
    for (int i = 0; i < NREQ; i++) {
        QK_CHECK_EQ(ran[i], 1);
        QK_CHECK_EQ(reqs[i].result, BLK);
        QK_CHECK(bufs[i][0] == (uint8_t)i && bufs[i][BLK - 1] == (uint8_t)i);
    }
    QK_CHECK(calls >= NREQ / 8);
    ops.destroy(st);
    printf("ok: %s reaps at most 8 at a time, %u calls for %d completions\n", what, calls, NREQ);
}

/* ---- 2: the loop ---- */

static void coroutine_fn reader(void *opaque)
{
    int i = (int)(intptr_t)opaque;
    static char b[NREQ];
    struct iovec iov = {&b[i], 1};
    QK_CHECK_EQ(qk_co_host_preadv(rfd[i][0], &iov, 1, UINT64_MAX), 1);
    reads_done++;
}

static void coroutine_fn pipe_waiter(void *opaque)
{
    (void)opaque;
    QK_CHECK_EQ(qk_co_wait_fd(pfd[0], POLLIN, -1), POLLIN);
    pipe_seen_at = reads_done;
}

/* Returns how many reads had run when the pipe's coroutine did. */
static int loop_order(QkAioBackendKind kind, const char *batch)
{
    QK_CHECK_EQ(qk_tunable_set("loop-reap-batch", batch), 0);
    qk_aio_set_backend(kind);
    QkLoop *loop = qk_loop_get();
    QK_CHECK_EQ(pipe(pfd), 0);
    for (int i = 0; i < NREQ; i++) {
        QK_CHECK_EQ(pipe(rfd[i]), 0);
    }
    reads_done = 0;
    pipe_seen_at = -1;
    qk_coroutine_enter(qk_coroutine_create(pipe_waiter, NULL));
    for (int i = 0; i < NREQ; i++) {
        qk_coroutine_enter(qk_coroutine_create(reader, (void *)(intptr_t)i));
    }
    /* Hands the reads over; none can finish yet... */
    qk_loop_run_once(loop, false);
    QK_CHECK_EQ(reads_done, 0);
    /* ...then all of them do, and the waiter's pipe becomes readable. */
    for (int i = 0; i < NREQ; i++) {
        QK_CHECK_EQ(write(rfd[i][1], "r", 1), 1);
    }
    QK_CHECK_EQ(write(pfd[1], "x", 1), 1);
    usleep(300 * 1000);
    for (int guard = 0; (reads_done < NREQ || pipe_seen_at < 0) && guard < 100000; guard++) {
        qk_loop_run_once(loop, true);
    }
    QK_CHECK_EQ(reads_done, NREQ);
    QK_CHECK(pipe_seen_at >= 0);
    close(pfd[0]);
    close(pfd[1]);
    for (int i = 0; i < NREQ; i++) {
        close(rfd[i][0]);
        close(rfd[i][1]);
    }
    qk_loop_destroy_current();
    return pipe_seen_at;
}

int main(void)
{
    char path[] = "/tmp/qk-reap-batch.XXXXXX";
    file_fd = mkstemp(path);
    QK_CHECK(file_fd >= 0);
    unlink(path);
    static uint8_t block[BLK];
    for (int b = 0; b < NREQ; b++) {
        memset(block, b, BLK);
        QK_CHECK_EQ(pwrite(file_fd, block, BLK, (off_t)b * BLK), BLK);
    }

    backend_reap(qk_uring_backend_new, "io_uring");
    backend_reap(qk_threads_backend_new, "threads");

    static const struct {
        QkAioBackendKind kind;
        const char *name;
    } kinds[] = {{QK_AIO_IO_URING, "io_uring"}, {QK_AIO_THREADS, "threads"}};
    for (unsigned k = 0; k < 2; k++) {
        int at = loop_order(kinds[k].kind, "8");
        QK_CHECK_EQ(at, 8);
        int all = loop_order(kinds[k].kind, "0");
        QK_CHECK_EQ(all, NREQ);
        printf("ok: %s loop: the pipe's coroutine ran after %d reads with batches of 8, after %d with 0\n",
               kinds[k].name, at, all);
    }
    close(file_fd);
    QK_TEST_DONE();
}
