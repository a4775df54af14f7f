/*
 * Data commands of the io interpreter: read, write, their aio_ forms,
 * aio_flush, discard and flush. Synchronous commands run in the
 * interpreter's coroutine; an aio_ command gets a coroutine of its own and
 * reports when it completes, in completion order, as qemu-io does.
 */
#include "io/io.h"
#include "common/checked.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct IoReq {
    QkIo *io;
    const QkIoCmd *cmd;
    bool write;
    bool zero;
    bool quiet;
    bool verbose;
    bool aio;
    int flags;            /* QK_REQ_* */
    int pattern;          /* -1: none */
    int64_t offset;
    int64_t count;
    uint8_t *buf;
} IoReq;

/* Parses "[options] off len" into r. Returns 0 or -EINVAL (already reported). */
static int parse_rw(IoReq *r, int argc, char **argv)
{
    const char *optstr = r->write ? "P:s:zufnqc" : "P:qv";
    const char *src_file = NULL;
    bool need_z_u = false, need_z_n = false, compressed = false;
    int c;
    while ((c = getopt(argc, argv, optstr)) != -1) {
        switch (c) {
        case 'P':
            r->pattern = qk_io_parse_pattern(optarg);
            if (r->pattern < 0) {
                return -EINVAL;
            }
            break;
        case 's': src_file = optarg; break;
        case 'z': r->zero = true; break;
        case 'u': r->flags |= QK_REQ_MAY_UNMAP; need_z_u = true; break;
        case 'n': r->flags |= QK_REQ_NO_FALLBACK; need_z_n = true; break;
        case 'f': r->flags |= QK_REQ_FUA; break;
        case 'c': compressed = true; break;
        case 'q': r->quiet = true; break;
        case 'v': r->verbose = true; break;
        default:
            qk_io_usage(r->cmd);
            return -EINVAL;
        }
    }
    if (optind != argc - 2) {
        qk_io_usage(r->cmd);
        return -EINVAL;
    }
    if ((r->zero ? 1 : 0) + (r->pattern >= 0 ? 1 : 0) + (src_file ? 1 : 0) > 1) {
        printf("Only one of -z, -P, and -s can be specified at the same time\n");
        return -EINVAL;
    }
    if (compressed && (r->flags & QK_REQ_FUA)) {
        printf("-f and -b or -c cannot be specified at the same time\n");
        return -EINVAL;
    }
    if (compressed && !r->zero) {
        r->flags |= QK_REQ_COMPRESSED; /* a zero write ignores -c, as qemu-io's does */
    }
    if (need_z_u && !r->zero) {
        printf("-u requires -z to be specified\n");
        return -EINVAL;
    }
    if (need_z_n && !r->zero) {
        printf("-n requires -z to be specified\n");
        return -EINVAL;
    }
    r->offset = qk_io_cvtnum(argv[optind]);
    if (r->offset < 0) {
        return -EINVAL;
    }
    r->count = qk_io_cvtnum(argv[optind + 1]);
    if (r->count < 0) {
        return -EINVAL;
    }
    if (r->count > QK_IO_MAX_BYTES && !r->zero) {
        printf("length cannot exceed %lld, given %s\n", QK_IO_MAX_BYTES, argv[optind + 1]);
        return -EINVAL;
    }
    if (!r->zero) {
        size_t align = qk_block_mem_alignment(r->io->bs) ? qk_block_mem_alignment(r->io->bs) : 1;
        r->buf = qk_aligned_alloc(align < 512 ? 512 : align, r->count ? (size_t)r->count : 1);
        if (!r->buf) {
            printf("%s failed: %s\n", r->cmd->name, strerror(ENOMEM));
            return -ENOMEM;
        }
        /* Unread bytes show up as 0xab; unpatterned writes carry 0xcd. */
        memset(r->buf, r->write ? (r->pattern >= 0 ? r->pattern : 0xcd) : 0xab, (size_t)r->count);
        if (src_file) {
            /* -s: the data comes from a file, repeated to fill the
             * request when it is shorter, as qemu-io repeats it. */
            FILE *f = fopen(src_file, "rb");
            if (!f) {
                fprintf(stderr, "%s: %s\n", src_file, strerror(errno));
                return -errno;
            }
            size_t got = fread(r->buf, 1, (size_t)r->count, f);
            if (got < (size_t)r->count && ferror(f)) {
                fprintf(stderr, "%s: %s\n", src_file, strerror(EIO));
                fclose(f);
                return -EIO;
            }
            fclose(f);
            if (got == 0 && r->count) {
                fprintf(stderr, "%s: file is empty\n", src_file);
                return -EINVAL;
            }
            for (size_t done = got; done < (size_t)r->count; done += got) {
                size_t n = QK_MIN(got, (size_t)r->count - done);
                memcpy(r->buf + done, r->buf, n);
            }
        }
    }
    return 0;
}

