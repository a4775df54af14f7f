/*
 * Repair (check -r leaks|all). Nothing is written before every cluster in
 * use is known: the references are computed from everything but the
 * refcount structure, which is then judged on its own. When it can be
 * trusted (table and blocks inside the file, aligned, used by nothing
 * else, and a stored refcount for every cluster in use) refcounts are
 * fixed in place; otherwise the whole structure is rebuilt elsewhere
 * (refcount_rebuild.c). Then OFLAG_COPIED of the active L1 and L2 entries
 * is made to match the refcounts, and the image is checked again from
 * scratch: the result reported is the image as it is after the repair.
 *
 * Crash safety: in-place fixes change refcounts only (no reference moves),
 * the rebuild switches the header only after the new structure is durable,
 * and OFLAG_COPIED is written after the refcounts it describes.
 */
#include "qcow2/check_int.h"
#include "qcow2/snapshot_int.h"

#include <stdlib.h>
#include <string.h>

/* Judges the stored refcount structure against the references computed
 * without it (k->skip_refcount_structure). When it is sound its own
 * clusters are added to k->refs, ready for an in-place repair. */
static bool coroutine_fn structure_trusted(Check *k)
{
    Qcow2State *s = k->s;
    bool ok = true;
    uint64_t rt_first = s->rt_offset >> s->cluster_bits;
    uint64_t rt_end = rt_first + s->rt_clusters;
    if (!ck_table_ok(k, s->rt_offset, (uint64_t)s->rt_clusters << s->cluster_bits)) {
        ck_say(k, "ERROR refcount table is outside the image");
        return false;
    }
    for (uint64_t c = rt_first; c < rt_end; c++) {
        if (k->refs[c]) {
            ck_say(k, "ERROR refcount table cluster %llu is also used by other metadata or data",
                   (unsigned long long)c);
            ok = false;
        }
        k->kind[c] |= CK_REFS;
    }
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (!s->rt[i]) {
            continue;
        }
        if ((s->rt[i] & ~QCOW2_REFT_OFFSET_MASK) || !qk_is_aligned(off, s->cluster_size) ||
            !qk_range_within(off, s->cluster_size, k->file_len)) {
            ck_say(k, "ERROR refcount table entry %llu is invalid (0x%llx)",
                   (unsigned long long)i, (unsigned long long)s->rt[i]);
            ok = false;
            continue;
        }
        uint64_t c = off >> s->cluster_bits;
        if (k->refs[c] || (k->kind[c] & CK_REFS)) {
            ck_say(k, "ERROR refcount block %llu (cluster %llu) is also used by other metadata or data",
                   (unsigned long long)i, (unsigned long long)c);
            ok = false;
        }
        k->kind[c] |= CK_REFS;
    }
    bool added = ok;
    for (uint64_t c = 0; added && c < k->nclusters; c++) {
        if (k->kind[c] & CK_REFS) {
            k->refs[c]++;
        }
    }
    /* A cluster in use without a stored refcount may already have been
     * handed out again: only a structure built from scratch is safe. */
    bool unreadable = false;
    for (uint64_t c = 0; c < k->nclusters + k->slack; c++) {
        uint64_t rc;
        if (!k->refs[c]) {
            continue;
        }
        if (!ck_stored_rc(k, c, &rc)) {
            if (!unreadable) {
                ck_say(k, "ERROR cannot read the refcount of cluster %llu", (unsigned long long)c);
            }
            unreadable = true;
            ok = false;
        } else if (rc == 0) {
            ok = false;
        }
    }
    /* Before the rebuild, every mismatch named in cluster order, as
     * qemu-img reports them; only the clusters in use without a refcount
     * when the structure's own clusters could not be counted. */
    bool all = added && !unreadable;
    for (uint64_t c = 0; !ok && c < k->nclusters + k->slack; c++) {
        uint64_t rc;
        if (ck_stored_rc(k, c, &rc) && (all ? rc != k->refs[c] : k->refs[c] && rc == 0)) {
            ck_say(k, "%s cluster %llu refcount=%llu reference=%u", rc > k->refs[c] ? "Leaked" : "ERROR",
                   (unsigned long long)c, (unsigned long long)rc, k->refs[c]);
        }
    }
    if (!ok) {
        /* The rebuild counts references without the old structure. */
        for (uint64_t c = 0; c < k->nclusters; c++) {
            if (added && (k->kind[c] & CK_REFS)) {
                k->refs[c]--;
            }
            k->kind[c] &= (uint8_t)~CK_REFS;
        }
    }
    return ok;
}

