/*
 * The asynchronous public API, used as an embedding program would (the
 * public header only): many requests in flight on one queue, a queue's
 * completion fd driven from a plain epoll loop, several threads each with
 * a queue of their own on one image, zero writes, discard and flush,
 * argument errors; then the same on an inline image (no engine thread),
 * with a time-limited wait, completions of one queue reaped by another's
 * do_io, and calls from a foreign thread refused; QEMU's tools judge the image afterwards (qemu-img
 * check clean, qemu-img compare identical to a raw file holding what the
 * test wrote).
 */
#include "qktest.h"
#include "qcowkit/qcowkit.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#define SIZE (64ULL << 20)
#define BS 4096
#define NBLOCKS (SIZE / BS)

static uint8_t *model; /* what the guest should read */

static int sh(const char *cmd)
{
    int r = system(cmd);
    return r == -1 || !WIFEXITED(r) ? -1 : WEXITSTATUS(r);
}

static void pattern(uint8_t *buf, uint64_t block, unsigned gen)
{
    for (unsigned i = 0; i < BS; i += 8) {
        uint64_t v = block * 0x9e3779b97f4a7c15ULL + i + gen * 131;
        memcpy(buf + i, &v, 8);
    }
}

/* An inline image's io_uring hands completions back to the opening
 * thread through task work, which interrupts its waits (EINTR) as a
 * signal would: a program's wait loop retries, as these do. */
static int poll_retry(struct pollfd *p, int ms)
{
    int r;
    while ((r = poll(p, 1, ms)) < 0 && errno == EINTR) {
    }
    return r;
}

static int epoll_retry(int ep, struct epoll_event *out, int ms)
{
    int r;
    while ((r = epoll_wait(ep, out, 1, ms)) < 0 && errno == EINTR) {
    }
    return r;
}

/* Waits for exactly n completions on q, checking each returned 0. */
static void wait_all(QkQueue *q, int n)
{
    QkCompletion c[64];
    while (n > 0) {
        int want = n < 64 ? n : 64;
        int got = qk_queue_do_io(q, c, 1, want, -1);
        QK_CHECK(got >= 1);
        if (got < 1) {
            return;
        }
        for (int i = 0; i < got; i++) {
            QK_CHECK_EQ(c[i].ret, 0);
        }
        n -= got;
    }
}

/* 512 writes of distinct blocks in flight at once, then 512 reads. */
static void test_many_in_flight(QkAsyncImage *img)
{
    enum { N = 512 };
    QkQueue *q = qk_async_queue(img, 0);
    uint8_t *bufs = aligned_alloc(4096, (size_t)N * BS);
    uint64_t blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = ((uint64_t)i * 7919) % (NBLOCKS / 2); /* distinct: 7919 is prime to NBLOCKS/2 */
        pattern(bufs + (size_t)i * BS, blocks[i], 1);
        memcpy(model + blocks[i] * BS, bufs + (size_t)i * BS, BS);
        struct iovec iov[2] = {{bufs + (size_t)i * BS, 1000}, {bufs + (size_t)i * BS + 1000, BS - 1000}};
        QK_CHECK_EQ(qk_queue_writev(q, blocks[i] * BS, iov, 2, (void *)(uintptr_t)i), 0);
    }
    QK_CHECK_EQ(qk_queue_outstanding(q), N);
    /* Each completion names its own request exactly once. */
    static uint8_t seen[N];
    memset(seen, 0, sizeof(seen));
    QkCompletion c[N];
    int got = 0;
    while (got < N) {
        int n = qk_queue_do_io(q, c + got, 1, N - got, -1);
        QK_CHECK(n >= 1);
        if (n < 1) {
            break;
        }
        got += n;
    }
    for (int i = 0; i < got; i++) {
        uintptr_t k = (uintptr_t)c[i].user_data;
        QK_CHECK(k < N && !seen[k]);
        if (k < N) {
            seen[k] = 1;
        }
        QK_CHECK_EQ(c[i].ret, 0);
    }
    QK_CHECK_EQ(qk_queue_outstanding(q), 0);
    memset(bufs, 0, (size_t)N * BS);
    for (int i = 0; i < N; i++) {
        struct iovec iov = {bufs + (size_t)i * BS, BS};
        QK_CHECK_EQ(qk_queue_readv(q, blocks[i] * BS, &iov, 1, NULL), 0);
    }
    wait_all(q, N);
    for (int i = 0; i < N; i++) {
        QK_CHECK(memcmp(bufs + (size_t)i * BS, model + blocks[i] * BS, BS) == 0);
    }
    free(bufs);
}

