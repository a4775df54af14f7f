/*
 * Guest-to-host mapping: L1/L2 lookup with standard (8-byte) and extended
 * (16-byte, 32 subclusters) L2 entries, classification of what a guest
 * range maps to, getting an L2 table ready for update (allocating it, or
 * copying it when a snapshot shares it), and growing the L1 table.
 */
#include "qcow2/qcow2_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

uint64_t qcow2_l1_needed(const Qcow2State *s, uint64_t size)
{
    /* bytes one L1 entry maps = cluster_size * l2_entries */
    unsigned shift = s->cluster_bits + s->l2_bits;
    return (size + (1ULL << shift) - 1) >> shift;
}

uint64_t qcow2_l2_get(const Qcow2State *s, const void *table, uint64_t i, uint64_t *bitmap)
{
    const uint8_t *t = table;
    if (s->extended_l2) {
        *bitmap = qk_be64_get(t + 16 * i + 8);
        return qk_be64_get(t + 16 * i);
    }
    *bitmap = 0;
    return qk_be64_get(t + 8 * i);
}

void qcow2_l2_set(const Qcow2State *s, void *table, uint64_t i, uint64_t e, uint64_t bitmap)
{
    uint8_t *t = table;
    if (s->extended_l2) {
        qk_be64_put(t + 16 * i, e);
        qk_be64_put(t + 16 * i + 8, bitmap);
    } else {
        qk_be64_put(t + 8 * i, e);
    }
}

/* Why an L2 entry cannot be followed (classify's answer). */
enum { ENTRY_OK, ENTRY_UNALIGNED, ENTRY_INVALID, ENTRY_V2_ZERO, ENTRY_DATA_FILE_COMPRESSED };

/* Classifies subcluster sc (0 with standard L2) of an entry. The bitmap
 * is judged whole, as QEMU judges it: one bad subcluster makes the entry
 * unusable for all, so a write to a good one cannot build on it. */
static int classify(const Qcow2State *s, uint64_t e, uint64_t bitmap, unsigned sc, bool for_write, Qcow2Type *type,
                    uint64_t *host)
{
    if (e & QCOW2_OFLAG_COMPRESSED) {
        *type = QCOW2_COMPRESSED;
        *host = 0;
        return ENTRY_OK;
    }
    uint64_t off = e & QCOW2_L2E_OFFSET_MASK;
    if (off & (s->cluster_size - 1)) {
        return ENTRY_UNALIGNED;
    }
    bool mapped = qcow2_l2e_mapped(s, e);
    if (!s->extended_l2) {
        if (e & QCOW2_OFLAG_ZERO) {
            if (!qcow2_is_v3(s) && !for_write) {
                return ENTRY_V2_ZERO; /* version 2 has no zero clusters */
            }
            *type = off ? QCOW2_ZERO_ALLOC : QCOW2_ZERO_PLAIN;
        } else {
            *type = mapped ? QCOW2_NORMAL : QCOW2_UNALLOC;
        }
        *host = off;
        return ENTRY_OK;
    }
    uint32_t alloc_bits = (uint32_t)bitmap, zero_bits = (uint32_t)(bitmap >> 32);
    if ((alloc_bits & zero_bits) || (alloc_bits && !mapped)) {
        return ENTRY_INVALID;
    }
    bool alloc = (alloc_bits >> sc) & 1, zero = (zero_bits >> sc) & 1;
    if (zero) {
        *type = off ? QCOW2_ZERO_ALLOC : QCOW2_ZERO_PLAIN;
        *host = off ? off + ((uint64_t)sc << s->sc_bits) : 0;
    } else if (alloc) {
        *type = QCOW2_NORMAL;
        *host = off + ((uint64_t)sc << s->sc_bits);
    } else {
        /* Unallocated in an allocated cluster: block status reports where
         * the bytes would go, as QEMU does. */
        *type = QCOW2_UNALLOC;
        *host = off ? off + ((uint64_t)sc << s->sc_bits) : 0;
    }
    return ENTRY_OK;
}

int qcow2_bad_l2_offset(Qcow2State *s, uint64_t l2off, uint64_t l1i)
{
    return qcow2_signal_corruption(s, "L2 table offset %#" PRIx64 " unaligned (L1 index: %#" PRIx64 ")", l2off, l1i);
}

