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
/* Declared in qcowkit/engine.h. */

#endif
