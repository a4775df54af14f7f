/*
 * Mirror job (see mirror.h).
 *
 * Ordering rule: every copy to the target, whether started by a walker or
 * by the write hook, is an "op" over a chunk-aligned range, kept in a FIFO
 * list; an op waits for every earlier op it overlaps. A walker resets the
 * chunk's dirty bits when it queues the op, before the source is read, and
 * writes mark bits when they complete, so a write the copy may have missed
 * is always marked again.
 *
 * Write-blocking mode turns the bitmap's own marking off and lets the hook
 * decide: a write that had no overlapping write in flight is copied to the
 * target and leaves the bitmap alone (a clean chunk stays clean, a dirty one
 * stays dirty); anything doubtful (overlapping writes whose landing order we
 * cannot know, discards, failures) is marked dirty for the walker to copy
 * from the source.
 */
#include "jobs/mirror.h"
#include "aio/loop.h"
#include "aio/task_pool.h"
#include "block/dirty_bitmap.h"
#include "common/checked.h"
#include "util/buf_slots.h"
#include "util/names.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_BUF_SIZE (16ULL << 20)
#define DEFAULT_IN_FLIGHT 16
/* Granularity: the target's cluster size clamped to [GRAN_DEFAULT_MIN,
 * GRAN_DEFAULT] by default; what a user may ask for (QEMU's range). */
#define GRAN_DEFAULT 65536u
#define GRAN_DEFAULT_MIN 4096u
#define GRAN_MIN 512u
#define GRAN_MAX (64ULL << 20)
/* How often the switch looks whether writes held by the quiesce are done. */
#define HELD_WRITES_POLL_NS 1000000
#define MAX_ZERO_OP (256ULL << 20)
#define MAX_ZERO_REQ (32ULL << 20)
#define IDLE_SLEEP_NS 2000000LL
/* Pause between dirty passes of a ready background mirror. */
#define PASS_PAUSE_NS 100000000LL
/* Window over which a background mirror measures the guest's write rate. */
#define WRITE_RATE_WINDOW_NS 100000000LL

typedef struct Mirror Mirror;

typedef struct MirrorOp {
    Mirror *m;
    uint64_t off, bytes;
    bool bulk;
    QkCoQueue waiters;
    struct MirrorOp *prev, *next;
} MirrorOp;

/* A guest write seen by before_write and not yet by after_write. */
typedef struct ActiveWrite {
    QkCoroutine *co;
    uint64_t off, bytes;
    bool conflict;
    struct ActiveWrite *next;
} ActiveWrite;

struct Mirror {
    QkJob job;                    /* first: the job API hands us back &job */
    QkBlock *src, *target;
    QkMirrorOptions o;
    uint64_t size, gran, max_op;
    size_t buf_align;
    QkDirtyBitmap *bm;
    QkTaskPool *pool;
    MirrorOp *ops_head, *ops_tail;
    ActiveWrite *writes;
    QkWriteHook hook;
    bool hook_installed;
    bool do_switch;
    bool switched;                /* users moved to the target: forward everything */
    bool pass_pause;              /* a full dirty pass ended while ready */
    bool pass_end;                /* a full dirty pass of a background mirror ended */
    uint64_t bulk_rate;           /* bytes/s the bulk pass copied at */
    int64_t pass_start_ns;
    uint64_t pass_start_done;     /* bytes_done when the pass began */
    uint64_t pass_start_marked;   /* the bitmap's marked_bytes then */
    uint64_t pass_start_dirty;    /* and its dirty bytes */
    uint64_t bulk_cursor;
    uint64_t in_flight_bytes;
    /* Copy buffers of max_op bytes, at most max_in_flight of them, kept
     * while the job runs (see util/buf_slots.c). */
    QkBufSlots bufs;
    QkError err;                  /* first copy error */
    QkMirrorStats st;
};

static const QkJobDriver mirror_driver;

int qk_mirror_priority_parse(const char *s, QkMirrorPriority *prio)
{
    static const char *const names[] = {"auto", "low", "normal"};
    int i = qk_name_index(names, sizeof(names) / sizeof(names[0]), s);
    if (i >= 0) {
        *prio = (QkMirrorPriority)i;
    }
    return i < 0 ? i : 0;
}

