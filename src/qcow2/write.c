/*
 * The write path. Writes into subclusters (clusters with standard L2)
 * that are allocated and owned by this image (COPIED) go straight to the
 * file and run in parallel. Anything else is an allocating write:
 *  - a cluster with no host offset gets a new one (several contiguous
 *    ones for a long write); only the partial subclusters at the edges of
 *    the request are copied, untouched subclusters stay as they were;
 *  - an owned cluster whose target subclusters are unallocated or zero is
 *    filled in place, copying only the partial edge subclusters;
 *  - a compressed or shared cluster is replaced by a copy of all of it;
 *    with extended L2, a shared one by a copy of the span from its first
 *    to its last allocated subcluster (and the write's own), the rest
 *    keeping its zero bits or staying unallocated, as QEMU does.
 * Copies of zeros are skipped when the host bytes are known to be zeros
 * (space never used before, see the clean-host table in deps.c). Order:
 * refcounts, then data, then L2 (a flush between data and the L2 table's
 * write, see update_l2); the L2 entry is read, changed and
 * written back under s->lock at update time, so writes into one cluster
 * that finish in any order each add only their own bits.
 */
#include "qcow2/qcow2_int.h"
#include "block/debug.h"

#include <stdlib.h>
#include <string.h>

/* One allocating request covers at most this many bytes of clusters (one
 * L2 table's worth at most too); longer writes are split. */
#define MAX_WRITE_SPAN (32ULL << 20)
/* Copy-on-write buffers: head and tail areas each start on this boundary,
 * which suits O_DIRECT on every device we meet. */
#define COW_BUF_ALIGN 4096u

#define STACK_IOVS 8

typedef struct AllocPlan {
    uint64_t c0, n;              /* clusters written */
    uint64_t l1i, i0;
    bool fresh;                  /* new host clusters */
    bool replace;                /* fresh, and the old cluster must be copied */
    bool keep_bits;              /* replace with extended L2: subclusters outside
                                  * [head, tail) keep their zero bits, the rest
                                  * stays unallocated */
    bool virgin;                 /* fresh host space never used before */
    uint64_t host;               /* host offset of cluster c0 (after allocation when fresh) */
    uint64_t wend;               /* end of the guest data written by this step */
    uint64_t head, tail;         /* COW areas: [head, off) and [wend, tail) */
    bool head_zero, tail_zero;   /* the area reads as zeros */
    bool head_write, tail_write; /* the area must be written to the host */
} AllocPlan;

static bool needs_new_host(const Qcow2State *s, uint64_t e)
{
    if (qcow2_has_data_file(s)) {
        /* Data clusters sit at their guest offsets and are never shared. */
        return !qcow2_l2e_mapped(s, e);
    }
    return !(e & QCOW2_L2E_OFFSET_MASK) || (e & QCOW2_OFLAG_COMPRESSED) || !(e & QCOW2_OFLAG_COPIED);
}

/* True when [off, off+len) reads as zeros (no backing data, zero flags). */
static int coroutine_fn area_is_zero(Qcow2State *s, uint64_t off, uint64_t len)
{
    int64_t blen = s->bs->backing ? qk_block_length(s->bs->backing) : 0;
    while (len) {
        Qcow2Extent ext;
        int r = qcow2_get_extent(s, off, len, &ext);
        if (r < 0) {
            return r;
        }
        bool z = ext.type == QCOW2_ZERO_PLAIN || ext.type == QCOW2_ZERO_ALLOC ||
                 (ext.type == QCOW2_UNALLOC && (blen <= 0 || off >= (uint64_t)blen));
        if (!z) {
            return 0;
        }
        off += ext.bytes;
        len -= ext.bytes;
    }
    return 1;
}

