/*
 * The write path and request tracking. Writes into clusters that are
 * allocated and owned by this image (COPIED) go straight to the file and
 * run in parallel. Anything else is an allocating write: it claims the
 * whole clusters it touches (so overlapping requests wait for it), takes
 * host clusters under s->lock, writes copy-on-write head + data + tail as
 * one host write, then points the L2 entries at the new data. Order:
 * refcounts, then data, then L2 (the cache writes refcount blocks before
 * any L2 table).
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- requests in flight ---- */

void coroutine_fn qcow2_req_begin(Qcow2State *s, Qcow2Req *r, uint64_t start, uint64_t end, bool exclusive)
{
    r->start = start;
    r->end = end;
    r->exclusive = exclusive;
    qk_co_queue_init(&r->waiters);
retry:
    for (Qcow2Req *o = s->reqs; o; o = o->next) {
        if ((o->exclusive || exclusive) && o->start < end && start < o->end) {
            qk_co_queue_wait(&o->waiters);
            goto retry;
        }
    }
    r->prev = NULL;
    r->next = s->reqs;
    if (s->reqs) {
        s->reqs->prev = r;
    }
    s->reqs = r;
}

void qcow2_req_end(Qcow2State *s, Qcow2Req *r)
{
    if (r->prev) {
        r->prev->next = r->next;
    } else {
        s->reqs = r->next;
    }
    if (r->next) {
        r->next->prev = r->prev;
    }
    qk_co_queue_wake_all(&r->waiters);
}

/* With lazy refcounts the on-disk refcounts may lag; the dirty bit tells
 * the next opener to rebuild them. Set once, before the first change. */
int coroutine_fn qcow2_mark_dirty(Qcow2State *s)
{
    if (!s->lazy_refcounts || (s->h.incompatible_features & QCOW2_INCOMPAT_DIRTY)) {
        return 0;
    }
    int r = qk_co_flush(s->bs->file);
    if (r == 0) {
        r = qcow2_set_incompat(s, s->h.incompatible_features | QCOW2_INCOMPAT_DIRTY);
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
        s->dirty_set_by_us = true;
    }
    return r;
}

/* ---- allocating writes ---- */

static bool needs_new_host(uint64_t e)
{
    return !(e & QCOW2_L2E_OFFSET_MASK) || (e & QCOW2_OFLAG_COMPRESSED) || !(e & QCOW2_OFLAG_COPIED);
}

