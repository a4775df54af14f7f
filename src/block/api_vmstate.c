/*
 * The public VM-state API (include/qcowkit/qcowkit.h): a hypervisor's
 * savevm/loadvm on top of the block layer's buffered writer and reader and
 * its snapshot calls. Each call runs one coroutine on this thread's loop;
 * buffer writes stay in flight between calls.
 */
#include "block/api_int.h"
#include "aio/loop.h"
#include "block/snapshot.h"
#include "block/vmstate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct QkVmStateStream {
    QkImage *img;               /* its node: qk_image_node(img) */
    QkVmStateWriter *w;
    QkVmStateReader *r;
    uint64_t pos;
    uint64_t size;
    int error;
};

typedef struct Call {
    QkVmStateStream *s;
    const void *cbuf;
    void *buf;
    size_t len;
    const char *name;
    QkError err;
    int64_t ret;
} Call;

static void set_err(char *errbuf, size_t errlen, const char *msg)
{
    if (errbuf && errlen) {
        snprintf(errbuf, errlen, "%s", msg);
    }
}

static void fill_opts(QkBlock *bs, const QkVmStateParams *p, QkVmStateOptions *o)
{
    QkImageInfo info = {0};
    qk_block_get_info(bs, &info);
    memset(o, 0, sizeof(*o));
    o->cluster_size = info.cluster_size;
    if (p) {
        o->workers = p->workers;
        o->buf_size = p->buf_size;
        o->unbuffered = p->unbuffered != 0;
    }
}

static void coroutine_fn discard_entry(void *opaque)
{
    Call *c = opaque;
    c->ret = qk_co_vmstate_discard(qk_image_node(c->s->img), &c->err);
}

/* A stream on an image whose format keeps snapshots, or NULL with a message. */
static QkVmStateStream *stream_new(QkImage *img, char *errbuf, size_t errlen)
{
    if (!img) {
        set_err(errbuf, errlen, "no image given");
        return NULL;
    }
    if (*qk_image_stream_slot(img)) {
        /* Both would use the same VM-state area of the active disk. */
        set_err(errbuf, errlen, "a VM-state stream is already open on this image");
        return NULL;
    }
    QkBlock *bs = qk_image_node(img);
    if (!qk_block_has_snapshots(bs)) {
        set_err(errbuf, errlen, "VM state needs an image format with internal snapshots, such as qcow2");
        return NULL;
    }
    QkVmStateStream *s = calloc(1, sizeof(*s));
    if (!s) {
        set_err(errbuf, errlen, "out of memory");
        return NULL;
    }
    s->img = img;
    return s;
}

/* Frees S and frees its image's slot for another stream. */
static void stream_free(QkVmStateStream *s)
{
    if (*qk_image_stream_slot(s->img) == s) {
        *qk_image_stream_slot(s->img) = NULL;
    }
    free(s);
}

QkVmStateStream *qk_image_vmstate_writer_open(QkImage *img, const QkVmStateParams *params,
                                              char *errbuf, size_t errlen)
{
    QkVmStateStream *s = stream_new(img, errbuf, errlen);
    if (!s) {
        return NULL;
    }
    QkBlock *bs = qk_image_node(s->img);
    /* State left by an applied snapshot or a failed save must not leak
     * into this one. */
    Call c = {.s = s};
    qk_co_run(discard_entry, &c);
    QkVmStateOptions o;
    fill_opts(bs, params, &o);
    s->w = c.ret == 0 ? qk_vmstate_writer_new(bs, &o, NULL) : NULL;
    if (!s->w) {
        char m[sizeof(c.err.msg) + 64];
        snprintf(m, sizeof(m), "Could not start saving the VM state: %s",
                 c.ret < 0 ? c.err.msg : "out of memory");
        set_err(errbuf, errlen, m);
        free(s);
        return NULL;
    }
    *qk_image_stream_slot(img) = s;
    return s;
}

static void coroutine_fn write_entry(void *opaque)
{
    Call *c = opaque;
    c->ret = qk_vmstate_write(c->s->w, c->s->pos, c->cbuf, c->len);
}

int qk_image_vmstate_write(QkVmStateStream *w, const void *buf, size_t len)
{
    if (!w || !w->w) {
        return -EINVAL; /* not a writer */
    }
    if (w->error) {
        return w->error;
    }
    Call c = {.s = w, .cbuf = buf, .len = len};
    qk_co_run(write_entry, &c);
    w->pos += len;
    if (c.ret < 0) {
        w->error = (int)c.ret;
    }
    return (int)c.ret;
}

