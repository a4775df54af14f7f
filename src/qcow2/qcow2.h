/*
 * Public-to-the-tools part of the qcow2 driver: consistency check and
 * repair. Everything else, internal snapshots included, is reached
 * through the block layer.
 */
#ifndef QK_QCOW2_QCOW2_H
#define QK_QCOW2_QCOW2_H

#include "block/block.h"

/* qk_qcow2_co_check, QkCheckResult and qk_block_is_qcow2 are declared in
 * qcowkit/engine.h. */

#endif
