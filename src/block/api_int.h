/*
 * What the files implementing the public API (api.c, api_vmstate.c) share:
 * the node behind a QkImage and the VM-state stream open on it. Nothing
 * else includes this.
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

#endif
