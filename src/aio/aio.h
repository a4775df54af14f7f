/*
 * Host file I/O from coroutines. Each call submits one operation to the
 * loop's backend and yields until it completes. Results: bytes transferred
 * (possibly short) or 0 for flush/fallocate/truncate, else -errno.
 */
#ifndef QK_AIO_AIO_H
#define QK_AIO_AIO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "aio/coroutine.h"

/* off UINT64_MAX reads at the descriptor's own position: for descriptors
 * that have no offsets (an eventfd, a pipe). */
ssize_t coroutine_fn qk_co_host_preadv(int fd, const struct iovec *iov, int iovcnt, uint64_t off);
ssize_t coroutine_fn qk_co_host_pwritev(int fd, const struct iovec *iov, int iovcnt, uint64_t off);
/* As qk_co_host_pwritev, then starts writing the range back to the disk
 * without waiting for it (sync_file_range WRITE): for a stream that is not
 * written again, so that the next flush finds little left to do. Only a
 * hint: a backend without a place to run it just writes. */
ssize_t coroutine_fn qk_co_host_pwritev_behind(int fd, const struct iovec *iov, int iovcnt, uint64_t off);
int coroutine_fn qk_co_host_fdatasync(int fd);
int coroutine_fn qk_co_host_fallocate(int fd, int mode, uint64_t off, uint64_t len);
int coroutine_fn qk_co_host_ftruncate(int fd, uint64_t len);
/* As qk_co_host_preadv/pwritev for an fd opened with O_DIRECT, which
 * copies nothing through the page cache: io_uring hands buffered writes to
 * its workers, but not these. */
ssize_t coroutine_fn qk_co_host_rw_direct(int fd, bool write, const struct iovec *iov, int iovcnt,
                                          uint64_t off);

/* Backend interface (internal). */
typedef enum QkAioOp {
    QK_AIO_READ, QK_AIO_WRITE, QK_AIO_FDATASYNC, QK_AIO_FALLOCATE, QK_AIO_FTRUNCATE,
} QkAioOp;

typedef struct QkAioReq {
    QkAioOp op;
    int fd;
    const struct iovec *iov;
    int iovcnt;
    uint64_t off;
    uint64_t len;
    int mode;
    bool direct;        /* fd has O_DIRECT */
    bool write_behind;  /* write: start the range's writeback afterwards */
    int64_t result;
    QkCoroutine *co;
    struct QkAioReq *next;
} QkAioReq;

#endif
