/*
 * qcowkit info: what qemu-img info shows, in its human layout or its JSON
 * keys, for one image or (--backing-chain) for every layer. Each layer is
 * opened on its own without its backing, so a missing backing file does
 * not stop `info` from describing the image that names it.
 */
#include "cmd.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const usage_text =
    "Usage: qcowkit info [-f FMT] [--output=human|json] [--backing-chain] [-U] FILE\n"
    "\n"
    "Shows an image's format, sizes, backing file and format options.\n"
    "  -f FMT            image format (default: probe)\n"
    "  --output=FMT      human (default) or json\n"
    "  --backing-chain   describe every image of the backing chain\n"
    "  -U                force shared access\n";

typedef struct SnapList {
    QkBlock *bs;
    QkSnapshotInfo *l;
    int n;
    int ret;
    QkError err;
} SnapList;

static void coroutine_fn list_co(void *opaque)
{
    SnapList *sl = opaque;
    sl->ret = qk_co_snapshot_list(sl->bs, &sl->l, &sl->n, &sl->err);
}

/* The image's snapshot table; none for formats without one. */
static int list_snapshots(QkBlock *bs, SnapList *sl)
{
    *sl = (SnapList){.bs = bs};
    if (!qk_block_has_snapshots(bs)) {
        return 0;
    }
    qk_co_run(list_co, sl);
    if (sl->ret < 0) {
        sl->l = NULL;
        sl->n = 0;
    }
    return sl->ret;
}

static void print_human(const char *filename, const QkImageInfo *info, const char *full_backing,
                        const SnapList *sl)
{
    char buf[64];
    printf("image: %s\n", filename);
    printf("file format: %s\n", info->format);
    printf("virtual size: %s (%" PRIu64 " bytes)\n",
           qk_format_size(info->virtual_size, buf, sizeof(buf)), info->virtual_size);
    if (info->actual_size >= 0) {
        printf("disk size: %s\n", qk_format_size((uint64_t)info->actual_size, buf, sizeof(buf)));
    } else {
        printf("disk size: unavailable\n");
    }
    if (info->encrypt) {
        printf("encrypted: yes\n");
    }
    if (info->cluster_size) {
        printf("cluster_size: %u\n", info->cluster_size);
    }
    if (info->backing_file) {
        printf("backing file: %s", info->backing_file);
        if (full_backing && strcmp(full_backing, info->backing_file) != 0) {
            printf(" (actual path: %s)", full_backing);
        }
        printf("\n");
        if (info->backing_format) {
            printf("backing file format: %s\n", info->backing_format);
        }
    }
    if (info->dirty) {
        printf("cleanly shut down: no\n");
    }
    qk_tool_print_snapshots(sl->l, sl->n);
    qk_tool_print_format_specific(info);
}

/* Keys in the order qemu-img prints them. */
static json_t *to_json(const char *filename, const QkImageInfo *info, const char *full_backing,
                       const SnapList *sl)
{
    json_t *o = json_object();
    if (info->backing_file && info->backing_format) {
        json_object_set_new(o, "backing-filename-format", json_string(info->backing_format));
    }
    if (sl->n) {
        json_object_set_new(o, "snapshots", qk_tool_snapshots_json(sl->l, sl->n));
    }
    json_object_set_new(o, "virtual-size", json_integer((json_int_t)info->virtual_size));
    json_object_set_new(o, "filename", json_string(filename));
    if (info->cluster_size) {
        json_object_set_new(o, "cluster-size", json_integer(info->cluster_size));
    }
    json_object_set_new(o, "format", json_string(info->format));
    if (info->actual_size >= 0) {
        json_object_set_new(o, "actual-size", json_integer(info->actual_size));
    }
    if (info->qcow2_version) {
        json_t *d = json_object();
        bool v3 = info->qcow2_version >= 3;
        json_object_set_new(d, "compat", json_string(v3 ? "1.1" : "0.10"));
        json_object_set_new(d, "compression-type",
                            json_string(info->compression_type ? info->compression_type : "zlib"));
        if (v3) {
            json_object_set_new(d, "lazy-refcounts", json_boolean(info->lazy_refcounts));
        }
        if (info->nb_bitmaps) {
            json_t *bl = json_array();
            for (int i = 0; i < info->nb_bitmaps; i++) {
                const QkBitmapInfo *b = &info->bitmaps[i];
                json_t *bo = json_object(), *fl = json_array();
                if (b->in_use) {
                    json_array_append_new(fl, json_string("in-use"));
                }
                if (b->auto_enabled) {
                    json_array_append_new(fl, json_string("auto"));
                }
                json_object_set_new(bo, "flags", fl);
                json_object_set_new(bo, "name", json_string(b->name));
                json_object_set_new(bo, "granularity", json_integer((json_int_t)b->granularity));
                json_array_append_new(bl, bo);
            }
            json_object_set_new(d, "bitmaps", bl);
        }
        json_object_set_new(d, "refcount-bits", json_integer(info->refcount_bits));
        if (info->data_file) {
            json_object_set_new(d, "data-file", json_string(info->data_file));
        }
        if (info->encrypt) {
            json_object_set_new(d, "encrypt", qk_tool_encrypt_json(info->encrypt));
        }
        if (info->data_file) {
            json_object_set_new(d, "data-file-raw", json_boolean(info->data_file_raw));
        }
        if (v3) {
            json_object_set_new(d, "corrupt", json_boolean(info->corrupt));
            json_object_set_new(d, "extended-l2", json_boolean(info->extended_l2));
        }
        json_t *fs = json_object();
        json_object_set_new(fs, "type", json_string("qcow2"));
        json_object_set_new(fs, "data", d);
        json_object_set_new(o, "format-specific", fs);
    }
    if (info->backing_file) {
        json_object_set_new(o, "full-backing-filename",
                            json_string(full_backing ? full_backing : info->backing_file));
    }
    if (info->encrypt) {
        json_object_set_new(o, "encrypted", json_true());
    }
    if (info->backing_file) {
        json_object_set_new(o, "backing-filename", json_string(info->backing_file));
    }
    json_object_set_new(o, "dirty-flag", json_boolean(info->dirty));
    return o;
}

