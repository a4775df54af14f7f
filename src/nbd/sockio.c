/*
 * Coroutine socket I/O. See sockio.h.
 */
#include "nbd/sockio.h"
#include "aio/loop.h"
#include "common/checked.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

int qk_sock_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return -errno;
    }
    fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0) {
        return -errno;
    }
    return 0;
}

/* Waits for fd to become ready, until deadline_ns (0: forever). */
static int coroutine_fn wait_until(int fd, int events, int64_t deadline_ns)
{
    if (!deadline_ns) {
        return qk_co_wait_fd(fd, events, -1);
    }
    int64_t left = deadline_ns - qk_clock_ns();
    return left > 0 ? qk_co_wait_fd(fd, events, left) : -ETIMEDOUT;
}

int coroutine_fn qk_co_sock_writev(int fd, struct iovec *iov, int iovcnt)
{
    return qk_co_sock_writev_until(fd, iov, iovcnt, 0);
}

int coroutine_fn qk_co_sock_writev_until(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns)
{
    while (iovcnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int r = wait_until(fd, POLLOUT, deadline_ns);
                if (r < 0) {
                    return r;
                }
                continue;
            }
            return -errno;
        }
        size_t done = (size_t)n;
        while (iovcnt > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return 0;
}

int coroutine_fn qk_co_sock_write(int fd, const void *buf, size_t len)
{
    return qk_co_sock_write_until(fd, buf, len, 0);
}

int coroutine_fn qk_co_sock_write_until(int fd, const void *buf, size_t len, int64_t deadline_ns)
{
    struct iovec iov = {(void *)buf, len};
    return qk_co_sock_writev_until(fd, &iov, 1, deadline_ns);
}

void qk_sock_reader_init(QkSockReader *r, int fd)
{
    r->fd = fd;
    r->deadline_ns = 0;
    r->start = r->end = 0;
}

/* One recv into dst; waits when nothing is there. Returns bytes (>0). */
static ssize_t coroutine_fn recv_some(int fd, void *dst, size_t len, int64_t deadline_ns)
{
    for (;;) {
        ssize_t n = recv(fd, dst, len, 0);
        if (n > 0) {
            return n;
        }
        if (n == 0) {
            return -ECONNRESET;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return -errno;
        }
        int r = wait_until(fd, POLLIN, deadline_ns);
        if (r < 0) {
            return r;
        }
    }
}

int coroutine_fn qk_co_sock_read(QkSockReader *r, void *dst, size_t len)
{
    uint8_t *out = dst;
    size_t have = r->end - r->start;
    size_t take = QK_MIN(have, len);
    memcpy(out, r->buf + r->start, take);
    r->start += take;
    out += take;
    len -= take;
    if (r->start == r->end) {
        r->start = r->end = 0;
    }
    while (len > 0) {
        /* Large payloads go straight to their destination; small reads
         * refill the buffer so following headers come for free. */
        if (len >= sizeof(r->buf) / 2) {
            ssize_t n = recv_some(r->fd, out, len, r->deadline_ns);
            if (n < 0) {
                return (int)n;
            }
            out += n;
            len -= (size_t)n;
            continue;
        }
        ssize_t n = recv_some(r->fd, r->buf, sizeof(r->buf), r->deadline_ns);
        if (n < 0) {
            return (int)n;
        }
        take = QK_MIN((size_t)n, len);
        memcpy(out, r->buf, take);
        out += take;
        len -= take;
        r->start = take;
        r->end = (size_t)n;
    }
    return 0;
}

int coroutine_fn qk_co_sock_skip(QkSockReader *r, uint64_t len)
{
    uint8_t scratch[4096];
    while (len > 0) {
        size_t n = (size_t)QK_MIN(len, (uint64_t)sizeof(scratch));
        int ret = qk_co_sock_read(r, scratch, n);
        if (ret < 0) {
            return ret;
        }
        len -= n;
    }
    return 0;
}