/* Subclusters of cluster c (guest) covered by [a, b), as a bit mask. */
static uint32_t sc_mask(const Qcow2State *s, uint64_t c, uint64_t a, uint64_t b)
{
    uint64_t cs = c << s->cluster_bits, ce = cs + s->cluster_size;
    a = QK_MAX(a, cs);
    b = QK_MIN(b, ce);
    if (a >= b) {
        return 0;
    }
    unsigned first = (unsigned)((a - cs) >> s->sc_bits);
    unsigned last = (unsigned)((b - 1 - cs) >> s->sc_bits);
    uint64_t m = ((2ULL << last) - 1) & ~((1ULL << first) - 1);
    return (uint32_t)m;
}

/* Decides, under s->lock, what an allocating write at off does. Returns 1
 * when the range turned out to be allocated (the caller writes in place). */
static int coroutine_fn plan_alloc(Qcow2State *s, uint64_t off, uint64_t bytes, AllocPlan *p)
{
    const uint64_t cs = s->cluster_size, scs = s->sc_size;
    memset(p, 0, sizeof(*p));
    p->c0 = off >> s->cluster_bits;
    p->l1i = p->c0 >> s->l2_bits;
    p->i0 = p->c0 & (s->l2_entries - 1);
    uint64_t table_last = ((p->l1i + 1) << s->l2_bits) - 1;
    uint64_t max_n = QK_MAX(1ULL, MAX_WRITE_SPAN >> s->cluster_bits);
    uint64_t clast = QK_MIN((off + bytes - 1) >> s->cluster_bits, table_last);
    clast = QK_MIN(clast, p->c0 + max_n - 1);
    if (p->l1i >= s->l1_size) {
        return -EINVAL;
    }

    Qcow2Extent ext;
    uint64_t first_len = QK_MIN(off + bytes, (p->c0 + 1) * cs) - off;
    int r = qcow2_get_extent_for_write(s, off, first_len, &ext);
    if (r < 0) {
        return r;
    }
    if (ext.type == QCOW2_NORMAL && ext.copied) {
        return 1; /* someone allocated it while we waited */
    }
    uint64_t l2off = s->l1[p->l1i] & QCOW2_L1E_OFFSET_MASK;
    void *t = NULL;
    if (l2off) {
        r = qcow2_cache_get(s->l2_cache, l2off, &t);
        if (r < 0) {
            return r;
        }
    }
    uint64_t bm = 0;
    uint64_t e0 = t ? qcow2_l2_get(s, t, p->i0, &bm) : 0;
    const uint32_t alloc0 = (uint32_t)(bm & QCOW2_BITMAP_ALL_ALLOC);
    p->n = 1;
    if (needs_new_host(s, e0)) {
        p->fresh = true;
        p->replace = (e0 & QCOW2_L2E_OFFSET_MASK) || (e0 & QCOW2_OFLAG_COMPRESSED);
        while (!p->replace && p->c0 + p->n <= clast) {
            uint64_t e = t ? qcow2_l2_get(s, t, p->i0 + p->n, &bm) : 0;
            if ((e & QCOW2_L2E_OFFSET_MASK) || (e & QCOW2_OFLAG_COMPRESSED)) {
                break;
            }
            p->n++;
        }
    } else {
        p->host = e0 & QCOW2_L2E_OFFSET_MASK;
    }
    if (t) {
        qcow2_cache_put(s->l2_cache, &t);
    }

    uint64_t start = p->c0 * cs, end = (p->c0 + p->n) * cs;
    p->wend = QK_MIN(off + bytes, end);
    if (p->replace && s->extended_l2 && !(e0 & QCOW2_OFLAG_COMPRESSED)) {
        /* A shared cluster with extended L2 (a snapshot holds it): only
         * the span from its first to its last allocated subcluster, and
         * the write's own, is copied (unallocated subclusters inside it
         * get the backing file's data, zero ones zeros), as QEMU copies
         * it. The rest keeps its zero bits or stays unallocated. */
        p->keep_bits = true;
        p->head = qk_align_down(off, scs);
        p->tail = QK_MIN(qk_align_up(p->wend, scs), end);
        if (alloc0) {
            p->head = QK_MIN(p->head, start + (uint64_t)__builtin_ctz(alloc0) * scs);
            p->tail = QK_MAX(p->tail, start + (uint64_t)(32 - __builtin_clz(alloc0)) * scs);
        }
    } else if (p->replace) {
        p->head = start;
        p->tail = end;
    } else {
        p->head = qk_align_down(off, scs);
        p->tail = QK_MIN(qk_align_up(p->wend, scs), end);
    }
    /* An edge subcluster that is already allocated needs no copy. */
    if (!p->fresh && p->head < off) {
        r = qcow2_get_extent(s, p->head, off - p->head, &ext);
        if (r < 0) {
            return r;
        }
        if (ext.type == QCOW2_NORMAL && ext.bytes == off - p->head) {
            p->head = off;
        }
    }
    if (!p->fresh && p->wend < p->tail) {
        r = qcow2_get_extent(s, p->wend, p->tail - p->wend, &ext);
        if (r < 0) {
            return r;
        }
        if (ext.type == QCOW2_NORMAL && ext.bytes == p->tail - p->wend) {
            p->tail = p->wend;
        }
    }
    if (p->head < off) {
        r = area_is_zero(s, p->head, off - p->head);
        if (r < 0) {
            return r;
        }
        p->head_zero = r;
    }
    if (p->wend < p->tail) {
        r = area_is_zero(s, p->wend, p->tail - p->wend);
        if (r < 0) {
            return r;
        }
        p->tail_zero = r;
    }
    p->head_write = p->head < off;
    p->tail_write = p->wend < p->tail;
    /* In place: zeros need no copy where the host subcluster never held data. */
    if (!p->fresh) {
        uint64_t in = p->head & (cs - 1);
        if (p->head_write && p->head_zero && qcow2_clean_is_zero(s, p->host, (unsigned)(in >> s->sc_bits))) {
            p->head_write = false;
        }
        in = (p->tail - 1) & (cs - 1);
        if (p->tail_write && p->tail_zero && qcow2_clean_is_zero(s, p->host, (unsigned)(in >> s->sc_bits))) {
            p->tail_write = false;
        }
    }
    return 0;
}

