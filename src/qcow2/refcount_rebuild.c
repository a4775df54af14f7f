/*
 * Refcount structure rebuild, for a repair that cannot trust the stored
 * refcount table or blocks (a block missing, overlapping other metadata or
 * data, outside the file, ...). A whole new table and set of blocks is
 * built in memory from the computed references and written to clusters
 * nothing uses: past the end of the file and past every cluster something
 * references beyond it. Only after they are durable does the header switch
 * to them (one 12-byte write inside the first sector), so a crash at any
 * point leaves either the old image untouched or the new structure in
 * place. The old table and blocks are no longer referenced by anything and
 * the new refcounts call them free.
 */
#include "qcow2/check_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct Layout {
    uint64_t start;        /* first cluster of the new blocks */
    uint64_t nblocks;
    uint64_t table_clusters;
    uint64_t entries;      /* refcount table entries (whole clusters of them) */
    uint64_t end;          /* one past the last new cluster */
} Layout;

/* The refcount a cluster gets in the new structure. */
static uint64_t new_ref(const Check *k, const Layout *l, uint64_t c)
{
    if (c >= l->start && c < l->end) {
        return 1;
    }
    /* The slack cluster just past the file keeps its references too. */
    return c < k->nclusters + k->slack ? k->refs[c] : 0;
}

/* Does range ti (the clusters one block describes) need a block? */
static bool block_needed(const Check *k, const Layout *l, const bool *used, uint64_t nused, uint64_t ti)
{
    if (ti < nused && used[ti]) {
        return true;
    }
    uint32_t rb_bits = k->s->rb_bits;
    uint64_t lo = ti << rb_bits, hi = lo + (1ULL << rb_bits);
    return l->end > lo && l->start < hi;
}

/* Sizes the structure for a given start: blocks and table describe every
 * used cluster and themselves. Grows monotonically, so it settles. */
static int size_layout(const Check *k, Layout *l, const bool *used, uint64_t nused)
{
    Qcow2State *s = k->s;
    l->nblocks = 0;
    l->table_clusters = 1;
    for (int round = 0; round < 64; round++) {
        l->end = l->start + l->nblocks + l->table_clusters;
        if ((l->end << s->cluster_bits) > QCOW2_MAX_HOST_OFFSET || l->end < l->start) {
            return -EFBIG;
        }
        uint64_t last_ti = ((l->end - 1) >> s->rb_bits);
        if (nused && nused - 1 > last_ti) {
            last_ti = nused - 1;
        }
        uint64_t nb = 0;
        for (uint64_t ti = 0; ti <= last_ti; ti++) {
            nb += block_needed(k, l, used, nused, ti);
        }
        uint64_t tc = QK_DIV_ROUND_UP((last_ti + 1) * 8, s->cluster_size);
        if (tc * s->cluster_size > QCOW2_MAX_REFTABLE_BYTES) {
            return -EFBIG;
        }
        if (nb == l->nblocks && tc == l->table_clusters) {
            l->entries = tc * s->cluster_size / 8;
            return 0;
        }
        l->nblocks = QK_MAX(nb, l->nblocks);
        l->table_clusters = QK_MAX(tc, l->table_clusters);
    }
    return -EFBIG;
}

/* Places the structure at the end of the file, clear of every cluster
 * referenced past the end. */
static int place(const Check *k, Layout *l, const bool *used, uint64_t nused)
{
    l->start = QK_MAX(k->nclusters, 1);
    for (;;) {
        int r = size_layout(k, l, used, nused);
        if (r < 0) {
            return r;
        }
        bool moved = false;
        for (size_t i = 0; i < k->n_outside; i++) {
            uint64_t o = k->outside[i];
            if (o >= l->start && o < l->end) {
                l->start = o + 1;
                moved = true;
            }
        }
        if (!moved) {
            return 0;
        }
    }
}

