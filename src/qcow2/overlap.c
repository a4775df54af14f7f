/*
 * Writes over live metadata are refused. A corrupt L2 entry (or a refcount
 * that let a metadata cluster be handed out again) would otherwise turn a
 * guest write into the destruction of a table: data of every cluster the
 * table maps lost at once. Every write of guest data into the image file,
 * every L2 table and refcount block written back, and every active L1
 * entry updated, is checked first against the header, the active L1 and
 * L2 tables, the refcount table and blocks, the bitmap directory, the
 * snapshot table and the snapshots' L1 tables (also those a damaged table
 * names past the end of the file, and a table that cannot be read, over
 * the length it claims), as QEMU's default ("cached") check does; so is
 * every table, bitmap or snapshot table written into clusters just
 * allocated for it (an allocation a damaged refcount let fall on live
 * metadata), and every guest cluster about to be freed. The first hit
 * fails with -EIO, as does every later write of guest data, and the image
 * is marked corrupt at the next flush or close (the header's corrupt bit,
 * which only check -r clears). Tables are still written back where they
 * belong, so what the image holds stays consistent.
 *
 * Cost: a sorted list of the metadata clusters is built when the tables
 * change (qcow2_meta_changed) and at least every few thousand checks, so
 * a check is a binary search. A hit in the list is confirmed against the
 * live tables before anything is refused, so a stale list can never fail a
 * good write.
 */
#include "qcow2/qcow2_int.h"
#include "qcow2/snapshot_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A list at most this many checks old is trusted to hold every table made
 * without a qcow2_meta_changed() call (there should be none). */
#define REBUILD_EVERY 4096

typedef struct MetaCluster {
    uint64_t c;
    unsigned kind;
} MetaCluster;

static const char *kind_name(unsigned kind)
{
    switch (kind) {
    case QCOW2_OL_HEADER: return "qcow2_header";
    case QCOW2_OL_L1: return "active L1 table";
    case QCOW2_OL_L2: return "active L2 table";
    case QCOW2_OL_REFT: return "refcount table";
    case QCOW2_OL_REFB: return "refcount block";
    case QCOW2_OL_SNAPSHOT_TABLE: return "snapshot table";
    case QCOW2_OL_INACTIVE_L1: return "inactive L1 table";
    default: return "bitmap directory";
    }
}

void qcow2_meta_changed(Qcow2State *s)
{
    s->meta_gen++;
}

void qcow2_meta_added(Qcow2State *s, uint64_t off, unsigned kind)
{
    /* Put into the list where it belongs, not a rebuild: a fresh large
     * image gets a new L2 table on many of its first writes, and the
     * rebuild walks the whole L1 and refcount tables. */
    if (!s->meta_list || s->meta_built_gen != s->meta_gen) {
        return; /* rebuilt at the next check anyway */
    }
    MetaCluster *v = realloc(s->meta_list, (s->meta_n + 1) * sizeof(*v));
    if (!v) {
        s->meta_gen++;
        return;
    }
    s->meta_list = v;
    uint64_t c = off >> s->cluster_bits;
    size_t i = s->meta_n;
    while (i > 0 && v[i - 1].c > c) {
        i--;
    }
    memmove(v + i + 1, v + i, (s->meta_n - i) * sizeof(*v));
    v[i] = (MetaCluster){.c = c, .kind = kind};
    s->meta_n++;
}

/* Calls fn for every metadata cluster range [first, last]. */
static bool each_meta(Qcow2State *s, bool (*fn)(void *, uint64_t, uint64_t, unsigned), void *o)
{
    uint64_t cs = s->cluster_size;
    if (!fn(o, 0, 0, QCOW2_OL_HEADER)) {
        return false;
    }
    if (s->l1_size && !fn(o, s->l1_offset / cs, (s->l1_offset + (uint64_t)s->l1_size * 8 - 1) / cs, QCOW2_OL_L1)) {
        return false;
    }
    for (uint32_t i = 0; i < s->l1_size; i++) {
        uint64_t off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (off && !fn(o, off / cs, off / cs, QCOW2_OL_L2)) {
            return false;
        }
    }
    if (s->rt_clusters &&
        !fn(o, s->rt_offset / cs, s->rt_offset / cs + s->rt_clusters - 1, QCOW2_OL_REFT)) {
        return false;
    }
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (off && !fn(o, off / cs, off / cs, QCOW2_OL_REFB)) {
            return false;
        }
    }
    if (s->bm_disk.size && !fn(o, s->bm_disk.off / cs, (s->bm_disk.off + s->bm_disk.size - 1) / cs,
                               QCOW2_OL_BITMAP_DIR)) {
        return false;
    }
    if (s->snap_table_len && !fn(o, s->snap_table_off / cs, (s->snap_table_off + s->snap_table_len - 1) / cs,
                                 QCOW2_OL_SNAPSHOT_TABLE)) {
        return false;
    }
    for (uint32_t i = 0; i < s->snap_l1_n; i++) {
        uint64_t off = s->snap_l1[i][0], len = s->snap_l1[i][1];
        if (len && !fn(o, off / cs, (off + len - 1) / cs, QCOW2_OL_INACTIVE_L1)) {
            return false;
        }
    }
    return true;
}

