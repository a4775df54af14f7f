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
#include "qcowkit/engine.h"

/* The writer and reader (QkVmStateWriter, QkVmStateReader and their
 * calls) are declared in qcowkit/engine.h: a piece written at pos returns
 * 0 or the first error seen so far (later pieces are then dropped); flush
 * writes what is buffered and waits for every write; the writer must be
 * flushed before it is freed; a read returns the byte count (0 at the
 * end) or -errno; closing a reader waits for its read-ahead. */

/* Bytes of buffer memory currently allocated (for tests and benchmarks). */
uint64_t qk_vmstate_writer_peak_memory(const QkVmStateWriter *w);

#endif
