/*
 * Refcounts: the refcount table and blocks of every width (1..64 bits),
 * refcount updates, growing the refcount table, and allocation of host
 * clusters (first-fit search from a hint, contiguous runs for multi-cluster
 * writes). Every caller holds s->lock.
 */
#include "qcow2/qcow2_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Growing the file ahead of allocation: an eighth of its size at a time,
 * between GROW_STEP_MIN and GROW_STEP_MAX (less when the new space must be
 * written with zeros), ending on a GROW_ALIGN (or cluster) boundary. */
#define GROW_STEP_MIN (1ULL << 20)
#define GROW_STEP_MAX (64ULL << 20)
#define GROW_STEP_MAX_ZEROED (8ULL << 20)
#define GROW_ALIGN 65536u

uint64_t qcow2_rb_get(const Qcow2State *s, const void *block, uint64_t i)
{
    const uint8_t *b = block;
    switch (s->refcount_order) {
    case 0: return (b[i / 8] >> (i % 8)) & 1;
    case 1: return (b[i / 4] >> (2 * (i % 4))) & 3;
    case 2: return (b[i / 2] >> (4 * (i % 2))) & 15;
    case 3: return b[i];
    case 4: return qk_be16_get(b + 2 * i);
    case 5: return qk_be32_get(b + 4 * i);
    default: return qk_be64_get(b + 8 * i);
    }
}

void qcow2_rb_set(const Qcow2State *s, void *block, uint64_t i, uint64_t v)
{
    uint8_t *b = block;
    unsigned shift, mask;
    switch (s->refcount_order) {
    case 0: shift = i % 8; mask = 1; b += i / 8; break;
    case 1: shift = 2 * (i % 4); mask = 3; b += i / 4; break;
    case 2: shift = 4 * (i % 2); mask = 15; b += i / 2; break;
    case 3: b[i] = (uint8_t)v; return;
    case 4: qk_be16_put(b + 2 * i, (uint16_t)v); return;
    case 5: qk_be32_put(b + 4 * i, (uint32_t)v); return;
    default: qk_be64_put(b + 8 * i, v); return;
    }
    *b = (uint8_t)((*b & ~(mask << shift)) | ((v & mask) << shift));
}

static uint64_t rb_mask(const Qcow2State *s)
{
    return (1ULL << s->rb_bits) - 1;
}

/* A refcount to lower that is already 0 (or that no refcount block
 * holds): said once, in words naming the cluster, so that a command
 * failing on it does not end in a bare "Structure needs cleaning". */
static int no_count_to_lower(Qcow2State *s, uint64_t cluster)
{
    qcow2_note_corruption(s, "Cannot free cluster %#" PRIx64 ": its refcount is already 0",
                          cluster << s->cluster_bits);
    return -QK_ECORRUPT;
}

/* Loads the refcount block at offset, checking it is sane first. */
static int coroutine_fn get_block(Qcow2State *s, uint64_t ti, void **block)
{
    uint64_t off = s->rt[ti] & QCOW2_REFT_OFFSET_MASK;
    if (off == 0) {
        return -QK_ECORRUPT;
    }
    if (!qk_is_aligned(off, s->cluster_size)) {
        /* As QEMU: no refcount of this image can be trusted for writing. */
        return qcow2_signal_corruption(s, "Refblock offset %#" PRIx64 " unaligned (reftable index: %#" PRIx64 ")",
                                       off, ti);
    }
    return qcow2_cache_get(s->rb_cache, off, block);
}

int coroutine_fn qcow2_get_refcount(Qcow2State *s, uint64_t cluster, uint64_t *rc)
{
    uint64_t ti = cluster >> s->rb_bits;
    if (ti >= s->rt_size || !(s->rt[ti] & QCOW2_REFT_OFFSET_MASK)) {
        *rc = 0;
        return 0;
    }
    void *b;
    int r = get_block(s, ti, &b);
    if (r < 0) {
        return r;
    }
    *rc = qcow2_rb_get(s, b, cluster & rb_mask(s));
    qcow2_cache_put(s->rb_cache, &b);
    return 0;
}