static int coroutine_fn alloc_write(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                    uint64_t *done)
{
    const uint64_t cs = s->cluster_size;
    uint64_t c0 = off >> s->cluster_bits;
    uint64_t l1i = c0 >> s->l2_bits;
    uint64_t table_last = ((l1i + 1) << s->l2_bits) - 1;
    uint64_t max_n = QK_MAX(1ULL, (32ULL << 20) >> s->cluster_bits);
    uint64_t clast = QK_MIN((off + bytes - 1) >> s->cluster_bits, table_last);
    clast = QK_MIN(clast, c0 + max_n - 1);
    uint64_t i0 = c0 & (s->l2_entries - 1);
    *done = 0;

    Qcow2Req req;
    qcow2_req_begin(s, &req, c0 * cs, (clast + 1) * cs, true);
    qk_co_mutex_lock(&s->lock);

    /* Someone may have allocated it while we waited. */
    Qcow2Extent ext;
    uint64_t first_len = QK_MIN(off + bytes, (c0 + 1) * cs) - off;
    int r = qcow2_get_extent(s, off, first_len, &ext);
    if (r < 0 || (ext.type == QCOW2_NORMAL && ext.copied && ext.bytes == first_len)) {
        qk_co_mutex_unlock(&s->lock);
        qcow2_req_end(s, &req);
        return r; /* *done == 0: the caller retries through the plain path */
    }
    r = qcow2_mark_dirty(s);
    void *t = NULL;
    if (r == 0) {
        r = qcow2_get_l2_for_write(s, l1i, &t);
    }
    if (r < 0) {
        qk_co_mutex_unlock(&s->lock);
        qcow2_req_end(s, &req);
        return r;
    }
    uint64_t bm;
    uint64_t e0 = qcow2_l2_get(s, t, i0, &bm);
    uint64_t n = 1;
    uint64_t host;
    bool fresh = needs_new_host(e0);
    if (fresh) {
        while (c0 + n <= clast) {
            uint64_t e = qcow2_l2_get(s, t, i0 + n, &bm);
            if (!needs_new_host(e)) {
                break;
            }
            n++;
        }
        int64_t h = qcow2_alloc_clusters(s, n);
        r = h < 0 ? (int)h : 0;
        host = (uint64_t)h;
    } else {
        /* Owned host cluster that reads (partly) as zero or unallocated:
         * fill it in place. */
        host = e0 & QCOW2_L2E_OFFSET_MASK;
    }
    qcow2_cache_put(s->l2_cache, &t);
    qk_co_mutex_unlock(&s->lock);
    if (r < 0) {
        qcow2_req_end(s, &req);
        return r;
    }

    uint64_t start = c0 * cs, end = (c0 + n) * cs;
    uint64_t wend = QK_MIN(off + bytes, end);
    uint64_t head = off - start, tail = end - wend;
    uint8_t *cow = NULL;
    if (head + tail) {
        cow = qk_aligned_alloc(QK_MAX(4096u, s->bs->mem_alignment), qk_align_up(head, 4096) + tail);
        r = cow ? 0 : -ENOMEM;
    }
    uint8_t *tailbuf = cow ? cow + qk_align_up(head, 4096) : NULL;
    QkIov q;
    qk_iov_init(&q, qiov->niov + 2);
    if (r == 0 && head) {
        QkIov hq;
        qk_iov_init_buf(&hq, cow, head);
        r = qcow2_read_unlocked(s, start, head, &hq, 0);
    }
    if (r == 0 && tail) {
        QkIov tq;
        qk_iov_init_buf(&tq, tailbuf, tail);
        r = qcow2_read_unlocked(s, wend, tail, &tq, 0);
    }
    if (r == 0) {
        if (head) {
            qk_iov_add(&q, cow, head);
        }
        qk_iov_concat(&q, qiov, qoff, wend - off);
        if (tail) {
            qk_iov_add(&q, tailbuf, tail);
        }
        r = qk_co_pwritev(s->bs->file, host, end - start, &q, 0, 0);
    }
    qk_iov_destroy(&q);
    free(cow);

    qk_co_mutex_lock(&s->lock);
    if (r < 0) {
        if (fresh) {
            qcow2_free_clusters(s, host, n * cs);
        }
    } else {
        r = qcow2_get_l2_for_write(s, l1i, &t);
    }
    if (r == 0) {
        for (uint64_t k = 0; k < n; k++) {
            uint64_t old = qcow2_l2_get(s, t, i0 + k, &bm);
            uint64_t nh = host + k * cs;
            qcow2_l2_set(s, t, i0 + k, nh | QCOW2_OFLAG_COPIED, s->extended_l2 ? QCOW2_BITMAP_ALL_ALLOC : 0);
            if (fresh && ((old & QCOW2_OFLAG_COMPRESSED) || (old & QCOW2_L2E_OFFSET_MASK))) {
                int fr = qcow2_free_l2_entry(s, old);
                if (fr < 0 && r == 0) {
                    r = fr;
                }
            }
        }
        qcow2_cache_mark_dirty(s->l2_cache, t);
        qcow2_cache_put(s->l2_cache, &t);
    }
    qk_co_mutex_unlock(&s->lock);
    qcow2_req_end(s, &req);
    if (r == 0) {
        *done = wend - off;
    }
    return r;
}

static int coroutine_fn write_chunk(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                    uint64_t *done)
{
    Qcow2Req req;
    qcow2_req_begin(s, &req, off, off + bytes, false);
    Qcow2Extent ext;
    int r = qcow2_get_extent(s, off, bytes, &ext);
    if (r == 0 && ext.type == QCOW2_NORMAL && ext.copied) {
        req.end = off + ext.bytes;
        r = qk_co_pwritev(s->bs->file, ext.host, ext.bytes, qiov, qoff, 0);
        qcow2_req_end(s, &req);
        *done = ext.bytes;
        return r;
    }
    qcow2_req_end(s, &req);
    if (r < 0) {
        return r;
    }
    return alloc_write(s, off, bytes, qiov, qoff, done);
}

int coroutine_fn qcow2_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff, int flags)
{
    Qcow2State *s = qcow2_state(bs);
    while (bytes) {
        uint64_t n = 0;
        int r = write_chunk(s, off, bytes, qiov, qoff, &n);
        if (r < 0) {
            return r;
        }
        off += n;
        qoff += n;
        bytes -= n;
    }
    if (flags & QK_REQ_FUA) {
        qk_co_mutex_lock(&s->lock);
        int r = qcow2_flush_caches(s);
        qk_co_mutex_unlock(&s->lock);
        return r < 0 ? r : qk_co_flush(bs->file);
    }
    return 0;
}
