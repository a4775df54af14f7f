/*
 * async_reader: reads a whole image through the asynchronous API, with
 * up to 16 requests in flight, from a plain epoll loop that watches the
 * queue's completion descriptor (as a VMM or backup tool would from its
 * own loop), and prints a checksum of the virtual disk (64-bit FNV-1a).
 * With -i the image is inline (QK_ASYNC_INLINE): its engine runs in this
 * thread, inside qk_queue_do_io(), and no second thread is started.
 *
 *   cc async_reader.c $(pkg-config --cflags --libs qcowkit) -o async_reader
 *   ./async_reader [-i] IMAGE
 */
#include <qcowkit/qcowkit.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

enum { DEPTH = 16, CHUNK = 256 << 10 };

int main(int argc, char **argv)
{
    int flags = 0;
    if (argc == 3 && strcmp(argv[1], "-i") == 0) {
        flags = QK_ASYNC_INLINE;
        argv++;
        argc--;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s [-i] IMAGE\n", argv[0]);
        return 2;
    }
    char msg[512];
    QkAsyncImage *img = qk_async_open(argv[1], NULL, flags, 1, msg, sizeof(msg));
    if (!img) {
        fprintf(stderr, "%s\n", msg);
        return 1;
    }
    QkQueue *q = qk_async_queue(img, 0);
    uint64_t size = qk_async_size(img);
    uint64_t nchunks = (size + CHUNK - 1) / CHUNK;
    char *bufs = malloc((size_t)DEPTH * CHUNK);
    char *ready = calloc(nchunks ? nchunks : 1, 1);  /* chunks read, not yet hashed */
    uint64_t *slot_of = malloc(sizeof(uint64_t) * (nchunks ? nchunks : 1));
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    if (!bufs || !ready || !slot_of || ep < 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, qk_queue_completion_fd(q), &ev) < 0) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    /* Chunks complete in any order; they are hashed in order, so a slot
     * is reused only once its chunk is hashed. */
    int free_slots[DEPTH], nfree = DEPTH;
    for (int i = 0; i < DEPTH; i++) {
        free_slots[i] = i;
    }
    uint64_t next = 0, hashed = 0, hash = 0xcbf29ce484222325ULL;
    int ret = 0;
    while (hashed < nchunks && ret == 0) {
        while (next < nchunks && nfree) {
            int slot = free_slots[--nfree];
            uint64_t off = next * CHUNK;
            struct iovec iov = {bufs + (size_t)slot * CHUNK, size - off < CHUNK ? size - off : CHUNK};
            slot_of[next] = (uint64_t)slot;
            if (qk_queue_readv(q, off, &iov, 1, (void *)(uintptr_t)next) < 0) {
                ret = 1;
                break;
            }
            next++;
        }
        QkCompletion c[DEPTH];
        int n = qk_queue_do_io(q, c, 0, DEPTH, 0);  /* hand over, take what is there */
        if (n == 0) {
            struct epoll_event out;
            /* EINTR: a signal, or (inline, io_uring) the kernel handing
             * completions back to this thread; wait again. */
            if (epoll_wait(ep, &out, 1, -1) < 0 && errno != EINTR) {
                ret = 1;
            }
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (c[i].ret < 0) {
                fprintf(stderr, "read failed: %s\n", qk_strerror(c[i].ret));
                ret = 1;
            }
            ready[(uintptr_t)c[i].user_data] = 1;
        }
        while (hashed < nchunks && ready[hashed]) {
            uint64_t off = hashed * CHUNK;
            size_t len = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
            const unsigned char *p = (const unsigned char *)bufs + slot_of[hashed] * CHUNK;
            for (size_t k = 0; k < len; k++) {
                hash = (hash ^ p[k]) * 0x100000001b3ULL;
            }
            free_slots[nfree++] = (int)slot_of[hashed];
            hashed++;
        }
    }
    /* Collect what is still in flight before closing. */
    while (qk_queue_outstanding(q) > 0) {
        QkCompletion c[DEPTH];
        if (qk_queue_do_io(q, c, 1, DEPTH, -1) <= 0) {
            break;
        }
    }
    close(ep);
    free(bufs);
    free(ready);
    free(slot_of);
    if (qk_async_close(img) < 0) {
        ret = 1;
    }
    if (ret == 0) {
        printf("%016llx %llu\n", (unsigned long long)hash, (unsigned long long)size);
    }
    return ret;
}
