/*
 * The "rbd" protocol driver: an image in a Ceph RBD pool, through librbd.
 * Names as QEMU spells them:
 *   rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:conf=PATH][:id=USER][:KEY=VALUE...]
 * (a backslash escapes ':', '@', '/' and itself; other keys are Ceph
 * options). Requests use librbd's asynchronous calls: a completion runs on
 * a librbd thread, which queues the request and signals the node's
 * eventfd once per batch; the node's reaper coroutine then wakes the
 * requests' coroutines. What librbd offers only in blocking form
 * (connecting, opening, closing, resizing, diff iteration, creating,
 * snapshots) runs on the work pool, so the event loop never waits on the
 * cluster.
 *
 * Owns: name parsing, the cluster connection of each node, request
 * submission and completion. A dead cluster ends in an error, not a
 * hang: qcowkit bounds librados' waits (rados_mon_op_timeout,
 * rados_osd_op_timeout, client_mount_timeout) unless the name sets them.
 */
#include "block/block.h"
#include "block/rbd_int.h"
#include "aio/co_sync.h"
#include "aio/aio.h"
#include "aio/work_pool.h"
#include "common/checked.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* librados' own waits are unbounded or minutes long; these end a dead
 * cluster's requests in seconds. */
static const char *const default_timeouts[][2] = {
    {"client_mount_timeout", "15"},
    {"rados_mon_op_timeout", "15"},
    {"rados_osd_op_timeout", "30"},
};

/* A read at this offset uses the descriptor's own position (an eventfd
 * has none), see aio.c. */
#define EVENTFD_NO_OFFSET UINT64_MAX

/* A block status query looks this far ahead at most (one diff walk). */
#define STATUS_WINDOW (1ULL << 30)

static void spec_free(RbdSpec *s)
{
    free(s->pool);
    free(s->ns);
    free(s->image);
    free(s->snap);
    free(s->conf);
    free(s->user);
    for (int i = 0; i < s->nkv; i++) {
        free(s->keys[i]);
        free(s->vals[i]);
    }
    free(s->keys);
    free(s->vals);
    memset(s, 0, sizeof(*s));
}

/* Copies *p up to the first unescaped character of stops, unescaping;
 * leaves *p at that character (or the end). NULL when out of memory. */
static char *take(const char **p, const char *stops)
{
    size_t n = strlen(*p);
    char *out = malloc(n + 1), *o = out;
    if (!out) {
        return NULL;
    }
    const char *s = *p;
    while (*s && !strchr(stops, *s)) {
        if (*s == '\\' && s[1]) {
            s++;
        }
        *o++ = *s++;
    }
    *o = '\0';
    *p = s;
    return out;
}

static int spec_add_kv(RbdSpec *s, char *k, char *v)
{
    char **nk = realloc(s->keys, sizeof(char *) * (size_t)(s->nkv + 1));
    if (nk) {
        s->keys = nk;
    }
    char **nv = nk ? realloc(s->vals, sizeof(char *) * (size_t)(s->nkv + 1)) : NULL;
    if (!nv) {
        return -ENOMEM;
    }
    s->vals = nv;
    s->keys[s->nkv] = k;
    s->vals[s->nkv] = v;
    s->nkv++;
    return 0;
}

/* Parses QEMU's rbd: name into *s; -EINVAL with a message naming what
 * is wrong. */
