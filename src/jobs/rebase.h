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
typedef void QkRebaseProgress(uint64_t done, uint64_t total, void *opaque);

typedef struct QkRebaseOptions {
    int workers;                 /* coroutines comparing at once (1..64) */
    bool compress;               /* -c: differing clusters written compressed */
    QkRebaseProgress *progress;  /* may be NULL */
    void *opaque;
} QkRebaseOptions;

/* Writes into top (opened read-write with its current chain) what reads
 * through its chain give wherever that differs from new_backing (NULL:
 * none, reads as zeros; past its end, zeros too). Compares and writes in
 * units of top's allocation granularity. top is flushed at the end, so
 * the caller may record the new backing file only after this returned 0. */
int coroutine_fn qk_co_rebase_copy(QkBlock *top, QkBlock *new_backing, const QkRebaseOptions *opts);

#endif