int qcow2_bad_data_offset(Qcow2State *s, uint64_t host, uint64_t l2off, uint64_t i)
{
    return qcow2_signal_corruption(s, "Cluster allocation offset %#" PRIx64 " unaligned (L2 offset: %#" PRIx64
                                   ", L2 index: %#x)", host, l2off, (unsigned)i);
}

/* The image is corrupt at entry i of the L2 table at l2off, found while
 * looking at guest offset pos: said in QEMU's words, which differ between
 * its read and write paths (its "L2 index" is the entry's place in its
 * table; its read path doubles a space). */
static int bad_entry(Qcow2State *s, int why, bool for_write, uint64_t e, uint64_t l2off, uint64_t i, uint64_t pos)
{
    unsigned idx = (unsigned)i;
    uint64_t host = e & QCOW2_L2E_OFFSET_MASK;
    switch (why) {
    case ENTRY_UNALIGNED:
        if (for_write) {
            return qcow2_signal_corruption(s, "Data cluster offset %#" PRIx64 " unaligned (guest offset: %#" PRIx64 ")",
                                           host, pos);
        }
        return qcow2_bad_data_offset(s, host, l2off, i);
    case ENTRY_V2_ZERO:
        return qcow2_signal_corruption(s, "Zero cluster entry found in pre-v3 image (L2 offset: %#" PRIx64
                                       ", L2 index: %#x)", l2off, idx);
    case ENTRY_INVALID:
        return qcow2_signal_corruption(s, "Invalid cluster entry found%s(L2 offset: %#" PRIx64 ", L2 index: %#x)",
                                       for_write ? " " : "  ", l2off, idx);
    default:
        return qcow2_signal_corruption(s, "Compressed cluster entry found in image with external data file "
                                       "(L2 offset: %#" PRIx64 ", L2 index: %#x)", l2off, idx);
    }
}

static int coroutine_fn get_extent(Qcow2State *s, uint64_t off, uint64_t max_bytes, bool for_write, Qcow2Extent *ext)
{
    uint64_t cl = off >> s->cluster_bits;
    uint64_t l1i = cl >> s->l2_bits;
    /* Never look past the end of this L2 table. */
    uint64_t table_end = (l1i + 1) << (s->l2_bits + s->cluster_bits);
    uint64_t limit = QK_MIN(max_bytes, table_end - off);
    memset(ext, 0, sizeof(*ext));
    uint64_t l2off = l1i < s->l1_size ? s->l1[l1i] & QCOW2_L1E_OFFSET_MASK : 0;
    if (!l2off) {
        ext->type = QCOW2_UNALLOC;
        ext->bytes = limit;
        return 0;
    }
    if (!qk_is_aligned(l2off, s->cluster_size)) {
        return qcow2_bad_l2_offset(s, l2off, l1i);
    }
    void *t;
    int r = qcow2_cache_get(s->l2_cache, l2off, &t);
    if (r < 0) {
        return r;
    }
    uint64_t unit_mask = s->sc_size - 1;
    uint64_t pos = off;          /* guest position being classified */
    uint64_t done = 0;
    while (done < limit) {
        uint64_t c = pos >> s->cluster_bits;
        uint64_t bm;
        uint64_t e = qcow2_l2_get(s, t, c & (s->l2_entries - 1), &bm);
        unsigned sc = (unsigned)((pos & (s->cluster_size - 1)) >> s->sc_bits);
        Qcow2Type type;
        uint64_t host;
        int why = classify(s, e, bm, sc, for_write, &type, &host);
        if (why == ENTRY_OK && qcow2_has_data_file(s) && type == QCOW2_COMPRESSED) {
            why = ENTRY_DATA_FILE_COMPRESSED; /* a data file holds no compressed clusters */
        }
        if (why == ENTRY_OK && qcow2_has_data_file(s) && (e & QCOW2_L2E_OFFSET_MASK) &&
            (e & QCOW2_L2E_OFFSET_MASK) != c << s->cluster_bits) {
            /* A data file keeps each cluster at its guest offset. QEMU
             * reads such an entry where it points; refused here, but
             * without marking the image, which QEMU would then refuse;
             * named in QEMU's words, once. */
            qcow2_note_corruption(s, "External data file host cluster offset %#" PRIx64
                                  " does not match guest cluster offset: %#" PRIx64 ", L2 index: %#" PRIx64 ")",
                                  (uint64_t)(e & QCOW2_L2E_OFFSET_MASK), c << s->cluster_bits,
                                  c & (s->l2_entries - 1));
            r = -QK_ECORRUPT;
            break;
        }
        if (why != ENTRY_OK) {
            /* After a good stretch, that stretch is the answer: the next
             * call, starting at the bad entry, fails there (so errors name
             * the right offset, as QEMU's do). */
            r = done ? 0 : bad_entry(s, why, for_write, e, l2off, c & (s->l2_entries - 1), pos);
            break;
        }
        uint64_t in_unit = pos & unit_mask;
        uint64_t n = QK_MIN(s->sc_size - in_unit, limit - done);
        if (type == QCOW2_COMPRESSED) {
            n = QK_MIN(s->cluster_size - (pos & (s->cluster_size - 1)), limit - done);
        }
        /* Data-file clusters are never shared: written in place. */
        bool copied = (e & QCOW2_OFLAG_COPIED) != 0 || qcow2_has_data_file(s);
        if (done == 0) {
            ext->type = type;
            ext->host = host || type == QCOW2_NORMAL ? host + in_unit : 0;
            ext->l2e = e;
            ext->copied = copied;
        } else {
            if (type != ext->type || type == QCOW2_COMPRESSED) {
                break;
            }
            if (type == QCOW2_NORMAL || type == QCOW2_ZERO_ALLOC) {
                if (host != ext->host + done || copied != ext->copied) {
                    break;
                }
            } else if (type == QCOW2_UNALLOC && (host != 0) != (ext->host != 0)) {
                break;
            } else if (type == QCOW2_UNALLOC && host && host != ext->host + done) {
                break;
            }
        }
        done += n;
        pos += n;
    }
    qcow2_cache_put(s->l2_cache, &t);
    if (r < 0) {
        return r;
    }
    ext->bytes = done;
    return 0;
}

