/*
 * qcowkit bitmap: changes an image's persistent dirty bitmaps as `qemu-img
 * bitmap` does: --add, --remove, --clear, --enable, --disable and --merge,
 * several in one call, run in the order given; each failure reported as
 * "Operation OP on bitmap NAME failed: ..." with exit status 1 (the
 * operations before it stay done, as with qemu-img).
 *
 * Owns the arguments and the order of operations. The bitmaps themselves
 * are the node's persistent dirty bitmaps: the format driver loads them
 * when the image opens read-write and stores them when it closes (qcow2:
 * src/qcow2/bitmaps.c).
 */
#include "cmd.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit bitmap (--add | --remove | --clear | --enable | --disable |\n"
    "                       --merge SOURCE)... [-b SOURCE_FILE [-F SOURCE_FMT]]\n"
    "                      [-g GRANULARITY] [-f FMT] FILE BITMAP\n"
    "\n"
    "Changes the persistent dirty bitmap BITMAP of FILE (qcow2, version 3). The\n"
    "operations run in the order given:\n"
    "  --add            create BITMAP (enabled: it records every later write)\n"
    "  --remove         delete it and free its clusters\n"
    "  --clear          clear all its bits\n"
    "  --enable         make it record writes\n"
    "  --disable        stop it recording writes\n"
    "  --merge SOURCE   set in BITMAP every bit set in bitmap SOURCE (of FILE, or\n"
    "                   of SOURCE_FILE with -b)\n"
    "  -g GRANULARITY   with --add: bytes per bit (power of two, 512 to 2G;\n"
    "                   default: the cluster size within 4k..64k)\n"
    "  -b SOURCE_FILE   --merge takes SOURCE from this image (-F: its format)\n"
    "  -f FMT           format of FILE (default: probed)\n";

enum { OP_ADD, OP_REMOVE, OP_CLEAR, OP_ENABLE, OP_DISABLE, OP_MERGE };
static const char *const op_names[] = {"add", "remove", "clear", "enable", "disable", "merge"};

typedef struct Op {
    int kind;
    const char *src;     /* merge: the source bitmap */
} Op;

/* The persistent bitmap name on bs, or NULL with qemu-img's message. */
static QkDirtyBitmap *find(QkBlock *bs, const char *name, QkError *err)
{
    QkDirtyBitmap *bm = qk_dirty_bitmap_find(bs, name);
    if (!bm || !qk_dirty_bitmap_persistent(bm)) {
        qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", name);
        return NULL;
    }
    return bm;
}

static QkDirtyBitmap *find_usable(QkBlock *bs, const char *name, QkError *err)
{
    QkDirtyBitmap *bm = find(bs, name, err);
    if (bm && qk_dirty_bitmap_inconsistent(bm)) {
        qk_error_set(err, -EINVAL, "Bitmap '%s' is inconsistent and cannot be used\n"
                     "Try block-dirty-bitmap-remove to delete this bitmap from disk", name);
        return NULL;
    }
    return bm;
}

/* Default granularity: the cluster size, kept within 4 KiB..64 KiB. */
static uint64_t default_granularity(QkBlock *bs)
{
    QkImageInfo info;
    qk_block_get_info(bs, &info);
    uint64_t g = info.cluster_size ? info.cluster_size : 65536;
    return g < 4096 ? 4096 : g > 65536 ? 65536 : g;
}

static int run_op(QkBlock *bs, QkBlock *src_bs, const Op *op, const char *name, uint64_t granularity, QkError *err)
{
    QkDirtyBitmap *bm;
    switch (op->kind) {
    case OP_ADD:
        if (qk_dirty_bitmap_find(bs, name)) {
            return qk_error_set(err, -EEXIST, "Bitmap already exists: %s", name);
        }
        if (!granularity) {
            granularity = default_granularity(bs);
        }
        if (granularity < 512 || (granularity & (granularity - 1)) || granularity > (1ULL << 31)) {
            return qk_error_set(err, -EINVAL, "Granularity must be power of 2 and at least 512");
        }
        bm = qk_dirty_bitmap_add_persistent(bs, name, granularity, err);
        return bm ? 0 : err->code ? err->code : -ENOMEM;
    case OP_REMOVE:
        bm = find(bs, name, err);
        return bm ? qk_dirty_bitmap_remove(bs, bm, err) : err->code;
    case OP_CLEAR:
    case OP_ENABLE:
    case OP_DISABLE:
        bm = find_usable(bs, name, err);
        if (!bm) {
            return err->code;
        }
        if (op->kind == OP_CLEAR) {
            qk_dirty_bitmap_clear(bm);
        } else {
            qk_dirty_bitmap_set_enabled(bm, op->kind == OP_ENABLE);
        }
        return 0;
    default: {
        bm = find_usable(bs, name, err);
        if (!bm) {
            return err->code;
        }
        QkDirtyBitmap *src = find_usable(src_bs ? src_bs : bs, op->src, err);
        return src ? qk_dirty_bitmap_merge(bm, src, err) : err->code;
    }
    }
}

