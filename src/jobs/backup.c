/*
 * Push backup job (see backup.h). The image is cut into chunks; `todo`
 * holds the chunks still to copy as they were at the start, `busy` those
 * being copied right now. A background pass copies todo chunks in order;
 * a write, zero write or discard to a todo chunk first copies the chunk's
 * old contents itself (copy-before-write, a write hook that runs before
 * the request reaches the driver), so the target ends up with the image of
 * the moment the job started whatever the guest writes meanwhile.
 *
 * A chunk leaves todo only once its copy is on the target; a copy that
 * fails leaves it there and fails the job. A failed copy-before-write
 * fails the job, not the guest's write: the guest's data comes first, a
 * backup that cannot be trusted is reported as failed.
 *
 * Owns: the chunk sets, the copies, the bitmap hand-over at start and end.
 * Must not know where the target came from (the daemon opens it).
 */
#include "jobs/backup_int.h"
#include "aio/loop.h"
#include "common/checked.h"
#include "util/names.h"

#include <stdlib.h>
#include <string.h>

#define GRAN_DEFAULT 65536u
#define GRAN_MIN 4096u
#define GRAN_MAX (64ULL << 20)
/* The background pass's requests: up to this many bytes of consecutive
 * chunks, this many at once. */
#define MAX_OP (1ULL << 20)
#define IN_FLIGHT 4
#define NONE UINT64_MAX


static const QkJobDriver backup_driver;

int qk_backup_sync_parse(const char *s, QkBackupSync *out)
{
    static const char *const names[] = {"full", "incremental", "bitmap", "none"};
    int i = qk_name_index(names, sizeof(names) / sizeof(names[0]), s);
    if (i >= 0) {
        *out = (QkBackupSync)i;
    }
    return i < 0 ? i : 0;
}

int qk_backup_bitmap_mode_parse(const char *s, QkBackupBitmapMode *out)
{
    static const char *const names[] = {"on-success", "never", "always"};
    int i = qk_name_index(names, sizeof(names) / sizeof(names[0]), s);
    if (i >= 0) {
        *out = (QkBackupBitmapMode)i;
    }
    return i < 0 ? i : 0;
}

bool qk_job_is_backup(const QkJob *job)
{
    return job->drv == &backup_driver;
}

void qk_backup_get_stats(const QkJob *job, QkBackupStats *st)
{
    *st = ((const Backup *)job)->st;
}

/* ---- chunk sets ---- */

static bool bit_get(const uint64_t *set, uint64_t c)
{
    return (set[c / 64] >> (c % 64)) & 1;
}

static void bit_set(uint64_t *set, uint64_t c, bool on)
{
    if (on) {
        set[c / 64] |= 1ULL << (c % 64);
    } else {
        set[c / 64] &= ~(1ULL << (c % 64));
    }
}

/* First chunk at or after c that is to be copied and nobody copies now. */
static uint64_t next_free_todo(const Backup *b, uint64_t c)
{
    while (c < b->nchunks) {
        uint64_t w = b->todo[c / 64] & ~b->busy[c / 64] & (~0ULL << (c % 64));
        if (w) {
            uint64_t r = (c & ~63ULL) + (uint64_t)__builtin_ctzll(w);
            return r < b->nchunks ? r : NONE;
        }
        c = (c & ~63ULL) + 64;
    }
    return NONE;
}

static bool any_set(const uint64_t *set, uint64_t nchunks)
{
    for (uint64_t i = 0; i < (nchunks + 63) / 64; i++) {
        if (set[i]) {
            return true;
        }
    }
    return false;
}

static uint64_t chunk_bytes(const Backup *b, uint64_t c0, uint64_t n)
{
    return QK_MIN((c0 + n) * b->gran, b->size) - c0 * b->gran;
}

/* ---- copying ---- */

