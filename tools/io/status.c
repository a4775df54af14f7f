/*
 * Status commands of the io interpreter: map and alloc (what the top
 * layer holds, as qemu-io reports it), length and info.
 */
#include "io/io.h"
#include "../cmd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Whether [off, off+bytes) starts allocated in the top layer, and for how
 * many bytes that stays the same (*pnum), merging driver extents. */
static int coroutine_fn top_allocated(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum)
{
    int first = -1;
    uint64_t done = 0;
    while (done < bytes) {
        uint64_t n;
        int r = qk_co_block_status(bs, off + done, bytes - done, &n, NULL, NULL);
        if (r < 0) {
            return r;
        }
        if (r & QK_BS_EOF || n == 0) {
            break;
        }
        int alloc = !!(r & QK_BS_ALLOCATED);
        if (first < 0) {
            first = alloc;
        } else if (alloc != first) {
            break;
        }
        done += n;
    }
    *pnum = done;
    return first > 0;
}

static int coroutine_fn map_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    int64_t len = qk_block_length(io->bs);
    if (len < 0) {
        printf("could not get image length: %s\n", strerror((int)-len));
        return (int)len;
    }
    uint64_t off = 0;
    while (off < (uint64_t)len) {
        uint64_t n;
        int r = top_allocated(io->bs, off, (uint64_t)len - off, &n);
        if (r < 0) {
            printf("Failed to get allocation status: %s\n", strerror(-r));
            return r;
        }
        if (n == 0) {
            break;
        }
        char s1[64], s2[64];
        qk_io_cvtstr((double)n, s1, sizeof(s1));
        qk_io_cvtstr((double)off, s2, sizeof(s2));
        printf("%s (0x%" PRIx64 ") bytes %s at offset %s (0x%" PRIx64 ")\n", s1, n,
               r ? "    allocated" : "not allocated", s2, off);
        off += n;
    }
    return 0;
}

static int coroutine_fn alloc_f(QkIo *io, int argc, char **argv)
{
    int64_t off = qk_io_cvtnum(argv[1]);
    if (off < 0) {
        return -EINVAL;
    }
    int64_t count = 512;
    if (argc == 3) {
        count = qk_io_cvtnum(argv[2]);
        if (count < 0) {
            return -EINVAL;
        }
    }
    int64_t len = qk_block_length(io->bs);
    if (len < 0) {
        return (int)len;
    }
    /* Like qemu-io, the range is cut at the end of the image. */
    count = off >= len ? 0 : (count < len - off ? count : len - off);
    uint64_t sum = 0;
    for (uint64_t done = 0; done < (uint64_t)count;) {
        uint64_t n;
        int r = top_allocated(io->bs, (uint64_t)off + done, (uint64_t)count - done, &n);
        if (r < 0) {
            printf("is_allocated failed: %s\n", strerror(-r));
            return r;
        }
        if (n == 0) {
            break;
        }
        if (r) {
            sum += n;
        }
        done += n;
    }
    char s[64];
    qk_io_cvtstr((double)off, s, sizeof(s));
    printf("%" PRIu64 "/%" PRId64 " bytes allocated at offset %s\n", sum, count, s);
    return 0;
}

static int coroutine_fn length_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    int64_t len = qk_block_length(io->bs);
    if (len < 0) {
        printf("getlength: %s\n", strerror((int)-len));
        return (int)len;
    }
    char s[64];
    qk_io_cvtstr((double)len, s, sizeof(s));
    printf("%s\n", s);
    return 0;
}

static int coroutine_fn info_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    QkImageInfo info;
    qk_block_get_info(io->bs, &info);
    uint64_t vmstate = 0;
    if (info.qcow2_version && info.cluster_size) {
        /* The VM state lives past the last L1 entry the disk needs. */
        uint64_t reach = (uint64_t)info.cluster_size * (info.cluster_size / (info.extended_l2 ? 16 : 8));
        vmstate = (info.virtual_size + reach - 1) / reach * reach;
    }
    char cs[64], vs[64];
    qk_io_cvtstr((double)info.cluster_size, cs, sizeof(cs));
    qk_io_cvtstr((double)vmstate, vs, sizeof(vs));
    printf("format name: %s\n", info.format);
    printf("cluster size: %s\n", cs);
    printf("vm state offset: %s\n", vs);
    qk_tool_print_format_specific(&info);
    return 0;
}

const QkIoCmd qk_io_status_cmds[] = {
    {"map", NULL, 0, 0, "", "prints the allocation state of the whole image", map_f},
    {"alloc", NULL, 1, 2, "offset [count]", "checks if offset is allocated in the file", alloc_f},
    {"length", "l", 0, 0, "", "gets the length of the current file", length_f},
    {"info", "i", 0, 0, "", "prints information about the current file", info_f},
    {NULL, NULL, 0, 0, NULL, NULL, NULL},
};
