/*
 * Changing a qcow2 image's virtual size (qemu-img resize), and emptying
 * an image (after commit), which is the same cut. Owns the order
 * of the steps and what happens to the area past the old or new end; the
 * L1 growth, the dropping of L2 subtrees and the cluster freeing they use
 * live with the tables they change (map.c, snapshot.c, zero.c).
 *
 * Both directions first cut off everything past the end being kept:
 * clusters past it inside the last L2 table become unallocated and the L1
 * entries past it are dropped (with their L2 tables and data). Shrinking
 * needs that to lose the data; growing needs it so that the new area
 * cannot show VM state or data left past the old end. The crash order is
 * the usual one: references go (L2 entries, then L1 entries, written and
 * flushed) before the refcounts they held drop; the new size is written
 * last when shrinking (a crash before leaves the old size with a cut
 * tail), and last when growing too: after the new L1 table and the
 * zeros over the new area are durable. An external data file grows
 * before any metadata maps its new area and is cut only after a shrink
 * has dropped every reference past the new end.
 */
#include "qcow2/qcow2_int.h"
#include "qcow2/snapshot_int.h"

#include <errno.h>

/* Everything past `end` (rounded up to a cluster) stops being allocated.
 * May yield; takes s->lock itself for the L2 part, needs it held for the
 * L1 part: call without it, it returns with it held. */
static int coroutine_fn cut_tail(Qcow2State *s, uint64_t end, bool growing)
{
    uint64_t keep_l1 = qcow2_l1_needed(s, end);
    uint64_t table_bytes = s->cluster_size << s->l2_bits;
    uint64_t cut_end = QK_MIN(keep_l1, (uint64_t)s->l1_size) * table_bytes;
    uint64_t from = qk_align_up(end, s->cluster_size);
    if (growing && from < cut_end &&
        !qk_is_aligned(s->l1[from / table_bytes] & QCOW2_L1E_OFFSET_MASK, s->cluster_size)) {
        /* A table at an offset inside a cluster: every request through it
         * fails (and marks the image), so nothing past the old end can
         * show. Grown as qemu-img grows it, without reading the table. */
        from = cut_end;
    }
    int r = qcow2_unmap_clusters(s, from, cut_end);
    qk_co_mutex_lock(&s->lock);
    if (r == 0) {
        r = qcow2_drop_l1_tail(s, keep_l1);
    }
    return r;
}

/* Gives the file's tail of unused clusters back to the host, as QEMU does
 * after a shrink. Refcounts and references are made durable first: the
 * file must never end before a cluster the disk still says is in use. */
static int coroutine_fn trim_file(Qcow2State *s)
{
    /* Refcounts that were found wrong on the way cannot say where the
     * last cluster in use is: cutting by them could cut live metadata
     * or data off. The file stays as long as it is. */
    if (s->meta_corrupt || s->nonfatal_said) {
        return 0;
    }
    int r = qcow2_flush_caches(s);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r == 0) {
        r = qcow2_drop_empty_refblocks(s);
    }
    if (r == 0) {
        r = qcow2_flush_caches(s);
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        return r;
    }
    int64_t flen = qk_block_length(s->bs->file);
    if (flen < 0) {
        return (int)flen;
    }
    uint64_t c = qk_align_up(QK_MAX((uint64_t)flen, s->host_end), s->cluster_size) >> s->cluster_bits;
    while (c > 1) {
        uint64_t rc;
        r = qcow2_get_refcount(s, c - 1, &rc);
        if (r < 0) {
            return r;
        }
        if (rc) {
            break;
        }
        c--;
    }
    /* Never below live metadata, whatever the refcounts say; and not at
     * all when one of its clusters counts 0: the refcounts are wrong
     * then, and the clusters they call free past it may well be in use. */
    uint64_t floor;
    r = qcow2_meta_floor(s, &floor);
    if (r == -QK_ECORRUPT) {
        return 0;
    }
    if (r < 0) {
        return r;
    }
    uint64_t end = QK_MAX(c << s->cluster_bits, floor);
    if (end >= (uint64_t)flen) {
        return 0;
    }
    QkError err = {0};
    r = qk_co_truncate(s->bs->file, end, QK_PREALLOC_OFF, &err);
    if (r == 0) {
        s->file_size = end;
        s->host_end = end;
        s->written_end = QK_MIN(s->written_end, end);
        s->file_grown = false;
    }
    return r;
}