static int coroutine_fn write_rt_value(Qcow2State *s, uint64_t ti, uint64_t v)
{
    if (ti >= s->rt_disk_size) {
        return 0; /* the table being built is written whole later */
    }
    uint8_t b[8];
    qk_be64_put(b, v);
    return qk_co_pwrite(s->bs->file, s->rt_offset + ti * 8, 8, b, QK_REQ_KIND(QK_IO_REFTABLE));
}

int coroutine_fn qcow2_write_rt_entry(Qcow2State *s, uint64_t ti)
{
    return write_rt_value(s, ti, s->rt[ti]);
}

/* Writes zeros over [from, target) of the host file in large requests.
 * With O_DIRECT, a small write into a hole or an unwritten (fallocated)
 * extent makes the file system allocate or convert blocks under an
 * exclusive lock, several times slower than a write into blocks that were
 * already written; writing the new space once, sequentially, turns every
 * later small write into the fast kind. */
enum { ZEROS_CHUNK = 1 << 20 };
static void *zeros;

/* One buffer for the process, made once even when images on several
 * engine threads grow at the same moment; it is never written. */
static void make_zeros(void)
{
    zeros = qk_aligned_zalloc(4096, ZEROS_CHUNK);
}

static int coroutine_fn write_zeros(Qcow2State *s, uint64_t from, uint64_t target)
{
    enum { CHUNK = ZEROS_CHUNK };
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_zeros);
    if (!zeros) {
        return -ENOMEM;
    }
    for (uint64_t off = from; off < target;) {
        uint64_t n = QK_MIN((uint64_t)CHUNK - off % CHUNK, target - off);
        int r = qk_co_pwrite(s->bs->file, off, n, zeros, 0);
        if (r < 0) {
            return r;
        }
        off += n;
    }
    return 0;
}

/* True when an allocation ending at end must grow the file, or (small
 * allocations under O_DIRECT) must first have zeros written under it. */
static bool must_grow(const Qcow2State *s, uint64_t end, bool direct, bool bulk)
{
    return end > s->file_size || (direct && !bulk && end > s->written_end);
}

/* Makes the file reach end for an allocation. Grows ahead so that small
 * writes into new clusters do not each pay for extending the file; close
 * trims the excess. Only small allocations under O_DIRECT get written
 * zeros (see write_zeros): a bulk one is written right away by requests
 * large enough to amortise the file system's allocation, and zeros under
 * it would double the bytes written, so it grows the file sparsely like a
 * buffered image does. used is where allocated space ended before. */
static int coroutine_fn grow_file(Qcow2State *s, uint64_t end, uint64_t used, bool bulk)
{
    bool direct = (s->bs->file->open_flags & QK_OPEN_NOCACHE) != 0;
    if (!must_grow(s, end, direct, bulk)) {
        return 0;
    }
    qk_co_mutex_lock(&s->grow_lock);
    if (!must_grow(s, end, direct, bulk)) {
        qk_co_mutex_unlock(&s->grow_lock); /* grown while we waited */
        return 0;
    }
    bool zeros = direct && !bulk;
    uint64_t step = QK_MAX(QK_MIN(s->file_size / 8, zeros ? GROW_STEP_MAX_ZEROED : GROW_STEP_MAX), GROW_STEP_MIN);
    /* The new end on a 64 KiB (or cluster) boundary: an unaligned zero
     * write would go through a bounce buffer and a read-modify-write under
     * O_DIRECT, and leave the next growth unaligned too. */
    uint64_t target = qk_align_up(end + step, QK_MAX(s->cluster_size, GROW_ALIGN));
    int r = 0;
    if (zeros) {
        /* Sparse space below used was taken by bulk allocations, whose
         * data covers it; only never-allocated space is zeroed. */
        uint64_t from = QK_MAX(s->written_end, qk_align_up(used, s->cluster_size));
        if (end <= from) {
            target = from;
        } else {
            r = write_zeros(s, from, target);
        }
        if (r == 0) {
            s->written_end = target;
        }
    } else {
        QkError err = {0};
        r = qk_co_truncate(s->bs->file, target, QK_PREALLOC_OFF, &err);
    }
    if (r == 0 && target > s->file_size) {
        s->file_size = target;
        s->file_grown = true;
    }
    qk_co_mutex_unlock(&s->grow_lock);
    return r;
}