/* Fixes the stored refcounts one cluster at a time; the structure is sound. */
static int coroutine_fn fix_in_place(Check *k, int fix)
{
    Qcow2State *s = k->s;
    /* Two passes, as qemu-img reports them: every mismatch found, then
     * what was done about each. */
    uint64_t leaks = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && leaks && k->partial && (fix & QK_CHECK_FIX_LEAKS)) {
            ck_say(k, "ERROR not freeing the %llu leaked clusters: part of the metadata that may "
                   "still reference them could not be read", (unsigned long long)leaks);
        }
        /* The cluster just past the file (k->slack) too: its block is
         * stored, so a change there allocates nothing. */
        for (uint64_t c = 0; c < k->nclusters + k->slack; c++) {
            uint64_t rc, ref = k->refs[c];
            if (!ck_stored_rc(k, c, &rc) || rc == ref) {
                continue;
            }
            bool leak = rc > ref;
            leaks += pass == 0 && leak;
            /* Lowering a refcount is only safe when every reference was counted. */
            bool allowed = (fix & (leak ? QK_CHECK_FIX_LEAKS : QK_CHECK_FIX_ERRORS)) && !(leak && k->partial);
            /* A leak kept back for want of what references it was
             * named in pass 0, and the line above says why it stays. */
            if (pass == 1 && leak && k->partial) {
                continue;
            }
            if (pass == 0 || !allowed) {
                ck_say(k, "%s cluster %llu refcount=%llu reference=%llu", leak ? "Leaked" : "ERROR",
                       (unsigned long long)c, (unsigned long long)rc, (unsigned long long)ref);
                continue;
            }
            if (ref > s->refcount_max) {
                ck_say(k, "ERROR cluster %llu has %llu references; %u-bit refcounts cannot count them",
                       (unsigned long long)c, (unsigned long long)ref, s->refcount_bits);
                continue;
            }
            /* A damaged 64-bit count can be further above the reference
             * count than one signed step can say: lowered in steps. */
            uint64_t diff = leak ? rc - ref : ref - rc;
            while (diff) {
                uint64_t step = QK_MIN(diff, (uint64_t)INT64_MAX);
                int r = qcow2_update_refcount(s, c << s->cluster_bits, s->cluster_size,
                                              leak ? -(int64_t)step : (int64_t)step);
                if (r < 0) {
                    return r;
                }
                diff -= step;
            }
            ck_say(k, "Repairing cluster %llu refcount=%llu reference=%llu", (unsigned long long)c,
                   (unsigned long long)rc, (unsigned long long)ref);
        }
    }
    /* Durable before OFLAG_COPIED is made to agree with the new values. */
    int r = qcow2_flush_caches(s);
    return r < 0 ? r : qk_co_flush(s->bs->file);
}

/* A table may take a flag change unless it is (also) a live refcount
 * structure. A cluster that is both an L2 table and guest data changes
 * for the guest too, as it does with every later write to that table:
 * that damage cannot be undone by the repair, and qemu-img writes the
 * flags there as well. */
static bool writable_table(const Check *k, uint64_t off)
{
    uint64_t c = off >> k->s->cluster_bits;
    return c < k->nclusters && !(k->kind[c] & CK_REFS);
}

static bool want_copied(uint64_t rc)
{
    return rc == 1;
}

/* OFLAG_COPIED of the active L1 and L2 entries, set exactly when the
 * (now correct) refcount is 1. */