static int spec_parse(const char *name, RbdSpec *s, QkError *err)
{
    memset(s, 0, sizeof(*s));
    if (!qk_block_is_rbd_name(name)) {
        return qk_error_set(err, -EINVAL, "'%s' is not an rbd: name", name);
    }
    const char *p = name + 4;
    char *a = take(&p, "/@:");
    if (!a) {
        goto nomem;
    }
    if (!*a || *p != '/') {
        const char *what = *a ? "an image name" : "a pool";
        free(a);
        return qk_error_set(err, -EINVAL, "rbd name '%s' lacks %s (rbd:POOL/IMAGE)", name, what);
    }
    s->pool = a;
    p++;
    char *b = take(&p, "/@:");
    if (!b) {
        goto nomem;
    }
    if (*p == '/') {
        p++;
        s->ns = b;
        b = take(&p, "@:");
        if (!b) {
            goto nomem;
        }
    }
    s->image = b;
    if (!*s->image) {
        spec_free(s);
        return qk_error_set(err, -EINVAL, "rbd name '%s' lacks an image name", name);
    }
    if (*p == '@') {
        p++;
        if (!(s->snap = take(&p, ":"))) {
            goto nomem;
        }
        if (!*s->snap) {
            spec_free(s);
            return qk_error_set(err, -EINVAL, "rbd name '%s' has an empty snapshot name", name);
        }
    }
    while (*p == ':') {
        p++;
        char *k = take(&p, "=:");
        if (!k) {
            goto nomem;
        }
        if (*p != '=' || !*k) {
            qk_error_set(err, -EINVAL, "rbd name '%s': option '%s' has no value (KEY=VALUE)", name, k);
            free(k);
            spec_free(s);
            return -EINVAL;
        }
        p++;
        char *v = take(&p, ":");
        if (!v) {
            free(k);
            goto nomem;
        }
        if (strcmp(k, "conf") == 0 || strcmp(k, "id") == 0) {
            char **slot = k[0] == 'c' ? &s->conf : &s->user;
            free(*slot);
            *slot = v;
            free(k);
        } else if (spec_add_kv(s, k, v) < 0) {
            free(k);
            free(v);
            goto nomem;
        }
    }
    return 0;
nomem:
    spec_free(s);
    return qk_error_set(err, -ENOMEM, "out of memory");
}

/* ---- Blocking work, run on the work pool ---- */

typedef struct Connect {
    const RbdSpec *spec;
    bool open_image;
    bool read_only;
    rados_t cluster;
    rados_ioctx_t io;
    rbd_image_t image;
    int r;
    QkError err;
} Connect;

static bool spec_has_key(const RbdSpec *s, const char *key)
{
    for (int i = 0; i < s->nkv; i++) {
        if (strcmp(s->keys[i], key) == 0) {
            return true;
        }
    }
    return false;
}

static void connect_work(void *opaque)
{
    Connect *c = opaque;
    const RbdSpec *s = c->spec;
    /* Here, on a worker's full-size stack: loading runs librbd's C++
     * static constructors, too deep for a coroutine's stack. */
    int r = qk_rbd_lib_load(&c->err);
    if (r < 0) {
        c->r = r;
        return;
    }
    r = RBD(rados_create)(&c->cluster, s->user);
    if (r < 0) {
        qk_error_set(&c->err, r, "error initializing: %s", strerror(-r));
        c->cluster = NULL;
        goto out;
    }
    /* No file is no error: the options may name the monitors. */
    r = RBD(rados_conf_read_file)(c->cluster, s->conf);
    if (r < 0 && s->conf) {
        qk_error_set(&c->err, r, "error reading conf file %s: %s", s->conf, strerror(-r));
        goto out;
    }
    for (size_t i = 0; i < QK_ARRAY_SIZE(default_timeouts); i++) {
        if (!spec_has_key(s, default_timeouts[i][0])) {
            RBD(rados_conf_set)(c->cluster, default_timeouts[i][0], default_timeouts[i][1]);
        }
    }
    /* No librbd cache, whatever the cache mode: once a dead OSD times
     * its writeback out, librbd's cache retries it for good, so requests
     * hang instead of failing (measured: a writer still blocked 116 s
     * after its OSD was killed, with rados_osd_op_timeout at 5 s). Every
     * request then goes to the OSDs, as QEMU's cache=none does. A name
     * can still ask for it (:rbd_cache=true). */
    if (!spec_has_key(s, "rbd_cache")) {
        RBD(rados_conf_set)(c->cluster, "rbd_cache", "false");
    }
    for (int i = 0; i < s->nkv; i++) {
        r = RBD(rados_conf_set)(c->cluster, s->keys[i], s->vals[i]);
        if (r < 0) {
            qk_error_set(&c->err, r, "invalid conf option %s: %s", s->keys[i], strerror(-r));
            goto out;
        }
    }
    r = RBD(rados_connect)(c->cluster);
    if (r < 0) {
        qk_error_set(&c->err, r, "error connecting: %s", strerror(-r));
        goto out;
    }
    r = RBD(rados_ioctx_create)(c->cluster, s->pool, &c->io);
    if (r < 0) {
        qk_error_set(&c->err, r, "error opening pool %s: %s", s->pool, strerror(-r));
        c->io = NULL;
        goto out;
    }
    if (s->ns) {
        RBD(rados_ioctx_set_namespace)(c->io, s->ns);
    }
    if (c->open_image) {
        r = c->read_only ? RBD(rbd_open_read_only)(c->io, s->image, &c->image, s->snap)
                         : RBD(rbd_open)(c->io, s->image, &c->image, s->snap);
        if (r < 0) {
            qk_error_set(&c->err, r, "error reading header from %s: %s", s->image, strerror(-r));
            c->image = NULL;
            goto out;
        }
    }
out:
    c->r = r < 0 ? r : 0;
    if (c->r < 0) {
        if (c->io) {
            RBD(rados_ioctx_destroy)(c->io);
            c->io = NULL;
        }
        if (c->cluster) {
            RBD(rados_shutdown)(c->cluster);
            c->cluster = NULL;
        }
    }
}

