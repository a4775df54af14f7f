/*
 * Rebase's copy (jobs/rebase.c): before an image's backing file is
 * switched, every range the image does not hold itself and whose content
 * differs between the old chain and the new backing is written into the
 * image, so the guest sees the same data afterwards.
 */
#ifndef QK_JOBS_REBASE_H
#define QK_JOBS_REBASE_H

#include "block/block.h"

/* Called after every piece looked at: bytes so far, of total. */
/* Declared in qcowkit/engine.h. */

#endif
