/*
 * Internal snapshots: create (the active L1 copied, every cluster it
 * reaches counted once more, COPIED cleared so later writes copy), apply
 * (the snapshot's L1 becomes the active one), delete (its references
 * dropped, clusters nobody else reaches freed), list, and dropping the
 * VM-state area from the active L1.
 *
 * Refcounts follow QEMU: a data cluster is counted once for every L1 table
 * (active or snapshot) whose tree reaches it, even through a shared L2.
 * Crash model: references are added before anything points at the new
 * structure and dropped only after nothing does, and each switch is one
 * header write; a crash can leak clusters, never leave one under-counted.
 * Every entry point quiesces the node and holds s->lock.
 */
#include "qcow2/snapshot_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A run of host-contiguous clusters whose refcounts change together. */
typedef struct Run {
    uint64_t start, len;
} Run;

static int coroutine_fn run_flush(Qcow2State *s, Run *run, int addend)
{
    int r = 0;
    if (run->len && addend) {
        r = qcow2_update_refcount(s, run->start, run->len, addend);
    }
    run->len = 0;
    return r;
}

static int coroutine_fn run_add(Qcow2State *s, Run *run, uint64_t off, uint64_t len, int addend)
{
    if (run->len && run->start + run->len == off) {
        run->len += len;
        return 0;
    }
    int r = run_flush(s, run, addend);
    run->start = off;
    run->len = len;
    return r;
}

/* A dropped table's clusters in an external data file: given back to
 * the host (advisory, as a discard), in runs. */
static int coroutine_fn discard_data(Qcow2State *s, uint64_t l2off)
{
    void *t;
    int r = qcow2_cache_get(s->l2_cache, l2off, &t);
    if (r < 0) {
        return r;
    }
    uint64_t start = 0, len = 0;
    for (uint64_t j = 0; j <= s->l2_entries; j++) {
        uint64_t bm;
        uint64_t e = j < s->l2_entries ? qcow2_l2_get(s, t, j, &bm) : 0;
        uint64_t off = e & QCOW2_L2E_OFFSET_MASK;
        bool mapped = (off || (e & QCOW2_OFLAG_COPIED)) && !(e & QCOW2_OFLAG_COMPRESSED);
        if (mapped && len && off == start + len) {
            len += s->cluster_size;
            continue;
        }
        if (len) {
            qk_co_pdiscard(s->data, start, len);
        }
        start = off;
        len = mapped ? s->cluster_size : 0;
    }
    qcow2_cache_put(s->l2_cache, &t);
    return 0;
}

/* A data entry of a tree losing its references that names live metadata
 * (only a corrupt entry does): its reference is not counted down, so the
 * table keeps the refcount its real use needs and is never handed out
 * again. A leak at worst. */
static bool names_live_metadata(Qcow2State *s, int addend, uint64_t off, uint64_t len)
{
    return addend < 0 && qcow2_meta_overlap(s, off, len, 0) != 0;
}

static int past_end(Qcow2State *s, uint64_t off)
{
    qcow2_note_corruption(s, "Data cluster %#" PRIx64 " lies past the end of the file", off);
    return -QK_ECORRUPT;
}