int coroutine_fn ck_fix_copied(Check *k)
{
    Qcow2State *s = k->s;
    bool l1_ok = true;
    for (uint64_t c = s->l1_offset >> s->cluster_bits;
         c < QK_DIV_ROUND_UP(s->l1_offset + (uint64_t)s->l1_size * 8, s->cluster_size); c++) {
        l1_ok &= writable_table(k, c << s->cluster_bits);
    }
    for (uint64_t i = 0; i < s->l1_size; i++) {
        uint64_t off = s->l1[i] & QCOW2_L1E_OFFSET_MASK;
        if (!off || !ck_table_ok(k, off, s->cluster_size)) {
            continue;
        }
        uint64_t rc;
        if (!ck_stored_rc(k, off >> s->cluster_bits, &rc)) {
            continue;
        }
        if (want_copied(rc) != !!(s->l1[i] & QCOW2_OFLAG_COPIED) && !(k->partial && want_copied(rc))) {
            if (l1_ok) {
                uint64_t old = s->l1[i];
                s->l1[i] = want_copied(rc) ? old | QCOW2_OFLAG_COPIED : old & ~QCOW2_OFLAG_COPIED;
                int r = qcow2_write_l1_entry(s, i);
                if (r < 0) {
                    s->l1[i] = old;
                    return r;
                }
                k->copied_repaired++;
                ck_say(k, "Repairing OFLAG_COPIED L2 cluster: l1_index=%llu l1_entry=%llx refcount=%llu",
                       (unsigned long long)i, (unsigned long long)old, (unsigned long long)rc);
            } else {
                ck_say(k, "ERROR OFLAG_COPIED L2 cluster: l1_index=%llu: the L1 table shares its "
                       "clusters with the refcount structure, not changing it", (unsigned long long)i);
            }
        }
        if (!writable_table(k, off)) {
            continue;
        }
        void *t;
        int r = qcow2_cache_get(s->l2_cache, off, &t);
        if (r < 0) {
            return r;
        }
        for (uint64_t j = 0; j < s->l2_entries; j++) {
            uint64_t bm;
            uint64_t e = qcow2_l2_get(s, t, j, &bm);
            uint64_t d = e & QCOW2_L2E_OFFSET_MASK;
            if ((e & QCOW2_OFLAG_COMPRESSED) && s->extended_l2 && bm) {
                qcow2_l2_set(s, t, j, e, 0);
                qcow2_cache_mark_dirty(s->l2_cache, t);
                ck_say(k, "Repairing compressed cluster %llu with non-zero subcluster allocation bitmap, "
                       "entry=0x%llx", (unsigned long long)j, (unsigned long long)e);
            }
            if ((e & QCOW2_OFLAG_COMPRESSED) || !d) {
                continue;
            }
            if (qcow2_has_data_file(s)) {
                rc = 1; /* a data file's clusters are never shared */
            } else if (!ck_stored_rc(k, d >> s->cluster_bits, &rc)) {
                continue;
            }
            if (want_copied(rc) == !!(e & QCOW2_OFLAG_COPIED) || (k->partial && want_copied(rc))) {
                continue; /* (a cluster counted once may be shared by what could not be read) */
            }
            uint64_t ne = want_copied(rc) ? e | QCOW2_OFLAG_COPIED : e & ~QCOW2_OFLAG_COPIED;
            qcow2_l2_set(s, t, j, ne, bm);
            qcow2_cache_mark_dirty(s->l2_cache, t);
            k->copied_repaired++;
            ck_say(k, "Repairing OFLAG_COPIED data cluster: l2_entry=%llx refcount=%llu",
                   (unsigned long long)e, (unsigned long long)rc);
        }
        qcow2_cache_put(s->l2_cache, &t);
    }
    int r = qcow2_flush_caches(s);
    return r < 0 ? r : qk_co_flush(s->bs->file);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The clusters of the refcount table and blocks about to be replaced that
 * nothing else uses, sorted (none when out of memory: they are only named). */
static size_t old_structure(Check *k, uint64_t **out)
{
    Qcow2State *s = k->s;
    uint64_t *c = malloc(((size_t)s->rt_clusters + s->rt_size + 1) * sizeof(*c));
    size_t n = 0;
    *out = c;
    if (!c) {
        return 0;
    }
    for (uint64_t i = 0; qk_is_aligned(s->rt_offset, s->cluster_size) && i < s->rt_clusters; i++) {
        c[n++] = (s->rt_offset >> s->cluster_bits) + i;
    }
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (off && qk_is_aligned(off, s->cluster_size)) {
            c[n++] = off >> s->cluster_bits;
        }
    }
    qsort(c, n, sizeof(*c), cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i] < k->nclusters && !k->refs[c[i]] && (m == 0 || c[m - 1] != c[i])) {
            c[m++] = c[i];
        }
    }
    return m;
}

