/*
 * Node lifetime and request entry. Format probing, opening the protocol
 * child and the backing chain, closing in the right order, and the qk_co_*
 * request functions that bound-check, count in-flight requests and
 * dispatch to drivers.
 */
#include "block/block.h"
#include "block/file_lock.h"
#include "block/debug.h"
#include "aio/loop.h"
#include "block/dirty_bitmap.h"
#include "block/inject.h"
#include "common/checked.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const QkBlockDriver *const drivers[] = {
    &qk_drv_qcow2,
    &qk_drv_raw,
    &qk_drv_file,
    &qk_drv_nbd,
    &qk_drv_rbd,
};

/* Here, not in the NBD driver: builds without it still recognise the
 * names (and say they cannot open them). */
bool qk_block_is_nbd_uri(const char *filename)
{
    static const char *const prefixes[] = {"nbd://", "nbd+unix://", "nbds://", "nbds+unix://"};
    for (size_t i = 0; i < QK_ARRAY_SIZE(prefixes); i++) {
        if (strncmp(filename, prefixes[i], strlen(prefixes[i])) == 0) {
            return true;
        }
    }
    return false;
}

const QkBlockDriver *qk_block_find_driver(const char *format)
{
    for (size_t i = 0; i < QK_ARRAY_SIZE(drivers); i++) {
        if (strcmp(drivers[i]->format_name, format) == 0) {
            return drivers[i];
        }
    }
    return NULL;
}

bool qk_format_known(const char *format)
{
    return qk_block_find_driver(format) != NULL;
}

bool qk_format_is_image(const char *format)
{
    const QkBlockDriver *drv = qk_block_find_driver(format);
    return drv && !drv->is_protocol;
}

bool qk_format_can_store_bitmaps(const char *format)
{
    const QkBlockDriver *drv = qk_block_find_driver(format);
    return drv && drv->bitmap_can_store;
}

bool qk_format_can_compress(const char *format)
{
    const QkBlockDriver *drv = qk_block_find_driver(format);
    return drv && drv->co_pwritev_compressed;
}

const char *qk_block_format_name(const QkBlock *bs)
{
    return bs->drv->format_name;
}

bool qk_block_format_probed(const QkBlock *bs)
{
    return bs->format_probed;
}

const char *qk_block_filename(const QkBlock *bs)
{
    return bs->filename;
}

QkBlock *qk_block_file(const QkBlock *bs)
{
    return bs->file;
}

QkBlock *qk_block_backing(const QkBlock *bs)
{
    return bs->backing;
}

const char *qk_block_backing_file(const QkBlock *bs)
{
    return bs->backing_file;
}

const char *qk_block_backing_format(const QkBlock *bs)
{
    return bs->backing_format;
}

uint32_t qk_block_mem_alignment(const QkBlock *bs)
{
    return bs->mem_alignment ? bs->mem_alignment : 1;
}

bool qk_block_can_compress(const QkBlock *bs)
{
    return bs->drv->co_pwritev_compressed != NULL;
}

bool qk_block_can_amend(const QkBlock *bs)
{
    return bs->drv->co_amend != NULL;
}

bool qk_block_can_change_backing(const QkBlock *bs)
{
    return bs->drv->co_change_backing != NULL;
}

int qk_cache_mode_parse(const char *name, int *flags)
{
    int f = *flags & ~(QK_OPEN_NOCACHE | QK_OPEN_WRITETHROUGH | QK_OPEN_NO_FLUSH);
    if (strcmp(name, "none") == 0 || strcmp(name, "off") == 0) {
        f |= QK_OPEN_NOCACHE;
    } else if (strcmp(name, "writeback") == 0) {
    } else if (strcmp(name, "writethrough") == 0) {
        f |= QK_OPEN_WRITETHROUGH;
    } else if (strcmp(name, "directsync") == 0) {
        f |= QK_OPEN_NOCACHE | QK_OPEN_WRITETHROUGH;
    } else if (strcmp(name, "unsafe") == 0) {
        f |= QK_OPEN_NO_FLUSH;
    } else {
        return -EINVAL;
    }
    *flags = f;
    return 0;
}