/* One L2 table of the walk (see qcow2_walk_l1). */
static int coroutine_fn walk_l2(Qcow2State *s, uint64_t l2off, int addend, bool fix_copied)
{
    if (qcow2_has_data_file(s)) {
        /* Its entries point into the data file: nothing here counts them
         * (and no snapshot shares them, so COPIED stays as it is). */
        return addend < 0 && !s->data_raw ? discard_data(s, l2off) : 0;
    }
    void *t;
    int r = qcow2_cache_get(s->l2_cache, l2off, &t);
    if (r < 0) {
        return r;
    }
    /* A walk that only looks (before a snapshot shares the tree, or a
     * deletion lowers what it shares) also refuses a cluster past the end
     * of the file: sharing it would count a cluster that is not there, as
     * qemu-img refuses to. */
    bool looking = addend == 0 && !fix_copied;
    Run run = {0, 0};
    bool dirty = false;
    for (uint64_t j = 0; j < s->l2_entries && r == 0; j++) {
        uint64_t bm;
        uint64_t e = qcow2_l2_get(s, t, j, &bm);
        if (e & QCOW2_OFLAG_COMPRESSED) {
            uint64_t host, len;
            qcow2_compressed_range(s, e, &host, &len);
            uint64_t a = qk_align_down(host, s->cluster_size);
            uint64_t alen = qk_align_up(host + len, s->cluster_size) - a;
            if (looking && a >= s->file_size) {
                r = past_end(s, a);
                break;
            }
            if (!names_live_metadata(s, addend, a, alen)) {
                r = run_add(s, &run, a, alen, addend);
            }
            continue;
        }
        uint64_t off = e & QCOW2_L2E_OFFSET_MASK;
        if (!off) {
            continue;
        }
        if (!qk_is_aligned(off, s->cluster_size)) {
            r = qcow2_bad_data_offset(s, off, l2off, j);
            break;
        }
        if (looking && off >= s->file_size) {
            r = past_end(s, off);
            break;
        }
        if (names_live_metadata(s, addend, off, s->cluster_size)) {
            continue;
        }
        r = run_add(s, &run, off, s->cluster_size, addend);
        if (r < 0 || !fix_copied) {
            continue;
        }
        uint64_t ne;
        if (addend > 0) {
            /* Another L1 now reaches it: shared whatever it was before. */
            ne = e & ~QCOW2_OFLAG_COPIED;
        } else {
            uint64_t rc;
            r = run_flush(s, &run, addend);
            if (r == 0) {
                r = qcow2_get_refcount(s, off >> s->cluster_bits, &rc);
            }
            if (r < 0) {
                break;
            }
            ne = rc == 1 ? (e | QCOW2_OFLAG_COPIED) : (e & ~QCOW2_OFLAG_COPIED);
        }
        if (ne != e) {
            qcow2_l2_set(s, t, j, ne, bm);
            dirty = true;
        }
    }
    if (r == 0) {
        r = run_flush(s, &run, addend);
    }
    if (dirty) {
        qcow2_cache_mark_dirty(s->l2_cache, t);
    }
    qcow2_cache_put(s->l2_cache, &t);
    return r;
}

int coroutine_fn qcow2_walk_l1(Qcow2State *s, uint64_t *l1, uint64_t n, int addend, bool fix_copied,
                               bool *l1_changed)
{
    if (l1_changed) {
        *l1_changed = false;
    }
    /* A walk that only sets flags goes on past a table it cannot read
     * (the first error is returned at the end): the flags elsewhere
     * still have to follow the refcounts. */
    int first_err = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l2off = l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (!l2off) {
            continue;
        }
        if (!qk_is_aligned(l2off, s->cluster_size)) {
            return qcow2_bad_l2_offset(s, l2off, i);
        }
        /* A table that is live metadata of another kind (only a corrupt
         * L1 entry names one: the active L1 table itself, a refcount
         * block) is neither walked nor freed: it leaks, and the structure
         * it really is stays in use. L2 tables may be shared. */
        if (addend < 0 && qcow2_meta_overlap(s, l2off, s->cluster_size, QCOW2_OL_L2)) {
            continue;
        }
        /* The table is released before its own refcount may drop to 0. */
        int r = walk_l2(s, l2off, addend, fix_copied);
        if (r < 0 && addend == 0 && fix_copied && !s->meta_corrupt) {
            first_err = first_err ? first_err : r;
            continue;
        }
        if (r == 0 && addend) {
            r = qcow2_update_refcount(s, l2off, s->cluster_size, addend);
        }
        if (r < 0) {
            return r;
        }
        if (fix_copied) {
            uint64_t rc;
            r = qcow2_get_refcount(s, l2off >> s->cluster_bits, &rc);
            if (r < 0) {
                return r;
            }
            uint64_t ne = rc == 1 ? (l1[i] | QCOW2_OFLAG_COPIED) : (l1[i] & ~QCOW2_OFLAG_COPIED);
            if (ne != l1[i] && l1_changed) {
                *l1_changed = true;
            }
            l1[i] = ne;
        }
    }
    return first_err;
}

