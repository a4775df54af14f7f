/*
 * The transmission phase: one coroutine reads requests in order (and the
 * payload of writes, which must come off the socket in order), then hands
 * each request to a coroutine of its own so slow I/O never holds up the
 * next request. Replies go out under the client's send lock, in whatever
 * order the I/O completes.
 *
 * Owns: request validation, mapping NBD commands to block requests, reply
 * encoding. Must not know about option haggling or listeners.
 */
#include "nbd/proto.h"
#include "nbd/server_int.h"
#include "aio/coroutine.h"
#include "block/dirty_bitmap.h"
#include "common/checked.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Reads at least this long ask the image where its holes are and send
 * them as hole chunks; shorter ones are cheaper to just read. */
#define SPARSE_READ_MIN (64u * 1024)
#define MAX_READ_SEGMENTS 64
#define MAX_EXTENTS 1024

typedef struct Req {
    QkNbdClient *c;
    QkNbdRequest r;
    void *buf;                  /* write payload */
    int early_error;            /* decided while reading (oversized write) */
    uint64_t bytes;             /* data buffered for it: payload or read reply */
} Req;

/* Data one client may have buffered at once (payloads being written and
 * replies being read), whatever its queue depth: twice the largest
 * request, so one always fits. Without it 64 reads of 32 MiB cost 2 GiB. */
#define CLIENT_BYTE_BUDGET (2ULL * QK_NBD_MAX_PAYLOAD)

static int coroutine_fn send_iov(QkNbdClient *c, struct iovec *iov, int n)
{
    if (c->dead) {
        return -EPIPE;
    }
    qk_co_mutex_lock(&c->send_lock);
    int r = c->dead ? -EPIPE : qk_co_sock_writev(c->fd, iov, n);
    qk_co_mutex_unlock(&c->send_lock);
    if (r < 0 && !c->dead) {
        /* The peer is gone: stop the reader too. */
        c->dead = true;
        shutdown(c->fd, SHUT_RDWR);
    }
    return r;
}

static int coroutine_fn send_simple(QkNbdClient *c, uint64_t cookie, int err,
                                    void *data, uint32_t len)
{
    uint8_t h[NBD_SIMPLE_REPLY_SIZE];
    qk_nbd_simple_reply(h, qk_nbd_errno_to_wire(err), cookie);
    struct iovec iov[2] = {{h, sizeof(h)}, {data, len}};
    return send_iov(c, iov, err == 0 && len ? 2 : 1);
}

static int coroutine_fn send_error_chunk(QkNbdClient *c, uint64_t cookie, int err)
{
    char msg[128];
    snprintf(msg, sizeof(msg), "%s", strerror(err < 0 ? -err : err));
    uint16_t mlen = (uint16_t)strlen(msg);
    uint8_t h[NBD_CHUNK_HEADER_SIZE + 6];
    qk_nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie, 6u + mlen);
    qk_be32_put(h + NBD_CHUNK_HEADER_SIZE, qk_nbd_errno_to_wire(err));
    qk_be16_put(h + NBD_CHUNK_HEADER_SIZE + 4, mlen);
    struct iovec iov[2] = {{h, sizeof(h)}, {msg, mlen}};
    return send_iov(c, iov, 2);
}

/* An error for any command, in the form the negotiated mode requires. */
static int coroutine_fn send_error(QkNbdClient *c, const QkNbdRequest *r, int err)
{
    if (c->structured && (r->type == NBD_CMD_READ || r->type == NBD_CMD_BLOCK_STATUS)) {
        return send_error_chunk(c, r->cookie, err);
    }
    return send_simple(c, r->cookie, err, NULL, 0);
}

static bool is_write_type(uint16_t type)
{
    return type == NBD_CMD_WRITE || type == NBD_CMD_TRIM || type == NBD_CMD_WRITE_ZEROES;
}