static int coroutine_fn ensure_size(Qcow2State *s, uint64_t end, bool bulk)
{
    uint64_t used = s->host_end;
    if (end > s->host_end) {
        s->host_end = end;
    }
    return grow_file(s, end, used, bulk);
}

int coroutine_fn qcow2_ensure_file_size(Qcow2State *s, uint64_t end)
{
    return ensure_size(s, end, false);
}

static int coroutine_fn grow_table(Qcow2State *s, uint64_t need_ti);

/* First-fit search for n free clusters. */
static int coroutine_fn find_free(Qcow2State *s, uint64_t n, uint64_t *start)
{
    uint64_t c = QK_MAX(s->free_hint, 1);
    uint64_t run_start = c, run = 0;
    bool hint_set = false;
    for (;;) {
        if (c >= s->reserved_start && c < s->reserved_end) {
            c = s->reserved_end;
            run = 0;
            continue;
        }
        if (((c + 1) << s->cluster_bits) > QCOW2_MAX_HOST_OFFSET) {
            return -EFBIG;
        }
        uint64_t ti = c >> s->rb_bits;
        uint64_t range_end = (ti + 1) << s->rb_bits;
        if (s->reserved_end > c && s->reserved_start < range_end) {
            range_end = QK_MAX(c + 1, s->reserved_start);
        }
        if (ti >= s->rt_size || !(s->rt[ti] & QCOW2_REFT_OFFSET_MASK)) {
            if (!hint_set) {
                s->free_hint = c;
                hint_set = true;
            }
            if (run == 0) {
                run_start = c;
            }
            if (run + (range_end - c) >= n) {
                *start = run_start;
                return 0;
            }
            run += range_end - c;
            c = range_end;
            continue;
        }
        void *b;
        int r = get_block(s, ti, &b);
        if (r < 0) {
            return r;
        }
        for (; c < range_end; c++) {
            if (qcow2_rb_get(s, b, c & rb_mask(s)) == 0) {
                if (!hint_set) {
                    s->free_hint = c;
                    hint_set = true;
                }
                if (run++ == 0) {
                    run_start = c;
                }
                if (run == n) {
                    qcow2_cache_put(s->rb_cache, &b);
                    *start = run_start;
                    return 0;
                }
            } else {
                run = 0;
            }
        }
        qcow2_cache_put(s->rb_cache, &b);
    }
}

/* Gives range ti a refcount block. */
static int coroutine_fn alloc_block(Qcow2State *s, uint64_t ti)
{
    for (;;) {
        uint64_t b;
        int r = find_free(s, 1, &b);
        if (r < 0) {
            return r;
        }
        uint64_t tb = b >> s->rb_bits;
        if (tb >= s->rt_size) {
            r = grow_table(s, tb);
            if (r < 0) {
                return r;
            }
            continue;
        }
        /* The file reaches b before the block is written: growing it may
         * write zeros over new space, which must not land on the block. */
        r = qcow2_ensure_file_size(s, (b + 1) << s->cluster_bits);
        if (r < 0) {
            return r;
        }
        bool self = tb == ti || !(s->rt[tb] & QCOW2_REFT_OFFSET_MASK);
        if (!self) {
            /* b is counted by an existing block. */
            r = qcow2_update_refcount(s, b << s->cluster_bits, s->cluster_size, 1);
            if (r < 0) {
                return r;
            }
        }
        void *blk;
        r = qcow2_cache_get_empty(s->rb_cache, b << s->cluster_bits, &blk);
        if (r < 0) {
            return r;
        }
        if (self) {
            /* The new block covers its own cluster. */
            qcow2_rb_set(s, blk, b & rb_mask(s), 1);
        }
        qcow2_cache_mark_dirty(s->rb_cache, blk);
        qcow2_cache_put(s->rb_cache, &blk);
        /* The table entry makes b a refcount block: every count it relies
         * on must be on disk first, the new block and, when b is counted
         * by another block, that block's increment too (a crash in
         * between would leave the block referenced with refcount 0). */
        r = qcow2_cache_flush(s->rb_cache);
        if (r < 0) {
            return r;
        }
        r = qk_co_flush(s->bs->file);
        if (r < 0) {
            return r;
        }
        uint64_t t = self ? tb : ti;
        /* In memory only once on disk: refcounts kept in a block the
         * table on disk does not name would read as 0 after a failed
         * write (the block's cluster leaks instead). */
        r = write_rt_value(s, t, b << s->cluster_bits);
        if (r < 0) {
            qcow2_cache_discard(s->rb_cache, b << s->cluster_bits);
            return r;
        }
        s->rt[t] = b << s->cluster_bits;
        qcow2_meta_added(s, b << s->cluster_bits, QCOW2_OL_REFB);
        if (t == ti) {
            return 0;
        }
    }
}

