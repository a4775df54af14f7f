/* Images written by qemu-img/qemu-io read back through our driver: data,
 * zero clusters (write -z), compressed clusters (zlib and zstd), extended
 * L2 with partly allocated clusters, a backing chain (reads past a shorter
 * backing file are zeros), internal snapshots (writes must copy shared
 * clusters). Then our zero writes and discards, checked by qemu-img, and
 * our subcluster discards with extended L2 read back by qemu-io. */
#include "qcow2_test_util.h"

#define MB (1ULL << 20)

static uint8_t *pattern(uint8_t *m, uint64_t off, uint64_t len, uint8_t p)
{
    memset(m + off, p, len);
    return m;
}

static void read_back(const char *path, const uint8_t *model, uint64_t len)
{
    QkBlock *bs = t_open(path, 0);
    QK_CHECK(bs != NULL);
    if (bs) {
        QK_CHECK_EQ(qk_block_length(bs), len);
        QK_CHECK_EQ(t_verify(bs, model, len), 0);
        qk_block_close(bs);
    }
}

static void qemu_written(const char *opts)
{
    fprintf(stderr, "qemu-written image %s\n", opts);
    uint64_t len = 8 * MB;
    uint8_t *m = calloc(1, len);
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 %s q.qcow2 8M", opts), 0);
    QK_CHECK_EQ(t_sh("qemu-io -f qcow2 -c 'write -P 0x11 0 1M' -c 'write -P 0x22 1536k 5000' "
                     "-c 'write -z 512k 128k' -c 'write -P 0x33 3M 4k' -c 'write -z -u 3M 64k' "
                     "-c 'write -P 0x44 7340032 1048576' q.qcow2 >/dev/null"), 0);
    pattern(m, 0, MB, 0x11);
    pattern(m, 1536 * 1024, 5000, 0x22);
    pattern(m, 512 * 1024, 128 * 1024, 0);
    pattern(m, 7340032, MB, 0x44);
    read_back("q.qcow2", m, len);
    /* And our writes on top must keep qemu-img happy. */
    QkBlock *bs = t_open("q.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (bs) {
        uint8_t buf[3000];
        memset(buf, 0x55, sizeof(buf));
        QK_CHECK_EQ(t_write(bs, 600 * 1024 + 7, sizeof(buf), buf), 0);
        memcpy(m + 600 * 1024 + 7, buf, sizeof(buf));
        QK_CHECK_EQ(t_write(bs, 3 * MB + 100, sizeof(buf), buf), 0);
        memcpy(m + 3 * MB + 100, buf, sizeof(buf));
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check("q.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("q.qcow2", "ref.raw"), 0);
    free(m);
}

static void compressed(const char *type)
{
    fprintf(stderr, "compressed %s\n", type);
    uint64_t len = 4 * MB;
    uint8_t *m = calloc(1, len);
    for (uint64_t i = 0; i < len; i++) {
        m[i] = (uint8_t)((i * 7) / 4096 + (i % 13 == 0));
    }
    QK_CHECK_EQ(t_write_raw("c.raw", m, len), 0);
    QK_CHECK_EQ(t_sh("qemu-img convert -c -O qcow2 -o compression_type=%s c.raw c.qcow2", type), 0);
    read_back("c.qcow2", m, len);
    QkBlock *bs = t_open("c.qcow2", QK_OPEN_RDWR);
    if (bs) {
        /* Overwriting part of a compressed cluster copies the rest out of it. */
        uint8_t buf[100];
        memset(buf, 0xee, sizeof(buf));
        QK_CHECK_EQ(t_write(bs, 70000, sizeof(buf), buf), 0);
        memcpy(m + 70000, buf, sizeof(buf));
        QK_CHECK_EQ(t_zero(bs, 1 * MB, 128 * 1024, QK_REQ_MAY_UNMAP), 0);
        memset(m + MB, 0, 128 * 1024);
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check("c.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("c.qcow2", "ref.raw"), 0);
    free(m);
}

static void chain(void)
{
    fprintf(stderr, "backing chain\n");
    uint64_t len = 8 * MB;
    uint8_t *m = calloc(1, len);
    /* base is shorter than the overlay: past its end reads zeros. */
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 base.qcow2 6M && "
                     "qemu-io -f qcow2 -c 'write -P 0xa1 0 6M' base.qcow2 >/dev/null && "
                     "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2 6M && "
                     "qemu-io -f qcow2 -c 'write -P 0xb2 1M 1M' -c 'write -z 3M 64k' mid.qcow2 >/dev/null && "
                     "qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2 8M && "
                     "qemu-io -f qcow2 -c 'write -P 0xc3 1536k 100k' top.qcow2 >/dev/null"), 0);
    pattern(m, 0, 6 * MB, 0xa1);
    pattern(m, MB, MB, 0xb2);
    pattern(m, 3 * MB, 64 * 1024, 0);
    pattern(m, 1536 * 1024, 100 * 1024, 0xc3);
    read_back("top.qcow2", m, len);
    QkBlock *bs = t_open("top.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (bs) {
        /* COW from the backing chain for unaligned writes. */
        uint8_t buf[5000];
        memset(buf, 0x77, sizeof(buf));
        static const uint64_t offs[] = {100, 65536 * 20 + 3, 3 * MB - 2500, 6 * MB - 1000, 7 * MB + 11};
        for (size_t i = 0; i < QK_ARRAY_SIZE(offs); i++) {
            QK_CHECK_EQ(t_write(bs, offs[i], sizeof(buf), buf), 0);
            memcpy(m + offs[i], buf, sizeof(buf));
        }
        /* Zeroing over a backing file must hide it; discard on v3 too. */
        QK_CHECK_EQ(t_zero(bs, 4 * MB, 256 * 1024, 0), 0);
        memset(m + 4 * MB, 0, 256 * 1024);
        QK_CHECK_EQ(t_discard(bs, 5 * MB, 128 * 1024), 0);
        memset(m + 5 * MB, 0, 128 * 1024);
        QK_CHECK_EQ(t_zero(bs, 2 * MB + 1000, 3000, 0), 0);
        memset(m + 2 * MB + 1000, 0, 3000);
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
        /* Block status: allocated here vs. in the backing. */
        uint64_t pnum = 0, map = 0;
        int st = t_status(bs, 1536 * 1024, 64 * 1024, &pnum, &map);
        QK_CHECK_EQ(st & (QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID),
                    QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID);
        QK_CHECK(pnum > 0 && map % 65536 == 0 && map > 0);
        st = t_status(bs, 4 * MB, 256 * 1024, &pnum, NULL);
        QK_CHECK_EQ(st & (QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_DATA), QK_BS_ZERO | QK_BS_ALLOCATED);
        QK_CHECK_EQ(pnum, 256 * 1024);
        st = t_status(bs, 2 * MB + 65536 * 4, 65536, &pnum, NULL);
        QK_CHECK_EQ(st & QK_BS_ALLOCATED, 0); /* only in the backing chain */
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check("top.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("top.qcow2", "ref.raw"), 0);
    read_back("top.qcow2", m, len);
    free(m);
}

static void snapshots(void)
{
    fprintf(stderr, "internal snapshot\n");
    uint64_t len = 4 * MB;
    uint8_t *m = calloc(1, len);
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 s.qcow2 4M && "
                     "qemu-io -f qcow2 -c 'write -P 0x5a 0 2M' s.qcow2 >/dev/null && "
                     "qemu-img snapshot -c snap1 s.qcow2"), 0);
    pattern(m, 0, 2 * MB, 0x5a);
    QkBlock *bs = t_open("s.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (bs) {
        uint8_t buf[1000];
        memset(buf, 0x6b, sizeof(buf));
        QK_CHECK_EQ(t_write(bs, 70000, sizeof(buf), buf), 0);
        memcpy(m + 70000, buf, sizeof(buf));
        QK_CHECK_EQ(t_discard(bs, MB, 64 * 1024), 0);
        memset(m + MB, 0, 64 * 1024);
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check("s.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("s.qcow2", "ref.raw"), 0);
    /* The snapshot still holds the old data. */
    QK_CHECK_EQ(t_sh("qemu-img snapshot -a snap1 s.qcow2 && qemu-io -f qcow2 -c 'read -P 0x5a 0 2M' s.qcow2 | grep -q 'read 2097152'"), 0);
    free(m);
}

static void zero_discard(const char *opts, bool v2)
{
    fprintf(stderr, "zero/discard %s\n", opts);
    uint64_t len = 8 * MB;
    uint8_t *m = calloc(1, len);
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 %s z.qcow2 8M", opts), 0);
    QkBlock *bs = t_open("z.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (!bs) {
        free(m);
        return;
    }
    uint8_t *buf = malloc(len);
    memset(buf, 0x3c, len);
    QK_CHECK_EQ(t_write(bs, 0, len, buf), 0);
    memset(m, 0x3c, len);
    QK_CHECK_EQ(t_zero(bs, MB, MB, 0), 0);                       /* keep allocation */
    QK_CHECK_EQ(t_zero(bs, 3 * MB, MB, QK_REQ_MAY_UNMAP), 0);    /* free clusters */
    QK_CHECK_EQ(t_zero(bs, 5 * MB + 100, 70000, QK_REQ_MAY_UNMAP), 0); /* unaligned */
    QK_CHECK_EQ(t_discard(bs, 6 * MB, 512 * 1024), 0);
    memset(m + MB, 0, MB);
    memset(m + 3 * MB, 0, MB);
    memset(m + 5 * MB + 100, 0, 70000);
    memset(m + 6 * MB, 0, 512 * 1024);  /* no backing: discarded reads as zeros */
    QK_CHECK_EQ(t_verify(bs, m, len), 0);
    /* Block status: data merged over many clusters, zeros where we zeroed. */
    uint64_t pnum = 0, map = 0;
    int st = t_status(bs, 0, MB, &pnum, &map);
    QK_CHECK_EQ(st & (QK_BS_DATA | QK_BS_ALLOCATED), QK_BS_DATA | QK_BS_ALLOCATED);
    if (!strstr(opts, "cluster_size=512")) {
        QK_CHECK_EQ(pnum, MB); /* one host-contiguous extent, written in one go */
    }
    if (!v2) {
        st = t_status(bs, 3 * MB, MB, &pnum, NULL);
        QK_CHECK(st & QK_BS_ZERO);
        QK_CHECK_EQ(pnum, MB);
    }
    /* Rewrite some of the zeroed space: must reuse or reallocate cleanly. */
    QK_CHECK_EQ(t_write(bs, MB + 4096, 8192, buf), 0);
    memset(m + MB + 4096, 0x3c, 8192);
    QK_CHECK_EQ(t_write(bs, 3 * MB + 65536, 65536, buf), 0);
    memset(m + 3 * MB + 65536, 0x3c, 65536);
    QK_CHECK_EQ(t_verify(bs, m, len), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check("z.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("z.qcow2", "ref.raw"), 0);
    read_back("z.qcow2", m, len);
    free(buf);
    free(m);
}

/* With extended L2 our discards of whole subclusters (of a partly covered
 * cluster, or of all of one cluster piece by piece, which frees it) must
 * read as zeros through qemu-io, also over a backing file, and the bytes
 * around them (partial subclusters at the edges too) keep their data. */
static void extl2_discard(bool backing)
{
    fprintf(stderr, "extended L2 subcluster discard, backing=%d\n", backing);
    const uint64_t cs = 65536, sc = 2048, len = 8 * cs;
    QK_CHECK_EQ(t_sh("rm -f xb.qcow2 x.qcow2 && qemu-img create -q -f qcow2 xb.qcow2 512k && "
                     "qemu-io -f qcow2 -c 'write -P 0x99 0 512k' xb.qcow2 >/dev/null && "
                     "qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k %s x.qcow2 512k",
                     backing ? "-b xb.qcow2 -F qcow2" : ""), 0);
    QkBlock *bs = t_open("x.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (!bs) {
        return;
    }
    uint8_t *buf = malloc(len);
    memset(buf, 0x3c, len);
    QK_CHECK_EQ(t_write(bs, 0, 6 * cs, buf), 0);
    /* Zeros: subcluster 3 of cluster 0; subclusters 5..9 of cluster 1 (the
     * discard starts and ends inside subclusters 4 and 10); the end of
     * cluster 2 and the start of cluster 3; all of cluster 4, a subcluster
     * or a bit more at a time (freed with the last one). */
    static const struct { uint64_t off, len, z0, z1; } d[] = {
        {3 * 2048, 2048, 3 * 2048, 4 * 2048},
        {65536 + 4 * 2048 + 1, 7 * 2048 - 2, 65536 + 5 * 2048, 65536 + 10 * 2048},
        {3 * 65536 - 5000, 9000, 3 * 65536 - 4096, 3 * 65536 + 2048},
    };
    for (size_t i = 0; i < QK_ARRAY_SIZE(d); i++) {
        QK_CHECK_EQ(t_discard(bs, d[i].off, d[i].len), 0);
    }
    for (uint64_t o = 4 * cs; o < 5 * cs; o += 3 * sc) {
        QK_CHECK_EQ(t_discard(bs, o, QK_MIN(3 * sc + 100, 5 * cs - o)), 0);
    }
    qk_block_close(bs);
    char cmds[4096];
    size_t u = 0;
    uint64_t pos = 0;
    for (size_t i = 0; i <= QK_ARRAY_SIZE(d); i++) {
        uint64_t z0 = i < QK_ARRAY_SIZE(d) ? d[i].z0 : 4 * cs, z1 = i < QK_ARRAY_SIZE(d) ? d[i].z1 : 5 * cs;
        u += (size_t)snprintf(cmds + u, sizeof(cmds) - u, "-c 'read -P 0x3c %llu %llu' -c 'read -P 0 %llu %llu' ",
                              (unsigned long long)pos, (unsigned long long)(z0 - pos), (unsigned long long)z0,
                              (unsigned long long)(z1 - z0));
        pos = z1;
    }
    snprintf(cmds + u, sizeof(cmds) - u, "-c 'read -P 0x3c %llu %llu' -c 'read -P %d %llu %llu'",
             (unsigned long long)pos, (unsigned long long)(6 * cs - pos), backing ? 0x99 : 0,
             (unsigned long long)(6 * cs), (unsigned long long)(len - 6 * cs));
    QK_CHECK_EQ(t_sh("qemu-io -f qcow2 -r %s x.qcow2 >x-read.log 2>&1 && ! grep -q failed x-read.log", cmds), 0);
    /* Cluster 4 went back to the host: nothing of it is allocated there. */
    QK_CHECK_EQ(t_sh("qemu-img map --output=json x.qcow2 | grep -q '\"start\": %llu, \"length\": %llu, "
                     "\"depth\": 0, \"present\": true, \"zero\": true, \"data\": false}'",
                     (unsigned long long)(4 * cs), (unsigned long long)cs), 0);
    QK_CHECK_EQ(t_qemu_check("x.qcow2"), 0);
    free(buf);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img/qemu-io not installed");
    }
    qemu_written("");
    qemu_written("-o cluster_size=4k,refcount_bits=8");
    qemu_written("-o extended_l2=on,cluster_size=64k");
    qemu_written("-o compat=0.10");
    compressed("zlib");
    compressed("zstd");
    chain();
    snapshots();
    zero_discard("", false);
    zero_discard("-o compat=0.10", true);
    zero_discard("-o extended_l2=on,cluster_size=128k", false);
    zero_discard("-o lazy_refcounts=on,cluster_size=512", false);
    extl2_discard(false);
    extl2_discard(true);
    QK_TEST_DONE();
}