typedef struct Disconnect {
    rados_t cluster;
    rados_ioctx_t io;
    rbd_image_t image;
    int r;
} Disconnect;

static void disconnect_work(void *opaque)
{
    Disconnect *d = opaque;
    d->r = 0;
    if (d->image) {
        d->r = RBD(rbd_close)(d->image);
    }
    if (d->io) {
        RBD(rados_ioctx_destroy)(d->io);
    }
    if (d->cluster) {
        RBD(rados_shutdown)(d->cluster);
    }
}

static int coroutine_fn connect_spec(const RbdSpec *spec, bool open_image, int flags, Connect *c,
                                     QkError *err)
{
    *c = (Connect){.spec = spec, .open_image = open_image, .read_only = !(flags & QK_OPEN_RDWR)};
    qk_co_run_in_thread(connect_work, c);
    if (c->r < 0 && err) {
        *err = c->err;
    }
    return c->r;
}

static void coroutine_fn reaper_entry(void *opaque);

static int coroutine_fn rbd_co_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    RbdState *s = bs->opaque;
    int r = spec_parse(bs->filename, &s->spec, err);
    if (r < 0) {
        return r;
    }
    bool read_only = !(opts->flags & QK_OPEN_RDWR);
    if (s->spec.snap && !read_only) {
        spec_free(&s->spec);
        return qk_error_set(err, -EROFS, "'%s' is a snapshot: it can only be opened read-only", bs->filename);
    }
    /* The completion eventfd first: nothing to undo on the cluster if
     * there is none to be had. */
    s->efd = eventfd(0, EFD_CLOEXEC);
    if (s->efd < 0) {
        r = -errno;
        spec_free(&s->spec);
        return qk_error_set_errno(err, r, "Could not open '%s'", bs->filename);
    }
    Connect c;
    r = connect_spec(&s->spec, true, opts->flags, &c, err);
    if (r < 0) {
        close(s->efd);
        spec_free(&s->spec);
        return r;
    }
    s->cluster = c.cluster;
    s->io = c.io;
    s->image = c.image;
    uint64_t features = 0, flags = 0;
    r = RBD(rbd_get_size)(s->image, &s->size);
    if (r < 0) {
        Disconnect d = {.cluster = s->cluster, .io = s->io, .image = s->image};
        qk_co_run_in_thread(disconnect_work, &d);
        close(s->efd);
        spec_free(&s->spec);
        return qk_error_set(err, r, "error getting the size of %s: %s", bs->filename, strerror(-r));
    }
    if (RBD(rbd_get_features)(s->image, &features) == 0 && RBD(rbd_get_flags)(s->image, &flags) == 0) {
        s->fast_diff = (features & RBD_FEATURE_FAST_DIFF) && !(flags & RBD_FLAG_FAST_DIFF_INVALID);
    }
    pthread_mutex_init(&s->lock, NULL);
    qk_co_mutex_init(&s->grow_lock);
    qk_co_queue_init(&s->reaper_gone);
    s->reaper_running = true;
    qk_coroutine_wake(qk_coroutine_create(reaper_entry, s));
    bs->size = s->size;
    bs->read_only = read_only;
    bs->request_alignment = 1;
    return 0;
}

