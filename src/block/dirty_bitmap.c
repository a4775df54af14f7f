/*
 * Dirty bitmaps on block nodes: a list per node, each a QkHBitmap with one
 * bit per `granularity` bytes.
 */
#include "block/dirty_bitmap.h"
#include "block/block.h"
#include "common/checked.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

QkDirtyBitmap *qk_dirty_bitmap_add(QkBlock *bs, const char *name, uint64_t granularity, QkError *err)
{
    if (granularity < 512 || !qk_is_pow2(granularity) || granularity > (1ULL << 31)) {
        qk_error_set(err, -EINVAL, "Granularity must be a power of two between 512 and 2 GiB");
        return NULL;
    }
    if (name && qk_dirty_bitmap_find(bs, name)) {
        qk_error_set(err, -EEXIST, "Bitmap already exists: %s", name);
        return NULL;
    }
    int64_t len = qk_block_length(bs);
    if (len < 0) {
        qk_error_set_errno(err, (int)len, "Cannot get the size of '%s'", bs->filename);
        return NULL;
    }
    QkDirtyBitmap *bm = calloc(1, sizeof(*bm));
    if (!bm) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    bm->name = name ? strdup(name) : NULL;
    bm->granularity = granularity;
    bm->size = (uint64_t)len;
    bm->enabled = true;
    bm->bits = qk_hbitmap_new(QK_DIV_ROUND_UP((uint64_t)len, granularity));
    if (!bm->bits || (name && !bm->name)) {
        qk_hbitmap_free(bm->bits);
        free(bm->name);
        free(bm);
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    bm->next = bs->dirty_bitmaps;
    bs->dirty_bitmaps = bm;
    return bm;
}

QkDirtyBitmap *qk_dirty_bitmap_find(QkBlock *bs, const char *name)
{
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
        if (bm->name && strcmp(bm->name, name) == 0) {
            return bm;
        }
    }
    return NULL;
}

QkDirtyBitmap *qk_dirty_bitmap_add_persistent(QkBlock *bs, const char *name, uint64_t granularity,
                                              QkError *err)
{
    if (!name || !*name) {
        qk_error_set(err, -EINVAL, "Bitmap name cannot be empty");
        return NULL;
    }
    if (qk_dirty_bitmap_find(bs, name)) {
        qk_error_set(err, -EEXIST, "Bitmap already exists: %s", name);
        return NULL;
    }
    if (!bs->drv->bitmap_can_store) {
        qk_error_set(err, -ENOTSUP, "Can't store persistent bitmaps to %s: Operation not supported",
                     bs->filename);
        return NULL;
    }
    if (bs->drv->bitmap_can_store(bs, name, granularity, err) < 0) {
        return NULL;
    }
    QkDirtyBitmap *bm = qk_dirty_bitmap_add(bs, name, granularity, err);
    if (bm) {
        bm->persistent = true;
        bm->changed = true; /* new: the image must store it at close */
    }
    return bm;
}

QkDirtyBitmap *qk_dirty_bitmap_first(QkBlock *bs)
{
    return bs->dirty_bitmaps;
}

QkDirtyBitmap *qk_dirty_bitmap_next(QkDirtyBitmap *bm)
{
    return bm->next;
}

const char *qk_dirty_bitmap_name(const QkDirtyBitmap *bm)
{
    return bm->name;
}

uint64_t qk_dirty_bitmap_granularity(const QkDirtyBitmap *bm)
{
    return bm->granularity;
}

bool qk_dirty_bitmap_enabled(const QkDirtyBitmap *bm)
{
    return bm->enabled;
}

bool qk_dirty_bitmap_persistent(const QkDirtyBitmap *bm)
{
    return bm->persistent;
}

bool qk_dirty_bitmap_inconsistent(const QkDirtyBitmap *bm)
{
    return bm->inconsistent;
}

static void bm_free(QkDirtyBitmap *bm)
{
    qk_hbitmap_free(bm->bits);
    free(bm->name);
    free(bm);
}

