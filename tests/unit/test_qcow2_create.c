/* qcow2 create with each qemu-img option: the image must be byte for byte
 * what qemu-img creates (ours may end with a zero-padded cluster), reopen
 * with the right properties, and pass qemu-img check. Invalid option
 * combinations must be refused. */
#include "qcow2_test_util.h"

static int same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int diff = !fa || !fb;
    while (!diff) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca == EOF && cb == EOF) {
            break;
        }
        /* A shorter file reads as zeros past its end. */
        if ((ca == EOF ? 0 : ca) != (cb == EOF ? 0 : cb)) {
            fprintf(stderr, "%s and %s differ at byte %ld\n", a, b, ftell(ca == EOF ? fb : fa));
            diff = 1;
        }
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return diff;
}

static void one(const char *name, QkCreateOptions o, const char *qemu_opts, bool exact)
{
    fprintf(stderr, "case %s\n", name);
    char ours[128], theirs[128];
    snprintf(ours, sizeof(ours), "ours-%s.qcow2", name);
    snprintf(theirs, sizeof(theirs), "qemu-%s.qcow2", name);
    QK_CHECK_EQ(t_create(ours, &o), 0);
    char sz[32] = "";
    if (o.size_set) {
        snprintf(sz, sizeof(sz), "%llu", (unsigned long long)o.size);
    }
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 %s '%s' %s", qemu_opts, theirs, sz), 0);
    if (exact) {
        QK_CHECK_EQ(same_bytes(ours, theirs), 0);
    }
    QK_CHECK_EQ(t_qemu_check(ours), 0);
    QK_CHECK_EQ(t_sh("qemu-img compare -q '%s' '%s'", ours, theirs), 0);
    QkBlock *bs = t_open(ours, QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (bs) {
        QkImageInfo info;
        qk_block_get_info(bs, &info);
        QK_CHECK_EQ(info.cluster_size, o.cluster_size ? o.cluster_size : 65536);
        QK_CHECK_EQ(info.refcount_bits, o.refcount_bits ? o.refcount_bits : 16);
        QK_CHECK_EQ(info.qcow2_version, o.compat ? o.compat : 3);
        QK_CHECK_EQ(info.lazy_refcounts, o.lazy_refcounts);
        QK_CHECK_EQ(info.extended_l2, o.extended_l2);
        QK_CHECK(strcmp(info.compression_type, o.compression_type ? "zstd" : "zlib") == 0);
        if (o.backing_file) {
            QK_CHECK(bs->backing_file && strcmp(bs->backing_file, o.backing_file) == 0);
            QK_CHECK(bs->backing_format && strcmp(bs->backing_format, o.backing_fmt) == 0);
            QK_CHECK(bs->backing != NULL);
        }
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check(ours), 0);
}

static void bad(const char *what, QkCreateOptions o)
{
    QkError err = {0};
    o.format = "qcow2";
    int r = qk_block_create("bad.qcow2", &o, &err);
    fprintf(stderr, "refused %s: %s\n", what, err.msg);
    QK_CHECK(r < 0);
    QK_CHECK(err.msg[0] != 0);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img not installed");
    }
    const uint64_t G = 1ULL << 30;
    one("default", (QkCreateOptions){.size = G, .size_set = true}, "", true);
    one("odd-size", (QkCreateOptions){.size = 1000000, .size_set = true}, "", false);
    one("v2", (QkCreateOptions){.size = G, .size_set = true, .compat = 2}, "-o compat=0.10", true);
    one("cs512", (QkCreateOptions){.size = 64 << 20, .size_set = true, .cluster_size = 512},
        "-o cluster_size=512 ", true);
    one("cs2m", (QkCreateOptions){.size = 10 * G, .size_set = true, .cluster_size = 2 << 20},
        "-o cluster_size=2M ", true);
    one("rb1", (QkCreateOptions){.size = G, .size_set = true, .refcount_bits = 1}, "-o refcount_bits=1", true);
    one("rb64", (QkCreateOptions){.size = G, .size_set = true, .refcount_bits = 64, .cluster_size = 4096},
        "-o refcount_bits=64,cluster_size=4k", true);
    one("lazy", (QkCreateOptions){.size = G, .size_set = true, .lazy_refcounts = true},
        "-o lazy_refcounts=on", true);
    one("extl2", (QkCreateOptions){.size = G, .size_set = true, .extended_l2 = true, .cluster_size = 1 << 17},
        "-o extended_l2=on,cluster_size=128k", true);
    one("zstd", (QkCreateOptions){.size = G, .size_set = true, .compression_type = 1},
        "-o compression_type=zstd", true);
    one("base", (QkCreateOptions){.size = 32 << 20, .size_set = true}, "", false);
    one("overlay", (QkCreateOptions){.backing_file = "ours-base.qcow2", .backing_fmt = "qcow2"},
        "-b ours-base.qcow2 -F qcow2", false);
    /* qemu-img's overlay names its own file; compare the header but for the name. */
    one("meta", (QkCreateOptions){.size = 64 << 20, .size_set = true, .prealloc = QK_PREALLOC_METADATA},
        "-o preallocation=metadata", false);
    one("falloc", (QkCreateOptions){.size = 16 << 20, .size_set = true, .prealloc = QK_PREALLOC_FALLOC},
        "-o preallocation=falloc", false);
    one("full", (QkCreateOptions){.size = 4 << 20, .size_set = true, .prealloc = QK_PREALLOC_FULL},
        "-o preallocation=full", false);
    one("meta512", (QkCreateOptions){.size = 8 << 20, .size_set = true, .prealloc = QK_PREALLOC_METADATA,
                                     .cluster_size = 512, .refcount_bits = 1},
        "-o preallocation=metadata,cluster_size=512,refcount_bits=1", false);

    /* Sizes must be what we asked for (rounded to 512 like qemu-img). */
    QkBlock *bs = t_open("ours-odd-size.qcow2", 0);
    QK_CHECK(bs && qk_block_length(bs) == 1000448);
    qk_block_close(bs);
    bs = t_open("ours-overlay.qcow2", 0);
    QK_CHECK(bs && qk_block_length(bs) == 32 << 20);
    qk_block_close(bs);

    bad("backing without format", (QkCreateOptions){.size = G, .size_set = true, .backing_file = "ours-base.qcow2"});
    bad("missing backing file", (QkCreateOptions){.backing_file = "nope.qcow2", .backing_fmt = "qcow2"});
    bad("no size", (QkCreateOptions){.size_set = false});
    bad("cluster size 1000", (QkCreateOptions){.size = G, .size_set = true, .cluster_size = 1000});
    bad("cluster size 4M", (QkCreateOptions){.size = G, .size_set = true, .cluster_size = 4 << 20});
    bad("cluster size 256", (QkCreateOptions){.size = G, .size_set = true, .cluster_size = 256});
    bad("refcount bits 3", (QkCreateOptions){.size = G, .size_set = true, .refcount_bits = 3});
    bad("refcount bits 128", (QkCreateOptions){.size = G, .size_set = true, .refcount_bits = 128});
    bad("v2 refcount bits 8", (QkCreateOptions){.size = G, .size_set = true, .compat = 2, .refcount_bits = 8});
    bad("v2 lazy", (QkCreateOptions){.size = G, .size_set = true, .compat = 2, .lazy_refcounts = true});
    bad("extl2 small clusters", (QkCreateOptions){.size = G, .size_set = true, .extended_l2 = true, .cluster_size = 4096});
    bad("v2 zstd", (QkCreateOptions){.size = G, .size_set = true, .compat = 2, .compression_type = 1});
    QK_TEST_DONE();
}
