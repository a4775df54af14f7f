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

/* Handles [off, off+len) with buf (buf_size bytes); 0 or -errno. May yield. */
typedef int coroutine_fn QkSliceFn(void *opaque, uint64_t off, uint64_t len, void *buf);

/* Runs fn over [0, size) in slices of slice bytes with workers (1..64)
 * coroutines, each given a buffer of buf_size bytes aligned to align.
 * Returns the first error, after every worker has stopped. */
int coroutine_fn qk_co_run_slices(uint64_t size, uint64_t slice, int workers, size_t buf_size,
                                  size_t align, QkSliceFn *fn, void *opaque);

#endif
