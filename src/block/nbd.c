/*
 * The "nbd" protocol driver: a remote NBD export (nbd://HOST:PORT/NAME,
 * nbd+unix:///NAME?socket=PATH) as a block node, through libnbd's
 * asynchronous API. Many requests are in flight at once: each request
 * coroutine submits its command and yields; a reader coroutine feeds the
 * socket's readability to libnbd (which runs the completion callbacks), a
 * writer coroutine does the same for writability when libnbd has bytes
 * queued. Nothing here blocks the event loop, so a daemon may even serve
 * and consume an export in the same process.
 *
 * Owns: the libnbd handle and its socket. Must not know about formats.
 */
#include "block/block.h"
#include "aio/loop.h"
#include "block/nbd_lib.h"
#include "common/checked.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#define CONNECT_TIMEOUT_NS (30LL * 1000 * 1000 * 1000)
#define DISCONNECT_TIMEOUT_NS (1LL * 1000 * 1000 * 1000)
#define DEFAULT_MAX_REQUEST (32u << 20)
/* Commands without payload (zero, trim, block status) carry a 32-bit
 * length; stay well under it and aligned. */
#define MAX_NOPAYLOAD_REQUEST (1u << 30)

typedef struct NbdState {
    struct nbd_handle *h;
    int fd;
    uint64_t size;
    uint32_t max_request;
    bool can_fua, can_zero, can_fast_zero, can_trim, can_flush, base_alloc;
    bool closing;
    unsigned helpers;           /* reader and writer coroutines running */
    QkCoQueue reader_wake, writer_wake, helpers_done;
} NbdState;

typedef struct NbdReq {
    QkCoroutine *co;
    bool done;
    bool waiting;
    int error;                  /* positive errno from libnbd */
    bool got_extent;
    uint32_t ext_len, ext_flags;
} NbdReq;

static int libnbd_errno(void)
{
    int e = nbd_get_errno();
    return e > 0 ? -e : -EIO;
}

static void kick_helpers(NbdState *s)
{
    qk_co_queue_wake_all(&s->reader_wake);
    unsigned dir = nbd_aio_get_direction(s->h);
    if (dir & LIBNBD_AIO_DIRECTION_WRITE) {
        qk_co_queue_wake_all(&s->writer_wake);
    }
}

static void coroutine_fn reader_entry(void *opaque)
{
    NbdState *s = opaque;
    while (!s->closing) {
        if (!(nbd_aio_get_direction(s->h) & LIBNBD_AIO_DIRECTION_READ) || nbd_aio_is_dead(s->h) ||
            nbd_aio_is_closed(s->h)) {
            qk_co_queue_wait(&s->reader_wake);
            continue;
        }
        if (qk_co_wait_fd(s->fd, POLLIN, -1) < 0) {
            continue; /* cancelled: re-check closing */
        }
        /* On failure libnbd has failed every command in flight with an
         * error already; later submissions fail at once. */
        nbd_aio_notify_read(s->h);
        kick_helpers(s);
    }
    s->helpers--;
    qk_co_queue_wake_all(&s->helpers_done);
}

static void coroutine_fn writer_entry(void *opaque)
{
    NbdState *s = opaque;
    while (!s->closing) {
        if (!(nbd_aio_get_direction(s->h) & LIBNBD_AIO_DIRECTION_WRITE) || nbd_aio_is_dead(s->h)) {
            qk_co_queue_wait(&s->writer_wake);
            continue;
        }
        if (qk_co_wait_fd(s->fd, POLLOUT, -1) < 0) {
            continue;
        }
        nbd_aio_notify_write(s->h);
        qk_co_queue_wake_all(&s->reader_wake);
    }
    s->helpers--;
    qk_co_queue_wake_all(&s->helpers_done);
}

static int complete_cb(void *opaque, int *error)
{
    NbdReq *r = opaque;
    r->done = true;
    r->error = *error;
    /* Only a coroutine that has yielded may be woken: the callback can
     * also run inside the submitting call itself. */
    if (r->waiting) {
        qk_coroutine_wake(r->co);
    }
    return 1;
}

static int extent_cb(void *opaque, const char *ctx, uint64_t offset, uint32_t *entries,
                     size_t nr, int *error)
{
    (void)offset;
    (void)error;
    NbdReq *r = opaque;
    if (!r->got_extent && nr >= 2 && strcmp(ctx, LIBNBD_CONTEXT_BASE_ALLOCATION) == 0) {
        r->got_extent = true;
        r->ext_len = entries[0];
        r->ext_flags = entries[1];
    }
    return 0;
}