static int cmp_range(const void *a, const void *b)
{
    uint64_t x = ((const uint64_t *)a)[0], y = ((const uint64_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* A snapshot's L1 table named past the end of the file: nothing there to
 * protect yet, but a write growing the file would put guest data (or a
 * new table) where the snapshot's L1 table is said to be, and reverting
 * to the snapshot would then read it as one. Kept as merged cluster
 * ranges, since a hostile table can name many huge ones. */
static void set_far(Qcow2State *s, const Qcow2Snapshot *sn, uint32_t n)
{
    free(s->snap_far);
    s->snap_far = NULL;
    s->snap_far_n = 0;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        k += sn[i].l1_bad;
    }
    uint64_t(*v)[2] = k ? malloc(k * sizeof(*v)) : NULL;
    if (!v) {
        return; /* none, or out of memory: unprotected, as before */
    }
    k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = (uint64_t)sn[i].l1_size * 8;
        /* An unaligned or oversized table is not one any tool would read. */
        if (!sn[i].l1_bad || !len || len > QCOW2_MAX_L1_BYTES || !qk_is_aligned(sn[i].l1_offset, s->cluster_size)) {
            continue;
        }
        v[k][0] = sn[i].l1_offset >> s->cluster_bits;
        v[k][1] = (sn[i].l1_offset + len - 1) >> s->cluster_bits;
        k++;
    }
    qsort(v, k, sizeof(*v), cmp_range);
    uint32_t m = 0;
    for (uint32_t i = 0; i < k; i++) {
        if (m && v[i][0] <= v[m - 1][1] + 1) {
            v[m - 1][1] = QK_MAX(v[m - 1][1], v[i][1]);
        } else {
            v[m][0] = v[i][0];
            v[m][1] = v[i][1];
            m++;
        }
    }
    if (!m) {
        free(v);
        return;
    }
    s->snap_far = v;
    s->snap_far_n = m;
}

/* Whether a range of clusters meets a far snapshot L1 table. */
static bool far_hit(const Qcow2State *s, uint64_t c0, uint64_t c1)
{
    /* First range ending at or after c0. */
    uint32_t lo = 0, hi = s->snap_far_n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->snap_far[mid][1] < c0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < s->snap_far_n && s->snap_far[lo][0] <= c1;
}

void qcow2_meta_set_snapshots(Qcow2State *s, const Qcow2Snapshot *sn, uint32_t n, uint64_t off, uint64_t len)
{
    free(s->snap_l1);
    s->snap_l1 = n ? malloc(n * sizeof(*s->snap_l1)) : NULL;
    /* Out of memory: the snapshots' tables go unprotected, as before. */
    s->snap_l1_n = s->snap_l1 ? n : 0;
    for (uint32_t i = 0; i < s->snap_l1_n; i++) {
        /* Tables past the end of the file go to set_far(). */
        s->snap_l1[i][0] = sn[i].l1_bad ? 0 : sn[i].l1_offset;
        s->snap_l1[i][1] = sn[i].l1_bad ? 0 : (uint64_t)sn[i].l1_size * 8;
    }
    set_far(s, sn, n);
    s->snap_table_off = len ? off : 0;
    s->snap_table_len = len;
    qcow2_meta_changed(s);
}

typedef struct Collect {
    MetaCluster *v;
    size_t n, cap;
} Collect;

static bool collect(void *o, uint64_t first, uint64_t last, unsigned kind)
{
    Collect *c = o;
    for (uint64_t x = first; x <= last; x++) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 64;
            MetaCluster *v = realloc(c->v, cap * sizeof(*v));
            if (!v) {
                return false;
            }
            c->v = v;
            c->cap = cap;
        }
        c->v[c->n++] = (MetaCluster){.c = x, .kind = kind};
    }
    return true;
}

static int cmp_cluster(const void *a, const void *b)
{
    uint64_t x = ((const MetaCluster *)a)->c, y = ((const MetaCluster *)b)->c;
    return x < y ? -1 : x > y;
}

