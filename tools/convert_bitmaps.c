/*
 * convert --bitmaps: the source's persistent dirty bitmaps copied into the
 * new image (names, granularities, enabled or not, every bit), as
 * qemu-img convert --bitmaps does; bitmaps left in use are refused, or
 * skipped with a warning under --skip-broken-bitmaps.
 */
#include "cmd.h"
#include "block/dirty_bitmap.h"

#include <string.h>

int qk_tool_bitmaps_can_copy(QkBlock *src, const char *out_fmt, bool skip_broken)
{
    const QkBlockDriver *drv = qk_block_find_driver(out_fmt);
    if (!drv || !drv->bitmap_can_store) {
        qk_tool_error("Format driver '%s' does not support bitmaps", out_fmt);
        return -1;
    }
    for (QkDirtyBitmap *bm = src->dirty_bitmaps; bm; bm = bm->next) {
        if (!bm->persistent || !bm->inconsistent) {
            continue;
        }
        if (!skip_broken) {
            qk_tool_error("Cannot copy inconsistent bitmap '%s'", bm->name);
            fprintf(stderr, "Try --skip-broken-bitmaps, or use '%s bitmap --remove' to delete it\n", qk_progname);
            return -1;
        }
    }
    return 0;
}

int qk_tool_bitmaps_copy(QkBlock *src, QkBlock *dst, bool skip_broken)
{
    /* Oldest first, as the source lists them (the node's list is newest first). */
    unsigned n = 0;
    for (QkDirtyBitmap *bm = src->dirty_bitmaps; bm; bm = bm->next) {
        n += bm->persistent;
    }
    for (unsigned k = n; k > 0; k--) {
        QkDirtyBitmap *bm = src->dirty_bitmaps;
        for (unsigned i = 0; bm; bm = bm->next) {
            if (bm->persistent && ++i == k) {
                break;
            }
        }
        if (bm->inconsistent) {
            if (skip_broken) {
                qk_tool_error("warning: Skipping inconsistent bitmap '%s'", bm->name);
            }
            continue;
        }
        QkError err = {0};
        QkDirtyBitmap *nb = NULL;
        if (dst->drv->bitmap_can_store(dst, bm->name, bm->granularity, &err) == 0) {
            nb = qk_dirty_bitmap_add(dst, bm->name, bm->granularity, &err);
        }
        if (!nb || qk_dirty_bitmap_merge(nb, bm, &err) < 0) {
            qk_tool_error("Failed to populate bitmap %s: %s", bm->name, err.msg);
            return -1;
        }
        nb->persistent = true;
        nb->changed = true;
        nb->enabled = bm->enabled;
    }
    return 0;
}
