/*
 * Internal snapshots through the block layer: each call goes to the node's
 * driver (QkBlockDriver's co_snapshot_* and co_vmstate_discard); a format
 * without internal snapshots fails with -ENOTSUP and says so. Callers (the
 * public VM-state API, the snapshot command) never name a format.
 */
#ifndef QK_BLOCK_SNAPSHOT_H
#define QK_BLOCK_SNAPSHOT_H

#include <stdint.h>

#include "block/block.h"

/* The snapshot calls and QkSnapshotInfo are declared in qcowkit/engine.h. */

#endif