/* Replaces the refcount table with a bigger one covering need_ti. */
static int coroutine_fn grow_table(Qcow2State *s, uint64_t need_ti)
{
    uint64_t per_cluster = s->cluster_size / 8;
    uint64_t want = QK_MAX(need_ti + 1, s->rt_size + s->rt_size / 2);
    for (;;) {
        uint64_t nclusters = QK_DIV_ROUND_UP(want, per_cluster);
        if (nclusters * s->cluster_size > QCOW2_MAX_REFTABLE_BYTES) {
            return -EFBIG;
        }
        uint64_t start;
        int r = find_free(s, nclusters, &start);
        if (r < 0) {
            return r;
        }
        /* The table, and a few blocks after it, must be covered by itself. */
        uint64_t last_ti = (start + nclusters + 64) >> s->rb_bits;
        if (last_ti >= nclusters * per_cluster) {
            want = last_ti + 1;
            continue;
        }
        uint64_t entries = nclusters * per_cluster;
        uint64_t *nt = calloc(entries, 8);
        if (!nt) {
            return -ENOMEM;
        }
        memcpy(nt, s->rt, s->rt_size * 8);
        uint64_t *old = s->rt;
        uint64_t old_size = s->rt_size;
        uint64_t old_off = s->rt_offset, old_clusters = s->rt_clusters;
        s->rt = nt;
        qcow2_meta_changed(s);
        s->rt_size = entries;
        uint64_t saved_rs = s->reserved_start, saved_re = s->reserved_end;
        s->reserved_start = start;
        s->reserved_end = start + nclusters;
        r = qcow2_update_refcount(s, start << s->cluster_bits, nclusters << s->cluster_bits, 1);
        s->reserved_start = saved_rs;
        s->reserved_end = saved_re;
        if (r == 0) {
            r = qcow2_cache_flush(s->rb_cache);
        }
        uint64_t *be = NULL;
        if (r == 0) {
            be = malloc(entries * 8);
            r = be ? 0 : -ENOMEM;
        }
        if (r == 0) {
            for (uint64_t i = 0; i < entries; i++) {
                qk_be64_put(&be[i], nt[i]);
            }
            r = qcow2_ensure_file_size(s, (start + nclusters) << s->cluster_bits);
        }
        if (r == 0) {
            r = qk_co_pwrite(s->bs->file, start << s->cluster_bits, entries * 8, be,
                             QK_REQ_KIND(QK_IO_REFTABLE));
        }
        free(be);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
        if (r == 0) {
            s->h.refcount_table_offset = start << s->cluster_bits;
            s->h.refcount_table_clusters = (uint32_t)nclusters;
            r = qcow2_write_header_field(s, QCOW2_HOFF_REFTABLE, 12);
            if (r < 0) {
                qcow2_fence(s, r);
            }
        }
        if (r < 0) {
            /* Back to the table on disk. Blocks only the new table names
             * are unreachable from it: forget them (they counted nothing
             * but the new table's clusters, which leak at worst), so that
             * no later refcount goes where no reader would look; the next
             * allocation past the old table grows it again. Blocks the old
             * range gained meanwhile were written into the old table. */
            s->h.refcount_table_offset = old_off;
            s->h.refcount_table_clusters = old_clusters;
            memcpy(old, nt, old_size * 8);
            for (uint64_t i = old_size; i < entries; i++) {
                if (nt[i] & QCOW2_REFT_OFFSET_MASK) {
                    qcow2_cache_discard(s->rb_cache, nt[i] & QCOW2_REFT_OFFSET_MASK);
                }
            }
            s->rt = old;
            qcow2_meta_changed(s);
            s->rt_size = old_size;
            free(nt);
            return r;
        }
        s->rt_offset = start << s->cluster_bits;
        s->rt_clusters = (uint32_t)nclusters;
        s->rt_disk_size = entries;
        free(old);
        r = qk_co_flush(s->bs->file);
        if (r == 0) {
            r = qcow2_free_clusters(s, old_off, (uint64_t)old_clusters << s->cluster_bits);
        }
        return r;
    }
}