static void plan_to_req(const Qcow2State *s, const AllocPlan *p, uint64_t off, Qcow2Req *req)
{
    uint64_t cs = s->cluster_size;
    *req = (Qcow2Req){
        .start = p->c0 * cs,
        .end = (p->c0 + p->n) * cs,
        .kind = QCOW2_REQ_ALLOC,
        .fresh = p->fresh,
        .foot_start = p->head_write ? p->head : off,
        .foot_end = p->tail_write ? p->tail : p->wend,
    };
    if (p->head_write) {
        req->cow_start[0] = p->head;
        req->cow_end[0] = off;
    }
    if (p->tail_write) {
        req->cow_start[1] = p->wend;
        req->cow_end[1] = p->tail;
    }
}

static void *cow_buf_get(Qcow2State *s)
{
    if (s->cow_pool_n) {
        return s->cow_pool[--s->cow_pool_n];
    }
    return qk_aligned_alloc(QK_MAX(COW_BUF_ALIGN, s->bs->mem_alignment), 2 * s->cluster_size + COW_BUF_ALIGN);
}

static void cow_buf_put(Qcow2State *s, void *b)
{
    if (!b) {
        return;
    }
    if (s->cow_pool_n < sizeof(s->cow_pool) / sizeof(s->cow_pool[0])) {
        s->cow_pool[s->cow_pool_n++] = b;
    } else {
        free(b);
    }
}

void qcow2_write_free(Qcow2State *s)
{
    while (s->cow_pool_n) {
        free(s->cow_pool[--s->cow_pool_n]);
    }
    qcow2_deps_free(s);
}

