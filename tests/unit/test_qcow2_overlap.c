/* The metadata overlap check (qcow2/overlap.c): each kind of live table
 * is found where it is and nowhere else, a kind can be left out (a table
 * written back at its own place), a table dropped without the list being
 * told is never reported (the list is only a filter: a hit is confirmed
 * against the live tables), and one added without telling is found once
 * the list is rebuilt after a few thousand checks. A write of guest data
 * onto a table fails with -EIO, later data writes fail too, and the image
 * is marked corrupt when it closes; the table keeps its bytes. Snapshots'
 * L1 tables named past the end of the file are protected too, as merged
 * ranges, except for ones no tool would read (unaligned). */
#include "qcow2_test_util.h"
#include "qcow2/qcow2_int.h"
#include "qcow2/snapshot_int.h"

#define CS 65536ULL

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img/qemu-io not installed");
    }
    QK_CHECK_EQ(t_sh("rm -f ov.qcow2 && qemu-img create -q -f qcow2 ov.qcow2 64M"), 0);
    QkBlock *bs = t_open("ov.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (!bs) {
        QK_TEST_DONE();
    }
    uint8_t *buf = malloc(CS);
    memset(buf, 0x5a, CS);
    QK_CHECK_EQ(t_write(bs, 0, CS, buf), 0);
    QK_CHECK_EQ(t_flush(bs), 0);
    Qcow2State *s = qcow2_state(bs);
    uint64_t l2 = s->l1[0] & QCOW2_L1E_OFFSET_MASK, rb = s->rt[0] & QCOW2_REFT_OFFSET_MASK;
    Qcow2Extent ext;
    QK_CHECK_EQ(qcow2_get_extent(s, 0, CS, &ext), 0);
    uint64_t data = ext.host;
    QK_CHECK(l2 && rb && data);

    QK_CHECK_EQ(qcow2_meta_overlap(s, 100, 8, 0), QCOW2_OL_HEADER);
    QK_CHECK_EQ(qcow2_meta_overlap(s, s->l1_offset, 8, 0), QCOW2_OL_L1);
    QK_CHECK_EQ(qcow2_meta_overlap(s, s->rt_offset + 8, 8, 0), QCOW2_OL_REFT);
    QK_CHECK_EQ(qcow2_meta_overlap(s, l2 + 512, 4096, 0), QCOW2_OL_L2);
    QK_CHECK_EQ(qcow2_meta_overlap(s, rb, CS, 0), QCOW2_OL_REFB);
    QK_CHECK_EQ(qcow2_meta_overlap(s, data, CS, 0), 0);
    /* A range that only ends in a table still overlaps it. */
    QK_CHECK_EQ(qcow2_meta_overlap(s, l2 - 512, 1024, QCOW2_OL_HEADER | QCOW2_OL_L1 | QCOW2_OL_REFT |
                                   QCOW2_OL_REFB), QCOW2_OL_L2);
    /* The table's own kind left out. */
    QK_CHECK_EQ(qcow2_meta_overlap(s, l2, CS, QCOW2_OL_L2), 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, rb, CS, QCOW2_OL_REFB), 0);

    /* Dropped without a word: the list still has it, the live tables do not. */
    uint64_t saved = s->l1[0];
    s->l1[0] = 0;
    QK_CHECK_EQ(qcow2_meta_overlap(s, l2, CS, 0), 0);
    s->l1[0] = saved;
    /* Moved without a word: found at the latest after a rebuild. */
    QK_CHECK_EQ(qcow2_meta_overlap(s, data, CS, 0), 0);
    s->l1[0] = data | QCOW2_OFLAG_COPIED;
    unsigned hit = 0;
    for (int i = 0; i < 5000 && !hit; i++) {
        hit = qcow2_meta_overlap(s, data, CS, 0);
    }
    QK_CHECK_EQ(hit, QCOW2_OL_L2);
    s->l1[0] = saved;
    qcow2_meta_changed(s);
    QK_CHECK_EQ(qcow2_meta_overlap(s, data, CS, 0), 0);

    /* Snapshots' L1 tables past the end of the file, two of them touching. */
    Qcow2Snapshot far[4] = {
        {.l1_offset = 1ULL << 30, .l1_size = 1, .l1_bad = true},
        {.l1_offset = (1ULL << 30) + CS, .l1_size = CS / 8 + 1, .l1_bad = true}, /* two clusters */
        {.l1_offset = 2ULL << 30, .l1_size = 1, .l1_bad = true},
        {.l1_offset = (3ULL << 30) + 512, .l1_size = 1, .l1_bad = true},       /* unaligned */
    };
    qcow2_meta_set_snapshots(s, far, 4, 0, 0);
    QK_CHECK_EQ(s->snap_far_n, 2u);
    QK_CHECK_EQ(qcow2_meta_overlap(s, (1ULL << 30) - CS, CS, 0), 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, (1ULL << 30) - CS, CS + 1, 0), QCOW2_OL_INACTIVE_L1);
    QK_CHECK_EQ(qcow2_meta_overlap(s, (1ULL << 30) + 2 * CS + 100, 8, 0), QCOW2_OL_INACTIVE_L1);
    QK_CHECK_EQ(qcow2_meta_overlap(s, (1ULL << 30) + 3 * CS, CS, 0), 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, (2ULL << 30) - 4096, 8192, 0), QCOW2_OL_INACTIVE_L1);
    QK_CHECK_EQ(qcow2_meta_overlap(s, 2ULL << 30, CS, QCOW2_OL_INACTIVE_L1), 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, 3ULL << 30, CS, 0), 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, data, CS, 0), 0);
    qcow2_meta_set_snapshots(s, NULL, 0, 0, 0);
    QK_CHECK_EQ(qcow2_meta_overlap(s, 2ULL << 30, CS, 0), 0);

    /* A guest write whose cluster is (made to look like) a table. */
    unsigned long long l1_sector = s->l1_offset / 512;
    QK_CHECK_EQ(t_sh("dd if=ov.qcow2 of=l1.before bs=512 skip=%llu count=1 status=none", l1_sector), 0);
    void *t;
    QK_CHECK_EQ(qcow2_cache_get(s->l2_cache, l2, &t), 0);
    uint64_t bm, e = qcow2_l2_get(s, t, 0, &bm);
    qcow2_l2_set(s, t, 0, s->l1_offset | QCOW2_OFLAG_COPIED, bm);
    QK_CHECK_EQ(t_write(bs, 0, 4096, buf), -EIO);
    QK_CHECK(s->meta_corrupt);
    const char *why = qk_block_corrupt_reason(bs);
    QK_CHECK(why && strstr(why, "overlaps with active L1 table") != NULL);
    /* Put back in memory only (never written): later data writes fail all the same. */
    qcow2_l2_set(s, t, 0, e, bm);
    qcow2_cache_put(s->l2_cache, &t);
    QK_CHECK_EQ(t_write(bs, 0, 4096, buf), -EIO);
    QK_CHECK_EQ(qk_block_close(bs), 0);
    QK_CHECK_EQ(t_sh("dd if=ov.qcow2 of=l1.after bs=512 skip=%llu count=1 status=none && cmp -s l1.before l1.after",
                     l1_sector), 0);
    QK_CHECK_EQ(t_sh("qemu-img info ov.qcow2 | grep -q 'corrupt: true'"), 0);
    QK_CHECK_EQ(t_sh("rm -f ov.qcow2 l1.before l1.after"), 0);
    free(buf);
    QK_TEST_DONE();
}
