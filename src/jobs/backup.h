/*
 * Push backup job: copies a node's contents as they were when the job
 * started to a target, while writes to the node go on (QEMU's backup job).
 * sync=full copies everything, sync=incremental and sync=bitmap what a
 * dirty bitmap recorded; the bitmap then records the writes made since the
 * job started, and gets back what it lost when the job fails or is
 * cancelled (bitmap-mode on-success; never keeps it as it was; always
 * clears what was copied even when the job fails).
 */
#ifndef QK_JOBS_BACKUP_H
#define QK_JOBS_BACKUP_H

#include "block/block.h"
#include "jobs/job.h"

typedef enum QkBackupSync {
    QK_BACKUP_SYNC_FULL,
    QK_BACKUP_SYNC_INCREMENTAL, /* bitmap, and bitmap-mode on-success only */
    QK_BACKUP_SYNC_BITMAP,
    QK_BACKUP_SYNC_NONE,        /* no background copy: only copy-before-write,
                                   until completed or cancelled (fleecing) */
} QkBackupSync;

typedef enum QkBackupBitmapMode {
    QK_BACKUP_BITMAP_ON_SUCCESS,
    QK_BACKUP_BITMAP_NEVER,
    QK_BACKUP_BITMAP_ALWAYS,
} QkBackupBitmapMode;

typedef struct QkBackupOptions {
    QkBackupSync sync;
    const char *bitmap;          /* a dirty bitmap of the source; NULL for none */
    QkBackupBitmapMode bitmap_mode;
    uint64_t speed;              /* bytes/s of the background copy; 0 unlimited */
    uint64_t granularity;        /* copy unit; 0: the target's cluster size, 64 KiB at least */
    bool target_is_zero;         /* reads as zeros (new, no backing): zeros need no write */
} QkBackupOptions;

int qk_backup_sync_parse(const char *s, QkBackupSync *out);
int qk_backup_bitmap_mode_parse(const char *s, QkBackupBitmapMode *out);

/* Starts the job. Holds the source's new writes while it waits for those
 * in flight, so the copy is of one point in time; may yield. */
QkJob *coroutine_fn qk_backup_start(const char *id, QkBlock *source, QkBlock *target,
                                    const QkBackupOptions *opts, QkError *err);
bool qk_job_is_backup(const QkJob *job);

/* A read-only node showing the source as it was when the job started:
 * chunks not copied yet are read from the source (their copy-before-write
 * waits for such reads), copied ones from the target. The bitmap handed to
 * the job, as it was at the start, is on it under the same name (for the
 * NBD context). Reads fail once the job ends. The node must be closed
 * before the job is freed. */
QkBlock *coroutine_fn qk_backup_snapshot_node(QkJob *job, const char *name, QkError *err);

typedef struct QkBackupStats {
    uint64_t granularity;
    uint64_t cbw_copies;         /* chunks copied ahead of a write to them */
    uint64_t cbw_wait_ns;        /* time writes spent waiting for those copies */
} QkBackupStats;
void qk_backup_get_stats(const QkJob *job, QkBackupStats *st);

#endif