/*
 * Crash safety orders refcount changes against the references to the
 * clusters (L2 entries, and L1, snapshot and refcount tables and the
 * header, which their callers write directly):
 *  - an increase reaches the disk before a reference to the cluster: the
 *    L2 cache depends on the refcount cache (callers that write a
 *    reference directly flush the refcount cache first);
 *  - a decrease reaches the disk after the reference was dropped: the
 *    refcount cache depends on the L2 cache, with a barrier for the
 *    references callers dropped by writing the file directly (they do so
 *    before lowering the refcount). Otherwise a crash could leave a
 *    reference to a cluster counted as free.
 * The two directions alternate; switching writes out the cache that was
 * waited for, so a block may hold both kinds of change without a cycle.
 * Switching to the allocation direction also makes every dropped
 * reference durable before the allocator can hand the freed cluster out
 * again: new data written into it can never show through an old L2 entry
 * after a crash. That matters with lazy refcounts too (refcounts are
 * rebuilt from the references after a crash), so there allocation just
 * ends the free direction. Writes that only allocate pay nothing extra;
 * alternating frees and allocations (discard, or overwriting clusters
 * shared with a snapshot) pay one flush per switch.
 */
static int coroutine_fn order_change(Qcow2State *s, int64_t addend)
{
    if (addend < 0) {
        return qcow2_cache_depend(s->rb_cache, s->l2_cache, true);
    }
    if (s->lazy_refcounts) {
        return qcow2_cache_release(s->rb_cache);
    }
    return qcow2_cache_depend(s->l2_cache, s->rb_cache, false);
}

int coroutine_fn qcow2_update_refcount(Qcow2State *s, uint64_t off, uint64_t len, int64_t addend)
{
    if (len == 0) {
        return 0;
    }
    uint64_t first = off >> s->cluster_bits;
    uint64_t last = (off + len - 1) >> s->cluster_bits;
    void *b = NULL;
    uint64_t cur_ti = UINT64_MAX;
    int r = 0;
    for (uint64_t c = first; c <= last; c++) {
        uint64_t ti = c >> s->rb_bits;
        if (ti != cur_ti) {
            if (b) {
                qcow2_cache_put(s->rb_cache, &b);
            }
            if (ti >= s->rt_size) {
                if (addend < 0) {
                    r = no_count_to_lower(s, c);
                    break;
                }
                r = grow_table(s, ti);
                if (r < 0) {
                    break;
                }
            }
            if (!(s->rt[ti] & QCOW2_REFT_OFFSET_MASK)) {
                if (addend < 0) {
                    r = no_count_to_lower(s, c);
                    break;
                }
                r = alloc_block(s, ti);
                if (r < 0) {
                    break;
                }
            }
            /* Per block: making room above may have changed direction. */
            r = order_change(s, addend);
            if (r < 0) {
                break;
            }
            r = get_block(s, ti, &b);
            if (r < 0) {
                break;
            }
            cur_ti = ti;
        }
        uint64_t i = c & rb_mask(s);
        uint64_t v = qcow2_rb_get(s, b, i);
        uint64_t nv;
        if (addend < 0 && (uint64_t)-addend > v) {
            r = no_count_to_lower(s, c); /* the image's refcounts cannot be right */
            break;
        }
        if (addend > 0 && (v > s->refcount_max || (s->refcount_max - v) < (uint64_t)addend)) {
            /* Not damage: the width cannot count this far (a snapshot of
             * a refcount_bits=1 image, say). A stored 64-bit count above
             * the limit (2^63 - 1) is damage, and adding to it would
             * wrap it to 0: the cluster would be handed out again. */
            r = -ERANGE;
            break;
        }
        nv = v + (uint64_t)addend;
        qcow2_rb_set(s, b, i, nv);
        qcow2_cache_mark_dirty(s->rb_cache, b);
        if (nv == 0) {
            if (s->comp_next && (s->comp_next - 1) >> s->cluster_bits == c) {
                s->comp_next = 0; /* free now: compressed writes must not add to it */
            }
            if (c < s->free_hint) {
                s->free_hint = c;
            }
            /* A freed table must never be written back over new data. */
            qcow2_cache_discard(s->l2_cache, c << s->cluster_bits);
            if ((c << s->cluster_bits) != (s->rt[ti] & QCOW2_REFT_OFFSET_MASK)) {
                qcow2_cache_discard(s->rb_cache, c << s->cluster_bits);
            }
        }
    }
    if (b) {
        qcow2_cache_put(s->rb_cache, &b);
    }
    return r;
}

