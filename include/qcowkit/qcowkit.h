/*
 * qcowkit public API: open QCOW2 (or raw) images and do I/O on them from
 * plain, single-threaded code. Each call runs the library's event loop on
 * the calling thread until it completes. Internally every request is a
 * coroutine; programs that want many requests in flight use the block
 * layer (src/block/block.h) directly, as the qcowkit tools do.
 *
 * Errors: functions return 0 (or a non-negative count) on success and a
 * negative errno on failure; -EUCLEAN (QK_ECORRUPT) means the image is
 * corrupt rather than the I/O failing. When `errbuf` is non-NULL it receives
 * a one-line message.
 */
#ifndef QCOWKIT_QCOWKIT_H
#define QCOWKIT_QCOWKIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct QkImage QkImage;

/* Open flags. */
#define QK_IMAGE_RDWR     (1 << 0)
#define QK_IMAGE_NOCACHE  (1 << 1)   /* O_DIRECT on the host file (cache=none) */

/* qk_image_open - opens FILENAME; FORMAT is "qcow2", "raw" or NULL to probe.
 * Returns the image or NULL with a message in errbuf. */
QkImage *qk_image_open(const char *filename, const char *format, int flags,
                       char *errbuf, size_t errlen);

/* qk_image_close - flushes (when writable) and closes; always frees.
 * Returns 0, or -errno when writing back failed (the final flush, cached
 * metadata, clearing the dirty bit): data written since the last
 * successful qk_image_flush may then be lost. */
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
 * calls fail with a message otherwise. */
typedef struct QkVmStateStream QkVmStateStream;

typedef struct QkVmStateParams {
    int workers;          /* buffers written/read in parallel; 0: 4 */
    uint64_t buf_size;    /* 0: max(cluster size, 1 MiB) */
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
 * taken and the written state is dropped. Always frees W. Returns 0 or
 * -errno (message in errbuf). */
int qk_image_vmstate_writer_close(QkVmStateStream *w, const char *name, char *errbuf, size_t errlen);

/* qk_image_vmstate_reader_open - reverts IMG to snapshot SNAPSHOT (id or
 * name; its disk content and size become the active disk) and opens its
 * VM state for reading; *SIZE gets the state's length. */
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

#ifdef __cplusplus
}
#endif

#endif