/* Copies [off, off + bytes) of the source as it reads now. */
static int coroutine_fn copy_range(Backup *b, uint64_t off, uint64_t bytes, QkError *err)
{
    void *buf = NULL;
    uint64_t end = off + bytes;
    int r = 0;
    while (off < end && r == 0) {
        uint64_t pnum = 0;
        int st = qk_co_block_status_above(b->src, off, end - off, &pnum, NULL);
        if (st < 0) {
            r = qk_error_set_errno(err, st, "Could not get the block status of the source");
            break;
        }
        if (pnum == 0) {
            pnum = end - off;
        }
        if (st & QK_BS_ZERO) {
            if (!b->o.target_is_zero) {
                r = qk_co_pwrite_zeroes(b->target, off, pnum, QK_REQ_MAY_UNMAP);
                if (r < 0) {
                    qk_error_set_errno(err, r, "Could not write to target '%s'", b->target->filename);
                }
            }
        } else {
            pnum = QK_MIN(pnum, MAX_OP);
            if (!buf) {
                buf = qk_buf_slots_get(&b->bufs);
                if (!buf) {
                    r = qk_error_set(err, -ENOMEM, "out of memory");
                    break;
                }
            }
            r = qk_co_pread(b->src, off, pnum, buf, 0);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not read from the source '%s'", b->src->filename);
                break;
            }
            r = qk_co_pwrite(b->target, off, pnum, buf, 0);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not write to target '%s'", b->target->filename);
            }
        }
        off += pnum;
    }
    qk_buf_slots_put(&b->bufs, buf);
    return r;
}

/* Copies chunks [c0, c0 + n), which the caller marked busy, and ends
 * their busy state: copied ones leave todo, failed ones stay and fail
 * the job. */
static int coroutine_fn copy_chunks(Backup *b, uint64_t c0, uint64_t n)
{
    QkError e = {0};
    uint64_t bytes = chunk_bytes(b, c0, n);
    int r = copy_range(b, c0 * b->gran, bytes, &e);
    for (uint64_t c = c0; c < c0 + n; c++) {
        bit_set(b->busy, c, false);
        if (r == 0) {
            bit_set(b->todo, c, false);
        }
    }
    if (r == 0) {
        b->job.bytes_done += bytes;
    } else if (!b->err.code) {
        b->err = e;
    }
    qk_co_queue_wake_all(&b->busy_waiters);
    return r;
}

typedef struct CopyTask {
    Backup *b;
    uint64_t c0, n;
} CopyTask;

static int coroutine_fn copy_task(void *opaque)
{
    CopyTask *t = opaque;
    Backup *b = t->b;
    uint64_t c0 = t->c0, n = t->n;
    free(t);
    return copy_chunks(b, c0, n);
}

/* The write hook: the chunks a modification touches that still hold
 * data of the backup's moment are copied before it goes on. */
static void coroutine_fn hook_cbw(QkWriteHook *h, QkBlock *bs, QkWriteKind kind, uint64_t off,
                                  uint64_t bytes)
{
    (void)bs;
    (void)kind;
    Backup *b = h->opaque;
    if (bytes == 0 || off >= b->size) {
        return;
    }
    uint64_t c0 = off / b->gran;
    uint64_t c1 = QK_MIN((qk_align_up(off + bytes, b->gran) / b->gran), b->nchunks);
    int64_t t0 = 0;
    for (;;) {
        if (b->err.code) {
            /* The job has failed: do not hold the guest up, beyond reads
             * of the view still taking these chunks from the source. */
            qk_backup_snapshot_wait_reads(b, c0, c1);
            return;
        }
        uint64_t c = c0;
        while (c < c1 && !bit_get(b->busy, c)) {
            c++;
        }
        if (c == c1) {
            break;
        }
        /* Someone is copying a chunk of ours: its old contents are on the
         * way to the target, but not yet out of the source. */
        if (!t0) {
            t0 = qk_clock_ns();
        }
        qk_co_queue_wait(&b->busy_waiters);
    }
    /* Claimed all at once (no yield in between), so the background pass
     * cannot take a chunk of ours while we copy an earlier run. */
    bool any = false;
    for (uint64_t c = c0; c < c1; c++) {
        if (bit_get(b->todo, c)) {
            bit_set(b->busy, c, true);
            any = true;
        }
    }
    if (any && !t0) {
        t0 = qk_clock_ns();
    }
    for (uint64_t c = c0; any && c < c1;) {
        if (!bit_get(b->todo, c) || !bit_get(b->busy, c)) {
            c++;
            continue;
        }
        uint64_t e = c + 1;
        while (e < c1 && bit_get(b->todo, e) && bit_get(b->busy, e)) {
            e++;
        }
        b->st.cbw_copies += e - c;
        copy_chunks(b, c, e - c); /* a failure fails the job (b->err) */
        c = e;
    }
    /* A read of the view that took these chunks from the source before
     * they were copied (by us or by another write) must end before the
     * source changes under it. */
    qk_backup_snapshot_wait_reads(b, c0, c1);
    if (t0) {
        b->st.cbw_wait_ns += (uint64_t)(qk_clock_ns() - t0);
    }
}

