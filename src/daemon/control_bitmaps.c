/*
 * Control commands for dirty bitmaps on exported images:
 * block-dirty-bitmap-add/remove/clear/enable/disable/merge/query.
 * Bitmaps live on the export's node, so they follow the node: after a
 * mirror switches an export, bitmaps start afresh on the target.
 * Persistent ones (loaded from the image, or added with "persistent") are
 * stored in the image when the export goes; one that stops matching its
 * stored copy (enabled, cleared, merged into) is first marked in use
 * there, so a crash never leaves a stale copy that looks valid.
 *
 * Owns: the JSON shape of bitmaps. Must not know the socket framing.
 */
#include "daemon/control.h"
#include "block/dirty_bitmap.h"
#include "util/size.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static QkBlock *export_node(QkDaemon *d, json_t *args, QkError *err)
{
    const char *name;
    if (qk_control_arg_string(args, "export", true, &name, err) < 0) {
        return NULL;
    }
    QkNbdExport *e = qk_nbd_server_find_export(qk_daemon_nbd_server(d), name);
    if (!e) {
        qk_error_set(err, -ENOENT, "Export '%s' not found", name);
        return NULL;
    }
    return e->bs;
}

static QkDirtyBitmap *find_bitmap(QkBlock *bs, json_t *args, const char *key, QkError *err)
{
    const char *name;
    if (qk_control_arg_string(args, key, true, &name, err) < 0) {
        return NULL;
    }
    QkDirtyBitmap *bm = qk_dirty_bitmap_find(bs, name);
    if (!bm) {
        qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", name);
    }
    return bm;
}

static json_t *coroutine_fn cmd_add(QkDaemon *d, json_t *args, QkError *err)
{
    const char *name;
    bool disabled = false, persistent = false;
    uint64_t gran = 65536;
    QkBlock *bs = export_node(d, args, err);
    if (!bs || qk_control_arg_string(args, "name", true, &name, err) < 0 ||
        qk_control_arg_bool(args, "disabled", &disabled, err) < 0 ||
        qk_control_arg_bool(args, "persistent", &persistent, err) < 0) {
        return NULL;
    }
    /* Names as QEMU allows them, so a bitmap made here can later be
     * stored in a qcow2 image and exported by name. */
    if (!*name) {
        qk_error_set(err, -EINVAL, "Bitmap name cannot be empty");
        return NULL;
    }
    if (strlen(name) > 1023) {
        qk_error_set(err, -EINVAL, "Bitmap name too long: %s", name);
        return NULL;
    }
    json_t *g = json_object_get(args, "granularity");
    if (g) {
        if (json_is_integer(g) && json_integer_value(g) > 0) {
            gran = (uint64_t)json_integer_value(g);
        } else if (!json_is_string(g) || qk_parse_size(json_string_value(g), &gran) < 0) {
            qk_error_set(err, -EINVAL, "Parameter 'granularity' expects a size");
            return NULL;
        }
    }
    QkDirtyBitmap *bm = persistent ? qk_dirty_bitmap_add_persistent(bs, name, gran, err)
                                   : qk_dirty_bitmap_add(bs, name, gran, err);
    if (!bm) {
        return NULL;
    }
    qk_dirty_bitmap_set_enabled(bm, !disabled);
    return json_object();
}

static json_t *coroutine_fn cmd_remove(QkDaemon *d, json_t *args, QkError *err)
{
    QkBlock *bs = export_node(d, args, err);
    QkDirtyBitmap *bm = bs ? find_bitmap(bs, args, "name", err) : NULL;
    if (!bm || qk_co_dirty_bitmap_remove(bs, bm, err) < 0) {
        return NULL;
    }
    return json_object();
}

static json_t *coroutine_fn cmd_clear(QkDaemon *d, json_t *args, QkError *err)
{
    QkBlock *bs = export_node(d, args, err);
    QkDirtyBitmap *bm = bs ? find_bitmap(bs, args, "name", err) : NULL;
    if (!bm || qk_co_dirty_bitmap_begin_change(bs, bm, err) < 0) {
        return NULL;
    }
    qk_dirty_bitmap_clear(bm);
    return json_object();
}

static json_t *coroutine_fn set_enabled(QkDaemon *d, json_t *args, bool on, QkError *err)
{
    QkBlock *bs = export_node(d, args, err);
    QkDirtyBitmap *bm = bs ? find_bitmap(bs, args, "name", err) : NULL;
    if (!bm || (bm->enabled != on && qk_co_dirty_bitmap_begin_change(bs, bm, err) < 0)) {
        return NULL;
    }
    qk_dirty_bitmap_set_enabled(bm, on);
    return json_object();
}

