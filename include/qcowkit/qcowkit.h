/*
 * qcowkit public API: open QCOW2 (or raw) images and do I/O on them from
 * plain, single-threaded code. Each call runs the library's event loop on
 * the calling thread until it completes. Internally every request is a
 * coroutine; programs that want many requests in flight use the
 * asynchronous API at the end of this header.
 *
 * Errors: functions return 0 (or a non-negative count) on success and a
 * negative errno on failure; -EUCLEAN (QK_ECORRUPT) means the image is
 * corrupt rather than the I/O failing. When `errbuf` is non-NULL it receives
 * a message: one line, but for an image locked by another user, which
 * gets QEMU's two-line wording. The library never prints, and never exits or aborts
 * on bad input or an I/O error.
 *
 * Memory: an allocation for data (buffers, tables, requests) that fails
 * is reported as -ENOMEM. Each thread that calls the library gets an event
 * loop (a ring or worker threads, a few descriptors) on its first call;
 * when it cannot be set up (out of descriptors, say) qk_image_open,
 * qk_async_open and a thread's first I/O call fail with the error. The
 * loop is freed when its thread exits, unless requests are still in
 * flight on it (an open VM-state stream's) or an inline async image uses
 * it. The process is aborted only when the engine's own bookkeeping
 * cannot be allocated later (a coroutine stack, a few iovecs) or the
 * kernel refuses an io_uring submission that was already prepared: states
 * it cannot unwind without losing track of requests in flight.
 */
#ifndef QCOWKIT_QCOWKIT_H
#define QCOWKIT_QCOWKIT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version: these macros say what a program was compiled
 * against, qk_version() what it runs with ("MAJOR.MINOR.PATCH"). */
#define QK_VERSION_MAJOR 0
#define QK_VERSION_MINOR 1
#define QK_VERSION_PATCH 0
const char *qk_version(void);

/* The error that means the image is corrupt (not an I/O failure). */
#define QK_ECORRUPT EUCLEAN

/* qk_strerror - a message for an errno this library returned, negative as
 * returned or positive (-EUCLEAN: "image is corrupt"). Never NULL; the
 * string is static. */
const char *qk_strerror(int err);

/* qk_set_aio_backend - "io_uring", "threads" or "default" (io_uring,
 * falling back to threads): the I/O backend of event loops created from now
 * on (each thread's first call, each async image's engine). The same as the
 * QCOWKIT_AIO environment variable, which applies only while no backend
 * was set this way. Returns 0 or -EINVAL. Safe from any thread. */
int qk_set_aio_backend(const char *name);

/* qk_set_tunable - sets one of the engine's tuning knobs by NAME from a
 * decimal VALUE, for event loops and files set up from now on; each also
 * has an environment variable, which applies while the program has not
 * set it this way:
 *   uring-async-min (QCOWKIT_URING_ASYNC_MIN): reads of at least this many
 *     bytes go to io_uring's kernel workers (default 131072; 0: never)
 *   uring-async-min-write (QCOWKIT_URING_ASYNC_MIN_WRITE): buffered writes
 *     of at least this many bytes go to writer threads (default 4096)
 *   uring-writer (QCOWKIT_URING_WRITER): 0 sends buffered writes to
 *     io_uring's workers instead of the writer threads (default 1)
 *   uring-coop-taskrun (QCOWKIT_URING_COOP): 1 sets rings up with
 *     IORING_SETUP_COOP_TASKRUN (default 0)
 *   bulk-read-direct (QCOWKIT_BULK_READ_DIRECT): 0 keeps a mirror's bulk
 *     reads of a page-cached file in the page cache (default 1)
 *   uring-submit-batch (QCOWKIT_URING_SUBMIT_BATCH): io_uring requests go
 *     to the kernel every this many (default 1; 0: only when the loop
 *     waits, but for a sequential run that reaches uring-seq-max)
 *   uring-seq-max (QCOWKIT_URING_SEQ_MAX): a run of io_uring requests
 *     each continuing the last goes to the kernel once it holds this many
 *     bytes (default 262144; 0: the run stays queued whole)
 *   loop-reap-batch (QCOWKIT_LOOP_REAP_BATCH): while a coroutine waits on
 *     a descriptor (a socket, an eventfd), the event loop completes at
 *     most this many requests before it polls its descriptors again
 *     (default 8; 0: all ready)
 * Returns 0, -ENOENT (no such knob) or -EINVAL (VALUE out of range). Safe
 * from any thread. */
