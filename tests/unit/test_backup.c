/* Backup job: the target receives the source as it was at the start while
 * writers overwrite it (data, zeroes, discards; raw and qcow2 sources), at
 * every moment of the copy, including writes to the chunks the background
 * pass is copying right then; sync=bitmap copies the bitmap's chunks only
 * and hands the bitmap the writes made since the start; a cancelled job
 * gives the bitmap back what it had; a failing target fails the job but
 * never a write; the point-in-time view (sync=none) keeps its old data for
 * a read on its way while a write to the same chunk arrives. */
#include "qktest.h"
#include "aio/loop.h"
#include "block/block.h"
#include "block/debug.h"
#include "block/dirty_bitmap.h"
#include "block/inject.h"
#include "jobs/backup.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1ULL << 20)
#define SIZE (16 * MiB)
#define GRAN (64 * 1024)

static uint8_t *orig, *now;

static QkBlock *coroutine_fn open_img(const char *name, const char *fmt)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = fmt};
    QkBlock *bs = qk_co_block_open(name, &o, &err);
    if (!bs) {
        fprintf(stderr, "open %s: %s\n", name, err.msg);
    }
    return bs;
}

static int coroutine_fn create_img(const char *name, const char *fmt)
{
    QkError err = {0};
    unlink(name);
    QkCreateOptions c = {.format = fmt, .size = SIZE, .size_set = true};
    int r = qk_co_block_create(name, &c, &err);
    if (r < 0) {
        fprintf(stderr, "create %s: %s\n", name, err.msg);
    }
    return r;
}

/* The source's contents at the start: every 64 KiB chunk its own byte,
 * with a zero range and an unwritten range among them. */
static int coroutine_fn seed_source(QkBlock *src)
{
    for (uint64_t c = 0; c < SIZE / GRAN; c++) {
        memset(orig + c * GRAN, (int)(c % 251) + 1, GRAN);
    }
    memset(orig + 3 * MiB, 0, MiB);
    memset(orig + 9 * MiB, 0, 2 * MiB);
    int r = qk_co_pwrite(src, 0, 3 * MiB, orig, 0);
    r = r ? r : qk_co_pwrite_zeroes(src, 3 * MiB, MiB, 0);
    r = r ? r : qk_co_pwrite(src, 4 * MiB, 5 * MiB, orig + 4 * MiB, 0);
    r = r ? r : qk_co_pwrite(src, 11 * MiB, SIZE - 11 * MiB, orig + 11 * MiB, 0);
    memcpy(now, orig, SIZE);
    return r;
}

/* A fresh source of fmt, seeded, and an empty qcow2 target; false
 * (counted as a failure) if either cannot be made. */
static bool coroutine_fn open_pair(const char *fmt, QkBlock **src, QkBlock **dst)
{
    QK_CHECK_EQ(create_img("src.img", fmt), 0);
    QK_CHECK_EQ(create_img("dst.qcow2", "qcow2"), 0);
    *src = open_img("src.img", fmt);
    *dst = open_img("dst.qcow2", "qcow2");
    if (!*src || !*dst) {
        qk_test_failures++;
        return false;
    }
    QK_CHECK_EQ(seed_source(*src), 0);
    return true;
}

static bool coroutine_fn same(QkBlock *bs, const uint8_t *want, const char *what)
{
    uint8_t *buf = malloc(SIZE);
    bool ok = buf && qk_co_pread(bs, 0, SIZE, buf, 0) == 0;
    for (uint64_t off = 0; ok && off < SIZE; off += 512) {
        if (memcmp(buf + off, want + off, 512) != 0) {
            fprintf(stderr, "%s: differs at %llu\n", what, (unsigned long long)off);
            ok = false;
        }
    }
    free(buf);
    return ok;
}

typedef struct Writer {
    QkBlock *bs;
    uint64_t seed;
    uint64_t lo, hi;             /* its own range: concurrent writers never overlap */
    int n;
    int ret;
    bool done;
} Writer;

