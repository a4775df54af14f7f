/* QkIov copy/slice/zero helpers. */
#include "qktest.h"
#include "util/iov.h"

#include <string.h>

int main(void)
{
    /* Gaps between the pieces so they stay three separate iovecs. */
    static char store[100];
    char *a = store, *b = store + 20, *c = store + 60;
    QkIov q;
    qk_iov_init(&q, 1);
    qk_iov_add(&q, a, 10);
    qk_iov_add(&q, b, 20);
    qk_iov_add(&q, c, 5);
    QK_CHECK_EQ(q.niov, 3);
    QK_CHECK_EQ(q.size, 35);

    char src[35], dst[35];
    for (int i = 0; i < 35; i++) {
        src[i] = (char)i;
    }
    QK_CHECK_EQ(qk_iov_from_buf(&q, 0, src, 35), 35);
    QK_CHECK_EQ(a[9], 9);
    QK_CHECK_EQ(b[0], 10);
    QK_CHECK_EQ(c[4], 34);
    memset(dst, 0, sizeof(dst));
    QK_CHECK_EQ(qk_iov_to_buf(&q, 8, dst, 20), 20);
    QK_CHECK(memcmp(dst, src + 8, 20) == 0);

    QkIov s;
    qk_iov_init(&s, 1);
    qk_iov_concat(&s, &q, 5, 27);
    QK_CHECK_EQ(s.size, 27);
    QK_CHECK_EQ(s.niov, 3);
    memset(dst, 0, sizeof(dst));
    qk_iov_to_buf(&s, 0, dst, 27);
    QK_CHECK(memcmp(dst, src + 5, 27) == 0);

    QK_CHECK(!qk_iov_is_zero(&q, 0, 35));
    qk_iov_memset(&q, 3, 0, 30);
    QK_CHECK(qk_iov_is_zero(&q, 3, 30));
    QK_CHECK(!qk_iov_is_zero(&q, 2, 30));
    QK_CHECK(!qk_iov_is_zero(&q, 3, 31));

    /* Adjacent buffers merge into one iovec. */
    char big[64];
    QkIov m;
    qk_iov_init(&m, 1);
    qk_iov_add(&m, big, 16);
    qk_iov_add(&m, big + 16, 48);
    QK_CHECK_EQ(m.niov, 1);
    QK_CHECK_EQ(m.size, 64);

    static char zeros[4096];
    QK_CHECK(qk_buf_is_zero(zeros, sizeof(zeros)));
    zeros[4095] = 1;
    QK_CHECK(!qk_buf_is_zero(zeros, sizeof(zeros)));
    zeros[4095] = 0;
    zeros[3] = 1;
    QK_CHECK(!qk_buf_is_zero(zeros, sizeof(zeros)));

    void *al = qk_aligned_alloc(4096, 8192);
    QK_CHECK(al && ((uintptr_t)al & 4095) == 0);
    free(al);

    qk_iov_destroy(&q);
    qk_iov_destroy(&s);
    qk_iov_destroy(&m);
    QK_TEST_DONE();
}
