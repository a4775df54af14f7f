/* The io_uring backend's submission batches on their own: with
 * uring-submit-batch at N, the Nth request queued reaches the kernel
 * without the loop's submit (so it completes while the test only waits),
 * fewer than N do not, a sequential stream stays queued in one piece
 * until the loop submits unless it reaches uring-seq-max bytes, and at 0
 * nothing goes before the loop submits.
 * Requests are reads of a file with known bytes; each completion enters a
 * coroutine that records the result. */
#include "qktest.h"
#include "aio/backend.h"
#include "util/tunables.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NREQ 8
#define BLK 4096

static QkAioReq reqs[NREQ];
static struct iovec iovs[NREQ];
static uint8_t bufs[NREQ][BLK];
static int64_t results[NREQ];
static int done;

static void coroutine_fn on_complete(void *opaque)
{
    QkAioReq *r = opaque;
    results[r - reqs] = r->result;
    done++;
}

/* Queues request i: a read of one block at OFF. */
static void queue_read(QkAioBackend *ops, void *st, int fd, int i, uint64_t off)
{
    memset(bufs[i], 0, BLK);
    iovs[i] = (struct iovec){.iov_base = bufs[i], .iov_len = BLK};
    reqs[i] = (QkAioReq){.op = QK_AIO_READ, .fd = fd, .iov = &iovs[i], .iovcnt = 1, .off = off, .len = BLK};
    results[i] = -1;
    reqs[i].co = qk_coroutine_create(on_complete, &reqs[i]);
    ops->queue(st, &reqs[i]);
}

/* Reaps for up to ms milliseconds or until `want` have completed, never
 * calling submit; returns how many completed. */
static int reap_for(QkAioBackend *ops, void *st, int want, int ms)
{
    for (int t = 0; t < ms && done < want; t += 10) {
        ops->wait(st, 10 * 1000 * 1000);
        ops->reap(st, 0);
    }
    ops->reap(st, 0);
    return done;
}

/* Every request up to n read back the bytes it asked for. */
static void check_reads(int n)
{
    for (int i = 0; i < n; i++) {
        QK_CHECK_EQ(results[i], BLK);
        uint64_t block = reqs[i].off / BLK;
        QK_CHECK(bufs[i][0] == (uint8_t)block && bufs[i][BLK - 1] == (uint8_t)block);
    }
}

static void *backend(QkAioBackend *ops, const char *batch, const char *seq_max)
{
    QK_CHECK_EQ(qk_tunable_set("uring-submit-batch", batch), 0);
    QK_CHECK_EQ(qk_tunable_set("uring-seq-max", seq_max), 0);
    int e = 0;
    void *st = qk_uring_backend_new(ops, &e);
    if (!st) {
        QK_TEST_SKIP("no io_uring here");
    }
    return st;
}

int main(void)
{
    char path[] = "/tmp/qk-uring-batch.XXXXXX";
    int fd = mkstemp(path);
    QK_CHECK(fd >= 0);
    unlink(path);
    static uint8_t block[BLK];
    for (int b = 0; b < 64; b++) {
        memset(block, b, BLK);
        QK_CHECK_EQ(pwrite(fd, block, BLK, (off_t)b * BLK), BLK);
    }
    /* Scattered, so none continues the one before it. */
    static const int scattered[NREQ] = {40, 3, 17, 60, 9, 33, 1, 50};
    QkAioBackend ops;

    /* Batches of 4: three scattered reads wait for the loop's submit... */
    void *st = backend(&ops, "4", "0");
    done = 0;
    for (int i = 0; i < 3; i++) {
        queue_read(&ops, st, fd, i, (uint64_t)scattered[i] * BLK);
    }
    QK_CHECK_EQ(reap_for(&ops, st, 3, 100), 0);
    /* ...and the fourth takes all four to the kernel. */
    queue_read(&ops, st, fd, 3, (uint64_t)scattered[3] * BLK);
    QK_CHECK_EQ(reap_for(&ops, st, 4, 5000), 4);
    check_reads(4);

    /* A sequential stream past the batch size stays queued as one piece. */
    done = 0;
    for (int i = 0; i < NREQ; i++) {
        queue_read(&ops, st, fd, i, (uint64_t)(20 + i) * BLK);
    }
    QK_CHECK_EQ(reap_for(&ops, st, NREQ, 100), 0);
    QK_CHECK_EQ(ops.submit(st), NREQ);
    QK_CHECK_EQ(reap_for(&ops, st, NREQ, 5000), NREQ);
    check_reads(NREQ);
    ops.destroy(st);

    /* With uring-seq-max at three blocks the stream goes in pieces of
     * three: six requests reach the kernel on their own, the last two
     * wait for the loop's submit. */
    st = backend(&ops, "4", "12288");
    done = 0;
    for (int i = 0; i < NREQ; i++) {
        queue_read(&ops, st, fd, i, (uint64_t)(20 + i) * BLK);
    }
    QK_CHECK_EQ(reap_for(&ops, st, 7, 300), 6);
    QK_CHECK_EQ(ops.submit(st), 2);
    QK_CHECK_EQ(reap_for(&ops, st, NREQ, 5000), NREQ);
    check_reads(NREQ);
    ops.destroy(st);

    /* At 0, nothing reaches the kernel before the loop's submit. */
    st = backend(&ops, "0", "0");
    done = 0;
    for (int i = 0; i < NREQ; i++) {
        queue_read(&ops, st, fd, i, (uint64_t)scattered[i] * BLK);
    }
    QK_CHECK_EQ(reap_for(&ops, st, NREQ, 100), 0);
    ops.submit(st);
    QK_CHECK_EQ(reap_for(&ops, st, NREQ, 5000), NREQ);
    check_reads(NREQ);
    ops.destroy(st);
    close(fd);
    QK_TEST_DONE();
}
