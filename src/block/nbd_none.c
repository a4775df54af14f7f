/*
 * The NBD client driver of a build made without libnbd's headers
 * (meson -Dnbd-client=disabled, or auto with them missing): opening an
 * nbd:// image fails with a message saying so.
 */
#include "block/block.h"

#include <errno.h>

static int coroutine_fn nbd_none_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    (void)bs;
    (void)opts;
    return qk_error_set(err, -ENOTSUP, "this build has no NBD client "
                        "(built with -Dnbd-client=disabled or without libnbd's headers)");
}

const QkBlockDriver qk_drv_nbd = {
    .format_name = "nbd",
    .is_protocol = true,
    .co_open = nbd_none_open,
};
