/*
 * What the files implementing the public API (api.c, api_vmstate.c) share:
 * the node behind a QkImage. Nothing else includes this.
 */
#ifndef QK_BLOCK_API_INT_H
#define QK_BLOCK_API_INT_H

#include "block/block.h"
#include "qcowkit/qcowkit.h"

QkBlock *qk_image_node(QkImage *img);

#endif
