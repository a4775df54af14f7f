/*
 * amend for qcow2 (qemu-img amend -o): compat 0.10 <-> 1.1, lazy_refcounts,
 * refcount_bits and size, in QEMU's order (upgrade, refcount width, lazy
 * refcounts, size, downgrade last).
 *
 * Every refusal is decided before the first write, so a refused amend
 * leaves the image as it was. Each step is crash-safe on its own: the
 * version changes with one write of cluster 0, the refcount width with
 * one header write after the new structure is durable (refcount_rebuild.c),
 * and a downgrade first turns every zero cluster of the active image into
 * what v2 can say (unallocated, or allocated zeros where a backing file
 * would show through) with ordinary writes, flushed, before the header
 * says version 2.
 *
 * Where qcowkit refuses and qemu-img goes on (a downgrade of an image with
 * zstd compression, persistent bitmaps, or zero clusters that only a
 * snapshot's tables hold), v2 could not keep what the image means.
 */
#include "qcow2/qcow2_int.h"
#include "qcow2/check_int.h"
#include "qcow2/snapshot_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Does any snapshot's L2 table hold a zero cluster? (v2 has none.) */
static int coroutine_fn snapshot_zero_clusters(Qcow2State *s, char **which, QkError *err)
{
    Qcow2Snapshot *sn = NULL;
    uint32_t n = 0;
    int r = qcow2_snapshots_read(s, &sn, &n, NULL, err);
    if (r < 0) {
        return r;
    }
    int found = 0;
    uint64_t entries = 1ULL << s->l2_bits;
    for (uint32_t i = 0; i < n && !found && r == 0; i++) {
        uint64_t bytes = (uint64_t)sn[i].l1_size * 8;
        uint64_t *l1 = bytes ? qk_aligned_alloc(4096, qk_align_up(bytes, 512)) : NULL;
        if (bytes && !l1) {
            r = qk_error_set(err, -ENOMEM, "out of memory");
            break;
        }
        if (bytes) {
            r = qk_co_pread(s->bs->file, sn[i].l1_offset, bytes, l1, 0);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not read the L1 table of snapshot '%s'", sn[i].name);
            }
        }
        for (uint32_t j = 0; r == 0 && j < sn[i].l1_size && !found; j++) {
            uint64_t l2off = qk_be64_get(&l1[j]) & QCOW2_L1E_OFFSET_MASK;
            if (!l2off) {
                continue;
            }
            void *t;
            qk_co_mutex_lock(&s->lock);
            r = qcow2_cache_get(s->l2_cache, l2off, &t);
            if (r == 0) {
                for (uint64_t k = 0; k < entries; k++) {
                    uint64_t bm, e = qcow2_l2_get(s, t, k, &bm);
                    if (!(e & QCOW2_OFLAG_COMPRESSED) && (e & QCOW2_OFLAG_ZERO)) {
                        found = 1;
                        break;
                    }
                }
                qcow2_cache_put(s->l2_cache, &t);
            } else {
                qk_error_set_errno(err, r, "Could not read an L2 table of snapshot '%s'", sn[i].name);
            }
            qk_co_mutex_unlock(&s->lock);
        }
        if (found) {
            *which = strdup(sn[i].name ? sn[i].name : "");
        }
        free(l1);
    }
    qcow2_snapshots_free(sn, n);
    return r < 0 ? r : found;
}

/* Everything that would make a downgrade refuse; nothing written. */
static int coroutine_fn downgrade_check(QkBlock *bs, uint32_t refcount_bits, uint64_t size, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (refcount_bits != 16) {
        return qk_error_set(err, -EINVAL, "compat=0.10 requires refcount_bits=16");
    }
    uint64_t incompat = s->h.incompatible_features & ~(QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_COMPRESSION);
    if (incompat) {
        return qk_error_set(err, -ENOTSUP, "Cannot downgrade an image with incompatible features %#llx set",
                            (unsigned long long)incompat);
    }
    if (s->h.compression_type != 0) {
        return qk_error_set(err, -ENOTSUP, "Cannot downgrade an image with zstd compression: "
                            "compat=0.10 has no compression type, its compressed clusters would not read back");
    }
    for (Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type == QCOW2_EXT_BITMAPS) {
            return qk_error_set(err, -ENOTSUP, "Cannot downgrade an image with persistent bitmaps "
                                "(remove them first): compat=0.10 cannot hold them");
        }
    }
    /* A v2 snapshot entry has neither a disk size (the image's is
     * assumed) nor room for more than 4 GiB of VM state: QEMU's words.
     * The size is the one the image will have (a size= given with the
     * downgrade is applied first, as QEMU applies it), so a refusal
     * comes before anything changes. */
    Qcow2Snapshot *sn;
    uint32_t n;
    int r = qcow2_snapshots_read(s, &sn, &n, NULL, err);
    if (r < 0) {
        return r;
    }
    for (uint32_t i = 0; i < n && r == 0; i++) {
        if (sn[i].disk_size != size || sn[i].vm_state_size > UINT32_MAX) {
            r = qk_error_set(err, -ENOTSUP, "Internal snapshots prevent downgrade of image");
        }
    }
    qcow2_snapshots_free(sn, n);
    if (r < 0) {
        return r;
    }
    char *which = NULL;
    r = snapshot_zero_clusters(s, &which, err);
    if (r > 0) {
        r = qk_error_set(err, -ENOTSUP, "Cannot downgrade: snapshot '%s' holds zero clusters, which "
                         "compat=0.10 cannot express (delete the snapshot or keep compat=1.1)",
                         which ? which : "?");
    }
    free(which);
    return r;
}