int coroutine_fn qcow2_get_extent(Qcow2State *s, uint64_t off, uint64_t max_bytes, Qcow2Extent *ext)
{
    return get_extent(s, off, max_bytes, false, ext);
}

int coroutine_fn qcow2_get_extent_for_write(Qcow2State *s, uint64_t off, uint64_t max_bytes, Qcow2Extent *ext)
{
    return get_extent(s, off, max_bytes, true, ext);
}

int coroutine_fn qcow2_write_l1_entry(Qcow2State *s, uint64_t i)
{
    /* The active L1 table may be named as something else too (a
     * snapshot's L1 table, by a corrupt snapshot table): that one must
     * not change with it. */
    int r = qcow2_check_table_write(s, s->l1_offset + i * 8, 8, QCOW2_OL_L1);
    if (r < 0) {
        return r;
    }
    uint8_t b[8];
    qk_be64_put(b, s->l1[i]);
    return qk_co_pwrite(s->bs->file, s->l1_offset + i * 8, 8, b, QK_REQ_KIND(QK_IO_L1));
}

int coroutine_fn qcow2_get_l2_for_write(Qcow2State *s, uint64_t l1i, void **table)
{
    if (l1i >= s->l1_size) {
        return -EINVAL;
    }
    uint64_t l1e = s->l1[l1i];
    uint64_t old = l1e & QCOW2_L1E_OFFSET_MASK;
    if (old && !qk_is_aligned(old, s->cluster_size)) {
        return qcow2_bad_l2_offset(s, old, l1i);
    }
    if (old && (l1e & QCOW2_OFLAG_COPIED)) {
        return qcow2_cache_get(s->l2_cache, old, table);
    }
    int64_t newoff = qcow2_alloc_clusters(s, 1);
    if (newoff < 0) {
        return (int)newoff;
    }
    void *nt;
    int r = qcow2_cache_get_empty(s->l2_cache, (uint64_t)newoff, &nt);
    if (r < 0) {
        return r;
    }
    if (old) {
        /* Shared with a snapshot: copy, the snapshot keeps the original. */
        void *ot;
        r = qcow2_cache_get(s->l2_cache, old, &ot);
        if (r < 0) {
            qcow2_cache_put(s->l2_cache, &nt);
            return r;
        }
        memcpy(nt, ot, s->cluster_size);
        qcow2_cache_put(s->l2_cache, &ot);
    }
    qcow2_cache_mark_dirty(s->l2_cache, nt);
    /* The table must be on disk (after its refcount) before L1 points to
     * it, durably: after a power loss an L1 entry must not lead to a
     * cluster still holding whatever it held before. */
    r = qcow2_cache_write_one(s->l2_cache, nt);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r == 0) {
        s->l1[l1i] = (uint64_t)newoff | QCOW2_OFLAG_COPIED;
        qcow2_meta_added(s, (uint64_t)newoff, QCOW2_OL_L2);
        r = qcow2_write_l1_entry(s, l1i);
        if (r < 0) {
            s->l1[l1i] = l1e;
            qcow2_meta_changed(s);
        }
    }
    if (r == 0 && old) {
        r = qcow2_update_refcount(s, old, s->cluster_size, -1);
    }
    if (r < 0) {
        qcow2_cache_put(s->l2_cache, &nt);
        return r;
    }
    *table = nt;
    return 0;
}

