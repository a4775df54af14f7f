/*
 * Zero writes and discard. Whole clusters are handled in the L2 tables
 * (zero flag on v3, freeing host clusters on unmap or discard); with
 * extended L2, whole subclusters of a partly covered cluster get their
 * zero bits set (the host cluster stays). Partial units (subclusters, or
 * clusters with standard L2) at the edges of a zero write are written as
 * zeros unless they already read as zeros (or, when the whole unit does,
 * get its zero bit, as QEMU does). Discard with standard L2 drops whole
 * clusters only; with extended L2 it treats the whole subclusters of a
 * partly covered cluster as a zero write does, and frees the host cluster
 * once none of its subclusters is allocated any more. Partial units at
 * the edges of a discard are left alone (discard is advisory).
 * On v3 a zero write records its zeros even where nothing is allocated
 * and no backing file lies below (an L2 table is allocated for them, as
 * QEMU does): a backing file attached later (rebase -u, amend) must not
 * show through what the guest zeroed.
 * v2 images have no zero flag. Without a backing file an unallocated
 * cluster reads as zeros, so a zero write unmaps the whole clusters it
 * covers (as QEMU resorts to discard there) and writes zeros only at its
 * edges; with a backing file zero writes fall back to the block layer's
 * generic path.
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>
#include <string.h>

/* MODE_CUT: the entry becomes unallocated (qcow2_unmap_clusters). */
enum { MODE_ZERO, MODE_ZERO_UNMAP, MODE_DISCARD, MODE_CUT };

/* Drops the reference the old L2 entry l2e of guest cluster c held. On
 * unmap or discard, a host cluster nobody refers to any more is also
 * given back to the host file; nothing can reuse it before the caller
 * drops s->lock. */
static int coroutine_fn free_entry(Qcow2State *s, uint64_t l2e, uint64_t c, int mode)
{
    uint64_t host = l2e & QCOW2_L2E_OFFSET_MASK;
    if (!(l2e & QCOW2_OFLAG_COMPRESSED) && !qk_is_aligned(host, s->cluster_size)) {
        return qcow2_free_l2_entry(s, l2e); /* says it, and leaks the cluster */
    }
    if (host && !(l2e & QCOW2_OFLAG_COMPRESSED) && qcow2_check_data_write(s, host, s->cluster_size) < 0) {
        /* A corrupt entry naming a table: its refcount is the table's,
         * never dropped (at worst a leak, which check -r gives back). */
        return -EIO;
    }
    if (qcow2_has_data_file(s)) {
        int r = qcow2_free_l2_entry(s, l2e);
        /* Not counted, and only this entry names it (a raw data file
         * was zeroed there already); offset 0 is guest cluster 0's. A
         * damaged entry (compressed, or not at its guest offset) names
         * another cluster's bytes: the entry goes, the bytes stay. */
        if (r == 0 && mode != MODE_ZERO && !(l2e & QCOW2_OFLAG_COMPRESSED) && host == c << s->cluster_bits) {
            qk_co_pdiscard(s->data, host, s->cluster_size);
        }
        return r;
    }
    /* Punched only when this reference was its last: a refcount that
     * was 0 already (damage the free only says) leaves the bytes be. */
    uint64_t rc = 0;
    if (host && !(l2e & QCOW2_OFLAG_COMPRESSED) && mode != MODE_ZERO &&
        qcow2_get_refcount(s, host >> s->cluster_bits, &rc) < 0) {
        rc = 0;
    }
    int r = qcow2_free_l2_entry(s, l2e);
    if (r == 0 && rc == 1) {
        qk_co_pdiscard(s->bs->file, host, s->cluster_size);
    }
    return r;
}

/* Whether something may show through unallocated clusters: a backing
 * file open below, or one the image records but this open left out
 * (QK_OPEN_NO_BACKING). Leaving a cluster unallocated "because it reads
 * as zeros" is only right when neither holds. */
static bool has_backing_file(const Qcow2State *s)
{
    return s->bs->backing || s->h.backing_file_offset || s->backing_pending;
}

/* Whether clusters whose L1 entry names no L2 table need one for this
 * change: a zero write records its zeros (v3), a discard matters only
 * where a backing file would show, and nothing is cut from a table that
 * does not exist. */
static bool needs_table(const Qcow2State *s, int mode)
{
    return mode == MODE_ZERO || mode == MODE_ZERO_UNMAP || (mode == MODE_DISCARD && has_backing_file(s));
}

