/*
 * Consistency check: computes every cluster's reference count from the
 * image's own tables (header, L1/L2 of the active state and of every
 * snapshot, refcount table and blocks, snapshot table, bitmaps), compares
 * it with the stored refcounts and the OFLAG_COPIED flags, and reports
 * differences in qemu-img check's words. It never writes; repair.c does
 * (with QK_CHECK_FIX_LEAKS / QK_CHECK_FIX_ERRORS), then runs it again.
 */
#include "qcow2/check_int.h"
#include "qcow2/snapshot_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ck_say(Check *k, const char *fmt, ...)
{
    if (!k->report) {
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    k->report(k->opaque, line);
}

static void note_outside(Check *k, uint64_t first, uint64_t last)
{
    for (uint64_t c = first; c <= last; c++) {
        if (k->n_outside == k->cap_outside) {
            size_t cap = k->cap_outside ? k->cap_outside * 2 : 64;
            uint64_t *n = cap <= (1u << 20) ? realloc(k->outside, cap * sizeof(*n)) : NULL;
            if (!n) {
                k->outside_overflow = true;
                return;
            }
            k->outside = n;
            k->cap_outside = cap;
        }
        k->outside[k->n_outside++] = c;
        if (c == UINT64_MAX) {
            return;
        }
    }
}

static void add_ref(Check *k, uint64_t off, uint64_t len, uint8_t kind)
{
    if (len == 0) {
        return;
    }
    uint64_t first = off >> k->s->cluster_bits;
    uint64_t last;
    if (qk_add_overflow(off, len - 1, &last)) {
        last = UINT64_MAX;
    }
    last >>= k->s->cluster_bits;
    uint64_t end;
    if (last == k->nclusters && !qk_add_overflow(off, len, &end) && end - k->file_len < k->s->cluster_size) {
        /* Less than a cluster past the end of the file (a table in the
         * file's last, partial cluster or just after it): counted, as
         * qemu-img counts it, in the one slot past the file's clusters;
         * the compare reports its refcount. New structures never go
         * there. */
        k->slack = true;
        note_outside(k, last, last);
    } else if (last >= k->nclusters) {
        ck_say(k, "ERROR: counting reference for region exceeding the end of the file by one cluster or more: "
            "offset 0x%llx size 0x%llx", (unsigned long long)off, (unsigned long long)len);
        k->res->corruptions++;
        note_outside(k, QK_MAX(first, k->nclusters), QK_MIN(last, QK_MAX(first, k->nclusters) + 64));
        last = k->nclusters ? k->nclusters - 1 : 0;
        if (first >= k->nclusters) {
            return;
        }
    }
    for (uint64_t c = first; c <= last; c++) {
        k->kind[c] |= kind;
        /* As QEMU counts: references past what the width can hold are
         * an error of their own, and the count stays at the maximum (the
         * refcount a repair can store). */
        if (k->refs[c] >= k->s->refcount_max || k->refs[c] == UINT32_MAX) {
            ck_say(k, "ERROR: overflow cluster offset=0x%llx", (unsigned long long)(c << k->s->cluster_bits));
            ck_say(k, "Use qcowkit amend -o refcount_bits=N to increase the refcount entry width "
                   "or convert to create a clean copy if the image cannot be opened for writing");
            k->res->corruptions++;
            continue;
        }
        k->refs[c]++;
    }
}

bool ck_table_ok(Check *k, uint64_t off, uint64_t len)
{
    return qk_is_aligned(off, k->s->cluster_size) && qk_range_within(off, len, k->file_len);
}

/* True if a cluster of [off, off+len) (inside the file) is referenced already. */
static bool referenced(Check *k, uint64_t off, uint64_t len)
{
    for (uint64_t c = off >> k->s->cluster_bits; len && c <= (off + len - 1) >> k->s->cluster_bits; c++) {
        if (k->refs[c]) {
            return true;
        }
    }
    return false;
}

/* fixable: t is the cache's copy of a table that may take changes. */
static void coroutine_fn check_l2_table(Check *k, void *t, bool active, bool fixable)
{
    Qcow2State *s = k->s;
    uint64_t next_contig = 0;
    for (uint64_t i = 0; i < s->l2_entries; i++) {
        uint64_t bm;
        uint64_t e = qcow2_l2_get(s, t, i, &bm);
        if (e & QCOW2_OFLAG_COMPRESSED) {
            uint64_t host, len;
            qcow2_compressed_range(s, e, &host, &len);
            if (e & QCOW2_OFLAG_COPIED) {
                ck_say(k, "ERROR: coffset=0x%llx: copied flag must never be set for compressed clusters",
                    (unsigned long long)host);
                k->res->corruptions++;
            }
            if (s->extended_l2 && bm) {
                /* A compressed cluster has no subclusters (-r all clears it). */
                ck_say(k, "ERROR compressed cluster %llu with non-zero subcluster allocation bitmap, entry=0x%llx",
                       (unsigned long long)i, (unsigned long long)e);
                k->res->corruptions++;
            }
            add_ref(k, host, len, CK_DATA);
            if (active) {
                k->res->allocated_clusters++;
                k->res->compressed_clusters++;
                k->res->fragmented_clusters++;
            }
            /* Each counts as fragmented; the run of the clusters around
             * it is not broken, as qemu-img counts them. */
            continue;
        }
        uint64_t off = e & QCOW2_L2E_OFFSET_MASK;
        /* The standard descriptor's reserved bits, as qemu-img checks them
         * (with extended L2 too, where bit 0 is unused as well). */
        if (e & QCOW2_L2E_RESERVED) {
            ck_say(k, "ERROR found l2 entry with reserved bits set: %llx", (unsigned long long)e);
            k->res->corruptions++;
        }
        if (s->extended_l2) {
            uint32_t alloc = (uint32_t)bm, zero = (uint32_t)(bm >> 32);
            bool mapped = off || (qcow2_has_data_file(s) && (e & QCOW2_OFLAG_COPIED));
            if (alloc && !mapped) {
                ck_say(k, "ERROR: Unallocated cluster has non-zero subcluster allocation map");
                k->res->corruptions++;
            } else if (alloc & zero) {
                ck_say(k, "ERROR offset=%llx: Allocated cluster has corrupted subcluster allocation bitmap",
                       (unsigned long long)off);
                k->res->corruptions++;
            }
        }
        bool data_file = qcow2_has_data_file(s);
        if (!qcow2_l2e_mapped(s, e)) {
            continue; /* (offset 0 is guest cluster 0's place in a data file) */
        }
        if (!qk_is_aligned(off, s->cluster_size) && fixable && k->fix_prealloc && (e & QCOW2_OFLAG_ZERO) &&
            !s->extended_l2) {
            /* It reads as zeros either way: -r all drops the offset, as
             * qemu-img does, and the cluster it half named is no longer
             * counted (the caller makes the table durable before any
             * refcount drops). */
            qcow2_l2_set(s, t, i, QCOW2_OFLAG_ZERO, 0);
            qcow2_cache_mark_dirty(s->l2_cache, t);
            k->prealloc_fixed++;
            if (k->fix_report) {
                char line[160];
                snprintf(line, sizeof(line),
                         "Repairing offset=%llx: Preallocated cluster is not properly aligned; L2 entry corrupted.",
                         (unsigned long long)off);
                k->fix_report(k->fix_opaque, line);
            }
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            /* Counted as a reference all the same (to the clusters the
             * entry touches), as qemu-img does, so both report alike. */
            bool prealloc = (e & QCOW2_OFLAG_ZERO) && !s->extended_l2;
            ck_say(k, "ERROR offset=%llx: %s cluster is not properly aligned; L2 entry corrupted.",
                   (unsigned long long)off, prealloc ? "Preallocated" : "Data");
            k->res->corruptions++;
            k->prealloc_bad += prealloc;
        }
        if (active) {
            k->res->allocated_clusters++;
            if (next_contig && off != next_contig) {
                k->res->fragmented_clusters++;
            }
            next_contig = off + s->cluster_size;
        }
        if (!data_file) {
            add_ref(k, off, s->cluster_size, CK_DATA); /* a data file's clusters are not counted */
        }
    }
}

static void coroutine_fn check_l2(Check *k, uint64_t l2off, bool active)
{
    Qcow2State *s = k->s;
    void *t;
    if (qk_range_within(l2off, s->cluster_size, k->file_len)) {
        if (qcow2_cache_get(s->l2_cache, l2off, &t) < 0) {
            ck_say(k, "ERROR: I/O error in check_refcounts_l2");
            k->res->check_errors++;
            return;
        }
        check_l2_table(k, t, active, k->fix_prealloc && !qcow2_meta_overlap(s, l2off, s->cluster_size, QCOW2_OL_L2));
        qcow2_cache_put(s->l2_cache, &t);
        return;
    }
    /* A table the end of the file cuts short (wholly past it, add_ref has
     * said so): what is there is counted, so its clusters are not taken
     * for leaks, and the rest reads as zeros, as qemu-img reads it. The
     * engine refuses such a table; -r all extends the file over it. What
     * the lost part held is unknown, so no refcount is lowered. */
    if (l2off >= k->file_len) {
        return;
    }
    ck_say(k, "ERROR l2_offset=%llx: L2 table is cut short by the end of the file", (unsigned long long)l2off);
    k->res->corruptions++;
    k->partial = true;
    k->short_end = QK_MAX(k->short_end, l2off + s->cluster_size);
    k->short_tables++;
    t = calloc(1, s->cluster_size);
    if (!t || qk_co_pread(s->bs->file, l2off, k->file_len - l2off, t, 0) < 0) {
        k->res->check_errors++;
    } else {
        check_l2_table(k, t, active, false);
    }
    free(t);
}

static int coroutine_fn check_l1(Check *k, const uint64_t *l1, uint64_t l1_off, uint64_t l1_size, bool active)
{
    Qcow2State *s = k->s;
    add_ref(k, l1_off, l1_size * 8, CK_META);
    for (uint64_t i = 0; i < l1_size; i++) {
        uint64_t e = l1[i];
        if (e & QCOW2_L1E_RESERVED) {
            ck_say(k, "ERROR found L1 entry with reserved bits set: %llx", (unsigned long long)e);
            k->res->corruptions++;
        }
        uint64_t off = e & QCOW2_L1E_OFFSET_MASK;
        bool data_file = qcow2_has_data_file(s);
        if (!off && !(data_file && (e & QCOW2_OFLAG_COPIED))) {
            continue; /* offset 0 is guest cluster 0's place in a data file */
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            ck_say(k, "ERROR l2_offset=%llx: Table is not cluster aligned; L1 entry corrupted",
                (unsigned long long)off);
            k->res->corruptions++;
            continue;
        }
        add_ref(k, off, s->cluster_size, CK_META);
        check_l2(k, off, active);
    }
    return 0;
}

static int coroutine_fn read_table(Qcow2State *s, uint64_t off, uint64_t n, uint64_t **out)
{
    uint64_t *t = calloc(QK_MAX(n, 1), 8);
    if (!t) {
        return -ENOMEM;
    }
    int r = n ? qk_co_pread(s->bs->file, off, n * 8, t, 0) : 0;
    for (uint64_t i = 0; r == 0 && i < n; i++) {
        t[i] = be64toh(t[i]);
    }
    if (r < 0) {
        free(t);
        return r;
    }
    *out = t;
    return 0;
}

/* A snapshot's id or name for a report line: what the file holds of it,
 * cut to fit (empty where it cannot be read). */
static void coroutine_fn entry_string(Check *k, uint64_t off, uint16_t len, char *buf, size_t size)
{
    size_t n = QK_MIN((size_t)len, size - 1);
    if (!qk_range_within(off, n, k->file_len) || qk_co_pread(k->s->bs->file, off, n, buf, 0) < 0) {
        n = 0;
    }
    buf[n] = 0;
}

/* A snapshot entry cut short whose first 12 bytes (its L1 table's offset
 * and size) name a table in the file: what the snapshot holds can be
 * kept. */
static bool l1_in_file(const Check *k, const uint8_t *fixed)
{
    uint64_t l1_off = qk_be64_get(fixed);
    uint32_t l1_size = qk_be32_get(fixed + 8);
    return l1_size && qk_is_aligned(l1_off, k->s->cluster_size) && (uint64_t)l1_size * 8 <= QCOW2_MAX_L1_BYTES &&
           qk_range_within(l1_off, (uint64_t)l1_size * 8, k->file_len);
}

/* The snapshot table does not read whole: said and counted, what it
 * references is unknown (no refcount is lowered), and what is in the file
 * of it, [off, end), is still the table's. */
static int table_truncated(Check *k, uint64_t off, uint64_t end)
{
    ck_say(k, "ERROR snapshot table is truncated");
    k->res->corruptions++;
    k->partial = true;
    if (off < k->file_len) {
        add_ref(k, off, QK_MIN(end, k->file_len) - off, CK_META);
    }
    return 0;
}

static int coroutine_fn check_snapshots(Check *k)
{
    Qcow2State *s = k->s;
    uint32_t nb = s->h.nb_snapshots;
    k->sn_cut_short = false;
    k->sn_whole = 0;
    k->sn_partial_end = 0;
    k->sn_names_end = 0;
    if (!nb) {
        return 0;
    }
    uint64_t off = s->h.snapshots_offset;
    uint64_t pos = off;
    uint8_t fixed[40];
    for (uint32_t i = 0; i < nb; i++) {
        if (!qk_range_within(pos, sizeof(fixed), k->file_len) || pos - off > QCOW2_MAX_SNAPSHOT_TABLE_BYTES) {
            /* Cut short where the file ends, after whole entries: the
             * rest is gone. An entry whose names run past the end (a
             * damaged length as likely as a cut) is not that. */
            k->sn_cut_short = !qk_range_within(pos, sizeof(fixed), k->file_len) && k->sn_whole == i;
            uint8_t l1f[12];
            if (k->sn_cut_short && qk_range_within(pos, sizeof(l1f), k->file_len) &&
                qk_co_pread(s->bs->file, pos, sizeof(l1f), l1f, 0) == 0 && l1_in_file(k, l1f)) {
                k->sn_partial_end = pos + sizeof(fixed);
            }
            return table_truncated(k, off, pos);
        }
        int r = qk_co_pread(s->bs->file, pos, sizeof(fixed), fixed, 0);
        if (r < 0) {
            k->res->check_errors++;
            return 0;
        }
        uint64_t l1_off = qk_be64_get(fixed);
        uint32_t l1_size = qk_be32_get(fixed + 8);
        uint16_t id_len = qk_be16_get(fixed + 12), name_len = qk_be16_get(fixed + 14);
        uint32_t extra = qk_be32_get(fixed + 36);
        uint64_t entry = pos;
        uint64_t entry_end = pos + 40ULL + extra + id_len + name_len;
        pos += qk_align_up(40ULL + extra + id_len + name_len, 8);
        /* The last entry's padding need not be in the file. */
        if (k->sn_whole == i && qk_range_within(entry, 40ULL + extra + id_len + name_len, k->file_len)) {
            k->sn_whole = i + 1;
        } else if (k->sn_whole == i && i < nb - 1 && k->file_len - (entry + 40) < 40ULL * (nb - 1 - i)) {
            /* The end of the file is inside an earlier entry's extra data
             * or names, so close to it that the entries after it could
             * not be in the file whatever its lengths say (each takes 40
             * bytes at least): cut short there, as in its fixed part.
             * (With room for them, a damaged length is as likely as a
             * cut, and the entry is reported below and left alone.) */
            k->sn_cut_short = true;
            if (l1_in_file(k, fixed)) {
                k->sn_partial_end = entry + sizeof(fixed);
            }
            return table_truncated(k, off, k->file_len);
        } else if (k->sn_whole == i && i == nb - 1 && extra <= QCOW2_SN_MAX_EXTRA) {
            /* (A bounded extension: at most 1 KiB of extra data and two
             * 64 KiB names.) */
            k->sn_names_end = entry_end;
        }
        /* What opening the image refuses, as qemu-img reports it (-r all
         * cuts the extra data, repair.c; the references are known all the
         * same). */
        if (extra > QCOW2_SN_MAX_EXTRA) {
            ck_say(k, "ERROR Too much extra metadata in snapshot table entry %u (%u > %u)", i, extra,
                   QCOW2_SN_MAX_EXTRA);
            k->res->corruptions++;
        } else if (qcow2_is_v3(s) && extra < 16) {
            ck_say(k, "ERROR snapshot table entry %u is incomplete", i);
            k->res->corruptions++;
        }
        /* In qemu-img's words and order. What such a table references is
         * unknown, so it is never walked (qemu-img walks the part of a
         * table past the end of the file that it can read). */
        bool aligned = qk_is_aligned(l1_off, s->cluster_size);
        if (!aligned || (uint64_t)l1_size * 8 > QCOW2_MAX_L1_BYTES) {
            char id[128], name[128];
            entry_string(k, entry + 40 + extra, id_len, id, sizeof(id));
            entry_string(k, entry + 40 + extra + id_len, name_len, name, sizeof(name));
            if (!aligned) {
                ck_say(k, "ERROR snapshot %s (%s) l1_offset=%#llx: L1 table is not cluster aligned; "
                       "snapshot table entry corrupted", id, name, (unsigned long long)l1_off);
            } else {
                ck_say(k, "ERROR snapshot %s (%s) l1_size=%#x: L1 table is too large; "
                       "snapshot table entry corrupted", id, name, l1_size);
            }
            k->res->corruptions++;
            k->partial = true;
            continue;
        }
        if (!qk_range_within(l1_off, (uint64_t)l1_size * 8, k->file_len)) {
            add_ref(k, l1_off, (uint64_t)l1_size * 8, CK_META); /* says it, counts the error */
            k->partial = true;
            continue;
        }
        if (referenced(k, l1_off, (uint64_t)l1_size * 8)) {
            /* Every snapshot has an L1 copy of its own. Not walking a shared
             * one also bounds the work by the file size: a hostile table can
             * name one 32 MiB L1 table 65536 times. Its own reference to
             * the table still counts: a refcount too low for the sharing
             * shows (and -r all raises it, so a write copies the cluster
             * instead of overwriting the table). */
            ck_say(k, "ERROR snapshot %u: its L1 table (offset 0x%llx) is referenced by something else too", i,
                (unsigned long long)l1_off);
            add_ref(k, l1_off, (uint64_t)l1_size * 8, CK_META);
            k->res->corruptions++;
            k->partial = true;
            continue;
        }
        uint64_t *l1;
        r = read_table(s, l1_off, l1_size, &l1);
        if (r < 0) {
            k->res->check_errors++;
            continue;
        }
        check_l1(k, l1, l1_off, l1_size, false);
        free(l1);
    }
    if (k->sn_whole < nb) {
        /* The last entry's names run past the end of the file (an entry
         * before it would have put the next one's fixed part there):
         * reading the table fails, as above. qemu-img reads zeros there,
         * and -r all extends the file over them so that both read that. */
        return table_truncated(k, off, pos);
    }
    add_ref(k, off, pos - off, CK_META);
    return 0;
}

typedef struct BmName {
    const char *s;
    uint16_t len;
} BmName;

static int cmp_name(const void *a, const void *b)
{
    const BmName *x = a, *y = b;
    int c = memcmp(x->s, y->s, QK_MIN(x->len, y->len));
    return c ? c : (int)x->len - (int)y->len;
}

/* Names are the bitmaps' identity (QEMU refuses an image with two of one
 * name); sorted, so a hostile directory of 65535 entries costs no more
 * than n log n. Entries without a readable name are reported elsewhere. */
static void report_duplicate_names(Check *k, BmName *names, uint32_t n)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (names[i].s && names[i].len) {
            names[m++] = names[i];
        }
    }
    qsort(names, m, sizeof(*names), cmp_name);
    for (uint32_t i = 1; i < m; i++) {
        if (cmp_name(&names[i - 1], &names[i]) == 0 && (i < 2 || cmp_name(&names[i - 2], &names[i]) != 0)) {
            ck_say(k, "ERROR bitmap name '%.*s' appears more than once", (int)names[i].len, names[i].s);
            k->res->corruptions++;
        }
    }
}