static int run(int argc, char **argv)
{
    enum { OPT_OUTPUT = 256, OPT_CHAIN };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"backing-chain", no_argument, NULL, OPT_CHAIN},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL;
    bool json = false, chain = false;
    int flags = QK_OPEN_NO_BACKING | QK_OPEN_METADATA_ONLY;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":f:hU", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': fmt = optarg; break;
        case 'U': flags |= QK_OPEN_FORCE_SHARE; break;
        case OPT_OUTPUT:
            if (qk_tool_parse_output("info", optarg, &json) < 0) {
                return 1;
            }
            break;
        case OPT_CHAIN: chain = true; break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("info", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("info", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("info", optind >= argc ? "Expecting one image file name"
                                                       : "Expecting one image file name");
    }
    json_t *list = json_array();
    char *name = strdup(argv[optind]);
    char *layer_fmt = fmt ? strdup(fmt) : NULL;
    int ret = 0;
    /* The layers seen, to name a loop as one; the same cap as opening. */
    enum { MAX_LAYERS = QK_MAX_BACKING_CHAIN };
    struct { dev_t dev; ino_t ino; } seen[MAX_LAYERS];
    for (int depth = 0; name; depth++) {
        struct stat st;
        bool have = !qk_block_is_remote(name) && stat(name, &st) == 0;
        for (int i = 0; have && i < depth; i++) {
            if (seen[i].dev == st.st_dev && seen[i].ino == st.st_ino) {
                qk_tool_error("Backing chain of '%s' loops: '%s' is its own backing file", argv[optind], name);
                ret = 1;
                goto done;
            }
        }
        if (depth >= MAX_LAYERS) {
            qk_tool_error("Backing chain of '%s' is too deep (more than %d images)", argv[optind], MAX_LAYERS);
            ret = 1;
            break;
        }
        seen[depth].dev = have ? st.st_dev : 0;
        seen[depth].ino = have ? st.st_ino : 0;
        QkError err = {0};
        QkBlock *bs = qk_tool_open(name, layer_fmt, flags, &err);
        if (!bs) {
            qk_tool_error("Could not open '%s': %s", name, err.msg);
            ret = 1;
            break;
        }
        QkImageInfo info;
        qk_block_get_info(bs, &info);
        if (info.bitmaps_stale) {
            /* What QEMU says when it opens such an image. */
            fprintf(stderr, "%s: warning: a program lacking bitmap support modified this file, so all bitmaps are "
                            "now considered inconsistent\nSome clusters may be leaked, run '%s check -r' on the "
                            "image file to fix.\n", qk_progname, qk_progname);
        }
        if (qk_block_bitmaps_problem(bs)) {
            /* qemu-img refuses to open such an image at all. */
            fprintf(stderr, "%s: warning: the persistent bitmaps of '%s' cannot be used: %s\n", qk_progname, name,
                    qk_block_bitmaps_problem(bs));
        }
        SnapList sl;
        if (list_snapshots(bs, &sl) == -QK_ECORRUPT) {
            /* A damaged table (one a copy cut short loses first) is no
             * reason to hide the rest of what info shows, and qemu-img
             * prints such an image; the snapshots are not listed, and
             * the warning says why and what can repair it. */
            fprintf(stderr, "%s: warning: the snapshots of '%s' are not listed: %s; run '%s check' on the "
                            "image\n", qk_progname, name, sl.err.msg, qk_progname);
        } else if (sl.ret < 0) {
            qk_tool_error("Could not read the snapshot table of '%s': %s", name, sl.err.msg);
            qk_block_close(bs);
            ret = 1;
            break;
        }
        /* The next layer's name; names with a protocol prefix are shown
         * as recorded, as qemu-img shows them. */
        char *next = info.backing_file ? qk_block_backing_path(name, info.backing_file) : NULL;
        bool prefixed = info.backing_file && (strncmp(info.backing_file, "json:", 5) == 0 ||
                                              strncmp(info.backing_file, "file:", 5) == 0);
        char *full = prefixed ? strdup(info.backing_file) : NULL;
        if (json) {
            json_array_append_new(list, to_json(name, &info, full ? full : next, &sl));
        } else {
            if (depth > 0) {
                printf("\n");
            }
            print_human(name, &info, full ? full : next, &sl);
        }
        qk_snapshot_list_free(sl.l, sl.n);
        /* The next layer is opened with the format this one records. */
        free(layer_fmt);
        layer_fmt = info.backing_format ? strdup(info.backing_format) : NULL;
        qk_block_close(bs);
        free(name);
        free(full);
        name = chain ? next : NULL;
        if (!chain) {
            free(next);
        }
    }
done:
    free(name);
    free(layer_fmt);
    if (json && ret == 0) {
        qk_tool_print_json(chain ? list : json_array_get(list, 0));
    }
    json_decref(list);
    return ret;
}

const QkCommand qk_cmd_info = {
    .name = "info",
    .summary = "show an image's format, sizes and backing file",
    .usage = usage_text,
    .run = run,
};
