/* Many requests in flight at once on one qcow2 image: overlapping and
 * disjoint writes racing to allocate the same clusters, reads alongside,
 * zero writes and discards, with and without a backing file. Content is
 * checked against an in-memory model (overlapping writes in one batch
 * write the same bytes, so any completion order gives one answer), then
 * by qemu-img check and compare. */
#include "qcow2_test_util.h"

#define MB (1ULL << 20)
#define NREQ 256

static uint32_t rng = 777;
static uint32_t rnd(void)
{
    rng = rng * 1103515245 + 12345;
    return rng >> 8;
}

static uint8_t val(int batch, uint64_t off)
{
    return (uint8_t)(batch * 31 + off / 512 + (off * 7) % 5 + 1);
}

static void run(const char *name, const char *qopts, bool backing, uint64_t len)
{
    fprintf(stderr, "case %s\n", name);
    uint8_t *m = calloc(1, len);
    uint8_t *touched = calloc(1, len);
    t_sh("rm -f cb.qcow2 cc.qcow2");
    if (backing) {
        QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 cb.qcow2 %llu && qemu-io -f qcow2 -c 'write -P 0x99 0 %llu' cb.qcow2 >/dev/null && "
                         "qemu-img create -q -f qcow2 %s -b cb.qcow2 -F qcow2 cc.qcow2",
                         (unsigned long long)len, (unsigned long long)(len / 2), qopts), 0);
        memset(m, 0x99, len / 2);
    } else {
        QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 %s cc.qcow2 %llu", qopts, (unsigned long long)len), 0);
    }
    QkBlock *bs = t_open("cc.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (!bs) {
        return;
    }
    QkImageInfo info;
    qk_block_get_info(bs, &info);
    uint64_t cs = info.cluster_size;
    static TReq reqs[NREQ];
    static uint8_t *bufs[NREQ];
    for (int batch = 1; batch <= 6; batch++) {
        memset(touched, 0, len);
        int n = 0;
        for (; n < NREQ; n++) {
            TReq *r = &reqs[n];
            memset(r, 0, sizeof(*r));
            r->bs = bs;
            int kind = (int)(rnd() % 10);
            uint64_t l = 1 + rnd() % (batch % 2 ? 9000 : 200000);
            uint64_t off = rnd() % len;
            /* Cluster the requests so that many fall into the same clusters. */
            if (kind < 5) {
                off = (rnd() % 16) * 65536 + rnd() % 70000;
            }
            off %= len;
            l = QK_MIN(l, len - off);
            if (kind < 7) {
                r->op = 1;
            } else if (kind < 9) {
                r->op = 0;
            } else {
                r->op = (batch >= 4) ? (rnd() % 2 ? 2 : 3) : 1;
            }
            r->off = off;
            r->len = l;
            bufs[n] = realloc(bufs[n], l);
            r->buf = bufs[n];
            if (r->op == 1) {
                for (uint64_t k = 0; k < l; k++) {
                    bufs[n][k] = val(batch, off + k);
                }
            }
            if (r->op == 2) {
                r->flags = rnd() % 2 ? QK_REQ_MAY_UNMAP : 0;
            }
        }
        /* Zero/discard ranges must not overlap writes (different bytes). */
        for (int i = 0; i < n; i++) {
            TReq *r = &reqs[i];
            if (r->op == 2 || r->op == 3) {
                for (int j = 0; j < n; j++) {
                    if (reqs[j].op == 1 && qk_ranges_overlap(r->off, r->len, reqs[j].off, reqs[j].len)) {
                        r->op = 0; /* make it a read instead */
                        break;
                    }
                }
            }
        }
        for (int i = 0; i < n; i++) {
            TReq *r = &reqs[i];
            if (r->op == 1) {
                memcpy(m + r->off, r->buf, r->len);
                memset(touched + r->off, 1, r->len);
            } else if (r->op == 2) {
                memset(m + r->off, 0, r->len);
                memset(touched + r->off, 1, r->len);
            } else if (r->op == 3 && !backing) {
                /* Discard drops whole clusters only; they then read as zeros. */
                uint64_t a = qk_align_up(r->off, cs);
                uint64_t e = r->off + r->len == len ? len : qk_align_down(r->off + r->len, cs);
                if (e > a) {
                    memset(m + a, 0, e - a);
                }
                memset(touched + r->off, 1, r->len);
            } else if (r->op == 3) {
                r->op = 0; /* discard over a backing file exposes it on v2: keep it simple */
            }
        }
        t_run_all(reqs, n);
        for (int i = 0; i < n; i++) {
            TReq *r = &reqs[i];
            QK_CHECK_EQ(r->ret, 0);
            if (r->op == 0) {
                for (uint64_t k = 0; k < r->len; k++) {
                    if (!touched[r->off + k] && r->ret == 0 && bufs[i][k] != m[r->off + k]) {
                        fprintf(stderr, "read mismatch at %llu\n", (unsigned long long)(r->off + k));
                        qk_test_failures++;
                        break;
                    }
                }
            }
        }
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
    }
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check("cc.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("ref.raw", m, len), 0);
    QK_CHECK_EQ(t_qemu_compare("cc.qcow2", "ref.raw"), 0);
    bs = t_open("cc.qcow2", 0);
    if (bs) {
        QK_CHECK_EQ(t_verify(bs, m, len), 0);
        qk_block_close(bs);
    }
    for (int i = 0; i < NREQ; i++) {
        free(bufs[i]);
        bufs[i] = NULL;
    }
    free(m);
    free(touched);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img not installed");
    }
    run("64k", "", false, 16 * MB);
    run("4k-rb1", "-o cluster_size=4k,refcount_bits=1", false, 8 * MB);
    run("512", "-o cluster_size=512", false, 2 * MB);
    run("backing", "", true, 16 * MB);
    run("extl2-backing", "-o extended_l2=on,cluster_size=128k", true, 16 * MB);
    run("lazy-2m", "-o lazy_refcounts=on,cluster_size=2M", false, 32 * MB);
    QK_TEST_DONE();
}
