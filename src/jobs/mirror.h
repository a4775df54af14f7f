/*
 * Mirror job: copies a node that is being written (the source) to another
 * node (the target: an image file we opened, or an NBD node on another
 * host) and keeps the copy in sync until it is completed.
 *
 * Bulk pass: one walk over the source by block status, copying data and
 * writing zeroes as zeroes. Writes that land meanwhile are caught by a dirty
 * bitmap created at start. Dirty passes: a cursor walks the bitmap, resets
 * each chunk's bits when it submits the chunk, advances past it and wraps at
 * the end; at most max_in_flight copies run at once. In write-blocking mode
 * each new write is also written to the target before the guest's request
 * completes, so the dirty set only shrinks.
 *
 * Owns: the copy loop, its in-flight ranges and the write hook. Must not know
 * about exports, the control socket or the command line: switching users to
 * the target is the caller's callback.
 */
#ifndef QK_JOBS_MIRROR_H
#define QK_JOBS_MIRROR_H

#include <stdbool.h>
#include <stdint.h>

#include "block/block.h"
#include "jobs/job.h"

/* QkMirrorMode, QkMirrorPriority, QkMirrorOptions and the calls that
 * parse them, open a target, start and complete a job are declared in
 * qcowkit/engine.h. */

const char *qk_mirror_mode_name(QkMirrorMode mode);

bool qk_job_is_mirror(const QkJob *job);
/* Debug counters (for tests and the benchmark). */
typedef struct QkMirrorStats {
    uint64_t granularity;
    uint64_t chunks_submitted;  /* copies started by the walkers */
    uint64_t cursor_restarts;   /* times the dirty walk began again at 0 */
    uint64_t active_writes;     /* guest writes copied by the write hook */
    uint64_t active_conflicts;  /* of those, left to the walker (overlap) */
    int64_t bulk_done_ns;       /* when the bulk pass finished, 0 before */
    uint64_t writer_waits;      /* background: windows spent waiting for writes to slow */
    int64_t writer_wait_ns;     /* time spent so */
} QkMirrorStats;
void qk_mirror_get_stats(const QkJob *job, QkMirrorStats *st);

#endif