static int coroutine_fn write_size(Qcow2State *s, uint64_t size)
{
    uint64_t old = s->h.size;
    s->h.size = size;
    int r = qcow2_write_header_field(s, QCOW2_HOFF_SIZE, 8);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        s->h.size = old;
    }
    return r;
}

static int coroutine_fn shrink(Qcow2State *s, uint64_t size, QkError *err)
{
    int r = cut_tail(s, size, false);
    if (r == 0 && s->meta_corrupt) {
        r = -EIO; /* the cut met corrupt metadata: the size stays */
    }
    if (r == 0) {
        r = qcow2_flush_caches(s);
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r == 0) {
        r = write_size(s, size);
    }
    if (r < 0) {
        qk_co_mutex_unlock(&s->lock);
        return qk_error_set_errno(err, r, "Could not shrink the image");
    }
    /* The shrink is done: a file left longer than needed only wastes
     * space (unreferenced clusters), so a failure here is not reported. */
    trim_file(s);
    qk_co_mutex_unlock(&s->lock);
    s->bs->size = size;
    return 0;
}

/* Makes [old, size) read as zeros, the size in memory already the new
 * one. Returns 1 if it wrote anything. May yield; called without
 * s->lock. */
static int coroutine_fn zero_new_area(Qcow2State *s, uint64_t old, uint64_t size, QkError *err)
{
    QkBlock *bs = s->bs;
    /* The new area must read as zeros: data of a bigger backing file, or
     * the old tail of the last cluster, must not show through. Where a
     * backing file reaches past the old end, a v3 image records zeros
     * over all of the new area, as QEMU does, so that a backing file
     * that grows or is swapped later does not show through either; v2
     * has no zero flag, and gets zeros written only as far as the
     * backing file reaches. */
    uint64_t zend = qk_align_up(old, s->cluster_size);
    int64_t bl = -1;
    if (bs->backing) {
        bl = qk_block_length(bs->backing);
        if (bl > 0 && (uint64_t)bl > old && qcow2_is_v3(s)) {
            zend = size;
        } else if (bl > 0 && (uint64_t)bl > zend) {
            zend = (uint64_t)bl;
        }
    }
    zend = QK_MIN(zend, size);
    if (zend > old && zend == QK_MIN(qk_align_up(old, s->cluster_size), size) &&
        (bs->backing ? bl >= 0 && (uint64_t)bl <= old : !s->h.backing_file_offset)) {
        /* Only the last cluster's tail, where no backing file reaches:
         * nothing but old data of this image's own could show there. A
         * tail that reads as zeros already, or that this image does not
         * hold, is left as it is, as qemu-img leaves it (no zero flag, no
         * L2 table, no zeros written for it). */
        uint64_t pnum = 0;
        int st = qk_co_block_status(bs, old, zend - old, &pnum, NULL, NULL);
        if (st >= 0 && pnum >= zend - old && ((st & QK_BS_ZERO) || !(st & QK_BS_ALLOCATED))) {
            zend = old;
        }
    }
    /* Preallocated clusters too: the last cluster's tail past the old
     * end, and subclusters left unallocated (extended L2), would show
     * the backing file. */
    if (zend > old) {
        int r = qk_co_pwrite_zeroes(bs, old, zend - old, 0);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not zero the new area");
        }
        return 1;
    }
    return 0;
}

static int coroutine_fn grow(Qcow2State *s, uint64_t old, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    QkBlock *bs = s->bs;
    int r = cut_tail(s, old, true);
    if (r < 0) {
        qk_co_mutex_unlock(&s->lock);
        return qk_error_set_errno(err, r, "Could not clear the area past the old end");
    }
    r = qcow2_grow_l1(s, qcow2_l1_needed(s, size), err);
    if (r == 0 && prealloc != QK_PREALLOC_OFF) {
        r = qcow2_preallocate(s, old, size, prealloc, err);
    }
    if (r == 0) {
        /* Durable before the size names the new area: the L1 table's new
         * place and length in the header (a crash must not leave a size
         * the L1 table is too small for) and the cut past the old end. */
        r = qcow2_flush_caches(s);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not write metadata");
        }
    }
    qk_co_mutex_unlock(&s->lock);
    if (r < 0) {
        return r;
    }
    /* The new area is zeroed before the header names it, as QEMU orders
     * it: a crash in between leaves the old size (with zero flags past
     * it, which nothing reads), never the new size over an area that
     * still shows the backing file or an old tail. Requests need the new
     * size in memory to reach the area. */
    bs->size = size;
    r = zero_new_area(s, old, size, err);
    if (r > 0) {
        r = qk_co_flush(bs);
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not write metadata");
        }
    }
    if (r == 0) {
        qk_co_mutex_lock(&s->lock);
        r = write_size(s, size);
        qk_co_mutex_unlock(&s->lock);
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not update the qcow2 header");
        }
    }
    if (r < 0) {
        bs->size = old;
    }
    return r;
}

