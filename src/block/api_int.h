/*
 * What the files implementing the public API (api.c, api_async.c,
 * api_vmstate.c) share: the node behind a QkImage, the VM-state stream
 * open on it, and how an engine error is told to a program. Nothing else
 * includes this.
 */
#ifndef QK_BLOCK_API_INT_H
#define QK_BLOCK_API_INT_H

#include "block/block.h"
#include "qcowkit/qcowkit.h"

QkBlock *qk_image_node(QkImage *img);

/* The one VM-state stream open on IMG, or NULL; qk_image_close() finishes
 * it first (api_vmstate.c) so it never outlives the node it writes. */
QkVmStateStream **qk_image_stream_slot(QkImage *img);
void qk_image_vmstate_stream_abandon(QkVmStateStream *s);

/* The stable API's answer for a request on bs that returned ret: -EIO
 * from an image found corrupt (the engine says EIO, as QEMU's tools do) is
 * -QK_ECORRUPT there, as qcowkit.h promises. */
static inline int qk_api_error(QkBlock *bs, int ret)
{
    return ret == -EIO && qk_block_corrupt_reason(bs) ? -QK_ECORRUPT : ret;
}

#endif
