/*
 * RBD's own snapshots behind the snapshot calls (a raw node over an RBD
 * image hands them here, see block/snapshot.c): list, create, roll back
 * and remove, each a blocking librbd call on the work pool. They hold no
 * VM state. As qemu-img shows them, a snapshot's id is its name.
 */
#include "block/rbd_int.h"
#include "block/snapshot.h"
#include "aio/work_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct Snap {
    rbd_image_t image;
    enum { SNAP_LIST, SNAP_CREATE, SNAP_ROLLBACK, SNAP_REMOVE } op;
    const char *name;
    QkSnapshotInfo *list;
    int n;
    uint64_t size;    /* after a rollback */
    int r;
} Snap;

static void snap_list(Snap *sn)
{
    int max = 16;
    rbd_snap_info_t *v = NULL;
    for (;;) {
        free(v);
        v = calloc((size_t)max, sizeof(*v));
        if (!v) {
            sn->r = -ENOMEM;
            return;
        }
        sn->r = RBD(rbd_snap_list)(sn->image, v, &max);
        if (sn->r != -ERANGE) {
            break;
        }
    }
    if (sn->r < 0) {
        free(v);
        return;
    }
    int n = sn->r;
    sn->r = 0;
    sn->list = calloc((size_t)(n ? n : 1), sizeof(*sn->list));
    for (int i = 0; sn->list && i < n; i++) {
        /* As qemu-img lists them: the name is the id too, the VM state
         * column shows the image's size then, and no date. */
        sn->list[i] = (QkSnapshotInfo){.id = strdup(v[i].name), .name = strdup(v[i].name),
                                       .vm_state_size = v[i].size, .disk_size = v[i].size};
        if (!sn->list[i].id || !sn->list[i].name) {
            sn->r = -ENOMEM;
        }
        sn->n = i + 1;
    }
    if (!sn->list) {
        sn->r = -ENOMEM;
    }
    RBD(rbd_snap_list_end)(v);
    free(v);
}

static void snap_work(void *opaque)
{
    Snap *sn = opaque;
    switch (sn->op) {
    case SNAP_LIST:
        snap_list(sn);
        break;
    case SNAP_CREATE:
        sn->r = RBD(rbd_snap_create)(sn->image, sn->name);
        break;
    case SNAP_ROLLBACK:
        sn->r = RBD(rbd_snap_rollback)(sn->image, sn->name);
        if (sn->r == 0) {
            sn->r = RBD(rbd_get_size)(sn->image, &sn->size);
        }
        break;
    case SNAP_REMOVE:
        sn->r = RBD(rbd_snap_remove)(sn->image, sn->name);
        break;
    }
}

int coroutine_fn qk_rbd_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err)
{
    Snap sn = {.image = ((RbdState *)bs->opaque)->image, .op = SNAP_LIST};
    qk_co_run_in_thread(snap_work, &sn);
    if (sn.r < 0) {
        qk_snapshot_list_free(sn.list, sn.n);
        return qk_error_set(err, sn.r, "error listing snapshots of %s: %s", bs->filename, strerror(-sn.r));
    }
    *list = sn.list;
    *n = sn.n;
    return 0;
}

/* -ENOENT with qemu-img's message unless the image has a snapshot so
 * named (an RBD snapshot's id is its name). */
static int coroutine_fn find_snap(QkBlock *bs, const char *name, QkError *err)
{
    QkSnapshotInfo *l;
    int n;
    int r = qk_rbd_co_snapshot_list(bs, &l, &n, err);
    if (r < 0) {
        return r;
    }
    r = -ENOENT;
    for (int i = 0; i < n && r < 0; i++) {
        r = strcmp(l[i].name, name) == 0 ? 0 : -ENOENT;
    }
    qk_snapshot_list_free(l, n);
    return r < 0 ? qk_error_set(err, r, "Can't find snapshot '%s'", name) : 0;
}

int coroutine_fn qk_rbd_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err)
{
    if (info->vm_state_size) {
        return qk_error_set(err, -ENOTSUP, "rbd snapshots cannot hold VM state");
    }
    Snap sn = {.image = ((RbdState *)bs->opaque)->image, .op = SNAP_CREATE, .name = info->name};
    qk_co_run_in_thread(snap_work, &sn);
    if (sn.r < 0) {
        return qk_error_set(err, sn.r, "failed to create snap: %s", strerror(-sn.r));
    }
    return 0;
}

int coroutine_fn qk_rbd_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                             QkError *err)
{
    RbdState *s = bs->opaque;
    int r = find_snap(bs, id_or_name, err);
    if (r < 0) {
        return r;
    }
    Snap sn = {.image = s->image, .op = SNAP_ROLLBACK, .name = id_or_name};
    qk_co_run_in_thread(snap_work, &sn);
    if (sn.r < 0) {
        return qk_error_set(err, sn.r, "Could not apply snapshot '%s': %s", id_or_name, strerror(-sn.r));
    }
    s->size = sn.size;
    bs->size = sn.size;
    *vm_state_size = 0;
    return 0;
}

int coroutine_fn qk_rbd_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    if (id && name && strcmp(id, name) != 0) {
        return qk_error_set(err, -ENOENT, "Can't find snapshot '%s'", id);
    }
    const char *snap = name ? name : id;
    int r = find_snap(bs, snap, err);
    if (r < 0) {
        return r;
    }
    Snap sn = {.image = ((RbdState *)bs->opaque)->image, .op = SNAP_REMOVE, .name = snap};
    qk_co_run_in_thread(snap_work, &sn);
    if (sn.r < 0) {
        return qk_error_set(err, sn.r, "Could not delete snapshot: %s", strerror(-sn.r));
    }
    return 0;
}
