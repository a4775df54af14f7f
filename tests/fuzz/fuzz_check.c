/*
 * Fuzz target: `check` and `check -r all` on a hostile image. The input
 * is the image file's bytes. The read-only check runs on the input; the
 * repair runs on a private copy (the library writes to it), after which
 * the repaired image is checked and read once more, as a user would.
 * Last, another copy is opened read-write the ordinary way (an image left
 * dirty with lazy refcounts is repaired by the open itself) and written
 * to, which is what a user does with an image check did not refuse.
 */
#include "fuzz_common.h"
#include "aio/loop.h"
#include "block/block.h"
#include "qcow2/qcow2.h"

#include <stdbool.h>
#include <string.h>
#include <unistd.h>

typedef struct Run {
    const char *path;
    int flags;
    int fix;
    bool write;                /* open normally and write instead of checking */
} Run;

static void report(void *opaque, const char *line)
{
    (void)opaque;
    (void)line;
}

/* A write at the start, one in the middle and a zeroed range: enough to
 * allocate clusters and touch refcounts on whatever the image claims. */
static void coroutine_fn write_some(QkBlock *bs)
{
    int64_t size = qk_block_length(bs);
    if (size <= 0) {
        return;
    }
    uint8_t buf[4096];
    memset(buf, 0xa5, sizeof(buf));
    uint64_t n = (uint64_t)size < sizeof(buf) ? (uint64_t)size : sizeof(buf);
    qk_co_pwrite(bs, 0, n, buf, 0);
    qk_co_pwrite(bs, (uint64_t)size / 2, (uint64_t)size - (uint64_t)size / 2 < n ? 1 : n, buf, 0);
    qk_co_pwrite_zeroes(bs, 0, n, QK_REQ_MAY_UNMAP);
    qk_co_flush(bs);
}

static void coroutine_fn run_co(void *opaque)
{
    Run *r = opaque;
    if (r->write) {
        QkError err = {0};
        QkOpenOptions o = {.flags = QK_OPEN_RDWR | QK_OPEN_NO_BACKING, .format = "qcow2"};
        QkBlock *bs = qk_co_block_open(r->path, &o, &err);
        if (bs) {
            write_some(bs);
            qk_co_block_close(bs);
        }
        return;
    }
    QkError err = {0};
    QkOpenOptions o = {.flags = r->flags | QK_OPEN_CHECK | QK_OPEN_NO_BACKING, .format = "qcow2"};
    QkBlock *bs = qk_co_block_open(r->path, &o, &err);
    if (!bs) {
        return;
    }
    QkCheckResult res;
    QkError cerr = {0};
    qk_qcow2_co_check(bs, r->fix, &res, report, NULL, &cerr);
    if (r->fix) {
        /* What the tool does after a repair: check again. */
        QkError err2 = {0};
        qk_qcow2_co_check(bs, 0, &res, report, NULL, &err2);
        uint8_t buf[4096];
        qk_co_pread(bs, 0, qk_block_length(bs) < (int64_t)sizeof(buf) ? (uint64_t)qk_block_length(bs)
                                                                      : sizeof(buf), buf, 0);
    }
    qk_co_block_close(bs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    if (size > FUZZ_MAX_INPUT) {
        return 0;
    }
    char path[64];
    int fd = fuzz_memfd(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    Run ro = {.path = path, .flags = 0, .fix = 0};
    qk_co_run(run_co, &ro);
    close(fd);
    fd = fuzz_memfd(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    Run rw = {.path = path, .flags = QK_OPEN_RDWR, .fix = QK_CHECK_FIX_LEAKS | QK_CHECK_FIX_ERRORS};
    qk_co_run(run_co, &rw);
    close(fd);
    fd = fuzz_memfd(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    Run wr = {.path = path, .write = true};
    qk_co_run(run_co, &wr);
    close(fd);
    return 0;
}