int coroutine_fn qk_co_dirty_bitmap_begin_change(QkBlock *bs, QkDirtyBitmap *bm, QkError *err)
{
    if (bm->inconsistent) {
        return qk_error_set(err, -EINVAL, "Bitmap '%s' is inconsistent and cannot be used", bm->name);
    }
    if (bm->busy) {
        return qk_error_set(err, -EBUSY, "Bitmap '%s' is in use", bm->name);
    }
    if (!bs->drv->co_bitmap_begin_change) {
        return 0;
    }
    /* Busy while the image is updated: a remove (or a backup taking it)
     * from another caller in the meantime would leave ours pointing at
     * a freed bitmap, or change it under the backup. */
    bm->busy++;
    int r = bs->drv->co_bitmap_begin_change(bs, bm, err);
    bm->busy--;
    return r;
}

int qk_dirty_bitmap_remove(QkBlock *bs, QkDirtyBitmap *bm, QkError *err)
{
    if (bm->busy) {
        return qk_error_set(err, -EBUSY, "Bitmap '%s' is in use", bm->name ? bm->name : "(anonymous)");
    }
    for (QkDirtyBitmap **pp = &bs->dirty_bitmaps; *pp; pp = &(*pp)->next) {
        if (*pp == bm) {
            *pp = bm->next;
            bm_free(bm);
            return 0;
        }
    }
    return qk_error_set(err, -ENOENT, "Bitmap not found");
}

int coroutine_fn qk_co_dirty_bitmap_remove(QkBlock *bs, QkDirtyBitmap *bm, QkError *err)
{
    if (bm->busy) {
        return qk_error_set(err, -EBUSY, "Bitmap '%s' is in use", bm->name ? bm->name : "(anonymous)");
    }
    /* A stored bitmap leaves the image now, not at the close: a crash
     * in between would otherwise bring back a bitmap flagged as saved,
     * which missed every write made after it was removed from memory. */
    if (bm->persistent && bs->drv->co_bitmap_remove) {
        bm->busy++;
        int r = bs->drv->co_bitmap_remove(bs, bm, err);
        bm->busy--;
        if (r < 0) {
            return r;
        }
    }
    return qk_dirty_bitmap_remove(bs, bm, err);
}

void qk_dirty_bitmap_remove_all(QkBlock *bs)
{
    while (bs->dirty_bitmaps) {
        QkDirtyBitmap *bm = bs->dirty_bitmaps;
        bs->dirty_bitmaps = bm->next;
        bm_free(bm);
    }
}

void qk_dirty_bitmap_set_enabled(QkDirtyBitmap *bm, bool enabled)
{
    bm->changed |= bm->enabled != enabled;
    bm->enabled = enabled;
}

void qk_dirty_bitmap_clear(QkDirtyBitmap *bm)
{
    qk_hbitmap_reset_all(bm->bits);
    bm->changed = true;
}

int qk_dirty_bitmap_merge(QkDirtyBitmap *dst, const QkDirtyBitmap *src, QkError *err)
{
    if (dst->size != src->size) {
        return qk_error_set(err, -EINVAL,
                            "Bitmaps are of different sizes (destination size is %" PRIu64
                            ", source size is %" PRIu64 ") and can't be merged", dst->size, src->size);
    }
    if (dst->granularity == src->granularity) {
        qk_hbitmap_merge(dst->bits, src->bits);
    } else {
        /* Every dirty range of src, widened to dst's granularity. */
        for (uint64_t off = qk_dirty_bitmap_next_dirty(src, 0); off != UINT64_MAX && off < src->size;) {
            uint64_t end = qk_dirty_bitmap_next_clean(src, off);
            end = end == UINT64_MAX || end > src->size ? src->size : end;
            uint64_t first = off / dst->granularity;
            qk_hbitmap_set(dst->bits, first, QK_DIV_ROUND_UP(end, dst->granularity) - first);
            off = end < src->size ? qk_dirty_bitmap_next_dirty(src, end) : UINT64_MAX;
        }
    }
    dst->changed = true;
    return 0;
}