/* After a rebuild, the old structure's clusters are free: named as
 * qemu-img names them, whose rebuild counts them first and then frees
 * them as leaks (their refcount was the old structure's 1). */
static void coroutine_fn say_released(Check *k, const uint64_t *old, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t rc;
        if (qcow2_get_refcount(k->s, old[i], &rc) == 0 && rc == 0) {
            ck_say(k, "Repairing cluster %llu refcount=1 reference=0", (unsigned long long)old[i]);
        }
    }
}

/* What a refusal says was left as it was: all of the image, unless
 * unaligned preallocated entries were made zero entries already (a change
 * that stands on its own), or damage met on the way marks the image
 * corrupt when it closes, as QEMU marks it. */
static const char *left_alone(const Check *k)
{
    if (k->prealloc_fixed) {
        return "the image is unchanged but for the preallocated entries repaired above";
    }
    return k->s->meta_corrupt && !k->s->read_only ? "the image is unchanged but marked corrupt"
                                                  : "the image is unchanged";
}

/* The repair proper; the caller checks again afterwards. */
static int coroutine_fn repair(Check *k, int fix, QkError *err)
{
    QkCheckResult scratch;
    memset(&scratch, 0, sizeof(scratch));
    k->res = &scratch;
    int r = ck_prepare(k);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not size the check");
    }
    k->skip_refcount_structure = true;
    ck_compute(k);
    k->skip_refcount_structure = false;
    if (scratch.check_errors) {
        return qk_error_set(err, -EIO, "could not read all of the image's metadata; not repairing, %s",
                            left_alone(k));
    }
    if (structure_trusted(k)) {
        r = fix_in_place(k, fix);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not write repaired refcounts");
        }
    } else if ((fix & QK_CHECK_FIX_ERRORS) && k->partial) {
        /* A rebuild counts only the references it can see. */
        return qk_error_set(err, -EIO, "the refcount structure must be rebuilt, but part of the metadata "
                            "could not be read; not repairing, %s", left_alone(k));
    } else if (fix & QK_CHECK_FIX_ERRORS) {
        ck_say(k, "Rebuilding refcount structure");
        uint64_t *old = NULL;
        size_t nold = old_structure(k, &old);
        r = ck_rebuild_refcounts(k, err);
        if (r == 0) {
            say_released(k, old, nold);
        }
        free(old);
        if (r < 0) {
            return r;
        }
    } else {
        /* As qemu-img: fixing leaks alone cannot make this image right. */
        ck_say(k, "ERROR need to rebuild refcount structures");
        return qk_error_set(err, -EIO, "the refcount structure must be rebuilt: repair with -r all (%s)",
                            left_alone(k));
    }
    bool copied = fix & QK_CHECK_FIX_ERRORS;
    if (!copied) {
        /* -r leaks changes the flags too, as qemu-img does, but only once
         * the refcounts they follow are right. */
        QkCheckReport *report = k->report;
        void *opaque = k->opaque;
        QkCheckResult left;
        k->skip_copied = true;
        r = ck_run(k, &left, NULL, NULL);
        k->skip_copied = false;
        k->report = report;
        k->opaque = opaque;
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not check the repaired refcounts");
        }
        copied = !left.corruptions && !left.leaks && !left.check_errors;
        if (!copied) {
            ck_check_copied(k); /* named, as qemu-img names them, not changed */
        }
    }
    if (copied) {
        r = ck_fix_copied(k);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not write repaired OFLAG_COPIED flags");
        }
    }
    return 0;
}

