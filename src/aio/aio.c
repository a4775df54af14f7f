/*
 * Host I/O entry points for coroutines: fill a request on the stack, queue
 * it on the loop's backend, yield until the backend completes it.
 */
#include "aio/aio.h"
#include "aio/backend.h"
#include "aio/loop.h"



static int64_t coroutine_fn submit(QkAioReq *req)
{
    req->co = qk_coroutine_self();
    req->result = 0;
    qk_loop_queue_aio(req);
    qk_coroutine_yield();
    return req->result;
}

ssize_t coroutine_fn qk_co_host_preadv(int fd, const struct iovec *iov, int iovcnt, uint64_t off)
{
    QkAioReq req = {.op = QK_AIO_READ, .fd = fd, .iov = iov, .iovcnt = iovcnt, .off = off};
    return submit(&req);
}

ssize_t coroutine_fn qk_co_host_pwritev(int fd, const struct iovec *iov, int iovcnt, uint64_t off)
{
    QkAioReq req = {.op = QK_AIO_WRITE, .fd = fd, .iov = iov, .iovcnt = iovcnt, .off = off};
    return submit(&req);
}

ssize_t coroutine_fn qk_co_host_pwritev_behind(int fd, const struct iovec *iov, int iovcnt, uint64_t off)
{
    QkAioReq req = {.op = QK_AIO_WRITE, .fd = fd, .iov = iov, .iovcnt = iovcnt, .off = off, .write_behind = true};
    return submit(&req);
}

ssize_t coroutine_fn qk_co_host_rw_direct(int fd, bool write, const struct iovec *iov, int iovcnt,
                                          uint64_t off)
{
    QkAioReq req = {.op = write ? QK_AIO_WRITE : QK_AIO_READ, .fd = fd, .iov = iov, .iovcnt = iovcnt,
                    .off = off, .direct = true};
    return submit(&req);
}

int coroutine_fn qk_co_host_fdatasync(int fd)
{
    QkAioReq req = {.op = QK_AIO_FDATASYNC, .fd = fd};
    return (int)submit(&req);
}

int coroutine_fn qk_co_host_fallocate(int fd, int mode, uint64_t off, uint64_t len)
{
    QkAioReq req = {.op = QK_AIO_FALLOCATE, .fd = fd, .mode = mode, .off = off, .len = len};
    return (int)submit(&req);
}

int coroutine_fn qk_co_host_ftruncate(int fd, uint64_t len)
{
    QkAioReq req = {.op = QK_AIO_FTRUNCATE, .fd = fd, .len = len};
    return (int)submit(&req);
}