/* Waits for a submitted command; cookie < 0 means submission failed. */
static int coroutine_fn finish(NbdState *s, NbdReq *r, int64_t cookie)
{
    if (cookie < 0) {
        return libnbd_errno();
    }
    kick_helpers(s);
    while (!r->done) {
        r->waiting = true;
        qk_coroutine_yield();
        r->waiting = false;
    }
    return r->error ? -r->error : 0;
}

#define COMPLETION(r) ((nbd_completion_callback){.callback = complete_cb, .user_data = (r)})

static int check_range(NbdState *s, uint64_t off, uint64_t bytes, int err)
{
    return qk_range_within(off, bytes, s->size) ? 0 : err;
}

/* Where [off, off+len) of q is one buffer, returns it; else NULL. */
static void *contiguous(QkIov *q, size_t off, size_t len)
{
    for (int i = 0; i < q->niov; i++) {
        if (off < q->iov[i].iov_len) {
            return off + len <= q->iov[i].iov_len ? (char *)q->iov[i].iov_base + off : NULL;
        }
        off -= q->iov[i].iov_len;
    }
    return NULL;
}

static int coroutine_fn qnbd_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                   size_t qiov_off, int flags)
{
    (void)flags;
    NbdState *s = bs->opaque;
    int r = check_range(s, off, bytes, -EINVAL);
    for (uint64_t done = 0; r == 0 && done < bytes;) {
        size_t n = (size_t)QK_MIN(bytes - done, (uint64_t)s->max_request);
        void *buf = contiguous(qiov, qiov_off + done, n);
        void *bounce = NULL;
        if (!buf) {
            buf = bounce = malloc(n);
            if (!bounce) {
                return -ENOMEM;
            }
        }
        NbdReq req = {.co = qk_coroutine_self()};
        r = finish(s, &req, nbd_aio_pread(s->h, buf, n, off + done, COMPLETION(&req), 0));
        if (bounce) {
            if (r == 0) {
                qk_iov_from_buf(qiov, qiov_off + done, bounce, n);
            }
            free(bounce);
        }
        done += n;
    }
    return r;
}

static int coroutine_fn qnbd_flush(QkBlock *bs)
{
    NbdState *s = bs->opaque;
    if (!s->can_flush) {
        return 0;
    }
    NbdReq req = {.co = qk_coroutine_self()};
    return finish(s, &req, nbd_aio_flush(s->h, COMPLETION(&req), 0));
}

static int coroutine_fn qnbd_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                    size_t qiov_off, int flags)
{
    NbdState *s = bs->opaque;
    int r = check_range(s, off, bytes, -ENOSPC);
    uint32_t nflags = (flags & QK_REQ_FUA) && s->can_fua ? LIBNBD_CMD_FLAG_FUA : 0;
    for (uint64_t done = 0; r == 0 && done < bytes;) {
        size_t n = (size_t)QK_MIN(bytes - done, (uint64_t)s->max_request);
        void *buf = contiguous(qiov, qiov_off + done, n);
        void *bounce = NULL;
        if (!buf) {
            buf = bounce = malloc(n);
            if (!bounce) {
                return -ENOMEM;
            }
            qk_iov_to_buf(qiov, qiov_off + done, bounce, n);
        }
        NbdReq req = {.co = qk_coroutine_self()};
        r = finish(s, &req, nbd_aio_pwrite(s->h, buf, n, off + done, COMPLETION(&req), nflags));
        free(bounce);
        done += n;
    }
    if (r == 0 && (flags & QK_REQ_FUA) && !nflags) {
        r = qnbd_flush(bs);
    }
    return r;
}

static int coroutine_fn qnbd_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    NbdState *s = bs->opaque;
    if (!s->can_zero || ((flags & QK_REQ_NO_FALLBACK) && !s->can_fast_zero)) {
        return -ENOTSUP;
    }
    int r = check_range(s, off, bytes, -ENOSPC);
    uint32_t nflags = (flags & QK_REQ_MAY_UNMAP) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE;
    nflags |= (flags & QK_REQ_NO_FALLBACK) ? LIBNBD_CMD_FLAG_FAST_ZERO : 0;
    nflags |= (flags & QK_REQ_FUA) && s->can_fua ? LIBNBD_CMD_FLAG_FUA : 0;
    for (uint64_t done = 0; r == 0 && done < bytes;) {
        uint64_t n = QK_MIN(bytes - done, (uint64_t)MAX_NOPAYLOAD_REQUEST);
        NbdReq req = {.co = qk_coroutine_self()};
        r = finish(s, &req, nbd_aio_zero(s->h, n, off + done, COMPLETION(&req), nflags));
        done += n;
    }
    if (r == 0 && (flags & QK_REQ_FUA) && !s->can_fua) {
        r = qnbd_flush(bs);
    }
    return r;
}

