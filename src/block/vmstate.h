/*
 * Buffered, parallel VM-state streaming for any node whose driver stores VM
 * state (co_save_vmstate / co_load_vmstate).
 *
 * A hypervisor delivers state as a stream of small, unaligned pieces.
 * The writer gathers them into aligned buffers of max(cluster size, 1 MiB),
 * writes each full buffer as a task in a task pool (several in flight),
 * counts those writes as in-flight requests on the node (so drain and close
 * wait), and qk_vmstate_writer_flush() writes the tail, waits for all and
 * returns the first error. A piece that does not continue the stream is
 * written directly after the buffered data has been written.
 * The reader serves sequential reads from buffers filled ahead by the pool.
 * Memory stays bounded by (workers + 1) buffers whatever the stream length.
 */
#ifndef QK_BLOCK_VMSTATE_H
#define QK_BLOCK_VMSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aio/coroutine.h"

typedef struct QkBlock QkBlock;
typedef struct QkIov QkIov;

typedef struct QkVmStateOptions {
    uint64_t buf_size;   /* 0: max(cluster size, 1 MiB); rounded up to 4 KiB */
    int workers;         /* buffers written/read in parallel; 0: 4 */
    bool unbuffered;     /* every piece is written as it comes (the slow path) */
    uint32_t cluster_size; /* hint for the default buffer size */
} QkVmStateOptions;

typedef struct QkVmStateWriter QkVmStateWriter;
typedef struct QkVmStateReader QkVmStateReader;

/* Writes go through `sink` (default: the node's driver co_save_vmstate). */
typedef int coroutine_fn QkVmStateIo(QkBlock *bs, QkIov *qiov, uint64_t pos);

QkVmStateWriter *qk_vmstate_writer_new(QkBlock *bs, const QkVmStateOptions *opts, QkVmStateIo *sink);
/* Appends len bytes at stream position pos. Returns 0 or the first error
 * seen so far (later pieces are then dropped). */
int coroutine_fn qk_vmstate_write(QkVmStateWriter *w, uint64_t pos, const void *buf, size_t len);
/* Writes what is buffered, waits for every write; 0 or the first error. */
int coroutine_fn qk_vmstate_writer_flush(QkVmStateWriter *w);
/* Frees the writer; it must have been flushed. */
void qk_vmstate_writer_free(QkVmStateWriter *w);
/* Bytes of buffer memory currently allocated (for tests and benchmarks). */
uint64_t qk_vmstate_writer_peak_memory(const QkVmStateWriter *w);

/* Reads stream bytes [0, size) with read-ahead through `source`
 * (default: the node's driver co_load_vmstate). */
QkVmStateReader *qk_vmstate_reader_new(QkBlock *bs, uint64_t size, const QkVmStateOptions *opts,
                                       QkVmStateIo *source);
/* Reads up to len bytes at pos; returns the byte count (0 at the end) or -errno. */
int64_t coroutine_fn qk_vmstate_read(QkVmStateReader *r, uint64_t pos, void *buf, size_t len);
/* Waits for read-ahead to finish and frees the reader. */
void coroutine_fn qk_vmstate_reader_close(QkVmStateReader *r);

#endif
