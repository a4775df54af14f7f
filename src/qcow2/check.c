/*
 * Consistency check and repair: rebuilds every cluster's reference count
 * from the image's own tables (header, L1/L2 of the active state and of
 * every snapshot, refcount table and blocks, snapshot table, bitmaps),
 * compares it with the stored refcounts and reports differences in
 * qemu-img check's words. With QK_CHECK_FIX_LEAKS / QK_CHECK_FIX_ERRORS
 * the stored refcounts are corrected.
 */
#include "qcow2/qcow2_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Check {
    Qcow2State *s;
    QkCheckResult *res;
    QkCheckReport *report;
    void *opaque;
    uint32_t *refs;
    uint64_t nclusters;
    uint64_t file_len;
} Check;

__attribute__((format(printf, 2, 3)))
static void say(Check *k, const char *fmt, ...)
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

static void add_ref(Check *k, uint64_t off, uint64_t len)
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
    if (last >= k->nclusters) {
        say(k, "ERROR: counting reference for region exceeding the end of the file by one cluster or more: "
            "offset 0x%llx size 0x%llx", (unsigned long long)off, (unsigned long long)len);
        k->res->corruptions++;
        last = k->nclusters ? k->nclusters - 1 : 0;
        if (first >= k->nclusters) {
            return;
        }
    }
    for (uint64_t c = first; c <= last; c++) {
        if (k->refs[c] != UINT32_MAX) {
            k->refs[c]++;
        }
    }
}

static bool table_ok(Check *k, uint64_t off, uint64_t len)
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

static int coroutine_fn check_l2(Check *k, uint64_t l2off, bool active)
{
    Qcow2State *s = k->s;
    void *t;
    int r = qcow2_cache_get(s->l2_cache, l2off, &t);
    if (r < 0) {
        say(k, "ERROR: I/O error in check_refcounts_l2");
        k->res->check_errors++;
        return 0;
    }
    uint64_t next_contig = 0;
    for (uint64_t i = 0; i < s->l2_entries; i++) {
        uint64_t bm;
        uint64_t e = qcow2_l2_get(s, t, i, &bm);
        if (e & QCOW2_OFLAG_COMPRESSED) {
            if (e & QCOW2_OFLAG_COPIED) {
                say(k, "ERROR: coffset=0x%llx: copied flag must never be set for compressed clusters",
                    (unsigned long long)(e & ~QCOW2_OFLAG_COPIED));
                k->res->corruptions++;
            }
            uint64_t host, len;
            qcow2_compressed_range(s, e, &host, &len);
            add_ref(k, host, len);
            if (active) {
                k->res->allocated_clusters++;
                k->res->compressed_clusters++;
                k->res->fragmented_clusters++;
            }
            next_contig = 0;
            continue;
        }
        uint64_t off = e & QCOW2_L2E_OFFSET_MASK;
        uint64_t reserved = s->extended_l2 ? (QCOW2_L2E_RESERVED | 1) : QCOW2_L2E_RESERVED;
        if (e & reserved) {
            say(k, "ERROR found l2 entry with reserved bits set: 0x%llx", (unsigned long long)e);
            k->res->corruptions++;
        }
        if (s->extended_l2) {
            uint32_t alloc = (uint32_t)bm, zero = (uint32_t)(bm >> 32);
            if ((alloc & zero) || (alloc && !off)) {
                say(k, "ERROR invalid subcluster allocation bitmap 0x%llx in L2 entry 0x%llx",
                    (unsigned long long)bm, (unsigned long long)e);
                k->res->corruptions++;
            }
        }
        if (!off) {
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            say(k, "ERROR offset=%llx: Cluster is not properly aligned; L2 entry corrupted",
                (unsigned long long)off);
            k->res->corruptions++;
            continue;
        }
        if (active) {
            k->res->allocated_clusters++;
            if (next_contig && off != next_contig) {
                k->res->fragmented_clusters++;
            }
            next_contig = off + s->cluster_size;
        }
        add_ref(k, off, s->cluster_size);
    }
    qcow2_cache_put(s->l2_cache, &t);
    return 0;
}

