/*
 * Convert's copy (see convert.h): the sources' concatenated content is
 * walked in claims of up to CHUNK bytes (COMPRESS_CHUNK with -c; aligned
 * to their size, so to every target cluster), several coroutines at once.
 * Each claim asks block status first and reads only what holds data;
 * known zeros are not read.
 * A claim whose first status covers far more than CHUNK and needs no
 * writes (zeros into a target that already reads as zeros, or ranges
 * left to the target's backing) grows to cover that whole range, so an
 * empty terabyte costs a handful of status calls, not half a million.
 *
 * Unless out_of_order, reads run in parallel but each claim writes only
 * after the claims before it have written: a new qcow2 target then gets
 * its clusters in guest order, as qemu-img's default gives them.
 *
 * Owns the copy loop, zero detection (-S) and compressed cluster writes;
 * opening, creating and size checks are the caller's.
 */
#include "jobs/convert.h"
#include "block/dirty_bitmap.h"
#include "aio/co_sync.h"
#include "common/checked.h"
#include "util/iov.h"
#include "jobs/throttle.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (2u << 20)
/* Compressing, the CPU is the limit, not the number of requests: smaller
 * claims keep every worker's buffer small (16 workers, 8 MiB in all)
 * while a claim still compresses several clusters in parallel. */
#define COMPRESS_CHUNK (512u << 10)
/* How far the first status of a claim looks for a range to skip. */
#define PROBE (1ull << 40)

enum { SEG_DATA, SEG_ZERO, SEG_SKIP };

typedef struct Seg {
    uint64_t off, len;  /* in the concatenated space */
    int kind;
} Seg;

typedef struct Run {
    const QkConvertOptions *o;
    uint64_t *start;     /* start[i]: where source i begins; start[nb_src]: total */
    uint64_t total;
    uint64_t dst_len;    /* the target's length (at least total) */
    uint32_t cluster;    /* target cluster (compressed writes); 0 for raw */
    uint64_t chunk;      /* claim size and alignment: CHUNK, or COMPRESS_CHUNK */
    uint64_t zunit;      /* zero-detection unit; 0: none (-S 0) */
    size_t align;
    uint64_t next;       /* first byte no claim covers yet */
    uint64_t written;    /* in order: every claim below this has written */
    QkCoQueue turn;
    uint64_t done;
    int ret;
    int running;
    QkCoQueue finished;
    QkRateLimit limit;   /* -r: charged with the bytes each claim reads */
    const char *fail_what; /* the first failure: what failed, and where */
    uint64_t fail_off;
} Run;

/* Records where the copy failed first (for the message), returns ret. */
static int failed(Run *r, const char *what, uint64_t off, int ret)
{
    if (ret < 0 && !r->fail_what) {
        r->fail_what = what;
        r->fail_off = off;
    }
    return ret;
}

typedef struct Worker {
    Run *r;
    uint8_t *buf;
    Seg *segs;
    size_t nseg, cap;
} Worker;

static int src_index(const Run *r, uint64_t pos)
{
    int i = 0;
    while (i + 1 < r->o->nb_src && pos >= r->start[i + 1]) {
        i++;
    }
    return i;
}

/* Status at pos (within the source holding it, at most max bytes):
 * which kind of segment starts there and how long it is. */
