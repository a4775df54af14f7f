/*
 * QkIov operations and aligned buffers.
 */
#include "util/iov.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void qk_iov_init(QkIov *q, int hint)
{
    q->niov = 0;
    q->size = 0;
    if (hint <= 1) {
        q->iov = q->local;
        q->nalloc = 1;
    } else {
        q->iov = malloc(sizeof(struct iovec) * hint);
        q->nalloc = q->iov ? hint : 0;
        if (!q->iov) {
            q->iov = q->local;
            q->nalloc = 1;
        }
    }
}

void qk_iov_init_buf(QkIov *q, void *buf, size_t len)
{
    qk_iov_init(q, 1);
    qk_iov_add(q, buf, len);
}

void qk_iov_add(QkIov *q, void *base, size_t len)
{
    if (len == 0) {
        return;
    }
    if (q->niov > 0) {
        struct iovec *last = &q->iov[q->niov - 1];
        if ((char *)last->iov_base + last->iov_len == (char *)base) {
            last->iov_len += len;
            q->size += len;
            return;
        }
    }
    if (q->niov == q->nalloc) {
        int n = q->nalloc * 2 + 4;
        struct iovec *nv;
        if (q->iov == q->local) {
            nv = malloc(sizeof(*nv) * n);
            if (nv) {
                memcpy(nv, q->local, sizeof(*nv) * q->niov);
            }
        } else {
            nv = realloc(q->iov, sizeof(*nv) * n);
        }
        if (!nv) {
            abort(); /* out of memory for a handful of iovecs: nothing sane to do */
        }
        q->iov = nv;
        q->nalloc = n;
    }
    q->iov[q->niov].iov_base = base;
    q->iov[q->niov].iov_len = len;
    q->niov++;
    q->size += len;
}

void qk_iov_concat(QkIov *q, const QkIov *src, size_t off, size_t len)
{
    for (int i = 0; i < src->niov && len > 0; i++) {
        size_t l = src->iov[i].iov_len;
        if (off >= l) {
            off -= l;
            continue;
        }
        size_t n = l - off < len ? l - off : len;
        qk_iov_add(q, (char *)src->iov[i].iov_base + off, n);
        len -= n;
        off = 0;
    }
}

void qk_iov_reset(QkIov *q)
{
    q->niov = 0;
    q->size = 0;
}

void qk_iov_destroy(QkIov *q)
{
    if (q->iov != q->local) {
        free(q->iov);
    }
    q->iov = q->local;
    q->nalloc = 1;
    q->niov = 0;
    q->size = 0;
}

static size_t walk(const QkIov *q, size_t off, size_t len, char *p, int dir, int c)
{
    size_t done = 0;
    for (int i = 0; i < q->niov && done < len; i++) {
        size_t l = q->iov[i].iov_len;
        if (off >= l) {
            off -= l;
            continue;
        }
        size_t n = l - off;
        if (n > len - done) {
            n = len - done;
        }
        char *b = (char *)q->iov[i].iov_base + off;
        switch (dir) {
        case 0: memcpy(p + done, b, n); break;
        case 1: memcpy(b, p + done, n); break;
        default: memset(b, c, n); break;
        }
        done += n;
        off = 0;
    }
    return done;
}

size_t qk_iov_to_buf(const QkIov *q, size_t off, void *buf, size_t len)
{
    return walk(q, off, len, buf, 0, 0);
}

size_t qk_iov_from_buf(const QkIov *q, size_t off, const void *buf, size_t len)
{
    return walk(q, off, len, (char *)buf, 1, 0);
}

size_t qk_iov_memset(const QkIov *q, size_t off, int c, size_t len)
{
    return walk(q, off, len, NULL, 2, c);
}

int qk_buf_is_zero(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    /* Check the head byte-wise, then compare the buffer against itself
     * shifted by 16 bytes: memcmp is vectorised and this needs no zero page. */
    size_t head = len < 16 ? len : 16;
    for (size_t i = 0; i < head; i++) {
        if (p[i]) {
            return 0;
        }
    }
    return len <= 16 || memcmp(p, p + 16, len - 16) == 0;
}

int qk_iov_is_zero(const QkIov *q, size_t off, size_t len)
{
    for (int i = 0; i < q->niov && len > 0; i++) {
        size_t l = q->iov[i].iov_len;
        if (off >= l) {
            off -= l;
            continue;
        }
        size_t n = l - off < len ? l - off : len;
        if (!qk_buf_is_zero((char *)q->iov[i].iov_base + off, n)) {
            return 0;
        }
        len -= n;
        off = 0;
    }
    return 1;
}

int qk_iov_is_aligned(const QkIov *q, size_t align)
{
    for (int i = 0; i < q->niov; i++) {
        if (((uintptr_t)q->iov[i].iov_base | q->iov[i].iov_len) & (align - 1)) {
            return 0;
        }
    }
    return 1;
}

void *qk_aligned_alloc(size_t align, size_t size)
{
    void *p = NULL;
    if (align < sizeof(void *)) {
        align = sizeof(void *);
    }
    if (posix_memalign(&p, align, size ? size : align) != 0) {
        return NULL;
    }
    return p;
}

/* A direct request is made of the buffer's physically contiguous runs:
 * on 4 KiB pages scattered in memory the kernel splits a 2 MiB read into
 * requests of half a megabyte or so, which this machine's disk served
 * many times slower (convert of a 1 GiB qcow2 with -T none -t none: 0.49
 * to 0.81 MiB per request, 1.73-2.31 s; in huge pages 1.7-1.8 MiB per
 * request, 0.95-1.03 s; 2026-12-05). The advice is only that: without
 * huge pages the buffer works the same. */
void *qk_io_buf_alloc(size_t align, size_t size)
{
    if (size < QK_IO_BUF_HUGE) {
        return qk_aligned_alloc(align, size);
    }
    size_t len = (size + QK_IO_BUF_HUGE - 1) & ~((size_t)QK_IO_BUF_HUGE - 1);
    void *p = qk_aligned_alloc(align > QK_IO_BUF_HUGE ? align : QK_IO_BUF_HUGE, len);
    if (p) {
        (void)madvise(p, len, MADV_HUGEPAGE);
    }
    return p;
}

void *qk_aligned_zalloc(size_t align, size_t size)
{
    void *p = qk_aligned_alloc(align, size);
    if (p) {
        memset(p, 0, size);
    }
    return p;
}