/* Appends len bytes of zeros (zero_buf is one cluster: repeat it). */
static void iov_add_zeros(Qcow2State *s, QkIov *q, uint64_t len)
{
    while (len) {
        uint64_t n = QK_MIN(len, s->cluster_size);
        qk_iov_add(q, s->zero_buf, n);
        len -= n;
    }
}

/* Points L2 at the data just written: entries of fresh clusters get their
 * host offset, and every entry gets the subclusters of the footprint as
 * allocated, merged into the bitmap as it is now. */
static int coroutine_fn update_l2(Qcow2State *s, const AllocPlan *p, uint64_t foot_start, uint64_t foot_end)
{
    void *t;
    int r = qcow2_get_l2_for_write(s, p->l1i, &t);
    if (r < 0) {
        return r;
    }
    /* The data and copies just written are not durable yet: the table
     * that now exposes them must not reach the disk before a flush, or a
     * power loss could show the cluster's old contents (or another
     * cluster's) where a completed flush had made zeros or older data
     * durable. Armed before the first change, since freeing below may
     * yield while a write of this table takes its copy. */
    qcow2_cache_barrier(s->l2_cache);
    for (uint64_t k = 0; k < p->n && r == 0; k++) {
        uint64_t bm;
        uint64_t old = qcow2_l2_get(s, t, p->i0 + k, &bm);
        uint64_t nh = p->host + k * s->cluster_size;
        uint32_t mask = sc_mask(s, p->c0 + k, foot_start, foot_end);
        if (!p->fresh && (old & QCOW2_L2E_OFFSET_MASK) != nh) {
            r = -QK_ECORRUPT; /* nothing may move a cluster we write into */
            break;
        }
        if (p->replace && (r = qcow2_check_free_l2_entry(s, old)) < 0) {
            break;
        }
        uint64_t nbm = 0;
        if (p->keep_bits && (bm & QCOW2_BITMAP_ALL_ALLOC & ~(uint64_t)mask)) {
            r = -QK_ECORRUPT; /* data outside the copy: the plan was wrong */
            break;
        }
        if (p->keep_bits) {
            nbm = mask | (bm & ~(uint64_t)QCOW2_BITMAP_ALL_ALLOC & ~((uint64_t)mask << 32));
        } else if (s->extended_l2) {
            nbm = p->replace ? QCOW2_BITMAP_ALL_ALLOC
                             : ((bm | mask) & ~((uint64_t)mask << 32));
            if (p->fresh && !p->replace) {
                nbm &= ~((uint64_t)~mask & QCOW2_BITMAP_ALL_ALLOC); /* stale bits of an entry with no host */
            }
        }
        qcow2_l2_set(s, t, p->i0 + k, nh | QCOW2_OFLAG_COPIED, nbm);
        qcow2_clean_mark(s, nh, mask);
        if (p->replace) {
            r = qcow2_free_l2_entry(s, old);
        }
    }
    qcow2_cache_mark_dirty(s->l2_cache, t);
    qcow2_cache_put(s->l2_cache, &t);
    return r;
}