/* Checks a request against the export; 0 or the -errno to reply with. */
static int validate(QkNbdClient *c, const QkNbdRequest *r)
{
    /* proto.md: once NBD_FLAG_SEND_FUA is advertised (always, here) FUA
     * must be accepted on every command, if only by ignoring it, since
     * existing clients set it on reads and flushes too. */
    uint16_t allowed = NBD_CMD_FLAG_FUA;
    switch (r->type) {
    case NBD_CMD_READ: allowed |= c->structured ? NBD_CMD_FLAG_DF : 0; break;
    case NBD_CMD_WRITE:
    case NBD_CMD_FLUSH:
    case NBD_CMD_TRIM:
    case NBD_CMD_CACHE:
        break;
    case NBD_CMD_WRITE_ZEROES: allowed |= NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO; break;
    case NBD_CMD_BLOCK_STATUS: allowed |= NBD_CMD_FLAG_REQ_ONE; break;
    default:
        return -EINVAL;
    }
    if (r->flags & ~allowed) {
        return -EINVAL;
    }
    if ((r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) && r->length > QK_NBD_MAX_PAYLOAD) {
        return -EINVAL;
    }
    if (is_write_type(r->type) && c->exp->readonly) {
        return -EPERM;
    }
    if (r->type == NBD_CMD_BLOCK_STATUS && ((!c->base_alloc && !c->alloc_depth && !c->nbitmaps) || r->length == 0)) {
        return -EINVAL;
    }
    int64_t size = qk_block_length(c->exp->bs);
    if (r->type != NBD_CMD_FLUSH && (size < 0 || !qk_range_within(r->offset, r->length, (uint64_t)size))) {
        /* proto.md: writes (and zero writes) past the end are ENOSPC,
         * everything else, a trim too, EINVAL. */
        return r->type == NBD_CMD_WRITE || r->type == NBD_CMD_WRITE_ZEROES ? -ENOSPC : -EINVAL;
    }
    return 0;
}

typedef struct Segment {
    uint64_t off;
    uint32_t len;
    bool hole;
} Segment;

/* Splits [off, off+len) into data and hole segments; the tail beyond
 * MAX_READ_SEGMENTS is one data segment. Returns the count or -errno. */
static int coroutine_fn map_read(QkBlock *bs, uint64_t off, uint32_t len, Segment *seg)
{
    int n = 0;
    uint64_t pos = off, end = off + len;
    while (pos < end) {
        uint64_t pnum = end - pos;
        bool hole = false;
        if (n < MAX_READ_SEGMENTS - 1) {
            int r = qk_co_block_status_above(bs, pos, end - pos, &pnum, NULL);
            if (r < 0) {
                return r;
            }
            if (pnum == 0) {
                pnum = end - pos;
            }
            hole = (r & QK_BS_ZERO) || !(r & QK_BS_ALLOCATED);
        }
        if (n > 0 && seg[n - 1].hole == hole) {
            seg[n - 1].len += (uint32_t)pnum;
        } else {
            seg[n++] = (Segment){pos, (uint32_t)pnum, hole};
        }
        pos += pnum;
    }
    return n;
}

static int coroutine_fn do_read(Req *q, QkBlock *bs)
{
    QkNbdClient *c = q->c;
    const QkNbdRequest *r = &q->r;
    if (r->length == 0) {
        if (!c->structured) {
            return send_simple(c, r->cookie, 0, NULL, 0);
        }
        uint8_t h[NBD_CHUNK_HEADER_SIZE];
        qk_nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, r->cookie, 0);
        struct iovec iov = {h, sizeof(h)};
        return send_iov(c, &iov, 1);
    }
    /* Large requests in huge pages (util/iov.c): from scattered 4 KiB
     * pages a direct read of several MiB reached the disk in pieces. */
    uint8_t *buf = qk_io_buf_alloc(qk_block_buf_align(bs), r->length);
    if (!buf) {
        return send_error(c, r, -ENOMEM);
    }
    Segment seg[MAX_READ_SEGMENTS];
    int nseg = 1;
    seg[0] = (Segment){r->offset, r->length, false};
    int ret = 0;
    if (c->structured && r->length >= SPARSE_READ_MIN && !(r->flags & NBD_CMD_FLAG_DF)) {
        ret = nseg = map_read(bs, r->offset, r->length, seg);
    }
    for (int i = 0; ret >= 0 && i < nseg; i++) {
        if (!seg[i].hole) {
            ret = qk_co_pread(bs, seg[i].off, seg[i].len, buf + (seg[i].off - r->offset), 0);
        }
    }
    if (ret < 0) {
        free(buf);
        return send_error(c, r, ret);
    }
    if (!c->structured) {
        ret = send_simple(c, r->cookie, 0, buf, r->length);
        free(buf);
        return ret;
    }
    /* One writev for every chunk: header, offset (and hole size) or data. */
    uint8_t hdr[MAX_READ_SEGMENTS][NBD_CHUNK_HEADER_SIZE + 12];
    struct iovec iov[MAX_READ_SEGMENTS * 2];
    int niov = 0;
    for (int i = 0; i < nseg; i++) {
        uint16_t fl = i == nseg - 1 ? NBD_REPLY_FLAG_DONE : 0;
        if (seg[i].hole) {
            qk_nbd_chunk_header(hdr[i], fl, NBD_REPLY_TYPE_OFFSET_HOLE, r->cookie, 12);
            qk_be64_put(hdr[i] + NBD_CHUNK_HEADER_SIZE, seg[i].off);
            qk_be32_put(hdr[i] + NBD_CHUNK_HEADER_SIZE + 8, seg[i].len);
            iov[niov++] = (struct iovec){hdr[i], NBD_CHUNK_HEADER_SIZE + 12};
        } else {
            qk_nbd_chunk_header(hdr[i], fl, NBD_REPLY_TYPE_OFFSET_DATA, r->cookie, 8 + seg[i].len);
            qk_be64_put(hdr[i] + NBD_CHUNK_HEADER_SIZE, seg[i].off);
            iov[niov++] = (struct iovec){hdr[i], NBD_CHUNK_HEADER_SIZE + 8};
            iov[niov++] = (struct iovec){buf + (seg[i].off - r->offset), seg[i].len};
        }
    }
    ret = send_iov(c, iov, niov);
    free(buf);
    return ret;
}