/* Writes n entries of l1 (host order) at off, zero-padded to whole
 * clusters: the active table in place, or a new copy in clusters just
 * allocated for it (checked against live metadata first). */
static int coroutine_fn write_l1(Qcow2State *s, uint64_t off, const uint64_t *l1, uint64_t n, bool strip_copied)
{
    uint64_t bytes = qk_align_up(QK_MAX(n * 8, 1), s->cluster_size);
    uint64_t *be = qk_aligned_zalloc(qk_block_buf_align(s->bs), bytes);
    if (!be) {
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < n; i++) {
        qk_be64_put(&be[i], strip_copied ? l1[i] & ~QCOW2_OFLAG_COPIED : l1[i]);
    }
    unsigned ignore = off == s->l1_offset ? QCOW2_OL_L1 : 0;
    int r = qcow2_co_write_new_meta(s, off, bytes, be, ignore, QK_REQ_KIND(QK_IO_L1));
    free(be);
    return r;
}

/* Writes the in-memory active L1 back in place (after COPIED changes).
 * A failure leaves l1_dirty set, so the next flush (or close) tries again:
 * COPIED flags on disk that disagree with the refcounts are corruption to
 * qemu-img check. */
int coroutine_fn qcow2_rewrite_active_l1(Qcow2State *s)
{
    s->l1_dirty = true;
    int r = write_l1(s, s->l1_offset, s->l1, s->l1_size, false);
    if (r == 0) {
        s->l1_dirty = false;
    }
    return r;
}

static int coroutine_fn read_l1(Qcow2State *s, uint64_t off, uint64_t n, uint64_t alloc_n, uint64_t **out)
{
    uint64_t *t = calloc(QK_MAX(alloc_n, 1), 8);
    if (!t) {
        return -ENOMEM;
    }
    int r = n ? qk_co_pread(s->bs->file, off, n * 8, t, 0) : 0;
    if (r < 0) {
        free(t);
        return r;
    }
    for (uint64_t i = 0; i < n; i++) {
        t[i] = be64toh(t[i]);
    }
    *out = t;
    return 0;
}

static uint64_t l1_clusters_bytes(const Qcow2State *s, uint64_t n)
{
    return qk_align_up(QK_MAX(n * 8, 1), s->cluster_size);
}

/* Metadata stable on disk: refcount blocks, then L2 tables, then a flush. */
static int coroutine_fn sync_all(Qcow2State *s)
{
    int r = qcow2_flush_caches(s);
    return r < 0 ? r : qk_co_flush(s->bs->file);
}

/* Adds delta to the refcount of every cluster the active tree uses (0:
 * none), recomputes its COPIED flags, writes the active L1 table back if
 * they changed, and makes it all stable. */
static int coroutine_fn update_active_tree(Qcow2State *s, int delta)
{
    bool changed;
    int r = 0;
    if (delta == 0) {
        /* A COPIED flag set below relies on a refcount the caller just
         * lowered to 1: that decrease reaches the disk first, or a power
         * loss could keep the flag on a cluster still counted twice. */
        r = sync_all(s);
        if (r < 0) {
            /* The flags stay as they were (never COPIED on a shared
             * cluster); the next snapshot operation or the close sets
             * them once the refcounts are out. */
            s->copied_stale = true;
            return r;
        }
        s->copied_stale = false;
    }
    /* A walk that fails half way leaves some flags changed in memory. */
    bool was_dirty = s->l1_dirty;
    s->l1_dirty = true;
    r = qcow2_walk_l1(s, s->l1, s->l1_size, delta, true, &changed);
    if (r == 0 && (changed || was_dirty)) {
        r = qcow2_rewrite_active_l1(s);
    } else if (r == 0) {
        s->l1_dirty = false;
    }
    return r < 0 ? r : sync_all(s);
}

/* Before a snapshot shares the active tree: clears COPIED on every entry
 * of the L2 tables this image owns and on the L1 entries, and makes that
 * durable, all before any refcount rises. A crash in between then leaves
 * only entries without COPIED whose refcount is still 1 (the next write
 * copies them; check -r sets the flag back), never COPIED on a cluster
 * whose refcount already says it is shared. Shared L2 tables (L1 entry
 * without COPIED) are not written: their entries are shared already. */
