/*
 * Public-to-the-tools part of the qcow2 driver: consistency check and
 * repair, internal snapshots. Everything else is reached through the
 * block layer.
 */
#ifndef QK_QCOW2_QCOW2_H
#define QK_QCOW2_QCOW2_H

#include <stdbool.h>
#include <stdint.h>

#include "block/block.h"

enum {
    QK_CHECK_FIX_LEAKS = 1 << 0,
    QK_CHECK_FIX_ERRORS = 1 << 1,
};

typedef struct QkCheckResult {
    int corruptions;          /* still present after the check */
    int leaks;
    int check_errors;         /* the check itself could not read something */
    int corruptions_fixed;
    int leaks_fixed;
    uint64_t image_end_offset;
    uint64_t total_clusters;       /* clusters of guest data the image can map */
    uint64_t allocated_clusters;
    uint64_t fragmented_clusters;
    uint64_t compressed_clusters;
} QkCheckResult;

/* Receives one line of the check's report (no trailing newline), e.g.
 * "Leaked cluster 5 refcount=1 reference=0" or "ERROR cluster 3 refcount=0 reference=1". */
typedef void QkCheckReport(void *opaque, const char *line);

/* Checks (and with fix flags repairs) a qcow2 node opened read-write when
 * fix != 0. Returns 0 when the check ran (result says what it found), or
 * -errno when it could not complete. */
int coroutine_fn qk_qcow2_co_check(QkBlock *bs, int fix, QkCheckResult *res,
                                   QkCheckReport *report, void *opaque, QkError *err);
bool qk_block_is_qcow2(const QkBlock *bs);

/* One entry of the snapshot table. */
typedef struct QkSnapshotInfo {
    char *id;                  /* create: NULL picks the next free number */
    char *name;
    uint64_t vm_state_size;    /* bytes of VM state saved with it */
    uint32_t date_sec;         /* create: 0 and 0 mean now */
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t disk_size;        /* virtual size when taken (create ignores it) */
    int64_t icount;            /* -1 when not recorded */
} QkSnapshotInfo;

/* The snapshot table; free with qk_snapshot_list_free. */
int coroutine_fn qk_qcow2_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
void qk_snapshot_list_free(QkSnapshotInfo *list, int n);
/* Snapshots the active disk (and the VM state written to the VM-state area,
 * whose length is info->vm_state_size). Names and ids must be unique:
 * -EEXIST otherwise. The node must not have requests in flight that
 * expect the old mapping; new requests wait until it is done. */
int coroutine_fn qk_qcow2_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
/* Makes the snapshot with this id (or else this name) the active disk,
 * including its virtual size and VM state. -ENOENT when there is none. */
int coroutine_fn qk_qcow2_co_snapshot_goto(QkBlock *bs, const char *id_or_name, QkError *err);
/* Deletes the first snapshot matching id (when not NULL) and name (when
 * not NULL), freeing clusters no one else uses. -ENOENT when none. */
int coroutine_fn qk_qcow2_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err);
/* Drops the VM-state area (everything past the virtual disk) from the
 * active mapping: after a snapshot took it, or after a failed save. */
int coroutine_fn qk_qcow2_co_vmstate_discard(QkBlock *bs, QkError *err);

#endif