static QkBlock *node_new(const QkBlockDriver *drv, const char *filename, int flags)
{
    QkBlock *bs = calloc(1, sizeof(*bs));
    if (!bs) {
        return NULL;
    }
    bs->drv = drv;
    bs->opaque = drv->instance_size ? calloc(1, drv->instance_size) : NULL;
    bs->filename = strdup(filename);
    if (!bs->filename || (drv->instance_size && !bs->opaque)) {
        free(bs->opaque);
        free(bs->filename);
        free(bs);
        return NULL;
    }
    bs->open_flags = flags;
    bs->read_only = !(flags & QK_OPEN_RDWR);
    bs->request_alignment = 1;
    bs->mem_alignment = 1;
    qk_co_queue_init(&bs->drain_waiters);
    qk_co_queue_init(&bs->quiesce_waiters);
    qk_co_mutex_init(&bs->flush_lock);
    return bs;
}

QkBlock *qk_block_new_node(const QkBlockDriver *drv, const char *name, bool read_only)
{
    return node_new(drv, name, read_only ? 0 : QK_OPEN_RDWR);
}

static void node_free(QkBlock *bs)
{
    free(bs->opaque);
    free(bs->filename);
    free(bs->backing_file);
    free(bs->backing_format);
    free(bs);
}

QkBlock *coroutine_fn qk_co_file_open(const char *filename, int flags, QkError *err)
{
    QkBlock *bs = node_new(&qk_drv_file, filename, flags);
    if (!bs) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    QkOpenOptions o = {.flags = flags};
    if (qk_drv_file.co_open(bs, &o, err) < 0) {
        node_free(bs);
        return NULL;
    }
    return bs;
}

bool qk_block_is_rbd_name(const char *filename)
{
    return strncmp(filename, "rbd:", 4) == 0;
}

bool qk_block_is_remote(const char *filename)
{
    return qk_block_is_nbd_uri(filename) || qk_block_is_rbd_name(filename);
}

/* The protocol driver a name opens with: a remote NBD export for nbd
 * URIs, an RBD image for rbd: names, else a host file. */
static const QkBlockDriver *protocol_driver(const char *filename)
{
    return qk_block_is_nbd_uri(filename) ? &qk_drv_nbd
           : qk_block_is_rbd_name(filename) ? &qk_drv_rbd
           : &qk_drv_file;
}

int coroutine_fn qk_co_protocol_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    const QkBlockDriver *drv = protocol_driver(filename);
    if (!drv->co_create) {
        return qk_error_set(err, -ENOTSUP, "Cannot create '%s': the %s protocol creates no images",
                            filename, drv->format_name);
    }
    return drv->co_create(filename, opts, err);
}

QkBlock *coroutine_fn qk_co_protocol_open(const char *filename, int flags, QkError *err)
{
    const QkBlockDriver *drv = protocol_driver(filename);
    if (drv == &qk_drv_file) {
        return qk_co_file_open(filename, flags, err);
    }
    QkBlock *bs = node_new(drv, filename, flags);
    if (!bs) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    QkOpenOptions o = {.flags = flags};
    if (drv->co_open(bs, &o, err) < 0) {
        node_free(bs);
        return NULL;
    }
    return bs;
}

/* The image lock a node of DRV over FILE takes, in QEMU's terms: a
 * reader holds consistent read, a writer also write; a qcow2 node (even a
 * reader) lets no one else write or resize under its metadata, and its
 * writer holds resize too. -U (force-share) shares everything. */
