/*
 * Metadata cache for cluster-sized tables (L2 tables, refcount blocks):
 * fixed number of entries, hash lookup by host offset, LRU eviction, dirty
 * tracking and writeback. Entries are pinned while a caller uses them;
 * pinned or loading entries are never evicted.
 *
 * A cache may depend on another: before any of its tables is written,
 * every dirty table of the dependency (and every write of one in flight)
 * is written and the file flushed. A barrier (with a dependency or on its
 * own) flushes the file before the next table write even when nothing is
 * dirty elsewhere, so that writes made to the file directly before it was
 * armed (data an L2 entry is about to expose, a reference dropped by a
 * direct write) reach the disk first. A table is written from a copy taken
 * once its dependencies are out: a change made while the write is in
 * flight waits for the next write, never slipping ahead of what it
 * depends on. Two caches
 * never depend on each other: qcow2_cache_depend() reverses a dependency
 * by writing out the cache that was waited for first. refcount.c uses
 * this to order allocations (refcount blocks first) and frees (L2 tables
 * first).
 */
#include "block/debug.h"
#include "qcow2/qcow2_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct Entry {
    uint64_t offset;         /* 0: free */
    uint64_t lru;
    int ref;
    bool dirty;
    bool busy;               /* being loaded or written back */
    bool writing;            /* being written back */
    QkCoQueue waiters;
    int hnext;               /* hash chain, -1 ends */
} Entry;

struct Qcow2Cache {
    Qcow2State *s;
    Qcow2Cache *depends;
    bool barrier;            /* flush the file before the next write even if depends is clean */
    void *spare;             /* a table-sized buffer for the next write's copy */
    unsigned nwriting;       /* writes in flight */
    size_t table_size;
    unsigned n;
    Entry *e;
    uint8_t *data;
    int *buckets;
    unsigned nbuckets;
    uint64_t clock;
    unsigned ndirty;
    QkCoQueue free_waiters;  /* every entry pinned */
};

static unsigned bucket_of(const Qcow2Cache *c, uint64_t offset)
{
    uint64_t h = offset * 0x9e3779b97f4a7c15ULL;
    return (unsigned)(h >> 40) & (c->nbuckets - 1);
}

static void hash_insert(Qcow2Cache *c, int i)
{
    unsigned b = bucket_of(c, c->e[i].offset);
    c->e[i].hnext = c->buckets[b];
    c->buckets[b] = i;
}

static void hash_remove(Qcow2Cache *c, int i)
{
    unsigned b = bucket_of(c, c->e[i].offset);
    for (int *p = &c->buckets[b]; *p >= 0; p = &c->e[*p].hnext) {
        if (*p == i) {
            *p = c->e[i].hnext;
            return;
        }
    }
}

static int lookup(const Qcow2Cache *c, uint64_t offset)
{
    for (int i = c->buckets[bucket_of(c, offset)]; i >= 0; i = c->e[i].hnext) {
        if (c->e[i].offset == offset) {
            return i;
        }
    }
    return -1;
}

Qcow2Cache *qcow2_cache_new(Qcow2State *s, unsigned entries)
{
    Qcow2Cache *c = calloc(1, sizeof(*c));
    if (!c) {
        return NULL;
    }
    c->s = s;
    c->table_size = s->cluster_size;
    c->n = entries;
    c->nbuckets = 16;
    while (c->nbuckets < entries * 2) {
        c->nbuckets *= 2;
    }
    c->e = calloc(entries, sizeof(Entry));
    c->buckets = malloc(sizeof(int) * c->nbuckets);
    c->data = qk_aligned_alloc(qk_block_buf_align(s->bs), (size_t)entries * c->table_size);
    if (!c->e || !c->buckets || !c->data) {
        qcow2_cache_free(c);
        return NULL;
    }
    for (unsigned i = 0; i < c->nbuckets; i++) {
        c->buckets[i] = -1;
    }
    for (unsigned i = 0; i < entries; i++) {
        c->e[i].hnext = -1;
        qk_co_queue_init(&c->e[i].waiters);
    }
    qk_co_queue_init(&c->free_waiters);
    return c;
}

size_t qcow2_cache_bytes(const Qcow2Cache *c)
{
    return (size_t)c->n * c->table_size;
}

void qcow2_cache_free(Qcow2Cache *c)
{
    if (!c) {
        return;
    }
    free(c->e);
    free(c->buckets);
    free(c->data);
    free(c->spare);
    free(c);
}

void qcow2_cache_set_dependency(Qcow2Cache *c, Qcow2Cache *dep)
{
    c->depends = dep;
}

bool qcow2_cache_has_dirty(const Qcow2Cache *c)
{
    return c->ndirty > 0;
}