/* A plain epoll loop: the completion fd wakes it, do_io with min 0 reaps. */
static void test_epoll(QkAsyncImage *img)
{
    enum { N = 200 };
    QkQueue *q = qk_async_queue(img, 1);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    QK_CHECK_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, qk_queue_completion_fd(q), &ev), 0);
    uint8_t *bufs = aligned_alloc(4096, (size_t)N * BS);
    for (int i = 0; i < N; i++) {
        struct iovec iov = {bufs + (size_t)i * BS, BS};
        QK_CHECK_EQ(qk_queue_readv(q, (uint64_t)i * 7919 % (NBLOCKS / 2) * BS, &iov, 1, NULL), 0);
    }
    /* max 0: hands the requests over and collects nothing, so the
     * completion fd is the only way to learn that they finished. */
    QkCompletion c[N];
    QK_CHECK_EQ(qk_queue_do_io(q, NULL, 0, 0, 0), 0);
    int got = 0;
    int wakeups = 0;
    while (got < N && got >= 0) {
        struct epoll_event out;
        int n = epoll_retry(ep, &out, 10000);
        QK_CHECK_EQ(n, 1);
        if (n != 1) {
            break;
        }
        wakeups++;
        int r = qk_queue_do_io(q, c + got, 0, N - got, 0);
        QK_CHECK(r >= 0);
        got += r > 0 ? r : 0;
    }
    QK_CHECK_EQ(got, N);
    QK_CHECK(wakeups >= 1);
    for (int i = 0; i < N && i < got; i++) {
        QK_CHECK_EQ(c[i].ret, 0);
    }
    /* Nothing left: the descriptor must not stay readable forever. */
    struct epoll_event out;
    QK_CHECK_EQ(epoll_retry(ep, &out, 0), 0);
    close(ep);
    free(bufs);
}

/* Collecting fewer completions than are waiting leaves the descriptor
 * readable: a program that reaps a few per wake-up must be woken again. */
static void test_partial_collect(QkAsyncImage *img)
{
    enum { N = 16 };
    QkQueue *q = qk_async_queue(img, 1);
    uint8_t *bufs = aligned_alloc(4096, (size_t)N * BS);
    for (int i = 0; i < N; i++) {
        struct iovec iov = {bufs + (size_t)i * BS, BS};
        QK_CHECK_EQ(qk_queue_readv(q, (uint64_t)i * BS, &iov, 1, NULL), 0);
    }
    QK_CHECK_EQ(qk_queue_do_io(q, NULL, 0, 0, 0), 0);
    struct pollfd p = {.fd = qk_queue_completion_fd(q), .events = POLLIN};
    QK_CHECK_EQ(poll_retry(&p, 10000), 1);
    usleep(200000); /* let every read finish */
    QkCompletion c[N];
    int got = 0;
    for (int round = 0; round < N && got < N; round++) {
        /* One per wake-up: the fd must say there is more each time. */
        p.revents = 0;
        int ready = poll_retry(&p, 10000);
        QK_CHECK_EQ(ready, 1);
        if (ready != 1) {
            break;
        }
        int n = qk_queue_do_io(q, c + got, 0, 1, 0);
        QK_CHECK(n == 1 || n == 0);
        got += n > 0 ? n : 0;
    }
    QK_CHECK_EQ(got, N);
    free(bufs);
}

