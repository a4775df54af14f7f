/*
 * Hierarchical bitmap: a flat bit array plus summary levels where each bit
 * says "this 64-bit word below is not all zero". Finding the next set bit
 * skips empty regions 64^k bits at a time, and the number of set bits is
 * kept up to date, so a dirty-chunk walker never scans clean space.
 */
#ifndef QK_UTIL_HBITMAP_H
#define QK_UTIL_HBITMAP_H

#include <stdbool.h>
#include <stdint.h>

#define QK_HBITMAP_MAX_LEVELS 12

/* Visible only so that qk_hbitmap_get can be inlined: every write tests a
 * bit of each enabled dirty bitmap. Use the functions. */
typedef struct QkHBitmap {
    uint64_t nbits;
    uint64_t count;
    int levels;
    uint64_t nwords[QK_HBITMAP_MAX_LEVELS];
    uint64_t *lv[QK_HBITMAP_MAX_LEVELS];
} QkHBitmap;

QkHBitmap *qk_hbitmap_new(uint64_t nbits);
void qk_hbitmap_free(QkHBitmap *hb);
uint64_t qk_hbitmap_size(const QkHBitmap *hb);
/* Sets / clears bits [start, start+count), clamped to the size. */
void qk_hbitmap_set(QkHBitmap *hb, uint64_t start, uint64_t count);
void qk_hbitmap_reset(QkHBitmap *hb, uint64_t start, uint64_t count);
void qk_hbitmap_reset_all(QkHBitmap *hb);
static inline bool qk_hbitmap_get(const QkHBitmap *hb, uint64_t bit)
{
    return bit < hb->nbits && (hb->lv[0][bit / 64] >> (bit % 64)) & 1;
}
/* Number of set bits. */
uint64_t qk_hbitmap_count(const QkHBitmap *hb);
/* First set bit >= from, or UINT64_MAX when none. */
uint64_t qk_hbitmap_next_set(const QkHBitmap *hb, uint64_t from);
/* First clear bit >= from, or UINT64_MAX when none. */
uint64_t qk_hbitmap_next_zero(const QkHBitmap *hb, uint64_t from);
/* The same within [from, end): a caller filling a window stops at its
 * end instead of scanning the set bits beyond it. */
uint64_t qk_hbitmap_next_zero_before(const QkHBitmap *hb, uint64_t from, uint64_t end);
/* dst |= src; both must have the same size. Returns false otherwise. */
bool qk_hbitmap_merge(QkHBitmap *dst, const QkHBitmap *src);

#endif