int qk_set_tunable(const char *name, const char *value);

typedef struct QkImage QkImage;

/* Open flags. */
#define QK_IMAGE_RDWR     (1 << 0)
#define QK_IMAGE_NOCACHE  (1 << 1)   /* O_DIRECT on the host file (cache=none) */

/* qk_image_open - opens FILENAME; FORMAT is "qcow2", "raw" or NULL to probe.
 * FLAGS: the QK_IMAGE_ flags above (others are refused). Returns the image
 * or NULL with a message in errbuf. The I/O calls below return -EINVAL for
 * a NULL image, qk_image_size 0. */
QkImage *qk_image_open(const char *filename, const char *format, int flags,
                       char *errbuf, size_t errlen);

/* qk_image_close - flushes (when writable) and closes; always frees.
 * Returns 0, or -errno when writing back failed (the final flush, cached
 * metadata, clearing the dirty bit): data written since the last
 * successful qk_image_flush may then be lost. A VM-state stream still open
 * on IMG is closed first (a writer as with NAME NULL: no snapshot). */
int qk_image_close(QkImage *img);

/* qk_image_size - the virtual disk size in bytes. */
uint64_t qk_image_size(const QkImage *img);

/* qk_image_pread / qk_image_pwrite - reads or writes LEN bytes at OFF of
 * the virtual disk. Any alignment is allowed. Returns 0 or -errno. */
int qk_image_pread(QkImage *img, uint64_t off, void *buf, size_t len);
int qk_image_pwrite(QkImage *img, uint64_t off, const void *buf, size_t len);

/* qk_image_zero - makes [OFF, OFF+LEN) read as zeros; UNMAP lets the image
 * release the space. qk_image_discard - drops the range's contents (it may
 * read as zeros or from a backing file afterwards). */
int qk_image_zero(QkImage *img, uint64_t off, uint64_t len, int unmap);
int qk_image_discard(QkImage *img, uint64_t off, uint64_t len);

/* qk_image_flush - makes completed writes stable on disk. */
int qk_image_flush(QkImage *img);

/* ---- VM state: saving a running VM's memory and devices with a snapshot ----
 *
 * A hypervisor streams its state in, in pieces of any size, and takes an
 * internal snapshot that records it (QEMU's savevm layout: QEMU can load
 * it); later it applies the snapshot and streams the state back out
 * (loadvm). Pieces are gathered into aligned buffers written in parallel,
 * so small unaligned pieces cost no read-modify-write even with
 * QK_IMAGE_NOCACHE. Memory stays at (workers + 1) buffers.
 * Images whose format keeps internal snapshots (qcow2) only: the open
 * calls fail with a message otherwise, and when a stream is already open
 * on the image (one at a time). A writer passed where a reader is wanted,
 * or the reverse, gets -EINVAL. */
typedef struct QkVmStateStream QkVmStateStream;

typedef struct QkVmStateParams {
    int workers;          /* buffers written/read in parallel; 0: 4 */
    uint64_t buf_size;    /* 0: max(cluster size, 2 MiB) */
    int unbuffered;       /* write each piece as it comes (slow; for comparison) */
} QkVmStateParams;

/* qk_image_vmstate_writer_open - starts saving VM state into IMG (opened
 * with QK_IMAGE_RDWR). PARAMS may be NULL. Returns NULL with a message in
 * errbuf on failure. */