static int coroutine_fn do_rw(IoReq *r)
{
    QkBlock *bs = r->io->bs;
    int64_t len = qk_block_length(bs);
    int64_t t0 = qk_clock_ns();
    int ret;
    if (len < 0) {
        ret = (int)len;
    } else if (!qk_range_within((uint64_t)r->offset, (uint64_t)r->count, (uint64_t)len)) {
        ret = -EIO;   /* what qemu-io reports for requests past the end */
    } else if (r->count == 0) {
        ret = 0;
    } else if (r->zero) {
        ret = qk_co_pwrite_zeroes(bs, (uint64_t)r->offset, (uint64_t)r->count, r->flags);
    } else if (r->write) {
        ret = qk_co_pwrite(bs, (uint64_t)r->offset, (uint64_t)r->count, r->buf, r->flags);
    } else {
        ret = qk_co_pread(bs, (uint64_t)r->offset, (uint64_t)r->count, r->buf, 0);
    }
    int64_t t1 = qk_clock_ns();
    if (ret < 0) {
        const char *what = r->aio ? (r->write ? "aio_write" : "readv") : r->cmd->name;
        printf("%s failed: %s\n", what, strerror(-ret));
        return ret;
    }
    if (!r->write && r->pattern >= 0) {
        for (int64_t i = 0; i < r->count; i++) {
            if (r->buf[i] != (uint8_t)r->pattern) {
                printf("Pattern verification failed at offset %lld, %lld bytes\n",
                       (long long)r->offset, (long long)r->count);
                ret = -EINVAL;
                break;
            }
        }
    }
    if (r->verbose) {
        qk_io_dump(r->buf, r->offset, r->count);
    }
    if (!r->quiet) {
        qk_io_report(r->write ? "wrote" : "read", t0, t1, r->offset, r->count, r->count, 1);
    }
    return ret;
}

static void free_req(IoReq *r)
{
    free(r->buf);
    free(r);
}

static int coroutine_fn rw_sync(QkIo *io, int argc, char **argv, bool write)
{
    IoReq r = {.io = io, .cmd = qk_io_find(argv[0]), .write = write, .pattern = -1};
    int ret = parse_rw(&r, argc, argv);
    if (ret == 0) {
        ret = do_rw(&r);
    }
    free(r.buf);
    return ret;
}

static int coroutine_fn read_f(QkIo *io, int argc, char **argv)
{
    return rw_sync(io, argc, argv, false);
}

static int coroutine_fn write_f(QkIo *io, int argc, char **argv)
{
    return rw_sync(io, argc, argv, true);
}

/* An aio failure cannot fail the command that started it (that one has
 * already returned), so it is remembered for the exit status instead. */
static int aio_failures;

static void coroutine_fn aio_entry(void *opaque)
{
    IoReq *r = opaque;
    QkIo *io = r->io;
    if (do_rw(r) < 0) {
        aio_failures++;
    }
    fflush(stdout);
    free_req(r);
    if (--io->aio_in_flight == 0) {
        qk_co_queue_wake_all(&io->aio_idle);
    }
}

static int coroutine_fn rw_aio(QkIo *io, int argc, char **argv, bool write)
{
    IoReq *r = calloc(1, sizeof(*r));
    if (!r) {
        return -ENOMEM;
    }
    *r = (IoReq){.io = io, .cmd = qk_io_find(argv[0]), .write = write, .pattern = -1, .aio = true};
    int ret = parse_rw(r, argc, argv);
    if (ret < 0) {
        free_req(r);
        return ret;
    }
    io->aio_in_flight++;
    qk_coroutine_enter(qk_coroutine_create(aio_entry, r));
    return 0;
}

