/*
 * The point in time of a running backup job as a read-only node (the pull
 * model, "fleecing"): a backup client reads it over NBD while the guest
 * keeps writing the source. Chunks the job has not copied yet still hold
 * their old contents on the source, so they are read there; a read of
 * them is registered (SnapRead) and a copy-before-write of those chunks
 * waits for it before letting its write reach the source. Copied chunks
 * are read from the target, where they no longer change.
 *
 * Owns: the view's driver and the register of its reads. Must not copy
 * anything itself (backup.c does).
 */
#include "jobs/backup_int.h"
#include "common/checked.h"

#include <stdlib.h>

typedef struct SnapState {
    Backup *b;
} SnapState;

static Backup *backup_of(QkBlock *bs)
{
    return ((SnapState *)bs->opaque)->b;
}

void coroutine_fn qk_backup_snapshot_wait_reads(Backup *b, uint64_t c0, uint64_t c1)
{
    for (;;) {
        SnapRead *r = b->snap_reads;
        while (r && (r->c1 <= c0 || c1 <= r->c0)) {
            r = r->next;
        }
        if (!r) {
            return;
        }
        qk_co_queue_wait(&b->snap_waiters);
    }
}

static void snap_read_end(Backup *b, SnapRead *r)
{
    for (SnapRead **pp = &b->snap_reads; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    qk_co_queue_wake_all(&b->snap_waiters);
}

/* The run of chunks from pos on (up to end) that are all read from the
 * same node; *from_source says which. */
static uint64_t same_source_run(const Backup *b, uint64_t pos, uint64_t end, bool *from_source)
{
    uint64_t c = pos / b->gran;
    *from_source = qk_backup_chunk_todo(b, c);
    uint64_t stop = QK_MIN(end, b->size);
    uint64_t next = (c + 1) * b->gran;
    while (next < stop && qk_backup_chunk_todo(b, next / b->gran) == *from_source) {
        next += b->gran;
    }
    return QK_MIN(next, stop) - pos;
}

static int gone(Backup *b)
{
    return b->snapshot_gone || b->err.code ? -EIO : 0;
}

static int coroutine_fn snap_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                    int flags)
{
    (void)flags;
    Backup *b = backup_of(bs);
    uint64_t pos = off, end = off + bytes;
    while (pos < end) {
        int r = gone(b);
        if (r < 0) {
            return r;
        }
        bool from_source;
        uint64_t n = same_source_run(b, pos, end, &from_source);
        if (from_source) {
            /* Registered before the read yields: from here on a write to
             * these chunks waits for us after its copy. */
            SnapRead sr = {pos / b->gran, (pos + n + b->gran - 1) / b->gran, b->snap_reads};
            b->snap_reads = &sr;
            r = qk_co_preadv(b->src, pos, n, qiov, qoff + (pos - off), 0);
            snap_read_end(b, &sr);
        } else {
            r = qk_co_preadv(b->target, pos, n, qiov, qoff + (pos - off), 0);
        }
        if (r < 0) {
            return r;
        }
        pos += n;
    }
    return 0;
}

static int coroutine_fn snap_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                          uint64_t *map, QkBlock **file)
{
    Backup *b = backup_of(bs);
    (void)map;
    if (file) {
        *file = NULL;
    }
    int r = gone(b);
    if (r < 0) {
        return r;
    }
    if (off >= b->size) {
        *pnum = 0;
        return QK_BS_EOF;
    }
    bool from_source;
    uint64_t n = same_source_run(b, off, off + bytes, &from_source);
    if (from_source) {
        SnapRead sr = {off / b->gran, (off + n + b->gran - 1) / b->gran, b->snap_reads};
        b->snap_reads = &sr;
        r = qk_co_block_status_above(b->src, off, n, pnum, NULL);
        snap_read_end(b, &sr);
    } else {
        r = qk_co_block_status_above(b->target, off, n, pnum, NULL);
    }
    if (r < 0) {
        return r;
    }
    /* What the data is, not where: this node has no file of its own. */
    return r & (QK_BS_DATA | QK_BS_ZERO | QK_BS_ALLOCATED);
}

static int64_t snap_get_length(QkBlock *bs)
{
    return (int64_t)backup_of(bs)->size;
}

static void snap_get_info(QkBlock *bs, QkImageInfo *info)
{
    info->format = "snapshot-access";
    info->virtual_size = backup_of(bs)->size;
}

static const QkBlockDriver snapshot_driver = {
    .format_name = "snapshot-access",
    .instance_size = sizeof(SnapState),
    .co_preadv = snap_preadv,
    .co_block_status = snap_block_status,
    .get_length = snap_get_length,
    .get_info = snap_get_info,
};

QkBlock *coroutine_fn qk_backup_snapshot_node(QkJob *job, const char *name, QkError *err)
{
    if (!qk_job_is_backup(job)) {
        qk_error_set(err, -EINVAL, "Job '%s' is not a backup job", job->id);
        return NULL;
    }
    Backup *b = (Backup *)job;
    QkBlock *bs = qk_block_new_node(&snapshot_driver, name, true);
    if (!bs) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    ((SnapState *)bs->opaque)->b = b;
    bs->size = b->size;
    bs->mem_alignment = b->buf_align;
    if (b->saved && b->bm) {
        /* The bitmap as it was at the start: what changed since the
         * previous backup, as of this backup's moment. */
        QkDirtyBitmap *copy = qk_dirty_bitmap_add(bs, b->bm->name, b->saved->granularity, err);
        if (!copy || qk_dirty_bitmap_merge(copy, b->saved, err) < 0) {
            qk_co_block_close(bs);
            return NULL;
        }
        qk_dirty_bitmap_set_enabled(copy, false);
    }
    return bs;
}
