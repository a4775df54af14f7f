/* Job copy buffers (util/buf_slots.c) and the slices' buffers
 * (jobs/slices.c): slots of one region, distinct and aligned; more than
 * the slots are allocated on their own; the region goes only once every
 * slot is back; each slice worker gets its own buffer. */
#include "qktest.h"
#include "aio/loop.h"
#include "common/checked.h"
#include "util/buf_slots.h"
#include "qcowkit/engine.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

static void slots(void)
{
    QkBufSlots s;
    QK_CHECK_EQ(qk_buf_slots_init(&s, 4096, 1000000, 4), 0);
    QK_CHECK_EQ(s.slot, 1003520); /* rounded up to the alignment */
    QK_CHECK(s.region == NULL);   /* nothing until the first get */
    void *b[6];
    for (int i = 0; i < 6; i++) {
        b[i] = qk_buf_slots_get(&s);
        QK_CHECK(b[i] != NULL);
        QK_CHECK(((uintptr_t)b[i] & 4095) == 0);
        memset(b[i], i, s.slot); /* all of it is ours (ASan checks) */
    }
    const char *r = s.region;
    QK_CHECK(r != NULL);
    for (int i = 0; i < 4; i++) {
        const char *p = b[i];
        QK_CHECK(p >= r && p + s.slot <= r + 4 * s.slot);
        for (int j = 0; j < i; j++) {
            QK_CHECK(b[j] != b[i]);
        }
    }
    for (int i = 4; i < 6; i++) {
        const char *p = b[i];
        QK_CHECK(p < r || p >= r + 4 * s.slot); /* beyond the slots: on its own */
    }
    QK_CHECK_EQ(s.out, 4);
    qk_buf_slots_put(&s, b[5]);
    qk_buf_slots_put(&s, b[4]);
    qk_buf_slots_put(&s, b[0]);
    qk_buf_slots_release(&s); /* three slots still out: the region stays */
    QK_CHECK(s.region == r);
    QK_CHECK(qk_buf_slots_get(&s) == b[0]); /* a slot given back is used again */
    for (int i = 0; i < 4; i++) {
        qk_buf_slots_put(&s, b[i]);
    }
    qk_buf_slots_put(&s, NULL);
    QK_CHECK_EQ(s.out, 0);
    qk_buf_slots_release(&s);
    QK_CHECK(s.region == NULL);
    void *again = qk_buf_slots_get(&s);
    QK_CHECK(again != NULL); /* a new region on demand */
    QK_CHECK(s.region != NULL);
    qk_buf_slots_put(&s, again);
    qk_buf_slots_destroy(&s); /* everything back: nothing left (ASan checks) */
}

/* ---- qk_co_run_slices ---- */
#define WORKERS 5
#define BUF (3 * 4096 + 1)
static void *seen[64];
static int nseen;
static uint64_t covered;

static int coroutine_fn slice_fn(void *opaque, uint64_t off, uint64_t len, void *buf)
{
    (void)opaque;
    (void)off;
    QK_CHECK(((uintptr_t)buf & 4095) == 0);
    memset(buf, 0x5a, BUF); /* the whole buffer is usable (ASan checks) */
    bool known = false;
    for (int i = 0; i < nseen; i++) {
        known |= seen[i] == buf;
    }
    if (!known && nseen < 64) {
        seen[nseen++] = buf;
    }
    covered += len;
    qk_co_sleep_ns(100000); /* let the other workers take slices */
    return 0;
}

static void coroutine_fn slices_co(void *opaque)
{
    (void)opaque;
    QK_CHECK_EQ(qk_co_run_slices(1 << 20, 65536, WORKERS, BUF, 4096, slice_fn, NULL), 0);
    QK_CHECK_EQ(covered, 1 << 20);
    QK_CHECK_EQ(nseen, WORKERS); /* one buffer per worker, each its own */
    for (int i = 0; i < nseen; i++) {
        for (int j = 0; j < i; j++) {
            const char *a = seen[i], *b = seen[j];
            QK_CHECK(a + BUF <= b || b + BUF <= a);
        }
    }
    QK_CHECK_EQ(qk_co_run_slices(1 << 20, 65536, 2, BUF, 3000, slice_fn, NULL), -EINVAL);
}

int main(void)
{
    slots();
    qk_co_run(slices_co, NULL);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
