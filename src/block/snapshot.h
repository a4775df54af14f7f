/*
 * Internal snapshots through the block layer: each call goes to the node's
 * driver (QkBlockDriver's co_snapshot_* and co_vmstate_discard); a format
 * without internal snapshots fails with -ENOTSUP and says so. Callers (the
 * public VM-state API, the snapshot command) never name a format.
 */
#ifndef QK_BLOCK_SNAPSHOT_H
#define QK_BLOCK_SNAPSHOT_H

#include <stdint.h>

#include "block/block.h"

/* One entry of a node's snapshot table. */
struct QkSnapshotInfo {
    char *id;                  /* create: NULL picks the next free number */
    char *name;
    uint64_t vm_state_size;    /* bytes of VM state saved with it */
    uint32_t date_sec;         /* create: 0 and 0 mean now */
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t disk_size;        /* virtual size when taken (create ignores it) */
    int64_t icount;            /* -1 when not recorded */
};

/* True when the node's format stores internal snapshots. */
bool qk_block_has_snapshots(const QkBlock *bs);
/* The snapshot table; free with qk_snapshot_list_free. */
int coroutine_fn qk_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
void qk_snapshot_list_free(QkSnapshotInfo *list, int n);
/* Snapshots the active disk and the VM state written to the node
 * (info->vm_state_size bytes of it). Ids must be unique (-EEXIST); names
 * may repeat, as in qemu-img. */
int coroutine_fn qk_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
/* Makes the snapshot whose id is id_or_name, else the first one so named,
 * the active disk with its virtual size and VM state; *vm_state_size (when
 * not NULL) gets the length of that state. -ENOENT when there is none. */
int coroutine_fn qk_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                     QkError *err);
/* Deletes the first snapshot matching id (when not NULL) and name (when
 * not NULL). -ENOENT when none. (qemu-img snapshot -d passes the name
 * only: it never deletes by id.) */
int coroutine_fn qk_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err);
/* Read-only nodes: reads see the snapshot matching id (when not NULL) and
 * name (when not NULL) until the node is closed; nothing is written and
 * the virtual size is unchanged. -ENOENT when none matches. */
int coroutine_fn qk_co_snapshot_load_tmp(QkBlock *bs, const char *id, const char *name, QkError *err);
/* Drops the VM state held by the active disk (left by a snapshot that
 * took it, an applied snapshot, or a failed save). */
int coroutine_fn qk_co_vmstate_discard(QkBlock *bs, QkError *err);

#endif