static void range_bits(const QkDirtyBitmap *bm, uint64_t off, uint64_t bytes, uint64_t *first, uint64_t *n)
{
    uint64_t end = off + bytes < off ? UINT64_MAX : off + bytes;
    *first = off / bm->granularity;
    *n = QK_DIV_ROUND_UP(end, bm->granularity) - *first;
}

void qk_dirty_bitmap_mark(QkDirtyBitmap *bm, uint64_t off, uint64_t bytes)
{
    if (bytes == 0) {
        return;
    }
    /* Every write marks every enabled bitmap: shifts, not divisions, and
     * nothing to do for a chunk already dirty (the common case). */
    unsigned g = (unsigned)__builtin_ctzll(bm->granularity);
    uint64_t last = off + bytes - 1 < off ? UINT64_MAX : off + bytes - 1;
    uint64_t first = off >> g, n = (last >> g) - first + 1;
    bm->marked_bytes += n << g;
    if (n == 1 && qk_hbitmap_get(bm->bits, first)) {
        return;
    }
    qk_hbitmap_set(bm->bits, first, n);
}

void qk_dirty_bitmap_reset(QkDirtyBitmap *bm, uint64_t off, uint64_t bytes)
{
    uint64_t first, n;
    if (bytes == 0) {
        return;
    }
    range_bits(bm, off, bytes, &first, &n);
    qk_hbitmap_reset(bm->bits, first, n);
}

bool qk_dirty_bitmap_get(const QkDirtyBitmap *bm, uint64_t off)
{
    return qk_hbitmap_get(bm->bits, off / bm->granularity);
}

uint64_t qk_dirty_bitmap_dirty_bytes(const QkDirtyBitmap *bm)
{
    uint64_t bytes = qk_hbitmap_count(bm->bits) * bm->granularity;
    /* The last chunk may be partial. */
    uint64_t nbits = qk_hbitmap_size(bm->bits);
    if (nbits && qk_hbitmap_get(bm->bits, nbits - 1) && bm->size % bm->granularity) {
        bytes -= bm->granularity - bm->size % bm->granularity;
    }
    return bytes;
}

uint64_t qk_dirty_bitmap_next_dirty(const QkDirtyBitmap *bm, uint64_t off)
{
    uint64_t b = qk_hbitmap_next_set(bm->bits, off / bm->granularity);
    return b == UINT64_MAX ? UINT64_MAX : b * bm->granularity;
}

uint64_t qk_dirty_bitmap_next_clean(const QkDirtyBitmap *bm, uint64_t off)
{
    uint64_t b = qk_hbitmap_next_zero(bm->bits, off / bm->granularity);
    return b == UINT64_MAX ? UINT64_MAX : b * bm->granularity;
}

void qk_dirty_bitmaps_mark_all(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
        if (bm->enabled) {
            qk_dirty_bitmap_mark(bm, off, bytes);
        }
    }
}

int qk_dirty_bitmaps_truncate(QkBlock *bs, uint64_t size)
{
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
        uint64_t nbits = QK_DIV_ROUND_UP(size, bm->granularity);
        if (nbits == qk_hbitmap_size(bm->bits)) {
            bm->size = size;
            continue;
        }
        QkHBitmap *nb = qk_hbitmap_new(nbits);
        if (!nb) {
            return -ENOMEM;
        }
        for (uint64_t b = qk_hbitmap_next_set(bm->bits, 0); b != UINT64_MAX && b < nbits;) {
            uint64_t z = qk_hbitmap_next_zero(bm->bits, b);
            uint64_t end = z == UINT64_MAX ? qk_hbitmap_size(bm->bits) : z;
            qk_hbitmap_set(nb, b, end - b);
            b = end < nbits ? qk_hbitmap_next_set(bm->bits, end) : UINT64_MAX;
        }
        qk_hbitmap_free(bm->bits);
        bm->bits = nb;
        bm->size = size;
        bm->changed = true; /* a stored copy has the old size's table */
    }
    return 0;
}