/* ---- bitmap hand-over ---- */

/* Gives the user's bitmap back what this job took from it and did not
 * deliver: everything (never, or a failed on-success job), or the chunks
 * not copied (always). */
static void bitmap_end(Backup *b, bool ok)
{
    QkError e = {0};
    if (b->bm) {
        if (b->o.bitmap_mode == QK_BACKUP_BITMAP_NEVER ||
            (!ok && b->o.bitmap_mode == QK_BACKUP_BITMAP_ON_SUCCESS)) {
            qk_dirty_bitmap_merge(b->bm, b->saved, &e); /* same size: cannot fail */
        } else if (!ok) {
            for (uint64_t c = 0; c < b->nchunks; c++) {
                if (bit_get(b->todo, c)) {
                    qk_dirty_bitmap_mark(b->bm, c * b->gran, chunk_bytes(b, c, 1));
                }
            }
        }
        b->bm->busy--;
        b->bm = NULL;
    }
    if (b->saved) {
        qk_dirty_bitmap_remove(b->src, b->saved, &e);
        b->saved = NULL;
    }
}

/* ---- the job ---- */

/* sync=none: only writes copy, until the job is completed or cancelled. */
static bool coroutine_fn wait_for_end(Backup *b)
{
    qk_job_set_ready(&b->job);
    while (!b->job.cancel_requested && !b->job.complete_requested && !b->err.code) {
        qk_co_job_sleep_ns(&b->job, 1000000000LL);
    }
    return b->job.cancel_requested;
}

static int coroutine_fn backup_run(QkJob *job, QkError *err)
{
    Backup *b = (Backup *)job;
    uint64_t c = 0;
    bool cancelled = false;
    for (;;) {
        if (b->o.sync == QK_BACKUP_SYNC_NONE) {
            cancelled = wait_for_end(b);
            break;
        }
        if (qk_co_job_pause_point(job)) {
            cancelled = true;
            break;
        }
        if (b->err.code || qk_task_pool_status(b->pool) < 0) {
            break;
        }
        c = next_free_todo(b, c);
        if (c == NONE) {
            if (!any_set(b->todo, b->nchunks)) {
                break;
            }
            /* Chunks passed over while a write was copying them may be
             * back (a failed copy leaves them to do): look from the start
             * before waiting. */
            c = next_free_todo(b, 0);
            if (c == NONE) {
                /* What is left is being copied ahead of writes (or by our
                 * own tasks): wait for those, then look again. */
                qk_co_queue_wait(&b->busy_waiters);
                c = 0;
                continue;
            }
        }
        /* Chunks are claimed only once a task can start on them: a write
         * to a claimed chunk waits for its copy, never for a free slot. */
        qk_task_pool_wait_slot(b->pool);
        c = next_free_todo(b, c);
        if (c == NONE) {
            c = 0;
            continue;
        }
        uint64_t n = 1, max = QK_MAX(MAX_OP / b->gran, 1);
        while (n < max && c + n < b->nchunks && bit_get(b->todo, c + n) && !bit_get(b->busy, c + n)) {
            n++;
        }
        CopyTask *t = malloc(sizeof(*t));
        if (!t) {
            qk_error_set(&b->err, -ENOMEM, "out of memory");
            break;
        }
        *t = (CopyTask){b, c, n};
        for (uint64_t k = c; k < c + n; k++) {
            bit_set(b->busy, k, true);
        }
        qk_task_pool_start(b->pool, copy_task, t);
        qk_co_job_throttle(job, chunk_bytes(b, c, n));
        c += n;
    }
    qk_task_pool_wait_all(b->pool);
    int r = 0;
    if (b->err.code) {
        *err = b->err;
        r = err->code;
    } else if (cancelled) {
        r = qk_error_set(err, -ECANCELED, "Backup job cancelled");
    } else {
        b->job.committed = true; /* the bitmap is about to be consumed */
        r = qk_co_flush(b->target);
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not flush target '%s'", b->target->filename);
        }
    }
    /* The view ends first: once the hook is gone, the source may change
     * under a read of it. */
    b->snapshot_gone = true;
    while (b->snap_reads) {
        qk_co_queue_wait(&b->snap_waiters);
    }
    /* No write may be in a copy-before-write when the hook goes. */
    qk_co_block_quiesce_begin(b->src);
    qk_block_remove_write_hook(b->src, &b->hook);
    b->hook_installed = false;
    bitmap_end(b, r == 0);
    qk_block_quiesce_end(b->src);
    qk_buf_slots_release(&b->bufs); /* a job never dismissed keeps no buffers */
    return r;
}