static int coroutine_fn drop_copied_active(Qcow2State *s)
{
    bool l1_changed = false;
    int r = 0;
    for (uint64_t i = 0; i < s->l1_size && r == 0; i++) {
        uint64_t l2off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (!l2off || !(s->l1[i] & QCOW2_OFLAG_COPIED)) {
            continue;
        }
        if (!qk_is_aligned(l2off, s->cluster_size)) {
            return qcow2_bad_l2_offset(s, l2off, i);
        }
        void *t;
        r = qcow2_cache_get(s->l2_cache, l2off, &t);
        if (r < 0) {
            return r;
        }
        bool dirty = false;
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t bm;
            uint64_t e = qcow2_l2_get(s, t, j, &bm);
            if (e & QCOW2_OFLAG_COPIED) {
                qcow2_l2_set(s, t, j, e & ~QCOW2_OFLAG_COPIED, bm);
                dirty = true;
            }
        }
        if (dirty) {
            qcow2_cache_mark_dirty(s->l2_cache, t);
        }
        qcow2_cache_put(s->l2_cache, &t);
        s->l1[i] &= ~QCOW2_OFLAG_COPIED;
        s->l1_dirty = true; /* a failed rewrite below is retried by the next flush */
        l1_changed = true;
    }
    if (r == 0) {
        r = sync_all(s);
    }
    if (r == 0 && l1_changed) {
        r = qcow2_rewrite_active_l1(s);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
    }
    return r;
}

int coroutine_fn qcow2_fix_stale_copied(Qcow2State *s)
{
    return s->copied_stale ? update_active_tree(s, 0) : 0;
}

static void begin(Qcow2State *s)
{
    qk_co_block_quiesce_begin(s->bs);
    qk_co_mutex_lock(&s->lock);
}

static void end(Qcow2State *s)
{
    qk_co_mutex_unlock(&s->lock);
    qk_block_quiesce_end(s->bs);
}

static int check_writable(Qcow2State *s, QkError *err)
{
    if (s->read_only) {
        return qk_error_set(err, -EACCES, "Permission denied");
    }
    if (s->refcount_max < 2) {
        return qk_error_set(err, -ENOTSUP, "snapshots need refcounts of at least 2 bits");
    }
    return 0;
}

/* The active L1 table and the L2 tables whose flags a snapshot's
 * creation or deletion rewrites must not lie on other live metadata (only
 * a corrupt header or L1 entry puts them there): the overlap check would
 * refuse those writes half way, after the refcounts changed for good and
 * before the flags followed. Refused before anything changes. Creation
 * rewrites only tables marked COPIED (clearing flags); deletion may set
 * flags in any table (`only_copied` false). */
static int active_tree_writable(Qcow2State *s, bool only_copied)
{
    int r = qcow2_check_table_write(s, s->l1_offset, (uint64_t)s->l1_size * 8, QCOW2_OL_L1);
    for (uint64_t i = 0; i < s->l1_size && r == 0; i++) {
        uint64_t l2off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (l2off && (!only_copied || (s->l1[i] & QCOW2_OFLAG_COPIED))) {
            r = qcow2_check_table_write(s, l2off, s->cluster_size, QCOW2_OL_L2);
        }
    }
    return r;
}

