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

typedef enum QkMirrorMode {
    QK_MIRROR_BACKGROUND,
    QK_MIRROR_WRITE_BLOCKING,
} QkMirrorMode;

/* Called at the moment of the switch: the source is quiesced (no write in
 * flight, new ones held) and the target holds the same bytes. */
typedef void QkMirrorSwitchFn(void *opaque, QkBlock *source, QkBlock *target);

/* LOW runs the copies' host I/O on the nice-19 pool. AUTO is NORMAL: on
 * a 2-core machine under a 4k writer at 48K IOPS, LOW kept the writer at
 * 26.3K IOPS but starved the copy (104 MB/s, never ready), NORMAL kept
 * 24.7K and copied at 1108 MB/s (bench/mirror.sh). */
typedef enum { QK_MIRROR_PRIO_AUTO, QK_MIRROR_PRIO_LOW, QK_MIRROR_PRIO_NORMAL } QkMirrorPriority;

typedef struct QkMirrorOptions {
    uint64_t granularity;     /* 0: target cluster size clamped to 4K..64K */
    uint64_t buf_size;        /* bytes of copy buffers in flight; 0: 16 MiB */
    int max_in_flight;        /* copies at once; 0: 16 */
    uint64_t speed;           /* bytes/s; 0: unlimited */
    QkMirrorMode mode;
    uint64_t ready_threshold; /* ready when dirty bytes <= this; default 0 */
    bool target_is_zero;      /* fresh target: the bulk pass skips zeroes */
    bool rescan_per_chunk;    /* ablation: restart the walk and drain per chunk */
    bool chase_writes;        /* ablation: background passes run back to back whatever the write rate */
    QkMirrorPriority copy_priority; /* CPU priority of the copies' host I/O */
    QkMirrorSwitchFn *switch_fn;
    void *switch_opaque;
} QkMirrorOptions;

/* Parses "background" / "write-blocking"; -EINVAL otherwise. */
int qk_mirror_mode_parse(const char *s, QkMirrorMode *mode);
const char *qk_mirror_mode_name(QkMirrorMode mode);
/* Parses "low" / "normal" / "auto"; -EINVAL otherwise. */
int qk_mirror_priority_parse(const char *s, QkMirrorPriority *prio);

/* Opens a mirror's target (flags and format in opts) with the cache mode
 * CACHE ("none", "writeback", ... as qemu-img names them). With CACHE
 * NULL a local file target gets O_DIRECT ("none"), as a VM's disk would,
 * and falls back to the page cache where the file system refuses
 * O_DIRECT; an NBD target ignores it. *used gets the mode opened. */
QkBlock *coroutine_fn qk_mirror_open_target(const char *target, const QkOpenOptions *opts, const char *cache,
                                            const char **used, QkError *err);

/* Creates and starts a mirror job. Neither node is owned by the job; both
 * must stay open until it has finished. The target must be at least as
 * large as the source. */
QkJob *qk_mirror_start(const char *id, QkBlock *source, QkBlock *target,
                       const QkMirrorOptions *opts, QkError *err);

/* Requests completion (the job must be ready); do_switch runs the switch
 * callback under quiesce before the job ends. */
int qk_mirror_complete(QkJob *job, bool do_switch, QkError *err);

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
