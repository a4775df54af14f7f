/*
 * librbd (and librados under it), loaded on first use. Linking them
 * pulls Ceph's C++ runtime (boost, the messenger, crypto) into every
 * qcowkit process, while only rbd: images need it. Include this instead
 * of <rbd/librbd.h>: the calls below then go through the pointers
 * qk_rbd_lib_load() resolved.
 */
#ifndef QK_RBD_LIB_H
#define QK_RBD_LIB_H

#include "util/error.h"

#include <rbd/librbd.h>

#define QK_RBD_FUNCS(X) \
    X(rados_conf_read_file) \
    X(rados_conf_set) \
    X(rados_connect) \
    X(rados_create) \
    X(rados_ioctx_create) \
    X(rados_ioctx_destroy) \
    X(rados_ioctx_set_namespace) \
    X(rados_shutdown) \
    X(rbd_aio_create_completion) \
    X(rbd_aio_discard) \
    X(rbd_aio_flush) \
    X(rbd_aio_get_return_value) \
    X(rbd_aio_readv) \
    X(rbd_aio_release) \
    X(rbd_aio_write_zeroes) \
    X(rbd_aio_writev) \
    X(rbd_close) \
    X(rbd_create) \
    X(rbd_diff_iterate2) \
    X(rbd_get_features) \
    X(rbd_get_flags) \
    X(rbd_get_size) \
    X(rbd_open) \
    X(rbd_open_read_only) \
    X(rbd_resize) \
    X(rbd_snap_create) \
    X(rbd_snap_list) \
    X(rbd_snap_list_end) \
    X(rbd_snap_remove) \
    X(rbd_snap_rollback) \
    X(rbd_stat)

typedef struct QkRbdLib {
#define QK_RBD_FIELD(name) __typeof__(name) *name;
    QK_RBD_FUNCS(QK_RBD_FIELD)
#undef QK_RBD_FIELD
} QkRbdLib;

extern QkRbdLib qk_rbd_fn;

/* Loads librbd once per process (safe from any thread); later calls
 * return the first result. */
int qk_rbd_lib_load(QkError *err);

#endif