static void backup_free(QkJob *job)
{
    Backup *b = (Backup *)job;
    if (b->hook_installed) {
        qk_block_remove_write_hook(b->src, &b->hook); /* the job never ran */
    }
    bitmap_end(b, false);
    qk_task_pool_free(b->pool);
    qk_buf_slots_destroy(&b->bufs);
    free(b->todo);
    free(b->busy);
    free(b);
}

static const QkJobDriver backup_driver = {
    .type = "backup",
    .run = backup_run,
    .free = backup_free,
};

static uint64_t default_granularity(QkBlock *target)
{
    QkImageInfo info;
    qk_block_get_info(target, &info);
    uint64_t g = QK_MAX((uint64_t)info.cluster_size, (uint64_t)GRAN_DEFAULT);
    return qk_is_pow2(g) && g <= GRAN_MAX ? g : GRAN_DEFAULT;
}

/* Fills todo: every chunk (full), or those the bitmap has any bit of. */
static void fill_todo(Backup *b)
{
    if (b->o.sync == QK_BACKUP_SYNC_FULL || b->o.sync == QK_BACKUP_SYNC_NONE) {
        for (uint64_t c = 0; c < b->nchunks; c++) {
            bit_set(b->todo, c, true);
        }
        return;
    }
    for (uint64_t off = qk_dirty_bitmap_next_dirty(b->saved, 0); off < b->size;) {
        uint64_t end = qk_dirty_bitmap_next_clean(b->saved, off);
        end = end == UINT64_MAX ? b->size : QK_MIN(end, b->size);
        for (uint64_t c = off / b->gran; c < (qk_align_up(end, b->gran) / b->gran); c++) {
            bit_set(b->todo, c, true);
        }
        off = end < b->size ? qk_dirty_bitmap_next_dirty(b->saved, end) : UINT64_MAX;
    }
}

/* Gives back the pin qk_backup_start takes on a bitmap it then fails
 * to use; NULL, for the failing return. */
static QkJob *unpin(QkDirtyBitmap *bm)
{
    if (bm) {
        bm->busy--;
    }
    return NULL;
}