int qk_mirror_mode_parse(const char *s, QkMirrorMode *mode)
{
    if (strcmp(s, "background") == 0) {
        *mode = QK_MIRROR_BACKGROUND;
    } else if (strcmp(s, "write-blocking") == 0) {
        *mode = QK_MIRROR_WRITE_BLOCKING;
    } else {
        return -EINVAL;
    }
    return 0;
}

const char *qk_mirror_mode_name(QkMirrorMode mode)
{
    return mode == QK_MIRROR_WRITE_BLOCKING ? "write-blocking" : "background";
}

bool qk_job_is_mirror(const QkJob *job)
{
    return job->drv == &mirror_driver;
}

void qk_mirror_get_stats(const QkJob *job, QkMirrorStats *st)
{
    *st = ((const Mirror *)job)->st;
}

/* ---- ops: ordered, overlapping copies wait for earlier ones ---- */

static uint64_t chunk_end(Mirror *m, uint64_t end)
{
    return QK_MIN(qk_align_up(end, m->gran), m->size);
}

static MirrorOp *op_new(Mirror *m, uint64_t off, uint64_t bytes, bool bulk)
{
    MirrorOp *op = calloc(1, sizeof(*op));
    if (!op) {
        abort(); /* a few dozen bytes; the loop cannot continue without it */
    }
    op->m = m;
    op->off = qk_align_down(off, m->gran);
    op->bytes = chunk_end(m, off + bytes) - op->off;
    op->bulk = bulk;
    qk_co_queue_init(&op->waiters);
    op->prev = m->ops_tail;
    if (m->ops_tail) {
        m->ops_tail->next = op;
    } else {
        m->ops_head = op;
    }
    m->ops_tail = op;
    m->in_flight_bytes += op->bytes;
    return op;
}

static void coroutine_fn op_wait_earlier(MirrorOp *op)
{
    Mirror *m = op->m;
again:
    for (MirrorOp *o = m->ops_head; o && o != op; o = o->next) {
        if (qk_ranges_overlap(o->off, o->bytes, op->off, op->bytes)) {
            qk_co_queue_wait(&o->waiters);
            goto again; /* o is gone; the list may have changed */
        }
    }
}

static void op_finish(MirrorOp *op)
{
    Mirror *m = op->m;
    if (op->prev) {
        op->prev->next = op->next;
    } else {
        m->ops_head = op->next;
    }
    if (op->next) {
        op->next->prev = op->prev;
    } else {
        m->ops_tail = op->prev;
    }
    m->in_flight_bytes -= op->bytes;
    qk_co_queue_wake_all(&op->waiters);
    free(op);
}

/* ---- copying ---- */

static int coroutine_fn copy_zeroes(Mirror *m, uint64_t off, uint64_t bytes)
{
    while (bytes > 0) {
        uint64_t n = QK_MIN(bytes, MAX_ZERO_REQ);
        int r = qk_co_pwrite_zeroes(m->target, off, n, QK_REQ_MAY_UNMAP);
        if (r < 0) {
            return qk_error_set_errno(&m->err, r, "Could not write to target '%s'", m->target->filename);
        }
        off += n;
        bytes -= n;
    }
    return 0;
}

