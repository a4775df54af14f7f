/*
 * The public, synchronous API (include/qcowkit/qcowkit.h) on top of the
 * block layer: each call runs one coroutine to completion on this thread's
 * loop.
 */
#include "qcowkit/qcowkit.h"
#include "aio/loop.h"
#include "block/api_int.h"
#include "block/block.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct QkImage {
    QkBlock *bs;
    QkVmStateStream *stream;
};

QkImage *qk_image_open(const char *filename, const char *format, int flags,
                       char *errbuf, size_t errlen)
{
    QkError err = {0};
    QkOpenOptions o = {.format = format};
    if (!filename || (flags & ~(QK_IMAGE_RDWR | QK_IMAGE_NOCACHE))) {
        if (errbuf && errlen) {
            snprintf(errbuf, errlen, filename ? "unknown flags %#x" : "no file name given",
                     (unsigned)(flags & ~(QK_IMAGE_RDWR | QK_IMAGE_NOCACHE)));
        }
        return NULL;
    }
    QkLoop *loop;
    int lr = qk_loop_try_get(&loop);
    if (lr < 0) {
        /* Out of descriptors or threads: an error, not an abort later. */
        if (errbuf && errlen) {
            snprintf(errbuf, errlen, "Could not set up an event loop: %s", strerror(-lr));
        }
        return NULL;
    }
    if (flags & QK_IMAGE_RDWR) {
        o.flags |= QK_OPEN_RDWR;
    }
    if (flags & QK_IMAGE_NOCACHE) {
        o.flags |= QK_OPEN_NOCACHE;
    }
    QkBlock *bs = qk_block_open(filename, &o, &err);
    if (!bs) {
        if (errbuf && errlen) {
            snprintf(errbuf, errlen, "%s", err.msg);
        }
        return NULL;
    }
    QkImage *img = malloc(sizeof(*img));
    if (!img) {
        qk_block_close(bs);
        if (errbuf && errlen) {
            snprintf(errbuf, errlen, "out of memory");
        }
        return NULL;
    }
    img->bs = bs;
    img->stream = NULL;
    return img;
}

int qk_image_close(QkImage *img)
{
    int r = 0;
    if (img) {
        if (img->stream) {
            qk_image_vmstate_stream_abandon(img->stream);
        }
        r = qk_block_close(img->bs);
        free(img);
    }
    return r;
}

QkBlock *qk_image_node(QkImage *img)
{
    return img->bs;
}

QkVmStateStream **qk_image_stream_slot(QkImage *img)
{
    return &img->stream;
}

uint64_t qk_image_size(const QkImage *img)
{
    if (!img) {
        return 0;
    }
    int64_t len = qk_block_length(img->bs);
    return len < 0 ? 0 : (uint64_t)len;
}

typedef enum { OP_READ, OP_WRITE, OP_ZERO, OP_DISCARD, OP_FLUSH } Op;

typedef struct Call {
    QkImage *img;
    Op op;
    uint64_t off, len;
    void *buf;
    int flags;
    int ret;
} Call;

static void coroutine_fn call_entry(void *opaque)
{
    Call *c = opaque;
    QkBlock *bs = c->img->bs;
    switch (c->op) {
    case OP_READ: c->ret = qk_co_pread(bs, c->off, c->len, c->buf, 0); break;
    case OP_WRITE: c->ret = qk_co_pwrite(bs, c->off, c->len, c->buf, 0); break;
    case OP_ZERO: c->ret = qk_co_pwrite_zeroes(bs, c->off, c->len, c->flags); break;
    case OP_DISCARD: c->ret = qk_co_pdiscard(bs, c->off, c->len); break;
    case OP_FLUSH: c->ret = qk_co_flush(bs); break;
    }
    c->ret = qk_api_error(bs, c->ret);
}

static int run(Call c)
{
    if (!c.img) {
        return -EINVAL;
    }
    QkLoop *loop;
    int lr = qk_loop_try_get(&loop); /* another thread's first call */
    if (lr < 0) {
        return lr;
    }
    qk_co_run(call_entry, &c);
    return c.ret;
}

int qk_image_pread(QkImage *img, uint64_t off, void *buf, size_t len)
{
    return run((Call){img, OP_READ, off, len, buf, 0, 0});
}

int qk_image_pwrite(QkImage *img, uint64_t off, const void *buf, size_t len)
{
    return run((Call){img, OP_WRITE, off, len, (void *)buf, 0, 0});
}

int qk_image_zero(QkImage *img, uint64_t off, uint64_t len, int unmap)
{
    return run((Call){img, OP_ZERO, off, len, NULL, unmap ? QK_REQ_MAY_UNMAP : 0, 0});
}

int qk_image_discard(QkImage *img, uint64_t off, uint64_t len)
{
    return run((Call){img, OP_DISCARD, off, len, NULL, 0, 0});
}

int qk_image_flush(QkImage *img)
{
    return run((Call){img, OP_FLUSH, 0, 0, NULL, 0, 0});
}