static void coroutine_fn close_entry(void *opaque)
{
    Call *c = opaque;
    QkVmStateStream *s = c->s;
    int r = qk_vmstate_writer_flush(s->w);
    if (r < 0) {
        qk_error_set_errno(&c->err, r, "Could not save the VM state");
    } else if (c->name) {
        QkSnapshotInfo info = {.name = (char *)c->name, .vm_state_size = s->pos, .icount = -1};
        r = qk_co_snapshot_create(qk_image_node(s->img), &info, &c->err);
    }
    QkError e2 = {0};
    int dr = qk_co_vmstate_discard(qk_image_node(s->img), &e2);
    if (r == 0 && dr < 0) {
        r = dr;
        c->err = e2;
    }
    c->ret = r;
}

int qk_image_vmstate_writer_close(QkVmStateStream *w, const char *name, char *errbuf, size_t errlen)
{
    if (!w || !w->w) {
        set_err(errbuf, errlen, "not a VM-state writer");
        return -EINVAL;
    }
    Call c = {.s = w, .name = name};
    qk_co_run(close_entry, &c);
    if (c.ret < 0) {
        set_err(errbuf, errlen, c.err.msg);
    }
    qk_vmstate_writer_free(w->w);
    stream_free(w);
    return (int)c.ret;
}

uint64_t qk_image_vmstate_peak_memory(const QkVmStateStream *s)
{
    return s && s->w ? qk_vmstate_writer_peak_memory(s->w) : 0;
}

static void coroutine_fn goto_entry(void *opaque)
{
    Call *c = opaque;
    c->ret = qk_co_snapshot_goto(qk_image_node(c->s->img), c->name, &c->s->size, &c->err);
}

QkVmStateStream *qk_image_vmstate_reader_open(QkImage *img, const char *snapshot,
                                              const QkVmStateParams *params, uint64_t *size,
                                              char *errbuf, size_t errlen)
{
    if (!snapshot || !size) {
        /* A NULL name must never pick a snapshot to revert to. */
        set_err(errbuf, errlen, !snapshot ? "no snapshot named" : "no place for the state's size");
        return NULL;
    }
    QkVmStateStream *s = stream_new(img, errbuf, errlen);
    if (!s) {
        return NULL;
    }
    QkBlock *bs = qk_image_node(s->img);
    Call c = {.s = s, .name = snapshot};
    qk_co_run(goto_entry, &c);
    QkVmStateOptions o;
    fill_opts(bs, params, &o);
    s->r = c.ret == 0 ? qk_vmstate_reader_new(bs, s->size, &o, NULL) : NULL;
    if (!s->r) {
        char m[sizeof(c.err.msg) + 256];
        snprintf(m, sizeof(m), "Could not load the VM state of snapshot '%.200s': %s", snapshot,
                 c.ret < 0 ? c.err.msg : "out of memory");
        set_err(errbuf, errlen, m);
        free(s);
        return NULL;
    }
    *qk_image_stream_slot(img) = s;
    *size = s->size;
    return s;
}

static void coroutine_fn read_entry(void *opaque)
{
    Call *c = opaque;
    c->ret = qk_vmstate_read(c->s->r, c->s->pos, c->buf, c->len);
}

int64_t qk_image_vmstate_read(QkVmStateStream *r, void *buf, size_t len)
{
    if (!r || !r->r) {
        return -EINVAL; /* not a reader */
    }
    Call c = {.s = r, .buf = buf, .len = len};
    qk_co_run(read_entry, &c);
    if (c.ret > 0) {
        r->pos += (uint64_t)c.ret;
    }
    return c.ret;
}

static void coroutine_fn reader_close_entry(void *opaque)
{
    Call *c = opaque;
    qk_vmstate_reader_close(c->s->r);
    c->ret = qk_co_vmstate_discard(qk_image_node(c->s->img), &c->err);
}

void qk_image_vmstate_reader_close(QkVmStateStream *r)
{
    if (!r || !r->r) {
        return; /* nothing, or a writer: qk_image_vmstate_writer_close's */
    }
    Call c = {.s = r};
    qk_co_run(reader_close_entry, &c);
    stream_free(r);
}

void qk_image_vmstate_stream_abandon(QkVmStateStream *s)
{
    if (s->w) {
        /* No snapshot: the state written so far is dropped. */
        qk_image_vmstate_writer_close(s, NULL, NULL, 0);
    } else {
        qk_image_vmstate_reader_close(s);
    }
}