static int coroutine_fn copy_op(MirrorOp *op)
{
    Mirror *m = op->m;
    void *buf = NULL;
    uint64_t pos = op->off, end = op->off + op->bytes;
    int r = 0;
    while (pos < end && r == 0) {
        uint64_t pnum = 0;
        int st = qk_co_block_status_above(m->src, pos, end - pos, &pnum, NULL);
        if (st < 0) {
            r = qk_error_set_errno(&m->err, st, "Could not get the block status of the source");
            break;
        }
        if (pnum == 0) {
            pnum = end - pos;
        }
        if (st & QK_BS_ZERO) {
            if (!(op->bulk && m->o.target_is_zero)) {
                r = copy_zeroes(m, pos, pnum);
            }
        } else {
            /* Buffers hold max_op, and a bulk zero op may have been
             * written since it was queued: copy such data in pieces. */
            pnum = QK_MIN(pnum, m->max_op);
            if (!buf) {
                buf = qk_buf_slots_get(&m->bufs);
                if (!buf) {
                    r = qk_error_set(&m->err, -ENOMEM, "out of memory");
                    break;
                }
            }
            r = qk_co_pread(m->src, pos, pnum, buf, QK_REQ_BULK_READ);
            if (r < 0) {
                qk_error_set_errno(&m->err, r, "Could not read from the source '%s'", m->src->filename);
                break;
            }
            r = qk_co_pwrite(m->target, pos, pnum, buf, 0);
            if (r < 0) {
                qk_error_set_errno(&m->err, r, "Could not write to target '%s'", m->target->filename);
                break;
            }
        }
        if (r == 0) {
            m->job.bytes_done += pnum;
            pos += pnum;
        }
    }
    qk_buf_slots_put(&m->bufs, buf);
    return r;
}

static int coroutine_fn copy_task(void *opaque)
{
    MirrorOp *op = opaque;
    Mirror *m = op->m;
    if (m->o.copy_priority == QK_MIRROR_PRIO_LOW) {
        qk_coroutine_set_background(true);
    }
    op_wait_earlier(op);
    int r = copy_op(op);
    if (r < 0) {
        /* Whatever was not copied must still count as dirty. */
        qk_dirty_bitmap_mark(m->bm, op->off, op->bytes);
    }
    op_finish(op);
    return r;
}

/* Queues a copy of [off, off+bytes) (chunk-aligned). Its bits are reset
 * here, before the copy can read the source. */
static void coroutine_fn submit(Mirror *m, uint64_t off, uint64_t bytes, bool bulk, uint64_t charge)
{
    qk_task_pool_wait_slot(m->pool);
    if (charge && m->job.speed) {
        qk_co_job_throttle(&m->job, charge);
    }
    MirrorOp *op = op_new(m, off, bytes, bulk);
    qk_dirty_bitmap_reset(m->bm, op->off, op->bytes);
    m->st.chunks_submitted++;
    qk_task_pool_start(m->pool, copy_task, op);
}

static bool should_stop(Mirror *m)
{
    return qk_co_job_pause_point(&m->job) || m->err.code || qk_task_pool_status(m->pool) < 0;
}

static void update_progress(Mirror *m)
{
    if (!m->bm) {
        return;
    }
    m->job.dirty_bytes = qk_dirty_bitmap_dirty_bytes(m->bm);
    m->job.bytes_total = m->job.bytes_done + m->job.dirty_bytes + m->in_flight_bytes +
                         (m->size - m->bulk_cursor);
}

static int coroutine_fn bulk_pass(Mirror *m)
{
    uint64_t off = 0;
    while (off < m->size) {
        if (should_stop(m)) {
            return 0;
        }
        uint64_t pnum = 0;
        int st = qk_co_block_status_above(m->src, off, m->size - off, &pnum, NULL);
        if (st < 0) {
            return qk_error_set_errno(&m->err, st, "Could not get the block status of the source");
        }
        uint64_t len, charge;
        if (pnum == 0) {
            pnum = m->gran;
        }
        if ((st & QK_BS_ZERO) && (off + pnum >= m->size || pnum >= m->gran)) {
            /* Zero runs are cheap: skip or zero them in large ops, and do
             * not count them against the speed limit. */
            len = off + pnum >= m->size ? m->size - off : qk_align_down(pnum, m->gran);
            len = QK_MIN(len, MAX_ZERO_OP);
            charge = 0;
        } else {
            len = QK_MIN(qk_align_up(pnum, m->gran), m->max_op);
            len = QK_MIN(len, m->size - off);
            charge = len;
        }
        submit(m, off, len, true, charge);
        off += len;
        m->bulk_cursor = off;
        update_progress(m);
    }
    return 0;
}

