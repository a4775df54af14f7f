/*
 * Convert's copy (jobs/convert.c): the content of one or more source
 * images, one after the other, written into a target image (qemu-img
 * convert's data path). The caller opens the sources and creates or
 * opens the target; this job only moves data.
 */
#ifndef QK_JOBS_CONVERT_H
#define QK_JOBS_CONVERT_H

#include "block/block.h"

/* Called after every piece written: bytes so far, of total. */
typedef void QkConvertProgress(uint64_t done, uint64_t total, void *opaque);

typedef struct QkConvertOptions {
    QkBlock **src;               /* the sources, concatenated in this order */
    int nb_src;
    QkBlock *dst;                /* at least as large as the sources together */
    /* The target reads as zeros wherever it is not written (a new image
     * without a backing file, or --target-is-zero): zeros are skipped
     * rather than written. */
    bool target_zero;
    /* The target has a backing file of its own (-B): only what each
     * source's top layer holds is copied; ranges it leaves to its backing
     * chain are not written, so the target's backing shows there. */
    bool top_only;
    /* Data that is all zeros over an aligned unit of this many bytes is
     * treated as zeros (a hole); 0 writes everything as data. */
    uint64_t sparse;
    bool compress;               /* every written cluster QK_REQ_COMPRESSED */
    int workers;                 /* coroutines copying at once (1..16) */
    bool out_of_order;           /* -W: writes need not reach the target in order */
    uint64_t rate;               /* -r: source bytes read per second; 0: no limit */
    /* Only the ranges dirty in this bitmap of the (single) source are
     * copied, the rest left to the target's backing file (an incremental
     * backup); NULL copies everything. */
    const struct QkDirtyBitmap *only;
    QkConvertProgress *progress; /* may be NULL */
    void *opaque;
} QkConvertOptions;

/* Copies; returns 0 or the first error (-errno), with err saying what
 * failed where ("error while reading at byte N: ..." as qemu-img says it).
 * The target is flushed at the end. -ENOTSUP from a compressed write means
 * the target's format cannot compress. */
int coroutine_fn qk_co_convert(const QkConvertOptions *o, QkError *err);

#endif
