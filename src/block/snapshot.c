/*
 * Block-layer entry points for internal snapshots (see snapshot.h): the
 * format-independent checks, then the driver.
 */
#include "block/snapshot.h"
#include "block/dirty_bitmap.h"

#include <errno.h>
#include <stdlib.h>

/* The node whose driver keeps the snapshots: bs itself, or for a format
 * that keeps none (raw) its protocol child when that does (an RBD image),
 * as QEMU falls back to the file. */
static QkBlock *snap_node(QkBlock *bs)
{
    if (!bs->drv->co_snapshot_create && bs->file && bs->file->drv->co_snapshot_create) {
        return bs->file;
    }
    return bs;
}

bool qk_block_has_snapshots(const QkBlock *bs)
{
    return snap_node((QkBlock *)bs)->drv->co_snapshot_create != NULL;
}

/* -ENOTSUP for a driver that lacks the operation. */
static int unsupported(const QkBlock *bs, QkError *err)
{
    return qk_error_set(err, -ENOTSUP, "The '%s' format does not support internal snapshots",
                        bs->drv->format_name);
}

int coroutine_fn qk_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err)
{
    *list = NULL;
    *n = 0;
    bs = snap_node(bs);
    if (!bs->drv->co_snapshot_list) {
        return unsupported(bs, err);
    }
    return bs->drv->co_snapshot_list(bs, list, n, err);
}

void qk_snapshot_list_free(QkSnapshotInfo *list, int n)
{
    for (int i = 0; list && i < n; i++) {
        free(list[i].id);
        free(list[i].name);
    }
    free(list);
}

int coroutine_fn qk_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err)
{
    bs = snap_node(bs);
    if (!bs->drv->co_snapshot_create) {
        return unsupported(bs, err);
    }
    if (!info->name) {
        return qk_error_set(err, -EINVAL, "a snapshot needs a name");
    }
    return bs->drv->co_snapshot_create(bs, info, err);
}

int coroutine_fn qk_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                     QkError *err)
{
    uint64_t dummy;
    QkBlock *sn = snap_node(bs);
    if (!sn->drv->co_snapshot_goto) {
        return unsupported(bs, err);
    }
    if (!id_or_name) {
        return qk_error_set(err, -EINVAL, "a snapshot to apply needs an ID or a name");
    }
    int r = sn->drv->co_snapshot_goto(sn, id_or_name, vm_state_size ? vm_state_size : &dummy, err);
    if (r == 0 && sn != bs) {
        /* The file may have another size now; the format node shows it. */
        int64_t len = qk_block_length(sn);
        bs->size = len >= 0 ? (uint64_t)len : bs->size;
    }
    if (r == 0) {
        /* The whole disk may read differently now, at its new size too:
         * bitmaps follow the size first, or a grown disk's new part
         * would stay clean. */
        int64_t len = qk_block_length(bs);
        uint64_t size = len >= 0 ? (uint64_t)len : bs->size;
        if (qk_dirty_bitmaps_truncate(bs, size) < 0) {
            return qk_error_set(err, -ENOMEM, "out of memory");
        }
        qk_dirty_bitmaps_mark_all(bs, 0, size);
    }
    return r;
}

int coroutine_fn qk_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    bs = snap_node(bs);
    if (!bs->drv->co_snapshot_delete) {
        return unsupported(bs, err);
    }
    if (!id && !name) {
        return qk_error_set(err, -EINVAL, "a snapshot to delete needs an ID or a name");
    }
    return bs->drv->co_snapshot_delete(bs, id, name, err);
}

int coroutine_fn qk_co_snapshot_load_tmp(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    if (!bs->drv->co_snapshot_load_tmp) {
        return qk_error_set(err, -ENOTSUP,
                            "Block format '%s' used by device '' does not support temporarily loading "
                            "internal snapshots",
                            bs->drv->format_name);
    }
    if (!id && !name) {
        return qk_error_set(err, -EINVAL, "a snapshot to load needs an ID or a name");
    }
    return bs->drv->co_snapshot_load_tmp(bs, id, name, err);
}

int coroutine_fn qk_co_vmstate_discard(QkBlock *bs, QkError *err)
{
    QkBlock *sn = snap_node(bs);
    if (!sn->drv->co_vmstate_discard) {
        /* Snapshots without VM state (RBD's) leave none to drop. */
        return sn->drv->co_snapshot_create ? 0 : unsupported(bs, err);
    }
    if (sn != bs) {
        return sn->drv->co_vmstate_discard(sn, err);
    }
    return bs->drv->co_vmstate_discard(bs, err);
}