static int coroutine_fn check_bitmaps(Check *k)
{
    Qcow2State *s = k->s;
    if (!(s->h.autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
        return 0;
    }
    for (Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type != QCOW2_EXT_BITMAPS) {
            continue;
        }
        if (e->len != 24) {
            ck_say(k, "ERROR bitmaps extension has length %u (24 expected)", e->len);
            k->res->corruptions++;
            if (e->len < 24) {
                continue;
            }
        }
        if (qk_be32_get(e->data + 4) != 0) {
            ck_say(k, "ERROR bitmaps extension has a non-zero reserved field");
            k->res->corruptions++;
        }
        uint32_t nb = qk_be32_get(e->data);
        uint64_t dsize = qk_be64_get(e->data + 8), doff = qk_be64_get(e->data + 16);
        if (dsize > (64ULL << 20) || !ck_table_ok(k, doff, dsize)) {
            ck_say(k, "ERROR bitmap directory is invalid");
            k->res->corruptions++;
            k->partial = true;
            return 0;
        }
        add_ref(k, doff, dsize, CK_META);
        uint8_t *dir = malloc(dsize ? dsize : 1);
        if (!dir || qk_co_pread(s->bs->file, doff, dsize, dir, 0) < 0) {
            free(dir);
            k->res->check_errors++;
            return 0;
        }
        if (nb > 65535) {
            ck_say(k, "ERROR bitmaps extension names %u bitmaps (at most 65535 allowed)", nb);
            k->res->corruptions++;
        }
        uint64_t p = 0;
        uint32_t i = 0;
        /* No more entries than the directory's bytes can hold are read. */
        BmName *names = calloc(QK_MIN((uint64_t)nb, dsize / 24) + 1, sizeof(*names));
        if (!names) {
            free(dir);
            k->res->check_errors++;
            return 0;
        }
        for (; i < nb && p + 24 <= dsize; i++) {
            uint64_t toff = qk_be64_get(dir + p);
            uint32_t tsize = qk_be32_get(dir + p + 8);
            uint32_t flags = qk_be32_get(dir + p + 12);
            uint8_t type = dir[p + 16], gbits = dir[p + 17];
            uint16_t name = qk_be16_get(dir + p + 18);
            uint32_t extra = qk_be32_get(dir + p + 20);
            if (p + 24 + (uint64_t)extra + name <= dsize) {
                names[i] = (BmName){(const char *)dir + p + 24 + extra, name};
            }
            p += qk_align_up(24ULL + extra + name, 8);
            /* What the specification allows (an image with anything else
             * is one qemu-img will not open). */
            if (type != 1) {
                ck_say(k, "ERROR bitmap %u has type %u (only 1, dirty tracking, exists)", i, type);
                k->res->corruptions++;
            }
            if (gbits < 9 || gbits > 31) {
                ck_say(k, "ERROR bitmap %u has granularity bits %u (9 to 31 allowed)", i, gbits);
                k->res->corruptions++;
            } else if (!(flags & QCOW2_BME_IN_USE)) {
                /* One in use may still have the size before a resize
                 * (QEMU's rule too): only its data is out of date. */
                uint64_t bits = QK_DIV_ROUND_UP(s->h.size, 1ULL << gbits);
                uint64_t want = QK_DIV_ROUND_UP(QK_DIV_ROUND_UP(bits, 8), s->cluster_size);
                if (tsize != want) {
                    ck_say(k, "ERROR bitmap %u: its table has %u entries, the image size needs %llu", i, tsize,
                           (unsigned long long)want);
                    k->res->corruptions++;
                }
            }
            if (flags & ~(uint32_t)(QCOW2_BME_IN_USE | QCOW2_BME_AUTO | QCOW2_BME_EXTRA_COMPAT)) {
                ck_say(k, "ERROR bitmap %u has unknown flags 0x%x", i, flags);
                k->res->corruptions++;
            }
            if (name == 0) {
                ck_say(k, "ERROR bitmap %u has no name", i);
                k->res->corruptions++;
            } else if (names[i].s && memchr(names[i].s, 0, name)) {
                ck_say(k, "ERROR bitmap %u has a name with a NUL byte", i);
                k->res->corruptions++;
                names[i].s = NULL;
            }
            if (!ck_table_ok(k, toff, (uint64_t)tsize * 8)) {
                ck_say(k, "ERROR bitmap table of bitmap %u is invalid", i);
                k->res->corruptions++;
                k->partial = true;
                continue;
            }
            add_ref(k, toff, (uint64_t)tsize * 8, CK_META);
            uint64_t *bt;
            if (read_table(s, toff, tsize, &bt) < 0) {
                k->res->check_errors++;
                continue;
            }
            uint32_t bad = 0, first_bad = 0;
            for (uint32_t j = 0; j < tsize; j++) {
                uint64_t o = bt[j] & QCOW2_L1E_OFFSET_MASK;
                if (!qcow2_bitmap_entry_ok(bt[j], s->cluster_size)) {
                    first_bad = bad++ ? first_bad : j;
                }
                /* A broken entry still holds the cluster it points into:
                 * removing the bitmap leaks it, so repair must not free
                 * it under the entry (nor count a second cluster). */
                if (o) {
                    add_ref(k, qk_align_down(o, s->cluster_size), s->cluster_size, CK_DATA);
                }
            }
            if (bad) {
                ck_say(k, "ERROR bitmap %u: %u table entr%s invalid (the first, entry %u, is 0x%llx); "
                       "remove the bitmap", i, bad, bad == 1 ? "y is" : "ies are", first_bad,
                       (unsigned long long)bt[first_bad]);
                k->res->corruptions++;
            }
            free(bt);
        }
        if (i < nb) {
            ck_say(k, "ERROR bitmap directory is too small for its %u entries", nb);
            k->res->corruptions++;
            k->partial = true;
        }
        report_duplicate_names(k, names, i);
        free(names);
        free(dir);
    }
    return 0;
}

