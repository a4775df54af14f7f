/*
 * Compressed cluster writes (convert -c, qemu-io write -c). Each guest
 * cluster is deflated (compression type 0: raw deflate, 4 KiB window as
 * the spec requires) or zstd-compressed (type 1) on its own; data that
 * does not shrink below a cluster is written uncompressed, as QEMU does.
 * Compressed clusters are packed into host clusters one after another,
 * byte by byte as QEMU packs them (the L2 entry's sector count then
 * covers parts of sectors that neighbours use, and its last sector may
 * reach past the file's end: readers take what is there); on a file
 * opened O_DIRECT each starts on a sector of its own and is padded to
 * the end of its last one, so no write needs a read-modify-write of a
 * sector another compressed cluster uses. Every compressed cluster holds one
 * reference on the host cluster it lies in: a host cluster shared by
 * several is freed when the last of them is.
 *
 * Order: the host bytes are reserved (refcount) before the data is
 * written, the data before the L2 entry that points at it (the L2 cache
 * depends on the refcount cache, and a barrier keeps the table back until
 * the data is flushed), and an old cluster's reference drops only after
 * the new entry replaced it.
 */
#include "qcow2/qcow2_int.h"
#include "aio/task_pool.h"
#include "aio/work_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#define SECTOR 512u

/* Per-thread compressor state kept between clusters: setting up a zstd
 * context or a deflate stream (hundreds of KiB of tables, zeroed) costs
 * about as much as compressing a 64 KiB cluster. Freed when the thread
 * ends; without it (out of memory) each call sets up its own. */
typedef struct Compressors {
    ZSTD_CCtx *zstd;
    z_stream z;
    bool z_ready;
    int z_level;
} Compressors;

static pthread_key_t comp_key;
static bool comp_key_ok;
static pthread_once_t comp_once = PTHREAD_ONCE_INIT;

static void comp_free(void *p)
{
    Compressors *c = p;
    ZSTD_freeCCtx(c->zstd);
    if (c->z_ready) {
        deflateEnd(&c->z);
    }
    free(c);
}

static void comp_key_init(void)
{
    comp_key_ok = pthread_key_create(&comp_key, comp_free) == 0;
}

static Compressors *compressors(void)
{
    pthread_once(&comp_once, comp_key_init);
    if (!comp_key_ok) {
        return NULL;
    }
    Compressors *c = pthread_getspecific(comp_key);
    if (!c && (c = calloc(1, sizeof(*c))) && pthread_setspecific(comp_key, c) != 0) {
        free(c);
        c = NULL;
    }
    return c;
}

/* Raw deflate with a 4 KiB window: what readers of type 0 expect. */
static int deflate_setup(z_stream *z, int level)
{
    memset(z, 0, sizeof(*z));
    return deflateInit2(z, level, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) == Z_OK ? 0 : -1;
}

/* Compresses in (len bytes) into out (cap bytes); returns the compressed
 * length, or 0 when it does not fit in cap. May run on any thread. */
static size_t compress_zlib(const uint8_t *in, size_t len, uint8_t *out, size_t cap, int level)
{
    Compressors *c = compressors();
    z_stream local, *z = &local;
    if (c && c->z_ready && c->z_level == level && deflateReset(&c->z) == Z_OK) {
        z = &c->z;
    } else if (c) {
        if (c->z_ready) {
            deflateEnd(&c->z);
        }
        c->z_ready = deflate_setup(&c->z, level) == 0;
        c->z_level = level;
        if (!c->z_ready) {
            return 0;
        }
        z = &c->z;
    } else if (deflate_setup(&local, level) < 0) {
        return 0;
    }
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    int r = deflate(z, Z_FINISH);
    size_t n = r == Z_STREAM_END ? cap - z->avail_out : 0;
    if (z == &local) {
        deflateEnd(&local);
    }
    return n;
}

static size_t compress_zstd(const uint8_t *in, size_t len, uint8_t *out, size_t cap, int level)
{
    Compressors *c = compressors();
    if (c && !c->zstd) {
        c->zstd = ZSTD_createCCtx();
    }
    size_t n = c && c->zstd ? ZSTD_compressCCtx(c->zstd, out, cap, in, len, level)
                            : ZSTD_compress(out, cap, in, len, level);
    return ZSTD_isError(n) ? 0 : n;
}

size_t qcow2_compress_cluster(int type, int level, const uint8_t *in, size_t len, uint8_t *out, size_t cap)
{
    if (type == 1) {
        return compress_zstd(in, len, out, cap, level ? level : ZSTD_CLEVEL_DEFAULT);
    }
    return compress_zlib(in, len, out, cap, level ? level : Z_DEFAULT_COMPRESSION);
}

typedef struct CompressJob {
    int type, level;
    const uint8_t *in;
    size_t len;
    uint8_t *out;
    size_t cap;
    size_t result;
} CompressJob;