static int coroutine_fn lock_image(QkBlock *file, const QkBlockDriver *drv, int flags, QkError *err)
{
    bool rw = (flags & QK_OPEN_RDWR) != 0;
    unsigned perm = QK_PERM_CONSISTENT_READ | (rw ? QK_PERM_WRITE : 0);
    unsigned shared = QK_PERM_ALL;
    if (drv == &qk_drv_qcow2) {
        perm |= rw ? QK_PERM_RESIZE : 0;
        shared &= ~(QK_PERM_WRITE | QK_PERM_RESIZE);
    }
    if (flags & QK_OPEN_NO_SHARE) {
        shared &= ~(QK_PERM_WRITE | QK_PERM_RESIZE);
    }
    if (flags & QK_OPEN_FORCE_SHARE) {
        shared = QK_PERM_ALL;
    }
    return qk_file_node_lock(file, perm, shared, (flags & QK_OPEN_TAKE_OVER) != 0, err);
}

bool qk_block_probes_not_raw(const uint8_t *buf)
{
    if (qk_block_foreign_format(buf, QK_PROBE_SIZE)) {
        return true;
    }
    for (size_t i = 0; i < QK_ARRAY_SIZE(drivers); i++) {
        if (drivers[i] != &qk_drv_raw && drivers[i]->probe && drivers[i]->probe(buf, QK_PROBE_SIZE) > 1) {
            return true;
        }
    }
    return false;
}

/* The driver the file's first bytes suit best (raw when none claims
 * them), or NULL with *foreign set when they announce a format qcowkit
 * does not read. */
static const QkBlockDriver *probe(QkBlock *file, const char **foreign)
{
    *foreign = NULL;
    uint8_t buf[QK_PROBE_SIZE];
    uint8_t *b = qk_aligned_zalloc(4096, 4096);
    if (!b) {
        return &qk_drv_raw;
    }
    int r = qk_co_pread(file, 0, 4096, b, 0);
    memcpy(buf, b, sizeof(buf));
    free(b);
    const QkBlockDriver *best = &qk_drv_raw;
    int best_score = 1;
    if (r < 0) {
        return best;
    }
    for (size_t i = 0; i < QK_ARRAY_SIZE(drivers); i++) {
        if (drivers[i]->probe) {
            int s = drivers[i]->probe(buf, sizeof(buf));
            if (s > best_score) {
                best_score = s;
                best = drivers[i];
            }
        }
    }
    if (best == &qk_drv_raw && (*foreign = qk_block_foreign_format(buf, sizeof(buf)))) {
        return NULL;
    }
    return best;
}

#define MAX_CHAIN QK_MAX_BACKING_CHAIN

/* The images above the one being opened, to tell a loop from depth. */
typedef struct ChainLink {
    dev_t dev;
    ino_t ino;
    const struct ChainLink *up;
} ChainLink;

/* -ELOOP with a message when filename is already in the chain or the
 * chain is too deep; fills *me for the image's own link. */
static int chain_check(const char *filename, const ChainLink *up, int depth, ChainLink *me, QkError *err)
{
    struct stat st;
    *me = (ChainLink){.up = up};
    if (!qk_block_is_remote(filename) && stat(filename, &st) == 0) {
        me->dev = st.st_dev;
        me->ino = st.st_ino;
        for (const ChainLink *l = up; l; l = l->up) {
            if (l->ino && l->dev == st.st_dev && l->ino == st.st_ino) {
                return qk_error_set(err, -ELOOP, "backing chain loops: '%s' is its own backing file "
                                    "%d level(s) down", filename, depth);
            }
        }
    }
    if (depth >= MAX_CHAIN) {
        return qk_error_set(err, -ELOOP, "backing chain is too deep: '%s' would be image %d, "
                            "at most %d are opened", filename, depth + 1, MAX_CHAIN);
    }
    return 0;
}

