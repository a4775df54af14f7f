/*
 * The "raw" format driver: the image is the file's bytes. Every request
 * passes straight to the protocol child.
 */
#include "block/block.h"

#include <string.h>

static int coroutine_fn raw_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    (void)opts;
    int64_t len = qk_block_length(bs->file);
    if (len < 0) {
        return qk_error_set_errno(err, (int)len, "Could not get size of '%s'", bs->filename);
    }
    bs->size = (uint64_t)len;
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

static int coroutine_fn raw_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                    size_t qiov_off, int flags)
{
    return qk_co_pwritev(bs->file, off, bytes, qiov, qiov_off, flags);
}

static int coroutine_fn raw_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    return qk_co_pwrite_zeroes(bs->file, off, bytes, flags);
}

static int coroutine_fn raw_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
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
            r = QK_BS_ZERO | QK_BS_ALLOCATED;
            *pnum = bytes;
        }
    }
    return r;
}

static int coroutine_fn raw_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    int r = qk_co_truncate(bs->file, size, prealloc, err);
    if (r == 0) {
        bs->size = size;
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
