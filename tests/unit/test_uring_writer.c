/* The io_uring backend's page-cache writer on its own: a ring stands in for
 * the loop's, receives the writer's "results ready" messages, and takes the
 * finished requests. Checks that every request comes back exactly once with
 * the result a lone write would have had: merged sequential runs, scattered
 * writes, requests of several buffers, a merged run cut short by the file
 * size limit (the requests past the limit fail alone with EFBIG), a file
 * descriptor that cannot be written, and requests still queued when the
 * writer is freed. The integrated path (loop, coroutines) is exercised by
 * every buffered-write test on the io_uring backend. */
#include "qktest.h"
#include "aio/uring_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAXREQ 512

static struct io_uring ring;
static QkAioReq reqs[MAXREQ];
static struct iovec iovs[MAXREQ][2];
static int seen[MAXREQ];
static uint64_t tag; /* what the writer's messages carry: its address | 1 */

/* Waits for messages until `want` requests have come back; returns how many
 * came back (more than `want` would be a bug the caller checks). */
static int collect(QkUringWriter *w, int want)
{
    int got = 0;
    while (got < want) {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = 10};
        if (io_uring_wait_cqe_timeout(&ring, &cqe, &ts) < 0) {
            fprintf(stderr, "timed out with %d of %d results\n", got, want);
            break;
        }
        QK_CHECK_EQ(cqe->user_data, tag);
        io_uring_cqe_seen(&ring, cqe);
        for (QkAioReq *r = qk_uring_writer_take(w); r; r = r->next) {
            int i = (int)(r - reqs);
            QK_CHECK(i >= 0 && i < MAXREQ);
            seen[i]++;
            got++;
        }
    }
    return got;
}

static void push_range(QkUringWriter *w, int from, int to)
{
    for (int i = from; i < to; i++) {
        reqs[i].next = i + 1 < to ? &reqs[i + 1] : NULL;
    }
    qk_uring_writer_push(w, &reqs[from], &reqs[to - 1]);
}

static void set_req(int i, int fd, void *buf, size_t len, uint64_t off)
{
    memset(&reqs[i], 0, sizeof(reqs[i]));
    iovs[i][0] = (struct iovec){.iov_base = buf, .iov_len = len};
    reqs[i].op = QK_AIO_WRITE;
    reqs[i].fd = fd;
    reqs[i].iov = iovs[i];
    reqs[i].iovcnt = 1;
    reqs[i].off = off;
    reqs[i].result = INT64_MIN;
}