static void compress_job(void *opaque)
{
    CompressJob *j = opaque;
    j->result = qcow2_compress_cluster(j->type, j->level, j->in, j->len, j->out, j->cap);
}

/* Reserves len bytes (at most a cluster) for compressed
 * data and takes the references that cover them; returns the host offset
 * or -errno. Data packs tightly: what does not fit in the rest of the
 * cluster being filled runs on into the next one when that is the
 * cluster the allocator hands out (the usual case at the file's end), as
 * the spec allows. Called with s->lock held. */
static int64_t coroutine_fn place(Qcow2State *s, uint64_t len)
{
    const uint64_t cs = s->cluster_size;
    uint64_t cur = s->comp_next;
    uint64_t used = cur & (cs - 1);
    int r;
    if (cur && used && used + len <= cs) {
        /* comp_next is reset when the cluster's refcount falls to zero,
         * so the cluster still holds our earlier clusters: one more. */
        r = qcow2_update_refcount(s, cur, len, 1);
        if (r == 0) {
            s->comp_next = cur + len;
            return (int64_t)cur;
        }
        if (r != -ERANGE) {
            return r;
        }
        /* The refcount width cannot count another user: a new cluster. */
        cur = 0;
    }
    int64_t h = qcow2_alloc_clusters(s, 1);
    if (h < 0) {
        return h;
    }
    qcow2_clean_forget(s, (uint64_t)h);
    if (cur && used && (uint64_t)h == qk_align_up(cur, cs)) {
        /* Contiguous: start in the partly filled cluster. */
        r = qcow2_update_refcount(s, cur, 1, 1);
        if (r == 0) {
            s->comp_next = cur + len;
            return (int64_t)cur;
        }
        if (r != -ERANGE) {
            qcow2_free_clusters(s, (uint64_t)h, cs);
            return r;
        }
    }
    s->comp_next = (uint64_t)h + len;
    return h;
}

/* L2 entry of a compressed cluster of clen bytes at host. */
static uint64_t compressed_entry(const Qcow2State *s, uint64_t host, uint64_t clen)
{
    unsigned shift = 62 - (s->cluster_bits - 8);
    uint64_t extra = ((host + clen - 1) / SECTOR) - (host / SECTOR);
    return QCOW2_OFLAG_COMPRESSED | (extra << shift) | host;
}

/* Points the L2 entry of guest cluster c at the compressed data and drops
 * what the entry referred to before. Called with s->lock held. */
static int coroutine_fn set_entry(Qcow2State *s, uint64_t c, uint64_t entry)
{
    uint64_t l1i = c >> s->l2_bits, i = c & (s->l2_entries - 1);
    void *t;
    int r = qcow2_get_l2_for_write(s, l1i, &t);
    if (r < 0) {
        return r;
    }
    /* The data just written is not durable yet (see update_l2 in write.c). */
    qcow2_cache_barrier(s->l2_cache);
    uint64_t bm;
    uint64_t old = qcow2_l2_get(s, t, i, &bm);
    /* Extended L2: a compressed cluster's bitmap is all zeros. */
    qcow2_l2_set(s, t, i, entry, 0);
    qcow2_cache_mark_dirty(s->l2_cache, t);
    qcow2_cache_put(s->l2_cache, &t);
    bool had_host = (old & QCOW2_OFLAG_COMPRESSED) || (old & QCOW2_L2E_OFFSET_MASK);
    return had_host ? qcow2_free_l2_entry(s, old) : 0;
}

/* One guest cluster c whose data (len bytes, zero-padded to a cluster) is
 * in buf; out has room for a cluster plus a sector. */