/* Random writes, zero writes and discards, some unaligned, some spanning
 * chunks; `now` follows them. Reads of the source check it as it goes. */
static void coroutine_fn writer_co(void *opaque)
{
    Writer *w = opaque;
    uint64_t s = w->seed;
    uint8_t *buf = malloc(3 * GRAN);
    for (int i = 0; i < w->n && w->ret == 0; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t len = 512 + (s >> 8) % (3 * GRAN - 512);
        uint64_t off = w->lo + (s >> 30) % (w->hi - w->lo - len);
        int kind = (int)((s >> 20) % 8);
        if (kind == 0) {
            w->ret = qk_co_pwrite_zeroes(w->bs, off, len, 0);
            memset(now + off, 0, len);
        } else {
            memset(buf, 0x80 + (int)(i % 100), len);
            w->ret = qk_co_pwrite(w->bs, off, len, buf, 0);
            memcpy(now + off, buf, len);
        }
        if (i % 8 == 0) {
            qk_co_sleep_ns(200000); /* spread over the copy's whole run */
        }
    }
    free(buf);
    w->done = true;
}

static void coroutine_fn full_case(const char *fmt, uint64_t speed, int writers)
{
    QkBlock *src, *dst;
    if (!open_pair(fmt, &src, &dst)) {
        return;
    }
    QkError err = {0};
    QkBackupOptions o = {.sync = QK_BACKUP_SYNC_FULL, .speed = speed, .granularity = GRAN,
                         .target_is_zero = true};
    QkJob *job = qk_backup_start("b", src, dst, &o, &err);
    QK_CHECK(job != NULL);
    Writer w[4] = {{0}};
    for (int i = 0; i < writers; i++) {
        w[i] = (Writer){.bs = src, .seed = 77 + (uint64_t)i * 1000, .n = 200,
                        .lo = SIZE / (uint64_t)writers * (uint64_t)i,
                        .hi = SIZE / (uint64_t)writers * (uint64_t)(i + 1)};
        qk_coroutine_enter(qk_coroutine_create(writer_co, &w[i]));
    }
    qk_co_job_wait(job);
    for (int i = 0; i < writers; i++) {
        while (!w[i].done) {
            qk_co_sleep_ns(1000000);
        }
        QK_CHECK_EQ(w[i].ret, 0);
    }
    QK_CHECK_EQ(job->state, QK_JOB_COMPLETED);
    QkBackupStats st;
    qk_backup_get_stats(job, &st);
    if (writers && speed) {
        QK_CHECK(st.cbw_copies > 0); /* the writers met chunks before their copy */
    }
    QK_CHECK_EQ(job->bytes_done, (uint64_t)SIZE);
    qk_job_free(job);
    char what[64];
    snprintf(what, sizeof(what), "full %s speed %llu: target", fmt, (unsigned long long)speed);
    QK_CHECK(same(dst, orig, what));
    snprintf(what, sizeof(what), "full %s speed %llu: source", fmt, (unsigned long long)speed);
    QK_CHECK(same(src, now, what));
    qk_co_block_close(src);
    qk_co_block_close(dst);
}

/* sync=bitmap: only the bitmap's chunks reach the target; afterwards the
 * bitmap holds the writes made since the start (on-success), or gets back
 * its old contents when the job is cancelled. */
