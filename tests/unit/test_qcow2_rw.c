/* qcow2 read/write through the driver for every cluster size (512 B..2 MiB)
 * and refcount width (1..64 bits), v2 and v3, lazy refcounts and extended
 * L2: aligned, unaligned and cluster-spanning writes checked against an
 * in-memory model, after reopen, and by qemu-img check and compare. */
#include "qcow2_test_util.h"

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
    rng = rng * 1103515245 + 12345;
    return rng >> 8;
}

typedef struct Cfg {
    uint32_t cs, rb;
    int compat;
    bool lazy, extl2;
    QkPrealloc prealloc;
    uint64_t size;
    bool direct;
} Cfg;

static void run(const Cfg *c)
{
    char path[256];
    snprintf(path, sizeof(path), "rw-%u-%u-%d%s%s.qcow2", c->cs, c->rb, c->compat, c->lazy ? "-lazy" : "",
             c->extl2 ? "-ext" : "");
    fprintf(stderr, "case %s prealloc=%d\n", path, c->prealloc);
    QkCreateOptions o = {.size = c->size, .size_set = true, .cluster_size = c->cs, .refcount_bits = c->rb,
                         .compat = c->compat, .lazy_refcounts = c->lazy, .extended_l2 = c->extl2,
                         .prealloc = c->prealloc};
    QK_CHECK_EQ(t_create(path, &o), 0);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    uint64_t len = c->size;
    uint8_t *model = calloc(1, len);
    QkBlock *bs = t_open(path, QK_OPEN_RDWR | (c->direct ? QK_OPEN_NOCACHE : 0));
    QK_CHECK(bs != NULL);
    if (!bs) {
        free(model);
        return;
    }
    QkImageInfo info;
    qk_block_get_info(bs, &info);
    QK_CHECK_EQ(info.cluster_size, c->cs);
    QK_CHECK_EQ(info.refcount_bits, c->rb);
    QK_CHECK_EQ(info.qcow2_version, c->compat ? c->compat : 3);
    QK_CHECK_EQ(info.extended_l2, c->extl2);
    QK_CHECK_EQ(info.lazy_refcounts, c->lazy);
    QK_CHECK_EQ(info.virtual_size, len);
    uint8_t *buf = malloc(len);
    for (int i = 0; i < 60; i++) {
        uint64_t maxw = QK_MIN(len, (uint64_t)c->cs * 3 + 10000);
        uint64_t wlen = 1 + rnd() % maxw;
        uint64_t off;
        switch (i % 4) {
        case 0: off = (rnd() % (len / c->cs)) * c->cs; wlen = c->cs * (1 + rnd() % 3); break; /* aligned */
        case 1: off = rnd() % len; break;                                                    /* anywhere */
        case 2: off = (rnd() % (len / c->cs)) * c->cs + c->cs - 100; wlen = 300; break;      /* straddle */
        default: off = rnd() % len; wlen = 1 + rnd() % 700; break;                          /* small */
        }
        if (off >= len) {
            off = len - 1;
        }
        wlen = QK_MIN(wlen, len - off);
        for (uint64_t k = 0; k < wlen; k++) {
            buf[k] = (uint8_t)(i * 7 + k / 512 + 1);
        }
        QK_CHECK_EQ(t_write(bs, off, wlen, buf), 0);
        memcpy(model + off, buf, wlen);
        if (i % 10 == 9) {
            QK_CHECK_EQ(t_verify(bs, model, len), 0);
        }
    }
    QK_CHECK_EQ(t_verify(bs, model, len), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", model, len), 0);
    QK_CHECK_EQ(t_qemu_compare(path, "ref.raw"), 0);
    bs = t_open(path, 0);
    QK_CHECK(bs != NULL);
    if (bs) {
        QK_CHECK_EQ(t_verify(bs, model, len), 0);
        qk_block_close(bs);
    }
    free(buf);
    free(model);
    unlink(path);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img/qemu-io not installed");
    }
    static const uint32_t sizes[] = {512, 1024, 4096, 65536, 1 << 20, 2 << 20};
    for (size_t i = 0; i < QK_ARRAY_SIZE(sizes); i++) {
        Cfg c = {.cs = sizes[i], .rb = 16, .size = QK_MAX(4ULL << 20, 8ULL * sizes[i])};
        run(&c);
    }
    static const uint32_t widths[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t i = 0; i < QK_ARRAY_SIZE(widths); i++) {
        Cfg c = {.cs = 512, .rb = widths[i], .size = 3ULL << 20};
        run(&c);
        Cfg d = {.cs = 65536, .rb = widths[i], .size = 8ULL << 20};
        run(&d);
    }
    Cfg v2 = {.cs = 65536, .rb = 16, .compat = 2, .size = 8ULL << 20};
    run(&v2);
    Cfg lazy = {.cs = 4096, .rb = 16, .lazy = true, .size = 4ULL << 20};
    run(&lazy);
    Cfg ext = {.cs = 65536, .rb = 16, .extl2 = true, .size = 8ULL << 20};
    run(&ext);
    Cfg ext2 = {.cs = 1 << 20, .rb = 16, .extl2 = true, .size = 16ULL << 20};
    run(&ext2);
    Cfg dio = {.cs = 65536, .rb = 16, .size = 8ULL << 20, .direct = true};
    run(&dio);
    Cfg dio512 = {.cs = 512, .rb = 16, .size = 2ULL << 20, .direct = true};
    run(&dio512);
    Cfg pm = {.cs = 65536, .rb = 16, .prealloc = QK_PREALLOC_METADATA, .size = 8ULL << 20};
    run(&pm);
    Cfg pf = {.cs = 65536, .rb = 16, .prealloc = QK_PREALLOC_FALLOC, .size = 8ULL << 20};
    run(&pf);
    Cfg pfull = {.cs = 4096, .rb = 16, .prealloc = QK_PREALLOC_FULL, .size = 2ULL << 20};
    run(&pfull);
    QK_TEST_DONE();
}