static int coroutine_fn rbd_co_close(QkBlock *bs)
{
    RbdState *s = bs->opaque;
    Disconnect d = {.cluster = s->cluster, .io = s->io, .image = s->image};
    if (!d.cluster) {
        return 0;
    }
    /* Nothing is in flight (the block layer drained the node): stop the
     * reaper, then let go of the cluster. */
    s->closing = true;
    uint64_t one = 1;
    while (write(s->efd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    while (s->reaper_running) {
        qk_co_queue_wait(&s->reaper_gone);
    }
    qk_co_run_in_thread(disconnect_work, &d);
    close(s->efd);
    pthread_mutex_destroy(&s->lock);
    spec_free(&s->spec);
    s->cluster = NULL;
    return d.r;
}

/* ---- Asynchronous requests ---- */

typedef struct RbdReq {
    QkCoroutine *co;
    ssize_t ret;
    bool finished;
    struct RbdReq *next;
} RbdReq;

typedef struct Completion {
    RbdState *s;
    RbdReq *req;
} Completion;

/* On a librbd thread: queue the request for the reaper; one eventfd
 * write per batch, not per request. */
static void req_done(rbd_completion_t c, void *arg)
{
    RbdState *s = ((Completion *)arg)->s;
    RbdReq *req = ((Completion *)arg)->req;
    req->ret = RBD(rbd_aio_get_return_value)(c);
    RBD(rbd_aio_release)(c);
    free(arg);
    pthread_mutex_lock(&s->lock);
    req->next = s->done;
    s->done = req;
    bool wake = !s->signalled;
    s->signalled = true;
    pthread_mutex_unlock(&s->lock);
    if (wake) {
        uint64_t one = 1;
        while (write(s->efd, &one, sizeof(one)) < 0 && errno == EINTR) {
        }
    }
}

/* The node's reaper: runs from open to close, waking the coroutines of
 * finished requests. Its wait is a read of the eventfd through the
 * loop's backend (on io_uring, no system call of its own). */
static void coroutine_fn reaper_entry(void *opaque)
{
    RbdState *s = opaque;
    while (!s->closing) {
        uint64_t v;
        struct iovec iov = {.iov_base = &v, .iov_len = sizeof(v)};
        ssize_t n = qk_co_host_preadv(s->efd, &iov, 1, EVENTFD_NO_OFFSET);
        if (n < 0 && n != -EINTR && n != -EAGAIN) {
            break; /* cannot happen on a valid eventfd */
        }
        /* A completion queued after this drain writes again (signalled
         * is false by then), so none waits unseen. */
        pthread_mutex_lock(&s->lock);
        RbdReq *list = s->done;
        s->done = NULL;
        s->signalled = false;
        pthread_mutex_unlock(&s->lock);
        for (RbdReq *r = list, *next; r; r = next) {
            next = r->next;
            r->finished = true;
            qk_coroutine_wake(r->co);
        }
    }
    s->reaper_running = false;
    qk_co_queue_wake_all(&s->reaper_gone);
}

typedef enum { OP_READ, OP_WRITE, OP_ZERO, OP_DISCARD, OP_FLUSH } RbdOp;

static ssize_t coroutine_fn rbd_request(RbdState *s, RbdOp op, uint64_t off, uint64_t bytes, QkIov *qiov,
                                        size_t qiov_off)
{
    RbdReq req = {.co = qk_coroutine_self()};
    Completion *cp = malloc(sizeof(*cp));
    if (!cp) {
        return -ENOMEM;
    }
    *cp = (Completion){.s = s, .req = &req};
    rbd_completion_t c;
    int r = RBD(rbd_aio_create_completion)(cp, req_done, &c);
    if (r < 0) {
        free(cp);
        return r;
    }
    /* The caller's vector as it is when it covers the request exactly
     * (the common case), else a view of the part. */
    QkIov view;
    const struct iovec *iov = NULL;
    int niov = 0;
    bool own_view = qiov && (qiov_off != 0 || qiov->size != bytes);
    if (own_view) {
        qk_iov_init(&view, qiov->niov);
        qk_iov_concat(&view, qiov, qiov_off, bytes);
        iov = view.iov;
        niov = view.niov;
    } else if (qiov) {
        iov = qiov->iov;
        niov = qiov->niov;
    }
    switch (op) {
    case OP_READ:
        r = RBD(rbd_aio_readv)(s->image, iov, niov, off, c);
        break;
    case OP_WRITE:
        r = RBD(rbd_aio_writev)(s->image, iov, niov, off, c);
        break;
    case OP_ZERO:
        r = RBD(rbd_aio_write_zeroes)(s->image, off, bytes, c, 0, 0);
        break;
    case OP_DISCARD:
        r = RBD(rbd_aio_discard)(s->image, off, bytes, c);
        break;
    case OP_FLUSH:
        r = RBD(rbd_aio_flush)(s->image, c);
        break;
    }
    if (r < 0) {
        /* Not submitted: the callback will not run. */
        RBD(rbd_aio_release)(c);
        free(cp);
    } else {
        while (!req.finished) {
            qk_coroutine_yield();
        }
        r = 0;
    }
    if (own_view) {
        qk_iov_destroy(&view);
    }
    return r < 0 ? r : req.ret;
}

/* A protocol node grows on write and reads zeros past its end, as a file
 * does (a qcow2 image on top allocates past the end). */
static int coroutine_fn grow_to(QkBlock *bs, uint64_t end);

static int coroutine_fn rbd_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                      size_t qiov_off, int flags)
{
    RbdState *s = bs->opaque;
    (void)flags;
    uint64_t in = off >= s->size ? 0 : QK_MIN(bytes, s->size - off);
    ssize_t n = in ? rbd_request(s, OP_READ, off, in, qiov, qiov_off) : 0;
    if (n < 0) {
        return (int)n;
    }
    if ((uint64_t)n < bytes) {
        qk_iov_memset(qiov, qiov_off + (size_t)n, 0, bytes - (uint64_t)n);
    }
    return 0;
}

static int coroutine_fn rbd_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                       size_t qiov_off, int flags)
{
    int r = grow_to(bs, off + bytes);
    if (r < 0) {
        return r;
    }
    ssize_t n = rbd_request(bs->opaque, OP_WRITE, off, bytes, qiov, qiov_off);
    if (n >= 0 && (flags & QK_REQ_FUA)) {
        n = rbd_request(bs->opaque, OP_FLUSH, 0, 0, NULL, 0);
    }
    return n < 0 ? (int)n : 0;
}

