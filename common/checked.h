/*
 * Checked arithmetic and alignment helpers. Every size or offset computed
 * from image metadata goes through these so a hostile image cannot wrap a
 * computation into a small, valid-looking number.
 */
#ifndef QK_COMMON_CHECKED_H
#define QK_COMMON_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns true on overflow (result then undefined). */
#define qk_add_overflow(a, b, r) __builtin_add_overflow((a), (b), (r))
#define qk_sub_overflow(a, b, r) __builtin_sub_overflow((a), (b), (r))
#define qk_mul_overflow(a, b, r) __builtin_mul_overflow((a), (b), (r))

/* Each argument is evaluated once (QK_MIN(x++, y) is safe); both are
 * compared in their common type, as a plain a < b would. */
#define QK_MIN(a, b) __extension__({ __typeof__((a) + (b)) qk_min_a_ = (a), qk_min_b_ = (b); \
                                     qk_min_a_ < qk_min_b_ ? qk_min_a_ : qk_min_b_; })
#define QK_MAX(a, b) __extension__({ __typeof__((a) + (b)) qk_max_a_ = (a), qk_max_b_ = (b); \
                                     qk_max_a_ > qk_max_b_ ? qk_max_a_ : qk_max_b_; })
#define QK_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define QK_DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))

/* Power-of-two alignment helpers (align must be a power of two). */
static inline uint64_t qk_align_down(uint64_t v, uint64_t align) { return v & ~(align - 1); }
static inline uint64_t qk_align_up(uint64_t v, uint64_t align) { return (v + align - 1) & ~(align - 1); }
static inline bool qk_is_aligned(uint64_t v, uint64_t align) { return (v & (align - 1)) == 0; }
static inline bool qk_is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* Rounds v up to a multiple of align (any power of two); false on overflow. */
static inline bool qk_align_up_checked(uint64_t v, uint64_t align, uint64_t *out)
{
    uint64_t t;
    if (qk_add_overflow(v, align - 1, &t)) {
        return false;
    }
    *out = t & ~(align - 1);
    return true;
}

/* True when [off, off+len) lies inside [0, limit) without wrapping. */
static inline bool qk_range_within(uint64_t off, uint64_t len, uint64_t limit)
{
    uint64_t end;
    return !qk_add_overflow(off, len, &end) && end <= limit;
}

/* True when [a, a+alen) and [b, b+blen) overlap (empty ranges never do). */
static inline bool qk_ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

#endif
