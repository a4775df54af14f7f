/*
 * The backup job's state, shared by the job (backup.c) and the read-only
 * node that shows a running job's point in time (backup_snapshot.c).
 */
#ifndef QK_JOBS_BACKUP_INT_H
#define QK_JOBS_BACKUP_INT_H

#include "jobs/backup.h"
#include "aio/task_pool.h"
#include "util/buf_slots.h"
#include "block/dirty_bitmap.h"

/* A read of the point in time that takes chunks from the source: a
 * copy-before-write of those chunks must not let its write go on until
 * the read is done. */
typedef struct SnapRead {
    uint64_t c0, c1;             /* chunks [c0, c1) */
    struct SnapRead *next;
} SnapRead;

typedef struct Backup {
    QkJob job; /* first: the job API hands this pointer around */
    QkBlock *src, *target;
    QkBackupOptions o;
    uint64_t size, gran, nchunks;
    uint64_t *todo, *busy;       /* one bit per chunk */
    QkCoQueue busy_waiters;      /* woken whenever busy chunks finish */
    QkDirtyBitmap *bm;           /* the user's bitmap, or NULL */
    QkDirtyBitmap *saved;        /* bm as it was at the start (disabled) */
    QkWriteHook hook;
    bool hook_installed;
    QkTaskPool *pool;
    QkError err;                 /* first failed copy */
    size_t buf_align;
    QkBufSlots bufs;             /* copy buffers of MAX_OP bytes, IN_FLIGHT of them */
    QkBackupStats st;
    /* The point-in-time view (backup_snapshot.c). */
    bool snapshot_gone;          /* the job is ending: the view reads nothing more */
    SnapRead *snap_reads;
    QkCoQueue snap_waiters;      /* woken whenever a SnapRead ends */
} Backup;

static inline bool qk_backup_chunk_todo(const Backup *b, uint64_t c)
{
    return (b->todo[c / 64] >> (c % 64)) & 1;
}

/* Waits until no read of the view takes chunks of [c0, c1) from the source. */
void coroutine_fn qk_backup_snapshot_wait_reads(Backup *b, uint64_t c0, uint64_t c1);

#endif