/* Updates the entries of clusters [c, c+n), all in one L2 table. */
static int coroutine_fn modify_table(Qcow2State *s, uint64_t c, uint64_t n, int mode)
{
    uint64_t l1i = c >> s->l2_bits;
    uint64_t i0 = c & (s->l2_entries - 1);
    if (l1i >= s->l1_size) {
        return 0;
    }
    if (!(s->l1[l1i] & QCOW2_L1E_OFFSET_MASK) && !needs_table(s, mode)) {
        return 0;
    }
    int r = qcow2_mark_dirty(s);
    void *t;
    if (r == 0) {
        r = qcow2_get_l2_for_write(s, l1i, &t);
    }
    if (r < 0) {
        return r;
    }
    bool changed = false;
    for (uint64_t k = 0; k < n && r == 0; k++) {
        uint64_t bm;
        uint64_t old = qcow2_l2_get(s, t, i0 + k, &bm);
        uint64_t host = old & QCOW2_L2E_OFFSET_MASK;
        bool compressed = (old & QCOW2_OFLAG_COMPRESSED) != 0;
        bool has_host = compressed || qcow2_l2e_mapped(s, old);
        uint64_t ne, nbm;
        bool free_old;
        if (mode == MODE_CUT) {
            ne = 0;
            nbm = 0;
            free_old = has_host;
        } else if (mode == MODE_DISCARD) {
            if (!has_backing_file(s) && !has_host) {
                continue; /* already reads as zeros */
            }
            if (s->extended_l2) {
                ne = 0;
                nbm = QCOW2_BITMAP_ALL_ZERO;
            } else {
                ne = qcow2_is_v3(s) ? QCOW2_OFLAG_ZERO : 0;
                nbm = 0;
            }
            free_old = has_host;
        } else if (mode == MODE_ZERO_UNMAP || compressed || (host && !(old & QCOW2_OFLAG_COPIED))) {
            ne = s->extended_l2 ? 0 : QCOW2_OFLAG_ZERO;
            nbm = s->extended_l2 ? QCOW2_BITMAP_ALL_ZERO : 0;
            free_old = has_host;
        } else {
            /* Keep the host cluster for later writes. */
            ne = s->extended_l2 ? old : (old | QCOW2_OFLAG_ZERO);
            nbm = s->extended_l2 ? QCOW2_BITMAP_ALL_ZERO : 0;
            free_old = false;
        }
        if (ne == old && nbm == bm) {
            continue;
        }
        if (free_old && (r = qcow2_check_free_l2_entry(s, old)) < 0) {
            break;
        }
        qcow2_l2_set(s, t, i0 + k, ne, nbm);
        changed = true;
        if (free_old) {
            r = free_entry(s, old, c + k, mode);
        }
    }
    if (changed) {
        qcow2_cache_mark_dirty(s->l2_cache, t);
    }
    qcow2_cache_put(s->l2_cache, &t);
    return r;
}

/* Sets the zero bits of the subclusters in mask of cluster c (extended
 * L2, a partly covered cluster). A discard then frees the host cluster if
 * no subcluster of it stays allocated. Returns 1 when the cluster is
 * compressed: its subclusters have no bits, the caller writes zeros
 * instead (a discard leaves it alone). */
static int coroutine_fn modify_subclusters(Qcow2State *s, uint64_t c, uint32_t mask, int mode)
{
    uint64_t l1i = c >> s->l2_bits;
    if (l1i >= s->l1_size) {
        return 0;
    }
    if (!(s->l1[l1i] & QCOW2_L1E_OFFSET_MASK) && !needs_table(s, mode)) {
        return 0;
    }
    int r = qcow2_mark_dirty(s);
    void *t;
    if (r == 0) {
        r = qcow2_get_l2_for_write(s, l1i, &t);
    }
    if (r < 0) {
        return r;
    }
    uint64_t i = c & (s->l2_entries - 1);
    uint64_t bm;
    uint64_t e = qcow2_l2_get(s, t, i, &bm);
    if (e & QCOW2_OFLAG_COMPRESSED) {
        qcow2_cache_put(s->l2_cache, &t);
        return mode == MODE_DISCARD ? 0 : 1;
    }
    /* Subclusters that read as zeros already (nothing here and no backing
     * file) get zero bits as well: a discard stays the zero write on whole
     * subclusters, and the entry what QEMU's tools make of that write. */
    uint64_t nbm = (bm & ~(uint64_t)mask) | ((uint64_t)mask << 32);
    uint64_t ne = e;
    bool drop = mode == MODE_DISCARD && qcow2_l2e_mapped(s, e) && !(nbm & QCOW2_BITMAP_ALL_ALLOC);
    if (drop && (r = qcow2_check_free_l2_entry(s, e)) < 0) {
        qcow2_cache_put(s->l2_cache, &t);
        return r;
    }
    if (drop) {
        /* Nothing of the host cluster is in use: free it. The zero bits
         * stay; unallocated subclusters stay unallocated, as they must
         * where a backing file shows through them (without one they read
         * as zeros anyway). */
        ne = 0;
    }
    if (ne != e || nbm != bm) {
        qcow2_l2_set(s, t, i, ne, nbm);
        qcow2_cache_mark_dirty(s->l2_cache, t);
    }
    qcow2_cache_put(s->l2_cache, &t);
    return drop ? free_entry(s, e, c, mode) : 0;
}