int coroutine_fn qcow2_grow_l1(Qcow2State *s, uint64_t min_size, QkError *err)
{
    if (min_size <= s->l1_size) {
        return 0;
    }
    if (min_size * 8 > QCOW2_MAX_L1_BYTES) {
        return qk_error_set(err, -EFBIG, "L1 table would be too large");
    }
    uint64_t new_size = min_size;
    uint64_t bytes = new_size * 8;
    uint64_t nclusters = QK_DIV_ROUND_UP(bytes, s->cluster_size);
    uint64_t *nl1 = calloc(1, nclusters * s->cluster_size);
    uint64_t *be = calloc(1, nclusters * s->cluster_size);
    if (!nl1 || !be) {
        free(nl1);
        free(be);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    if (s->l1_size) {
        memcpy(nl1, s->l1, (size_t)s->l1_size * 8);
    }
    for (uint64_t i = 0; i < new_size; i++) {
        qk_be64_put(&be[i], nl1[i]);
    }
    int64_t off = qcow2_alloc_clusters(s, nclusters);
    int r = off < 0 ? (int)off : 0;
    if (r == 0) {
        /* Refcounts for the new table first, then the table, then the header. */
        r = qcow2_cache_flush(s->rb_cache);
    }
    if (r == 0) {
        r = qcow2_co_write_new_meta(s, (uint64_t)off, bytes, be, 0, QK_REQ_KIND(QK_IO_L1));
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    uint64_t old_off = s->l1_offset, old_size = s->l1_size;
    if (r == 0) {
        s->h.l1_size = (uint32_t)new_size;
        s->h.l1_table_offset = (uint64_t)off;
        r = qcow2_write_header_field(s, QCOW2_HOFF_L1, 12);
        if (r < 0) {
            s->h.l1_size = (uint32_t)old_size;
            s->h.l1_table_offset = old_off;
            qcow2_fence(s, r);
        }
    }
    free(be);
    if (r < 0) {
        free(nl1);
        if (off >= 0) {
            qcow2_free_clusters(s, (uint64_t)off, nclusters * s->cluster_size);
        }
        return qk_error_set_errno(err, r, "Could not grow the L1 table");
    }
    free(s->l1);
    s->l1 = nl1;
    qcow2_meta_changed(s);
    s->l1_size = (uint32_t)new_size;
    s->l1_offset = (uint64_t)off;
    /* Only a corrupt entry makes the old table something the new one
     * still names (an L2 table): freed, it would be handed out again
     * under that reference. It leaks instead. */
    if (old_size && qcow2_meta_overlap(s, old_off, old_size * 8, 0)) {
        qcow2_note_corruption(s, "The old L1 table at %#" PRIx64 " is still in use as other metadata: left allocated",
                              old_off);
    } else if (old_size) {
        r = qcow2_free_clusters(s, old_off, old_size * 8);
    }
    return r < 0 ? qk_error_set_errno(err, r, "Could not free the old L1 table") : 0;
}