static int coroutine_fn create_locked(Qcow2State *s, const QkSnapshotInfo *info, QkError *err)
{
    Qcow2Snapshot *tab;
    uint32_t n;
    int r = qcow2_snapshots_read(s, &tab, &n, NULL, err);
    if (r < 0) {
        return r;
    }
    char idbuf[24];
    const char *id = info->id;
    if (!id || !*id) {
        snprintf(idbuf, sizeof(idbuf), "%llu", (unsigned long long)qcow2_snapshot_next_id(tab, n));
        id = idbuf;
    }
    /* Only ids are unique: like qemu-img, a name may be used again (apply
     * and delete then take the first snapshot of that name). */
    if (qcow2_snapshot_find(tab, n, id, NULL) >= 0) {
        r = qk_error_set(err, -EEXIST, "Snapshot ID '%s' already exists", id);
    } else if (n >= QCOW2_MAX_SNAPSHOTS) {
        r = qk_error_set(err, -EFBIG, "Too many snapshots");
    }
    Qcow2Snapshot *nt = r == 0 ? realloc(tab, (n + 1) * sizeof(*nt)) : NULL;
    if (r == 0 && !nt) {
        r = qk_error_set(err, -ENOMEM, "out of memory");
    }
    if (r < 0) {
        qcow2_snapshots_free(tab, n);
        return r;
    }
    tab = nt;
    Qcow2Snapshot *sn = &tab[n];
    memset(sn, 0, sizeof(*sn));
    sn->id = strdup(id);
    sn->name = strdup(info->name);
    sn->l1_size = s->l1_size;
    sn->vm_state_size = info->vm_state_size;
    sn->vm_clock_nsec = info->vm_clock_nsec;
    sn->disk_size = s->h.size;
    sn->icount = info->icount;
    sn->date_sec = info->date_sec;
    sn->date_nsec = info->date_nsec;
    if (!info->date_sec && !info->date_nsec) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sn->date_sec = (uint32_t)ts.tv_sec;
        sn->date_nsec = (uint32_t)ts.tv_nsec;
    }
    n++;
    if (!sn->id || !sn->name) {
        qcow2_snapshots_free(tab, n);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }

    /* A walk that adds nothing only looks: every table and cluster of the
     * active tree must start where a cluster does, before anything
     * changes. A walk that stopped half way would leave COPIED flags
     * cleared on clusters still counted once. */
    r = qcow2_walk_l1(s, s->l1, s->l1_size, 0, false, NULL);
    if (r == 0) {
        r = active_tree_writable(s, true);
    }
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not update the refcounts");
        goto out;
    }
    /* The snapshot's copy of L1, written before anything refers to it. */
    uint64_t l1_bytes = l1_clusters_bytes(s, s->l1_size);
    int64_t l1off = qcow2_alloc_clusters(s, l1_bytes >> s->cluster_bits);
    r = l1off < 0 ? (int)l1off : 0;
    if (r == 0) {
        sn->l1_offset = (uint64_t)l1off;
        r = write_l1(s, (uint64_t)l1off, s->l1, s->l1_size, true);
    }
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not write the snapshot's L1 table");
        goto out;
    }
    r = drop_copied_active(s);
    if (r == 0) {
        r = update_active_tree(s, 1);
    }
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not update the refcounts");
        /* No snapshot was taken: the flags go back to what the refcounts
         * say (best effort; raised refcounts stay as leaks), so a failed
         * create leaves the active tree as it was. */
        update_active_tree(s, 0);
        goto out;
    }
    r = qcow2_snapshots_write(s, tab, n, err);
out:
    qcow2_snapshots_free(tab, n);
    return r;
}

int coroutine_fn qcow2_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (qcow2_has_data_file(s)) {
        /* Its clusters are not counted, so nothing could share them. */
        return qk_error_set(err, -ENOTSUP, "internal snapshots are not supported with an external data file");
    }
    if (strlen(info->name) > UINT16_MAX) {
        /* Before anything is allocated: the table could not hold it. */
        return qk_error_set(err, -EINVAL, "snapshot name too long");
    }
    int r = check_writable(s, err);
    if (r < 0) {
        return r;
    }
    begin(s);
    r = qcow2_flush_caches(s);
    if (r == 0) {
        r = qcow2_fix_stale_copied(s);
    }
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not write metadata");
    } else {
        r = create_locked(s, info, err);
    }
    end(s);
    return r;
}

/* A snapshot's L1 table, and the L2 tables it names, must lie clear of
 * the header, the active L1 table, the refcount structures and the bitmap
 * directory (its L2 tables may be active ones: shared). Checked before
 * applying it changes anything: a damaged or hostile table would
 * otherwise become the active L1 and only fail once the old tree's
 * references were being dropped. */