static QkBlock *coroutine_fn open_depth(const char *filename, const QkOpenOptions *opts,
                                        int depth, const ChainLink *up, QkError *err)
{
    ChainLink me;
    if (chain_check(filename, up, depth, &me, err) < 0) {
        return NULL;
    }
    const QkBlockDriver *drv = NULL;
    if (opts->format) {
        drv = qk_block_find_driver(opts->format);
        if (!drv) {
            qk_error_set(err, -EINVAL, "Unknown driver '%s'", opts->format);
            return NULL;
        }
    }
    bool remote = qk_block_is_remote(filename);
    if ((opts->flags & QK_OPEN_FORCE_SHARE) && (opts->flags & QK_OPEN_RDWR)) {
        qk_error_set(err, -EINVAL, "force-share=on can only be used with read-only images");
        return NULL;
    }
    if (drv && drv->is_protocol) {
        QkBlock *p = qk_co_protocol_open(filename, opts->flags, err);
        if (p && lock_image(p, drv, opts->flags, err) < 0) {
            qk_co_block_close(p);
            return NULL;
        }
        return p;
    }
    QkBlock *file = qk_co_protocol_open(filename, opts->flags, err);
    if (!file) {
        return NULL;
    }
    if (!drv) {
        /* An export's or RBD image's bytes are a guest's disk: never let
         * them pick a format. */
        const char *foreign = NULL;
        drv = remote ? &qk_drv_raw : probe(file, &foreign);
        if (!drv) {
            qk_error_set(err, -ENOTSUP, "%s images are not supported ('qemu-img convert -O qcow2' makes a "
                         "qcow2 copy; -f raw reads the file's bytes)", foreign);
            qk_co_block_close(file);
            return NULL;
        }
    }
    /* Before the format reads anything it could act on, or marks the
     * image in use. */
    if (lock_image(file, drv, opts->flags, err) < 0) {
        qk_co_block_close(file);
        return NULL;
    }
    QkBlock *bs = node_new(drv, filename, opts->flags);
    if (!bs) {
        qk_co_block_close(file);
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    bs->file = file;
    bs->format_probed = !opts->format && !remote;
    bs->request_alignment = 1;
    bs->mem_alignment = file->mem_alignment;
    int r = drv->co_open(bs, opts, err);
    if (r < 0) {
        qk_co_block_close(file);
        node_free(bs);
        return NULL;
    }
    if (bs->backing_file && !(opts->flags & QK_OPEN_NO_BACKING)) {
        char *path = NULL, *json_fmt = NULL;
        QkOpenOptions bo = *opts;
        /* Backing files are read-only and never written through. */
        bo.flags &= ~QK_OPEN_RDWR;
        /* On the heap: this frame is one per layer of the chain, on a
         * coroutine's stack, and an error is 3 KiB. */
        QkError *berr = calloc(1, sizeof(*berr));
        if (berr && qk_block_backing_resolve(filename, bs->backing_file, &path, &json_fmt, berr) == 0) {
            /* The header's format wins over a json: name's, as in QEMU. */
            bo.format = bs->backing_format ? bs->backing_format : json_fmt;
            bs->backing = open_depth(path, &bo, depth + 1, &me, berr);
        }
        free(json_fmt);
        free(path);
        if (!bs->backing && berr && berr->code == -ELOOP) {
            /* Said once, not under one prefix per level. */
            qk_error_set(err, berr->code, "%s", berr->msg);
        } else if (!bs->backing) {
            qk_error_set(err, berr && berr->code ? berr->code : -ENOMEM, "Could not open backing file: %s",
                         berr && berr->code ? berr->msg : "out of memory");
        }
        free(berr);
        if (!bs->backing) {
            qk_co_block_close(bs);
            return NULL;
        }
    }
    return bs;
}

QkBlock *coroutine_fn qk_co_block_open(const char *filename, const QkOpenOptions *opts, QkError *err)
{
    QkOpenOptions def = {0};
    QkBlock *bs = open_depth(filename, opts ? opts : &def, 0, NULL, err);
    return bs;
}

typedef struct OpenCo {
    const char *filename;
    const QkOpenOptions *opts;
    QkError *err;
    QkBlock *bs;
    int ret;
    const QkCreateOptions *copts;
} OpenCo;

static void coroutine_fn open_entry(void *opaque)
{
    OpenCo *o = opaque;
    o->bs = qk_co_block_open(o->filename, o->opts, o->err);
}

QkBlock *qk_block_open(const char *filename, const QkOpenOptions *opts, QkError *err)
{
    OpenCo o = {.filename = filename, .opts = opts, .err = err};
    qk_co_run(open_entry, &o);
    return o.bs;
}

/* Keeps the first error: later ones are usually its consequences. */
static void first_error(int *r, int e)
{
    if (*r == 0 && e < 0) {
        *r = e;
    }
}

int coroutine_fn qk_co_block_close(QkBlock *bs)
{
    if (!bs) {
        return 0;
    }
    int r = 0;
    qk_co_drain(bs);
    if (!bs->read_only) {
        first_error(&r, qk_co_flush(bs));
    }
    if (bs->drv->co_close) {
        first_error(&r, bs->drv->co_close(bs));
    }
    if (bs->backing) {
        first_error(&r, qk_co_block_close(bs->backing));
    }
    if (bs->file) {
        first_error(&r, qk_co_block_close(bs->file));
    }
    qk_dirty_bitmap_remove_all(bs);
    node_free(bs);
    return r;
}

typedef struct CloseCo {
    QkBlock *bs;
    int ret;
} CloseCo;

static void coroutine_fn close_entry(void *opaque)
{
    CloseCo *c = opaque;
    c->ret = qk_co_block_close(c->bs);
}

int qk_block_close(QkBlock *bs)
{
    CloseCo c = {.bs = bs};
    if (bs) {
        qk_co_run(close_entry, &c);
    }
    return c.ret;
}

int coroutine_fn qk_co_block_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    const char *fmt = opts->format ? opts->format : "raw";
    const QkBlockDriver *drv = qk_block_find_driver(fmt);
    if (!drv || !drv->co_create) {
        return qk_error_set(err, -EINVAL, "Unknown file format '%s'", fmt);
    }
    return drv->co_create(filename, opts, err);
}