/* Length of the dirty run at off (chunk-aligned), at most max_op. */
static uint64_t dirty_run(Mirror *m, uint64_t off)
{
    uint64_t bit = off / m->gran, nbits = qk_hbitmap_size(m->bm->bits);
    uint64_t max_bits = m->max_op / m->gran, n = 1;
    while (n < max_bits && bit + n < nbits && qk_hbitmap_get(m->bm->bits, bit + n)) {
        n++;
    }
    return QK_MIN(n * m->gran, m->size - off);
}

/* Submits the next dirty chunk run at or after *cursor. Returns false when
 * nothing is dirty. */
static bool coroutine_fn dirty_step(Mirror *m, uint64_t *cursor)
{
    uint64_t off = *cursor < m->size ? qk_dirty_bitmap_next_dirty(m->bm, *cursor) : UINT64_MAX;
    if (off == UINT64_MAX || off >= m->size) {
        /* Wrap around: the only time the walk starts again at 0. */
        m->st.cursor_restarts++;
        *cursor = 0;
        if (m->o.mode == QK_MIRROR_BACKGROUND) {
            /* A background mirror need not chase every write as it
             * lands: between passes the main loop waits while writes
             * outpace the copy (wait_for_writes_to_slow), and a ready one
             * pauses anyway, so writes to the same chunks coalesce and
             * the CPUs stay with the writer. Completion copies what is
             * left with writes held. */
            m->pass_pause = m->job.state == QK_JOB_READY;
            m->pass_end = true;
            return false;
        }
        off = qk_dirty_bitmap_next_dirty(m->bm, 0);
        if (off == UINT64_MAX || off >= m->size) {
            return false;
        }
    }
    uint64_t len = dirty_run(m, off);
    submit(m, off, len, false, len);
    *cursor = off + len;
    if (m->o.rescan_per_chunk) {
        /* The slow shape kept for comparison: start over and drain. */
        *cursor = 0;
        m->st.cursor_restarts++;
        qk_task_pool_wait_all(m->pool);
        qk_co_block_quiesce_begin(m->src);
        qk_block_quiesce_end(m->src);
    }
    return true;
}

/* ---- write-blocking hook ---- */

static ActiveWrite *take_write(Mirror *m, QkCoroutine *co, uint64_t off, uint64_t bytes)
{
    for (ActiveWrite **pp = &m->writes; *pp; pp = &(*pp)->next) {
        ActiveWrite *w = *pp;
        if (w->co == co && w->off == off && w->bytes == bytes) {
            *pp = w->next;
            return w;
        }
    }
    return NULL;
}

static void hook_before(QkWriteHook *h, QkBlock *bs, QkWriteKind kind, uint64_t off, uint64_t bytes)
{
    (void)bs;
    (void)kind;
    Mirror *m = h->opaque;
    ActiveWrite *w = calloc(1, sizeof(*w));
    if (!w) {
        return; /* treated as a conflict by after_write */
    }
    w->co = qk_coroutine_self();
    w->off = qk_align_down(off, m->gran);
    w->bytes = qk_align_up(off + bytes, m->gran) - w->off;
    for (ActiveWrite *o = m->writes; o; o = o->next) {
        if (qk_ranges_overlap(o->off, o->bytes, w->off, w->bytes)) {
            o->conflict = w->conflict = true;
        }
    }
    w->next = m->writes;
    m->writes = w;
}

static void hook_failed(QkWriteHook *h, QkBlock *bs, QkWriteKind kind, uint64_t off, uint64_t bytes)
{
    (void)bs;
    (void)kind;
    Mirror *m = h->opaque;
    free(take_write(m, qk_coroutine_self(), qk_align_down(off, m->gran),
                    qk_align_up(off + bytes, m->gran) - qk_align_down(off, m->gran)));
    qk_dirty_bitmap_mark(m->bm, off, bytes);
}

