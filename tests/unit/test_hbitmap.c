/* Hierarchical bitmap against a plain bool-array model. */
#include "qktest.h"
#include "util/hbitmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t model_next(const unsigned char *m, uint64_t n, uint64_t from, int want)
{
    for (uint64_t i = from; i < n; i++) {
        if (m[i] == want) {
            return i;
        }
    }
    return UINT64_MAX;
}

int main(void)
{
    uint64_t sizes[] = {1, 63, 64, 65, 4095, 4096, 262145, 300000};
    srand(7);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        uint64_t n = sizes[s];
        QkHBitmap *hb = qk_hbitmap_new(n);
        unsigned char *m = calloc(n, 1);
        QK_CHECK_EQ(qk_hbitmap_next_set(hb, 0), UINT64_MAX);
        for (int iter = 0; iter < 2000; iter++) {
            uint64_t a = (uint64_t)rand() % n;
            uint64_t len = (uint64_t)rand() % (rand() % 4 == 0 ? n : 200) + 1;
            bool set = rand() % 3 != 0;
            if (set) {
                qk_hbitmap_set(hb, a, len);
            } else {
                qk_hbitmap_reset(hb, a, len);
            }
            for (uint64_t i = a; i < a + len && i < n; i++) {
                m[i] = set;
            }
            uint64_t from = (uint64_t)rand() % n;
            uint64_t e1 = model_next(m, n, from, 1), e0 = model_next(m, n, from, 0);
            /* The bounded search: the same answer inside its window, none past it. */
            uint64_t end = from + (uint64_t)rand() % 300;
            uint64_t eb = e0 != UINT64_MAX && e0 < end ? e0 : UINT64_MAX;
            if (qk_hbitmap_next_set(hb, from) != e1 || qk_hbitmap_next_zero(hb, from) != e0 ||
                qk_hbitmap_next_zero_before(hb, from, end) != eb) {
                QK_CHECK_EQ(qk_hbitmap_next_set(hb, from), e1);
                QK_CHECK_EQ(qk_hbitmap_next_zero(hb, from), e0);
                QK_CHECK_EQ(qk_hbitmap_next_zero_before(hb, from, end), eb);
                break;
            }
        }
        uint64_t cnt = 0;
        for (uint64_t i = 0; i < n; i++) {
            cnt += m[i];
            if (qk_hbitmap_get(hb, i) != (bool)m[i]) {
                QK_CHECK(!"get mismatch");
                break;
            }
        }
        QK_CHECK_EQ(qk_hbitmap_count(hb), cnt);
        /* Walking every set bit with next_set visits exactly the model's bits. */
        uint64_t walked = 0;
        for (uint64_t b = qk_hbitmap_next_set(hb, 0); b != UINT64_MAX; b = qk_hbitmap_next_set(hb, b + 1)) {
            walked++;
        }
        QK_CHECK_EQ(walked, cnt);

        QkHBitmap *other = qk_hbitmap_new(n);
        qk_hbitmap_set(other, n / 2, 1);
        QK_CHECK(qk_hbitmap_merge(other, hb));
        QK_CHECK_EQ(qk_hbitmap_count(other), cnt + (m[n / 2] ? 0 : 1));
        qk_hbitmap_reset_all(hb);
        QK_CHECK_EQ(qk_hbitmap_count(hb), 0);
        QK_CHECK_EQ(qk_hbitmap_next_set(hb, 0), UINT64_MAX);
        qk_hbitmap_free(other);
        qk_hbitmap_free(hb);
        free(m);
    }
    QkHBitmap *a = qk_hbitmap_new(10), *b = qk_hbitmap_new(11);
    QK_CHECK(!qk_hbitmap_merge(a, b));
    qk_hbitmap_free(a);
    qk_hbitmap_free(b);
    /* Large sparse bitmap: a far bit is found quickly. */
    QkHBitmap *big = qk_hbitmap_new(1ULL << 32);
    qk_hbitmap_set(big, (1ULL << 32) - 5, 3);
    QK_CHECK_EQ(qk_hbitmap_next_set(big, 0), (1ULL << 32) - 5);
    QK_CHECK_EQ(qk_hbitmap_count(big), 3);
    /* Fully set: a bounded search for a zero stops at its window. */
    qk_hbitmap_set(big, 0, 1ULL << 32);
    QK_CHECK_EQ(qk_hbitmap_next_zero_before(big, 1000, 5000), UINT64_MAX);
    qk_hbitmap_reset(big, 4999, 1);
    QK_CHECK_EQ(qk_hbitmap_next_zero_before(big, 1000, 5000), 4999);
    QK_CHECK_EQ(qk_hbitmap_next_zero_before(big, 1000, 4999), UINT64_MAX);
    qk_hbitmap_free(big);
    QK_TEST_DONE();
}
