/*
 * Dirty bitmaps attached to a block node. Every completed write, zero
 * write and discard through the node's request entry marks the enabled
 * bitmaps, at the bitmap's granularity (a power of two, 512 B and up).
 * Marking happens when the request completes, so a copier that reads a
 * chunk and then clears its bit cannot lose a write that was still in flight.
 */
#ifndef QK_BLOCK_DIRTY_BITMAP_H
#define QK_BLOCK_DIRTY_BITMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/coroutine.h"
#include "util/error.h"
#include "util/hbitmap.h"
#include "qcowkit/engine.h" /* QkDirtyBitmap and the calls programs use */

struct QkDirtyBitmap {
    char *name;
    uint64_t granularity;
    uint64_t size;            /* bytes covered */
    bool enabled;
    int busy;                 /* users (e.g. a mirror job) that forbid removal */
    QkHBitmap *bits;
    uint64_t marked_bytes;    /* chunk bytes ever marked: how fast writes land, as seen at this granularity */
    /* Persistent bitmaps belong to the image format too (qcow2/bitmaps.c),
     * which stores them on close. */
    bool persistent;
    bool inconsistent;        /* found in use (not saved after a crash): never used, only removed */
    bool changed;             /* enabled, cleared or merged into since it was loaded */
    uint32_t disk_slot;       /* 1 + its index in the directory it was loaded from; 0: new */
    struct QkDirtyBitmap *next;
};

/* Before a bitmap is cleared, merged into or otherwise changed by a
 * request: refuses one that is inconsistent or in use (-EINVAL, -EBUSY),
 * and has the image mark a stored copy in use first. May yield. */
int coroutine_fn qk_co_dirty_bitmap_begin_change(QkBlock *bs, QkDirtyBitmap *bm, QkError *err);
void qk_dirty_bitmap_remove_all(QkBlock *bs);


/* Byte-range operations (ranges are widened to granularity). */
void qk_dirty_bitmap_mark(QkDirtyBitmap *bm, uint64_t off, uint64_t bytes);
void qk_dirty_bitmap_reset(QkDirtyBitmap *bm, uint64_t off, uint64_t bytes);
bool qk_dirty_bitmap_get(const QkDirtyBitmap *bm, uint64_t off);
uint64_t qk_dirty_bitmap_dirty_bytes(const QkDirtyBitmap *bm);
/* Offset of the first dirty chunk at or after off, or UINT64_MAX. */
uint64_t qk_dirty_bitmap_next_dirty(const QkDirtyBitmap *bm, uint64_t off);
/* Offset of the first clean chunk at or after off, or UINT64_MAX. */
uint64_t qk_dirty_bitmap_next_clean(const QkDirtyBitmap *bm, uint64_t off);

/* After a resize: every bitmap covers the new size (a new area clean). */
int qk_dirty_bitmaps_truncate(QkBlock *bs, uint64_t size);

/* Called by the request entry points for every completed modification. */
void qk_dirty_bitmaps_mark_all(QkBlock *bs, uint64_t off, uint64_t bytes);

#endif
