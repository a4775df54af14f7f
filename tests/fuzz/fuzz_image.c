/*
 * Fuzz target: opening a qcow2 image read-only and reading everything the
 * library can be made to read from it. The input is the image file's
 * bytes. After the open (header, extensions, L1, refcount table, snapshot
 * table) it gathers `info`, lists the snapshots, walks block status over
 * the virtual disk and reads every byte of it (L2 tables, subclusters,
 * compressed clusters), within caps that keep one input fast.
 */
#include "fuzz_common.h"
#include "aio/loop.h"
#include "block/block.h"
#include "block/snapshot.h"

#include <stdlib.h>
#include <unistd.h>

/* Caps per input: a hostile header may claim an exabyte disk. */
#define MAX_EXTENTS 4096
#define MAX_READ_BYTES (16ull << 20)
#define READ_CHUNK (1u << 20)

typedef struct Run {
    const char *path;
    uint8_t *buf;
} Run;

static void coroutine_fn read_all(QkBlock *bs, uint8_t *buf)
{
    uint64_t size = (uint64_t)qk_block_length(bs);
    uint64_t off = 0, read = 0;
    for (int n = 0; off < size && n < MAX_EXTENTS; n++) {
        uint64_t pnum = 0, map = 0;
        QkBlock *file = NULL;
        int st = qk_co_block_status(bs, off, size - off, &pnum, &map, &file);
        if (st < 0 || pnum == 0) {
            break;
        }
        int depth = 0;
        uint64_t pnum_above = 0;
        qk_co_block_status_above(bs, off, size - off, &pnum_above, &depth);
        /* Read the extent, whatever it is: holes and zeros go through the
         * same mapping code as data. */
        for (uint64_t p = off; p < off + pnum && read < MAX_READ_BYTES; p += READ_CHUNK) {
            uint64_t len = off + pnum - p < READ_CHUNK ? off + pnum - p : READ_CHUNK;
            qk_co_pread(bs, p, len, buf, 0);
            read += len;
        }
        off += pnum;
    }
    /* Unaligned reads take the read-modify paths of the layer. */
    if (size > 1) {
        qk_co_pread(bs, size / 2 - 1, size - size / 2 + 1 < 4097 ? size - size / 2 + 1 : 4097, buf, 0);
    }
}

static void coroutine_fn run_co(void *opaque)
{
    Run *r = opaque;
    QkError err = {0};
    /* The persistent bitmaps' loader reads the directory, the tables and
     * the bitmap data of the image too. */
    QkOpenOptions o = {.flags = QK_OPEN_NO_BACKING | QK_OPEN_LOAD_BITMAPS, .format = "qcow2"};
    QkBlock *bs = qk_co_block_open(r->path, &o, &err);
    if (!bs) {
        fuzz_debug("open: %s", err.msg);
        /* What info opens: an encrypted image is described (its LUKS
         * header parsed), and every guest read must fail. */
        qk_error_clear(&err);
        o.flags = QK_OPEN_NO_BACKING | QK_OPEN_METADATA_ONLY;
        bs = qk_co_block_open(r->path, &o, &err);
        if (!bs) {
            return;
        }
    }
    QkImageInfo info;
    qk_block_get_info(bs, &info);
    QkSnapshotInfo *list = NULL;
    int n = 0;
    if (qk_co_snapshot_list(bs, &list, &n, &err) == 0) {
        qk_snapshot_list_free(list, n);
    }
    fuzz_debug("open: %s, %llu bytes, %d snapshots", info.format, (unsigned long long)info.virtual_size, n);
    read_all(bs, r->buf);
    qk_co_block_close(bs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    if (size > FUZZ_MAX_INPUT) {
        return 0;
    }
    char path[64];
    int fd = fuzz_memfd(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    Run r = {.path = path, .buf = malloc(READ_CHUNK + 4097)};
    if (r.buf) {
        qk_co_run(run_co, &r);
    }
    free(r.buf);
    close(fd);
    return 0;
}