int coroutine_fn ck_compute(Check *k)
{
    Qcow2State *s = k->s;
    memset(k->refs, 0, (k->nclusters + 1) * sizeof(uint32_t));
    memset(k->kind, 0, k->nclusters + 1);
    k->slack = false;
    k->n_outside = 0;
    k->outside_overflow = false;
    k->partial = s->l1_past_eof; /* what the lost L1 table referenced is unknown */
    k->short_end = 0;
    k->short_tables = 0;
    k->prealloc_bad = 0;
    add_ref(k, 0, s->cluster_size, CK_META);
    check_l1(k, s->l1, s->l1_offset, s->l1_size, true);
    check_snapshots(k);
    check_bitmaps(k);
    if (k->skip_refcount_structure) {
        return 0;
    }
    add_ref(k, s->rt_offset, (uint64_t)s->rt_clusters << s->cluster_bits, CK_REFS);
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (s->rt[i] & ~QCOW2_REFT_OFFSET_MASK) {
            ck_say(k, "ERROR refcount table entry %llu has reserved bits set", (unsigned long long)i);
            k->res->corruptions++;
            continue;
        }
        if (!off) {
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            ck_say(k, "ERROR refcount block %llu is not cluster aligned; refcount table entry corrupted",
                   (unsigned long long)i);
            k->res->corruptions++;
            continue;
        }
        if (!qk_range_within(off, s->cluster_size, k->file_len)) {
            ck_say(k, "ERROR refcount block %llu is outside image", (unsigned long long)i);
            k->res->corruptions++;
            continue;
        }
        add_ref(k, off, s->cluster_size, CK_REFS);
    }
    return 0;
}