static int coroutine_fn check_l1(Check *k, const uint64_t *l1, uint64_t l1_off, uint64_t l1_size, bool active)
{
    Qcow2State *s = k->s;
    add_ref(k, l1_off, l1_size * 8);
    for (uint64_t i = 0; i < l1_size; i++) {
        uint64_t e = l1[i];
        if (e & QCOW2_L1E_RESERVED) {
            say(k, "ERROR found L1 entry with reserved bits set: 0x%llx", (unsigned long long)e);
            k->res->corruptions++;
        }
        uint64_t off = e & QCOW2_L1E_OFFSET_MASK;
        if (!off) {
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            say(k, "ERROR l2_offset=%llx: Table is not cluster aligned; L1 entry corrupted",
                (unsigned long long)off);
            k->res->corruptions++;
            continue;
        }
        add_ref(k, off, s->cluster_size);
        if (!qk_range_within(off, s->cluster_size, k->file_len)) {
            continue; /* already reported by add_ref */
        }
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

static int coroutine_fn check_snapshots(Check *k)
{
    Qcow2State *s = k->s;
    uint32_t nb = s->h.nb_snapshots;
    if (!nb) {
        return 0;
    }
    uint64_t off = s->h.snapshots_offset;
    uint64_t pos = off;
    uint8_t fixed[40];
    for (uint32_t i = 0; i < nb; i++) {
        if (!qk_range_within(pos, sizeof(fixed), k->file_len) || pos - off > QCOW2_MAX_SNAPSHOT_TABLE_BYTES) {
            say(k, "ERROR snapshot table is truncated");
            k->res->corruptions++;
            return 0;
        }
        int r = qk_co_pread(s->bs->file, pos, sizeof(fixed), fixed, 0);
        if (r < 0) {
            k->res->check_errors++;
            return 0;
        }
        uint64_t l1_off = qcow2_ld64(fixed);
        uint32_t l1_size = qcow2_ld32(fixed + 8);
        uint16_t id_len = qcow2_ld16(fixed + 12), name_len = qcow2_ld16(fixed + 14);
        uint32_t extra = qcow2_ld32(fixed + 36);
        pos += qk_align_up(40ULL + extra + id_len + name_len, 8);
        if ((uint64_t)l1_size * 8 > QCOW2_MAX_L1_BYTES || !table_ok(k, l1_off, (uint64_t)l1_size * 8)) {
            say(k, "ERROR snapshot %u has an invalid L1 table (offset 0x%llx, %u entries)", i,
                (unsigned long long)l1_off, l1_size);
            k->res->corruptions++;
            continue;
        }
        if (referenced(k, l1_off, (uint64_t)l1_size * 8)) {
            /* Every snapshot has an L1 copy of its own. Not walking a shared
             * one also bounds the work by the file size: a hostile table can
             * name one 32 MiB L1 table 65536 times. */
            say(k, "ERROR snapshot %u: its L1 table (offset 0x%llx) overlaps other metadata", i,
                (unsigned long long)l1_off);
            k->res->corruptions++;
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
    add_ref(k, off, pos - off);
    return 0;
}

static int coroutine_fn check_bitmaps(Check *k)
{
    Qcow2State *s = k->s;
    if (!(s->h.autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
        return 0;
    }
    for (Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type != QCOW2_EXT_BITMAPS || e->len < 24) {
            continue;
        }
        uint32_t nb = qcow2_ld32(e->data);
        uint64_t dsize = qcow2_ld64(e->data + 8), doff = qcow2_ld64(e->data + 16);
        if (dsize > (64ULL << 20) || !table_ok(k, doff, dsize)) {
            say(k, "ERROR bitmap directory is invalid");
            k->res->corruptions++;
            return 0;
        }
        add_ref(k, doff, dsize);
        uint8_t *dir = malloc(dsize ? dsize : 1);
        if (!dir || qk_co_pread(s->bs->file, doff, dsize, dir, 0) < 0) {
            free(dir);
            k->res->check_errors++;
            return 0;
        }
        uint64_t p = 0;
        for (uint32_t i = 0; i < nb && p + 24 <= dsize; i++) {
            uint64_t toff = qcow2_ld64(dir + p);
            uint32_t tsize = qcow2_ld32(dir + p + 8);
            uint16_t name = qcow2_ld16(dir + p + 18);
            uint32_t extra = qcow2_ld32(dir + p + 20);
            p += qk_align_up(24ULL + extra + name, 8);
            if (!table_ok(k, toff, (uint64_t)tsize * 8)) {
                say(k, "ERROR bitmap table of bitmap %u is invalid", i);
                k->res->corruptions++;
                continue;
            }
            add_ref(k, toff, (uint64_t)tsize * 8);
            uint64_t *bt;
            if (read_table(s, toff, tsize, &bt) < 0) {
                k->res->check_errors++;
                continue;
            }
            for (uint32_t j = 0; j < tsize; j++) {
                uint64_t o = bt[j] & QCOW2_L1E_OFFSET_MASK;
                if (o) {
                    add_ref(k, o, s->cluster_size);
                }
            }
            free(bt);
        }
        free(dir);
    }
    return 0;
}

static int coroutine_fn compute(Check *k)
{
    Qcow2State *s = k->s;
    memset(k->refs, 0, k->nclusters * sizeof(uint32_t));
    add_ref(k, 0, s->cluster_size);
    check_l1(k, s->l1, s->l1_offset, s->l1_size, true);
    check_snapshots(k);
    add_ref(k, s->rt_offset, (uint64_t)s->rt_clusters << s->cluster_bits);
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (!off) {
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            say(k, "ERROR refcount block %llu is not cluster aligned; refcount table entry corrupted",
                (unsigned long long)i);
            k->res->corruptions++;
            continue;
        }
        if (!qk_range_within(off, s->cluster_size, k->file_len)) {
            say(k, "ERROR refcount block %llu is outside image", (unsigned long long)i);
            k->res->corruptions++;
            continue;
        }
        add_ref(k, off, s->cluster_size);
    }
    check_bitmaps(k);
    return 0;
}

static uint64_t coroutine_fn stored_rc(Check *k, uint64_t c)
{
    uint64_t rc = 0;
    if (qcow2_get_refcount(k->s, c, &rc) < 0) {
        return 0;
    }
    return rc;
}

/* Compares; with fix, repairs. Returns how many refcounts it changed. */
static int coroutine_fn compare(Check *k, int fix, bool final)
{
    Qcow2State *s = k->s;
    int changed = 0;
    uint64_t highest = 0;
    bool any = false;
    for (uint64_t c = 0; c < k->nclusters; c++) {
        uint64_t rc = stored_rc(k, c), ref = k->refs[c];
        if (rc || ref) {
            highest = c;
            any = true;
        }
        if (rc == ref) {
            continue;
        }
        bool leak = rc > ref;
        if (fix & (leak ? QK_CHECK_FIX_LEAKS : QK_CHECK_FIX_ERRORS)) {
            int64_t delta = leak ? -(int64_t)(rc - ref) : (int64_t)(ref - rc);
            if (qcow2_update_refcount(s, c << s->cluster_bits, s->cluster_size, delta) == 0) {
                changed++;
                if (final) {
                    say(k, "Repairing cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                        (unsigned long long)rc, (unsigned long long)ref);
                }
                if (leak) {
                    k->res->leaks_fixed++;
                } else {
                    k->res->corruptions_fixed++;
                }
                continue;
            }
        }
        if (!final) {
            continue;
        }
        if (leak) {
            say(k, "Leaked cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                (unsigned long long)rc, (unsigned long long)ref);
            k->res->leaks++;
        } else {
            say(k, "ERROR cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                (unsigned long long)rc, (unsigned long long)ref);
            k->res->corruptions++;
        }
    }
    k->res->image_end_offset = any ? (highest + 1) << s->cluster_bits : 0;
    return changed;
}

/* COPIED must be set exactly when the stored refcount is 1. */
static int coroutine_fn check_copied(Check *k)
{
    Qcow2State *s = k->s;
    for (uint64_t i = 0; i < s->l1_size; i++) {
        uint64_t off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (!off || !table_ok(k, off, s->cluster_size)) {
            continue;
        }
        uint64_t rc = stored_rc(k, off >> s->cluster_bits);
        if ((rc == 1) != !!(s->l1[i] & QCOW2_OFLAG_COPIED)) {
            say(k, "ERROR OFLAG_COPIED L2 cluster: l1_index=%llu l1_entry=%llx refcount=%llu",
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
            if ((e & QCOW2_OFLAG_COMPRESSED) || !d || !qk_is_aligned(d, s->cluster_size)) {
                continue;
            }
            rc = stored_rc(k, d >> s->cluster_bits);
            if ((rc == 1) != !!(e & QCOW2_OFLAG_COPIED)) {
                say(k, "ERROR OFLAG_COPIED data cluster: l2_entry=%llx refcount=%llu",
                    (unsigned long long)e, (unsigned long long)rc);
                k->res->corruptions++;
            }
        }
        qcow2_cache_put(s->l2_cache, &t);
    }
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
    Check k = {.s = s, .res = res, .report = report, .opaque = opaque};
    qk_co_mutex_lock(&s->lock);
    int r = 0;
    for (int pass = 0; pass < 4; pass++) {
        int64_t flen = qk_block_length(bs->file);
        if (flen < 0) {
            r = qk_error_set_errno(err, (int)flen, "Could not get file size");
            break;
        }
        k.file_len = (uint64_t)flen;
        uint64_t n = QK_DIV_ROUND_UP(k.file_len, s->cluster_size);
        if (n != k.nclusters || !k.refs) {
            free(k.refs);
            k.nclusters = n;
            k.refs = calloc(QK_MAX(n, 1), sizeof(uint32_t));
            if (!k.refs) {
                r = qk_error_set(err, -ENOMEM, "out of memory for %llu clusters", (unsigned long long)n);
                break;
            }
        }
        /* Count and report only in the final pass; fixing passes stay quiet. */
        QkCheckResult scratch;
        bool final = pass == 3 || !fix;
        memset(&scratch, 0, sizeof(scratch));
        k.res = final ? res : &scratch;
        QkCheckReport *rep = k.report;
        if (!final) {
            k.report = NULL;
        }
        uint64_t fixed_leaks = res->leaks_fixed, fixed_corr = res->corruptions_fixed;
        compute(&k);
        k.report = rep;
        if (final) {
            res->leaks_fixed = fixed_leaks;
            res->corruptions_fixed = fixed_corr;
            compare(&k, 0, true);
            check_copied(&k);
            break;
        }
        k.res = res;
        int changed = compare(&k, fix, false);
        if (changed) {
            int fr = qcow2_flush_caches(s);
            if (fr < 0) {
                r = qk_error_set_errno(err, fr, "Could not write repaired refcounts");
                break;
            }
        } else {
            pass = 2; /* nothing left to fix: go to the final pass */
        }
    }
    res->total_clusters = QK_DIV_ROUND_UP(s->h.size, s->cluster_size);
    qk_co_mutex_unlock(&s->lock);
    free(k.refs);
    return r;
}