static bool snapshot_tree_sane(Qcow2State *s, const Qcow2Snapshot *sn, const uint64_t *l1)
{
    /* Its L1 table is one of the snapshots' (inactive) ones, of course. */
    if (sn->l1_size &&
        qcow2_meta_overlap(s, sn->l1_offset, (uint64_t)sn->l1_size * 8, QCOW2_OL_L2 | QCOW2_OL_INACTIVE_L1)) {
        return false;
    }
    for (uint64_t i = 0; i < sn->l1_size; i++) {
        uint64_t off = l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (off && (!qk_is_aligned(off, s->cluster_size) ||
                    qcow2_meta_overlap(s, off, s->cluster_size, QCOW2_OL_L2))) {
            return false;
        }
    }
    return true;
}

static int coroutine_fn goto_locked(Qcow2State *s, const Qcow2Snapshot *sn, QkError *err)
{
    if (!qk_is_aligned(sn->disk_size, 512) || sn->disk_size > (1ULL << 62)) {
        return qk_error_corrupt(err, "snapshot '%s' has an invalid disk size", sn->name);
    }
    uint64_t new_size = QK_MAX((uint64_t)sn->l1_size, qcow2_l1_needed(s, sn->disk_size));
    if (new_size * 8 > QCOW2_MAX_L1_BYTES) {
        return qk_error_set(err, -EFBIG, "L1 table would be too large");
    }
    uint64_t *nl1;
    int r = read_l1(s, sn->l1_offset, sn->l1_size, new_size, &nl1);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not read the snapshot's L1 table");
    }
    if (!snapshot_tree_sane(s, sn, nl1)) {
        free(nl1);
        return qk_error_corrupt(err, "Failed to load snapshot: its tables overlap the image's metadata");
    }
    /* A snapshot of another size resizes the disk: the stored bitmaps are
     * marked in use first, as for a resize, or a crash after the header
     * write would leave them claiming to be saved at the old size. */
    if (sn->disk_size != s->h.size) {
        r = qcow2_bitmaps_begin_resize(s, sn->disk_size, err);
        if (r < 0) {
            free(nl1);
            return r;
        }
    }
    /* The snapshot's tree gains the active reference first... */
    r = qcow2_walk_l1(s, nl1, sn->l1_size, 1, false, NULL);
    for (uint64_t i = 0; i < new_size; i++) {
        nl1[i] &= ~QCOW2_OFLAG_COPIED;
    }
    uint64_t l1_bytes = l1_clusters_bytes(s, new_size);
    int64_t l1off = -1;
    if (r == 0) {
        l1off = qcow2_alloc_clusters(s, l1_bytes >> s->cluster_bits);
        r = l1off < 0 ? (int)l1off : 0;
    }
    if (r == 0) {
        r = write_l1(s, (uint64_t)l1off, nl1, new_size, false);
    }
    if (r == 0) {
        r = sync_all(s);
    }
    /* ...then one header write makes it the active L1 with its disk size... */
    Qcow2Header old_h = s->h;
    if (r == 0) {
        s->h.size = sn->disk_size;
        s->h.l1_size = (uint32_t)new_size;
        s->h.l1_table_offset = (uint64_t)l1off;
        r = qcow2_write_header_field(s, QCOW2_HOFF_SIZE_AND_L1, QCOW2_SIZE_AND_L1_LEN);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
        if (r < 0) {
            s->h = old_h;
            qcow2_fence(s, r);
        }
    }
    if (r < 0) {
        free(nl1);
        return qk_error_set_errno(err, r, "Could not switch to the snapshot's L1 table");
    }
    uint64_t *old_l1 = s->l1;
    uint64_t old_n = s->l1_size, old_off = s->l1_offset;
    s->l1 = nl1;
    s->l1_size = (uint32_t)new_size;
    qcow2_meta_changed(s);
    s->l1_offset = (uint64_t)l1off;
    s->bs->size = sn->disk_size;
    /* ...and only then does the old tree lose it. */
    r = qcow2_walk_l1(s, old_l1, old_n, -1, false, NULL);
    free(old_l1);
    if (r == 0) {
        r = qcow2_free_clusters(s, old_off, l1_clusters_bytes(s, old_n));
    }
    if (r == 0) {
        r = update_active_tree(s, 0);
    }
    return r < 0 ? qk_error_set_errno(err, r, "Could not update the refcounts") : 0;
}