static void coroutine_fn create_entry(void *opaque)
{
    OpenCo *o = opaque;
    o->ret = qk_co_block_create(o->filename, o->copts, o->err);
}

int qk_block_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    OpenCo o = {.filename = filename, .copts = opts, .err = err};
    qk_co_run(create_entry, &o);
    return o.ret;
}

/* ---- in-flight tracking ---- */

void qk_block_inc_in_flight(QkBlock *bs)
{
    bs->in_flight++;
}

void qk_block_dec_in_flight(QkBlock *bs)
{
    if (--bs->in_flight == 0) {
        qk_co_queue_wake_all(&bs->drain_waiters);
    }
}

void coroutine_fn qk_co_drain(QkBlock *bs)
{
    while (bs->in_flight > 0) {
        qk_co_queue_wait(&bs->drain_waiters);
    }
    if (bs->file) {
        qk_co_drain(bs->file);
    }
    if (bs->backing) {
        qk_co_drain(bs->backing);
    }
}

/* ---- modification entry and exit ---- */

void qk_block_add_write_hook(QkBlock *bs, QkWriteHook *h)
{
    h->next = bs->write_hooks;
    bs->write_hooks = h;
}

void qk_block_remove_write_hook(QkBlock *bs, QkWriteHook *h)
{
    for (QkWriteHook **pp = &bs->write_hooks; *pp; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            return;
        }
    }
}

void coroutine_fn qk_co_block_quiesce_begin(QkBlock *bs)
{
    bs->quiesce_counter++;
    while (bs->in_flight > 0) {
        qk_co_queue_wait(&bs->drain_waiters);
    }
}

void qk_block_quiesce_end(QkBlock *bs)
{
    if (--bs->quiesce_counter == 0) {
        qk_co_queue_wake_all(&bs->quiesce_waiters);
    }
}