static int coroutine_fn status_at(Run *r, uint64_t pos, uint64_t max, uint64_t *pnum, int *kind)
{
    int i = src_index(r, pos);
    QkBlock *bs = r->o->src[i];
    uint64_t soff = pos - r->start[i];
    max = QK_MIN(max, r->start[i + 1] - pos);
    if (r->o->only) {
        /* Clean ranges stay as the target's backing has them. */
        const QkDirtyBitmap *bm = r->o->only;
        bool dirty = qk_dirty_bitmap_get(bm, soff);
        uint64_t next = dirty ? qk_dirty_bitmap_next_clean(bm, soff) : qk_dirty_bitmap_next_dirty(bm, soff);
        if (next != UINT64_MAX && next > soff) {
            max = QK_MIN(max, next - soff);
        }
        if (!dirty) {
            *pnum = max;
            *kind = SEG_SKIP;
            return 0;
        }
    }
    uint64_t n = 0;
    int st;
    if (r->o->top_only) {
        st = qk_co_block_status(bs, soff, max, &n, NULL, NULL);
    } else {
        int depth = 0;
        st = qk_co_block_status_above(bs, soff, max, &n, &depth);
    }
    if (st < 0 || n == 0) {
        return failed(r, "reading block status at offset", pos, st < 0 ? st : -EIO);
    }
    *pnum = n;
    if (r->o->top_only && !(st & QK_BS_ALLOCATED) && bs->backing) {
        int64_t blen = qk_block_length(bs->backing);
        if (blen > 0 && soff < (uint64_t)blen) {
            /* qemu-img -B: what the top layer leaves to its chain is left
             * to the target's backing file, whatever the source chain
             * holds. */
            *pnum = QK_MIN(n, (uint64_t)blen - soff);
            *kind = SEG_SKIP;
        } else {
            /* Past the end of a shorter backing file the source reads
             * zeros, whatever the target's backing file holds there: they
             * are written. (qemu-img 7.2 writes them only where its status
             * query happens to start past that end, and leaves the backing
             * file's data showing elsewhere.) */
            *kind = SEG_ZERO;
        }
    } else if (!(st & QK_BS_ZERO) && (st & (QK_BS_DATA | QK_BS_ALLOCATED))) {
        *kind = SEG_DATA;
    } else {
        *kind = SEG_ZERO;
    }
    return 0;
}

/* Whether a segment of this kind needs any write. */
static bool needs_write(const Run *r, int kind)
{
    return kind == SEG_DATA || (kind == SEG_ZERO && (!r->o->target_zero || r->zunit == 0));
}

static int add_seg(Worker *w, uint64_t off, uint64_t len, int kind)
{
    if (w->nseg && w->segs[w->nseg - 1].kind == kind && w->segs[w->nseg - 1].off + w->segs[w->nseg - 1].len == off) {
        w->segs[w->nseg - 1].len += len;
        return 0;
    }
    if (w->nseg == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        Seg *s = realloc(w->segs, cap * sizeof(*s));
        if (!s) {
            return -ENOMEM;
        }
        w->segs = s;
        w->cap = cap;
    }
    w->segs[w->nseg++] = (Seg){.off = off, .len = len, .kind = kind};
    return 0;
}

/* --salvage: [pos, pos+n) of source i failed as a whole; what of it
 * still reads 512 bytes at a time is kept, the rest becomes zeros. */
static void coroutine_fn salvage_read(Run *r, int i, uint64_t pos, uint64_t n, uint8_t *buf)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t piece = QK_MIN((uint64_t)512, n - done);
        int ret = qk_co_pread(r->o->src[i], pos + done - r->start[i], piece, buf + done, 0);
        if (ret < 0) {
            memset(buf + done, 0, piece);
            if (r->o->salvaged) {
                r->o->salvaged(pos + done, ret, r->o->opaque);
            }
        }
        done += piece;
    }
}

/* Where in [pos, pos+n) of source i the read that failed with ret fails:
 * the start of the first cluster that does not read (a damaged cluster
 * is named, not the start of the claim that held it, as qemu-img names
 * the request that failed). */
static uint64_t coroutine_fn first_bad(Run *r, int i, uint64_t pos, uint64_t n, uint8_t *buf, int ret)
{
    QkImageInfo info = {0};
    qk_block_get_info(r->o->src[i], &info);
    uint64_t step = info.cluster_size ? info.cluster_size : 65536;
    uint64_t rel = pos - r->start[i];
    for (uint64_t at = rel; at < rel + n;) {
        uint64_t piece = QK_MIN(rel + n, (at / step + 1) * step) - at;
        if (qk_co_pread(r->o->src[i], at, piece, buf, 0) < 0) {
            return r->start[i] + at;
        }
        at += piece;
    }
    (void)ret;
    return pos; /* it read this time: the failure was not the data's */
}

