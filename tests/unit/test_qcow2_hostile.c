/* Hostile and truncated images: open must fail with a clear message (or,
 * for damage only found later, the request must fail with -EUCLEAN), must
 * never crash, and must leave the file byte for byte unchanged. */
#include "qcow2_test_util.h"

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 1);
    if (fread(b, 1, *len, f) != *len) {
        *len = 0;
    }
    fclose(f);
    return b;
}

static void put_be(const char *path, long off, uint64_t v, int bytes)
{
    int fd = open(path, O_WRONLY);
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) {
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    }
    QK_CHECK_EQ(pwrite(fd, b, (size_t)bytes, off), bytes);
    close(fd);
}

static void fresh(void)
{
    QK_CHECK_EQ(t_sh("rm -f h.qcow2 && qemu-img create -q -f qcow2 h.qcow2 64M && "
                     "qemu-io -f qcow2 -c 'write -P 1 0 128k' h.qcow2 >/dev/null"), 0);
}

/* Opens read-write and read-only; both must fail mentioning `want`. */
/* Whether a read-only open finds the header's corrupt bit set. */
static bool marked_corrupt(const char *path)
{
    QkBlock *bs = t_open(path, 0);
    if (!bs) {
        return false;
    }
    QkImageInfo info;
    qk_block_get_info(bs, &info);
    qk_block_close(bs);
    return info.corrupt;
}

