/*
 * Parallel passes over an image (jobs/slices.c): commit, rebase, compare
 * and dd walk [0, size) in fixed slices, several coroutines at once, each
 * with a buffer of its own; the first error stops the walk.
 *
 * The slice sets the access pattern. Slices of one read each keep the
 * reads in flight next to each other, one sequential stream per file that
 * the kernel's read-ahead follows; slices of several reads each make as
 * many streams as workers, which it does not (rebase and compare read
 * twice as fast once their slices became single pieces).
 */
#ifndef QK_JOBS_SLICES_H
#define QK_JOBS_SLICES_H

#include "aio/coroutine.h"

#include <stddef.h>
#include <stdint.h>

/* Declared in qcowkit/engine.h. */

#endif
