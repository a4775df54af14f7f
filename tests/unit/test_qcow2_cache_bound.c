/* A configured metadata cache size (QkOpenOptions.cache_size, the CLI's
 * --cache-size) bounds the memory of the L2 and refcount-block caches:
 * with room for only six tables on an image that needs dozens, concurrent
 * writes and reads across the whole disk still give the right data,
 * qemu-img check stays clean and qemu-img compare agrees. A size below the
 * minimum is refused with a message saying how much is needed; a size
 * larger than the image needs is not all allocated. */
#include "qcow2_test_util.h"
#include "qcow2/qcow2_int.h"

#define LEN (64ULL << 20) /* 32 L2 tables and 8 refcount blocks at 4 KiB clusters */
#define NREQ 128

static uint32_t rng = 4242;
static uint32_t rnd(void)
{
    rng = rng * 1103515245 + 12345;
    return rng >> 8;
}

static QkBlock *open_with(uint64_t cache_size, QkError *err)
{
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "qcow2", .cache_size = cache_size};
    return qk_block_open("cb.qcow2", &o, err);
}

static uint64_t cache_bytes(QkBlock *bs)
{
    Qcow2State *s = qcow2_state(bs);
    return qcow2_cache_bytes(s->l2_cache) + qcow2_cache_bytes(s->rb_cache);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img/qemu-io not installed");
    }
    QK_CHECK_EQ(t_sh("rm -f cb.qcow2 && qemu-img create -q -f qcow2 -o cluster_size=4096 cb.qcow2 %llu",
                     (unsigned long long)LEN), 0);

    /* Too small: five tables, six needed. */
    QkError err = {0};
    QkBlock *bs = open_with(5 * 4096, &err);
    QK_CHECK(bs == NULL);
    QK_CHECK_EQ(err.code, -EINVAL);
    QK_CHECK(strstr(err.msg, "cache-size must be at least 24576 bytes") != NULL);
    fprintf(stderr, "too small: %s\n", err.msg);

    /* More than needed: only what maps the image is taken. */
    memset(&err, 0, sizeof(err));
    bs = open_with(1ULL << 30, &err);
    QK_CHECK(bs != NULL);
    if (bs) {
        QK_CHECK(cache_bytes(bs) < (1ULL << 30));
        QK_CHECK_EQ(qcow2_cache_bytes(qcow2_state(bs)->l2_cache), 32 * 4096);
        qk_block_close(bs);
    }

    /* Absurd: the cache is allocated up front, so neither kind of table
     * may take more than the image can ever use (a 4 KiB-cluster image of
     * LEN bytes needs 8 refcount blocks; 2 more are allowed for growth). */
    memset(&err, 0, sizeof(err));
    bs = open_with(INT64_MAX, &err);
    QK_CHECK(bs != NULL);
    if (bs) {
        QK_CHECK_EQ(qcow2_cache_bytes(qcow2_state(bs)->l2_cache), 32 * 4096);
        QK_CHECK(qcow2_cache_bytes(qcow2_state(bs)->rb_cache) <= (8 + 2) * 4096);
        qk_block_close(bs);
    }

    /* The minimum: two L2 tables and four refcount blocks. */
    const uint64_t bound = 6 * 4096;
    memset(&err, 0, sizeof(err));
    bs = open_with(bound, &err);
    QK_CHECK(bs != NULL);
    if (!bs) {
        fprintf(stderr, "open: %s\n", err.msg);
        QK_TEST_DONE();
    }
    QK_CHECK(cache_bytes(bs) <= bound);
    uint8_t *m = calloc(1, LEN);
    static TReq reqs[NREQ];
    static uint8_t *bufs[NREQ];
    for (int batch = 1; batch <= 4; batch++) {
        /* Disjoint requests (one per 512 KiB slice) all over the disk, so
         * nearly every one needs an L2 table the others pushed out. */
        for (int i = 0; i < NREQ; i++) {
            TReq *r = &reqs[i];
            memset(r, 0, sizeof(*r));
            r->bs = bs;
            uint64_t slice = LEN / NREQ;
            r->off = (uint64_t)((i * 37 + batch * 11) % NREQ) * slice + rnd() % (slice / 2);
            r->len = 1 + rnd() % (slice / 2 - 1);
            r->op = (batch == 1 || rnd() % 3) ? 1 : 0;
            bufs[i] = realloc(bufs[i], r->len);
            r->buf = bufs[i];
            if (r->op == 1) {
                memset(bufs[i], (int)(batch * 40 + i % 40 + 1), r->len);
                memcpy(m + r->off, bufs[i], r->len);
            }
        }
        t_run_all(reqs, NREQ);
        for (int i = 0; i < NREQ; i++) {
            QK_CHECK_EQ(reqs[i].ret, 0);
            if (reqs[i].op == 0 && memcmp(bufs[i], m + reqs[i].off, reqs[i].len) != 0) {
                fprintf(stderr, "batch %d read %d differs\n", batch, i);
                qk_test_failures++;
            }
        }
        QK_CHECK_EQ(t_verify(bs, m, LEN), 0);
    }
    QK_CHECK(cache_bytes(bs) <= bound);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check("cb.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("cb.raw", m, LEN), 0);
    QK_CHECK_EQ(t_qemu_compare("cb.qcow2", "cb.raw"), 0);
    for (int i = 0; i < NREQ; i++) {
        free(bufs[i]);
    }
    free(m);
    QK_TEST_DONE();
}