typedef struct Worker {
    QkAsyncImage *img;
    int id;
    int failures;
} Worker;

/* Each thread rewrites its own quarter of the upper half at depth 32;
 * a buffer is reused only after its request's completion came back. */
static void *worker(void *opaque)
{
    Worker *w = opaque;
    enum { DEPTH = 32, PER = 1024 };
    QkQueue *q = qk_async_queue(w->img, 2 + w->id);
    uint64_t first = NBLOCKS / 2 + (uint64_t)w->id * (NBLOCKS / 8);
    uint8_t *bufs = aligned_alloc(4096, (size_t)DEPTH * BS);
    int free_slots[DEPTH], nfree = DEPTH;
    for (int i = 0; i < DEPTH; i++) {
        free_slots[i] = i;
    }
    QkCompletion c[DEPTH];
    int submitted = 0, done = 0;
    while (done < PER) {
        while (submitted < PER && nfree) {
            int slot = free_slots[--nfree];
            uint8_t *b = bufs + (size_t)slot * BS;
            uint64_t blk = first + (uint64_t)submitted * 13 % (NBLOCKS / 8);
            pattern(b, blk, 2);
            struct iovec iov = {b, BS};
            if (qk_queue_writev(q, blk * BS, &iov, 1, (void *)(uintptr_t)slot) != 0) {
                w->failures++;
                free_slots[nfree++] = slot;
            }
            submitted++;
        }
        int n = qk_queue_do_io(q, c, 1, DEPTH, -1);
        if (n <= 0) {
            w->failures++;
            break;
        }
        for (int i = 0; i < n; i++) {
            w->failures += c[i].ret != 0;
            free_slots[nfree++] = (int)(uintptr_t)c[i].user_data;
        }
        done += n;
    }
    free(bufs);
    return NULL;
}

static void test_threads(QkAsyncImage *img)
{
    pthread_t t[4];
    Worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (Worker){.img = img, .id = i};
        QK_CHECK_EQ(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        QK_CHECK_EQ(w[i].failures, 0);
        uint64_t first = NBLOCKS / 2 + (uint64_t)i * (NBLOCKS / 8);
        for (int k = 0; k < 1024; k++) {
            uint64_t blk = first + (uint64_t)k * 13 % (NBLOCKS / 8);
            pattern(model + blk * BS, blk, 2);
        }
    }
}

/* Inline: a wait with a time limit (the poll path), and one queue's
 * completions reaped inside another queue's do_io, which must leave the
 * first queue's descriptor readable. */
static void test_inline_waits(QkAsyncImage *img)
{
    enum { N = 64 };
    QkQueue *q0 = qk_async_queue(img, 0), *q1 = qk_async_queue(img, 1);
    uint8_t *bufs = aligned_alloc(4096, (size_t)(N + 1) * BS);
    QkCompletion c[N];
    for (int i = 0; i < N; i++) {
        struct iovec iov = {bufs + (size_t)i * BS, BS};
        QK_CHECK_EQ(qk_queue_readv(q0, (uint64_t)i * 31 * BS, &iov, 1, NULL), 0);
    }
    int got = 0;
    for (int tries = 0; tries < 100 && got < N; tries++) {
        int n = qk_queue_do_io(q0, c + got, N - got, N - got, 100 * 1000 * 1000);
        QK_CHECK(n >= 0);
        got += n > 0 ? n : 0;
    }
    QK_CHECK_EQ(got, N);
    for (int i = 0; i < N; i++) {
        struct iovec iov = {bufs + (size_t)i * BS, BS};
        /* Blocks test_many_in_flight wrote: reads that reach the disk. */
        QK_CHECK_EQ(qk_queue_readv(q0, (uint64_t)i * 7919 % (NBLOCKS / 2) * BS, &iov, 1, NULL), 0);
    }
    QK_CHECK_EQ(qk_queue_do_io(q0, NULL, 0, 0, 0), 0);
    usleep(100000);
    struct iovec iov1 = {bufs + (size_t)N * BS, BS};
    QK_CHECK_EQ(qk_queue_readv(q1, 0, &iov1, 1, NULL), 0);
    wait_all(q1, 1); /* reaps q0's finished reads too */
    struct pollfd p = {.fd = qk_queue_completion_fd(q0), .events = POLLIN};
    got = 0;
    while (got < N) {
        int ready = poll_retry(&p, 10000);
        QK_CHECK_EQ(ready, 1);
        if (ready != 1) {
            break;
        }
        int n = qk_queue_do_io(q0, c + got, 0, N - got, 0);
        QK_CHECK(n >= 0);
        got += n > 0 ? n : 0;
    }
    QK_CHECK_EQ(got, N);
    QK_CHECK_EQ(poll_retry(&p, 0), 0);
    free(bufs);
}