static int coroutine_fn write_one(Qcow2State *s, uint64_t c, const uint8_t *buf, uint64_t len, uint8_t *out)
{
    const uint64_t cs = s->cluster_size;
    /* Smaller than a cluster, or it is not worth it (and the sector count
     * field could not describe it). */
    CompressJob job = {.type = s->h.compression_type, .level = s->compress_level, .in = buf, .len = cs,
                       .out = out, .cap = cs - 1};
    /* A cluster takes a millisecond or more to deflate: on a worker
     * thread, so that requests in parallel compress in parallel and the
     * loop keeps serving I/O. */
    qk_co_run_in_thread(compress_job, &job);
    size_t clen = job.result;
    if (clen == 0) {
        QkIov q;
        qk_iov_init_buf(&q, (void *)buf, len);
        return qcow2_co_pwritev(s->bs, c << s->cluster_bits, len, &q, 0, 0);
    }
    /* Packed byte by byte, as QEMU packs them (at 4k clusters, sector
     * padding made files 3-5% larger). Only a file that needs aligned
     * writes (O_DIRECT) gets whole sectors, so that two clusters never
     * share a sector that would need a read-modify-write. */
    uint64_t wlen = s->bs->file->request_alignment > 1 ? qk_align_up(clen, SECTOR) : clen;
    memset(out + clen, 0, wlen - clen);

    Qcow2Req req;
    qcow2_req_begin(s, &req, c << s->cluster_bits, (c + 1) << s->cluster_bits, true);
    qk_co_mutex_lock(&s->lock);
    int r = qcow2_mark_dirty(s);
    if (r == 0) {
        /* The L2 table first, as QEMU does: allocated between two pieces
         * of compressed data, it would break their run, and the rest of
         * the cluster being filled would be lost to padding (a whole
         * cluster at 2 MiB clusters). */
        void *t;
        r = qcow2_get_l2_for_write(s, c >> s->l2_bits, &t);
        if (r == 0) {
            qcow2_cache_put(s->l2_cache, &t);
        }
    }
    int64_t host = r == 0 ? place(s, wlen) : r;
    qk_co_mutex_unlock(&s->lock);
    if (host < 0) {
        qcow2_req_end(s, &req);
        return (int)host;
    }
    r = qcow2_check_data_write(s, (uint64_t)host, wlen);
    if (r == 0) {
        r = qk_co_pwrite(s->bs->file, (uint64_t)host, wlen, out, 0);
    }
    qk_co_mutex_lock(&s->lock);
    if (r == 0) {
        r = set_entry(s, c, compressed_entry(s, (uint64_t)host, clen));
    } else {
        /* Nothing points at the bytes: give our reference back. */
        qcow2_update_refcount(s, (uint64_t)host, wlen, -1);
    }
    qk_co_mutex_unlock(&s->lock);
    qcow2_req_end(s, &req);
    return r;
}

/* One cluster of a request, run as a task so that the clusters of a long
 * request compress in parallel. */
typedef struct ClusterTask {
    Qcow2State *s;
    uint64_t c, len;
    const uint8_t *src;  /* the caller's buffer (a whole cluster), or NULL: buf */
    uint8_t *buf, *out;
} ClusterTask;

static int coroutine_fn cluster_task(void *opaque)
{
    ClusterTask *t = opaque;
    int r = write_one(t->s, t->c, t->src ? t->src : t->buf, t->len, t->out);
    free(t->buf);
    free(t->out);
    free(t);
    return r;
}

/* The caller's bytes of [off, off+len) when they are contiguous in one
 * element of q (the usual case: convert passes one buffer), else NULL. */
static const uint8_t *contiguous(const QkIov *q, size_t off, size_t len)
{
    for (int i = 0; i < q->niov; off -= q->iov[i].iov_len, i++) {
        if (off < q->iov[i].iov_len) {
            return off + len <= q->iov[i].iov_len ? (const uint8_t *)q->iov[i].iov_base + off : NULL;
        }
    }
    return NULL;
}

/* Clusters of one request compressed at once (the worker threads bound
 * the real parallelism; this bounds the buffers). */
#define MAX_PARALLEL 16

int coroutine_fn qcow2_co_pwritev_compressed(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                             size_t qoff)
{
    Qcow2State *s = qcow2_state(bs);
    const uint64_t cs = s->cluster_size;
    if (qcow2_has_data_file(s)) {
        return -ENOTSUP; /* a data file holds clusters only at their guest offsets */
    }
    /* Whole clusters only; the last may be cut short by the image's end. */
    if ((off & (cs - 1)) || ((bytes & (cs - 1)) && off + bytes != bs->size)) {
        return -EINVAL;
    }
    QkTaskPool *pool = bytes > cs ? qk_task_pool_new(MAX_PARALLEL) : NULL;
    int r = 0;
    for (uint64_t done = 0; r == 0 && done < bytes; done += cs) {
        uint64_t n = QK_MIN(cs, bytes - done);
        ClusterTask *t = malloc(sizeof(*t));
        /* The caller's buffer stays valid until this function returns
         * (it waits for every task): a whole cluster in one piece is
         * compressed from there, without a copy. */
        const uint8_t *src = n == cs ? contiguous(qiov, qoff + done, cs) : NULL;
        uint8_t *buf = src ? NULL : qk_aligned_alloc(qk_block_buf_align(bs), cs);
        uint8_t *out = malloc(cs + SECTOR);
        if (!t || (!src && !buf) || !out) {
            free(t);
            free(buf);
            free(out);
            r = -ENOMEM;
            break;
        }
        if (!src) {
            qk_iov_to_buf(qiov, qoff + done, buf, n);
            memset(buf + n, 0, cs - n);
        }
        *t = (ClusterTask){.s = s, .c = (off + done) >> s->cluster_bits, .len = n, .src = src, .buf = buf,
                           .out = out};
        if (pool) {
            qk_task_pool_start(pool, cluster_task, t);
            r = qk_task_pool_status(pool);
        } else {
            r = cluster_task(t);
        }
    }
    if (pool) {
        qk_task_pool_wait_all(pool);
        r = r ? r : qk_task_pool_status(pool);
        qk_task_pool_free(pool);
    }
    return r;
}
