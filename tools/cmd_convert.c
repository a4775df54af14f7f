/*
 * qcowkit convert: copies one or more images (concatenated) into a new
 * or, with -n, an existing image (qemu-img convert), qcow2 and raw in
 * and out, with the same options, messages, exit codes and, as far as
 * the formats allow, the same allocation in the result.
 *
 * Owns argument handling, the -o list, the checks qemu-img makes (in its
 * order, so the first error reported is the same), creating or opening
 * the target; the copy itself is jobs/convert.c.
 */
#include "cmd.h"
#include "progress.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A number as qemu-img reads -m (strtol's rules: leading blanks, a sign,
 * 0x or 0 prefixes), all of the argument used. */
static int parse_long(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end || v < 0) {
        return -EINVAL;
    }
    *out = (uint64_t)v;
    return 0;
}

static const char *const usage_text =
    "Usage: qcowkit convert [-c] [-p] [-q] [-n] [-W] [-U] [-C] [-f FMT] [-O OUTPUT_FMT]\n"
    "                       [-o OPTIONS] [-B BACKING_FILE [-F BACKING_FMT]] [-S SPARSE_SIZE]\n"
    "                       [-m NUM_COROUTINES] [-t CACHE] [-T SRC_CACHE] [-r RATE]\n"
    "                       [-l SNAPSHOT_PARAM] [--compress-threads N] [--compress-level N]\n"
    "                       [--target-is-zero] [--bitmaps [--skip-broken-bitmaps]] [--salvage]\n"
    "                       SRC [SRC...] DST\n"
    "\n"
    "Copies the content of SRC (several are concatenated) into a new image DST\n"
    "of their total size (replaced if it exists). Only data is read: ranges the\n"
    "sources know to be zeros are skipped, and the new image stays sparse.\n"
    "SRC and DST may be NBD URIs (nbd://HOST[:PORT]/NAME, nbd+unix:///NAME?socket=\n"
    "PATH): data streams to and from the export; an export DST is not created but\n"
    "written in place (raw), and must be at least as large as the sources.\n"
    "  -f FMT        format of the sources (default: probed)\n"
    "  -O FMT        format of DST: raw (default) or qcow2\n"
    "  -o OPTIONS    creation options for DST, as for create ('-o help' lists them)\n"
    "  -B BACKING    DST gets this backing file (-F its format, required): only what\n"
    "                the sources' top layers hold is copied\n"
    "  -c            write DST's clusters compressed (qcow2)\n"
    "  --compress-threads N  threads compressing at once (default: one per CPU)\n"
    "  --compress-level N    zlib 1..9 (default 6), zstd 1..22 (default 3)\n"
    "  -l SNAPSHOT   copy this internal snapshot of SRC instead of its active disk:\n"
    "                ID_OR_NAME, or snapshot.id=ID[,snapshot.name=NAME]\n"
    "  -n            do not create DST: write into the existing image, which must\n"
    "                be large enough; zeros are written as zeros\n"
    "  --target-is-zero  with -n: DST already reads as zeros, skip writing zeros\n"
    "  -S SIZE       data all zeros over SIZE bytes (default 4k) is left a hole;\n"
    "                0 writes everything\n"
    "  -m N          coroutines copying at once, 1..16 (default 8; 16 into an rbd: image)\n"
    "  -W            allow writes to DST out of order (always into an rbd: image)\n"
    "  -t CACHE      cache mode for DST (default unsafe): none, writeback,\n"
    "                writethrough, directsync, unsafe\n"
    "  -T SRC_CACHE  cache mode for the sources (default writeback)\n"
    "  -U            open the sources even if another process uses them\n"
    "  -r RATE       read at most RATE bytes of data per second (k, M, G suffixes)\n"
    "  --bitmaps     copy the persistent dirty bitmaps of SRC (one source, qcow2 DST)\n"
    "  --skip-broken-bitmaps  with --bitmaps: skip bitmaps left in use, with a warning\n"
    "  --salvage     copy what can be read: a source read that fails is retried\n"
    "                512 bytes at a time, and what still fails is written as\n"
    "                zeros with a warning (the copy ends with status 0)\n"
    "  -C            accepted for compatibility; no effect\n"
    "  -p            show progress\n"
    "  -q            quiet\n";

