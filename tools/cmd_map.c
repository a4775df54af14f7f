/*
 * qcowkit map: where each range of the guest disk comes from, across the
 * backing chain, in qemu-img map's human table or JSON list. Each extent
 * is asked of the top layer first and of lower layers only where the
 * layers above leave it unallocated.
 */
#include "cmd.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit map [-f FMT] [--output=human|json] [-s|--start-offset=OFF]\n"
    "                   [-l|--max-length=LEN] [-U] FILE\n"
    "\n"
    "Lists the image's extents: which layer of the backing chain holds each\n"
    "range and where in which host file (human: data extents only; json: all).\n";

typedef struct Extent {
    uint64_t start, length;
    int depth;
    bool present, zero, data, has_offset;
    uint64_t offset;
    const char *file;
} Extent;

typedef struct MapRun {
    QkBlock *bs;
    uint64_t start, end;
    bool json;
    int ret;
} MapRun;

/* Status of the extent at off, from the first layer that has it. */
static int coroutine_fn get_extent(QkBlock *top, uint64_t off, uint64_t bytes, Extent *e)
{
    int depth = 0;
    /* The layer above's place for the range, when it has one (unallocated
     * subclusters of an allocated cluster). */
    bool above_has_offset = false;
    uint64_t above_map = 0;
    QkBlock *above_file = NULL;
    for (QkBlock *b = top; b; b = qk_block_backing(b), depth++) {
        uint64_t n, map = 0;
        QkBlock *file = NULL;
        int r = qk_co_block_status(b, off, bytes, &n, &map, &file);
        if (r < 0) {
            return r;
        }
        if (r & QK_BS_EOF || n == 0) {
            /* Past the end of a shorter backing file: reads as zeros,
             * told (as qemu-img tells it) at the depth of the layer above,
             * with that layer's host place if it gave one. */
            *e = (Extent){.start = off, .length = bytes, .depth = depth ? depth - 1 : 0, .zero = true,
                          .has_offset = above_has_offset, .offset = above_map,
                          .file = above_file ? qk_block_filename(above_file) : NULL};
            return 0;
        }
        above_has_offset = (r & QK_BS_OFFSET_VALID) && file;
        above_map = map;
        above_file = file;
        if (r & QK_BS_ALLOCATED || !qk_block_backing(b)) {
            bool present = r & QK_BS_ALLOCATED;
            *e = (Extent){
                .start = off, .length = n, .depth = depth, .present = present,
                /* Unallocated all the way down reads as zeros. */
                .zero = (r & QK_BS_ZERO) || !present,
                .data = r & QK_BS_DATA,
                .has_offset = (r & QK_BS_OFFSET_VALID) && file,
                .offset = map,
                .file = file ? qk_block_filename(file) : NULL,
            };
            return 0;
        }
        bytes = n;
    }
    return -EIO;
}

static bool mergeable(const Extent *a, const Extent *b)
{
    if (a->depth != b->depth || a->present != b->present || a->zero != b->zero ||
        a->data != b->data || a->has_offset != b->has_offset) {
        return false;
    }
    if (a->has_offset && (a->offset + a->length != b->offset || a->file != b->file)) {
        return false;
    }
    return true;
}

/* Returns -1 (after the message) for what the human table cannot show. */
static int print_extent(const Extent *e, bool json, bool first)
{
    if (json) {
        printf("%s{ \"start\": %" PRIu64 ", \"length\": %" PRIu64 ", \"depth\": %d, \"present\": %s,"
               " \"zero\": %s, \"data\": %s",
               first ? "[" : ",\n", e->start, e->length, e->depth, e->present ? "true" : "false",
               e->zero ? "true" : "false", e->data ? "true" : "false");
        if (e->has_offset) {
            printf(", \"offset\": %" PRIu64, e->offset);
        }
        printf("}");
        return 0;
    }
    /* The human table lists ranges with data and their host place: data
     * with no such place (compressed) ends it, as in qemu-img. */
    if (e->data && !e->has_offset) {
        fflush(stdout);
        qk_tool_error("File contains external, encrypted or compressed clusters.");
        return -1;
    }
    if (e->data && !e->zero) {
        char a[32], b[32], c[32];
        snprintf(a, sizeof(a), "%#" PRIx64, e->start);
        snprintf(b, sizeof(b), "%#" PRIx64, e->length);
        snprintf(c, sizeof(c), "%#" PRIx64, e->offset);
        printf("%-16s%-16s%-16s%s\n", a, b, c, e->file);
    }
    return 0;
}