static int coroutine_fn alloc_write(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                    int flags, uint64_t *done)
{
    const uint64_t cs = s->cluster_size;
    AllocPlan p;
    Qcow2Req req;
    int r;
    *done = 0;

    qk_co_mutex_lock(&s->lock);
    for (;;) {
        r = plan_alloc(s, off, bytes, &p);
        if (r != 0) {
            qk_co_mutex_unlock(&s->lock);
            return r < 0 ? r : 0; /* *done == 0: the caller retries in place */
        }
        plan_to_req(s, &p, off, &req);
        Qcow2Req *o = qcow2_req_conflict(s, &req);
        if (!o) {
            break;
        }
        qk_co_mutex_unlock(&s->lock);
        qk_co_queue_wait(&o->waiters);
        qk_co_mutex_lock(&s->lock);
    }
    qcow2_req_insert(s, &req);
    r = qcow2_mark_dirty(s);
    if (r == 0) {
        /* A new L2 table goes before the data cluster, keeping data
         * clusters of consecutive writes contiguous in the file. */
        void *t;
        r = qcow2_get_l2_for_write(s, p.l1i, &t);
        if (r == 0) {
            qcow2_cache_put(s->l2_cache, &t);
        }
    }
    if (r == 0 && p.fresh && qcow2_has_data_file(s)) {
        /* The data file's cluster at the guest offset: nothing to count,
         * and it may hold old bytes, so the copies are all written. */
        p.host = p.c0 * cs;
        for (uint64_t k = 0; k < p.n; k++) {
            qcow2_clean_forget(s, p.host + k * cs);
        }
    } else if (r == 0 && p.fresh) {
        uint64_t before = qk_align_up(s->host_end, cs);
        /* A long write fills its new clusters itself (see qcow2_alloc_clusters_bulk). */
        bool bulk = p.wend - off >= QCOW2_BULK_WRITE;
        int64_t h = bulk ? qcow2_alloc_clusters_bulk(s, p.n) : qcow2_alloc_clusters(s, p.n);
        r = h < 0 ? (int)h : 0;
        if (r == 0) {
            p.host = (uint64_t)h;
            p.virgin = p.host >= before;
            for (uint64_t k = 0; k < p.n; k++) {
                if (p.virgin && s->extended_l2) {
                    qcow2_clean_add(s, p.host + k * cs);
                } else {
                    qcow2_clean_forget(s, p.host + k * cs);
                }
            }
            /* Never-used space reads as zeros: no need to write zero copies. */
            if (p.virgin && !p.replace) {
                p.head_write &= !p.head_zero;
                p.tail_write &= !p.tail_zero;
                /* Only the ranges change: req stays linked in s->reqs. */
                Qcow2Req upd;
                plan_to_req(s, &p, off, &upd);
                req.foot_start = upd.foot_start;
                req.foot_end = upd.foot_end;
                memcpy(req.cow_start, upd.cow_start, sizeof(req.cow_start));
                memcpy(req.cow_end, upd.cow_end, sizeof(req.cow_end));
            }
        }
    }
    qk_co_mutex_unlock(&s->lock);
    if (r < 0) {
        qcow2_req_end(s, &req);
        return r;
    }
    if (p.fresh) {
        qk_block_debug_event(QK_DBG_CLUSTER_ALLOC);
    }

    uint64_t start = p.c0 * cs;
    uint64_t fs = req.foot_start, fe = req.foot_end;
    uint8_t *buf = NULL;
    struct iovec stack_iov[STACK_IOVS];
    QkIov q;
    bool need_q = p.head_write || p.tail_write;
    if (need_q) {
        if (qiov->niov + 2 <= STACK_IOVS) {
            q = (QkIov){.iov = stack_iov, .nalloc = STACK_IOVS};
        } else {
            qk_iov_init(&q, qiov->niov + 2);
        }
    }
    /* Old data of both areas is read before anything is written. */
    bool read_head = p.head_write && !p.head_zero, read_tail = p.tail_write && !p.tail_zero;
    if (read_head || read_tail) {
        buf = cow_buf_get(s);
        r = buf ? 0 : -ENOMEM;
        qk_block_debug_event(QK_DBG_COW_READ);
    }
    uint8_t *tailbuf = buf ? buf + qk_align_up(off - p.head, COW_BUF_ALIGN) : NULL;
    if (r == 0 && read_head) {
        QkIov hq;
        qk_iov_init_buf(&hq, buf, off - p.head);
        r = qcow2_read_unlocked(s, p.head, off - p.head, &hq, 0, 0);
    }
    if (r == 0 && read_tail) {
        QkIov tq;
        qk_iov_init_buf(&tq, tailbuf, p.tail - p.wend);
        r = qcow2_read_unlocked(s, p.wend, p.tail - p.wend, &tq, 0, 0);
    }
    if (r == 0) {
        if (need_q) {
            qk_block_debug_event(QK_DBG_COW_WRITE);
            if (p.head_write) {
                if (read_head) {
                    qk_iov_add(&q, buf, off - p.head);
                } else {
                    iov_add_zeros(s, &q, off - p.head);
                }
            }
            qk_iov_concat(&q, qiov, qoff, p.wend - off);
            if (p.tail_write) {
                if (read_tail) {
                    qk_iov_add(&q, tailbuf, p.tail - p.wend);
                } else {
                    iov_add_zeros(s, &q, p.tail - p.wend);
                }
            }
        }
        qk_block_debug_event(QK_DBG_WRITE_AIO);
        r = qcow2_check_data_write(s, p.host + (fs - start), fe - fs);
        if (r == 0) {
            r = qk_co_pwritev(s->data, p.host + (fs - start), fe - fs, need_q ? &q : qiov,
                              need_q ? 0 : qoff, flags);
        }
    }
    if (need_q && q.iov != stack_iov) {
        qk_iov_destroy(&q);
    }
    cow_buf_put(s, buf);
    if (r == 0) {
        qk_block_debug_event(QK_DBG_WRITE_DONE);
        qk_block_debug_event(QK_DBG_L2_UPDATE);
    }

    qk_co_mutex_lock(&s->lock);
    if (r == 0) {
        r = update_l2(s, &p, fs, fe);
    } else {
        /* The bytes may hold anything now. */
        for (uint64_t k = 0; k < p.n; k++) {
            qcow2_clean_mark(s, p.host + k * cs, sc_mask(s, p.c0 + k, fs, fe));
        }
        if (p.fresh && !qcow2_has_data_file(s)) {
            for (uint64_t k = 0; k < p.n; k++) {
                qcow2_clean_forget(s, p.host + k * cs);
            }
            qcow2_free_clusters(s, p.host, p.n * cs);
        }
    }
    qk_co_mutex_unlock(&s->lock);
    qcow2_req_end(s, &req);
    if (r == 0) {
        *done = p.wend - off;
    }
    return r;
}