/* One BLOCK_STATUS chunk: id, then n (length, flags) extents in out. */
static int coroutine_fn send_status(QkNbdClient *c, const QkNbdRequest *r, uint32_t id, uint8_t *out, unsigned n,
                                    bool last)
{
    uint32_t plen = 4 + 8 * n;
    qk_be32_put(out, id);
    uint8_t h[NBD_CHUNK_HEADER_SIZE];
    qk_nbd_chunk_header(h, last ? NBD_REPLY_FLAG_DONE : 0, NBD_REPLY_TYPE_BLOCK_STATUS, r->cookie, plen);
    struct iovec iov[2] = {{h, sizeof(h)}, {out, plen}};
    return send_iov(c, iov, 2);
}

/* Appends an extent, merged with the last one when the flags agree;
 * false when out is full. */
static bool add_extent(uint8_t *out, unsigned *n, unsigned max, uint64_t len, uint32_t fl)
{
    if (*n > 0 && qk_be32_get(out + 4 + 8 * (*n - 1) + 4) == fl) {
        uint8_t *d = out + 4 + 8 * (*n - 1);
        qk_be32_put(d, qk_be32_get(d) + (uint32_t)len);
        return true;
    }
    if (*n == max) {
        return false;
    }
    uint8_t *d = out + 4 + 8 * (*n)++;
    qk_be32_put(d, (uint32_t)len);
    qk_be32_put(d + 4, fl);
    return true;
}

/* base:allocation extents of [offset, offset + length), or with depth
 * the qemu:allocation-depth ones (0: nowhere in the chain, 1: this
 * image, 2: its backing file, ...). */
static int coroutine_fn alloc_extents(QkBlock *bs, const QkNbdRequest *r, bool depth_ctx, uint8_t *out,
                                      unsigned max, unsigned *n)
{
    uint64_t pos = r->offset, end = r->offset + r->length;
    *n = 0;
    while (pos < end) {
        uint64_t pnum;
        int depth;
        int ret = qk_co_block_status_above(bs, pos, end - pos, &pnum, &depth);
        if (ret < 0) {
            return ret;
        }
        if (pnum == 0) {
            pnum = end - pos;
        }
        uint32_t fl = 0;
        if (depth_ctx) {
            fl = (ret & QK_BS_ALLOCATED) ? (uint32_t)depth + 1 : 0;
        } else if (!(ret & QK_BS_ALLOCATED)) {
            fl = NBD_STATE_HOLE | NBD_STATE_ZERO; /* nothing in the chain: reads as zeros */
        } else {
            fl |= (ret & QK_BS_DATA) ? 0 : NBD_STATE_HOLE;
            fl |= (ret & QK_BS_ZERO) ? NBD_STATE_ZERO : 0;
        }
        if (!add_extent(out, n, max, pnum, fl)) {
            break;
        }
        pos += pnum;
    }
    return 0;
}

/* qemu:dirty-bitmap extents: dirty (1) or clean (0) runs of the bitmap.
 * -ENOENT when it was removed before the client began transmission:
 * "all clean" would tell a backup client that nothing changed. */