static void *foreign_thread(void *opaque)
{
    QkAsyncImage *img = opaque;
    QkCompletion c[1];
    intptr_t bad = 0;
    bad += qk_queue_do_io(qk_async_queue(img, 0), c, 0, 1, 0) != -EPERM;
    bad += qk_async_close(img) != -EPERM;
    return (void *)bad;
}

static void test_inline_foreign_thread(QkAsyncImage *img)
{
    pthread_t t;
    void *bad = (void *)1;
    QK_CHECK_EQ(pthread_create(&t, NULL, foreign_thread, img), 0);
    pthread_join(t, &bad);
    QK_CHECK(bad == NULL);
}

static void test_zero_discard_flush(QkAsyncImage *img)
{
    QkQueue *q = qk_async_queue(img, 0);
    QK_CHECK_EQ(qk_queue_write_zeroes(q, 0, 64 * BS, QK_ZERO_UNMAP, NULL), 0);
    QK_CHECK_EQ(qk_queue_write_zeroes(q, 128 * BS, 3 * BS + 100, 0, NULL), 0);
    wait_all(q, 2);
    memset(model, 0, 64 * BS);
    memset(model + 128 * BS, 0, 3 * BS + 100);
    QK_CHECK_EQ(qk_queue_discard(q, 320 * BS, 16 * BS, NULL), 0);
    QK_CHECK_EQ(qk_queue_flush(q, NULL), 0);
    wait_all(q, 2);
    /* A whole discarded cluster reads as zeros here (no backing file);
     * a partial one may keep its data, as in qemu. */
    memset(model + 320 * BS, 0, 16 * BS);
    uint8_t *buf = aligned_alloc(4096, 512 * BS);
    struct iovec iov = {buf, 512 * BS};
    QK_CHECK_EQ(qk_queue_readv(q, 0, &iov, 1, NULL), 0);
    wait_all(q, 1);
    QK_CHECK(memcmp(buf, model, 512 * BS) == 0);
    free(buf);
}