/* Reads [pos, pos+len) of the concatenated sources into buf. */
static int coroutine_fn read_src(Run *r, uint64_t pos, uint64_t len, uint8_t *buf)
{
    while (len) {
        int i = src_index(r, pos);
        uint64_t n = QK_MIN(len, r->start[i + 1] - pos);
        int ret = qk_co_pread(r->o->src[i], pos - r->start[i], n, buf, QK_REQ_BULK_READ);
        if (ret < 0 && r->o->salvage) {
            salvage_read(r, i, pos, n, buf);
            ret = 0;
        }
        if (ret < 0) {
            return failed(r, "reading at byte", first_bad(r, i, pos, n, buf, ret), ret);
        }
        pos += n;
        buf += n;
        len -= n;
    }
    return 0;
}

static int coroutine_fn write_data(Run *r, uint64_t off, uint64_t len, uint8_t *buf)
{
    return len ? qk_co_pwrite(r->o->dst, off, len, buf, 0) : 0;
}

/* Zeros: nothing on a target that reads as zeros, else a zero write. */
static int coroutine_fn write_zeros(Run *r, uint64_t off, uint64_t len)
{
    if (!len || r->o->target_zero) {
        return 0;
    }
    return qk_co_pwrite_zeroes(r->o->dst, off, len, QK_REQ_MAY_UNMAP);
}

/* A data segment with -S: units (aligned in the target) that are all
 * zeros become holes or zero writes; the rest is written in runs. */
static int coroutine_fn write_sparse(Run *r, uint64_t off, uint64_t len, uint8_t *buf)
{
    uint64_t end = off + len, run = off;
    bool run_zero = false;
    for (uint64_t p = off; p < end;) {
        uint64_t q = QK_MIN(end, (p / r->zunit + 1) * r->zunit);
        /* Only a whole unit counts as a hole; a piece at a segment's edge
         * is written as it is. */
        bool z = q - p == r->zunit && qk_buf_is_zero(buf + (p - off), q - p);
        if (p > run && z != run_zero) {
            int ret = run_zero ? write_zeros(r, run, p - run) : write_data(r, run, p - run, buf + (run - off));
            if (ret < 0) {
                return ret;
            }
            run = p;
        }
        run_zero = z;
        p = q;
    }
    return run_zero ? write_zeros(r, run, end - run) : write_data(r, run, end - run, buf + (run - off));
}

static int coroutine_fn write_segments(Worker *w, uint64_t off)
{
    Run *r = w->r;
    for (size_t i = 0; i < w->nseg; i++) {
        Seg *s = &w->segs[i];
        uint8_t *b = w->buf + (s->off - off);
        int ret = 0;
        if (s->kind == SEG_SKIP) {
            continue;
        }
        if (r->zunit == 0) {
            /* -S 0: everything is written as data. */
            if (s->kind == SEG_ZERO) {
                memset(b, 0, s->len);
            }
            ret = write_data(r, s->off, s->len, b);
        } else if (s->kind == SEG_ZERO) {
            ret = write_zeros(r, s->off, s->len);
        } else {
            ret = write_sparse(r, s->off, s->len, b);
        }
        if (ret < 0) {
            return ret;
        }
    }
    return 0;
}

/* -c: whole target clusters. A cluster with data is filled (zeros where
 * the source has zeros, the source chain's content where it leaves the
 * range to its backing) and written compressed. */
