/*
 * The "raw" format driver: the image is the file's bytes. Every request
 * passes straight to the protocol child, except, on an image whose format
 * was guessed, a modification of its first bytes that would make the next
 * guess another format (head_modify).
 */
#include "block/block.h"
#include "aio/co_sync.h"
#include "common/checked.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct RawState {
    /* Serialises modifications of the first sector of a guessed image, so
     * each is judged against what the ones before it left (two partial
     * writes, each harmless alone, could otherwise build a header). */
    QkCoMutex head_lock;
} RawState;

/* The disk a raw image shows ends on a 512-byte sector, as in QEMU's block
 * layer: a partial last sector reads as zeros past the end of the file
 * (the protocol node gives zeros there), and a write into it extends the
 * file. Sizes beyond the last whole sector of 2^64 cannot be opened. */
static uint64_t sector_align(uint64_t len)
{
    return len % 512 ? len + (512 - len % 512) : len;
}

static int coroutine_fn raw_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    (void)opts;
    RawState *s = bs->opaque;
    qk_co_mutex_init(&s->head_lock);
    int64_t len = qk_block_length(bs->file);
    if (len < 0) {
        return qk_error_set_errno(err, (int)len, "Could not get size of '%s'", bs->filename);
    }
    bs->size = sector_align((uint64_t)len);
    bs->request_alignment = bs->file->request_alignment;
    return 0;
}

static int64_t raw_get_length(QkBlock *bs)
{
    return bs->size;
}

static int coroutine_fn raw_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                   size_t qiov_off, int flags)
{
    return qk_co_preadv(bs->file, off, bytes, qiov, qiov_off, flags);
}

enum { HEAD_WRITE, HEAD_ZEROES, HEAD_DISCARD };

static bool touches_head(const QkBlock *bs, uint64_t off, uint64_t bytes)
{
    return bs->format_probed && off < QK_PROBE_SIZE && bytes;
}

/* A modification of a guessed image's first sector (coroutine_fn: reads
 * the sector, then writes). The sector as it would be afterwards must
 * still be guessed raw, or the request fails with -EPERM. The part of a
 * write inside the sector is written from the copy that was judged, not
 * from the caller's buffer, which may change in between. A discard is
 * judged as if it zeroed its range, which is what a file's hole reads as. */
static int coroutine_fn head_modify(QkBlock *bs, int kind, uint64_t off, uint64_t bytes, QkIov *qiov,
                                    size_t qiov_off, int flags)
{
    RawState *s = bs->opaque;
    uint64_t head = QK_MIN(off + bytes, (uint64_t)QK_PROBE_SIZE) - off;
    /* A whole page, aligned: what a direct read of the start needs. */
    uint8_t *buf = qk_aligned_zalloc(4096, 4096);
    if (!buf) {
        return -ENOMEM;
    }
    qk_co_mutex_lock(&s->head_lock);
    int r = qk_co_pread(bs->file, 0, QK_PROBE_SIZE, buf, 0);
    if (r == -EINVAL || r == -ESPIPE) {
        r = 0; /* a file shorter than a sector: its start reads as zeroes */
        memset(buf, 0, QK_PROBE_SIZE);
    }
    if (r == 0) {
        if (kind == HEAD_WRITE) {
            qk_iov_to_buf(qiov, qiov_off, buf + off, head);
        } else {
            memset(buf + off, 0, head);
        }
        if (qk_block_probes_not_raw(buf)) {
            r = -EPERM;
        }
    }
    if (r == 0) {
        switch (kind) {
        case HEAD_WRITE:
            r = qk_co_pwrite(bs->file, off, head, buf + off, flags);
            if (r == 0 && bytes > head) {
                r = qk_co_pwritev(bs->file, off + head, bytes - head, qiov, qiov_off + head, flags);
            }
            break;
        case HEAD_ZEROES:
            r = qk_co_pwrite_zeroes(bs->file, off, bytes, flags);
            break;
        default:
            r = qk_co_pdiscard(bs->file, off, bytes);
            break;
        }
    }
    qk_co_mutex_unlock(&s->head_lock);
    free(buf);
    return r;
}

static int coroutine_fn raw_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                    size_t qiov_off, int flags)
{
    if (touches_head(bs, off, bytes)) {
        return head_modify(bs, HEAD_WRITE, off, bytes, qiov, qiov_off, flags);
    }
    return qk_co_pwritev(bs->file, off, bytes, qiov, qiov_off, flags);
}

static int coroutine_fn raw_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    if (touches_head(bs, off, bytes)) {
        return head_modify(bs, HEAD_ZEROES, off, bytes, NULL, 0, flags);
    }
    return qk_co_pwrite_zeroes(bs->file, off, bytes, flags);
}

static int coroutine_fn raw_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    if (touches_head(bs, off, bytes)) {
        return head_modify(bs, HEAD_DISCARD, off, bytes, NULL, 0, 0);
    }
    return qk_co_pdiscard(bs->file, off, bytes);
}

static int coroutine_fn raw_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                         uint64_t *map, QkBlock **file)
{
    int r = qk_co_block_status(bs->file, off, bytes, pnum, map, file);
    if (r >= 0) {
        /* Everything in a raw image belongs to this layer. */
        r |= QK_BS_ALLOCATED;
        if (r & QK_BS_EOF) {
            /* The tail of a partial last sector: zeros, still mapped 1:1. */
            r = QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
            *pnum = bytes;
            *map = off;
            *file = bs->file;
        }
    }
    return r;
}

static int coroutine_fn raw_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    int r = qk_co_truncate(bs->file, size, prealloc, err);
    if (r == 0) {
        bs->size = sector_align(size);
    }
    return r;
}

static int coroutine_fn raw_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    if (opts->backing_file) {
        return qk_error_set(err, -EINVAL, "raw images cannot have a backing file");
    }
    /* Whole 512-byte sectors, as QEMU creates them (create 15 gives 512). */
    QkCreateOptions o = *opts;
    if (o.size % 512) {
        if (o.size > UINT64_MAX - 512) {
            return qk_error_set(err, -EFBIG, "Image size too large");
        }
        o.size += 512 - o.size % 512;
    }
    return qk_co_protocol_create(filename, &o, err);
}

const QkBlockDriver qk_drv_raw = {
    .format_name = "raw",
    .instance_size = sizeof(RawState),
    .co_open = raw_open,
    .co_create = raw_create,
    .co_preadv = raw_preadv,
    .co_pwritev = raw_pwritev,
    .co_pwrite_zeroes = raw_pwrite_zeroes,
    .co_pdiscard = raw_pdiscard,
    .co_block_status = raw_block_status,
    .co_truncate = raw_truncate,
    .get_length = raw_get_length,
};
