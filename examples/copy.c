/*
 * copy: copies the virtual disk of one image into another with the
 * synchronous API (libqcowkit). The destination must exist and be at
 * least as large (create it with `qcowkit create` or qemu-img).
 *
 *   cc copy.c $(pkg-config --cflags --libs qcowkit) -o copy
 *   ./copy SRC DST
 */
#include <errno.h>
#include <qcowkit/qcowkit.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SRC DST\n", argv[0]);
        return 2;
    }
    char msg[512];
    QkImage *src = qk_image_open(argv[1], NULL, 0, msg, sizeof(msg));
    if (!src) {
        fprintf(stderr, "%s\n", msg);
        return 1;
    }
    QkImage *dst = qk_image_open(argv[2], NULL, QK_IMAGE_RDWR, msg, sizeof(msg));
    if (!dst) {
        fprintf(stderr, "%s\n", msg);
        qk_image_close(src);
        return 1;
    }
    uint64_t size = qk_image_size(src);
    int r = size > qk_image_size(dst) ? -EFBIG : 0;
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    r = r == 0 && !buf ? -ENOMEM : r;
    for (uint64_t off = 0; r == 0 && off < size; off += CHUNK) {
        size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        r = qk_image_pread(src, off, buf, n);
        if (r == 0) {
            r = qk_image_pwrite(dst, off, buf, n);
        }
    }
    if (r == 0) {
        r = qk_image_flush(dst);
    }
    free(buf);
    qk_image_close(src);
    /* The close writes back what is cached: its error means lost data. */
    int cr = qk_image_close(dst);
    r = r == 0 ? cr : r;
    if (r < 0) {
        fprintf(stderr, "copy failed: %s\n", qk_strerror(r));
        return 1;
    }
    printf("copied %llu bytes with libqcowkit %s\n", (unsigned long long)size, qk_version());
    return 0;
}
