/*
 * Parallel passes over an image (jobs/slices.c): commit and rebase walk
 * [0, size) in fixed slices, several coroutines at once, each with a
 * buffer of its own; the first error stops the walk.
 */
#ifndef QK_JOBS_SLICES_H
#define QK_JOBS_SLICES_H

#include "aio/coroutine.h"

#include <stddef.h>
#include <stdint.h>

/* Declared in qcowkit/engine.h. */

#endif