static void expect_fail(const char *what, const char *want)
{
    size_t l1, l2;
    uint8_t *before = slurp("h.qcow2", &l1);
    for (int rw = 0; rw < 2; rw++) {
        QkError err = {0};
        QkOpenOptions o = {.flags = rw ? QK_OPEN_RDWR : 0, .format = "qcow2"};
        QkBlock *bs = qk_block_open("h.qcow2", &o, &err);
        fprintf(stderr, "%s (%s): %s\n", what, rw ? "rw" : "ro", err.msg);
        QK_CHECK(bs == NULL);
        if (bs) {
            qk_block_close(bs);
            continue;
        }
        QK_CHECK(err.code < 0);
        QK_CHECK(strstr(err.msg, want) != NULL);
    }
    uint8_t *after = slurp("h.qcow2", &l2);
    QK_CHECK(l1 == l2 && memcmp(before, after, l1) == 0);
    free(before);
    free(after);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img not installed");
    }
    fresh(); QK_CHECK_EQ(truncate("h.qcow2", 50), 0); expect_fail("truncated to 50", "truncated");
    fresh(); QK_CHECK_EQ(truncate("h.qcow2", 90), 0); expect_fail("truncated to 90", "truncated");
    fresh(); QK_CHECK_EQ(truncate("h.qcow2", 70000), 0); expect_fail("truncated tables", "image is corrupt");
    fresh(); put_be("h.qcow2", 4, 4, 4); expect_fail("version 4", "version");
    fresh(); put_be("h.qcow2", 0, 0x51464900, 4); expect_fail("bad magic", "not in qcow2 format");
    fresh(); put_be("h.qcow2", 20, 8, 4); expect_fail("cluster_bits 8", "cluster_bits");
    fresh(); put_be("h.qcow2", 20, 22, 4); expect_fail("cluster_bits 22", "cluster_bits");
    fresh(); put_be("h.qcow2", 20, 0xffffffff, 4); expect_fail("cluster_bits huge", "cluster_bits");
    fresh(); put_be("h.qcow2", 32, 1, 4); expect_fail("encrypted", "encrypted");
    fresh(); put_be("h.qcow2", 36, 0x10000000, 4); expect_fail("huge l1_size", "L1 table too large");
    fresh(); put_be("h.qcow2", 36, 0x100000, 4); expect_fail("l1 past eof", "past the end");
    fresh(); put_be("h.qcow2", 40, 0x30008, 8); expect_fail("l1 misaligned", "not cluster aligned");
    fresh(); put_be("h.qcow2", 40, 1ULL << 50, 8); expect_fail("l1 offset huge", "past the end");
    fresh(); put_be("h.qcow2", 40, 0, 8); expect_fail("l1 over header", "overlaps the image header");
    fresh(); put_be("h.qcow2", 40, 0x10000, 8); expect_fail("l1 over refcount table", "overlap");
    fresh(); put_be("h.qcow2", 36, 0, 4); expect_fail("l1 too small", "too small");
    fresh(); put_be("h.qcow2", 48, 0, 8); expect_fail("reftable over header", "overlaps the image header");
    fresh(); put_be("h.qcow2", 48, 0xffffffffff0000ULL, 8); expect_fail("reftable past eof", "past the end");
    fresh(); put_be("h.qcow2", 56, 0, 4); expect_fail("reftable empty", "refcount table is empty");
    fresh(); put_be("h.qcow2", 56, 0x7fffffff, 4); expect_fail("reftable huge", "too large");
    fresh(); put_be("h.qcow2", 60, 100000, 4); expect_fail("too many snapshots", "snapshots");
    fresh(); put_be("h.qcow2", 72, 1ULL << 10, 8); expect_fail("unknown incompat bit", "Unknown incompatible feature: 400");
    /* Named from the image's own feature table: rename entry for bit 4 to bit 9. */
    fresh(); put_be("h.qcow2", 72, 1ULL << 9, 8);
    { size_t l; uint8_t *b = slurp("h.qcow2", &l); uint8_t *p = memmem(b, l, "extended L2", 11);
      QK_CHECK(p != NULL); if (p) { put_be("h.qcow2", (long)(p - b) - 1, 9, 1); } free(b); }
    expect_fail("named incompat bit", "extended L2 entries");
    /* The external data file bit with no file named, and a named one missing. */
    fresh(); put_be("h.qcow2", 72, 1ULL << 2, 8); expect_fail("external data file unnamed", "'data-file' is required");
    QK_CHECK_EQ(t_sh("rm -f h.qcow2 hd.raw && qemu-img create -q -f qcow2 -o data_file=hd.raw h.qcow2 64M && "
                     "rm hd.raw"), 0);
    expect_fail("external data file missing", "Could not open 'hd.raw'");
    {
        /* A metadata-only open describes it; guest data is out of reach. */
        QkError err = {0};
        QkOpenOptions o = {.flags = QK_OPEN_METADATA_ONLY, .format = "qcow2"};
        QkBlock *bs = qk_block_open("h.qcow2", &o, &err);
        QK_CHECK(bs != NULL);
        if (bs) {
            QkImageInfo info;
            qk_block_get_info(bs, &info);
            QK_CHECK(info.data_file && strcmp(info.data_file, "hd.raw") == 0);
            uint8_t buf[512];
            QK_CHECK_EQ(t_read(bs, 0, sizeof(buf), buf), -ENOMEDIUM);
            qk_block_close(bs);
        }
        QK_CHECK(access("hd.raw", F_OK) != 0);
    }
    fresh(); put_be("h.qcow2", 96, 7, 4); expect_fail("refcount_order 7", "refcount_order");
    fresh(); put_be("h.qcow2", 100, 48, 4); expect_fail("header_length small", "header_length");
    fresh(); put_be("h.qcow2", 100, 0x100000, 4); expect_fail("header_length huge", "header_length");
    fresh(); put_be("h.qcow2", 104, 7, 1); expect_fail("compression type", "compression type");
    fresh(); put_be("h.qcow2", 8, 0x20000, 8); put_be("h.qcow2", 16, 10, 4); expect_fail("backing offset", "backing file");
    fresh(); put_be("h.qcow2", 8, 0x200, 8); put_be("h.qcow2", 16, 5000, 4); expect_fail("backing name long", "backing file name too long");
    fresh(); put_be("h.qcow2", 116, 0x7fffffff, 4); expect_fail("extension length", "header extension");
    fresh(); put_be("h.qcow2", 72, 2, 8); /* corrupt bit: read-only open allowed, rw refused */
    {
        QkError err = {0};
        QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "qcow2"};
        QkBlock *bs = qk_block_open("h.qcow2", &o, &err);
        QK_CHECK(bs == NULL && strstr(err.msg, "corrupt"));
        QK_CHECK(marked_corrupt("h.qcow2"));
    }
    /* Damage found only when used: an L1 entry pointing at a misaligned L2
     * table, an L2 entry pointing at a misaligned cluster. Reads through it
     * fail with EIO, as QEMU's do, and the image says why; a read-only
     * open leaves the file as it was, a writable one marks it corrupt. */
    fresh(); put_be("h.qcow2", 0x30000, 0x8000000000050200ULL, 8);
    {
        size_t l1, l2;
        uint8_t *before = slurp("h.qcow2", &l1);
        QkBlock *bs = t_open("h.qcow2", 0);
        QK_CHECK(bs != NULL);
        if (bs) {
            uint8_t buf[4096];
            QK_CHECK_EQ(t_read(bs, 0, sizeof(buf), buf), -EIO);
            const char *why = qk_block_corrupt_reason(bs);
            QK_CHECK(why && strstr(why, "L2 table offset 0x50200 unaligned (L1 index: 0)"));
            qk_block_close(bs);
        }
        uint8_t *after = slurp("h.qcow2", &l2);
        QK_CHECK(l1 == l2 && memcmp(before, after, l1) == 0);
        free(before);
        free(after);
    }
    fresh(); put_be("h.qcow2", 0x40000, 0x8000000000050200ULL, 8);
    {
        QkBlock *bs = t_open("h.qcow2", 0);
        QK_CHECK(bs != NULL);
        if (bs) {
            uint8_t buf[4096];
            QK_CHECK_EQ(t_read(bs, 0, sizeof(buf), buf), -EIO);
            QK_CHECK_EQ(t_read(bs, 65536, sizeof(buf), buf), 0);
            qk_block_close(bs);
        }
        bs = t_open("h.qcow2", QK_OPEN_RDWR);
        QK_CHECK(bs != NULL);
        if (bs) {
            uint8_t buf[4096] = {0};
            QK_CHECK_EQ(t_read(bs, 0, sizeof(buf), buf), -EIO);
            /* No more writes, even to healthy clusters. */
            QK_CHECK_EQ(t_write(bs, 65536, sizeof(buf), buf), -EIO);
            QK_CHECK(qk_block_close(bs) == 0);
        }
        QK_CHECK(marked_corrupt("h.qcow2"));
    }
    QK_TEST_DONE();
}
