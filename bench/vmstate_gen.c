/*
 * VM-state benchmark driver: produces a migration-like stream (small
 * section records, then 4 KiB pages of incompressible data each behind an
 * 8-byte header, delivered in 131,328-byte pieces = 32 page records, as
 * QEMU's savevm hands them to the block layer) and either
 *   stream SIZE                      writes it to stdout, or
 *   save IMAGE NAME SIZE [opts]      saves it through the public API as
 *                                    snapshot NAME, or
 *   load IMAGE NAME [opts]           reads a snapshot's state back
 * opts: -t none|writeback, -u (unbuffered), -w WORKERS, -b BUFSIZE, -v (verify on load).
 * Prints "seconds=S bytes=N peak_buffers=M".
 */
#include "qcowkit/qcowkit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define REC (PAGE + 8)
#define PIECE (32 * REC)
#define POOL (64u << 20)

static uint8_t *pool;

static void make_pool(void)
{
    pool = malloc(POOL + PAGE);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i + 8 <= POOL + PAGE; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(pool + i, &x, 8);
    }
}

/* The stream is a pure function of the position: section records of 40
 * bytes every 1024 pages, page records otherwise. Fills one piece. */
typedef struct Gen {
    uint64_t page;
} Gen;

static size_t next_piece(Gen *g, uint8_t *buf, uint64_t remaining)
{
    size_t n = 0;
    if (g->page % 1024 == 0) {
        /* A small device section: header and a few fields, its own piece. */
        size_t len = 40;
        memset(buf, 0, len);
        buf[0] = 0x04;
        memcpy(buf + 1, &g->page, 8);
        g->page++;
        return len < remaining ? len : (size_t)remaining;
    }
    while (n + REC <= PIECE && g->page % 1024 != 0) {
        uint64_t hdr = (g->page << 12) | 0x08;
        memcpy(buf + n, &hdr, 8);
        uint64_t off = (g->page * 2654435761ULL) % (POOL / 8) * 8;
        memcpy(buf + n + 8, pool + off, PAGE);
        n += REC;
        g->page++;
    }
    return n < remaining ? n : (size_t)remaining;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: vmstate_gen stream SIZE | save IMAGE NAME SIZE [opts] | load IMAGE NAME [opts]\n");
        return 1;
    }
    make_pool();
    uint8_t *buf = malloc(PIECE);
    const char *mode = argv[1];
    if (strcmp(mode, "stream") == 0) {
        uint64_t size = strtoull(argv[2], NULL, 0), done = 0;
        Gen g = {0};
        while (done < size) {
            size_t n = next_piece(&g, buf, size - done);
            for (size_t w = 0; w < n;) {
                ssize_t r = write(1, buf + w, n - w);
                if (r < 0) {
                    return 1;
                }
                w += (size_t)r;
            }
            done += n;
        }
        return 0;
    }
    bool save = strcmp(mode, "save") == 0;
    int first_opt = save ? 5 : 4;
    if (argc < first_opt) {
        fprintf(stderr, "missing arguments\n");
        return 1;
    }
    QkVmStateParams p = {0};
    int flags = QK_IMAGE_RDWR;
    bool verify = false;
    for (int i = first_opt; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            if (strcmp(argv[++i], "none") == 0) {
                flags |= QK_IMAGE_NOCACHE;
            }
        } else if (strcmp(argv[i], "-u") == 0) {
            p.unbuffered = 1;
        } else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc) {
            p.workers = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-b") == 0 && i + 1 < argc) {
            p.buf_size = strtoull(argv[++i], NULL, 0);
        } else if (strcmp(argv[i], "-v") == 0) {
            verify = true;
        }
    }
    char err[256];
    QkImage *img = qk_image_open(argv[2], "qcow2", flags, err, sizeof(err));
    if (!img) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    double t0 = now();
    uint64_t total = 0, peak = 0;
    int ret = 0;
    if (save) {
        uint64_t size = strtoull(argv[4], NULL, 0);
        QkVmStateStream *w = qk_image_vmstate_writer_open(img, &p, err, sizeof(err));
        if (!w) {
            fprintf(stderr, "writer: %s\n", err);
            return 1;
        }
        Gen g = {0};
        while (total < size && ret == 0) {
            size_t n = next_piece(&g, buf, size - total);
            ret = qk_image_vmstate_write(w, buf, n);
            total += n;
        }
        peak = qk_image_vmstate_peak_memory(w);
        int r = qk_image_vmstate_writer_close(w, argv[3], err, sizeof(err));
        if (ret == 0 && r < 0) {
            ret = r;
        }
        if (ret < 0) {
            fprintf(stderr, "save: %s\n", err);
        }
    } else {
        uint64_t size;
        QkVmStateStream *r = qk_image_vmstate_reader_open(img, argv[3], &p, &size, err, sizeof(err));
        if (!r) {
            fprintf(stderr, "reader: %s\n", err);
            return 1;
        }
        uint8_t *want = malloc(PIECE);
        Gen g = {0};
        while (total < size) {
            size_t n = verify ? next_piece(&g, want, size - total) : PIECE;
            int64_t got = qk_image_vmstate_read(r, buf, n);
            if (got <= 0 || (verify && ((size_t)got != n || memcmp(buf, want, n) != 0))) {
                fprintf(stderr, "load: %s at %llu\n", got < 0 ? strerror((int)-got) : "mismatch",
                        (unsigned long long)total);
                ret = -EIO;
                break;
            }
            total += (uint64_t)got;
        }
        free(want);
        qk_image_vmstate_reader_close(r);
    }
    qk_image_close(img);
    double t = now() - t0;
    printf("seconds=%.3f bytes=%llu peak_buffers=%llu\n", t, (unsigned long long)total, (unsigned long long)peak);
    free(buf);
    free(pool);
    return ret < 0 ? 1 : 0;
}