/* Snapshot entries with more extra data than QEMU's limit make every
 * open refuse the table. -r all keeps the first bytes of it, as qemu-img
 * does, and writes the table anew (new clusters durable before the header
 * names them, the old ones freed last). It runs after the refcounts are
 * right, since writing the table allocates. Entries of a v3 image with
 * too little extra data for the disk size (check's "incomplete") are
 * written with all of it, as qemu-img repairs them: the disk size is the
 * image's, the instruction count unknown. */
static int coroutine_fn fix_snapshot_extra(Check *k, QkError *err)
{
    Qcow2State *s = k->s;
    Qcow2Snapshot *sn;
    uint32_t n, capped;
    QkError e2 = {0};
    if (qcow2_snapshots_read_capped(s, &sn, &n, NULL, &capped, &e2) < 0) {
        qk_error_clear(&e2);
        return 0; /* damaged otherwise: check reports what it finds */
    }
    int r = 0;
    uint32_t incomplete = 0;
    for (uint32_t i = 0; i < n; i++) {
        incomplete += sn[i].incomplete;
    }
    if (capped || incomplete) {
        for (uint32_t i = 0; i < n; i++) {
            if (sn[i].extra_dropped) {
                ck_say(k, "Discarding too much extra metadata in snapshot table entry %u (%u > %u)", i,
                       sn[i].extra_dropped, QCOW2_SN_MAX_EXTRA);
            } else if (sn[i].incomplete) {
                ck_say(k, "Repairing snapshot table entry %u is incomplete", i); /* qemu-img's words */
            }
        }
        r = qcow2_snapshots_write(s, sn, n, err);
    }
    qcow2_snapshots_free(sn, n);
    return r;
}

/* Like qemu: a repaired image with nothing left wrong is marked clean and
 * consistent again. */
static int coroutine_fn mark_clean(Check *k, const QkCheckResult *res)
{
    Qcow2State *s = k->s;
    uint64_t bits = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
    if (res->corruptions || res->check_errors) {
        return 0;
    }
    /* Damage met during the repair (a refcount block at an unaligned
     * offset, say) is what it repaired: the image is not marked for it
     * when it closes. */
    s->meta_corrupt = false;
    if (!(s->h.incompatible_features & bits) || !qcow2_is_v3(s)) {
        return 0;
    }
    int r = qk_co_flush(s->bs->file);
    if (r == 0) {
        r = qcow2_set_incompat(s, s->h.incompatible_features & ~bits);
    }
    if (r == 0) {
        s->dirty_set_by_us = false;
    }
    return r;
}

/* The lines of the check after a repair, held back: qemu-img prints that
 * check only when something was fixed (otherwise the repair pass, which
 * named every error, was the whole report). */
typedef struct {
    char **line;
    size_t n;
    bool lost;      /* out of memory: what is held is incomplete */
} HeldLines;

static void hold_line(void *opaque, const char *line)
{
    HeldLines *h = opaque;
    char *copy = h->lost ? NULL : strdup(line);
    char **grown = copy ? realloc(h->line, (h->n + 1) * sizeof(*h->line)) : NULL;
    if (!grown) {
        free(copy);
        h->lost = true;
        return;
    }
    h->line = grown;
    h->line[h->n++] = copy;
}

static void release_lines(HeldLines *h, QkCheckReport *report, void *opaque)
{
    for (size_t i = 0; i < h->n; i++) {
        if (report) {
            report(opaque, h->line[i]);
        }
        free(h->line[i]);
    }
    free(h->line);
    memset(h, 0, sizeof(*h));
}

