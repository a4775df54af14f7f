/*
 * What the RBD driver's files share (rbd.c: connection and I/O;
 * rbd_snapshot.c: RBD's own snapshots behind the snapshot calls).
 */
#ifndef QK_BLOCK_RBD_INT_H
#define QK_BLOCK_RBD_INT_H

#include "block/block.h"
#include "block/rbd_lib.h"

#include <pthread.h>

/* librbd's calls, through the pointers rbd_lib.c resolved. */
#define RBD(f) (qk_rbd_fn.f)

typedef struct RbdSpec {
    char *pool, *ns, *image, *snap;
    char *conf, *user;
    char **keys, **vals;
    int nkv;
} RbdSpec;

typedef struct RbdState {
    RbdSpec spec;
    rados_t cluster;
    rados_ioctx_t io;
    rbd_image_t image;
    uint64_t size;
    bool fast_diff;   /* the object map can answer block status */
    /* Completions: librbd's threads push finished requests here and
     * signal efd once per batch; the reaper coroutine wakes their
     * coroutines on the loop. */
    pthread_mutex_t lock;
    struct RbdReq *done;  /* finished, not yet reaped (under lock) */
    bool signalled;       /* efd written since the reaper last drained (under lock) */
    int efd;
    bool closing;
    bool reaper_running;
    QkCoQueue reaper_gone;
    QkCoMutex grow_lock;  /* one resize at a time for writes past the end */
} RbdState;

int coroutine_fn qk_rbd_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
int coroutine_fn qk_rbd_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
int coroutine_fn qk_rbd_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                         QkError *err);
int coroutine_fn qk_rbd_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err);

#endif