static void coroutine_fn write_begin(QkBlock *bs, QkWriteKind kind, uint64_t off, uint64_t bytes)
{
    while (bs->quiesce_counter > 0) {
        qk_co_queue_wait(&bs->quiesce_waiters);
    }
    bs->in_flight++;
    /* A hook is removed only while the node is quiesced, which waits for
     * this request, and added at the head: the rest of the list stays
     * valid while a hook yields. */
    for (QkWriteHook *h = bs->write_hooks; h; h = h->next) {
        if (h->copy_before_write) {
            h->copy_before_write(h, bs, kind, off, bytes);
        }
    }
    for (QkWriteHook *h = bs->write_hooks; h; h = h->next) {
        if (h->before_write) {
            h->before_write(h, bs, kind, off, bytes);
        }
    }
}

/* Marks dirty bitmaps (even on failure: part of the range may have
 * changed), runs the write hooks on success, and ends the request. */
static int coroutine_fn write_end(QkBlock *bs, int r, QkWriteKind kind, uint64_t off, uint64_t bytes,
                                  QkIov *qiov, size_t qiov_off, int flags)
{
    qk_dirty_bitmaps_mark_all(bs, off, bytes);
    for (QkWriteHook *h = bs->write_hooks; h; h = h->next) {
        if (r == 0) {
            r = h->after_write ? h->after_write(h, bs, kind, off, bytes, qiov, qiov_off, flags) : 0;
        } else if (h->write_failed) {
            h->write_failed(h, bs, kind, off, bytes);
        }
    }
    qk_block_dec_in_flight(bs);
    return r;
}

/* ---- requests ---- */

int64_t qk_block_length(QkBlock *bs)
{
    if (bs->drv->get_length) {
        return bs->drv->get_length(bs);
    }
    return (int64_t)bs->size;
}

static int check_range(QkBlock *bs, uint64_t off, uint64_t bytes, bool write)
{
    if (write && bs->read_only) {
        return -EACCES;
    }
    if (write && bs->fenced) {
        return -EIO;
    }
    if (bs->no_guest_data) {
        return -ENOMEDIUM;
    }
    if (bytes > (1ULL << 62) || off > (1ULL << 62)) {
        return -EINVAL;
    }
    /* Protocol nodes grow on write and read zeros past the end. */
    if (bs->drv->is_protocol) {
        return 0;
    }
    if (!qk_range_within(off, bytes, bs->size)) {
        return -EINVAL;
    }
    return 0;
}

int coroutine_fn qk_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                              size_t qiov_off, int flags)
{
    int r = check_range(bs, off, bytes, false);
    if (r < 0 || bytes == 0) {
        return r;
    }
    bs->in_flight++;
    r = bs->drv->co_preadv(bs, off, bytes, qiov, qiov_off, flags);
    qk_block_dec_in_flight(bs);
    return r;
}

int coroutine_fn qk_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                               size_t qiov_off, int flags)
{
    int r = check_range(bs, off, bytes, true);
    if (r < 0 || bytes == 0) {
        return r;
    }
    if ((flags & QK_REQ_COMPRESSED) && !bs->drv->co_pwritev_compressed) {
        return -ENOTSUP;
    }
    write_begin(bs, QK_WRITE_DATA, off, bytes);
    if (flags & QK_REQ_COMPRESSED) {
        r = bs->drv->co_pwritev_compressed(bs, off, bytes, qiov, qiov_off);
    } else {
        r = bs->drv->co_pwritev(bs, off, bytes, qiov, qiov_off, flags);
    }
    if (r == 0 && (bs->open_flags & QK_OPEN_WRITETHROUGH) && !bs->drv->is_protocol) {
        r = qk_co_flush(bs);
    }
    return write_end(bs, r, QK_WRITE_DATA, off, bytes, qiov, qiov_off, flags);
}

int coroutine_fn qk_co_pread(QkBlock *bs, uint64_t off, uint64_t bytes, void *buf, int flags)
{
    QkIov q;
    qk_iov_init_buf(&q, buf, bytes);
    return qk_co_preadv(bs, off, bytes, &q, 0, flags);
}