static int coroutine_fn data_file_grow(Qcow2State *s, uint64_t old, uint64_t size, QkPrealloc prealloc,
                                      QkError *err)
{
    int64_t len = qk_block_length(s->data);
    if (len < 0) {
        return qk_error_set_errno(err, (int)len, "Could not get the data file's length");
    }
    if ((uint64_t)len > old) {
        int r = qk_co_pwrite_zeroes(s->data, old, QK_MIN((uint64_t)len, size) - old, 0);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not zero the data file past the old end");
        }
    }
    if ((uint64_t)len >= size) {
        return 0;
    }
    return qk_co_truncate(s->data, size, prealloc == QK_PREALLOC_METADATA ? QK_PREALLOC_OFF : prealloc, err);
}

int coroutine_fn qcow2_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    uint64_t old = bs->size;
    if (size % 512) {
        return qk_error_set(err, -EINVAL, "The new size must be a multiple of 512");
    }
    if (size > (1ULL << 62)) {
        return qk_error_set(err, -EFBIG, "size too large");
    }
    if (s->h.nb_snapshots && !qcow2_is_v3(s)) {
        return qk_error_set(err, -ENOTSUP, "Can't resize a v2 image which has snapshots");
    }
    if (size < old && prealloc != QK_PREALLOC_OFF) {
        return qk_error_set(err, -EINVAL, "Preallocation can't be used for shrinking an image");
    }
    if (size < old) {
        int r = qcow2_bitmaps_begin_resize(s, size, err);
        if (r == 0) {
            r = shrink(s, size, err);
        }
        if (r == 0 && qcow2_has_data_file(s)) {
            /* Nothing refers past the new end any more. */
            r = qk_co_truncate(s->data, size, QK_PREALLOC_OFF, err);
        }
        return r;
    }
    if (size == old && prealloc == QK_PREALLOC_OFF) {
        return 0;
    }
    if (old != 0 && s->h.backing_file_offset && !bs->backing) {
        /* What would show through the new area is unknown: it could not
         * be zeroed. (From size 0 it is creation: the backing file is
         * meant to show.) */
        return qk_error_set(err, -ENOTSUP, "Cannot grow an image whose backing file is not open");
    }
    if (size != old) {
        int r = qcow2_bitmaps_begin_resize(s, size, err);
        if (r < 0) {
            return r;
        }
    }
    if (qcow2_has_data_file(s) && old != 0) {
        /* The data file grows first (its preallocation is its own), and
         * with zeros where it already reached past the old end: a raw
         * data file's new area is mapped as it is. */
        int r = data_file_grow(s, old, size, prealloc, err);
        if (r < 0) {
            return r;
        }
        if (prealloc != QK_PREALLOC_OFF || s->data_raw) {
            prealloc = QK_PREALLOC_METADATA;
        }
    }
    return grow(s, old, size, prealloc, err);
}

int coroutine_fn qcow2_co_make_empty(QkBlock *bs)
{
    Qcow2State *s = qcow2_state(bs);
    /* The same cut as a shrink to size 0, without changing the size: every
     * entry unallocated, every L2 table dropped. */
    int r = cut_tail(s, 0, false);
    if (r == 0) {
        r = qcow2_flush_caches(s);
    }
    if (r == 0 && !qcow2_has_data_file(s)) {
        /* The freed tail goes back to the host, as after qemu-img commit. */
        r = trim_file(s);
    }
    qk_co_mutex_unlock(&s->lock);
    return r;
}