static void test_errors(QkAsyncImage *img)
{
    QkQueue *q = qk_async_queue(img, 0);
    uint8_t b[16];
    struct iovec iov = {b, sizeof(b)};
    QK_CHECK_EQ(qk_queue_readv(q, SIZE - 8, &iov, 1, NULL), -EINVAL);
    QK_CHECK_EQ(qk_queue_write_zeroes(q, SIZE, 1, 0, NULL), -EINVAL);
    QK_CHECK_EQ(qk_queue_write_zeroes(q, 0, 1, 0x80, NULL), -EINVAL);
    QK_CHECK_EQ(qk_queue_readv(q, 0, &iov, -1, NULL), -EINVAL);
    QkCompletion c[1];
    QK_CHECK_EQ(qk_queue_do_io(q, c, 1, 1, 0), -EINVAL); /* nothing outstanding */
    QK_CHECK_EQ(qk_queue_do_io(q, c, 0, 1, 0), 0);
    QK_CHECK(qk_async_queue(img, 6) == NULL);
    QK_CHECK(qk_async_queue(img, -1) == NULL);
    /* NULL where a lookup gave one: an answer, never a crash. */
    QK_CHECK(qk_async_queue(NULL, 0) == NULL);
    QK_CHECK_EQ(qk_async_size(NULL), 0);
    QK_CHECK_EQ(qk_queue_completion_fd(qk_async_queue(img, 6)), -EINVAL);
    QK_CHECK_EQ(qk_queue_outstanding(NULL), 0);
    /* INT64_MAX for "forever", and a wait longer than poll() can take in
     * one call (30 days): the deadline saturates (no overflow, which
     * UBSan reports in the sanitizer build), the completion comes back. */
    const int64_t waits[] = {INT64_MAX, 30LL * 86400 * 1000000000};
    for (int i = 0; i < 2; i++) {
        QK_CHECK_EQ(qk_queue_flush(q, NULL), 0);
        QK_CHECK_EQ(qk_queue_do_io(q, c, 1, 1, waits[i]), 1);
        QK_CHECK_EQ(c[0].ret, 0);
    }
    QK_CHECK_EQ(qk_set_aio_backend("bogus"), -EINVAL);
    QK_CHECK_EQ(qk_set_aio_backend(NULL), -EINVAL);
    QK_CHECK(strcmp(qk_strerror(-EUCLEAN), "image is corrupt") == 0);
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", QK_VERSION_MAJOR, QK_VERSION_MINOR, QK_VERSION_PATCH);
    QK_CHECK(strcmp(qk_version(), want) == 0);
    char msg[256];
    QK_CHECK(qk_async_open("missing.qcow2", NULL, 0, 1, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "missing.qcow2") != NULL);
    QK_CHECK(qk_async_open("missing.qcow2", NULL, 0, 0, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "nqueues") != NULL);
    QK_CHECK(qk_async_open(NULL, NULL, 0, 1, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "no file name") != NULL);
}

int main(void)
{
    if (sh("qemu-img --version >/dev/null 2>&1") != 0) {
        QK_TEST_SKIP("qemu-img not found");
    }
    char dir[] = "/tmp/qk-async-XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0) {
        return 1;
    }
    QK_CHECK_EQ(sh("qemu-img create -q -f qcow2 -o cluster_size=65536 a.qcow2 64M"), 0);
    model = calloc(1, SIZE);
    char msg[256];
    /* The API's backend setting, as the environment would set it. */
    const char *env = getenv("QCOWKIT_AIO");
    QK_CHECK_EQ(qk_set_aio_backend(env && *env ? env : "default"), 0);
    for (int pass = 0; pass < 3; pass++) {
        /* Second pass: O_DIRECT, reopening what the first wrote; third:
         * an inline image, O_DIRECT. */
        int flags = QK_IMAGE_RDWR | (pass ? QK_IMAGE_NOCACHE : 0) | (pass == 2 ? QK_ASYNC_INLINE : 0);
        QkAsyncImage *img = qk_async_open("a.qcow2", "qcow2", flags, 6, msg, sizeof(msg));
        QK_CHECK(img != NULL);
        if (!img) {
            fprintf(stderr, "open: %s\n", msg);
            QK_TEST_DONE();
        }
        QK_CHECK_EQ(qk_async_size(img), SIZE);
        test_many_in_flight(img);
        test_epoll(img);
        test_partial_collect(img);
        if (pass == 2) {
            test_inline_waits(img);
            test_inline_foreign_thread(img);
        } else {
            test_threads(img);
        }
        test_zero_discard_flush(img);
        test_errors(img);
        QK_CHECK_EQ(qk_async_close(img), 0);
    }
    int fd = open("model.raw", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0 && write(fd, model, SIZE) == (ssize_t)SIZE);
    close(fd);
    QK_CHECK_EQ(sh("qemu-img check -q a.qcow2"), 0);
    QK_CHECK_EQ(sh("qemu-img compare -q -f qcow2 -F raw a.qcow2 model.raw"), 0);
    free(model);
    /* Only this run's directory: the other build's run may be going on. */
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "cd / && rm -rf '%s'", dir);
    sh(cmd);
    QK_TEST_DONE();
}