static int bitmap_extents(QkDirtyBitmap *bm, const QkNbdRequest *r, uint8_t *out, unsigned max, unsigned *n)
{
    uint64_t pos = r->offset, end = r->offset + r->length;
    *n = 0;
    if (!bm) {
        return -ENOENT;
    }
    while (pos < end) {
        bool dirty = qk_dirty_bitmap_get(bm, pos);
        uint64_t next = dirty ? qk_dirty_bitmap_next_clean(bm, pos) : qk_dirty_bitmap_next_dirty(bm, pos);
        uint64_t stop = next == UINT64_MAX || next > end ? end : next;
        if (stop <= pos) {
            stop = end;
        }
        if (!add_extent(out, n, max, stop - pos, dirty ? NBD_STATE_DIRTY : 0)) {
            break;
        }
        pos = stop;
    }
    return 0;
}

/* Takes the node from the export for each context: sending a chunk may
 * wait on the client, and a mirror may switch the export meanwhile and
 * close the node the request started on. */
static int coroutine_fn do_block_status(Req *q)
{
    QkNbdClient *c = q->c;
    const QkNbdRequest *r = &q->r;
    unsigned max = (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : MAX_EXTENTS;
    uint8_t *out = malloc(4 + 8 * (size_t)max);
    if (!out) {
        return send_error(c, r, -ENOMEM);
    }
    unsigned n;
    int ret = 0;
    for (int k = 0; ret == 0 && k < 2; k++) {
        if (!(k == 0 ? c->base_alloc : c->alloc_depth)) {
            continue;
        }
        ret = alloc_extents(c->exp->bs, r, k == 1, out, max, &n);
        if (ret < 0) {
            free(out);
            return send_error(c, r, ret);
        }
        bool last = c->nbitmaps == 0 && (k == 1 || !c->alloc_depth);
        ret = send_status(c, r, k == 0 ? QK_NBD_CTX_BASE : QK_NBD_CTX_DEPTH, out, n, last);
    }
    for (unsigned i = 0; ret == 0 && i < c->nbitmaps; i++) {
        int br = bitmap_extents(c->held ? c->held[i] : NULL, r, out, max, &n);
        if (br < 0) {
            /* Replies already sent for this request end with the error. */
            free(out);
            return send_error(c, r, br);
        }
        ret = send_status(c, r, QK_NBD_CTX_BITMAP0 + i, out, n, i + 1 == c->nbitmaps);
    }
    free(out);
    return ret;
}

/* NBD_CMD_CACHE: read the range so it is warm for the reads that follow. */
static int coroutine_fn do_cache(QkBlock *bs, uint64_t off, uint32_t len)
{
    uint32_t chunk = QK_MIN(len, 1u << 20);
    if (chunk == 0) {
        return 0;
    }
    void *buf = qk_aligned_alloc(qk_block_buf_align(bs), chunk);
    if (!buf) {
        return -ENOMEM;
    }
    int r = 0;
    for (uint64_t done = 0; r == 0 && done < len; done += chunk) {
        uint32_t n = (uint32_t)QK_MIN((uint64_t)chunk, len - done);
        r = qk_co_pread(bs, off + done, n, buf, 0);
    }
    free(buf);
    return r;
}

static void coroutine_fn handle(Req *q)
{
    QkNbdClient *c = q->c;
    const QkNbdRequest *r = &q->r;
    QkBlock *bs = c->exp->bs;
    int ret = q->early_error ? q->early_error : validate(c, r);
    if (ret < 0) {
        send_error(c, r, ret);
        return;
    }
    bool fua = (r->flags & NBD_CMD_FLAG_FUA) && is_write_type(r->type);
    switch (r->type) {
    case NBD_CMD_READ:
        do_read(q, bs);
        return;
    case NBD_CMD_BLOCK_STATUS:
        do_block_status(q);
        return;
    case NBD_CMD_WRITE:
        ret = qk_co_pwrite(bs, r->offset, r->length, q->buf, 0);
        break;
    case NBD_CMD_FLUSH:
        ret = qk_co_flush(bs);
        break;
    case NBD_CMD_TRIM:
        ret = qk_co_pdiscard(bs, r->offset, r->length);
        break;
    case NBD_CMD_WRITE_ZEROES: {
        int fl = (r->flags & NBD_CMD_FLAG_NO_HOLE) ? 0 : QK_REQ_MAY_UNMAP;
        fl |= (r->flags & NBD_CMD_FLAG_FAST_ZERO) ? QK_REQ_NO_FALLBACK : 0;
        ret = qk_co_pwrite_zeroes(bs, r->offset, r->length, fl);
        break;
    }
    case NBD_CMD_CACHE:
        ret = do_cache(bs, r->offset, r->length);
        break;
    }
    /* FUA as a flush of the whole node: it also makes the format's
     * metadata for this write stable, which a FUA data write alone would
     * not. Clients use FUA rarely, so the wider flush costs little. */
    if (ret == 0 && fua) {
        /* The export's node now: a write held by a mirror's switch went on
         * to the new node, and that is what must be stable. */
        ret = qk_co_flush(c->exp->bs);
    }
    send_simple(c, r->cookie, ret, NULL, 0);
}

static void coroutine_fn req_entry(void *opaque)
{
    Req *q = opaque;
    QkNbdClient *c = q->c;
    handle(q);
    free(q->buf);
    c->in_flight_bytes -= q->bytes;
    free(q);
    c->in_flight--;
    qk_co_queue_wake_one(&c->slot_wait);
    if (c->in_flight == 0) {
        qk_co_queue_wake_all(&c->idle);
    }
}

/* Reads a write's payload (or drops it when the request is refused
 * already, so the stream stays in step). Returns 0 or a socket error. */
static int coroutine_fn read_payload(QkNbdClient *c, Req *q)
{
    if (q->r.length > QK_NBD_MAX_PAYLOAD) {
        q->early_error = -EINVAL;
        return qk_co_sock_skip(c->rd, q->r.length);
    }
    if (q->r.length == 0) {
        return 0;
    }
    q->buf = qk_io_buf_alloc(qk_block_buf_align(c->exp->bs), q->r.length);
    if (!q->buf) {
        q->early_error = -ENOMEM;
        return qk_co_sock_skip(c->rd, q->r.length);
    }
    return qk_co_sock_read(c->rd, q->buf, q->r.length);
}

/* Pins the bitmaps behind the client's contexts for the connection's
 * life, as an export's bitmaps are pinned in QEMU: clear, remove, enable,
 * disable, merge into and backups refuse a busy bitmap. */
void qk_nbd_client_hold_bitmaps(QkNbdClient *c)
{
    if (c->nbitmaps == 0) {
        return;
    }
    c->held = calloc(c->nbitmaps, sizeof(*c->held));
    for (unsigned i = 0; c->held && i < c->nbitmaps; i++) {
        QkDirtyBitmap *bm = qk_dirty_bitmap_find(c->exp->bs, c->bitmaps[i]);
        if (bm && !bm->inconsistent) {
            bm->busy++;
            c->held[i] = bm;
        }
    }
}

void qk_nbd_client_release_bitmaps(QkNbdClient *c)
{
    for (unsigned i = 0; c->held && i < c->nbitmaps; i++) {
        if (c->held[i]) {
            c->held[i]->busy--;
        }
    }
    free(c->held);
    c->held = NULL;
}

void coroutine_fn qk_nbd_transmit(QkNbdClient *c)
{
    unsigned max = c->srv->max_in_flight;
    qk_nbd_client_hold_bitmaps(c);
    for (;;) {
        while (c->in_flight >= max && !c->closing && !c->dead) {
            qk_co_queue_wait(&c->slot_wait);
        }
        if (c->closing || c->dead) {
            break;
        }
        uint8_t h[NBD_REQUEST_SIZE];
        if (qk_co_sock_read(c->rd, h, sizeof(h)) < 0) {
            break;
        }
        QkNbdRequest r;
        if (qk_nbd_parse_request(h, &r) < 0) {
            break; /* lost framing: nothing after this can be trusted */
        }
        if (r.type == NBD_CMD_DISC) {
            break;
        }
        uint64_t need = (r.type == NBD_CMD_READ || r.type == NBD_CMD_WRITE) && r.length <= QK_NBD_MAX_PAYLOAD
                            ? r.length : 0;
        while (c->in_flight && c->in_flight_bytes + need > CLIENT_BYTE_BUDGET && !c->closing && !c->dead) {
            qk_co_queue_wait(&c->slot_wait);
        }
        if (c->closing || c->dead) {
            break;
        }
        Req *q = calloc(1, sizeof(*q));
        if (!q) {
            break;
        }
        q->c = c;
        q->r = r;
        if (r.type == NBD_CMD_WRITE && read_payload(c, q) < 0) {
            /* The client went away mid-payload: the write never started,
             * so the image has not seen a byte of it. */
            free(q->buf);
            free(q);
            break;
        }
        q->bytes = need;
        c->in_flight_bytes += need;
        c->in_flight++;
        qk_coroutine_enter(qk_coroutine_create(req_entry, q));
    }
    while (c->in_flight > 0) {
        qk_co_queue_wait(&c->idle);
    }
    qk_nbd_client_release_bitmaps(c);
}