static int coroutine_fn write_structure(Check *k, const Layout *l, uint64_t *table, uint64_t *overflows)
{
    Qcow2State *s = k->s;
    uint64_t per_block = 1ULL << s->rb_bits;
    void *buf = qk_aligned_zalloc(4096, s->cluster_size);
    if (!buf) {
        return -ENOMEM;
    }
    int r = 0;
    uint64_t next = l->start;
    /* Only ranges below the last cluster in use can hold a refcount. */
    uint64_t last = QK_MAX(k->nclusters, l->end);
    for (uint64_t ti = 0; ti < l->entries && (ti << s->rb_bits) < last && r == 0; ti++) {
        memset(buf, 0, s->cluster_size);
        bool any = false;
        for (uint64_t i = 0; i < per_block; i++) {
            uint64_t v = new_ref(k, l, ti * per_block + i);
            if (v > s->refcount_max) {
                (*overflows)++;
                v = s->refcount_max;
            }
            if (v) {
                qcow2_rb_set(s, buf, i, v);
                any = true;
            }
        }
        if (!any) {
            continue;
        }
        if (next >= l->start + l->nblocks) {
            r = -EIO; /* sizing and writing disagree: never write past the layout */
            break;
        }
        table[ti] = next << s->cluster_bits;
        r = qk_co_pwrite(s->bs->file, next << s->cluster_bits, s->cluster_size, buf, 0);
        next++;
    }
    free(buf);
    if (r < 0) {
        return r;
    }
    uint64_t bytes = l->table_clusters << s->cluster_bits;
    uint64_t *be = qk_aligned_zalloc(4096, bytes);
    if (!be) {
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < l->entries; i++) {
        qk_be64_put(&be[i], table[i]);
    }
    r = qk_co_pwrite(s->bs->file, (l->start + l->nblocks) << s->cluster_bits, bytes, be, 0);
    free(be);
    return r;
}

int coroutine_fn ck_rebuild_refcounts(Check *k, QkError *err)
{
    Qcow2State *s = k->s;
    if (k->outside_overflow) {
        return qk_error_set(err, -EFBIG, "too many clusters referenced past the end of the file "
                            "to place a new refcount structure safely; image left unchanged");
    }
    uint64_t per_block = 1ULL << s->rb_bits;
    uint64_t nused = QK_DIV_ROUND_UP(k->nclusters + k->slack, per_block);
    bool *used = calloc(QK_MAX(nused, 1), 1);
    if (!used) {
        return qk_error_set(err, -ENOMEM, "out of memory for the refcount rebuild");
    }
    for (uint64_t c = 0; c < k->nclusters + k->slack; c++) {
        if (k->refs[c]) {
            used[c >> s->rb_bits] = true;
        }
    }
    Layout l;
    int r = place(k, &l, used, nused);
    free(used);
    if (r < 0) {
        return qk_error_set_errno(err, r, "no room for a new refcount structure; image left unchanged");
    }
    uint64_t *table = calloc(l.entries, 8);
    if (!table) {
        return qk_error_set(err, -ENOMEM, "out of memory for the new refcount table");
    }
    /* Nothing may be left to write back into the old blocks. */
    r = qcow2_flush_caches(s);
    uint64_t overflows = 0;
    if (r == 0) {
        r = write_structure(k, &l, table, &overflows);
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        free(table);
        return qk_error_set_errno(err, r, "Could not write the new refcount structure; "
                                  "the image still uses the old one");
    }
    uint64_t old_off = s->h.refcount_table_offset;
    uint32_t old_clusters = s->h.refcount_table_clusters;
    s->h.refcount_table_offset = (l.start + l.nblocks) << s->cluster_bits;
    s->h.refcount_table_clusters = (uint32_t)l.table_clusters;
    /* With a new width, table and width change in one write of the first
     * sector (offsets 48 to 100: the fields between are as they are). */
    r = qcow2_write_header_field(s, QCOW2_HOFF_REFTABLE,
                                 k->write_order ? QCOW2_HOFF_REFCOUNT_ORDER + 4 - QCOW2_HOFF_REFTABLE : 12);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        /* The disk may name either structure now: the old one stays
         * named in memory, and nothing more is written. */
        s->h.refcount_table_offset = old_off;
        s->h.refcount_table_clusters = old_clusters;
        free(table);
        return qk_error_set_errno(err, qcow2_fence(s, r), "Could not switch the header to the new refcount structure");
    }
    /* Forget the old blocks: their clusters are free now and may be reused. */
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (off) {
            qcow2_cache_discard(s->rb_cache, off);
        }
    }
    for (uint64_t c = l.start; c < l.end; c++) {
        qcow2_cache_discard(s->l2_cache, c << s->cluster_bits);
    }
    free(s->rt);
    s->rt = table;
    qcow2_meta_changed(s);
    s->rt_size = s->rt_disk_size = l.entries;
    s->rt_offset = s->h.refcount_table_offset;
    s->rt_clusters = (uint32_t)l.table_clusters;
    uint64_t end = l.end << s->cluster_bits;
    s->host_end = QK_MAX(s->host_end, end);
    s->file_size = QK_MAX(s->file_size, end);
    s->written_end = QK_MAX(s->written_end, end);
    s->free_hint = 1;
    if (overflows) {
        ck_say(k, "ERROR %llu clusters are referenced more often than %u-bit refcounts can count",
               (unsigned long long)overflows, s->refcount_bits);
    }
    return 0;
}

