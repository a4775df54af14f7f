/*
 * libnbd, loaded on first use. Linking it pulls in GnuTLS, libxml2 and
 * ICU, a few MiB of resident memory in every qcowkit process, while only
 * nbd:// images need it. Include this instead of <libnbd.h>: the nbd_*
 * calls below then go through the pointers qk_nbd_lib_load() resolved.
 */
#ifndef QK_NBD_LIB_H
#define QK_NBD_LIB_H

#include "util/error.h"

#include <libnbd.h>

#define QK_NBD_FUNCS(X) \
    X(add_meta_context) \
    X(aio_block_status) \
    X(aio_connect_uri) \
    X(aio_disconnect) \
    X(aio_flush) \
    X(aio_get_direction) \
    X(aio_get_fd) \
    X(aio_is_closed) \
    X(aio_is_connecting) \
    X(aio_is_dead) \
    X(aio_is_ready) \
    X(aio_notify_read) \
    X(aio_notify_write) \
    X(aio_pread) \
    X(aio_pwrite) \
    X(aio_trim) \
    X(aio_zero) \
    X(can_fast_zero) \
    X(can_flush) \
    X(can_fua) \
    X(can_meta_context) \
    X(can_trim) \
    X(can_zero) \
    X(close) \
    X(create) \
    X(get_block_size) \
    X(get_errno) \
    X(get_error) \
    X(get_size) \
    X(is_read_only)

typedef struct QkNbdLib {
#define QK_NBD_FIELD(name) __typeof__(nbd_##name) *name;
    QK_NBD_FUNCS(QK_NBD_FIELD)
#undef QK_NBD_FIELD
} QkNbdLib;

extern QkNbdLib qk_nbd_fn;

/* Loads libnbd once per process; later calls return the first result. */
int qk_nbd_lib_load(QkError *err);

#ifndef QK_NBD_LIB_REAL
#define nbd_add_meta_context (qk_nbd_fn.add_meta_context)
#define nbd_aio_block_status (qk_nbd_fn.aio_block_status)
#define nbd_aio_connect_uri (qk_nbd_fn.aio_connect_uri)
#define nbd_aio_disconnect (qk_nbd_fn.aio_disconnect)
#define nbd_aio_flush (qk_nbd_fn.aio_flush)
#define nbd_aio_get_direction (qk_nbd_fn.aio_get_direction)
#define nbd_aio_get_fd (qk_nbd_fn.aio_get_fd)
#define nbd_aio_is_closed (qk_nbd_fn.aio_is_closed)
#define nbd_aio_is_connecting (qk_nbd_fn.aio_is_connecting)
#define nbd_aio_is_dead (qk_nbd_fn.aio_is_dead)
#define nbd_aio_is_ready (qk_nbd_fn.aio_is_ready)
#define nbd_aio_notify_read (qk_nbd_fn.aio_notify_read)
#define nbd_aio_notify_write (qk_nbd_fn.aio_notify_write)
#define nbd_aio_pread (qk_nbd_fn.aio_pread)
#define nbd_aio_pwrite (qk_nbd_fn.aio_pwrite)
#define nbd_aio_trim (qk_nbd_fn.aio_trim)
#define nbd_aio_zero (qk_nbd_fn.aio_zero)
#define nbd_can_fast_zero (qk_nbd_fn.can_fast_zero)
#define nbd_can_flush (qk_nbd_fn.can_flush)
#define nbd_can_fua (qk_nbd_fn.can_fua)
#define nbd_can_meta_context (qk_nbd_fn.can_meta_context)
#define nbd_can_trim (qk_nbd_fn.can_trim)
#define nbd_can_zero (qk_nbd_fn.can_zero)
#define nbd_close (qk_nbd_fn.close)
#define nbd_create (qk_nbd_fn.create)
#define nbd_get_block_size (qk_nbd_fn.get_block_size)
#define nbd_get_errno (qk_nbd_fn.get_errno)
#define nbd_get_error (qk_nbd_fn.get_error)
#define nbd_get_size (qk_nbd_fn.get_size)
#define nbd_is_read_only (qk_nbd_fn.is_read_only)
#endif

#endif