static int coroutine_fn write_compressed(Worker *w, uint64_t off, uint64_t end)
{
    Run *r = w->r;
    size_t si = 0;
    for (uint64_t c = off; c < end; c += r->cluster) {
        uint64_t ce = QK_MIN(end, c + r->cluster);
        bool data = false, all_skip = true;
        while (si < w->nseg && w->segs[si].off + w->segs[si].len <= c) {
            si++;
        }
        for (size_t j = si; j < w->nseg && w->segs[j].off < ce; j++) {
            data |= w->segs[j].kind == SEG_DATA;
            all_skip &= w->segs[j].kind == SEG_SKIP;
        }
        uint8_t *b = w->buf + (c - off);
        int ret = 0;
        if (all_skip) {
            continue;
        }
        if (data) {
            for (size_t j = si; j < w->nseg && w->segs[j].off < ce && ret == 0; j++) {
                Seg *s = &w->segs[j];
                uint64_t a = QK_MAX(s->off, c), e = QK_MIN(s->off + s->len, ce);
                if (s->kind == SEG_ZERO) {
                    memset(w->buf + (a - off), 0, e - a);
                } else if (s->kind == SEG_SKIP) {
                    ret = read_src(r, a, e - a, w->buf + (a - off));
                }
            }
            if (ret < 0) {
                return ret;
            }
            data = r->zunit == 0 || !qk_buf_is_zero(b, ce - c);
        }
        if (data) {
            /* A source whose length is not a multiple of 512 ends inside
             * the target's last sector (a new target's size is rounded up
             * to it); compressed writes must reach the image's end, so
             * the tail is written as zeros, as a sector-granular read of
             * the source would give it. */
            uint64_t wl = ce - c;
            if (ce == r->total && r->total % 512 && qk_align_up(r->total, 512) <= r->dst_len) {
                wl = qk_align_up(r->total, 512) - c;
                memset(b + (ce - c), 0, wl - (ce - c));
            }
            QkIov qiov;
            qk_iov_init_buf(&qiov, b, wl);
            ret = qk_co_pwritev(r->o->dst, c, wl, &qiov, 0, QK_REQ_COMPRESSED);
        } else {
            for (size_t j = si; j < w->nseg && w->segs[j].off < ce && ret == 0; j++) {
                Seg *s = &w->segs[j];
                if (s->kind != SEG_SKIP) {
                    uint64_t a = QK_MAX(s->off, c), e = QK_MIN(s->off + s->len, ce);
                    ret = write_zeros(r, a, e - a);
                }
            }
        }
        if (ret < 0) {
            return ret;
        }
    }
    return 0;
}

/* One claim [off, *end): status, reads, then (in turn) writes. */
static int coroutine_fn copy_claim(Worker *w, uint64_t off, uint64_t *end)
{
    Run *r = w->r;
    w->nseg = 0;
    uint64_t n;
    int kind;
    int ret = status_at(r, off, QK_MIN(PROBE, r->total - off), &n, &kind);
    if (ret < 0) {
        return ret;
    }
    if (!needs_write(r, kind) && off + n > *end && r->next == *end) {
        /* Nothing to write far beyond this claim: take it all. */
        uint64_t e = off + n == r->total ? r->total : (off + n) / r->chunk * r->chunk;
        if (e > *end) {
            r->next = *end = e;
        }
    }
    n = QK_MIN(n, *end - off);
    for (uint64_t pos = off;;) {
        if ((ret = add_seg(w, pos, n, kind)) < 0) {
            return ret;
        }
        pos += n;
        if (pos >= *end) {
            break;
        }
        if ((ret = status_at(r, pos, *end - pos, &n, &kind)) < 0) {
            return ret;
        }
    }
    if (r->o->rate) {
        uint64_t data = 0;
        for (size_t i = 0; i < w->nseg; i++) {
            data += w->segs[i].kind == SEG_DATA ? w->segs[i].len : 0;
        }
        qk_co_throttle(&r->limit, data);
    }
    for (size_t i = 0; i < w->nseg; i++) {
        Seg *s = &w->segs[i];
        if (s->kind == SEG_DATA && (ret = read_src(r, s->off, s->len, w->buf + (s->off - off))) < 0) {
            return ret;
        }
    }
    while (!r->o->out_of_order && r->written != off && r->ret == 0) {
        qk_co_queue_wait(&r->turn);
    }
    if (r->ret < 0) {
        return r->ret;
    }
    ret = r->o->compress ? write_compressed(w, off, *end) : write_segments(w, off);
    if (ret < 0) {
        return failed(r, "writing at byte", off, ret);
    }
    r->written = *end;
    qk_co_queue_wake_all(&r->turn);
    r->done += *end - off;
    if (r->o->progress) {
        r->o->progress(r->done, r->total, r->o->opaque);
    }
    return 0;
}