static void coroutine_fn bitmap_case(bool cancel)
{
    QkBlock *src, *dst;
    if (!open_pair("qcow2", &src, &dst)) {
        return;
    }
    QkError err = {0};
    QkDirtyBitmap *bm = qk_dirty_bitmap_add(src, "b", GRAN, &err);
    QK_CHECK(bm != NULL);
    uint8_t *buf = malloc(2 * MiB);
    memset(buf, 0x11, 2 * MiB);
    QK_CHECK_EQ(qk_co_pwrite(src, 5 * MiB, 2 * MiB, buf, 0), 0);
    QK_CHECK_EQ(qk_co_pwrite(src, 13 * MiB + 100, 1000, buf, 0), 0); /* marks one chunk */
    memcpy(orig + 5 * MiB, buf, 2 * MiB);
    memcpy(orig + 13 * MiB + 100, buf, 1000);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(bm), 2 * MiB + GRAN);
    QkBackupOptions o = {.sync = QK_BACKUP_SYNC_BITMAP, .bitmap = "b", .granularity = GRAN,
                         .target_is_zero = true, .speed = cancel ? 256 * 1024 : 0};
    QkJob *job = qk_backup_start("b", src, dst, &o, &err);
    QK_CHECK(job != NULL);
    QK_CHECK_EQ(bm->busy, 1);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(bm), 0);
    /* A write made after the start: in the bitmap, not in the backup. */
    memset(buf, 0x22, GRAN);
    QK_CHECK_EQ(qk_co_pwrite(src, 5 * MiB, GRAN, buf, 0), 0);
    if (cancel) {
        QK_CHECK_EQ(qk_job_cancel(job, &err), 0);
    }
    qk_co_job_wait(job);
    QK_CHECK_EQ(job->state, cancel ? QK_JOB_CANCELLED : QK_JOB_COMPLETED);
    qk_job_free(job);
    QK_CHECK_EQ(bm->busy, 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(bm), cancel ? 2 * MiB + GRAN : GRAN);
    if (!cancel) {
        /* The target: the bitmap's chunks as they were, zeros elsewhere. */
        uint8_t *want = calloc(1, SIZE);
        memcpy(want + 5 * MiB, orig + 5 * MiB, 2 * MiB);
        memcpy(want + 13 * MiB, orig + 13 * MiB, GRAN);
        QK_CHECK(same(dst, want, "sync=bitmap target"));
        free(want);
    }
    free(buf);
    qk_co_block_close(src);
    qk_co_block_close(dst);
}

/* A target that fails: the job fails naming it, every write succeeds. */
static void coroutine_fn failing_target_case(void)
{
    QkBlock *src, *dst;
    if (!open_pair("raw", &src, &dst)) {
        return;
    }
    QkError err = {0};
    QK_CHECK_EQ(qk_inject_configure("write:nth=5:errno=EIO:mode=sticky:file=dst.qcow2", &err), 0);
    QkBackupOptions o = {.sync = QK_BACKUP_SYNC_FULL, .granularity = GRAN, .target_is_zero = true,
                         .speed = 4 * MiB};
    QkJob *job = qk_backup_start("b", src, dst, &o, &err);
    QK_CHECK(job != NULL);
    Writer w = {.bs = src, .seed = 5, .n = 100, .lo = 0, .hi = SIZE};
    qk_coroutine_enter(qk_coroutine_create(writer_co, &w));
    qk_co_job_wait(job);
    while (!w.done) {
        qk_co_sleep_ns(1000000);
    }
    QK_CHECK_EQ(w.ret, 0);
    QK_CHECK_EQ(job->state, QK_JOB_FAILED);
    QK_CHECK(strstr(job->err.msg, "dst.qcow2") != NULL);
    qk_job_free(job);
    qk_inject_configure(NULL, &err);
    QK_CHECK(same(src, now, "source after a failed backup"));
    qk_co_block_close(src);
    qk_co_block_close(dst);
}

typedef struct ViewRead {
    QkBlock *view;
    uint64_t off, len;
    uint8_t *buf;
    int ret;
    bool done;
} ViewRead;

static void coroutine_fn view_read_co(void *opaque)
{
    ViewRead *v = opaque;
    v->ret = qk_co_pread(v->view, v->off, v->len, v->buf, 0);
    v->done = true;
}