static int coroutine_fn zero_partial(Qcow2State *s, uint64_t off, uint64_t len);

/* [start, end) is aligned to subclusters (clusters with standard L2). */
static int coroutine_fn modify_range(Qcow2State *s, uint64_t start, uint64_t end, int mode)
{
    const uint64_t cs = s->cluster_size;
    while (start < end) {
        uint64_t c = start >> s->cluster_bits;
        uint64_t cend = (c + 1) << s->cluster_bits;
        Qcow2Req req;
        int r;
        if (qk_is_aligned(start, cs) && end >= cend) {
            uint64_t table_end_c = ((c >> s->l2_bits) + 1) << s->l2_bits;
            uint64_t n = QK_MIN((end - start) >> s->cluster_bits, table_end_c - c);
            qcow2_req_begin(s, &req, start, start + (n << s->cluster_bits), true);
            qk_co_mutex_lock(&s->lock);
            r = modify_table(s, c, n, mode);
            qk_co_mutex_unlock(&s->lock);
            qcow2_req_end(s, &req);
            start += n << s->cluster_bits;
        } else {
            uint64_t e = QK_MIN(end, cend);
            unsigned first = (unsigned)((start - (c << s->cluster_bits)) >> s->sc_bits);
            unsigned last = (unsigned)((e - 1 - (c << s->cluster_bits)) >> s->sc_bits);
            uint32_t mask = (uint32_t)(((2ULL << last) - 1) & ~((1ULL << first) - 1));
            qcow2_req_begin(s, &req, start, e, true);
            qk_co_mutex_lock(&s->lock);
            r = modify_subclusters(s, c, mask, mode);
            qk_co_mutex_unlock(&s->lock);
            qcow2_req_end(s, &req);
            if (r == 1) {
                r = zero_partial(s, start, e - start);
            }
            start = e;
        }
        if (r < 0) {
            return r;
        }
    }
    return 0;
}

/* True when [off, off+len) already reads as zeros from this image. */
static int coroutine_fn reads_as_zero(Qcow2State *s, uint64_t off, uint64_t len)
{
    while (len) {
        Qcow2Extent ext;
        int r = qcow2_get_extent(s, off, len, &ext);
        if (r < 0) {
            return r;
        }
        bool z = ext.type == QCOW2_ZERO_PLAIN || ext.type == QCOW2_ZERO_ALLOC ||
                 (ext.type == QCOW2_UNALLOC && !has_backing_file(s));
        if (!z) {
            return 0;
        }
        off += ext.bytes;
        len -= ext.bytes;
    }
    return 1;
}

/* Whether a zero write needs no zeros written (NBD's FAST_ZERO, which
 * must fail rather than be slow): 1 when each partial unit at its edges
 * reads as zeros already (it then only gets its zero bit, as QEMU does
 * it), 0 when one would be written, or a raw data file zeroed in full.
 * Asked before anything changes, so a refusal leaves the image as it was
 * and the caller may write the zeros itself. */
static int coroutine_fn fast_zero_ok(Qcow2State *s, uint64_t off, uint64_t bytes)
{
    if (s->data_raw) {
        return 0;
    }
    const uint64_t unit = s->sc_size, end = off + bytes;
    const uint64_t edges[2] = {off, end == s->bs->size ? qk_align_up(end, unit) : end};
    for (int i = 0; i < 2; i++) {
        uint64_t us = qk_align_down(edges[i], unit);
        if (us == edges[i]) {
            continue;
        }
        int r = reads_as_zero(s, us, QK_MIN(unit, s->bs->size - us));
        if (r <= 0) {
            return r;
        }
    }
    return 1;
}

/* Gives the unit at us zero bits (a zero flag with standard L2) when all
 * of it reads as zeros already, as QEMU does; checked and changed under
 * one exclusive claim so that no write slips in between. 1 if done. */
static int coroutine_fn zero_unit_if_zero(Qcow2State *s, uint64_t us)
{
    uint64_t unit = s->sc_size;
    uint64_t c = us >> s->cluster_bits;
    Qcow2Req req;
    qcow2_req_begin(s, &req, us, us + unit, true);
    qk_co_mutex_lock(&s->lock);
    int r = reads_as_zero(s, us, unit);
    if (r == 1) {
        int m = s->extended_l2 ? modify_subclusters(s, c, 1u << ((us >> s->sc_bits) & 31), MODE_ZERO)
                               : modify_table(s, c, 1, MODE_ZERO);
        r = m < 0 ? m : m == 0;
    }
    qk_co_mutex_unlock(&s->lock);
    qcow2_req_end(s, &req);
    return r;
}