/* The first guest offset at or after off whose L2 entry has the zero
 * flag (size when there is none). As QEMU's downgrade, only those entries
 * are looked at: damage elsewhere in a table (an offset inside a
 * cluster, say) does not stop it, and is left for check to report. */
static int coroutine_fn next_zero(Qcow2State *s, uint64_t off, uint64_t size, uint64_t *next)
{
    uint64_t table_bytes = s->cluster_size << s->l2_bits;
    int r = 0;
    qk_co_mutex_lock(&s->lock);
    while (off < size && r == 0) {
        uint64_t l1i = off / table_bytes;
        uint64_t table_end = QK_MIN((l1i + 1) * table_bytes, size);
        uint64_t l2off = l1i < s->l1_size ? s->l1[l1i] & QCOW2_L1E_OFFSET_MASK : 0;
        void *t;
        if (!l2off) {
            off = table_end;
            continue;
        }
        if (!qk_is_aligned(l2off, s->cluster_size)) {
            r = qcow2_bad_l2_offset(s, l2off, l1i);
            break;
        }
        r = qcow2_cache_get(s->l2_cache, l2off, &t);
        if (r < 0) {
            break;
        }
        for (; off < table_end; off = (off | (s->cluster_size - 1)) + 1) {
            uint64_t bm;
            uint64_t e = qcow2_l2_get(s, t, (off >> s->cluster_bits) & (s->l2_entries - 1), &bm);
            if (!(e & QCOW2_OFLAG_COMPRESSED) && (e & QCOW2_OFLAG_ZERO)) {
                break;
            }
        }
        qcow2_cache_put(s->l2_cache, &t);
        if (off < table_end) {
            break;
        }
    }
    qk_co_mutex_unlock(&s->lock);
    *next = QK_MIN(off, size);
    return r;
}

/* The active image's zero clusters become unallocated (nothing below
 * would show through) or allocated zeros (a backing file would). */
static int coroutine_fn expand_zero_clusters(QkBlock *bs, const QkAmendOptions *o)
{
    Qcow2State *s = qcow2_state(bs);
    bool backing = s->h.backing_file_offset != 0;
    uint64_t size = s->h.size, off = 0;
    while (off < size) {
        uint64_t z;
        int r = next_zero(s, off, size, &z);
        if (r < 0) {
            return r;
        }
        if (z > off) {
            off = z;
            if (o->progress) {
                o->progress(off, size, o->opaque);
            }
            continue;
        }
        Qcow2Extent ext;
        r = qcow2_get_extent(s, off, size - off, &ext);
        if (r < 0) {
            return r;
        }
        uint64_t n = ext.bytes;
        if (n == 0) {
            return -EIO;
        }
        if (ext.type == QCOW2_ZERO_PLAIN && !backing) {
            r = qcow2_unmap_clusters(s, off, off + n);
        } else if (ext.type == QCOW2_ZERO_PLAIN || ext.type == QCOW2_ZERO_ALLOC) {
            /* Ordinary writes of zeros: they allocate (or reuse the kept
             * cluster) with the usual ordering, and drop the zero flag. */
            for (uint64_t p = 0; p < n && r == 0; p += s->cluster_size) {
                r = qk_co_pwrite(bs, off + p, QK_MIN(s->cluster_size, n - p), s->zero_buf, 0);
            }
        }
        if (r < 0) {
            return r;
        }
        off += n;
        if (o->progress) {
            o->progress(off, size, o->opaque);
        }
    }
    return 0;
}

static int coroutine_fn set_compat_bits(Qcow2State *s, uint64_t compat)
{
    uint64_t old = s->h.compatible_features;
    s->h.compatible_features = compat;
    int r = qcow2_write_header_field(s, QCOW2_HOFF_COMPAT, 8);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        s->h.compatible_features = old;
        qcow2_fence(s, r);
    }
    return r;
}