/* Writes cached metadata back (the table must describe what is on disk),
 * then reads the snapshot table. */
static int coroutine_fn flush_and_read_table(Qcow2State *s, Qcow2Snapshot **tab, uint32_t *n, bool lenient,
                                             QkError *err)
{
    int r = qcow2_flush_caches(s);
    if (r == 0) {
        r = qcow2_fix_stale_copied(s);
    }
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not write metadata");
    }
    return lenient ? qcow2_snapshots_read_lenient(s, tab, n, NULL, err) : qcow2_snapshots_read(s, tab, n, NULL, err);
}

int coroutine_fn qcow2_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                        QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (qcow2_has_data_file(s)) {
        /* Refused before the lookup, in qemu-img's words. */
        return qk_error_set(err, -ENOTSUP, "Failed to load snapshot: Operation not supported");
    }
    int r = check_writable(s, err);
    if (r < 0) {
        return r;
    }
    begin(s);
    Qcow2Snapshot *tab = NULL;
    uint32_t n = 0;
    r = flush_and_read_table(s, &tab, &n, false, err);
    if (r == 0) {
        int i = qcow2_snapshot_find_id_or_name(tab, n, id_or_name);
        r = i < 0 ? qk_error_set(err, -ENOENT, "Failed to load snapshot: No such file or directory")
                  : goto_locked(s, &tab[i], err);
        *vm_state_size = r == 0 ? tab[i].vm_state_size : 0;
    }
    qcow2_snapshots_free(tab, n);
    end(s);
    return r;
}

/* A read-only view of a snapshot (convert -l): its L1 table replaces the
 * active one in memory; nothing is written, and the virtual size stays the
 * image's, as QEMU's temporary load keeps it. Entries past the snapshot's
 * L1 read as unallocated. */
int coroutine_fn qcow2_co_snapshot_load_tmp(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (!s->read_only) {
        return qk_error_set(err, -EINVAL, "Device is not readonly");
    }
    Qcow2Snapshot *tab = NULL;
    uint32_t n = 0;
    begin(s);
    int r = qcow2_snapshots_read(s, &tab, &n, NULL, err);
    if (r == 0) {
        int i = qcow2_snapshot_find(tab, n, id, name);
        uint64_t *nl1 = NULL;
        if (i < 0) {
            r = qk_error_set(err, -ENOENT, "Can't find snapshot");
        } else if ((r = read_l1(s, tab[i].l1_offset, tab[i].l1_size, tab[i].l1_size, &nl1)) < 0) {
            qk_error_set_errno(err, r, "Could not read the snapshot's L1 table");
        } else {
            free(s->l1);
            s->l1 = nl1;
            s->l1_size = tab[i].l1_size;
            qcow2_meta_changed(s);
            s->l1_offset = tab[i].l1_offset;
        }
    }
    qcow2_snapshots_free(tab, n);
    end(s);
    return r;
}

