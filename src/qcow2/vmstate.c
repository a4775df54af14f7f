/*
 * VM state in qcow2 images: the driver's co_save_vmstate/co_load_vmstate.
 * Stream byte pos lives at guest offset vm_state_offset + pos, mapped by
 * the active L1 like disk data, where vm_state_offset is the virtual size
 * rounded up to what one L1 entry maps (QEMU's layout, so either program
 * can load what the other saved). A snapshot's L1 copy keeps the state;
 * snapshot.c drops it from the active L1 afterwards. The buffering and
 * parallelism are the block layer's (block/vmstate.c), not ours.
 */
#include "qcow2/snapshot_int.h"

uint64_t qcow2_vm_state_offset(const Qcow2State *s)
{
    return qcow2_l1_needed(s, s->h.size) << (s->cluster_bits + s->l2_bits);
}

/* Guest range [off, off+bytes) for stream range [pos, pos+bytes). */
static int vm_range(Qcow2State *s, uint64_t pos, uint64_t bytes, uint64_t *off, uint64_t *end)
{
    if (qk_add_overflow(qcow2_vm_state_offset(s), pos, off) || qk_add_overflow(*off, bytes, end) ||
        *end > QCOW2_MAX_HOST_OFFSET) {
        return -EFBIG;
    }
    return 0;
}

int coroutine_fn qcow2_co_save_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    Qcow2State *s = qcow2_state(bs);
    uint64_t bytes = qiov->size, off, end;
    if (s->read_only) {
        return -EACCES;
    }
    if (qcow2_has_data_file(s)) {
        return -ENOTSUP; /* no internal snapshots to keep it for */
    }
    int r = vm_range(s, pos, bytes, &off, &end);
    if (r < 0 || bytes == 0) {
        return r;
    }
    uint64_t need = qcow2_l1_needed(s, end);
    if (need > s->l1_size) {
        qk_co_mutex_lock(&s->lock);
        if (need > s->l1_size) {
            /* Grow by half again at least: a long stream must not
             * rewrite the whole L1 for every new L2 table it reaches. */
            uint64_t max = QCOW2_MAX_L1_BYTES / 8;
            uint64_t want = QK_MIN(QK_MAX(need, (uint64_t)s->l1_size + s->l1_size / 2), max);
            QkError err = {0};
            r = qcow2_grow_l1(s, QK_MAX(want, need), &err);
        }
        qk_co_mutex_unlock(&s->lock);
        if (r < 0) {
            return r;
        }
    }
    /* Written once and not again: let the file start writing it back, so
     * the flush before each new L2 table's L1 entry (and the last one)
     * does not wait for the whole stream at once. */
    return qcow2_co_pwritev(bs, off, bytes, qiov, 0, QK_REQ_WRITE_BEHIND);
}

int coroutine_fn qcow2_co_load_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    Qcow2State *s = qcow2_state(bs);
    uint64_t bytes = qiov->size, off, end;
    int r = vm_range(s, pos, bytes, &off, &end);
    if (r < 0 || bytes == 0) {
        return r;
    }
    return qcow2_co_preadv(bs, off, bytes, qiov, 0, 0);
}