static int64_t coroutine_fn alloc_clusters(Qcow2State *s, uint64_t n, bool bulk)
{
    for (;;) {
        uint64_t start;
        int r = find_free(s, n, &start);
        if (r < 0) {
            return r;
        }
        uint64_t hint = s->free_hint;
        s->reserved_start = start;
        s->reserved_end = start + n;
        r = qcow2_update_refcount(s, start << s->cluster_bits, n << s->cluster_bits, 1);
        s->reserved_start = s->reserved_end = 0;
        if (r < 0) {
            return r;
        }
        /* Allocating refcount blocks may have used part of the run. */
        bool clash = false;
        for (uint64_t c = start; c < start + n && !clash; c++) {
            uint64_t rc;
            r = qcow2_get_refcount(s, c, &rc);
            if (r < 0) {
                return r;
            }
            clash = rc != 1;
        }
        if (clash) {
            r = qcow2_update_refcount(s, start << s->cluster_bits, n << s->cluster_bits, -1);
            if (r < 0) {
                return r;
            }
            continue;
        }
        if (hint == start) {
            s->free_hint = start + n;
        }
        r = ensure_size(s, (start + n) << s->cluster_bits, bulk);
        if (r < 0) {
            return r;
        }
        return (int64_t)(start << s->cluster_bits);
    }
}

int64_t coroutine_fn qcow2_alloc_clusters(Qcow2State *s, uint64_t n)
{
    return alloc_clusters(s, n, false);
}

int64_t coroutine_fn qcow2_alloc_clusters_bulk(Qcow2State *s, uint64_t n)
{
    return alloc_clusters(s, n, true);
}

int coroutine_fn qcow2_free_clusters(Qcow2State *s, uint64_t off, uint64_t len)
{
    return qcow2_update_refcount(s, qk_align_down(off, s->cluster_size),
                                 qk_align_up(off + len, s->cluster_size) - qk_align_down(off, s->cluster_size),
                                 -1);
}

void qcow2_compressed_range(const Qcow2State *s, uint64_t l2e, uint64_t *host, uint64_t *len)
{
    unsigned shift = 62 - (s->cluster_bits - 8);
    uint64_t nsec = ((l2e >> shift) & ((1ULL << (s->cluster_bits - 8)) - 1)) + 1;
    *host = l2e & ((1ULL << shift) - 1);
    /* The sector count is from the start of the host offset's sector. */
    *len = nsec * 512 - (*host & 511);
}

