/*
 * convert --bitmaps: the source's persistent dirty bitmaps copied into the
 * new image (names, granularities, enabled or not, every bit), as
 * qemu-img convert --bitmaps does; bitmaps left in use are refused, or
 * skipped with a warning under --skip-broken-bitmaps.
 */
#include "cmd.h"

#include <string.h>

int qk_tool_bitmaps_can_copy(QkBlock *src, const char *out_fmt, bool skip_broken)
{
    if (!qk_format_can_store_bitmaps(out_fmt)) {
        qk_tool_error("Format driver '%s' does not support bitmaps", out_fmt);
        return -1;
    }
    for (QkDirtyBitmap *bm = qk_dirty_bitmap_first(src); bm; bm = qk_dirty_bitmap_next(bm)) {
        if (!qk_dirty_bitmap_persistent(bm) || !qk_dirty_bitmap_inconsistent(bm)) {
            continue;
        }
        if (!skip_broken) {
            qk_tool_error("Cannot copy inconsistent bitmap '%s'", qk_dirty_bitmap_name(bm));
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
    for (QkDirtyBitmap *bm = qk_dirty_bitmap_first(src); bm; bm = qk_dirty_bitmap_next(bm)) {
        n += qk_dirty_bitmap_persistent(bm);
    }
    for (unsigned k = n; k > 0; k--) {
        QkDirtyBitmap *bm = qk_dirty_bitmap_first(src);
        for (unsigned i = 0; bm; bm = qk_dirty_bitmap_next(bm)) {
            if (qk_dirty_bitmap_persistent(bm) && ++i == k) {
                break;
            }
        }
        const char *name = qk_dirty_bitmap_name(bm);
        if (qk_dirty_bitmap_inconsistent(bm)) {
            if (skip_broken) {
                qk_tool_error("warning: Skipping inconsistent bitmap '%s'", name);
            }
            continue;
        }
        QkError err = {0};
        QkDirtyBitmap *nb = qk_dirty_bitmap_add_persistent(dst, name, qk_dirty_bitmap_granularity(bm), &err);
        if (!nb) {
            qk_tool_error("Failed to create bitmap %s: %s", name, err.msg);
            return -1;
        }
        if (qk_dirty_bitmap_merge(nb, bm, &err) < 0) {
            qk_tool_error("Failed to populate bitmap %s: %s", name, err.msg);
            return -1;
        }
        qk_dirty_bitmap_set_enabled(nb, qk_dirty_bitmap_enabled(bm));
    }
    return 0;
}