int main(void)
{
    if (!qk_uring_writer_usable()) {
        QK_TEST_SKIP("kernel has no IORING_OP_MSG_RING");
    }
    QK_CHECK_EQ(io_uring_queue_init(64, &ring, 0), 0);
    const char *dir = getenv("TEST_DIR") ? getenv("TEST_DIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof(path), "%s/uring_writer.XXXXXX", dir);
    int fd = mkstemp(path);
    QK_CHECK(fd >= 0);
    unlink(path);
    int e = 0;
    QkUringWriter *w = qk_uring_writer_new(ring.ring_fd, &e);
    QK_CHECK(w != NULL);
    tag = (uint64_t)(uintptr_t)w | 1;

    /* 1. A sequential run (merged), scattered writes, two-buffer requests,
     * pushed in three hand-overs while the writer works. */
    enum { SEQ = 100, SCAT = 150, TWO = 50, N = SEQ + SCAT + TWO };
    static unsigned char bufs[N][4096];
    static unsigned char model[2 << 20];
    static unsigned char back[2 << 20];
    memset(model, 0, sizeof(model));
    for (int i = 0; i < N; i++) {
        memset(bufs[i], 1 + i % 251, sizeof(bufs[i]));
    }
    for (int i = 0; i < SEQ; i++) {
        set_req(i, fd, bufs[i], 4096, (uint64_t)i * 4096);
    }
    for (int i = SEQ; i < SEQ + SCAT; i++) {
        /* Distinct 4 KiB slots above the sequential run, out of order. */
        uint64_t slot = SEQ + (uint64_t)((i - SEQ) * 37 % SCAT);
        set_req(i, fd, bufs[i], 4096, slot * 4096);
    }
    for (int i = SEQ + SCAT; i < N; i++) {
        uint64_t off = (uint64_t)(SEQ + SCAT + (i - SEQ - SCAT) * 2) * 4096;
        set_req(i, fd, bufs[i], 1000, off);
        iovs[i][1] = (struct iovec){.iov_base = bufs[i] + 1000, .iov_len = 3096};
        reqs[i].iovcnt = 2;
    }
    for (int i = 0; i < N; i++) {
        memcpy(model + reqs[i].off, bufs[i], 4096);
    }
    memset(seen, 0, sizeof(seen));
    push_range(w, 0, SEQ);
    push_range(w, SEQ, SEQ + SCAT);
    push_range(w, SEQ + SCAT, N);
    QK_CHECK_EQ(collect(w, N), N);
    for (int i = 0; i < N; i++) {
        QK_CHECK_EQ(seen[i], 1);
        QK_CHECK_EQ(reqs[i].result, 4096);
    }
    size_t span = (size_t)(SEQ + SCAT + TWO * 2 - 1) * 4096; /* to the end of the last write */
    QK_CHECK_EQ(pread(fd, back, span, 0), (ssize_t)span);
    QK_CHECK(memcmp(back, model, span) == 0);

    /* 2. A sequential run across the file size limit: the merged write stops
     * at the limit, the request it cut gets the short count (its caller
     * writes the rest), and the requests past it fail alone with EFBIG. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    const uint64_t limit = (1 << 20) + 2048;
    lim.rlim_cur = limit;
    lim.rlim_max = old.rlim_max;
    QK_CHECK_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    const uint64_t base = (1 << 20) - 4 * 4096;
    for (int i = 0; i < 8; i++) {
        set_req(i, fd, bufs[i], 4096, base + (uint64_t)i * 4096);
    }
    memset(seen, 0, sizeof(seen));
    push_range(w, 0, 8);
    QK_CHECK_EQ(collect(w, 8), 8);
    setrlimit(RLIMIT_FSIZE, &old);
    for (int i = 0; i < 8; i++) {
        QK_CHECK_EQ(seen[i], 1);
        int64_t want = i < 4 ? 4096 : i == 4 ? 2048 : -EFBIG;
        QK_CHECK_EQ(reqs[i].result, want);
    }

    /* 3. A descriptor not open for writing: each request fails alone. */
    int rfd = open("/dev/null", O_RDONLY);
    for (int i = 0; i < 6; i++) {
        set_req(i, rfd, bufs[i], 4096, (uint64_t)i * 4096);
    }
    memset(seen, 0, sizeof(seen));
    push_range(w, 0, 6);
    QK_CHECK_EQ(collect(w, 6), 6);
    for (int i = 0; i < 6; i++) {
        QK_CHECK_EQ(seen[i], 1);
        QK_CHECK_EQ(reqs[i].result, -EBADF);
    }
    close(rfd);

    /* 4. Freed with work queued: the writes finish and their messages are
     * delivered before the thread stops. (The finished list goes with the
     * writer: the backend frees it only when nothing is in flight.) */
    for (int i = 0; i < 200; i++) {
        set_req(i, fd, bufs[i], 4096, (uint64_t)((i * 7) % 200) * 4096);
    }
    memset(seen, 0, sizeof(seen));
    push_range(w, 0, 200);
    qk_uring_writer_free(w);
    int got = 0;
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
        QK_CHECK_EQ(cqe->user_data, tag);
        io_uring_cqe_seen(&ring, cqe);
        got++;
    }
    QK_CHECK(got >= 1);
    for (int i = 0; i < 200; i++) {
        QK_CHECK_EQ(reqs[i].result, 4096);
    }
    close(fd);
    io_uring_queue_exit(&ring);
    QK_TEST_DONE();
}
