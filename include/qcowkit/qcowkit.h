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

/* qk_image_close - flushes (when writable) and closes; always frees. */
void qk_image_close(QkImage *img);

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

#ifdef __cplusplus
}
#endif

#endif