static void *table_of(Qcow2Cache *c, int i)
{
    return c->data + (size_t)i * c->table_size;
}

static int index_of(Qcow2Cache *c, const void *table)
{
    return (int)(((const uint8_t *)table - c->data) / c->table_size);
}

/* True when writing a table of c must first write out its dependency. */
static bool dependency_pending(const Qcow2Cache *c)
{
    const Qcow2Cache *d = c->depends;
    return c->barrier || (d && (d->ndirty || d->nwriting));
}

static int coroutine_fn flush_dependency(Qcow2Cache *c)
{
    if (!dependency_pending(c)) {
        return 0;
    }
    /* Cleared first: a barrier armed while we yield needs a flush of its own. */
    c->barrier = false;
    int r = c->depends ? qcow2_cache_flush(c->depends) : 0;
    if (r == 0) {
        r = qcow2_data_file_flush(c->s); /* data a barrier waits for */
    }
    if (r == 0) {
        r = qk_co_flush(c->s->bs->file);
    }
    if (r < 0) {
        c->barrier = true;
    }
    return r;
}

int coroutine_fn qcow2_cache_depend(Qcow2Cache *c, Qcow2Cache *dep, bool barrier)
{
    if (dep->depends == c) {
        /* dep waits for c: c's tables go out now, then dep is free. */
        if (dependency_pending(dep)) {
            dep->barrier = false;
            int r = qcow2_cache_flush(c);
            if (r == 0) {
                r = qk_co_flush(c->s->bs->file);
            }
            if (r < 0) {
                dep->barrier = true;
                return r;
            }
        }
        dep->depends = NULL;
    }
    c->depends = dep;
    if (barrier) {
        c->barrier = true;
    }
    return 0;
}

void qcow2_cache_barrier(Qcow2Cache *c)
{
    c->barrier = true;
}

int coroutine_fn qcow2_cache_release(Qcow2Cache *c)
{
    int r = flush_dependency(c);
    if (r == 0) {
        c->depends = NULL;
    }
    return r;
}

/* Writes entry i if dirty. The entry is marked busy so it is neither
 * evicted nor reused meanwhile; a change made during the write marks it
 * dirty again. The dependency is checked again after every flush it
 * needed: a change made while that flush ran (another allocation, another
 * data write armed a barrier) is in the copy taken below, so what it
 * relies on must be out too. Nothing yields between the last check and
 * the copy. */
static int coroutine_fn write_entry(Qcow2Cache *c, int i)
{
    Entry *e = &c->e[i];
    for (;;) {
        while (e->busy) {
            qk_co_queue_wait(&e->waiters);
        }
        if (!e->dirty || !e->offset) {
            return 0;
        }
        if (!dependency_pending(c)) {
            break;
        }
        int r = flush_dependency(c);
        if (r < 0) {
            return r;
        }
    }
    int r;
    void *copy = c->spare;
    c->spare = NULL;
    if (!copy) {
        copy = qk_aligned_alloc(qk_block_buf_align(c->s->bs), c->table_size);
        if (!copy) {
            return -ENOMEM;
        }
    }
    memcpy(copy, table_of(c, i), c->table_size);
    e->dirty = false;
    c->ndirty--;
    e->busy = true;
    e->writing = true;
    c->nwriting++;
    e->ref++;
    bool rb = c == c->s->rb_cache;
    r = qcow2_check_table_write(c->s, e->offset, c->table_size, rb ? QCOW2_OL_REFB : QCOW2_OL_L2);
    if (r == 0) {
        r = qk_co_pwrite(c->s->bs->file, e->offset, c->table_size, copy,
                         QK_REQ_KIND(rb ? QK_IO_REFBLOCK : QK_IO_L2));
    }
    if (c->spare) {
        free(copy);
    } else {
        c->spare = copy;
    }
    if (c == c->s->rb_cache) {
        qk_block_debug_event(QK_DBG_REFBLOCK_UPDATE);
    }
    e->ref--;
    e->busy = false;
    e->writing = false;
    c->nwriting--;
    if (r < 0 && !e->dirty) {
        e->dirty = true;
        c->ndirty++;
    }
    qk_co_queue_wake_all(&e->waiters);
    if (e->ref == 0) {
        qk_co_queue_wake_all(&c->free_waiters);
    }
    return r;
}

/* Finds an entry that can take a new table, writing back a dirty victim if
 * needed. Returns its index; may yield. */