bool coroutine_fn ck_stored_rc(Check *k, uint64_t c, uint64_t *rc)
{
    *rc = 0;
    return qcow2_get_refcount(k->s, c, rc) == 0;
}

/* The refcount as the report gives it: an aligned block past the end of
 * the file reads as zeros, as qemu-img reads it (it was reported as
 * outside the image); an unaligned one cannot be read at all. Repairs use
 * ck_stored_rc, which refuses both. */
static int coroutine_fn reported_rc(Check *k, uint64_t c, uint64_t *rc)
{
    Qcow2State *s = k->s;
    uint64_t ti = c >> s->rb_bits;
    uint64_t rb = ti < s->rt_size ? s->rt[ti] & QCOW2_REFT_OFFSET_MASK : 0;
    *rc = 0;
    bool outside = rb && qk_is_aligned(rb, s->cluster_size) && !qk_range_within(rb, s->cluster_size, k->file_len);
    return outside ? 0 : qcow2_get_refcount(s, c, rc);
}

static void coroutine_fn compare(Check *k)
{
    Qcow2State *s = k->s;
    uint64_t highest = 0;
    k->rc_unreadable = 0;
    for (uint64_t c = 0; c < k->nclusters + k->slack; c++) {
        uint64_t rc, ref = k->refs[c];
        int r = reported_rc(k, c, &rc);
        if (r < 0) {
            ck_say(k, "Can't get refcount for cluster %llu: %s", (unsigned long long)c, strerror(-r));
            k->res->check_errors++;
            k->rc_unreadable++;
            continue;
        }
        if (rc || ref) {
            highest = c;
        }
        if (rc == ref) {
            continue;
        }
        if (rc > ref) {
            ck_say(k, "Leaked cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                   (unsigned long long)rc, (unsigned long long)ref);
            k->res->leaks++;
        } else {
            ck_say(k, "ERROR cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                   (unsigned long long)rc, (unsigned long long)ref);
            k->res->corruptions++;
        }
    }
    /* As qemu-img: one cluster at least, even when no refcount could be read. */
    k->res->image_end_offset = (highest + 1) << s->cluster_bits;
}

/* COPIED must be set exactly when the stored refcount is 1. */
int coroutine_fn ck_check_copied(Check *k)
{
    Qcow2State *s = k->s;
    for (uint64_t i = 0; i < s->l1_size; i++) {
        uint64_t off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (!off || !ck_table_ok(k, off, s->cluster_size)) {
            continue;
        }
        uint64_t rc;
        /* A refcount that cannot be read was reported by the compare. */
        if (reported_rc(k, off >> s->cluster_bits, &rc) == 0 && (rc == 1) != !!(s->l1[i] & QCOW2_OFLAG_COPIED)) {
            ck_say(k, "ERROR OFLAG_COPIED L2 cluster: l1_index=%llu l1_entry=%llx refcount=%llu",
                   (unsigned long long)i, (unsigned long long)s->l1[i], (unsigned long long)rc);
            k->res->corruptions++;
        }
        void *t;
        if (qcow2_cache_get(s->l2_cache, off, &t) < 0) {
            k->res->check_errors++;
            continue;
        }
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t bm;
            uint64_t e = qcow2_l2_get(s, t, j, &bm);
            uint64_t d = e & QCOW2_L2E_OFFSET_MASK;
            if ((e & QCOW2_OFLAG_COMPRESSED) || !d) {
                continue;
            }
            /* A data file's clusters are never shared: refcount 1, as qemu-img counts them. */
            rc = 1;
            if (!qcow2_has_data_file(s) && reported_rc(k, d >> s->cluster_bits, &rc) < 0) {
                continue;
            }
            if ((rc == 1) != !!(e & QCOW2_OFLAG_COPIED)) {
                ck_say(k, "ERROR OFLAG_COPIED data cluster: l2_entry=%llx refcount=%llu",
                       (unsigned long long)e, (unsigned long long)rc);
                k->res->corruptions++;
            }
        }
        qcow2_cache_put(s->l2_cache, &t);
    }
    return 0;
}

int ck_prepare(Check *k)
{
    int64_t flen = qk_block_length(k->s->bs->file);
    if (flen < 0) {
        return (int)flen;
    }
    k->file_len = (uint64_t)flen;
    uint64_t n = QK_DIV_ROUND_UP(k->file_len, k->s->cluster_size);
    if (n != k->nclusters || !k->refs) {
        free(k->refs);
        free(k->kind);
        k->nclusters = n;
        k->refs = calloc(n + 1, sizeof(uint32_t));
        k->kind = calloc(n + 1, 1);
        if (!k->refs || !k->kind) {
            return -ENOMEM;
        }
    }
    return 0;
}

void ck_free(Check *k)
{
    free(k->refs);
    free(k->kind);
    free(k->outside);
    k->refs = NULL;
    k->kind = NULL;
    k->outside = NULL;
}

int coroutine_fn ck_run(Check *k, QkCheckResult *res, QkCheckReport *report, void *opaque)
{
    memset(res, 0, sizeof(*res));
    k->res = res;
    k->report = report;
    k->opaque = opaque;
    int r = ck_prepare(k);
    if (r < 0) {
        return r;
    }
    k->skip_refcount_structure = false;
    ck_compute(k);
    compare(k);
    if (!k->skip_copied) {
        ck_check_copied(k);
    }
    res->total_clusters = QK_DIV_ROUND_UP(k->s->h.size, k->s->cluster_size);
    return 0;
}

int coroutine_fn qk_qcow2_co_check(QkBlock *bs, int fix, QkCheckResult *res, QkCheckReport *report,
                                   void *opaque, QkError *err)
{
    if (!qk_block_is_qcow2(bs)) {
        return qk_error_set(err, -EINVAL, "not a qcow2 image");
    }
    Qcow2State *s = qcow2_state(bs);
    memset(res, 0, sizeof(*res));
    if (fix && s->read_only) {
        return qk_error_set(err, -EACCES, "cannot repair a read-only image");
    }
    Check k = {.s = s, .report = report, .opaque = opaque};
    qk_co_mutex_lock(&s->lock);
    int r;
    if (fix) {
        r = ck_repair(&k, fix, res, err);
    } else {
        r = ck_run(&k, res, report, opaque);
        if (r < 0) {
            r = qk_error_set_errno(err, r, "Could not check the image");
        }
    }
    qk_co_mutex_unlock(&s->lock);
    ck_free(&k);
    return r;
}