static int coroutine_fn rbd_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    int r = grow_to(bs, off + bytes);
    if (r < 0) {
        return r;
    }
    ssize_t n = rbd_request(bs->opaque, OP_ZERO, off, bytes, NULL, 0);
    if (n >= 0 && (flags & QK_REQ_FUA)) {
        n = rbd_request(bs->opaque, OP_FLUSH, 0, 0, NULL, 0);
    }
    return n < 0 ? (int)n : 0;
}

static int coroutine_fn rbd_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    RbdState *s = bs->opaque;
    if (off >= s->size) {
        return 0;
    }
    ssize_t n = rbd_request(s, OP_DISCARD, off, QK_MIN(bytes, s->size - off), NULL, 0);
    return n < 0 ? (int)n : 0;
}

static int coroutine_fn rbd_co_flush(QkBlock *bs)
{
    ssize_t n = rbd_request(bs->opaque, OP_FLUSH, 0, 0, NULL, 0);
    return n < 0 ? (int)n : 0;
}

/* ---- Block status: the object map through rbd_diff_iterate2 ---- */

typedef struct Diff {
    rbd_image_t image;
    uint64_t off, len;
    uint64_t start, end;   /* the first allocated extent found, merged with those that follow it */
    bool found;
    int r;
} Diff;

/* Past the first extent and what continues it, nothing is needed. */
#define DIFF_STOP (-ECANCELED)

static int diff_cb(uint64_t off, size_t len, int exists, void *opaque)
{
    Diff *d = opaque;
    if (!exists) {
        return d->found ? DIFF_STOP : 0;
    }
    if (!d->found) {
        d->found = true;
        d->start = off;
        d->end = off + len;
        return 0;
    }
    if (off != d->end) {
        return DIFF_STOP;
    }
    d->end += len;
    return 0;
}

static void diff_work(void *opaque)
{
    Diff *d = opaque;
    d->r = RBD(rbd_diff_iterate2)(d->image, NULL, d->off, d->len, 1, 1, diff_cb, d);
    if (d->r == DIFF_STOP) {
        d->r = 0;
    }
}

static int coroutine_fn rbd_co_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                            uint64_t *map, QkBlock **file)
{
    RbdState *s = bs->opaque;
    if (off >= s->size) {
        *pnum = bytes;
        return QK_BS_EOF | QK_BS_ZERO;
    }
    bytes = QK_MIN(bytes, s->size - off);
    /* Data sits at its own offset in the image (map shows it so). */
    *map = off;
    *file = bs;
    if (!s->fast_diff) {
        /* Without a valid object map a walk reads every object: report
         * data, as QEMU does, and let the reader find the zeros. */
        *pnum = bytes;
        return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
    }
    Diff d = {.image = s->image, .off = off, .len = QK_MIN(bytes, STATUS_WINDOW)};
    qk_co_run_in_thread(diff_work, &d);
    if (d.r < 0) {
        return d.r;
    }
    /* Whole objects: the extents may start before off. */
    if (!d.found || d.start >= off + d.len) {
        *pnum = d.len;
        return QK_BS_ZERO | QK_BS_OFFSET_VALID;
    }
    if (d.start > off) {
        *pnum = d.start - off;
        return QK_BS_ZERO | QK_BS_OFFSET_VALID;
    }
    *pnum = QK_MIN(d.end, off + d.len) - off;
    return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
}