static int coroutine_fn get_victim(Qcow2Cache *c)
{
    for (;;) {
        int best = -1;
        for (unsigned i = 0; i < c->n; i++) {
            Entry *e = &c->e[i];
            if (e->ref || e->busy) {
                continue;
            }
            if (!e->offset) {
                return (int)i;
            }
            if (best < 0 || e->lru < c->e[best].lru) {
                best = (int)i;
            }
        }
        if (best < 0) {
            qk_co_queue_wait(&c->free_waiters);
            continue;
        }
        Entry *e = &c->e[best];
        if (e->dirty) {
            int r = write_entry(c, best);
            if (r < 0) {
                return r;
            }
            continue; /* the world may have changed while writing */
        }
        hash_remove(c, best);
        e->offset = 0;
        return best;
    }
}

static bool table_in_file(Qcow2Cache *c, uint64_t offset);

static int coroutine_fn get(Qcow2Cache *c, uint64_t offset, void **table, bool read)
{
    for (;;) {
        int i = lookup(c, offset);
        if (i >= 0) {
            Entry *e = &c->e[i];
            if (e->busy && e->ref == 0) {
                /* Still loading. */
                qk_co_queue_wait(&e->waiters);
                continue;
            }
            e->ref++;
            e->lru = ++c->clock;
            if (!read) {
                memset(table_of(c, i), 0, c->table_size);
            }
            *table = table_of(c, i);
            return 0;
        }
        i = get_victim(c);
        if (i < 0) {
            return i;
        }
        if (lookup(c, offset) >= 0) {
            continue; /* someone loaded it while we made room */
        }
        if (read && !table_in_file(c, offset)) {
            /* A table past the end of the file would read as zeros: refcount
             * blocks would call live clusters free, L2 tables would hide data. */
            qcow2_note_corruption(c->s, "%s at %#" PRIx64 " extends past the end of the file",
                                  c == c->s->rb_cache ? "Refcount block" : "L2 table", offset);
            return -QK_ECORRUPT;
        }
        Entry *e = &c->e[i];
        e->offset = offset;
        e->dirty = false;
        e->lru = ++c->clock;
        hash_insert(c, i);
        if (read) {
            e->busy = true;
            int r = qk_co_pread(c->s->bs->file, offset, c->table_size, table_of(c, i), 0);
            e->busy = false;
            qk_co_queue_wake_all(&e->waiters);
            if (r < 0) {
                hash_remove(c, i);
                e->offset = 0;
                qk_co_queue_wake_all(&c->free_waiters);
                return r;
            }
        } else {
            memset(table_of(c, i), 0, c->table_size);
        }
        e->ref = 1;
        *table = table_of(c, i);
        return 0;
    }
}

/* True when [offset, offset + table size) lies inside the host file. */
static bool table_in_file(Qcow2Cache *c, uint64_t offset)
{
    if (qk_range_within(offset, c->table_size, c->s->file_size)) {
        return true;
    }
    int64_t len = qk_block_length(c->s->bs->file);
    return len >= 0 && qk_range_within(offset, c->table_size, (uint64_t)len);
}

int coroutine_fn qcow2_cache_get(Qcow2Cache *c, uint64_t offset, void **table)
{
    return get(c, offset, table, true);
}

int coroutine_fn qcow2_cache_get_empty(Qcow2Cache *c, uint64_t offset, void **table)
{
    return get(c, offset, table, false);
}

void qcow2_cache_put(Qcow2Cache *c, void **table)
{
    int i = index_of(c, *table);
    *table = NULL;
    if (--c->e[i].ref == 0) {
        qk_co_queue_wake_all(&c->free_waiters);
    }
}

void qcow2_cache_mark_dirty(Qcow2Cache *c, void *table)
{
    Entry *e = &c->e[index_of(c, table)];
    if (!e->dirty) {
        e->dirty = true;
        c->ndirty++;
    }
}

int coroutine_fn qcow2_cache_write_one(Qcow2Cache *c, void *table)
{
    return write_entry(c, index_of(c, table));
}

int coroutine_fn qcow2_cache_flush(Qcow2Cache *c)
{
    int ret = 0;
    for (unsigned i = 0; i < c->n && c->ndirty; i++) {
        if (c->e[i].dirty) {
            int r = write_entry(c, (int)i);
            if (r < 0 && ret == 0) {
                ret = r;
            }
        }
    }
    /* Writes started before (an eviction, say) count as part of the flush:
     * whoever orders other writes after it relies on them. */
    for (unsigned i = 0; i < c->n && c->nwriting; i++) {
        while (c->e[i].writing) {
            qk_co_queue_wait(&c->e[i].waiters);
        }
    }
    return ret;
}

void qcow2_cache_discard(Qcow2Cache *c, uint64_t offset)
{
    int i = lookup(c, offset);
    if (i < 0) {
        return;
    }
    Entry *e = &c->e[i];
    if (e->dirty) {
        e->dirty = false;
        c->ndirty--;
    }
    if (e->ref == 0 && !e->busy) {
        hash_remove(c, i);
        e->offset = 0;
    }
}
