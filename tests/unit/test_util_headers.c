/* The small shared headers on their own: single-evaluation QK_MIN/QK_MAX,
 * the big-endian loads and stores (util/byteorder.h), the range helpers
 * (util/checked.h) and the one backing-path resolver (block.h). */
#include "qktest.h"
#include "block/block.h"
#include "common/byteorder.h"
#include "common/checked.h"

#include <stdlib.h>
#include <string.h>

static void min_max(void)
{
    int i = 0, j = 10;
    QK_CHECK_EQ(QK_MIN(i++, j++), 0);
    QK_CHECK_EQ(i, 1);
    QK_CHECK_EQ(j, 11);
    QK_CHECK_EQ(QK_MAX(i++, j++), 11);
    QK_CHECK_EQ(i, 2);
    QK_CHECK_EQ(j, 12);
    uint64_t big = 1ULL << 40;
    QK_CHECK_EQ(QK_MIN(big, 4096), 4096);
    QK_CHECK_EQ(QK_MAX(big, 1), big);
    QK_CHECK_EQ(QK_MAX(QK_MIN(5, 7), QK_MIN(9, 6)), 6);
    QK_CHECK_EQ(QK_MIN(-3, 2), -3);
}

static void byteorder(void)
{
    uint8_t b[11] = {0};
    /* Odd offsets: the loads and stores work at any alignment. */
    qk_be64_put(b + 1, 0x0102030405060708ULL);
    QK_CHECK(b[1] == 1 && b[8] == 8 && b[0] == 0 && b[9] == 0);
    QK_CHECK_EQ(qk_be64_get(b + 1), 0x0102030405060708ULL);
    qk_be32_put(b + 3, 0xa1b2c3d4u);
    QK_CHECK(b[3] == 0xa1 && b[6] == 0xd4);
    QK_CHECK_EQ(qk_be32_get(b + 3), 0xa1b2c3d4u);
    qk_be16_put(b + 9, 0xbeef);
    QK_CHECK(b[9] == 0xbe && b[10] == 0xef);
    QK_CHECK_EQ(qk_be16_get(b + 9), 0xbeef);
}

static void ranges(void)
{
    QK_CHECK(qk_ranges_overlap(0, 10, 9, 1));
    QK_CHECK(!qk_ranges_overlap(0, 10, 10, 1));
    QK_CHECK(!qk_ranges_overlap(5, 0, 0, 10));
    QK_CHECK(qk_range_within(0, 10, 10));
    QK_CHECK(!qk_range_within(1, 10, 10));
    QK_CHECK(!qk_range_within(UINT64_MAX, 2, UINT64_MAX));
    uint64_t r;
    QK_CHECK(qk_align_up_checked(4095, 4096, &r) && r == 4096);
    QK_CHECK(!qk_align_up_checked(UINT64_MAX - 10, 4096, &r));
}

static void backing_path_is(const char *image, const char *backing, const char *want)
{
    char *p = qk_block_backing_path(image, backing);
    QK_CHECK(p && strcmp(p, want) == 0);
    if (p && strcmp(p, want) != 0) {
        fprintf(stderr, "  %s + %s: got %s, want %s\n", image, backing, p, want);
    }
    free(p);
}

static void backing_paths(void)
{
    backing_path_is("dir/top.qcow2", "base.qcow2", "dir/base.qcow2");
    backing_path_is("/a/b/top.qcow2", "../base.raw", "/a/b/../base.raw");
    backing_path_is("top.qcow2", "base.qcow2", "base.qcow2");
    backing_path_is("dir/top.qcow2", "/abs/base.qcow2", "/abs/base.qcow2");
    backing_path_is("dir/top.qcow2", "nbd://host:10809/exp", "nbd://host:10809/exp");
    backing_path_is("dir/top.qcow2", "nbd+unix:///exp?socket=/s", "nbd+unix:///exp?socket=/s");
    backing_path_is("dir/top.qcow2", "nbd:unix:/s:exportname=e", "nbd:unix:/s:exportname=e");
}

int main(void)
{
    min_max();
    byteorder();
    ranges();
    backing_paths();
    QK_TEST_DONE();
}
