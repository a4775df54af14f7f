/*
 * Socket I/O from coroutines: "read exactly n bytes" and "write all of
 * these iovecs" on a non-blocking socket, yielding on EAGAIN through the
 * event loop. A buffered reader lets the server pull many small request
 * headers out of one recv().
 *
 * Owns: partial reads/writes, EINTR/EAGAIN, EOF. Must not know any protocol.
 */
#ifndef QK_NBD_SOCKIO_H
#define QK_NBD_SOCKIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "aio/coroutine.h"

/* Makes fd non-blocking and close-on-exec; returns 0 or -errno. */
int qk_sock_set_nonblock(int fd);

/* Writes every byte of iov (which it may modify). 0 or -errno
 * (-EPIPE/-ECONNRESET when the peer went away). Never raises SIGPIPE. */
int coroutine_fn qk_co_sock_writev(int fd, struct iovec *iov, int iovcnt);
int coroutine_fn qk_co_sock_write(int fd, const void *buf, size_t len);
/* The same, failing with -ETIMEDOUT once qk_clock_ns() passes deadline_ns
 * (0: no deadline). */
int coroutine_fn qk_co_sock_writev_until(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
int coroutine_fn qk_co_sock_write_until(int fd, const void *buf, size_t len, int64_t deadline_ns);

#define QK_SOCK_READER_BUF (64 * 1024)

typedef struct QkSockReader {
    int fd;
    int64_t deadline_ns;           /* reads fail with -ETIMEDOUT after it; 0: never */
    size_t start, end;             /* unread bytes are buf[start, end) */
    uint8_t buf[QK_SOCK_READER_BUF];
} QkSockReader;

void qk_sock_reader_init(QkSockReader *r, int fd);
/* Reads exactly len bytes into dst. 0, or -ECONNRESET on EOF (even a
 * clean one: the caller knows whether it was at a message boundary by
 * checking qk_sock_reader_pending() before the call), or -errno. */
int coroutine_fn qk_co_sock_read(QkSockReader *r, void *dst, size_t len);
/* Reads and drops len bytes. */
int coroutine_fn qk_co_sock_skip(QkSockReader *r, uint64_t len);
static inline size_t qk_sock_reader_pending(const QkSockReader *r) { return r->end - r->start; }

#endif
