/* VM-state writer and reader against an in-memory sink that completes in
 * random order: round trips of many stream sizes and piece sizes, memory
 * bound, error injection, out-of-sequence pieces, drain waiting. */
#include "qktest.h"
#include "aio/loop.h"
#include "block/block.h"
#include "block/vmstate.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXSTATE (9 << 20)

static unsigned char *store;     /* what the sink holds */
static uint64_t fail_at = UINT64_MAX;
static int sink_calls, sink_done, max_parallel, parallel;

static int coroutine_fn sink(QkBlock *bs, QkIov *q, uint64_t pos)
{
    (void)bs;
    sink_calls++;
    parallel++;
    if (parallel > max_parallel) {
        max_parallel = parallel;
    }
    qk_co_sleep_ns((rand() % 4) * 200000); /* complete out of order */
    parallel--;
    sink_done++;
    if (pos <= fail_at && fail_at < pos + q->size) {
        return -EIO;
    }
    if (pos + q->size > MAXSTATE) {
        return -ENOSPC;
    }
    qk_iov_to_buf(q, 0, store + pos, q->size);
    return 0;
}

static int coroutine_fn source(QkBlock *bs, QkIov *q, uint64_t pos)
{
    (void)bs;
    qk_co_sleep_ns((rand() % 3) * 100000);
    qk_iov_from_buf(q, 0, store + pos, q->size);
    return 0;
}

static QkBlock *bs;
static unsigned char *src;

static void coroutine_fn round_trip(uint64_t size, int workers, uint64_t buf_size, bool unbuffered)
{
    memset(store, 0, MAXSTATE);
    sink_calls = sink_done = max_parallel = 0;
    QkVmStateOptions o = {.buf_size = buf_size, .workers = workers, .unbuffered = unbuffered};
    QkVmStateWriter *w = qk_vmstate_writer_new(bs, &o, sink);
    uint64_t pos = 0;
    while (pos < size) {
        size_t piece = 1 + (size_t)(rand() % (rand() % 8 == 0 ? 65536 : 200));
        if (piece > size - pos) {
            piece = size - pos;
        }
        QK_CHECK_EQ(qk_vmstate_write(w, pos, src + pos, piece), 0);
        pos += piece;
    }
    QK_CHECK_EQ(qk_vmstate_writer_flush(w), 0);
    QK_CHECK_EQ(sink_calls, sink_done);
    if (!unbuffered) {
        uint64_t bsz = buf_size ? buf_size : 2 << 20; /* the default */
        QK_CHECK(qk_vmstate_writer_peak_memory(w) <= (uint64_t)(workers + 1) * bsz);
        if (size > 4 * bsz && workers > 1) {
            QK_CHECK(max_parallel > 1); /* buffers really were written in parallel */
        }
        if (size > 0) {
            QK_CHECK(max_parallel <= workers);
        }
    }
    qk_vmstate_writer_free(w);
    QK_CHECK(memcmp(store, src, size) == 0);

    /* Read back in random piece sizes through read-ahead. */
    QkVmStateReader *r = qk_vmstate_reader_new(bs, size, &o, source);
    unsigned char *back = malloc(size + 1);
    uint64_t got = 0;
    while (got < size) {
        size_t piece = 1 + (size_t)(rand() % 70000);
        int64_t n = qk_vmstate_read(r, got, back + got, piece);
        QK_CHECK(n > 0);
        if (n <= 0) {
            break;
        }
        got += (uint64_t)n;
    }
    QK_CHECK_EQ(qk_vmstate_read(r, size, back, 10), 0);
    QK_CHECK(memcmp(back, src, size) == 0);
    qk_vmstate_reader_close(r);
    free(back);
}

static void coroutine_fn body(void *opaque)
{
    (void)opaque;
    uint64_t sizes[] = {0, 1, 4095, 65537, (1 << 20) - 3, 3 * (1 << 20) + 12345, 8 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        round_trip(sizes[i], 4, 0, false);
        round_trip(sizes[i], 1, 65536, false);
        round_trip(sizes[i], 8, 128 * 1024, false);
    }
    round_trip(300000, 4, 0, true);

    /* An injected error in the middle: flush reports it. */
    fail_at = 5 << 20;
    QkVmStateOptions o = {.workers = 4};
    QkVmStateWriter *w = qk_vmstate_writer_new(bs, &o, sink);
    int first_err = 0;
    for (uint64_t pos = 0; pos < (8 << 20); pos += 4104) {
        int r = qk_vmstate_write(w, pos, src + pos, 4104);
        if (r < 0 && !first_err) {
            first_err = r;
        }
    }
    QK_CHECK_EQ(qk_vmstate_writer_flush(w), -EIO);
    QK_CHECK(first_err == 0 || first_err == -EIO);
    qk_vmstate_writer_free(w);
    fail_at = UINT64_MAX;

    /* Out-of-sequence piece: buffered data is written first, then the piece. */
    memset(store, 0, MAXSTATE);
    w = qk_vmstate_writer_new(bs, &o, sink);
    QK_CHECK_EQ(qk_vmstate_write(w, 0, src, 5000), 0);
    QK_CHECK_EQ(qk_vmstate_write(w, 100, "XYZ", 3), 0);     /* rewrites inside buffered data */
    QK_CHECK_EQ(qk_vmstate_write(w, 103, src + 103, 10), 0); /* continues after the piece */
    QK_CHECK_EQ(qk_vmstate_writer_flush(w), 0);
    qk_vmstate_writer_free(w);
    QK_CHECK(memcmp(store, src, 100) == 0);
    QK_CHECK(memcmp(store + 100, "XYZ", 3) == 0);
    QK_CHECK(memcmp(store + 103, src + 103, 5000 - 103) == 0);

    /* Drain waits for buffered writes still in flight. */
    w = qk_vmstate_writer_new(bs, &o, sink);
    sink_calls = sink_done = 0;
    for (uint64_t pos = 0; pos < (4 << 20); pos += 65536) {
        qk_vmstate_write(w, pos, src + pos, 65536);
    }
    QK_CHECK(sink_done < sink_calls); /* something is still in flight */
    QK_CHECK(bs->in_flight > 0);
    qk_co_drain(bs);
    QK_CHECK_EQ(sink_done, sink_calls);
    QK_CHECK_EQ(bs->in_flight, 0);
    QK_CHECK_EQ(qk_vmstate_writer_flush(w), 0);
    qk_vmstate_writer_free(w);
}

int main(void)
{
    int fd = open("vm.raw", O_RDWR | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
    close(fd);
    store = malloc(MAXSTATE);
    src = malloc(MAXSTATE);
    srand(1234);
    for (size_t i = 0; i < MAXSTATE; i++) {
        src[i] = (unsigned char)(rand() >> 7);
    }
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
    bs = qk_block_open("vm.raw", &o, &err);
    QK_CHECK(bs != NULL);
    if (bs) {
        qk_co_run(body, NULL);
        qk_block_close(bs);
    }
    free(store);
    free(src);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