int coroutine_fn qcow2_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    int r = check_writable(s, err);
    if (r < 0) {
        return r;
    }
    begin(s);
    Qcow2Snapshot *tab = NULL;
    uint32_t n = 0;
    r = flush_and_read_table(s, &tab, &n, true, err);
    int i = r == 0 ? qcow2_snapshot_find(tab, n, id, name) : -1;
    if (r == 0 && i < 0) {
        r = qk_error_set(err, -ENOENT, "snapshot not found");
    }
    /* OFLAG_COPIED in the active tree follows the refcounts the deletion
     * lowers: an active table that cannot be read (or names a cluster
     * where none starts) could not take its flags, and would be left with
     * entries counted once but not marked so; so would a table the flags
     * cannot be written to. Refused before any change. */
    if (r == 0) {
        r = qcow2_walk_l1(s, s->l1, s->l1_size, 0, false, NULL);
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not read the image's active tables");
        } else {
            r = active_tree_writable(s, false);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not update the active tables' flags");
            }
        }
    }
    if (r < 0) {
        qcow2_snapshots_free(tab, n);
        end(s);
        return r;
    }
    Qcow2Snapshot gone = tab[i];
    memmove(&tab[i], &tab[i + 1], (n - (uint32_t)i - 1) * sizeof(*tab));
    n--;
    /* Out of the table first: from here a crash only leaks. */
    r = qcow2_snapshots_write(s, tab, n, err);
    qcow2_snapshots_free(tab, n);
    uint64_t *l1 = NULL;
    /* A snapshot whose L1 table cannot be read goes from the table all
     * the same, as qemu-img lets it go; what it referenced leaks (check
     * -r leaks gets it back). */
    if (r == 0 && !gone.l1_bad) {
        r = read_l1(s, gone.l1_offset, gone.l1_size, gone.l1_size, &l1);
        if (r == 0) {
            r = qcow2_walk_l1(s, l1, gone.l1_size, -1, false, NULL);
        }
        free(l1);
        if (r == 0 && gone.l1_size) {
            r = qcow2_free_clusters(s, gone.l1_offset, (uint64_t)gone.l1_size * 8);
        }
        /* Even after a walk that stopped half way (a table it could not
         * read): the refcounts it lowered are right, the rest leak, and
         * OFLAG_COPIED must follow what was lowered, or clusters the
         * active tree alone now holds read as errors. */
        int ur = update_active_tree(s, 0);
        if (r == 0) {
            r = ur;
        }
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not free the snapshot's clusters");
        }
    }
    free(gone.id);
    free(gone.name);
    free(gone.extra_unknown);
    end(s);
    return r;
}

int coroutine_fn qcow2_drop_l1_tail(Qcow2State *s, uint64_t from)
{
    if (from >= s->l1_size) {
        return 0;
    }
    uint64_t n = s->l1_size - from;
    uint64_t *gone = malloc(n * 8);
    if (!gone) {
        return -ENOMEM;
    }
    bool any = false;
    for (uint64_t i = 0; i < n; i++) {
        gone[i] = s->l1[from + i];
        any |= (gone[i] & QCOW2_L1E_OFFSET_MASK) != 0;
        s->l1[from + i] = 0;
    }
    qcow2_meta_changed(s);
    int r = 0;
    if (any) {
        /* Unhooked on disk before the references go. */
        r = qcow2_rewrite_active_l1(s);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
        if (r < 0) {
            memcpy(s->l1 + from, gone, n * 8);
        } else {
            r = qcow2_walk_l1(s, gone, n, -1, false, NULL);
        }
    }
    free(gone);
    return r;
}

int coroutine_fn qcow2_co_vmstate_discard(QkBlock *bs, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (s->read_only) {
        return qk_error_set(err, -EACCES, "Permission denied");
    }
    begin(s);
    int r = qcow2_flush_caches(s);
    if (r == 0) {
        r = qcow2_drop_l1_tail(s, qcow2_l1_needed(s, s->h.size));
    }
    if (r == 0) {
        r = sync_all(s);
    }
    end(s);
    return r < 0 ? qk_error_set_errno(err, r, "Could not discard the VM state") : 0;
}

int coroutine_fn qcow2_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *count, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    Qcow2Snapshot *tab;
    uint32_t n;
    *list = NULL;
    *count = 0;
    qk_co_mutex_lock(&s->lock);
    int r = qcow2_snapshots_read_lenient(s, &tab, &n, NULL, err);
    qk_co_mutex_unlock(&s->lock);
    if (r < 0) {
        return r;
    }
    QkSnapshotInfo *l = calloc(QK_MAX(n, 1), sizeof(*l));
    if (!l) {
        qcow2_snapshots_free(tab, n);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        l[i] = (QkSnapshotInfo){
            .id = tab[i].id, .name = tab[i].name, .vm_state_size = tab[i].vm_state_size,
            .date_sec = tab[i].date_sec, .date_nsec = tab[i].date_nsec,
            .vm_clock_nsec = tab[i].vm_clock_nsec, .disk_size = tab[i].disk_size, .icount = tab[i].icount,
        };
        tab[i].id = tab[i].name = NULL; /* moved */
    }
    qcow2_snapshots_free(tab, n);
    *list = l;
    *count = (int)n;
    return 0;
}
