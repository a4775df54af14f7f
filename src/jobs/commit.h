/*
 * Commit's copy (jobs/commit.c): what the layers of top above base_depth
 * hold goes into base, which is flushed at the end.
 */
#ifndef QK_JOBS_COMMIT_H
#define QK_JOBS_COMMIT_H

#include "block/block.h"

/* Called after every piece copied: bytes looked at so far, of total. */
/* Declared in qcowkit/engine.h. */

#endif