int coroutine_fn qk_co_pwrite(QkBlock *bs, uint64_t off, uint64_t bytes, const void *buf, int flags)
{
    QkIov q;
    qk_iov_init_buf(&q, (void *)buf, bytes);
    return qk_co_pwritev(bs, off, bytes, &q, 0, flags);
}

int coroutine_fn qk_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    int r = check_range(bs, off, bytes, true);
    if (r < 0 || bytes == 0) {
        return r;
    }
    write_begin(bs, QK_WRITE_ZEROES, off, bytes);
    if (bs->drv->co_pwrite_zeroes) {
        r = bs->drv->co_pwrite_zeroes(bs, off, bytes, flags);
    } else {
        r = -ENOTSUP;
    }
    if (r == -ENOTSUP && !(flags & QK_REQ_NO_FALLBACK)) {
        /* Fallback: write a zeroed buffer in chunks. */
        size_t chunk = (size_t)QK_MIN(bytes, (uint64_t)1 << 20);
        void *z = qk_aligned_zalloc(4096, chunk);
        r = z ? 0 : -ENOMEM;
        for (uint64_t done = 0; r == 0 && done < bytes; done += chunk) {
            uint64_t n = QK_MIN((uint64_t)chunk, bytes - done);
            QkIov q;
            qk_iov_init_buf(&q, z, n);
            r = bs->drv->co_pwritev(bs, off + done, n, &q, 0, flags & (QK_REQ_FUA | QK_REQ_KIND_MASK));
        }
        free(z);
    }
    if (r == 0 && (bs->open_flags & QK_OPEN_WRITETHROUGH) && !bs->drv->is_protocol) {
        r = qk_co_flush(bs); /* writethrough covers every modification, as for data */
    }
    return write_end(bs, r, QK_WRITE_ZEROES, off, bytes, NULL, 0, flags);
}

int coroutine_fn qk_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    int r = check_range(bs, off, bytes, true);
    if (r < 0 || bytes == 0) {
        return r;
    }
    if (!bs->drv->co_pdiscard) {
        return 0; /* discard is advisory */
    }
    write_begin(bs, QK_WRITE_DISCARD, off, bytes);
    r = bs->drv->co_pdiscard(bs, off, bytes);
    if (r == -ENOTSUP) {
        r = 0;
    }
    if (r == 0 && (bs->open_flags & QK_OPEN_WRITETHROUGH) && !bs->drv->is_protocol) {
        r = qk_co_flush(bs);
    }
    return write_end(bs, r, QK_WRITE_DISCARD, off, bytes, NULL, 0, 0);
}

int coroutine_fn qk_co_flush(QkBlock *bs)
{
    int r = 0;
    if (bs->read_only) {
        return 0;
    }
    if (bs->fenced) {
        return -EIO;
    }
    bs->in_flight++;
    if (bs->drv->is_protocol) {
        qk_block_debug_event(QK_DBG_FLUSH);
    }
    if (bs->drv->co_flush) {
        r = bs->drv->co_flush(bs);
    }
    if (r == 0 && bs->file) {
        r = qk_co_flush(bs->file);
    }
    qk_block_dec_in_flight(bs);
    return r;
}

int coroutine_fn qk_co_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                    uint64_t *map, QkBlock **file)
{
    uint64_t dummy_map;
    QkBlock *dummy_file;
    map = map ? map : &dummy_map;
    file = file ? file : &dummy_file;
    *map = 0;
    *file = NULL;
    int64_t len = qk_block_length(bs);
    if (len < 0) {
        return (int)len;
    }
    if (off >= (uint64_t)len) {
        *pnum = 0;
        return QK_BS_EOF;
    }
    bytes = QK_MIN(bytes, (uint64_t)len - off);
    if (bytes == 0) {
        *pnum = 0;
        return 0;
    }
    if (bs->no_guest_data) {
        return -ENOMEDIUM;
    }
    if (!bs->drv->co_block_status) {
        *pnum = bytes;
        return QK_BS_DATA | QK_BS_ALLOCATED;
    }
    bs->in_flight++;
    int r = bs->drv->co_block_status(bs, off, bytes, pnum, map, file);
    qk_block_dec_in_flight(bs);
    if (r >= 0 && *pnum > bytes) {
        *pnum = bytes;
    }
    return r;
}