typedef struct GuestWrite {
    QkBlock *bs;
    uint64_t off, len;
    int ret;
    bool done;
} GuestWrite;

static void coroutine_fn guest_write_co(void *opaque)
{
    GuestWrite *g = opaque;
    uint8_t *buf = malloc(g->len);
    memset(buf, 0xee, g->len);
    g->ret = qk_co_pwrite(g->bs, g->off, g->len, buf, 0);
    memcpy(now + g->off, buf, g->len);
    free(buf);
    g->done = true;
}

/* The point-in-time view (sync=none): a read of a chunk not copied yet
 * goes to the source; a write to that chunk arriving while the read is
 * on its way (paused just before the host read) copies the chunk, then
 * waits for the read, so the read still sees the old data. The view
 * fails its reads once the job has ended. */
static void coroutine_fn view_case(void)
{
    QkBlock *src, *dst;
    if (!open_pair("raw", &src, &dst)) {
        return;
    }
    QkError err = {0};
    QkBackupOptions o = {.sync = QK_BACKUP_SYNC_NONE, .granularity = GRAN, .target_is_zero = true};
    QkJob *job = qk_backup_start("v", src, dst, &o, &err);
    QK_CHECK(job != NULL);
    QkBlock *view = qk_backup_snapshot_node(job, "view", &err);
    QK_CHECK(view != NULL);
    uint8_t *buf = malloc(2 * GRAN);
    ViewRead v = {.view = view, .off = 5 * GRAN + 100, .len = GRAN, .buf = buf};
    QK_CHECK_EQ(qk_debug_break(QK_DBG_READ_AIO, "v"), 0);
    qk_coroutine_enter(qk_coroutine_create(view_read_co, &v));
    qk_debug_wait_break("v");
    GuestWrite g = {.bs = src, .off = 5 * GRAN, .len = 2 * GRAN};
    qk_coroutine_enter(qk_coroutine_create(guest_write_co, &g));
    for (int i = 0; i < 50 && !g.done; i++) {
        qk_co_sleep_ns(1000000);
    }
    QK_CHECK(!g.done); /* held until the view's read is done */
    QK_CHECK_EQ(qk_debug_resume("v"), 0);
    while (!v.done || !g.done) {
        qk_co_sleep_ns(1000000);
    }
    QK_CHECK_EQ(v.ret, 0);
    QK_CHECK_EQ(g.ret, 0);
    QK_CHECK(memcmp(buf, orig + v.off, v.len) == 0);
    /* Now from the target: the copy the write made. */
    QK_CHECK_EQ(qk_co_pread(view, 4 * GRAN, 2 * GRAN, buf, 0), 0);
    QK_CHECK(memcmp(buf, orig + 4 * GRAN, 2 * GRAN) == 0);
    QK_CHECK(same(view, orig, "the view after writes"));
    QK_CHECK(same(src, now, "the source under the view"));
    QK_CHECK_EQ(qk_job_complete(job, &err), 0);
    qk_co_job_wait(job);
    QK_CHECK_EQ(job->state, QK_JOB_COMPLETED);
    QK_CHECK_EQ(qk_co_pread(view, 0, GRAN, buf, 0), -EIO);
    qk_co_block_close(view);
    qk_job_free(job);
    free(buf);
    qk_co_block_close(src);
    qk_co_block_close(dst);
}

static void coroutine_fn main_co(void *opaque)
{
    (void)opaque;
    full_case("raw", 0, 0);
    full_case("raw", 8 * MiB, 3);
    full_case("qcow2", 8 * MiB, 3);
    full_case("qcow2", 0, 2);
    bitmap_case(false);
    bitmap_case(true);
    failing_target_case();
    view_case();
}

int main(void)
{
    orig = malloc(SIZE);
    now = malloc(SIZE);
    qk_co_run(main_co, NULL);
    free(orig);
    free(now);
    unlink("src.img");
    unlink("dst.qcow2");
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