/* Grows the file to end (zeros), durably, before anything relies on it. */
static int coroutine_fn extend_file(Check *k, uint64_t end)
{
    QkError e2 = {0};
    int r = qk_co_truncate(k->s->bs->file, end, QK_PREALLOC_OFF, &e2);
    if (r == 0) {
        r = qk_co_flush(k->s->bs->file);
    }
    qk_error_clear(&e2);
    if (r == 0) {
        k->s->file_size = QK_MAX(k->s->file_size, end);
    }
    return r;
}

int coroutine_fn ck_repair(Check *k, int fix, QkCheckResult *res, QkError *err)
{
    QkCheckReport *report = k->report;
    void *opaque = k->opaque;
    QkCheckResult before, refs_only;
    int r = ck_run(k, &before, NULL, NULL);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not check the image");
    }
    /* Refcounts that cannot be read are the rebuild's to replace; any
     * other part that cannot be read stops the repair. */
    if ((uint32_t)before.check_errors > k->rc_unreadable) {
        return qk_error_set(err, -EIO, "could not read all of the image's metadata; not repairing, %s",
                            left_alone(k));
    }
    uint32_t prealloc = 0;
    if ((fix & QK_CHECK_FIX_ERRORS) && k->prealloc_bad) {
        /* First, as qemu-img does while it counts: unaligned preallocated
         * entries become plain zero entries (they read as zeros either
         * way), durable before any refcount follows the references they
         * drop. Only those lines are said here. */
        QkCheckResult scratch;
        k->fix_prealloc = true;
        k->prealloc_fixed = 0;
        k->fix_report = report;
        k->fix_opaque = opaque;
        r = ck_run(k, &scratch, NULL, NULL);
        k->fix_prealloc = false;
        k->fix_report = NULL;
        prealloc = k->prealloc_fixed;
        if (r == 0 && prealloc) {
            r = qcow2_flush_caches(k->s);
            if (r == 0) {
                r = qk_co_flush(k->s->bs->file);
            }
            if (r == 0) {
                r = ck_run(k, &before, NULL, NULL);
            }
        }
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not repair the preallocated clusters");
        }
    }
    uint32_t cut = 0;
    if ((fix & QK_CHECK_FIX_ERRORS) && k->sn_cut_short) {
        /* A file cut short: what is gone of the snapshot table cannot be
         * read back, and until the header stops naming it no repair can
         * tell what those snapshots referenced (their clusters stay
         * leaked). The whole entries stay; the rest are dropped, first,
         * before the file may grow over where they were (they would read
         * as zeros then, snapshots of nothing). */
        k->report = report;
        k->opaque = opaque;
        uint32_t nb = k->s->h.nb_snapshots;
        if (k->sn_partial_end) {
            /* The cut entry's L1 table is in the file: the entries after
             * it are dropped (header first), then the file grows over the
             * rest of its fixed part (if the cut is in it) and the fixed
             * part is written with what survives of it, no id, no name and
             * no extra data (a v3 image's is written below with the
             * incomplete entries). */
            uint32_t keep = k->sn_whole + 1;
            uint64_t at = k->sn_partial_end - QCOW2_SN_FIXED_LEN;
            uint8_t ent[QCOW2_SN_FIXED_LEN] = {0};
            r = qk_co_pread(k->s->bs->file, at, QK_MIN(k->file_len - at, sizeof(ent)), ent, 0);
            if (r < 0) {
                return qk_error_set_errno(err, r, "Could not read the snapshot table");
            }
            memset(ent + 12, 0, 4);
            memset(ent + 36, 0, 4);
            ck_say(k, "Repairing the snapshot table: the end of the file cuts entry %u short after its L1 "
                   "table's place; keeping %u of %u entries, the last without a name or an id", k->sn_whole,
                   keep, nb);
            r = keep < nb ? qcow2_snapshots_cut(k->s, keep, err) : 0;
            if (r < 0) {
                return r;
            }
            /* (Never shorter: a cut in its names leaves the file longer.) */
            r = k->sn_partial_end > k->file_len ? extend_file(k, k->sn_partial_end) : 0;
            if (r == 0) {
                r = qk_co_pwrite(k->s->bs->file, at, sizeof(ent), ent, QK_REQ_KIND(QK_IO_SNAPSHOT));
            }
            if (r == 0) {
                r = qk_co_flush(k->s->bs->file);
            }
            if (r < 0) {
                return qk_error_set_errno(err, r, "Could not extend the file over the snapshot table");
            }
            k->file_len = QK_MAX(k->file_len, k->sn_partial_end);
            qcow2_snapshots_protect(k->s);
            cut = 1;
        } else {
            if (k->sn_whole) {
                ck_say(k, "Repairing the snapshot table: the end of the file cuts it short; keeping its first "
                       "%u of %u entries", k->sn_whole, nb);
            } else {
                ck_say(k, "Repairing the snapshot table: it lies past the end of the file; dropping its %u "
                       "entr%s", nb, nb == 1 ? "y" : "ies");
            }
            r = qcow2_snapshots_cut(k->s, k->sn_whole, err);
            if (r < 0) {
                return r;
            }
            cut = 1;
        }
    }
    if ((fix & QK_CHECK_FIX_ERRORS) && k->sn_names_end > k->file_len) {
        /* Only the last entry's names are missing (or its lengths are
         * damaged): nothing is dropped, the file grows over them and the
         * missing bytes read as zeros, as qemu-img reads them now. */
        k->report = report;
        k->opaque = opaque;
        ck_say(k, "Repairing the snapshot table: the end of the file cuts its last entry's names short; "
               "extended to 0x%llx (the missing bytes read as zeros)", (unsigned long long)k->sn_names_end);
        r = extend_file(k, k->sn_names_end);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not extend the file over the snapshot table");
        }
        /* The step below must not cut it back. */
        k->file_len = k->sn_names_end;
        cut = 1;
    }
    uint32_t extended = 0;
    if ((fix & QK_CHECK_FIX_ERRORS) && k->short_end > k->file_len) {
        /* L2 tables the end of the file cuts short: the file grows over
         * them, so they read whole, their lost part as zeros (as qemu-img
         * reads them all along). Nothing else changes meaning. */
        k->report = report;
        k->opaque = opaque;
        ck_say(k, "Repairing the end of the file: extended to 0x%llx over the L2 tables it cut short",
               (unsigned long long)k->short_end);
        r = extend_file(k, k->short_end);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not extend the file over its cut-short L2 tables");
        }
        extended = k->short_tables;
    }
    /* What was fixed is counted as qemu-img counts it: the refcount
     * problems found before, plus each OFLAG_COPIED flag changed (flags that
     * only disagreed with a wrong refcount are not counted twice). */
    k->skip_copied = true;
    r = ck_run(k, &refs_only, NULL, NULL);
    k->skip_copied = false;
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not check the image");
    }
    k->copied_repaired = 0;
    bool repaired = before.corruptions || before.leaks;
    if (repaired) {
        k->report = report;
        k->opaque = opaque;
        r = repair(k, fix, err);
        if (r == 0 && (fix & QK_CHECK_FIX_ERRORS)) {
            r = fix_snapshot_extra(k, err);
        }
        if (r < 0) {
            return r;
        }
    }
    HeldLines held = {0};
    r = ck_run(k, res, hold_line, &held);
    if (r < 0) {
        release_lines(&held, report, opaque);
        return qk_error_set_errno(err, r, "Could not check the repaired image");
    }
    int found = refs_only.corruptions + k->copied_repaired + (int)extended + (int)prealloc + (int)cut;
    res->corruptions_fixed = found > res->corruptions ? found - res->corruptions : 0;
    res->leaks_fixed = before.leaks > res->leaks ? before.leaks - res->leaks : 0;
    bool said = repaired && !res->corruptions_fixed && !res->leaks_fixed && !held.lost;
    release_lines(&held, said ? NULL : report, opaque);
    r = mark_clean(k, res);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not mark the repaired image clean");
    }
    return 0;
}