/* Lazy refcounts off: the refcounts on disk must be complete first. */
static int coroutine_fn lazy_off(Qcow2State *s)
{
    int r = qcow2_flush_caches(s);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r == 0 && (s->h.incompatible_features & QCOW2_INCOMPAT_DIRTY)) {
        r = qcow2_set_incompat(s, s->h.incompatible_features & ~QCOW2_INCOMPAT_DIRTY);
    }
    if (r == 0) {
        r = set_compat_bits(s, s->h.compatible_features & ~QCOW2_COMPAT_LAZY_REFCOUNTS);
    }
    if (r == 0) {
        s->lazy_refcounts = false;
        qcow2_cache_set_dependency(s->l2_cache, s->rb_cache);
    }
    return r;
}

int coroutine_fn qcow2_co_amend(QkBlock *bs, const QkAmendOptions *o, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (s->read_only && !o->check_only) {
        return qk_error_set(err, -EACCES, "the image is read-only");
    }
    uint32_t version = o->compat ? (uint32_t)o->compat : s->h.version;
    uint32_t bits = o->refcount_bits ? o->refcount_bits : s->refcount_bits;
    if (version < 3 && qcow2_has_data_file(s)) {
        return qk_error_set(err, -ENOTSUP, "Cannot downgrade an image with a data file");
    }
    if (o->data_file && !qcow2_has_data_file(s)) {
        return qk_error_set(err, -EINVAL, "data-file can only be set for images that use an external data file");
    }
    if (o->data_file_raw_set && o->data_file_raw && !s->data_raw) {
        return qk_error_set(err, -EINVAL, "data-file-raw cannot be set on existing images");
    }
    if (version < 3 && o->lazy_refcounts == 1) {
        return qk_error_set(err, -EINVAL, "Lazy refcounts only supported with compatibility level 1.1 "
                            "and above (use compat=1.1 or greater)");
    }
    if (version < 3 && o->refcount_bits && o->refcount_bits != 16) {
        return qk_error_set(err, -EINVAL, "Refcount widths other than 16 bits require compatibility "
                            "level 1.1 or above (use compat=1.1 or greater)");
    }
    bool downgrade = version < s->h.version;
    if (downgrade) {
        int r = downgrade_check(bs, bits, o->size_set ? o->size : s->h.size, err);
        if (r < 0) {
            return r;
        }
    }
    uint32_t order = 0;
    while ((1U << order) < bits) {
        order++;
    }
    if (o->check_only) {
        return bits != s->refcount_bits ? qcow2_change_refcount_order(s, order, true, err) : 0;
    }
    qk_co_drain(bs);
    int r = 0;
    if (version > s->h.version) {
        Qcow2Header h = s->h;
        h.version = 3;
        h.incompatible_features = h.compatible_features = h.autoclear_features = 0;
        h.refcount_order = 4;
        h.compression_type = 0;
        r = qcow2_co_rewrite_header(bs, &h, err);
        if (r < 0) {
            return r;
        }
    }
    if (bits != s->refcount_bits) {
        r = qcow2_change_refcount_order(s, order, false, err);
        if (r < 0) {
            return r;
        }
    }
    if (o->lazy_refcounts == 1 && !(s->h.compatible_features & QCOW2_COMPAT_LAZY_REFCOUNTS)) {
        /* Only the header says so from now on; this open keeps ordering
         * refcounts before references (stricter, never wrong). */
        r = set_compat_bits(s, s->h.compatible_features | QCOW2_COMPAT_LAZY_REFCOUNTS);
    } else if (o->lazy_refcounts == 0 && (s->h.compatible_features & QCOW2_COMPAT_LAZY_REFCOUNTS)) {
        r = lazy_off(s);
    }
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not change lazy_refcounts");
    }
    if (o->size_set && o->size != s->h.size) {
        r = qcow2_co_truncate(bs, o->size, QK_PREALLOC_OFF, err);
        if (r < 0) {
            return r;
        }
    }
    if (downgrade) {
        if (s->lazy_refcounts || (s->h.compatible_features & QCOW2_COMPAT_LAZY_REFCOUNTS)) {
            r = lazy_off(s);
        }
        if (r == 0) {
            r = expand_zero_clusters(bs, o);
        }
        if (r == 0) {
            r = qcow2_flush_caches(s);
        }
        if (r == 0) {
            r = qk_co_flush(bs->file);
        }
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not expand the zero clusters");
        }
        /* Nothing v3-only is left: the header may say version 2. */
        Qcow2Header h = s->h;
        h.version = 2;
        h.incompatible_features = h.compatible_features = h.autoclear_features = 0;
        r = qcow2_co_rewrite_header(bs, &h, err);
    }
    if (r == 0 && (o->data_file || (o->data_file_raw_set && !o->data_file_raw && s->data_raw))) {
        r = qcow2_data_file_amend(bs, o->data_file, o->data_file_raw_set && !o->data_file_raw, err);
    }
    return r;
}
