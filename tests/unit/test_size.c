/* Size parsing and formatting. */
#include "qktest.h"
#include "util/size.h"
#include "common/checked.h"

#include <errno.h>
#include <string.h>

int main(void)
{
    uint64_t v;
    QK_CHECK_EQ(qk_parse_size("0", &v), 0); QK_CHECK_EQ(v, 0);
    QK_CHECK_EQ(qk_parse_size("512", &v), 0); QK_CHECK_EQ(v, 512);
    QK_CHECK_EQ(qk_parse_size("64k", &v), 0); QK_CHECK_EQ(v, 65536);
    QK_CHECK_EQ(qk_parse_size("64K", &v), 0); QK_CHECK_EQ(v, 65536);
    QK_CHECK_EQ(qk_parse_size("1G", &v), 0); QK_CHECK_EQ(v, 1ULL << 30);
    QK_CHECK_EQ(qk_parse_size("2M", &v), 0); QK_CHECK_EQ(v, 2ULL << 20);
    QK_CHECK_EQ(qk_parse_size("1T", &v), 0); QK_CHECK_EQ(v, 1ULL << 40);
    QK_CHECK_EQ(qk_parse_size("1.5M", &v), 0); QK_CHECK_EQ(v, 3ULL << 19);
    QK_CHECK_EQ(qk_parse_size("1GiB", &v), 0); QK_CHECK_EQ(v, 1ULL << 30);
    QK_CHECK_EQ(qk_parse_size("4KB", &v), 0); QK_CHECK_EQ(v, 4096);
    QK_CHECK_EQ(qk_parse_size("", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("abc", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("-1", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("12Q", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("1.5", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("99999999999999999999", &v), -ERANGE);
    QK_CHECK_EQ(qk_parse_size("16777216T", &v), -ERANGE);
    /* As qemu-img: hexadecimal bytes (no fraction), leading blanks. */
    QK_CHECK_EQ(qk_parse_size("0x100000", &v), 0); QK_CHECK_EQ(v, 1ULL << 20);
    QK_CHECK_EQ(qk_parse_size("0X10", &v), 0); QK_CHECK_EQ(v, 16);
    /* A suffix on hex is taken, as qemu-img 7.2 takes it (deprecated). */
    QK_CHECK_EQ(qk_parse_size("0x10k", &v), 0); QK_CHECK_EQ(v, 16ULL << 10);
    QK_CHECK_EQ(qk_parse_size("0x2M", &v), 0); QK_CHECK_EQ(v, 2ULL << 20);
    QK_CHECK_EQ(qk_parse_size("0x10q", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("0x1.5k", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("0xffffffffffffffK", &v), -ERANGE);
    QK_CHECK_EQ(qk_parse_size("0x1.5", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("0x", &v), -EINVAL);
    QK_CHECK_EQ(qk_parse_size("0x10000000000000000", &v), -ERANGE);
    QK_CHECK_EQ(qk_parse_size(" 1M", &v), 0); QK_CHECK_EQ(v, 1ULL << 20);
    QK_CHECK_EQ(qk_parse_size(" -1", &v), -EINVAL);

    char buf[32];
    QK_CHECK(strcmp(qk_format_size(512, buf, sizeof(buf)), "512 B") == 0);
    QK_CHECK(strcmp(qk_format_size(65536, buf, sizeof(buf)), "64 KiB") == 0);
    QK_CHECK(strcmp(qk_format_size(1ULL << 30, buf, sizeof(buf)), "1 GiB") == 0);
    QK_CHECK(strcmp(qk_format_size(3ULL << 19, buf, sizeof(buf)), "1.5 MiB") == 0);
    QK_CHECK(strcmp(qk_format_size(200704, buf, sizeof(buf)), "196 KiB") == 0);

    uint64_t r;
    QK_CHECK(qk_add_overflow(UINT64_MAX, (uint64_t)1, &r));
    QK_CHECK(!qk_add_overflow((uint64_t)1, (uint64_t)1, &r) && r == 2);
    QK_CHECK(qk_mul_overflow((uint64_t)1 << 40, (uint64_t)1 << 30, &r));
    QK_CHECK(qk_range_within(0, 10, 10));
    QK_CHECK(!qk_range_within(1, 10, 10));
    QK_CHECK(!qk_range_within(UINT64_MAX, 2, UINT64_MAX));
    QK_CHECK(qk_align_up_checked(5, 4, &r) && r == 8);
    QK_CHECK(!qk_align_up_checked(UINT64_MAX - 1, 4, &r));
    QK_CHECK(qk_ranges_overlap(0, 10, 9, 1));
    QK_CHECK(!qk_ranges_overlap(0, 10, 10, 1));
    QK_CHECK(!qk_ranges_overlap(0, 0, 0, 10));
    QK_TEST_DONE();
}
