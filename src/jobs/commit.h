/*
 * Commit's copy (jobs/commit.c): what the layers of top above base_depth
 * hold goes into base, which is flushed at the end.
 */
#ifndef QK_JOBS_COMMIT_H
#define QK_JOBS_COMMIT_H

#include "block/block.h"

/* Called after every piece copied: bytes looked at so far, of total. */
typedef void QkCommitProgress(uint64_t done, uint64_t total, void *opaque);

typedef struct QkCommitOptions {
    int workers;                /* coroutines copying at once (1..64) */
    uint64_t rate;              /* bytes/s copied at most; 0: no limit */
    QkCommitProgress *progress; /* may be NULL */
    void *opaque;
} QkCommitOptions;

/* Copies every range of top whose data comes from a layer above depth
 * base_depth (0 is top itself) into base, read through top's chain.
 * Grows base to top's size first if it is smaller. Returns 0 or -errno
 * (base then holds part of the data: the caller must not empty top). */
int coroutine_fn qk_co_commit_copy(QkBlock *top, int base_depth, QkBlock *base,
                                   const QkCommitOptions *opts);

#endif
