/* The write log (block/writelog.h) as the file driver fills it: many
 * concurrent writes, a flush issued while some are still in flight, zero
 * writes with and without unmap, a discard, a truncate, a FUA write and a
 * caller's mark. Checks the records parse, carry the written data, and
 * that every write whose completion we saw before issuing a flush is logged
 * before that flush's FLUSH_BEGIN (the rule the replay relies on). Then
 * that nothing is logged when QCOWKIT_LOG_WRITES is unset. Runs on
 * whichever backend QCOWKIT_AIO selects, buffered and O_DIRECT. */
#include "qktest.h"
#include "aio/coroutine.h"
#include "aio/loop.h"
#include "block/block.h"
#include "block/writelog.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NW 64
#define WLEN 3000

typedef struct W {
    uint64_t off;
    unsigned char pat;
    bool done;
    bool done_before_flush;   /* completed before the flush was issued */
} W;

static QkBlock *file;
static W ws[NW];
static int outstanding;

static void coroutine_fn write_co(void *opaque)
{
    W *w = opaque;
    unsigned char buf[WLEN];
    memset(buf, w->pat, sizeof(buf));
    QK_CHECK_EQ(qk_co_pwrite(file, w->off, WLEN, buf, 0), 0);
    w->done = true;
    outstanding--;
}

static void coroutine_fn flush_co(void *opaque)
{
    (void)opaque;
    for (int i = 0; i < NW; i++) {
        ws[i].done_before_flush = ws[i].done;
    }
    QK_CHECK_EQ(qk_co_flush(file), 0);
    outstanding--;
}

static void coroutine_fn workload_co(void *opaque)
{
    const char *path = opaque;
    unsigned char fua[512];
    memset(fua, 0x5a, sizeof(fua));
    QK_CHECK_EQ(qk_co_pwrite_zeroes(file, 0, 4096, QK_REQ_MAY_UNMAP), 0);
    QK_CHECK_EQ(qk_co_pwrite_zeroes(file, 4096, 4096, 0), 0);
    QK_CHECK_EQ(qk_co_pdiscard(file, 8192, 4096), 0);
    QK_CHECK_EQ(qk_co_pwrite(file, 12288, sizeof(fua), fua, QK_REQ_FUA), 0);
    QkError err = {0};
    QK_CHECK_EQ(qk_co_truncate(file, 1 << 20, QK_PREALLOC_OFF, &err), 0);
    QK_CHECK_EQ(qk_write_log_mark("test mark"), 0);
    (void)path;
}

typedef struct Rec {
    uint32_t magic;
    uint16_t type, flags;
    uint32_t file, pid;
    uint64_t seq, off, len;
} __attribute__((packed)) Rec;

static unsigned char *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        *len = 0;
        return NULL;
    }
    unsigned char *b = malloc((size_t)st.st_size + 1);
    *len = (size_t)pread(fd, b, (size_t)st.st_size, 0);
    close(fd);
    return b;
}