/* Zeroes [off, off+len) inside one unit (subcluster, or cluster). */
static int coroutine_fn zero_partial(Qcow2State *s, uint64_t off, uint64_t len)
{
    if (!len) {
        return 0;
    }
    /* v2 has no zero flag to give a unit that reads as zeros. */
    int z = qcow2_is_v3(s) ? zero_unit_if_zero(s, qk_align_down(off, s->sc_size)) : 0;
    if (z != 0) {
        return z < 0 ? z : 0;
    }
    z = reads_as_zero(s, off, len);
    if (z != 0) {
        return z < 0 ? z : 0;
    }
    /* zero_buf is one cluster: repeat it. */
    QkIov q;
    qk_iov_init(&q, (int)(len / s->cluster_size) + 2);
    for (uint64_t done = 0; done < len;) {
        uint64_t n = QK_MIN(len - done, s->cluster_size);
        qk_iov_add(&q, s->zero_buf, n);
        done += n;
    }
    int r = qcow2_co_pwritev(s->bs, off, len, &q, 0, 0);
    qk_iov_destroy(&q);
    return r;
}

static int coroutine_fn pwrite_zeroes(Qcow2State *s, uint64_t off, uint64_t bytes, int flags);

int coroutine_fn qcow2_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    Qcow2State *s = qcow2_state(bs);
    if (!(flags & QK_REQ_BACKING_PENDING)) {
        return pwrite_zeroes(s, off, bytes, flags);
    }
    s->backing_pending++;
    int r = pwrite_zeroes(s, off, bytes, flags);
    s->backing_pending--;
    return r;
}

static int coroutine_fn pwrite_zeroes(Qcow2State *s, uint64_t off, uint64_t bytes, int flags)
{
    QkBlock *bs = s->bs;
    if (!qcow2_is_v3(s) && has_backing_file(s)) {
        return -ENOTSUP; /* unmapping would show the backing file */
    }
    if (flags & QK_REQ_NO_FALLBACK) {
        int r = fast_zero_ok(s, off, bytes);
        if (r <= 0) {
            return r < 0 ? r : -ENOTSUP;
        }
    }
    if (s->data_raw) {
        /* A raw data file must read as the disk: it gets the zeros too. */
        int r = qk_co_pwrite_zeroes(s->data, off, bytes, 0);
        if (r < 0) {
            return r;
        }
    }
    uint64_t unit = s->sc_size;
    uint64_t end = off + bytes;
    /* The last unit may stick out past the virtual size: zero it whole. */
    uint64_t end_al = end == bs->size ? qk_align_up(end, unit) : qk_align_down(end, unit);
    uint64_t start_al = qk_align_up(off, unit);
    if (start_al >= end_al) {
        /* Inside one unit, or across the boundary of two. */
        uint64_t mid = QK_MIN(start_al, end);
        int r = zero_partial(s, off, mid - off);
        return r < 0 ? r : zero_partial(s, mid, end - mid);
    }
    int mode = !qcow2_is_v3(s) ? MODE_CUT : (flags & QK_REQ_MAY_UNMAP) ? MODE_ZERO_UNMAP : MODE_ZERO;
    int r = zero_partial(s, off, start_al - off);
    if (r == 0) {
        r = modify_range(s, start_al, end_al, mode);
    }
    if (r == 0 && end > end_al) {
        r = zero_partial(s, end_al, end - end_al);
    }
    return r;
}

int coroutine_fn qcow2_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    Qcow2State *s = qcow2_state(bs);
    /* Standard L2: whole clusters only, a partial cluster keeps its data.
     * Extended L2: whole subclusters, which then read as zeros (not from
     * the backing file), as a guest expects of discard on v3 images. */
    uint64_t unit = s->extended_l2 ? s->sc_size : s->cluster_size;
    uint64_t end = off + bytes;
    uint64_t end_al = end == bs->size ? qk_align_up(end, unit) : qk_align_down(end, unit);
    uint64_t start_al = qk_align_up(off, unit);
    if (start_al >= end_al) {
        return 0; /* discard is advisory */
    }
    if (!qcow2_is_v3(s) && has_backing_file(s)) {
        /* Version 2 has no zero flag: a discarded cluster would show the
         * backing file's old data. Nothing is done, as in QEMU. */
        return 0;
    }
    if (s->data_raw) {
        /* What the L2 tables now read as zeros, the raw data file must too. */
        int r = qk_co_pwrite_zeroes(s->data, start_al, end_al - start_al, 0);
        if (r < 0) {
            return r;
        }
    }
    return modify_range(s, start_al, end_al, MODE_DISCARD);
}

int coroutine_fn qcow2_unmap_clusters(Qcow2State *s, uint64_t start, uint64_t end)
{
    return start < end ? modify_range(s, start, end, MODE_CUT) : 0;
}