static int coroutine_fn hook_after(QkWriteHook *h, QkBlock *bs, QkWriteKind kind, uint64_t off,
                                   uint64_t bytes, QkIov *qiov, size_t qiov_off, int flags)
{
    (void)bs;
    Mirror *m = h->opaque;
    uint64_t aoff = qk_align_down(off, m->gran);
    ActiveWrite *w = take_write(m, qk_coroutine_self(), aoff, qk_align_up(off + bytes, m->gran) - aoff);
    bool doubtful = !w || w->conflict || kind == QK_WRITE_DISCARD || m->err.code;
    free(w);
    if (m->switched) {
        /* A write that was held at the switch and then went on to the old
         * source: the target is where it belongs now, and where a FUA
         * write's client expects it to be stable when acknowledged. */
        int fua = flags & QK_REQ_FUA;
        int r = kind == QK_WRITE_DATA ? qk_co_pwritev(m->target, off, bytes, qiov, qiov_off, fua)
              : kind == QK_WRITE_ZEROES ? qk_co_pwrite_zeroes(m->target, off, bytes, (flags & QK_REQ_MAY_UNMAP) | fua)
              : qk_co_pdiscard(m->target, off, bytes);
        m->st.active_writes++;
        return r;
    }
    if (doubtful) {
        qk_dirty_bitmap_mark(m->bm, off, bytes);
        m->st.active_conflicts++;
        return 0;
    }
    MirrorOp *op = op_new(m, off, bytes, false);
    op_wait_earlier(op);
    int r;
    if (kind == QK_WRITE_DATA) {
        r = qk_co_pwritev(m->target, off, bytes, qiov, qiov_off, 0);
    } else {
        r = qk_co_pwrite_zeroes(m->target, off, bytes, flags & QK_REQ_MAY_UNMAP);
    }
    if (r < 0) {
        /* The guest's write succeeded; the job fails instead. */
        qk_error_set_errno(&m->err, r, "Could not write to target '%s'", m->target->filename);
        qk_dirty_bitmap_mark(m->bm, off, bytes);
    } else {
        m->st.active_writes++;
        m->job.bytes_done += bytes;
    }
    op_finish(op);
    return 0;
}

static void install_hook(Mirror *m)
{
    m->hook.after_write = hook_after;
    m->hook.before_write = hook_before;
    m->hook.write_failed = hook_failed;
    m->hook.opaque = m;
    /* No yield between these two: from here on the hook alone marks. */
    qk_dirty_bitmap_set_enabled(m->bm, false);
    qk_block_add_write_hook(m->src, &m->hook);
    m->hook_installed = true;
}

/* Removes the hook; the caller has quiesced the source, so no hook runs. */
static void remove_hook(Mirror *m)
{
    if (!m->hook_installed) {
        return;
    }
    qk_block_remove_write_hook(m->src, &m->hook);
    m->hook_installed = false;
    while (m->writes) {
        ActiveWrite *w = m->writes;
        m->writes = w->next;
        free(w);
    }
}

/* ---- the job ---- */

/* Under quiesce: copies everything still dirty, then flushes. */
static int coroutine_fn final_copy(Mirror *m)
{
    uint64_t cursor = 0;
    for (;;) {
        while (!m->err.code && qk_task_pool_status(m->pool) == 0 && dirty_step(m, &cursor)) {
        }
        qk_task_pool_wait_all(m->pool);
        if (m->err.code || qk_task_pool_status(m->pool) < 0) {
            return -EIO;
        }
        if (qk_dirty_bitmap_dirty_bytes(m->bm) == 0) {
            break;
        }
    }
    int r = qk_co_flush(m->target);
    if (r < 0) {
        return qk_error_set_errno(&m->err, r, "Could not flush target '%s'", m->target->filename);
    }
    return 0;
}

/* After the switch: writes that were held by the quiesce now run on the
 * old source; the hook forwards them. New requests use the target, so the
 * old source's in-flight count falls to zero and stays there. */
static void coroutine_fn forward_held_writes(Mirror *m)
{
    do {
        qk_co_sleep_ns(HELD_WRITES_POLL_NS);
        qk_co_drain(m->src);
    } while (m->src->in_flight > 0);
}

static void release_bitmap(Mirror *m)
{
    if (m->bm) {
        m->bm->busy = 0;
        qk_dirty_bitmap_remove(m->src, m->bm, NULL);
        m->bm = NULL;
    }
}