QkVmStateStream *qk_image_vmstate_writer_open(QkImage *img, const QkVmStateParams *params,
                                              char *errbuf, size_t errlen);

/* qk_image_vmstate_write - appends LEN bytes to the stream. Returns 0, or
 * the first error any earlier write hit (the save is then lost). */
int qk_image_vmstate_write(QkVmStateStream *w, const void *buf, size_t len);

/* qk_image_vmstate_writer_close - finishes the save. With NAME, waits for
 * every write, then takes snapshot NAME recording the state (the id is
 * the next free number; a name may repeat, as in qemu-img) and drops the state from the
 * active disk. With NAME NULL, or when any write failed, no snapshot is
 * taken and the written state is dropped. Always frees W (a NULL W or a
 * reader: -EINVAL, nothing freed). Returns 0 or -errno (message in
 * errbuf). */
int qk_image_vmstate_writer_close(QkVmStateStream *w, const char *name, char *errbuf, size_t errlen);

/* qk_image_vmstate_reader_open - reverts IMG to snapshot SNAPSHOT (id or
 * name, never NULL; its disk content and size become the active disk)
 * and opens its VM state for reading; *SIZE gets the state's length. */
QkVmStateStream *qk_image_vmstate_reader_open(QkImage *img, const char *snapshot,
                                              const QkVmStateParams *params, uint64_t *size,
                                              char *errbuf, size_t errlen);

/* qk_image_vmstate_read - reads the next bytes of the state (read-ahead
 * keeps the next buffers coming). Returns the count, 0 at the end, or -errno. */
int64_t qk_image_vmstate_read(QkVmStateStream *r, void *buf, size_t len);

/* qk_image_vmstate_reader_close - frees R (waits for read-ahead) and drops
 * the state from the active disk; the snapshot keeps it. */
void qk_image_vmstate_reader_close(QkVmStateStream *r);

/* qk_image_vmstate_peak_memory - bytes of buffers the stream allocated at
 * most (writer only; for monitoring). */
uint64_t qk_image_vmstate_peak_memory(const QkVmStateStream *s);

/* ---- Asynchronous API: many requests in flight, driven from any loop ----
 *
 * qk_async_open() opens an image on an engine thread of its own, which
 * runs every request of that image as a coroutine on its event loop
 * (io_uring, or the thread pool). Programs talk to it through queues:
 * requests are enqueued without blocking (qk_queue_readv() ...), handed to
 * the engine by qk_queue_do_io(), and their completions collected by the
 * same call. Each queue has a completion file descriptor that becomes
 * readable when completions may be waiting, so a program can watch it in
 * its own epoll/poll/io_uring loop and call qk_queue_do_io() with min 0
 * when it fires.
 *
 * Inline images (QK_ASYNC_INLINE) have no engine thread: the thread that
 * opens one runs its engine, inside qk_async_open(), qk_queue_do_io() and
 * qk_async_close(), on that thread's event loop (the one the synchronous
 * API uses there too). Requests then start and finish without waking a
 * second thread, which is faster when cores are few; every call on the
 * image and its queues must come from the opening thread (do_io and close
 * return -EPERM elsewhere, changing nothing). The image makes progress
 * only inside those calls: a program that watches the completion
 * descriptors calls qk_queue_do_io() with min 0 whenever one fires, and
 * may see it fire with nothing to collect.
 *
 * Threading: the image's metadata lives on the engine thread only. Each
 * queue belongs to one thread at a time (calls on one queue must not run
 * concurrently); different queues may be used from different threads at
 * once. qk_async_close() must not run concurrently with calls on any of
 * its queues. Buffers passed to a request must stay valid, untouched for
 * writes, until its completion is returned. Requests of one queue, and of
 * different queues, may complete in any order; a flush covers the writes
 * completed before it was submitted.
 *
 * Errors: as in the rest of the API, 0 or a negative errno. The library
 * never prints or exits on I/O errors; an allocation failure at submission
 * returns -ENOMEM and nothing is queued. */