QkJob *coroutine_fn qk_backup_start(const char *id, QkBlock *source, QkBlock *target,
                                    const QkBackupOptions *opts, QkError *err)
{
    QkBackupOptions o = *opts;
    int64_t slen = qk_block_length(source), tlen = qk_block_length(target);
    if (slen < 0 || tlen < 0) {
        qk_error_set_errno(err, slen < 0 ? (int)slen : (int)tlen, "Cannot get the image size");
        return NULL;
    }
    if (tlen != slen) {
        /* As QEMU: a larger target would keep a tail the source does not
         * have, and show it once users move to it. */
        qk_error_set(err, -EINVAL, "Source and target image have different sizes (%lld and %lld bytes)",
                     (long long)slen, (long long)tlen);
        return NULL;
    }
    if (target->read_only) {
        qk_error_set(err, -EACCES, "Target '%s' is read-only", target->filename);
        return NULL;
    }
    if ((o.sync == QK_BACKUP_SYNC_INCREMENTAL || o.sync == QK_BACKUP_SYNC_BITMAP) && !o.bitmap) {
        qk_error_set(err, -EINVAL, "must provide a valid bitmap name for '%s' sync mode",
                     o.sync == QK_BACKUP_SYNC_INCREMENTAL ? "incremental" : "bitmap");
        return NULL;
    }
    if (o.sync == QK_BACKUP_SYNC_INCREMENTAL && o.bitmap_mode != QK_BACKUP_BITMAP_ON_SUCCESS) {
        qk_error_set(err, -EINVAL, "Bitmap sync mode must be 'on-success' when using sync mode 'incremental'");
        return NULL;
    }
    QkDirtyBitmap *bm = NULL;
    if (o.bitmap) {
        bm = qk_dirty_bitmap_find(source, o.bitmap);
        if (!bm) {
            qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", o.bitmap);
            return NULL;
        }
        /* Checks it can be used, and has a stored copy marked in use
         * before it starts to differ. */
        if (qk_co_dirty_bitmap_begin_change(source, bm, err) < 0) {
            return NULL;
        }
        /* The job's from here: the waits below (quiescing the source)
         * must not let another caller remove or change it. */
        bm->busy++;
    }
    if (!o.granularity) {
        o.granularity = default_granularity(target);
    }
    if (o.granularity < GRAN_MIN || o.granularity > GRAN_MAX || !qk_is_pow2(o.granularity)) {
        qk_error_set(err, -EINVAL, "Granularity must be a power of two between 4 KiB and 64 MiB");
        return unpin(bm);
    }
    Backup *b = calloc(1, sizeof(*b));
    if (!b) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return unpin(bm);
    }
    b->src = source;
    b->target = target;
    b->o = o;
    b->o.bitmap = NULL; /* the caller's string; bm is what we keep */
    b->size = (uint64_t)slen;
    b->gran = o.granularity;
    b->st.granularity = o.granularity;
    b->nchunks = (qk_align_up(b->size, b->gran) / b->gran);
    size_t words = (size_t)((b->nchunks + 63) / 64 + 1);
    b->todo = calloc(words, sizeof(uint64_t));
    b->busy = calloc(words, sizeof(uint64_t));
    b->pool = qk_task_pool_new(IN_FLIGHT);
    b->buf_align = QK_MAX(qk_block_buf_align(source), qk_block_buf_align(target));
    qk_co_queue_init(&b->busy_waiters);
    qk_co_queue_init(&b->snap_waiters);
    int br = qk_buf_slots_init(&b->bufs, b->buf_align, MAX_OP, IN_FLIGHT);
    if (!b->todo || !b->busy || !b->pool || br < 0) {
        free(b->todo);
        free(b->busy);
        qk_task_pool_free(b->pool);
        qk_buf_slots_destroy(&b->bufs);
        free(b);
        qk_error_set(err, -ENOMEM, "out of memory");
        return unpin(bm);
    }
    if (qk_job_init(&b->job, &backup_driver, id, err) < 0) {
        free(b->todo);
        free(b->busy);
        qk_task_pool_free(b->pool);
        qk_buf_slots_destroy(&b->bufs);
        free(b);
        return unpin(bm);
    }
    /* The moment of the backup: writes already in flight land first (and
     * mark the bitmap), later ones wait for the hook. */
    qk_co_block_quiesce_begin(source);
    if (bm) {
        b->saved = qk_dirty_bitmap_add(source, NULL, bm->granularity, err);
        if (!b->saved || qk_dirty_bitmap_merge(b->saved, bm, err) < 0) {
            qk_block_quiesce_end(source);
            qk_job_free(&b->job);
            return unpin(bm);
        }
        qk_dirty_bitmap_set_enabled(b->saved, false);
        b->bm = bm; /* its pin is released when the job ends */
        if (o.bitmap_mode != QK_BACKUP_BITMAP_NEVER) {
            /* From now on bm records what the next increment needs. */
            qk_dirty_bitmap_clear(bm);
        }
    }
    fill_todo(b);
    for (uint64_t c = 0; c < b->nchunks; c++) {
        if (bit_get(b->todo, c)) {
            b->job.bytes_total += chunk_bytes(b, c, 1);
        }
    }
    b->hook.copy_before_write = hook_cbw;
    b->hook.opaque = b;
    qk_block_add_write_hook(source, &b->hook);
    b->hook_installed = true;
    qk_block_quiesce_end(source);
    qk_job_set_speed(&b->job, o.speed);
    qk_job_start(&b->job);
    return &b->job;
}
