/* Dirty bitmaps on a raw node: writes, zero writes and discards mark them;
 * disabled bitmaps stay clean; ranges widen to the granularity. */
#include "qktest.h"
#include "aio/loop.h"
#include "block/block.h"
#include "block/dirty_bitmap.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static void coroutine_fn body(void *opaque)
{
    (void)opaque;
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
    QkBlock *bs = qk_co_block_open("dirty.raw", &o, &err);
    QK_CHECK(bs != NULL);
    if (!bs) {
        return;
    }
    QK_CHECK(qk_dirty_bitmap_add(bs, "b", 1000, &err) == NULL); /* not a power of two */
    qk_error_clear(&err);
    QkDirtyBitmap *a = qk_dirty_bitmap_add(bs, "a", 65536, &err);
    QkDirtyBitmap *d = qk_dirty_bitmap_add(bs, "off", 4096, &err);
    QK_CHECK(a && d);
    QK_CHECK(qk_dirty_bitmap_add(bs, "a", 65536, &err) == NULL);
    qk_dirty_bitmap_set_enabled(d, false);

    char buf[100] = {1};
    QK_CHECK_EQ(qk_co_pwrite(bs, 65536 + 10, sizeof(buf), buf, 0), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 65536);
    QK_CHECK(qk_dirty_bitmap_get(a, 65536));
    QK_CHECK(!qk_dirty_bitmap_get(a, 0));
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(d), 0);

    /* A write straddling a chunk boundary dirties both chunks. */
    QK_CHECK_EQ(qk_co_pwrite(bs, 5 * 65536 - 50, sizeof(buf), buf, 0), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 3 * 65536);
    QK_CHECK_EQ(qk_co_pwrite_zeroes(bs, 10 * 65536, 65536, 0), 0);
    QK_CHECK_EQ(qk_co_pdiscard(bs, 12 * 65536, 2 * 65536), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 6 * 65536);

    /* Walk the dirty chunks from a cursor. */
    uint64_t expect[] = {65536, 4 * 65536, 5 * 65536, 10 * 65536, 12 * 65536, 13 * 65536};
    int i = 0;
    for (uint64_t off = qk_dirty_bitmap_next_dirty(a, 0); off != UINT64_MAX;
         off = qk_dirty_bitmap_next_dirty(a, off + 65536)) {
        QK_CHECK(i < 6 && off == expect[i]);
        i++;
    }
    QK_CHECK_EQ(i, 6);
    qk_dirty_bitmap_reset(a, 4 * 65536, 2 * 65536);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 4 * 65536);
    QK_CHECK_EQ(qk_dirty_bitmap_next_dirty(a, 2 * 65536), 10 * 65536);

    /* Merge: equal granularity, then a finer one (its ranges widened to
     * the target's chunks), then an empty one. */
    QkDirtyBitmap *c = qk_dirty_bitmap_add(bs, "c", 65536, &err);
    qk_dirty_bitmap_mark(c, 0, 1);
    QK_CHECK_EQ(qk_dirty_bitmap_merge(a, c, &err), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 5 * 65536);
    qk_dirty_bitmap_mark(d, 20 * 65536 + 4096, 8192);     /* chunk 20 of a */
    qk_dirty_bitmap_mark(d, 22 * 65536 - 4096, 8192);     /* chunks 21 and 22 */
    QK_CHECK_EQ(qk_dirty_bitmap_merge(a, d, &err), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 8 * 65536);
    QK_CHECK(qk_dirty_bitmap_get(a, 21 * 65536) && qk_dirty_bitmap_get(a, 22 * 65536));
    QK_CHECK(!qk_dirty_bitmap_get(a, 23 * 65536));
    qk_dirty_bitmap_clear(d);
    QK_CHECK_EQ(qk_dirty_bitmap_merge(a, d, &err), 0);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 8 * 65536);
    /* The same bit marked again changes nothing. */
    qk_dirty_bitmap_mark(a, 21 * 65536 + 7, 1);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 8 * 65536);
    qk_dirty_bitmap_clear(a);
    QK_CHECK_EQ(qk_dirty_bitmap_dirty_bytes(a), 0);

    a->busy = 1;
    qk_error_clear(&err);
    QK_CHECK(qk_dirty_bitmap_remove(bs, a, &err) == -EBUSY);
    a->busy = 0;
    QK_CHECK_EQ(qk_dirty_bitmap_remove(bs, a, &err), 0);
    QK_CHECK(qk_dirty_bitmap_find(bs, "a") == NULL);
    QK_CHECK(qk_dirty_bitmap_find(bs, "c") == c);
    qk_co_block_close(bs);
}

int main(void)
{
    int fd = open("dirty.raw", O_RDWR | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0 && ftruncate(fd, 64 * 65536 + 1000) == 0);
    close(fd);
    qk_co_run(body, NULL);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