int coroutine_fn qk_co_block_status_above(QkBlock *bs, uint64_t off, uint64_t bytes,
                                          uint64_t *pnum, int *depth)
{
    int d = 0;
    uint64_t want = bytes;
    for (QkBlock *b = bs; b; b = b->backing, d++) {
        uint64_t n;
        int r = qk_co_block_status(b, off, want, &n, NULL, NULL);
        if (r < 0) {
            return r;
        }
        if (r & QK_BS_EOF || n == 0) {
            /* Past the end of a shorter backing file: reads as zeros. */
            *pnum = want;
            if (depth) {
                *depth = d;
            }
            return QK_BS_ZERO;
        }
        if (r & QK_BS_ALLOCATED || !b->backing) {
            *pnum = n;
            if (depth) {
                *depth = d;
            }
            return r;
        }
        /* Unallocated here: look below, but only as far as this layer is. */
        want = n;
    }
    *pnum = want;
    return QK_BS_ZERO;
}

int coroutine_fn qk_co_make_empty(QkBlock *bs)
{
    if (bs->read_only) {
        return -EACCES;
    }
    if (!bs->drv->co_make_empty) {
        return -ENOTSUP;
    }
    qk_co_drain(bs);
    /* The bitmaps stay as they are (as in QEMU): after a commit the image
     * reads what it read before, from below it now, so nothing changed
     * for a backup of it. */
    return bs->drv->co_make_empty(bs);
}

int coroutine_fn qk_co_change_backing(QkBlock *bs, const char *name, const char *fmt, QkError *err)
{
    if (bs->read_only) {
        return qk_error_set(err, -EACCES, "the image is read-only");
    }
    if (!bs->drv->co_change_backing) {
        return qk_error_set(err, -ENOTSUP, "Operation not supported");
    }
    qk_co_drain(bs);
    return bs->drv->co_change_backing(bs, name, fmt, err);
}

int coroutine_fn qk_co_amend(QkBlock *bs, const QkAmendOptions *o, QkError *err)
{
    if (bs->read_only && !o->check_only) {
        return qk_error_set(err, -EACCES, "the image is read-only");
    }
    if (!bs->drv->co_amend) {
        return qk_error_set(err, -ENOTSUP, "Format driver '%s' does not support option amendment",
                            bs->drv->format_name);
    }
    return bs->drv->co_amend(bs, o, err);
}

int coroutine_fn qk_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    if (bs->read_only) {
        return qk_error_set(err, -EACCES, "image is read-only");
    }
    if (bs->fenced) {
        return qk_error_set(err, -EIO, "an earlier metadata update failed: the image takes no more writes");
    }
    if (!bs->drv->co_truncate) {
        return qk_error_set(err, -ENOTSUP, "format '%s' does not support resize", bs->drv->format_name);
    }
    qk_co_drain(bs);
    int r = bs->drv->co_truncate(bs, size, prealloc, err);
    if (r == 0 && qk_dirty_bitmaps_truncate(bs, size) < 0) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    return r;
}

void qk_block_get_info(QkBlock *bs, QkImageInfo *info)
{
    memset(info, 0, sizeof(*info));
    info->format = bs->drv->format_name;
    info->virtual_size = (uint64_t)qk_block_length(bs);
    QkBlock *f = bs->file ? bs->file : bs;
    info->actual_size = f->drv->get_allocated_size ? f->drv->get_allocated_size(f) : -1;
    info->backing_file = bs->backing_file;
    info->backing_format = bs->backing_format;
    if (bs->drv->get_info) {
        bs->drv->get_info(bs, info);
    }
}