/* Notes where a dirty pass starts, for wait_for_writes_to_slow. */
static void pass_begin(Mirror *m)
{
    m->pass_start_ns = qk_clock_ns();
    m->pass_start_done = m->job.bytes_done;
    m->pass_start_marked = m->bm->marked_bytes;
    m->pass_start_dirty = qk_dirty_bitmap_dirty_bytes(m->bm);
}

/* Called between dirty passes of a background mirror. While the guest
 * dirties chunks faster than half the rate the mirror copies them, another
 * pass cannot shrink the dirty set: it would only re-copy chunks the guest
 * dirties again, taking CPU and bandwidth from the very writer background
 * mode must not slow. So the mirror waits, a window at a time, for the
 * writes to slow down; job-complete (which holds writes) or cancel ends the
 * wait at once. Write-blocking mode converges under any load instead. */
static void coroutine_fn wait_for_writes_to_slow(Mirror *m)
{
    int64_t now = qk_clock_ns(), dt = now - m->pass_start_ns;
    uint64_t rate = m->bulk_rate, written = m->bm->marked_bytes - m->pass_start_marked;
    if (dt > 0) {
        rate = QK_MAX(rate, (uint64_t)((double)(m->job.bytes_done - m->pass_start_done) * 1e9 / (double)dt));
    }
    /* A pass that halved the dirty set converges: go on. A pass too short
     * to tell the write rate gets one window more. */
    uint64_t dirty = qk_dirty_bitmap_dirty_bytes(m->bm);
    bool converging = dirty <= m->o.ready_threshold || dirty <= m->pass_start_dirty / 2;
    bool measured = dt >= WRITE_RATE_WINDOW_NS / 10;
    while (rate && !converging && !should_stop(m) && !m->job.complete_requested) {
        if (measured && (double)written * 1e9 / (double)dt * 2 < (double)rate) {
            break;
        }
        if (measured) {
            m->st.writer_waits++;
        }
        uint64_t before = m->bm->marked_bytes;
        int64_t t0 = qk_clock_ns();
        qk_co_job_sleep_ns(&m->job, WRITE_RATE_WINDOW_NS);
        dt = QK_MAX(qk_clock_ns() - t0, 1);
        written = m->bm->marked_bytes - before;
        if (measured) {
            m->st.writer_wait_ns += dt;
        }
        measured = true;
    }
    pass_begin(m);
}