static int coroutine_fn qnbd_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    NbdState *s = bs->opaque;
    if (!s->can_trim) {
        return -ENOTSUP;
    }
    int r = check_range(s, off, bytes, -ENOSPC);
    for (uint64_t done = 0; r == 0 && done < bytes;) {
        uint64_t n = QK_MIN(bytes - done, (uint64_t)MAX_NOPAYLOAD_REQUEST);
        NbdReq req = {.co = qk_coroutine_self()};
        r = finish(s, &req, nbd_aio_trim(s->h, n, off + done, COMPLETION(&req), 0));
        done += n;
    }
    return r;
}

static int coroutine_fn qnbd_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                         uint64_t *map, QkBlock **file)
{
    NbdState *s = bs->opaque;
    /* Bytes live at the same offset of the export, as in a host file. */
    *map = off;
    *file = bs;
    if (!s->base_alloc) {
        *pnum = bytes;
        return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
    }
    uint64_t n = QK_MIN(bytes, (uint64_t)MAX_NOPAYLOAD_REQUEST);
    NbdReq req = {.co = qk_coroutine_self()};
    nbd_extent_callback ecb = {.callback = extent_cb, .user_data = &req};
    int r = finish(s, &req, nbd_aio_block_status(s->h, n, off, ecb, COMPLETION(&req),
                                                 LIBNBD_CMD_FLAG_REQ_ONE));
    if (r < 0) {
        return r;
    }
    if (!req.got_extent || req.ext_len == 0) {
        return -EIO; /* the server broke its promise of base:allocation */
    }
    *pnum = QK_MIN((uint64_t)req.ext_len, bytes);
    int ret = QK_BS_OFFSET_VALID;
    ret |= (req.ext_flags & LIBNBD_STATE_HOLE) ? 0 : QK_BS_DATA | QK_BS_ALLOCATED;
    if (req.ext_flags & LIBNBD_STATE_ZERO) {
        ret |= QK_BS_ZERO;
    }
    return ret;
}

static int64_t qnbd_get_length(QkBlock *bs)
{
    NbdState *s = bs->opaque;
    return (int64_t)s->size;
}

/* Drives libnbd through connecting and the handshake without blocking. */
static int coroutine_fn connect_handle(NbdState *s, const char *uri, QkError *err)
{
    if (nbd_aio_connect_uri(s->h, uri) < 0) {
        return qk_error_set(err, libnbd_errno(), "Could not connect to '%s': %s", uri, nbd_get_error());
    }
    int64_t deadline = qk_clock_ns() + CONNECT_TIMEOUT_NS;
    while (nbd_aio_is_connecting(s->h)) {
        int fd = nbd_aio_get_fd(s->h);
        unsigned dir = nbd_aio_get_direction(s->h);
        int64_t left = deadline - qk_clock_ns();
        if (fd < 0 || left <= 0) {
            return qk_error_set(err, -ETIMEDOUT, "Could not connect to '%s': %s", uri,
                                fd < 0 ? nbd_get_error() : "timed out");
        }
        bool w = (dir & LIBNBD_AIO_DIRECTION_WRITE) != 0;
        int r = qk_co_wait_fd(fd, w ? POLLOUT : POLLIN, left);
        if (r == -ETIMEDOUT) {
            continue;
        }
        if ((w ? nbd_aio_notify_write(s->h) : nbd_aio_notify_read(s->h)) < 0) {
            break;
        }
    }
    if (!nbd_aio_is_ready(s->h)) {
        const char *msg = nbd_get_error();
        return qk_error_set(err, -ECONNREFUSED, "Could not connect to '%s': %s", uri,
                            msg ? msg : "handshake failed");
    }
    s->fd = nbd_aio_get_fd(s->h);
    return 0;
}