static int coroutine_fn write_chunk(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                    int flags, uint64_t *done)
{
    Qcow2Req req;
    qcow2_req_begin(s, &req, off, off + bytes, false);
    Qcow2Extent ext;
    int r = qcow2_get_extent_for_write(s, off, bytes, &ext);
    if (r == 0 && ext.type == QCOW2_NORMAL && ext.copied) {
        req.end = off + ext.bytes;
        qk_block_debug_event(QK_DBG_WRITE_AIO);
        r = qcow2_check_data_write(s, ext.host, ext.bytes);
        if (r == 0) {
            r = qk_co_pwritev(s->data, ext.host, ext.bytes, qiov, qoff, flags);
        }
        qcow2_req_end(s, &req);
        *done = ext.bytes;
        return r;
    }
    qcow2_req_end(s, &req);
    if (r < 0) {
        return r;
    }
    return alloc_write(s, off, bytes, qiov, qoff, flags, done);
}

int coroutine_fn qcow2_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff, int flags)
{
    Qcow2State *s = qcow2_state(bs);
    /* The data writes take the hints; FUA is for the whole request below. */
    int data_flags = flags & QK_REQ_WRITE_BEHIND;
    while (bytes) {
        uint64_t n = 0;
        int r = write_chunk(s, off, bytes, qiov, qoff, data_flags, &n);
        if (r < 0) {
            return r;
        }
        off += n;
        qoff += n;
        bytes -= n;
    }
    if (flags & QK_REQ_FUA) {
        qk_co_mutex_lock(&s->lock);
        int r = qcow2_data_file_flush(s);
        if (r == 0) {
            r = qcow2_flush_caches(s);
        }
        qk_co_mutex_unlock(&s->lock);
        return r < 0 ? r : qk_co_flush(bs->file);
    }
    return 0;
}
