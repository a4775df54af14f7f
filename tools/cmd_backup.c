/*
 * qcowkit backup: a push backup of an image that is not in use, full or
 * incremental. A full backup copies the whole disk into a new image; an
 * incremental one copies only the ranges a persistent dirty bitmap of the
 * source marks, into a new qcow2 image whose backing file is the previous
 * backup, so that the chain full <- increment <- ... reads as the source
 * did at each backup. With --bitmap, the bitmap is cleared once the copy
 * is complete and flushed (it then records what the next increment must
 * hold); a failed backup leaves it as it was.
 *
 * Owns the arguments and the order of the steps; the copy is the convert
 * job's (src/jobs/convert.c), the bitmaps the format driver's.
 */
#include "cmd.h"
#include "progress.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit backup [--sync=full|incremental] [--bitmap NAME] [-B BACKING [-F FMT]]\n"
    "                      [-f FMT] [-O FMT] [-p] [-q] SOURCE TARGET\n"
    "\n"
    "Backs up SOURCE (not in use by anyone else) into the new image TARGET.\n"
    "  --sync=full        copy the whole disk (default)\n"
    "  --sync=incremental copy only the ranges bitmap NAME marks; needs --bitmap\n"
    "                     and -B, the previous backup, as TARGET's backing file\n"
    "  --bitmap NAME      a persistent dirty bitmap of SOURCE: cleared once the\n"
    "                     backup is complete, so it records the next increment\n"
    "  -B BACKING         TARGET's backing file (-F: its format, default qcow2)\n"
    "  -f FMT             format of SOURCE (default: probed)\n"
    "  -O FMT             format of TARGET: qcow2 (default) or raw (full only)\n"
    "  -p                 show progress\n"
    "  -q                 quiet\n";

typedef struct BackupRun {
    QkConvertOptions co;
    QkProgress progress;
    QkError err;
    int ret;
} BackupRun;

static void coroutine_fn backup_co(void *opaque)
{
    BackupRun *b = opaque;
    b->ret = qk_co_convert(&b->co, &b->err);
}

static int run(int argc, char **argv)
{
    enum { OPT_SYNC = 256, OPT_BITMAP };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"sync", required_argument, NULL, OPT_SYNC},
        {"bitmap", required_argument, NULL, OPT_BITMAP},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *out_fmt = "qcow2", *backing = NULL, *backing_fmt = "qcow2", *bitmap = NULL;
    bool incremental = false, progress = false, quiet = false;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":hf:O:B:F:pq", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h': fputs(usage_text, stdout); return 0;
        case 'f': fmt = optarg; break;
        case 'O': out_fmt = optarg; break;
        case 'B': backing = optarg; break;
        case 'F': backing_fmt = optarg; break;
        case 'p': progress = true; break;
        case 'q': quiet = true; break;
        case OPT_BITMAP: bitmap = optarg; break;
        case OPT_SYNC:
            if (strcmp(optarg, "full") == 0) {
                incremental = false;
            } else if (strcmp(optarg, "incremental") == 0 || strcmp(optarg, "bitmap") == 0) {
                incremental = true;
            } else {
                qk_tool_error("Invalid sync mode '%s': full or incremental", optarg);
                return 1;
            }
            break;
        case ':': return qk_tool_usage_error("missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind + 2 != argc) {
        return qk_tool_usage_error("%s", "Expecting source and target file names");
    }
    if (incremental && (!bitmap || !backing)) {
        qk_tool_error("--sync=incremental needs --bitmap and -B (the previous backup)");
        return 1;
    }
    if (backing && strcmp(out_fmt, "qcow2") != 0) {
        qk_tool_error("Backing file not supported for file format '%s'", out_fmt);
        return 1;
    }
    const char *src_name = argv[optind], *dst_name = argv[optind + 1];
    QkError err = {0};
    /* Read-write when a bitmap is to be cleared (and stored) afterwards. */
    QkBlock *src = qk_tool_open(src_name, fmt, bitmap ? QK_OPEN_RDWR : 0, &err);
    if (!src) {
        qk_tool_error("Could not open '%s': %s", src_name, err.msg);
        return 1;
    }
    int ret = 1;
    QkBlock *dst = NULL;
    QkDirtyBitmap *bm = NULL;
    if (bitmap) {
        bm = qk_dirty_bitmap_find(src, bitmap);
        if (!bm || !qk_dirty_bitmap_persistent(bm)) {
            qk_tool_error("Dirty bitmap '%s' not found", bitmap);
            goto out;
        }
        if (qk_dirty_bitmap_inconsistent(bm)) {
            qk_tool_error("Bitmap '%s' is inconsistent and cannot be used", bitmap);
            goto out;
        }
    }
    int64_t len = qk_block_length(src);
    if (len < 0) {
        qk_tool_error("Could not get size of %s: %s", src_name, strerror((int)-len));
        goto out;
    }
    if (qk_tool_same_file(src_name, dst_name)) {
        qk_tool_error("The target is the source");
        goto out;
    }
    QkCreateOptions co = {.format = out_fmt, .size = (uint64_t)len, .size_set = true,
                          .backing_file = backing, .backing_fmt = backing ? backing_fmt : NULL};
    if (qk_block_create(dst_name, &co, &err) < 0) {
        qk_tool_error("%s: %s", dst_name, err.msg);
        goto out;
    }
    QkOpenOptions oo = {.flags = QK_OPEN_RDWR, .format = out_fmt};
    dst = qk_block_open(dst_name, &oo, &err);
    if (!dst) {
        qk_tool_error("Could not open '%s': %s", dst_name, err.msg);
        goto out;
    }
    BackupRun b = {
        .co = {
            .src = &src,
            .nb_src = 1,
            .dst = dst,
            .target_zero = !backing,
            .sparse = 4096,
            .workers = 8,
            .only = incremental ? bm : NULL,
            .progress = qk_progress_report,
        },
    };
    b.co.opaque = &b.progress;
    qk_progress_init(&b.progress, stdout, progress && !quiet);
    qk_co_run(backup_co, &b);
    if (b.ret < 0) {
        qk_tool_error("%s", b.err.msg);
        goto out;
    }
    /* The backup is durable before the bitmap forgets what it holds. */
    int r = qk_block_close(dst);
    dst = NULL;
    if (r < 0) {
        qk_tool_error("error while writing to the backup: %s", strerror(-r));
        goto out;
    }
    qk_progress_finish(&b.progress);
    if (bm) {
        qk_dirty_bitmap_clear(bm);
    }
    ret = 0;
out:
    if (dst) {
        qk_block_close(dst);
    }
    return qk_tool_close_written(src, ret, true, "");
}

const QkCommand qk_cmd_backup = {
    .name = "backup",
    .summary = "back up an image not in use: full, or incremental from a persistent dirty bitmap",
    .usage = usage_text,
    .run = run,
};
