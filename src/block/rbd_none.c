/*
 * The RBD driver of a build made without librbd's headers (meson
 * -Drbd=disabled, or auto with them missing): opening or creating an
 * rbd: image fails with a message saying so.
 */
#include "block/block.h"

#include <errno.h>

#define NO_RBD "this build has no Ceph RBD support (built with -Drbd=disabled or without librbd's headers)"

static int coroutine_fn rbd_none_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    (void)bs;
    (void)opts;
    return qk_error_set(err, -ENOTSUP, NO_RBD);
}

static int coroutine_fn rbd_none_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    (void)filename;
    (void)opts;
    return qk_error_set(err, -ENOTSUP, NO_RBD);
}

const QkBlockDriver qk_drv_rbd = {
    .format_name = "rbd",
    .is_protocol = true,
    .co_open = rbd_none_open,
    .co_create = rbd_none_create,
};