static void coroutine_fn worker(void *opaque)
{
    Worker w = {.r = opaque};
    Run *r = w.r;
    w.buf = qk_io_buf_alloc(r->align, r->chunk);
    if (!w.buf && r->ret == 0) {
        r->ret = -ENOMEM;
    }
    while (w.buf && r->ret == 0 && r->next < r->total) {
        uint64_t off = r->next;
        uint64_t end = QK_MIN(r->total, (off / r->chunk + 1) * r->chunk);
        r->next = end;
        int ret = copy_claim(&w, off, &end);
        if (ret < 0 && r->ret == 0) {
            r->ret = ret;
            qk_co_queue_wake_all(&r->turn); /* those waiting for their turn stop */
        }
    }
    free(w.buf);
    free(w.segs);
    if (--r->running == 0) {
        qk_co_queue_wake_all(&r->finished);
    }
}

int coroutine_fn qk_co_convert(const QkConvertOptions *o, QkError *err)
{
    Run r = {.o = o};
    qk_ratelimit_init(&r.limit, o->rate, 100 * 1000 * 1000);
    r.start = calloc((size_t)o->nb_src + 1, sizeof(*r.start));
    if (!r.start) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    size_t align = qk_block_buf_align(o->dst);
    for (int i = 0; i < o->nb_src; i++) {
        int64_t len = qk_block_length(o->src[i]);
        if (len < 0) {
            free(r.start);
            return qk_error_set_errno(err, (int)len, "Could not get the size of source %d", i + 1);
        }
        r.start[i + 1] = r.start[i] + (uint64_t)len;
        align = QK_MAX(align, (size_t)o->src[i]->mem_alignment);
    }
    r.total = r.start[o->nb_src];
    int64_t dlen = qk_block_length(o->dst);
    if (dlen < 0) {
        free(r.start);
        return qk_error_set_errno(err, (int)dlen, "Could not get the size of the output image");
    }
    r.dst_len = (uint64_t)dlen;
    r.align = align;
    QkImageInfo info = {0};
    qk_block_get_info(o->dst, &info);
    r.cluster = info.cluster_size ? info.cluster_size : 65536;
    /* Zero detection works in the target's allocation units when they
     * are larger than -S: a unit partly written is allocated anyway. */
    uint64_t unit = info.cluster_size ? (info.extended_l2 ? info.cluster_size / 32 : info.cluster_size) : 0;
    r.zunit = o->sparse ? QK_MAX(o->sparse, unit) : 0;
    r.chunk = o->compress ? QK_MAX((uint64_t)COMPRESS_CHUNK, r.cluster) : CHUNK;
    int workers = QK_MAX(1, QK_MIN(o->workers, 16));
    r.running = workers;
    if (o->progress) {
        o->progress(0, r.total, o->opaque);
    }
    for (int i = 0; i < workers; i++) {
        qk_coroutine_enter(qk_coroutine_create(worker, &r));
    }
    while (r.running) {
        qk_co_queue_wait(&r.finished);
    }
    free(r.start);
    if (r.ret == 0 && (r.ret = qk_co_flush(o->dst)) < 0) {
        return qk_error_set_errno(err, r.ret, "error while flushing the output image");
    }
    if (r.ret < 0) {
        if (r.fail_what) {
            return qk_error_set_errno(err, r.ret, "error while %s %" PRIu64, r.fail_what, r.fail_off);
        }
        return qk_error_set_errno(err, r.ret, "error while converting");
    }
    return 0;
}
