/*
 * Hierarchical bitmap implementation. Level 0 holds the bits; level k+1 has
 * one bit per 64-bit word of level k, set when that word is non-zero. The
 * top level is a single word. Updates touch O(levels) words per changed
 * word; searches descend from the top.
 */
#include "util/hbitmap.h"

#include <stdlib.h>
#include <string.h>

#define MAX_LEVELS QK_HBITMAP_MAX_LEVELS

QkHBitmap *qk_hbitmap_new(uint64_t nbits)
{
    QkHBitmap *hb = calloc(1, sizeof(*hb));
    if (!hb) {
        return NULL;
    }
    hb->nbits = nbits;
    uint64_t n = nbits ? nbits : 1;
    int l = 0;
    do {
        uint64_t words = (n + 63) / 64;
        hb->nwords[l] = words;
        hb->lv[l] = calloc(words, sizeof(uint64_t));
        if (!hb->lv[l]) {
            qk_hbitmap_free(hb);
            return NULL;
        }
        n = words;
        l++;
    } while (n > 1 && l < MAX_LEVELS);
    hb->levels = l;
    return hb;
}

void qk_hbitmap_free(QkHBitmap *hb)
{
    if (!hb) {
        return;
    }
    for (int l = 0; l < MAX_LEVELS; l++) {
        free(hb->lv[l]);
    }
    free(hb);
}

uint64_t qk_hbitmap_size(const QkHBitmap *hb) { return hb->nbits; }
uint64_t qk_hbitmap_count(const QkHBitmap *hb) { return hb->count; }

/* Propagates a change of word w at level l (zero <-> non-zero) upwards. */
static void propagate(QkHBitmap *hb, int l, uint64_t w)
{
    for (; l + 1 < hb->levels; l++) {
        uint64_t up = w / 64;
        uint64_t mask = 1ULL << (w % 64);
        uint64_t old = hb->lv[l + 1][up];
        if (hb->lv[l][w]) {
            hb->lv[l + 1][up] |= mask;
        } else {
            hb->lv[l + 1][up] &= ~mask;
        }
        if ((old != 0) == (hb->lv[l + 1][up] != 0)) {
            break; /* the summary above does not change */
        }
        w = up;
    }
}

static void update(QkHBitmap *hb, uint64_t start, uint64_t count, bool set)
{
    if (start >= hb->nbits) {
        return;
    }
    if (count > hb->nbits - start) {
        count = hb->nbits - start;
    }
    uint64_t end = start + count;
    while (start < end) {
        uint64_t w = start / 64;
        unsigned lo = start % 64;
        unsigned n = (unsigned)((end - start) < (uint64_t)(64 - lo) ? (end - start) : (uint64_t)(64 - lo));
        uint64_t mask = (n == 64) ? ~0ULL : (((1ULL << n) - 1) << lo);
        uint64_t old = hb->lv[0][w];
        uint64_t nw = set ? (old | mask) : (old & ~mask);
        if (nw != old) {
            hb->lv[0][w] = nw;
            hb->count += (uint64_t)__builtin_popcountll(nw) - (uint64_t)__builtin_popcountll(old);
            if ((old != 0) != (nw != 0)) {
                propagate(hb, 0, w);
            }
        }
        start += n;
    }
}

void qk_hbitmap_set(QkHBitmap *hb, uint64_t start, uint64_t count) { update(hb, start, count, true); }
void qk_hbitmap_reset(QkHBitmap *hb, uint64_t start, uint64_t count) { update(hb, start, count, false); }

void qk_hbitmap_reset_all(QkHBitmap *hb)
{
    for (int l = 0; l < hb->levels; l++) {
        memset(hb->lv[l], 0, hb->nwords[l] * sizeof(uint64_t));
    }
    hb->count = 0;
}

/* Finds the first set bit at level l at or after index pos, using the
 * levels above to skip empty words. */
static uint64_t find_set(const QkHBitmap *hb, int l, uint64_t pos)
{
    uint64_t nbits_l = l == 0 ? hb->nbits : hb->nwords[l - 1];
    while (pos < nbits_l) {
        uint64_t w = pos / 64;
        uint64_t word = hb->lv[l][w] & (~0ULL << (pos % 64));
        if (word) {
            uint64_t bit = w * 64 + (uint64_t)__builtin_ctzll(word);
            return bit < nbits_l ? bit : UINT64_MAX;
        }
        /* Ask the level above for the next non-empty word after w. */
        if (l + 1 >= hb->levels) {
            return UINT64_MAX;
        }
        uint64_t nw = find_set(hb, l + 1, w + 1);
        if (nw == UINT64_MAX) {
            return UINT64_MAX;
        }
        pos = nw * 64;
    }
    return UINT64_MAX;
}

uint64_t qk_hbitmap_next_set(const QkHBitmap *hb, uint64_t from)
{
    if (from >= hb->nbits || hb->count == 0) {
        return UINT64_MAX;
    }
    return find_set(hb, 0, from);
}

uint64_t qk_hbitmap_next_zero_before(const QkHBitmap *hb, uint64_t from, uint64_t end)
{
    end = end < hb->nbits ? end : hb->nbits;
    for (uint64_t pos = from; pos < end;) {
        uint64_t w = pos / 64;
        uint64_t word = ~hb->lv[0][w] & (~0ULL << (pos % 64));
        if (word) {
            uint64_t bit = w * 64 + (uint64_t)__builtin_ctzll(word);
            return bit < end ? bit : UINT64_MAX;
        }
        pos = (w + 1) * 64;
    }
    return UINT64_MAX;
}

uint64_t qk_hbitmap_next_zero(const QkHBitmap *hb, uint64_t from)
{
    return qk_hbitmap_next_zero_before(hb, from, hb->nbits);
}

bool qk_hbitmap_merge(QkHBitmap *dst, const QkHBitmap *src)
{
    if (dst->nbits != src->nbits) {
        return false;
    }
    for (uint64_t w = 0; w < src->nwords[0]; w++) {
        uint64_t old = dst->lv[0][w];
        uint64_t nw = old | src->lv[0][w];
        if (nw != old) {
            dst->lv[0][w] = nw;
            dst->count += (uint64_t)__builtin_popcountll(nw) - (uint64_t)__builtin_popcountll(old);
            if (!old) {
                propagate(dst, 0, w);
            }
        }
    }
    return true;
}