int qcow2_check_free_l2_entry(Qcow2State *s, uint64_t l2e)
{
    uint64_t off = l2e & QCOW2_L2E_OFFSET_MASK;
    if (l2e & QCOW2_OFLAG_COMPRESSED) {
        uint64_t host, len;
        qcow2_compressed_range(s, l2e, &host, &len);
        return qcow2_check_data_free(s, host, len);
    }
    if (qk_is_aligned(off, s->cluster_size)) {
        return off && !qcow2_has_data_file(s) ? qcow2_check_data_free(s, off, s->cluster_size) : 0;
    }
    /* As QEMU: the entry may go, its cluster leaks (check -r gives it back). */
    qcow2_note_corruption(s, "Cannot free unaligned cluster %#" PRIx64, off);
    return 0;
}

int coroutine_fn qcow2_free_l2_entry(Qcow2State *s, uint64_t l2e)
{
    int r = qcow2_check_free_l2_entry(s, l2e);
    if (r < 0) {
        return r;
    }
    uint64_t host, len;
    if (l2e & QCOW2_OFLAG_COMPRESSED) {
        qcow2_compressed_range(s, l2e, &host, &len);
        r = qcow2_free_clusters(s, host, len);
    } else {
        host = l2e & QCOW2_L2E_OFFSET_MASK;
        if (!host || qcow2_has_data_file(s) || !qk_is_aligned(host, s->cluster_size)) {
            return 0; /* data-file clusters are not counted; an unaligned one leaks */
        }
        r = qcow2_update_refcount(s, host, s->cluster_size, -1);
    }
    if (r == -QK_ECORRUPT) {
        /* A refcount already 0 (or a refcount block that cannot be read):
         * the reference is gone all the same, and what the refcounts say
         * is for check -r to mend. As QEMU, the request goes on. */
        qcow2_note_corruption(s, "Cannot free cluster %#" PRIx64 ": its refcount is 0 or cannot be read", host);
        r = 0;
    }
    return r;
}

/* A refcount block that counts nothing but (perhaps) itself. */
static int coroutine_fn block_is_empty(Qcow2State *s, uint64_t ti, bool *empty)
{
    uint64_t off = s->rt[ti] & QCOW2_REFT_OFFSET_MASK;
    void *b;
    int r = get_block(s, ti, &b);
    if (r < 0) {
        return r;
    }
    uint64_t self = off >> s->cluster_bits;
    bool self_here = (self >> s->rb_bits) == ti;
    *empty = true;
    for (uint64_t i = 0; i <= rb_mask(s) && *empty; i++) {
        uint64_t v = qcow2_rb_get(s, b, i);
        *empty = v == 0 || (self_here && i == (self & rb_mask(s)) && v == 1);
    }
    qcow2_cache_put(s->rb_cache, &b);
    return 0;
}

int coroutine_fn qcow2_drop_empty_refblocks(Qcow2State *s)
{
    int r = qcow2_cache_flush(s->rb_cache);
    for (uint64_t ti = s->rt_size; r == 0 && ti-- > 1;) {
        uint64_t off = s->rt[ti] & QCOW2_REFT_OFFSET_MASK;
        if (!off || ti >= s->rt_disk_size) {
            continue;
        }
        bool empty;
        r = block_is_empty(s, ti, &empty);
        if (r < 0 || !empty) {
            continue;
        }
        /* Unhooked on disk first: until then it is a live block, after it
         * a block that counts itself is free at once; one counted
         * elsewhere is freed there once the table entry is durable (a
         * crash in between leaks a cluster, never more). */
        qcow2_cache_discard(s->rb_cache, off);
        uint64_t old = s->rt[ti];
        s->rt[ti] = 0;
        qcow2_meta_changed(s);
        r = qcow2_write_rt_entry(s, ti);
        if (r == 0) {
            r = qk_co_flush(s->bs->file);
        }
        if (r < 0) {
            s->rt[ti] = old;
            qcow2_meta_changed(s);
            break;
        }
        uint64_t c = off >> s->cluster_bits;
        if ((c >> s->rb_bits) != ti) {
            r = qcow2_update_refcount(s, off, s->cluster_size, -1);
        } else if (c < s->free_hint) {
            s->free_hint = c;
        }
    }
    return r;
}