static void check_log(const char *log, const char *path, size_t start)
{
    size_t len;
    unsigned char *b = slurp(log, &len);
    QK_CHECK(b != NULL);
    if (!b) {
        return;
    }
    int64_t write_pos[NW];
    for (int i = 0; i < NW; i++) {
        write_pos[i] = -1;
    }
    int64_t flush_begin = -1, flush_end = -1, n = 0;
    int counts[9] = {0};
    uint64_t last_seq = 0;
    bool opened = false, marked = false;
    size_t pos = start;
    while (pos + sizeof(Rec) <= len) {
        Rec r;
        memcpy(&r, b + pos, sizeof(r));
        pos += sizeof(r);
        QK_CHECK_EQ(r.magic, QK_WRITE_LOG_MAGIC);
        if (r.magic != QK_WRITE_LOG_MAGIC || r.type == 0 || r.type > 8) {
            break;
        }
        QK_CHECK(r.seq > last_seq);
        last_seq = r.seq;
        counts[r.type]++;
        const unsigned char *data = b + pos;
        if (r.type == QK_WLOG_OPEN || r.type == QK_WLOG_WRITE || r.type == QK_WLOG_MARK) {
            QK_CHECK(pos + r.len <= len);
            pos += r.len;
        }
        if (r.type == QK_WLOG_OPEN) {
            char *real = realpath(path, NULL);
            opened |= real && r.len == strlen(real) && memcmp(data, real, r.len) == 0;
            free(real);
        } else if (r.type == QK_WLOG_WRITE && r.len == WLEN && r.off >= 65536) {
            int i = (int)((r.off - 65536) / 4096);
            QK_CHECK(i >= 0 && i < NW && ws[i].off == r.off);
            if (i >= 0 && i < NW) {
                write_pos[i] = n;
                for (size_t k = 0; k < WLEN; k++) {
                    if (data[k] != ws[i].pat) {
                        QK_CHECK(!"logged write data differs from what was written");
                        break;
                    }
                }
            }
        } else if (r.type == QK_WLOG_FLUSH_BEGIN && flush_begin < 0) {
            flush_begin = n;
        } else if (r.type == QK_WLOG_FLUSH_END && flush_end < 0) {
            flush_end = n;
            QK_CHECK_EQ(r.len, 0);
        } else if (r.type == QK_WLOG_MARK) {
            marked |= r.len == 9 && memcmp(data, "test mark", 9) == 0;
        }
        n++;
    }
    QK_CHECK_EQ(pos, len);
    QK_CHECK(opened);
    QK_CHECK(marked);
    QK_CHECK(flush_begin >= 0 && flush_end > flush_begin);
    int before = 0;
    for (int i = 0; i < NW; i++) {
        QK_CHECK(write_pos[i] >= 0);
        if (ws[i].done_before_flush) {
            before++;
            QK_CHECK(write_pos[i] < flush_begin);
        }
    }
    /* The flush was issued halfway; some writes had completed by then. */
    QK_CHECK(before > 0);
    QK_CHECK(counts[QK_WLOG_ZERO] >= 2);
    QK_CHECK(counts[QK_WLOG_DISCARD] == 1);
    QK_CHECK(counts[QK_WLOG_TRUNCATE] == 1);
    /* Two flushes (ours, the FUA write's) plus close's none: file nodes
     * do not flush on close. */
    QK_CHECK(counts[QK_WLOG_FLUSH_BEGIN] >= 2 && counts[QK_WLOG_FLUSH_BEGIN] == counts[QK_WLOG_FLUSH_END]);
    free(b);
}

static int open_flags;

static void coroutine_fn open_co(void *opaque)
{
    QkError err = {0};
    file = qk_co_file_open(opaque, QK_OPEN_RDWR | open_flags, &err);
    if (!file && open_flags) {
        fprintf(stderr, "O_DIRECT: %s (skipped)\n", err.msg);
        return;
    }
    QK_CHECK(file != NULL);
}

static void coroutine_fn close_co(void *opaque)
{
    (void)opaque;
    qk_co_block_close(file);
}

static void run(const char *path, const char *log)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
    close(fd);
    /* One log per process (the first one named): a second run appends. */
    size_t start;
    free(slurp(log, &start));
    setenv(QK_WRITE_LOG_ENV, log, 1);
    qk_co_run(open_co, (void *)path);
    if (!file) {
        return;
    }
    QkLoop *loop = qk_loop_get();
    outstanding = NW + 1;
    for (int i = 0; i < NW; i++) {
        ws[i] = (W){.off = 65536 + (uint64_t)i * 4096, .pat = (unsigned char)(i + 1)};
        qk_coroutine_enter(qk_coroutine_create(write_co, &ws[i]));
        if (i == NW / 2) {
            /* Let some complete, then flush while the rest are in flight. */
            while (outstanding > NW + 1 - NW / 4) {
                qk_loop_run_once(loop, true);
            }
            qk_coroutine_enter(qk_coroutine_create(flush_co, NULL));
        }
    }
    while (outstanding) {
        qk_loop_run_once(loop, true);
    }
    qk_co_run(workload_co, (void *)path);
    qk_co_run(close_co, NULL);
    check_log(log, path, start);

    /* Off: nothing more is logged. */
    size_t before, after;
    free(slurp(log, &before));
    unsetenv(QK_WRITE_LOG_ENV);
    qk_co_run(open_co, (void *)path);
    if (file) {
        qk_co_run(workload_co, (void *)path);
        qk_co_run(close_co, NULL);
    }
    free(slurp(log, &after));
    QK_CHECK_EQ(after, before);
}

int main(void)
{
    char path[4096], log[4096];
    const char *dir = getenv("TEST_DIR");
    snprintf(path, sizeof(path), "%s/write-log.raw", dir ? dir : ".");
    snprintf(log, sizeof(log), "%s/write-log.log", dir ? dir : ".");
    unlink(log);
    run(path, log);
    open_flags = QK_OPEN_NOCACHE;
    run(path, log);
    unlink(path);
    unlink(log);
    QK_TEST_DONE();
}
