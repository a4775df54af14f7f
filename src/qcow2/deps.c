/*
 * Requests in flight and the dependencies between them, plus the
 * clean-host table that lets allocating writes skip copy-on-write of
 * zeros. Owns the rules for who waits for whom; the write, read and zero
 * paths only say what they are about to do. Must not know how data is
 * written or how L2 entries are encoded.
 *
 * The rules (strict_alloc_deps off):
 *  - zero writes and discards (EXCL) wait for, and block, every overlap;
 *  - an allocating write whose cluster is still being newly allocated
 *    (fresh: no host offset in L2 yet) blocks everything touching that
 *    cluster, and waits for everything touching it;
 *  - two allocating writes into an already allocated cluster wait for
 *    each other only where one's footprint (COW + data) touches the
 *    other's COW areas: those are the bytes a copy could overwrite;
 *  - reads and writes into allocated subclusters never wait for an
 *    allocating write into an allocated cluster: their bytes are in
 *    subclusters that write does not copy.
 * With strict_alloc_deps every request touching a cluster with an
 * allocating write in flight waits for it (the older, simpler rule).
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>

#define CLEAN_SLOTS 4096u

static bool overlaps(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1)
{
    return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

static bool touches_cow(const Qcow2Req *a, uint64_t start, uint64_t end)
{
    return overlaps(a->cow_start[0], a->cow_end[0], start, end) ||
           overlaps(a->cow_start[1], a->cow_end[1], start, end);
}

/* Must n (about to start) wait for o (in flight)? */
static bool must_wait(const Qcow2State *s, const Qcow2Req *n, const Qcow2Req *o)
{
    if (!overlaps(n->start, n->end, o->start, o->end)) {
        return false;
    }
    if (n->kind == QCOW2_REQ_EXCL || o->kind == QCOW2_REQ_EXCL) {
        return true;
    }
    if (n->kind == QCOW2_REQ_PLAIN && o->kind == QCOW2_REQ_PLAIN) {
        return false;
    }
    if (s->strict_alloc_deps) {
        return true;
    }
    /* A fresh allocation may replace (and free) an old host cluster, and
     * nobody else can use the new one before its L2 entry exists. */
    if (n->fresh || o->fresh) {
        return true;
    }
    if (n->kind != QCOW2_REQ_ALLOC || o->kind != QCOW2_REQ_ALLOC) {
        return false;
    }
    return touches_cow(o, n->foot_start, n->foot_end) || touches_cow(n, o->foot_start, o->foot_end);
}

/* Plain requests never wait for each other, so they sit on a list of
 * their own that only the other kinds scan: a VM's steady reads and writes
 * into allocated clusters pay for what is in flight of the rarer kinds,
 * not for every request in flight (a scan of 128 of them per write was a
 * fifth of the CPU time of 4k writes at depth 128). */
static Qcow2Req **list_of(Qcow2State *s, const Qcow2Req *r)
{
    return r->kind == QCOW2_REQ_PLAIN ? &s->plain_reqs : &s->reqs;
}

static Qcow2Req *conflict_in(Qcow2State *s, Qcow2Req *head, const Qcow2Req *r)
{
    for (Qcow2Req *o = head; o; o = o->next) {
        if (o != r && must_wait(s, r, o)) {
            return o;
        }
    }
    return NULL;
}

Qcow2Req *qcow2_req_conflict(Qcow2State *s, const Qcow2Req *r)
{
    Qcow2Req *o = conflict_in(s, s->reqs, r);
    if (!o && r->kind != QCOW2_REQ_PLAIN) {
        o = conflict_in(s, s->plain_reqs, r);
    }
    return o;
}

void qcow2_req_insert(Qcow2State *s, Qcow2Req *r)
{
    Qcow2Req **head = list_of(s, r);
    qk_co_queue_init(&r->waiters);
    r->prev = NULL;
    r->next = *head;
    if (*head) {
        (*head)->prev = r;
    }
    *head = r;
}

void coroutine_fn qcow2_req_begin(Qcow2State *s, Qcow2Req *r, uint64_t start, uint64_t end, bool exclusive)
{
    *r = (Qcow2Req){
        .start = start,
        .end = end,
        .kind = exclusive ? QCOW2_REQ_EXCL : QCOW2_REQ_PLAIN,
    };
    Qcow2Req *o;
    while ((o = qcow2_req_conflict(s, r))) {
        qk_co_queue_wait(&o->waiters);
    }
    qcow2_req_insert(s, r);
}

void qcow2_req_end(Qcow2State *s, Qcow2Req *r)
{
    if (r->prev) {
        r->prev->next = r->next;
    } else {
        *list_of(s, r) = r->next;
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

/* ---- clean-host table ----
 * A direct-mapped cache: losing a slot to a collision only makes a later
 * write copy zeros it could have skipped. A subcluster stays clean until
 * a write's footprint covered it (committed or failed); zeroing or
 * discarding later cannot make it clean again, so those paths need not
 * report here. */

static Qcow2CleanSlot *slot_for(const Qcow2State *s, uint64_t host)
{
    if (!s->clean) {
        return NULL;
    }
    uint64_t c = host >> s->cluster_bits;
    Qcow2CleanSlot *e = &s->clean[c & (CLEAN_SLOTS - 1)];
    return e->cluster_plus1 == c + 1 ? e : NULL;
}

void qcow2_clean_add(Qcow2State *s, uint64_t host)
{
    if (!s->clean) {
        s->clean = calloc(CLEAN_SLOTS, sizeof(*s->clean));
        if (!s->clean) {
            return; /* only an optimisation */
        }
    }
    uint64_t c = host >> s->cluster_bits;
    s->clean[c & (CLEAN_SLOTS - 1)] = (Qcow2CleanSlot){.cluster_plus1 = c + 1, .dirty = 0};
}

void qcow2_clean_forget(Qcow2State *s, uint64_t host)
{
    Qcow2CleanSlot *e = slot_for(s, host);
    if (e) {
        e->cluster_plus1 = 0;
    }
}

void qcow2_clean_mark(Qcow2State *s, uint64_t host, uint32_t sc_mask)
{
    Qcow2CleanSlot *e = slot_for(s, host);
    if (e) {
        e->dirty |= sc_mask;
    }
}

bool qcow2_clean_is_zero(const Qcow2State *s, uint64_t host, unsigned sc)
{
    const Qcow2CleanSlot *e = slot_for(s, host);
    return e && !((e->dirty >> sc) & 1);
}

void qcow2_deps_free(Qcow2State *s)
{
    free(s->clean);
    s->clean = NULL;
}