static int coroutine_fn mirror_run(QkJob *job, QkError *err)
{
    Mirror *m = (Mirror *)job;
    int r = bulk_pass(m);
    qk_task_pool_wait_all(m->pool);
    m->st.bulk_done_ns = qk_clock_ns();
    if (m->st.bulk_done_ns > job->start_ns) {
        m->bulk_rate = (uint64_t)((double)job->bytes_done * 1e9 / (double)(m->st.bulk_done_ns - job->start_ns));
    }
    pass_begin(m);
    update_progress(m);
    if (r == 0 && !should_stop(m) && m->o.mode == QK_MIRROR_WRITE_BLOCKING) {
        /* No write may be in flight across the install: one that began
         * before it has no record in the hook, so a later overlapping
         * write would be copied as if alone, and the older one, landing
         * after it on the source, would be copied over it afterwards. */
        qk_co_block_quiesce_begin(m->src);
        install_hook(m);
        qk_block_quiesce_end(m->src);
    }
    uint64_t cursor = 0;
    bool completed = false;
    while (r == 0 && !should_stop(m)) {
        update_progress(m);
        if (job->state == QK_JOB_RUNNING && job->dirty_bytes <= m->o.ready_threshold &&
            qk_task_pool_busy(m->pool) == 0) {
            /* "ready" promises a copy on the target as of now, crash or
             * not (QEMU flushes here too): what was copied so far must be
             * stable before the job says so. */
            r = qk_co_flush(m->target);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not flush target '%s'", m->target->filename);
                break;
            }
            qk_job_set_ready(job);
        }
        if (job->state == QK_JOB_READY && job->complete_requested) {
            job->committed = true; /* a cancel can no longer undo the switch */
            qk_task_pool_wait_all(m->pool);
            qk_co_block_quiesce_begin(m->src);
            r = final_copy(m);
            if (r == 0 && m->do_switch && m->o.switch_fn) {
                m->o.switch_fn(m->o.switch_opaque, m->src, m->target);
                if (!m->hook_installed) {
                    install_hook(m);
                }
                m->switched = true;
                qk_block_quiesce_end(m->src);
                forward_held_writes(m);
                qk_co_block_quiesce_begin(m->src);
            }
            remove_hook(m);
            qk_block_quiesce_end(m->src);
            completed = r == 0;
            break;
        }
        if (job->dirty_bytes == 0 || !dirty_step(m, &cursor)) {
            qk_co_job_sleep_ns(job, m->pass_pause ? PASS_PAUSE_NS : IDLE_SLEEP_NS);
            m->pass_pause = false;
            if (m->pass_end) {
                m->pass_end = false;
                if (!m->o.chase_writes) {
                    wait_for_writes_to_slow(m);
                }
            }
        }
    }
    qk_task_pool_wait_all(m->pool);
    if (m->hook_installed) {
        qk_co_block_quiesce_begin(m->src);
        remove_hook(m);
        qk_block_quiesce_end(m->src);
    }
    update_progress(m);
    qk_buf_slots_release(&m->bufs); /* a finished job that is never dismissed keeps no memory */
    /* From here on the job holds nothing on either node: the caller may
     * close them as soon as it learns that the job has finished. */
    release_bitmap(m);
    if (m->err.code) {
        *err = m->err;
        return m->err.code;
    }
    if (qk_task_pool_status(m->pool) < 0) {
        return qk_error_set_errno(err, qk_task_pool_status(m->pool), "Mirror copy failed");
    }
    if (r < 0) {
        return r;
    }
    return completed ? 0 : -ECANCELED;
}

static void mirror_free(QkJob *job)
{
    Mirror *m = (Mirror *)job;
    release_bitmap(m); /* only when the job never ran */
    qk_task_pool_free(m->pool);
    qk_buf_slots_destroy(&m->bufs);
    free(m);
}

static const QkJobDriver mirror_driver = {
    .type = "mirror",
    .run = mirror_run,
    .free = mirror_free,
};

static uint64_t default_granularity(QkBlock *target)
{
    QkImageInfo info;
    qk_block_get_info(target, &info);
    uint64_t g = info.cluster_size ? info.cluster_size : GRAN_DEFAULT;
    g = QK_MAX(g, GRAN_DEFAULT_MIN);
    g = QK_MIN(g, GRAN_DEFAULT);
    return qk_is_pow2(g) ? g : GRAN_DEFAULT;
}

QkBlock *coroutine_fn qk_mirror_open_target(const char *target, const QkOpenOptions *opts, const char *cache,
                                            const char **used, QkError *err)
{
    QkOpenOptions o = *opts;
    if (qk_block_is_remote(target)) {
        *used = "n/a";
        return qk_co_block_open(target, &o, err);
    }
    /* *used outlives the caller's string: one of these. */
    static const char *const modes[] = {"none", "off", "writeback", "writethrough", "directsync", "unsafe"};
    const char *name = NULL;
    for (size_t i = 0; cache && i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(cache, modes[i]) == 0) {
            name = modes[i];
        }
    }
    if (cache && (!name || qk_cache_mode_parse(cache, &o.flags) < 0)) {
        qk_error_set(err, -EINVAL, "Invalid cache mode '%s'", cache);
        return NULL;
    }
    if (!cache) {
        o.flags |= QK_OPEN_NOCACHE;
    }
    QkBlock *bs = qk_co_block_open(target, &o, err);
    if (!bs && !cache && err->code == -EINVAL) {
        /* No O_DIRECT on this file system: the page cache it is. */
        *err = (QkError){0};
        o.flags &= ~QK_OPEN_NOCACHE;
        bs = qk_co_block_open(target, &o, err);
        *used = "writeback";
        return bs;
    }
    *used = cache ? name : "none";
    return bs;
}