static int64_t rbd_get_length(QkBlock *bs)
{
    return (int64_t)((RbdState *)bs->opaque)->size;
}

typedef struct Resize {
    rbd_image_t image;
    uint64_t size;
    int r;
} Resize;

static void resize_work(void *opaque)
{
    Resize *z = opaque;
    z->r = RBD(rbd_resize)(z->image, z->size);
}

static int coroutine_fn grow_to(QkBlock *bs, uint64_t end)
{
    RbdState *s = bs->opaque;
    if (end <= s->size) {
        return 0;
    }
    qk_co_mutex_lock(&s->grow_lock);
    Resize z = {.image = s->image, .size = end};
    if (end > s->size) {
        qk_co_run_in_thread(resize_work, &z);
        if (z.r == 0) {
            s->size = end;
            bs->size = end;
        }
    }
    qk_co_mutex_unlock(&s->grow_lock);
    return z.r;
}

static int coroutine_fn rbd_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    RbdState *s = bs->opaque;
    if (prealloc != QK_PREALLOC_OFF) {
        return qk_error_set(err, -ENOTSUP, "Preallocation is not supported on rbd images");
    }
    Resize z = {.image = s->image, .size = size};
    qk_co_run_in_thread(resize_work, &z);
    if (z.r < 0) {
        return qk_error_set(err, z.r, "error resizing %s: %s", bs->filename, strerror(-z.r));
    }
    s->size = size;
    bs->size = size;
    return 0;
}

static void rbd_get_info(QkBlock *bs, QkImageInfo *info)
{
    (void)bs;
    info->actual_size = -1;
}

/* ---- Creating an image ---- */

typedef struct Create {
    rados_ioctx_t io;
    const char *name;
    uint64_t size;
    int r;
} Create;

static void create_work(void *opaque)
{
    Create *c = opaque;
    int order = 0; /* librbd's default object size */
    c->r = RBD(rbd_create)(c->io, c->name, c->size, &order);
}

static int coroutine_fn rbd_co_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    if (opts->prealloc != QK_PREALLOC_OFF) {
        return qk_error_set(err, -ENOTSUP, "Preallocation is not supported on rbd images");
    }
    RbdSpec spec;
    int r = spec_parse(filename, &spec, err);
    if (r < 0) {
        return r;
    }
    if (spec.snap) {
        spec_free(&spec);
        return qk_error_set(err, -EINVAL, "Can't use snapshot name for rbd image creation");
    }
    Connect c;
    r = connect_spec(&spec, false, QK_OPEN_RDWR, &c, err);
    if (r == 0) {
        Create cr = {.io = c.io, .name = spec.image, .size = opts->size};
        qk_co_run_in_thread(create_work, &cr);
        if (cr.r < 0) {
            r = qk_error_set(err, cr.r, "error rbd create: %s", strerror(-cr.r));
        }
        Disconnect d = {.cluster = c.cluster, .io = c.io};
        qk_co_run_in_thread(disconnect_work, &d);
    }
    spec_free(&spec);
    return r;
}

const QkBlockDriver qk_drv_rbd = {
    .format_name = "rbd",
    .instance_size = sizeof(RbdState),
    .is_protocol = true,
    .co_open = rbd_co_open,
    .co_close = rbd_co_close,
    .co_create = rbd_co_create,
    .co_preadv = rbd_co_preadv,
    .co_pwritev = rbd_co_pwritev,
    .co_pwrite_zeroes = rbd_co_pwrite_zeroes,
    .co_pdiscard = rbd_co_pdiscard,
    .co_flush = rbd_co_flush,
    .co_block_status = rbd_co_block_status,
    .co_truncate = rbd_co_truncate,
    .get_length = rbd_get_length,
    .get_info = rbd_get_info,
    .co_snapshot_list = qk_rbd_co_snapshot_list,
    .co_snapshot_create = qk_rbd_co_snapshot_create,
    .co_snapshot_goto = qk_rbd_co_snapshot_goto,
    .co_snapshot_delete = qk_rbd_co_snapshot_delete,
};