static int run(int argc, char **argv)
{
    enum { OPT_ADD = 256, OPT_REMOVE, OPT_CLEAR, OPT_ENABLE, OPT_DISABLE, OPT_MERGE, OPT_OBJECT };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"add", no_argument, NULL, OPT_ADD},
        {"remove", no_argument, NULL, OPT_REMOVE},
        {"clear", no_argument, NULL, OPT_CLEAR},
        {"enable", no_argument, NULL, OPT_ENABLE},
        {"disable", no_argument, NULL, OPT_DISABLE},
        {"merge", required_argument, NULL, OPT_MERGE},
        {"granularity", required_argument, NULL, 'g'},
        {"source-file", required_argument, NULL, 'b'},
        {"source-format", required_argument, NULL, 'F'},
        {"object", required_argument, NULL, OPT_OBJECT},
        {NULL, 0, NULL, 0},
    };
    Op ops[64];
    int nops = 0;
    bool want_merge = false;
    const char *fmt = NULL, *src_file = NULL, *src_fmt = NULL;
    uint64_t granularity = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":b:f:F:g:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case 'b': src_file = optarg; break;
        case 'f': fmt = optarg; break;
        case 'F': src_fmt = optarg; break;
        case 'g':
            if (qk_tool_cvtnum("granularity", optarg, 0, INT64_MAX, &granularity) < 0) {
                return 1;
            }
            break;
        case OPT_ADD: case OPT_REMOVE: case OPT_CLEAR: case OPT_ENABLE: case OPT_DISABLE: case OPT_MERGE:
            if (nops == (int)(sizeof(ops) / sizeof(ops[0]))) {
                return qk_tool_usage_error("%s", "too many operations");
            }
            ops[nops].kind = opt - OPT_ADD;
            ops[nops].src = opt == OPT_MERGE ? optarg : NULL;
            want_merge |= opt == OPT_MERGE;
            nops++;
            break;
        case OPT_OBJECT:
            qk_tool_error("%s is not supported", argv[optind - 1]);
            return 1;
        case ':':
            return qk_tool_usage_error("missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (nops == 0) {
        qk_tool_error("Need at least one of --add, --remove, --clear, --enable, --disable, or --merge");
        return 1;
    }
    bool want_add = false;
    for (int i = 0; i < nops; i++) {
        want_add |= ops[i].kind == OP_ADD;
    }
    if (granularity && !want_add) {
        qk_tool_error("granularity only supported with --add");
        return 1;
    }
    if (src_fmt && !src_file) {
        qk_tool_error("-F only supported with -b");
        return 1;
    }
    if (src_file && !want_merge) {
        qk_tool_error("Merge bitmap source file only supported with --merge");
        return 1;
    }
    if (optind + 2 != argc) {
        qk_tool_error("Expecting filename and bitmap name");
        return 1;
    }
    const char *filename = argv[optind], *name = argv[optind + 1];

    QkError err = {0};
    QkBlock *bs = qk_tool_open(filename, fmt, QK_OPEN_RDWR, &err);
    if (!bs) {
        qk_tool_error("Could not open '%s': %s", filename, err.msg);
        return 1;
    }
    QkBlock *src_bs = NULL;
    int ret = 1;
    if (src_file) {
        src_bs = qk_tool_open(src_file, src_fmt, QK_OPEN_LOAD_BITMAPS | QK_OPEN_FORCE_SHARE, &err);
        if (!src_bs) {
            qk_tool_error("Could not open '%s': %s", src_file, err.msg);
            goto out;
        }
    }
    for (int i = 0; i < nops; i++) {
        QkError oerr = {0};
        if (run_op(bs, src_bs, &ops[i], name, granularity, &oerr) < 0) {
            qk_tool_error("Operation %s on bitmap %s failed: %s", op_names[ops[i].kind], name, oerr.msg);
            goto out;
        }
    }
    ret = 0;
out:
    if (src_bs) {
        qk_block_close(src_bs);
    }
    return qk_tool_close_written(bs, ret, true, "");
}

const QkCommand qk_cmd_bitmap = {
    .name = "bitmap",
    .summary = "add, remove, clear, enable, disable or merge persistent dirty bitmaps",
    .usage = usage_text,
    .run = run,
};