/* The width fields of s for refcount_order `order`. */
static void set_order(Qcow2State *s, uint32_t order)
{
    s->h.refcount_order = order;
    s->refcount_order = order;
    s->refcount_bits = 1U << order;
    s->refcount_max = s->refcount_bits == 64 ? (uint64_t)INT64_MAX : (1ULL << s->refcount_bits) - 1;
    s->rb_bits = s->cluster_bits + 3 - order;
}

int coroutine_fn qcow2_change_refcount_order(Qcow2State *s, uint32_t order, bool dry, QkError *err)
{
    if (order == s->refcount_order) {
        return 0;
    }
    QkCheckResult res;
    memset(&res, 0, sizeof(res));
    Check k = {.s = s, .res = &res, .skip_refcount_structure = true, .write_order = true};
    /* Everything cached reaches the old blocks first, in the old width. */
    int r = dry ? 0 : qcow2_flush_caches(s);
    if (r == 0 && !dry) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not flush the image");
    }
    r = ck_prepare(&k);
    if (r < 0) {
        ck_free(&k);
        return qk_error_set_errno(err, r, "Could not size the refcount computation");
    }
    ck_compute(&k);
    if (res.check_errors || res.corruptions) {
        ck_free(&k);
        return qk_error_set(err, -EIO, "the image has errors; repair it (check -r all) before "
                            "changing the refcount width");
    }
    uint32_t bits = 1U << order;
    uint64_t max = bits == 64 ? (uint64_t)INT64_MAX : (1ULL << bits) - 1;
    /* A cluster in use keeps its stored count, a leak on it included (as
     * qemu-img keeps it): OFLAG_COPIED follows the stored counts, so it
     * stays right with no write of its own. Counting references instead
     * lowered such a leak (2 for one reference, as an interrupted snapshot
     * deletion leaves it) and needed a flag pass after the header switch:
     * a crash between the two left OFLAG_COPIED errors. Leaks on clusters
     * nothing uses are dropped: no flag names them. */
    for (uint64_t c = 0; c < k.nclusters; c++) {
        uint64_t rc = k.refs[c];
        if (rc) {
            uint64_t stored;
            if (!ck_stored_rc(&k, c, &stored)) {
                ck_free(&k);
                return qk_error_set(err, -EIO, "Could not read the refcount of cluster %#llx",
                                    (unsigned long long)(c << s->cluster_bits));
            }
            rc = QK_MAX(rc, stored);
        }
        if (rc > max) {
            ck_free(&k);
            return qk_error_set(err, -EINVAL, "Cannot decrease refcount entry width to %u bits: "
                                "Cluster at offset %#llx has a refcount of %llu", bits,
                                (unsigned long long)(c << s->cluster_bits), (unsigned long long)rc);
        }
        if (rc > UINT32_MAX) {
            ck_free(&k);
            return qk_error_set(err, -EINVAL, "Cluster at offset %#llx has a refcount of %llu; "
                                "repair the leak (check -r leaks) before changing the refcount width",
                                (unsigned long long)(c << s->cluster_bits), (unsigned long long)rc);
        }
        k.refs[c] = (uint32_t)rc;
    }
    if (dry) {
        ck_free(&k);
        return 0;
    }
    uint32_t old = s->refcount_order;
    set_order(s, order);
    r = ck_rebuild_refcounts(&k, err);
    if (r < 0) {
        set_order(s, old);
    }
    ck_free(&k);
    return r;
}