static json_t *coroutine_fn cmd_enable(QkDaemon *d, json_t *args, QkError *err)
{
    return set_enabled(d, args, true, err);
}

static json_t *coroutine_fn cmd_disable(QkDaemon *d, json_t *args, QkError *err)
{
    return set_enabled(d, args, false, err);
}

/* target |= each of bitmaps (names on the same export). */
static json_t *coroutine_fn cmd_merge(QkDaemon *d, json_t *args, QkError *err)
{
    QkBlock *bs = export_node(d, args, err);
    QkDirtyBitmap *dst = bs ? find_bitmap(bs, args, "target", err) : NULL;
    if (!dst) {
        return NULL;
    }
    json_t *srcs = json_object_get(args, "bitmaps");
    if (!json_is_array(srcs)) {
        qk_error_set(err, -EINVAL, "Parameter 'bitmaps' expects a list of bitmap names");
        return NULL;
    }
    /* Check all first so a bad name changes nothing. */
    size_t i, n = json_array_size(srcs);
    json_t *v;
    QkDirtyBitmap **src = calloc(n ? n : 1, sizeof(*src));
    if (!src) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    json_t *ret = NULL;
    json_array_foreach(srcs, i, v) {
        const char *name = json_string_value(v);
        src[i] = name ? qk_dirty_bitmap_find(bs, name) : NULL;
        if (!src[i]) {
            qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", name ? name : "(not a string)");
            goto out;
        }
        if (src[i]->inconsistent) {
            qk_error_set(err, -EINVAL, "Bitmap '%s' is inconsistent and cannot be used", src[i]->name);
            goto out;
        }
    }
    /* The sources are busy while the target's stored copy is marked in
     * use, so a remove from another client cannot free one meanwhile. */
    for (i = 0; i < n; i++) {
        src[i]->busy += src[i] != dst;
    }
    int r = qk_co_dirty_bitmap_begin_change(bs, dst, err);
    for (i = 0; i < n; i++) {
        src[i]->busy -= src[i] != dst;
    }
    for (i = 0; r == 0 && i < n; i++) {
        r = qk_dirty_bitmap_merge(dst, src[i], err);
    }
    ret = r == 0 ? json_object() : NULL;
out:
    free(src);
    return ret;
}

static json_t *coroutine_fn cmd_query(QkDaemon *d, json_t *args, QkError *err)
{
    const char *only;
    if (qk_control_arg_string(args, "export", false, &only, err) < 0) {
        return NULL;
    }
    if (only && !qk_nbd_server_find_export(qk_daemon_nbd_server(d), only)) {
        qk_error_set(err, -ENOENT, "Export '%s' not found", only);
        return NULL;
    }
    json_t *list = json_array();
    for (QkNbdExport *e = qk_nbd_server_first_export(qk_daemon_nbd_server(d)); e; e = e->next) {
        if (only && strcmp(only, e->name) != 0) {
            continue;
        }
        for (QkDirtyBitmap *bm = e->bs->dirty_bitmaps; bm; bm = bm->next) {
            if (!bm->name) {
                continue; /* a job's own bitmap */
            }
            json_array_append_new(list, json_pack("{s:s,s:s,s:I,s:I,s:b,s:b,s:b,s:b}",
                                                  "export", e->name,
                                                  "name", bm->name,
                                                  "granularity", (json_int_t)bm->granularity,
                                                  "count", (json_int_t)qk_dirty_bitmap_dirty_bytes(bm),
                                                  "enabled", bm->enabled,
                                                  "busy", bm->busy > 0,
                                                  "persistent", bm->persistent,
                                                  "inconsistent", bm->inconsistent));
        }
    }
    return list;
}

static const char *const add_params[] = {"export", "name", "granularity", "disabled", "persistent", NULL};
static const char *const name_params[] = {"export", "name", NULL};
static const char *const merge_params[] = {"export", "target", "bitmaps", NULL};
static const char *const query_params[] = {"export", NULL};

static const QkControlCommand cmds[] = {
    {"block-dirty-bitmap-add", cmd_add, add_params},
    {"block-dirty-bitmap-remove", cmd_remove, name_params},
    {"block-dirty-bitmap-clear", cmd_clear, name_params},
    {"block-dirty-bitmap-enable", cmd_enable, name_params},
    {"block-dirty-bitmap-disable", cmd_disable, name_params},
    {"block-dirty-bitmap-merge", cmd_merge, merge_params},
    {"block-dirty-bitmap-query", cmd_query, query_params},
};

const QkControlTable qk_control_bitmap_table = {cmds, sizeof(cmds) / sizeof(cmds[0])};
