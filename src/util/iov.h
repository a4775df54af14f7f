/*
 * Scatter/gather vectors (QkIov): a growable array of iovecs plus its total
 * size. Drivers pass a QkIov and a byte offset into it instead of copying.
 */
#ifndef QK_UTIL_IOV_H
#define QK_UTIL_IOV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "qcowkit/engine.h"

void qk_iov_init(QkIov *q, int hint);
void qk_iov_add(QkIov *q, void *base, size_t len);
/* Appends the bytes [off, off+len) of src (views, not copies). */
void qk_iov_concat(QkIov *q, const QkIov *src, size_t off, size_t len);
void qk_iov_reset(QkIov *q);
void qk_iov_destroy(QkIov *q);

size_t qk_iov_to_buf(const QkIov *q, size_t off, void *buf, size_t len);
size_t qk_iov_from_buf(const QkIov *q, size_t off, const void *buf, size_t len);
size_t qk_iov_memset(const QkIov *q, size_t off, int c, size_t len);
/* True when bytes [off, off+len) are all zero. */
int qk_iov_is_zero(const QkIov *q, size_t off, size_t len);
/* True when every base and length is a multiple of align. */
int qk_iov_is_aligned(const QkIov *q, size_t align);

/* Buffer helpers. */
void *qk_aligned_zalloc(size_t align, size_t size);
/* A buffer for large direct I/O (align as qk_aligned_alloc; free()):
 * one of QK_IO_BUF_HUGE bytes or more starts on a huge-page boundary and
 * asks for transparent huge pages (see util/iov.c). */
#define QK_IO_BUF_HUGE (2u << 20)
void *qk_io_buf_alloc(size_t align, size_t size);

#endif