static int coroutine_fn qnbd_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    NbdState *s = bs->opaque;
    s->fd = -1;
    qk_co_queue_init(&s->reader_wake);
    qk_co_queue_init(&s->writer_wake);
    qk_co_queue_init(&s->helpers_done);
    int lr = qk_nbd_lib_load(err);
    if (lr < 0) {
        return lr;
    }
    s->h = nbd_create();
    if (!s->h) {
        return qk_error_set(err, -ENOMEM, "Could not create NBD handle: %s", nbd_get_error());
    }
    nbd_add_meta_context(s->h, LIBNBD_CONTEXT_BASE_ALLOCATION);
    int r = connect_handle(s, bs->filename, err);
    if (r == 0) {
        int64_t size = nbd_get_size(s->h);
        if (size < 0) {
            r = qk_error_set(err, libnbd_errno(), "Could not get the size of '%s'", bs->filename);
        } else {
            s->size = (uint64_t)size;
        }
    }
    if (r == 0 && (opts->flags & QK_OPEN_RDWR) && nbd_is_read_only(s->h) == 1) {
        r = qk_error_set(err, -EACCES, "NBD export '%s' is read-only", bs->filename);
    }
    if (r < 0) {
        nbd_close(s->h);
        s->h = NULL;
        return r;
    }
    s->can_fua = nbd_can_fua(s->h) == 1;
    s->can_zero = nbd_can_zero(s->h) == 1;
    s->can_fast_zero = nbd_can_fast_zero(s->h) == 1;
    s->can_trim = nbd_can_trim(s->h) == 1;
    s->can_flush = nbd_can_flush(s->h) == 1;
    s->base_alloc = nbd_can_meta_context(s->h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    int64_t maxb = nbd_get_block_size(s->h, LIBNBD_SIZE_MAXIMUM);
    s->max_request = maxb > 0 ? (uint32_t)QK_MIN(maxb, (int64_t)DEFAULT_MAX_REQUEST) : DEFAULT_MAX_REQUEST;
    int64_t minb = nbd_get_block_size(s->h, LIBNBD_SIZE_MINIMUM);
    bs->request_alignment = minb > 1 && qk_is_pow2((uint64_t)minb) ? (uint32_t)minb : 1;
    bs->size = s->size;
    s->helpers = 2;
    qk_coroutine_wake(qk_coroutine_create(reader_entry, s));
    qk_coroutine_wake(qk_coroutine_create(writer_entry, s));
    return 0;
}

static int coroutine_fn qnbd_close(QkBlock *bs)
{
    NbdState *s = bs->opaque;
    if (!s->h) {
        return 0;
    }
    s->closing = true;
    qk_co_queue_wake_all(&s->reader_wake);
    qk_co_queue_wake_all(&s->writer_wake);
    qk_loop_cancel_fd_wait(qk_loop_get(), s->fd);
    while (s->helpers > 0) {
        qk_co_queue_wait(&s->helpers_done);
    }
    /* Say goodbye properly (NBD_CMD_DISC), but never wait long for it. */
    if (nbd_aio_is_ready(s->h) && nbd_aio_disconnect(s->h, 0) == 0) {
        int64_t deadline = qk_clock_ns() + DISCONNECT_TIMEOUT_NS;
        while ((nbd_aio_get_direction(s->h) & LIBNBD_AIO_DIRECTION_WRITE) &&
               !nbd_aio_is_dead(s->h) && !nbd_aio_is_closed(s->h)) {
            int64_t left = deadline - qk_clock_ns();
            if (left <= 0 || qk_co_wait_fd(s->fd, POLLOUT, left) < 0) {
                break;
            }
            nbd_aio_notify_write(s->h);
        }
    }
    nbd_close(s->h);
    s->h = NULL;
    return 0;
}

static void qnbd_get_info(QkBlock *bs, QkImageInfo *info)
{
    (void)bs;
    info->actual_size = -1;
}

const QkBlockDriver qk_drv_nbd = {
    .format_name = "nbd",
    .instance_size = sizeof(NbdState),
    .is_protocol = true,
    .co_open = qnbd_open,
    .co_close = qnbd_close,
    .co_preadv = qnbd_preadv,
    .co_pwritev = qnbd_pwritev,
    .co_pwrite_zeroes = qnbd_pwrite_zeroes,
    .co_pdiscard = qnbd_pdiscard,
    .co_flush = qnbd_flush,
    .co_block_status = qnbd_block_status,
    .get_length = qnbd_get_length,
    .get_info = qnbd_get_info,
};