static void coroutine_fn map_entry(void *opaque)
{
    MapRun *m = opaque;
    Extent cur = {0}, next;
    bool have = false, first = true;
    if (!m->json) {
        printf("%-16s%-16s%-16s%s\n", "Offset", "Length", "Mapped to", "File");
    }
    for (uint64_t off = m->start; off < m->end; off += next.length) {
        /* Ask in chunks so a huge image never needs one giant answer. */
        uint64_t want = m->end - off < (1ULL << 30) ? m->end - off : (1ULL << 30);
        int r = get_extent(m->bs, off, want, &next);
        if (r < 0) {
            fflush(stdout);
            qk_tool_error("Could not read file metadata: %s", strerror(-r));
            m->ret = 1;
            return;
        }
        if (have && mergeable(&cur, &next)) {
            cur.length += next.length;
            continue;
        }
        if (have) {
            if (print_extent(&cur, m->json, first) < 0) {
                m->ret = 1;
                return;
            }
            first = false;
        }
        cur = next;
        have = true;
    }
    if (have) {
        if (print_extent(&cur, m->json, first) < 0) {
            m->ret = 1;
            return;
        }
        first = false;
    }
    if (!have) {
        /* Nothing to map (an empty image or range): qemu-img still lists
         * one empty extent where the range starts. */
        Extent none = {.start = m->start};
        print_extent(&none, m->json, first);
        first = false;
    }
    if (m->json) {
        printf("]\n");
    }
}

static int run(int argc, char **argv)
{
    enum { OPT_OUTPUT = 256, OPT_START, OPT_MAXLEN };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"start-offset", required_argument, NULL, OPT_START},
        {"max-length", required_argument, NULL, OPT_MAXLEN},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL;
    MapRun m = {0};
    uint64_t max_len = UINT64_MAX;
    int flags = 0, c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":f:hUs:l:", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': fmt = optarg; break;
        case 'U': flags |= QK_OPEN_FORCE_SHARE; break;
        case OPT_OUTPUT:
            if (qk_tool_parse_output("map", optarg, &m.json) < 0) {
                return 1;
            }
            break;
        case 's': case OPT_START:
            if (qk_tool_cvtnum("start offset", optarg, 0, INT64_MAX, &m.start) < 0) {
                return 1;
            }
            break;
        case 'l': case OPT_MAXLEN:
            if (qk_tool_cvtnum("max length", optarg, 0, INT64_MAX, &max_len) < 0) {
                return 1;
            }
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("map", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("map", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("map", "Expecting one image file name");
    }
    QkError err = {0};
    m.bs = qk_tool_open(argv[optind], fmt, flags, &err);
    if (!m.bs) {
        qk_tool_error("Could not open '%s': %s", argv[optind], err.msg);
        return 1;
    }
    uint64_t len = (uint64_t)qk_block_length(m.bs);
    m.end = max_len < len - (m.start < len ? m.start : len) ? m.start + max_len : len;
    qk_co_run(map_entry, &m);
    fflush(stdout);
    int cr = qk_block_close(m.bs);
    if (cr < 0) {
        qk_tool_error("%s: closing the image failed: %s", argv[optind], strerror(-cr));
        return 1;
    }
    return m.ret;
}

const QkCommand qk_cmd_map = {
    .name = "map",
    .summary = "show where the image's data lives across the backing chain",
    .usage = usage_text,
    .run = run,
};