static void rebuild(Qcow2State *s)
{
    Collect c = {0};
    free(s->meta_list);
    s->meta_list = NULL;
    s->meta_n = 0;
    if (each_meta(s, collect, &c)) {
        qsort(c.v, c.n, sizeof(*c.v), cmp_cluster);
        s->meta_list = c.v;
        s->meta_n = c.n;
    } else {
        free(c.v);
    }
    s->meta_built_gen = s->meta_gen;
    s->meta_checks = 0;
}

typedef struct Exact {
    uint64_t c0, c1;
    unsigned ignore, hit;
} Exact;

static bool exact(void *o, uint64_t first, uint64_t last, unsigned kind)
{
    Exact *e = o;
    if (!(kind & e->ignore) && first <= e->c1 && e->c0 <= last) {
        e->hit = kind;
        return false;
    }
    return true;
}

unsigned qcow2_meta_overlap(Qcow2State *s, uint64_t off, uint64_t len, unsigned ignore)
{
    if (!len) {
        return 0;
    }
    uint64_t c0 = off >> s->cluster_bits, c1 = (off + len - 1) >> s->cluster_bits;
    if (s->meta_built_gen != s->meta_gen || !s->meta_list || ++s->meta_checks > REBUILD_EVERY) {
        rebuild(s);
    }
    if (s->meta_list) {
        /* First entry at or after c0. */
        size_t lo = 0, hi = s->meta_n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->meta_list[mid].c < c0) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        bool candidate = false;
        for (size_t i = lo; i < s->meta_n && s->meta_list[i].c <= c1 && !candidate; i++) {
            candidate = !(s->meta_list[i].kind & ignore);
        }
        if (!candidate) {
            return !(ignore & QCOW2_OL_INACTIVE_L1) && far_hit(s, c0, c1) ? QCOW2_OL_INACTIVE_L1 : 0;
        }
    }
    Exact e = {.c0 = c0, .c1 = c1, .ignore = ignore};
    each_meta(s, exact, &e);
    if (!e.hit && !(ignore & QCOW2_OL_INACTIVE_L1) && far_hit(s, c0, c1)) {
        e.hit = QCOW2_OL_INACTIVE_L1;
    }
    return e.hit;
}

int coroutine_fn qcow2_meta_floor(Qcow2State *s, uint64_t *end)
{
    rebuild(s);
    if (!s->meta_list) {
        return -ENOMEM;
    }
    uint64_t last = 0;
    for (size_t i = 0; i < s->meta_n; i++) {
        uint64_t c = s->meta_list[i].c, rc;
        int r = qcow2_get_refcount(s, c, &rc);
        if (r < 0) {
            return r;
        }
        if (rc == 0) {
            return -QK_ECORRUPT;
        }
        last = QK_MAX(last, c);
    }
    *end = (last + 1) << s->cluster_bits;
    return 0;
}

/* what: "write on" or "free of", for the message QEMU's words give. */
static int refuse(Qcow2State *s, unsigned hit, const char *what)
{
    return qcow2_signal_corruption(s, "Preventing invalid %s metadata (overlaps with %s)", what, kind_name(hit));
}

int qcow2_check_data_write(Qcow2State *s, uint64_t off, uint64_t len)
{
    if (qcow2_has_data_file(s)) {
        return 0; /* guest data has a file of its own */
    }
    if (s->meta_corrupt) {
        return -EIO;
    }
    unsigned hit = qcow2_meta_overlap(s, off, len, 0);
    return hit ? refuse(s, hit, "write on") : 0;
}

int qcow2_check_data_free(Qcow2State *s, uint64_t off, uint64_t len)
{
    unsigned hit = qcow2_meta_overlap(s, off, len, 0);
    return hit ? refuse(s, hit, "free of") : 0;
}

int qcow2_check_table_write(Qcow2State *s, uint64_t off, uint64_t len, unsigned kind)
{
    unsigned hit = qcow2_meta_overlap(s, off, len, kind);
    return hit ? refuse(s, hit, "write on") : 0;
}

int coroutine_fn qcow2_co_write_new_meta(Qcow2State *s, uint64_t off, uint64_t len, const void *buf,
                                         unsigned ignore, int flags)
{
    int r = qcow2_check_table_write(s, off, len, ignore);
    return r < 0 ? r : qk_co_pwrite(s->bs->file, off, len, buf, flags);
}

int coroutine_fn qcow2_mark_corrupt_if_needed(Qcow2State *s)
{
    if (!s->meta_corrupt || (s->h.incompatible_features & QCOW2_INCOMPAT_CORRUPT)) {
        return 0;
    }
    return qcow2_set_incompat(s, s->h.incompatible_features | QCOW2_INCOMPAT_CORRUPT);
}