static int coroutine_fn aio_read_f(QkIo *io, int argc, char **argv)
{
    return rw_aio(io, argc, argv, false);
}

static int coroutine_fn aio_write_f(QkIo *io, int argc, char **argv)
{
    return rw_aio(io, argc, argv, true);
}

int coroutine_fn qk_io_aio_drain(QkIo *io)
{
    while (io->aio_in_flight > 0) {
        qk_co_queue_wait(&io->aio_idle);
    }
    int failed = aio_failures;
    aio_failures = 0;
    return failed ? -EIO : 0;
}

static int coroutine_fn aio_flush_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    qk_io_aio_drain(io);
    return 0;
}

static int coroutine_fn discard_f(QkIo *io, int argc, char **argv)
{
    const QkIoCmd *cmd = qk_io_find(argv[0]);
    bool quiet = false;
    int c;
    while ((c = getopt(argc, argv, "q")) != -1) {
        if (c != 'q') {
            qk_io_usage(cmd);
            return -EINVAL;
        }
        quiet = true;
    }
    if (optind != argc - 2) {
        qk_io_usage(cmd);
        return -EINVAL;
    }
    int64_t off = qk_io_cvtnum(argv[optind]);
    if (off < 0) {
        return -EINVAL;
    }
    int64_t count = qk_io_cvtnum(argv[optind + 1]);
    if (count < 0) {
        return -EINVAL;
    }
    int64_t len = qk_block_length(io->bs);
    int64_t t0 = qk_clock_ns();
    int ret = len < 0 ? (int)len
              : !qk_range_within((uint64_t)off, (uint64_t)count, (uint64_t)len) ? -EIO
              : qk_co_pdiscard(io->bs, (uint64_t)off, (uint64_t)count);
    int64_t t1 = qk_clock_ns();
    if (ret < 0) {
        printf("discard failed: %s\n", strerror(-ret));
        return ret;
    }
    if (!quiet) {
        qk_io_report("discard", t0, t1, off, count, count, 1);
    }
    return 0;
}

static int coroutine_fn flush_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    int ret = qk_co_flush(io->bs);
    if (ret < 0) {
        printf("flush failed: %s\n", strerror(-ret));
    }
    return ret;
}

/* As qemu-io's: any new size, smaller ones included (no --shrink here). */
static int coroutine_fn truncate_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    int64_t size = qk_io_cvtnum(argv[1]);
    if (size < 0) {
        printf("non-numeric truncate argument -- %s\n", argv[1]);
        return -EINVAL;
    }
    QkError err = {0};
    int ret = qk_co_truncate(io->bs, (uint64_t)size, QK_PREALLOC_OFF, &err);
    if (ret < 0) {
        printf("truncate: %s\n", err.msg[0] ? err.msg : strerror(-ret));
    }
    return ret;
}

const QkIoCmd qk_io_rw_cmds[] = {
    {"read", "r", 2, -1, "[-qv] [-P pattern] off len",
     "reads a number of bytes at a specified offset", read_f},
    {"write", "w", 2, -1, "[-cfnquz] [-P pattern | -s src_file] off len",
     "writes a number of bytes at a specified offset", write_f},
    {"aio_read", NULL, 2, -1, "[-qv] [-P pattern] off len",
     "asynchronously reads a number of bytes", aio_read_f},
    {"aio_write", NULL, 2, -1, "[-fnquz] [-P pattern] off len",
     "asynchronously writes a number of bytes", aio_write_f},
    {"aio_flush", NULL, 0, 0, "", "completes all outstanding aio requests", aio_flush_f},
    {"discard", "d", 2, -1, "[-q] off len", "discards a number of bytes at a specified offset",
     discard_f},
    {"flush", "f", 0, 0, "", "flush all in-core file state to disk", flush_f},
    {"truncate", NULL, 1, 1, "off", "truncates the current file at the given offset", truncate_f},
    {NULL, NULL, 0, 0, NULL, NULL, NULL},
};