typedef struct QkAsyncImage QkAsyncImage;
typedef struct QkQueue QkQueue;

typedef struct QkCompletion {
    void *user_data;      /* as given when the request was enqueued */
    int ret;              /* 0 or -errno */
} QkCompletion;

/* qk_async_open - opens FILENAME (FORMAT "qcow2", "raw" or NULL to probe;
 * FLAGS as for qk_image_open, plus QK_ASYNC_INLINE) on a new engine thread,
 * or on the calling thread with QK_ASYNC_INLINE, with NQUEUES queues
 * (1 to 64). Returns NULL with a message in errbuf on failure. */
#define QK_ASYNC_INLINE   (1 << 8)
QkAsyncImage *qk_async_open(const char *filename, const char *format, int flags, int nqueues,
                            char *errbuf, size_t errlen);

/* qk_async_close - waits for every request in flight, flushes (when
 * writable), closes the image, stops the engine and frees the queues
 * (completions not collected are dropped). Requests enqueued but never
 * submitted by qk_queue_do_io() are dropped unrun, as an io_uring drops
 * entries never submitted: a write enqueued and not submitted does not
 * reach the image (see qk_queue_outstanding()). Returns 0, or the error
 * of the final flush: the last writes may not be on disk. Frees IMG,
 * except for an inline image closed from another thread (-EPERM,
 * nothing done). */
int qk_async_close(QkAsyncImage *img);

/* qk_async_size - the virtual disk size in bytes (0 for NULL). */
uint64_t qk_async_size(const QkAsyncImage *img);

/* qk_async_queue - queue I (0 <= I < nqueues), or NULL. */
QkQueue *qk_async_queue(QkAsyncImage *img, int i);

/* Enqueue a request on Q (nothing is submitted until qk_queue_do_io).
 * IOV (IOVCNT entries, at most 1024) is copied; the buffers it points to
 * are not. Zero writes take QK_ZERO_UNMAP to let the image release space.
 * Return 0 or -errno (-EINVAL for a bad argument, -ENOMEM). */
#define QK_ZERO_UNMAP (1 << 0)
struct iovec;
int qk_queue_readv(QkQueue *q, uint64_t off, const struct iovec *iov, int iovcnt, void *user_data);
int qk_queue_writev(QkQueue *q, uint64_t off, const struct iovec *iov, int iovcnt, void *user_data);
int qk_queue_write_zeroes(QkQueue *q, uint64_t off, uint64_t len, int flags, void *user_data);
int qk_queue_discard(QkQueue *q, uint64_t off, uint64_t len, void *user_data);
int qk_queue_flush(QkQueue *q, void *user_data);

/* qk_queue_do_io - submits every request enqueued on Q, then returns up to
 * MAX completions in OUT, waiting until at least MIN are there or
 * TIMEOUT_NS passes (< 0: no limit; 0: do not wait). Returns the number of
 * completions (possibly fewer than MIN after a timeout), or -EINVAL when
 * MIN exceeds what Q has outstanding (it would wait forever) or MIN > MAX. */
int qk_queue_do_io(QkQueue *q, QkCompletion *out, int min, int max, int64_t timeout_ns);

/* qk_queue_completion_fd - a descriptor that becomes readable (POLLIN)
 * when completions may be waiting on Q. Reading it is the library's job:
 * call qk_queue_do_io() when it fires. Valid until qk_async_close().
 * -EINVAL for a NULL Q. */
int qk_queue_completion_fd(QkQueue *q);

/* qk_queue_outstanding - requests enqueued or in flight on Q whose
 * completion has not been returned yet (0 for a NULL Q). */
unsigned qk_queue_outstanding(const QkQueue *q);

#ifdef __cplusplus
}
#endif

#endif