QkJob *qk_mirror_start(const char *id, QkBlock *source, QkBlock *target,
                       const QkMirrorOptions *opts, QkError *err)
{
    QkMirrorOptions o = opts ? *opts : (QkMirrorOptions){0};
    int64_t slen = qk_block_length(source), tlen = qk_block_length(target);
    if (slen < 0 || tlen < 0) {
        qk_error_set_errno(err, slen < 0 ? (int)slen : (int)tlen, "Cannot get the image size");
        return NULL;
    }
    if (tlen != slen) {
        /* As QEMU: a larger target would keep a tail the source does not
         * have, and show it once users move to it. */
        qk_error_set(err, -EINVAL, "Source and target image have different sizes (%lld and %lld bytes)",
                     (long long)slen, (long long)tlen);
        return NULL;
    }
    if (target->read_only) {
        qk_error_set(err, -EACCES, "Target '%s' is read-only", target->filename);
        return NULL;
    }
    if (!o.granularity) {
        o.granularity = default_granularity(target);
    }
    if (o.granularity < GRAN_MIN || o.granularity > GRAN_MAX || !qk_is_pow2(o.granularity)) {
        qk_error_set(err, -EINVAL, "Granularity must be a power of two between 512 and 64 MiB");
        return NULL;
    }
    if (o.copy_priority == QK_MIRROR_PRIO_AUTO) {
        o.copy_priority = QK_MIRROR_PRIO_NORMAL;
    }
    o.buf_size = o.buf_size ? o.buf_size : DEFAULT_BUF_SIZE;
    o.max_in_flight = o.max_in_flight > 0 ? o.max_in_flight : DEFAULT_IN_FLIGHT;
    if (o.buf_size < o.granularity) {
        qk_error_set(err, -EINVAL, "Buffer size must be at least the granularity (%llu)",
                     (unsigned long long)o.granularity);
        return NULL;
    }
    Mirror *m = calloc(1, sizeof(*m));
    if (!m) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    m->src = source;
    m->target = target;
    m->o = o;
    m->size = (uint64_t)slen;
    m->gran = o.granularity;
    m->st.granularity = o.granularity;
    /* buf_size bounds the memory of all copies in flight together. */
    m->max_op = QK_MAX(qk_align_down(QK_MIN(o.buf_size / (uint64_t)o.max_in_flight, 16ULL << 20), m->gran),
                       m->gran);
    m->buf_align = QK_MAX(qk_block_buf_align(source), qk_block_buf_align(target));
    m->pool = qk_task_pool_new(o.max_in_flight);
    int br = qk_buf_slots_init(&m->bufs, m->buf_align, m->max_op, o.max_in_flight);
    if (!m->pool || br < 0 || qk_job_init(&m->job, &mirror_driver, id, err) < 0) {
        if (!m->pool || br < 0) {
            qk_error_set(err, -ENOMEM, "out of memory");
        }
        qk_task_pool_free(m->pool);
        qk_buf_slots_destroy(&m->bufs);
        free(m);
        return NULL;
    }
    m->bm = qk_dirty_bitmap_add(source, NULL, m->gran, err);
    if (!m->bm) {
        qk_job_free(&m->job);
        return NULL;
    }
    m->bm->busy = 1;
    qk_job_set_speed(&m->job, o.speed);
    m->job.bytes_total = m->size;
    qk_job_start(&m->job);
    return &m->job;
}

int qk_mirror_complete(QkJob *job, bool do_switch, QkError *err)
{
    if (!qk_job_is_mirror(job)) {
        return qk_error_set(err, -EINVAL, "Job '%s' is not a mirror job", job->id);
    }
    if (do_switch && qk_block_file_deleted(((Mirror *)job)->target)) {
        /* Every write after the switch would go where no one can read it
         * again once the export closes. */
        return qk_error_set(err, -ENOENT, "The target of job '%s' was deleted: the export stays on its source",
                            job->id);
    }
    int r = qk_job_complete(job, err);
    if (r == 0) {
        ((Mirror *)job)->do_switch = do_switch;
    }
    return r;
}
