/*
 * Block-layer entry points for internal snapshots (see snapshot.h): the
 * format-independent checks, then the driver.
 */
#include "block/snapshot.h"
#include "block/dirty_bitmap.h"

#include <errno.h>
#include <stdlib.h>

bool qk_block_has_snapshots(const QkBlock *bs)
{
    return bs->drv->co_snapshot_create != NULL;
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
    if (!bs->drv->co_snapshot_goto) {
        return unsupported(bs, err);
    }
    int r = bs->drv->co_snapshot_goto(bs, id_or_name, vm_state_size ? vm_state_size : &dummy, err);
    if (r == 0) {
        /* The whole disk may read differently now. */
        qk_dirty_bitmaps_mark_all(bs, 0, bs->size);
    }
    return r;
}

int coroutine_fn qk_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    if (!bs->drv->co_snapshot_delete) {
        return unsupported(bs, err);
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
    return bs->drv->co_snapshot_load_tmp(bs, id, name, err);
}

int coroutine_fn qk_co_vmstate_discard(QkBlock *bs, QkError *err)
{
    if (!bs->drv->co_vmstate_discard) {
        return unsupported(bs, err);
    }
    return bs->drv->co_vmstate_discard(bs, err);
}