typedef struct ConvertCmd {
    QkConvertOptions co;
    QkProgress progress;
    QkError err;
    int ret;
} ConvertCmd;

/* --salvage: each 512 bytes that could not be read, as qemu-img warns. */
static void salvaged(uint64_t off, int err, void *opaque)
{
    (void)opaque;
    fflush(stdout);
    fprintf(stderr, "%s: warning: error while reading offset %" PRIu64 ": %s\n", qk_progname, off, strerror(-err));
}

static void coroutine_fn convert_co(void *opaque)
{
    ConvertCmd *c = opaque;
    c->ret = qk_co_convert(&c->co, &c->err);
}

/* qemu-img's usage errors: the message, then where to look for help. */
static void lock_error(const char *prefix, const char *name)
{
    qk_tool_error("%sFailed to get \"write\" lock", prefix);
    fprintf(stderr, "Is another process using the image [%s]?\n", name);
}

static int run_convert(int argc, char **argv)
{
    const char *fmt = NULL, *out_fmt = NULL, *cache = NULL, *src_cache = NULL;
    const char *backing = NULL, *backing_fmt = NULL, *snapshot = NULL;
    QkToolSnapshot snap;
    uint64_t rate = 0, compress_threads = 0, compress_level = 0;
    bool compress = false, progress = false, quiet = false, no_create = false;
    bool out_of_order = false, target_is_zero = false, bitmaps = false, skip_broken = false, salvage = false;
    int src_flags = 0;
    uint64_t sparse = 4096, workers = 8;
    bool workers_set = false, copy_range = false, sparse_set = false;
    char *opt_lists[32];
    int nlists = 0;
    enum { OPT_TARGET_IS_ZERO = 256, OPT_COMPRESS_THREADS, OPT_COMPRESS_LEVEL, OPT_BITMAPS, OPT_SKIP_BROKEN,
           OPT_SALVAGE };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"force-share", no_argument, NULL, 'U'},
        {"target-is-zero", no_argument, NULL, OPT_TARGET_IS_ZERO},
        {"compress-threads", required_argument, NULL, OPT_COMPRESS_THREADS},
        {"compress-level", required_argument, NULL, OPT_COMPRESS_LEVEL},
        {"bitmaps", no_argument, NULL, OPT_BITMAPS},
        {"skip-broken-bitmaps", no_argument, NULL, OPT_SKIP_BROKEN},
        {"salvage", no_argument, NULL, OPT_SALVAGE},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":hf:O:B:F:Cco:l:S:pt:T:qnm:WUr:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f': fmt = optarg; break;
        case 'O': out_fmt = optarg; break;
        case 'B': backing = optarg; break;
        case 'F': backing_fmt = optarg; break;
        case 'C': copy_range = true; break; /* the same bytes either way; only its conflicts matter */
        case 'c': compress = true; break;
        case 'l':
            if (!qk_tool_parse_snapshot(optarg, &snap)) {
                return 1;
            }
            snapshot = optarg;
            break;
        case 'p': progress = true; break;
        case 't': cache = optarg; break;
        case 'T': src_cache = optarg; break;
        case 'q': quiet = true; break;
        case 'n': no_create = true; break;
        case 'W': out_of_order = true; break;
        case 'U': src_flags |= QK_OPEN_FORCE_SHARE; break;
        case OPT_TARGET_IS_ZERO: target_is_zero = true; break;
        case OPT_BITMAPS: bitmaps = true; break;
        case OPT_SKIP_BROKEN: skip_broken = true; break;
        case OPT_SALVAGE: salvage = true; break;
        case OPT_COMPRESS_THREADS:
            if (qk_parse_uint(optarg, &compress_threads) < 0 || compress_threads < 1 || compress_threads > 1024) {
                qk_tool_error("Invalid number of compression threads '%s': 1 to 1024", optarg);
                return 1;
            }
            break;
        case OPT_COMPRESS_LEVEL:
            /* The type's own range is checked once the target is known. */
            if (qk_parse_uint(optarg, &compress_level) < 0 || compress_level < 1 || compress_level > 22) {
                qk_tool_error("Invalid compression level '%s': zlib takes 1 to 9, zstd 1 to 22", optarg);
                return 1;
            }
            break;
        case 'o':
            if (nlists == (int)(sizeof(opt_lists) / sizeof(opt_lists[0]))) {
                return qk_tool_usage_error("too many -o options%s", "");
            }
            if (!qk_tool_opt_list_valid(optarg)) {
                qk_tool_error("Invalid option list: %s", optarg);
                return 1;
            }
            opt_lists[nlists++] = optarg;
            break;
        case 'S':
            sparse_set = true;
            if (qk_tool_cvtnum("buffer size for sparse output", optarg, 0, INT64_MAX, &sparse) < 0) {
                return 1;
            }
            if (sparse % 512 || sparse > (16u << 20)) {
                qk_tool_error("Invalid buffer size for sparse output specified. Valid sizes are multiples of 512 "
                              "up to 16777216. Select 0 to disable sparse detection (fully allocates output).");
                return 1;
            }
            break;
        case 'm':
            workers_set = true;
            if (parse_long(optarg, &workers) < 0 || workers < 1 || workers > 16) {
                qk_tool_error("Invalid number of coroutines. Allowed number of coroutines is between 1 and 16");
                return 1;
            }
            break;
        case 'r': {
            if (qk_tool_cvtnum("rate limit", optarg, 0, INT64_MAX, &rate) < 0) {
                return 1;
            }
            break;
        }
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            return qk_tool_usage_error("missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (!out_fmt) {
        out_fmt = "raw";
    }
    if (skip_broken && !bitmaps) {
        qk_tool_error("Use of --skip-broken-bitmaps requires --bitmaps");
        return 1;
    }
    if (copy_range && salvage) {
        qk_tool_error("Cannot use copy offloading in salvaging mode");
        return 1;
    }
    if (copy_range && (compress || sparse_set)) {
        qk_tool_error("Cannot enable copy offloading when -%c is used", compress ? 'c' : 'S');
        return 1;
    }
    if (target_is_zero && !no_create) {
        qk_tool_error("--target-is-zero requires use of -n flag");
        return 1;
    }
    if (no_create && nlists) {
        qk_tool_error("-o has no effect when skipping image creation");
        return 1;
    }
    bool qcow2 = strcmp(out_fmt, "qcow2") == 0;
    if (qk_tool_opt_lists_want_help(opt_lists, nlists)) {
        qk_tool_create_opts_help(qcow2, qcow2 ? "qcow2 " : "raw ");
        return 0;
    }
    int nb_src = argc - optind - 1;
    if (nb_src < 1) {
        qk_tool_error("Must specify image file name");
        return 1;
    }
    const char *out_name = argv[argc - 1];
    bool nbd_out = qk_block_is_nbd_uri(out_name);
    if (qk_block_is_rbd_name(out_name)) {
        /* An object store keeps no on-disk order worth writing in, and
         * each request waits on the network: in order, one write at a
         * time, an import took twice qemu-img -m 16 -W's time here. */
        out_of_order = true;
        workers = workers_set ? workers : 16;
    }
    int flags = QK_OPEN_RDWR | QK_OPEN_NO_FLUSH; /* qemu-img convert's default: cache=unsafe */
    /* A source must not change under the copy, nor be the file the copy
     * writes (a raw source named as the target's data file, say), whatever
     * its format: qemu-img convert's sources share no writes either. */
    src_flags |= QK_OPEN_NO_SHARE;
    int sflags = 0;
    if (src_cache && qk_cache_mode_parse(src_cache, &sflags) < 0) {
        qk_tool_error("Invalid source cache option: %s", src_cache);
        return 1;
    }
    src_flags |= sflags;
    if (bitmaps && nb_src > 1) {
        qk_tool_error("Copying bitmaps only possible with single source");
        return 1;
    }
    if (bitmaps) {
        src_flags |= QK_OPEN_LOAD_BITMAPS;
    }
    if (snapshot && nb_src > 1) {
        qk_tool_error("No support for concatenating multiple snapshot");
        return 1;
    }
    if (compress_threads) {
        qk_work_pool_set_threads((unsigned)compress_threads);
    }

    int ret = 1;
    QkBlock *out = NULL;
    QkBlock **src = calloc((size_t)nb_src, sizeof(*src));
    char *opt_copies[32] = {0};
    if (!src) {
        qk_tool_error("out of memory");
        return 1;
    }
    QkError err = {0};
    uint64_t total = 0;
    for (int i = 0; i < nb_src; i++) {
        const char *name = argv[optind + i];
        src[i] = qk_tool_open(name, fmt, src_flags, &err);
        if (!src[i]) {
            qk_tool_error("Could not open '%s': %s", name, err.msg);
            goto out;
        }
        if (snapshot && qk_tool_load_snapshot(src[i], &snap) < 0) {
            goto out;
        }
        int64_t len = qk_block_length(src[i]);
        if (len < 0) {
            qk_tool_error("Could not get size of %s: %s", name, strerror((int)-len));
            goto out;
        }
        total += (uint64_t)len;
    }
    if (!qk_format_is_image(out_fmt)) {
        qk_tool_error("Unknown file format '%s'", out_fmt);
        goto out;
    }
    if (bitmaps && qk_tool_bitmaps_can_copy(src[0], out_fmt, skip_broken) < 0) {
        goto out;
    }
    QkToolCreateOpts a = {.compression = "zlib", .lazy = "off"};
    a.o.format = out_fmt;
    for (int i = 0; i < nlists; i++) {
        /* Each list is parsed from a copy; its strings stay referenced. */
        opt_copies[i] = strdup(opt_lists[i]);
        if (!opt_copies[i] || qk_tool_create_opts_parse(&a, qcow2, opt_copies[i], "") < 0) {
            goto out;
        }
    }
    if (backing) {
        a.o.backing_file = backing;
    }
    if (backing_fmt) {
        a.o.backing_fmt = backing_fmt;
    }
    if (a.o.backing_file && nb_src > 1) {
        /* The target would read the backing file where a later source has
         * no data of its own: that source's backing file content is lost. */
        qk_tool_error("Having a backing file for the target makes no sense when concatenating multiple input "
                      "images");
        goto out;
    }
    /* With -n the target is not created: -B only says the target holds
     * the base's data already, so whatever the top leaves to its chain
     * is not copied (as in qemu-img, for a raw target too). */
    if (a.o.backing_file && !qcow2 && !no_create) {
        qk_tool_error("Backing file not supported for file format '%s'", out_fmt);
        goto out;
    }
    if (a.o.backing_file && !a.o.backing_fmt && !no_create) {
        qk_tool_error("Use of backing file requires explicit backing format");
        goto out;
    }
    if (target_is_zero && a.o.backing_file) {
        /* qemu-img says so and goes on, writing zeros as without the flag. */
        qk_tool_error("Cannot use --target-is-zero when the destination image has a backing file");
        target_is_zero = false;
    }
    if (compress && !qk_format_can_compress(out_fmt)) {
        qk_tool_error("Compression not supported for this file format");
        goto out;
    }
    if (compress && a.prealloc && strcmp(a.prealloc, "off") != 0) {
        qk_tool_error("Compression and preallocation not supported at the same time");
        goto out;
    }
    /* Writing over a source would destroy what is being read; qemu-img's
     * image locking refuses it, with these words. */
    for (int i = 0; i < nb_src; i++) {
        if (qk_block_file(src[i]) && qk_tool_same_file(qk_block_filename(qk_block_file(src[i])), out_name)) {
            char prefix[4096];
            if (no_create) {
                snprintf(prefix, sizeof(prefix), "Could not open '%s': ", out_name);
            } else {
                snprintf(prefix, sizeof(prefix), "%s: error while converting %s: ", out_name, out_fmt);
            }
            lock_error(prefix, out_name);
            goto out;
        }
    }
    /* zlib's levels end at 9: refused before a new image is created
     * (with -n, once the target's type is known). */
    if (compress && compress_level > 9 && !no_create && strcmp(a.compression, "zstd") != 0) {
        qk_tool_error("Invalid compression level %" PRIu64 " for zlib: 1 to 9", compress_level);
        goto out;
    }
    if (!no_create) {
        char why[1024];
        const char *msg = qk_tool_create_opts_check(&a, qcow2, why, sizeof(why));
        a.o.size = total;
        a.o.size_set = true;
        if (!msg && nbd_out && !qcow2) {
            /* An export cannot be created: as qemu-img, it is used as it
             * is, if large enough (checked once open), and not assumed to
             * read as zeros. */
        } else if (!msg && nbd_out) {
            msg = "a qcow2 image cannot be created on an NBD export (create it there first, then use -n)";
        } else if (!msg && qk_block_create(out_name, &a.o, &err) < 0) {
            msg = err.msg;
        }
        if (msg) {
            qk_tool_error("%s: error while converting %s: %s", out_name, out_fmt, msg);
            goto out;
        }
    }
    /* qemu-img reads the cache mode only now, after creating the image. */
    if (cache) {
        flags = QK_OPEN_RDWR;
        if (qk_cache_mode_parse(cache, &flags) < 0) {
            qk_tool_error("Invalid cache option: %s", cache);
            goto out;
        }
        flags |= QK_OPEN_RDWR;
    }
    QkOpenOptions oo = {.flags = flags, .format = out_fmt, .compress_level = (int)compress_level};
    out = qk_block_open(out_name, &oo, &err);
    if (!out) {
        qk_tool_error("Could not open '%s': %s", out_name, err.msg);
        goto out;
    }
    if (compress && compress_level > 9) {
        QkImageInfo oi = {0};
        qk_block_get_info(out, &oi);
        if (!oi.compression_type || strcmp(oi.compression_type, "zstd") != 0) {
            qk_tool_error("Invalid compression level %" PRIu64 " for zlib: 1 to 9", compress_level);
            goto out;
        }
    }
    if (nbd_out && !no_create) {
        int64_t olen = qk_block_length(out);
        if (olen < 0 || (uint64_t)olen < total) {
            qk_tool_error("%s: error while converting %s: Cannot grow NBD nodes", out_name, out_fmt);
            goto out;
        }
    }
    if (no_create) {
        int64_t olen = qk_block_length(out);
        if (olen < 0 || (uint64_t)olen < total) {
            qk_tool_error("output file is smaller than input file");
            goto out;
        }
    }
    ConvertCmd c = {
        .co = {
            .src = src,
            .nb_src = nb_src,
            .dst = out,
            .target_zero = no_create ? target_is_zero : !a.o.backing_file && !nbd_out,
            .top_only = backing != NULL || a.o.backing_file != NULL,
            .sparse = sparse,
            .compress = compress,
            .workers = (int)workers,
            .out_of_order = out_of_order,
            .rate = rate,
            .progress = qk_progress_report,
            .salvage = salvage,
            .salvaged = salvaged,
        },
    };
    c.co.opaque = &c.progress;
    qk_progress_init(&c.progress, stdout, progress && !quiet);
    qk_co_run(convert_co, &c);
    if (c.ret == -ENOTSUP && compress) {
        qk_tool_error("Compression not supported for this file format");
    } else if (c.ret < 0) {
        qk_tool_error("%s", c.err.msg);
    } else if (bitmaps && qk_tool_bitmaps_copy(src[0], out, skip_broken) < 0) {
        /* message printed */
    } else {
        qk_progress_finish(&c.progress);
        ret = 0;
    }
out:
    if (out) {
        int r = qk_block_close(out);
        if (ret == 0 && r < 0) {
            qk_tool_error("error while writing to output image file: %s", strerror(-r));
            ret = 1;
        }
    }
    for (int i = 0; i < nb_src; i++) {
        if (src[i]) {
            qk_block_close(src[i]);
        }
    }
    for (int i = 0; i < nlists; i++) {
        free(opt_copies[i]);
    }
    free(src);
    return ret;
}

const QkCommand qk_cmd_convert = {
    .name = "convert",
    .summary = "copy images (concatenated) into a new or existing image",
    .usage = usage_text,
    .run = run_convert,
};
