/*
 * The "file" protocol driver: a host file or block device.
 *
 * With O_DIRECT (cache=none) the device's alignment is detected once and
 * unaligned requests go through aligned bounce buffers. An unaligned write
 * is a read-modify-write of whole blocks, so it is serialised against every
 * in-flight write that touches the same blocks (and they against it): two
 * RMWs of one block must not interleave or one would undo the other.
 *
 * With QCOWKIT_LOG_WRITES set, a file opened read-write also records what
 * is done to it in the write log (block/writelog.h); off, that costs one
 * test of s->log per request.
 *
 * Owns: host fd, alignment, bounce buffers, RMW serialisation.
 */
#include "block/block.h"
#include "block/debug.h"
#include "block/writelog.h"
#include "block/file_lock.h"
#include "aio/aio.h"
#include "aio/loop.h"
#include "block/inject.h"
#include "common/checked.h"
#include "util/tunables.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct Tracked {
    uint64_t start, end;     /* aligned byte range */
    bool rmw;
    QkCoQueue waiters;
    struct Tracked *prev, *next;
} Tracked;

typedef struct FileState {
    int fd;
    bool direct;
    bool no_flush;
    bool is_block_dev;
    /* In-flight writes, only tracked under O_DIRECT: only a write that
     * reads-modifies-writes a block conflicts with anything, so the plain
     * ones (nearly all) are kept apart and never scanned by each other. */
    Tracked *rmw_writes, *plain_writes;
    int bulk_fd;             /* O_DIRECT reader for QK_REQ_BULK_READ: -1 not yet, -2 unusable */
    int64_t last_write_ns;   /* when the last buffered write was issued */
    QkWriteLog *log;         /* NULL unless QCOWKIT_LOG_WRITES is set */
    QkFileLock *lock;        /* this node's image lock (qk_file_node_lock) */
} FileState;

int qk_file_node_lock(QkBlock *bs, unsigned perm, unsigned shared, bool take_over, QkError *err)
{
    if (bs->drv != &qk_drv_file) {
        return 0; /* exports and RBD images are their servers' to guard */
    }
    FileState *s = bs->opaque;
    if (s->lock) {
        return 0;
    }
    return qk_file_lock_acquire(s->fd, bs->filename, perm, shared, take_over, &s->lock, err);
}

bool qk_block_file_deleted(QkBlock *bs)
{
    while (bs && bs->drv != &qk_drv_file) {
        bs = bs->file;
    }
    struct stat st;
    if (!bs) {
        return false; /* no local file: an export's or an RBD image's */
    }
    FileState *s = bs->opaque;
    return fstat(s->fd, &st) == 0 && st.st_nlink == 0;
}

/* fdatasync, logged as a flush when the write log is on. */
static int coroutine_fn file_sync(FileState *s, int log_flags)
{
    if (!s->log) {
        return qk_co_host_fdatasync(s->fd);
    }
    int64_t id = qk_write_log_flush_begin(s->log, log_flags);
    if (id < 0) {
        return (int)id;
    }
    int r = qk_co_host_fdatasync(s->fd);
    int lr = qk_write_log_flush_end(s->log, id, r);
    return r < 0 ? r : lr;
}

static void detect_alignment(QkBlock *bs, FileState *s)
{
    uint32_t off_align = 0, mem_align = 0;
#ifdef STATX_DIOALIGN
    struct statx stx;
    if (statx(s->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
        off_align = stx.stx_dio_offset_align;
        mem_align = stx.stx_dio_mem_align;
    }
#endif
    if (!off_align && s->is_block_dev) {
        int ss;
        if (ioctl(s->fd, BLKSSZGET, &ss) == 0 && ss > 0) {
            off_align = (uint32_t)ss;
        }
    }
    if (!off_align || !qk_is_pow2(off_align)) {
        off_align = 4096; /* safe for every device we know */
    }
    if (!mem_align || !qk_is_pow2(mem_align)) {
        mem_align = 4096;
    }
    bs->request_alignment = off_align;
    bs->mem_alignment = mem_align < off_align ? off_align : mem_align;
}

static int coroutine_fn file_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    FileState *s = bs->opaque;
    int oflags = O_CLOEXEC | ((opts->flags & QK_OPEN_RDWR) ? O_RDWR : O_RDONLY);
    if (opts->flags & QK_OPEN_NOCACHE) {
        oflags |= O_DIRECT;
    }
    s->bulk_fd = -1;
    /* Non-blocking only while opening: a name that turns out to be a FIFO
     * (a hostile image's data file, say) would otherwise wait for a
     * writer forever; its reads then fail (ESPIPE) instead. */
    s->fd = open(bs->filename, oflags | O_NONBLOCK);
    if (s->fd < 0) {
        return qk_error_set_errno(err, -errno, "Could not open '%s'", bs->filename);
    }
    int fl = fcntl(s->fd, F_GETFL);
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = -errno;
        close(s->fd);
        s->fd = -1;
        return qk_error_set_errno(err, e, "Could not open '%s'", bs->filename);
    }
    struct stat st;
    if (fstat(s->fd, &st) == 0 && S_ISBLK(st.st_mode)) {
        s->is_block_dev = true;
    } else if (fstat(s->fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        close(s->fd);
        return qk_error_set(err, -EISDIR, "Could not open '%s': Is a directory", bs->filename);
    } else if (fstat(s->fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        /* No offsets to read at: its reads would wait for a writer. */
        close(s->fd);
        return qk_error_set(err, -ESPIPE, "Could not open '%s': a pipe or socket is not an image", bs->filename);
    }
    s->direct = (opts->flags & QK_OPEN_NOCACHE) != 0;
    s->no_flush = (opts->flags & QK_OPEN_NO_FLUSH) != 0;
    if (s->direct) {
        detect_alignment(bs, s);
    }
    if (opts->flags & QK_OPEN_RDWR) {
        int r = qk_write_log_attach(bs->filename, &s->log, err);
        if (r < 0) {
            close(s->fd);
            s->fd = -1;
            return r;
        }
    }
    return 0;
}

static int coroutine_fn file_close(QkBlock *bs)
{
    FileState *s = bs->opaque;
    int r = 0;
    if (s->fd >= 0 && close(s->fd) < 0 && errno != EINTR) {
        /* NFS and some FUSE file systems report write-back errors here. */
        r = -errno;
    }
    if (s->log) {
        qk_write_log_detach(s->log);
        s->log = NULL;
    }
    if (s->bulk_fd >= 0) {
        close(s->bulk_fd);
    }
    qk_file_lock_release(s->lock);
    s->lock = NULL;
    s->bulk_fd = -1;
    s->fd = -1;
    return r;
}

/* Transfers exactly [off, off+q->size), resubmitting after short
 * transfers. A read that hits EOF zero-fills the rest; a write that makes
 * no progress fails with -EIO. */
static int coroutine_fn host_rw_fd(int fd, bool direct, uint64_t off, QkIov *q, bool write, bool behind)
{
    size_t done = 0;
    while (done < q->size) {
        QkIov rest;
        QkIov *cur = q;
        if (done) {
            qk_iov_init(&rest, q->niov);
            qk_iov_concat(&rest, q, done, q->size - done);
            cur = &rest;
        }
        ssize_t n = direct ? qk_co_host_rw_direct(fd, write, cur->iov, cur->niov, off + done)
                    : write && behind ? qk_co_host_pwritev_behind(fd, cur->iov, cur->niov, off + done)
                    : write ? qk_co_host_pwritev(fd, cur->iov, cur->niov, off + done)
                            : qk_co_host_preadv(fd, cur->iov, cur->niov, off + done);
        if (done) {
            qk_iov_destroy(&rest);
        }
        if (n == -EINTR || n == -EAGAIN) {
            continue;
        }
        if (n < 0) {
            return (int)n;
        }
        if (n == 0) {
            if (write) {
                return -EIO;
            }
            qk_iov_memset(q, done, 0, q->size - done);
            return 0;
        }
        done += (size_t)n;
    }
    return 0;
}

static int coroutine_fn host_read_full(FileState *s, uint64_t off, QkIov *q)
{
    return host_rw_fd(s->fd, s->direct, off, q, false, false);
}

static int coroutine_fn host_write_full(FileState *s, uint64_t off, QkIov *q)
{
    return host_rw_fd(s->fd, s->direct, off, q, true, false);
}

/* Bulk reads of a file opened through the page cache go through a second,
 * O_DIRECT descriptor when aligned to BULK_ALIGN (see QK_REQ_BULK_READ):
 * opened on first use; a file system that refuses O_DIRECT keeps the
 * buffered path, as does the bulk-read-direct tunable set to 0.
 *
 * Not when most of the range is in the page cache already: then a
 * buffered read is a copy from memory plus the few missing pages, where a
 * direct one reads it all from the disk again (and writes dirty pages
 * back first). Importing a cached 4 GiB qcow2 into RBD with the OSD on
 * the same disk read 1.6 GB from the disk with every bulk read direct,
 * while qemu-img's buffered reads took 0.2 GB. "Most": the page cache
 * drops a page here and there under memory pressure (a quarter of that
 * image's 2 MiB pieces missed 2 to 32 of their 512 pages).
 *
 * Only while nobody writes the file through the page cache, though: a
 * direct read first writes back the range's dirty pages and waits for
 * them, under the inode lock buffered writes need too, so a guest writing
 * during a mirror kept 36% of its idle IOPS with direct bulk reads and 53%
 * with buffered ones (bench/mirror.sh, 3 runs each). A write in the last
 * BULK_QUIET_NS sends bulk reads through the page cache. */
#define BULK_ALIGN 4096u
#define BULK_QUIET_NS 1000000000LL

static int bulk_fd(QkBlock *bs, FileState *s)
{
    if (s->bulk_fd == -1) {
        int fd = qk_tunable(QK_TUNE_BULK_READ_DIRECT) ? open(bs->filename, O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
        struct stat a, b;
        /* The same file, not one renamed into its place meanwhile. */
        if (fd >= 0 && (fstat(fd, &a) < 0 || fstat(s->fd, &b) < 0 || a.st_ino != b.st_ino ||
                        a.st_dev != b.st_dev)) {
            close(fd);
            fd = -1;
        }
        s->bulk_fd = fd >= 0 ? fd : -2;
    }
    return s->bulk_fd;
}

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture (Linux 6.5) */
#endif

/* Whether at least half the pages of [off, off + len) are in the page
 * cache, by cachestat(2); false where the kernel cannot tell (before
 * 6.5). One system call, no copy. */
static bool range_mostly_cached(int fd, uint64_t off, uint64_t len)
{
    static int unsupported;
    if (__atomic_load_n(&unsupported, __ATOMIC_RELAXED)) {
        return false;
    }
    struct {
        uint64_t off, len;
    } range = {off, len};
    struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
    } cs;
    if (syscall(__NR_cachestat, fd, &range, &cs, 0) < 0) {
        if (errno == ENOSYS) {
            __atomic_store_n(&unsupported, 1, __ATOMIC_RELAXED);
        }
        return false;
    }
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t pages = (off + len + page - 1) / page - off / page;
    return cs.nr_cache * 2 >= pages;
}

static bool needs_bounce(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *q)
{
    uint64_t a = bs->request_alignment;
    if (a <= 1) {
        return false;
    }
    return !qk_is_aligned(off, a) || !qk_is_aligned(bytes, a) || !qk_iov_is_aligned(q, bs->mem_alignment);
}

static int coroutine_fn file_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                    size_t qiov_off, int flags)
{
    FileState *s = bs->opaque;
    qk_block_debug_event(QK_DBG_READ_AIO);
    QkIov sub;
    qk_iov_init(&sub, qiov->niov);
    qk_iov_concat(&sub, qiov, qiov_off, bytes);
    int r;
    if ((flags & QK_REQ_BULK_READ) && !s->direct && !s->is_block_dev &&
        qk_clock_ns() - s->last_write_ns > BULK_QUIET_NS && qk_is_aligned(off, BULK_ALIGN) &&
        qk_is_aligned(bytes, BULK_ALIGN) && qk_iov_is_aligned(&sub, BULK_ALIGN) && bulk_fd(bs, s) >= 0 &&
        !range_mostly_cached(s->fd, off, bytes)) {
        r = host_rw_fd(s->bulk_fd, true, off, &sub, false, false);
    } else if (!needs_bounce(bs, off, bytes, &sub)) {
        r = host_read_full(s, off, &sub);
    } else {
        uint64_t a = bs->request_alignment;
        uint64_t start = qk_align_down(off, a);
        uint64_t end = qk_align_up(off + bytes, a);
        void *buf = qk_aligned_alloc(bs->mem_alignment, end - start);
        if (!buf) {
            qk_iov_destroy(&sub);
            return -ENOMEM;
        }
        QkIov bq;
        qk_iov_init_buf(&bq, buf, end - start);
        r = host_read_full(s, start, &bq);
        if (r == 0) {
            qk_iov_from_buf(&sub, 0, (char *)buf + (off - start), bytes);
        }
        free(buf);
    }
    qk_iov_destroy(&sub);
    return r;
}

static bool conflicts(const Tracked *a, const Tracked *b)
{
    return (a->rmw || b->rmw) && qk_ranges_overlap(a->start, a->end - a->start, b->start, b->end - b->start);
}

static Tracked *conflict_in(Tracked *head, const Tracked *t)
{
    for (Tracked *o = head; o; o = o->next) {
        if (conflicts(o, t)) {
            return o;
        }
    }
    return NULL;
}

static Tracked **list_of(FileState *s, const Tracked *t)
{
    return t->rmw ? &s->rmw_writes : &s->plain_writes;
}

static void coroutine_fn track_begin(FileState *s, Tracked *t)
{
    qk_co_queue_init(&t->waiters);
    Tracked *o;
    while ((o = conflict_in(s->rmw_writes, t)) || (t->rmw && (o = conflict_in(s->plain_writes, t)))) {
        qk_co_queue_wait(&o->waiters);
    }
    Tracked **head = list_of(s, t);
    t->prev = NULL;
    t->next = *head;
    if (*head) {
        (*head)->prev = t;
    }
    *head = t;
}

static void track_end(FileState *s, Tracked *t)
{
    if (t->prev) {
        t->prev->next = t->next;
    } else {
        *list_of(s, t) = t->next;
    }
    if (t->next) {
        t->next->prev = t->prev;
    }
    qk_co_queue_wake_all(&t->waiters);
}

static int coroutine_fn file_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                     size_t qiov_off, int flags)
{
    FileState *s = bs->opaque;
    int r = qk_inject_write(bs->filename, flags);
    if (r < 0) {
        return r;
    }
    QkIov sub;
    qk_iov_init(&sub, qiov->niov);
    qk_iov_concat(&sub, qiov, qiov_off, bytes);
    if (!s->direct) {
        s->last_write_ns = qk_clock_ns();
        r = host_rw_fd(s->fd, false, off, &sub, true, (flags & QK_REQ_WRITE_BEHIND) != 0);
    } else {
        uint64_t a = bs->request_alignment;
        Tracked t = {
            .start = qk_align_down(off, a),
            .end = qk_align_up(off + bytes, a),
            .rmw = !qk_is_aligned(off, a) || !qk_is_aligned(bytes, a),
        };
        track_begin(s, &t);
        qk_block_debug_event(QK_DBG_DIRECT_WRITE);
        if (!needs_bounce(bs, off, bytes, &sub)) {
            r = host_write_full(s, off, &sub);
        } else {
            size_t len = t.end - t.start;
            char *buf = qk_aligned_alloc(bs->mem_alignment, len);
            r = buf ? 0 : -ENOMEM;
            /* Read the partial head and tail blocks (one read if they are one block). */
            if (r == 0 && off != t.start) {
                QkIov hq;
                qk_iov_init_buf(&hq, buf, a);
                r = host_read_full(s, t.start, &hq);
            }
            if (r == 0 && off + bytes != t.end && (t.end - a > t.start || off == t.start)) {
                QkIov tq;
                qk_iov_init_buf(&tq, buf + len - a, a);
                r = host_read_full(s, t.end - a, &tq);
            }
            if (r == 0) {
                qk_iov_to_buf(&sub, 0, buf + (off - t.start), bytes);
                QkIov bq;
                qk_iov_init_buf(&bq, buf, len);
                r = host_write_full(s, t.start, &bq);
            }
            free(buf);
        }
        track_end(s, &t);
    }
    if (r == 0 && s->log) {
        r = qk_write_log_data(s->log, off, sub.iov, sub.niov, bytes);
    }
    qk_iov_destroy(&sub);
    if (r == 0 && (flags & QK_REQ_FUA) && !s->no_flush) {
        r = file_sync(s, QK_WLOG_F_FUA);
    }
    return r;
}

static int coroutine_fn file_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags)
{
    FileState *s = bs->opaque;
    if (s->is_block_dev) {
        return -ENOTSUP;
    }
    if (s->direct) {
        uint64_t a = bs->request_alignment;
        if (!qk_is_aligned(off, a) || !qk_is_aligned(bytes, a)) {
            return -ENOTSUP; /* the generic path does RMW correctly */
        }
    }
    /* Counted once: a refusal above comes back as a plain write. */
    int r = qk_inject_write(bs->filename, flags);
    if (r < 0) {
        return r;
    }
    struct stat st;
    bool past_eof = fstat(s->fd, &st) == 0 && off + bytes > (uint64_t)st.st_size;
    if ((flags & QK_REQ_MAY_UNMAP) && !past_eof) {
        r = qk_co_host_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, bytes);
        if (r == 0) {
            if (s->log) {
                r = qk_write_log_op(s->log, QK_WLOG_ZERO, QK_WLOG_F_UNMAP, off, bytes);
            }
            goto out;
        }
    }
    r = qk_co_host_fallocate(s->fd, FALLOC_FL_ZERO_RANGE, off, bytes);
    if (r == -EOPNOTSUPP || r == -ENOSYS || r == -EINVAL) {
        r = -ENOTSUP;
    }
    if (r == 0 && s->log) {
        r = qk_write_log_op(s->log, QK_WLOG_ZERO, 0, off, bytes);
    }
out:
    if (r == 0 && (flags & QK_REQ_FUA) && !s->no_flush) {
        r = file_sync(s, QK_WLOG_F_FUA);
    }
    return r;
}

static int coroutine_fn file_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes)
{
    FileState *s = bs->opaque;
    if (s->is_block_dev) {
        return 0;
    }
    int r = qk_co_host_fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, bytes);
    if (r == 0 && s->log) {
        r = qk_write_log_op(s->log, QK_WLOG_DISCARD, 0, off, bytes);
    }
    return r == -EOPNOTSUPP ? 0 : r;
}

static int coroutine_fn file_flush(QkBlock *bs)
{
    FileState *s = bs->opaque;
    if (s->no_flush) {
        return 0;
    }
    int r = qk_inject_flush(bs->filename);
    return r < 0 ? r : file_sync(s, 0);
}

static int64_t file_get_length(QkBlock *bs)
{
    FileState *s = bs->opaque;
    struct stat st;
    if (fstat(s->fd, &st) < 0) {
        return -errno;
    }
    if (S_ISBLK(st.st_mode)) {
        uint64_t sz;
        if (ioctl(s->fd, BLKGETSIZE64, &sz) == 0) {
            return (int64_t)sz;
        }
    }
    return st.st_size;
}

static int64_t file_allocated(QkBlock *bs)
{
    FileState *s = bs->opaque;
    struct stat st;
    if (fstat(s->fd, &st) < 0) {
        return -errno;
    }
    return (int64_t)st.st_blocks * 512;
}

static int coroutine_fn file_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                          uint64_t *map, QkBlock **file)
{
    FileState *s = bs->opaque;
    *map = off;
    *file = bs;
    off_t data = lseek(s->fd, (off_t)off, SEEK_DATA);
    if (data < 0) {
        if (errno == ENXIO) {
            /* No data after off: the rest is a hole. */
            *pnum = bytes;
            return QK_BS_ZERO | QK_BS_OFFSET_VALID;
        }
        *pnum = bytes;
        return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
    }
    if ((uint64_t)data > off) {
        *pnum = QK_MIN(bytes, (uint64_t)data - off);
        return QK_BS_ZERO | QK_BS_OFFSET_VALID;
    }
    off_t hole = lseek(s->fd, (off_t)off, SEEK_HOLE);
    if (hole < 0 || (uint64_t)hole <= off) {
        *pnum = bytes;
    } else {
        *pnum = QK_MIN(bytes, (uint64_t)hole - off);
    }
    return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
}

static int coroutine_fn file_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err)
{
    FileState *s = bs->opaque;
    int64_t old = file_get_length(bs);
    int r = qk_co_host_ftruncate(s->fd, size);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not resize file");
    }
    if (s->log && (r = qk_write_log_op(s->log, QK_WLOG_TRUNCATE, 0, size, 0)) < 0) {
        return qk_error_set_errno(err, r, "Could not log the resize");
    }
    if (old >= 0 && size > (uint64_t)old && prealloc != QK_PREALLOC_OFF && prealloc != QK_PREALLOC_METADATA) {
        r = qk_co_host_fallocate(s->fd, 0, (uint64_t)old, size - (uint64_t)old);
        if (r < 0 && prealloc == QK_PREALLOC_FALLOC) {
            return qk_error_set_errno(err, r, "Could not preallocate");
        }
        if (prealloc == QK_PREALLOC_FULL) {
            /* Write real zeros so the blocks are not just reserved. */
            size_t chunk = 1 << 20;
            char *z = qk_aligned_zalloc(qk_block_buf_align(bs), chunk);
            if (!z) {
                return qk_error_set(err, -ENOMEM, "out of memory");
            }
            for (uint64_t p = (uint64_t)old; p < size && r >= 0;) {
                uint64_t n = QK_MIN((uint64_t)chunk, size - p);
                QkIov q;
                qk_iov_init_buf(&q, z, n);
                r = file_pwritev(bs, p, n, &q, 0, 0);
                p += n;
            }
            free(z);
            if (r < 0) {
                return qk_error_set_errno(err, r, "Could not preallocate");
            }
        }
    }
    return 0;
}

static int coroutine_fn file_create(const char *filename, const QkCreateOptions *opts, QkError *err)
{
    QkBlock *bs = NULL;
    int fd = open(filename, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return qk_error_set_errno(err, -errno, "Could not create '%s'", filename);
    }
    /* An existing file is emptied only when no one else uses it, as QEMU
     * checks: its lock is held until the new file is sized. */
    QkFileLock *lock = NULL;
    int r = qk_file_lock_acquire(fd, filename, QK_PERM_WRITE | QK_PERM_RESIZE, QK_PERM_ALL & ~QK_PERM_RESIZE,
                                 false, &lock, err);
    struct stat st;
    if (r == 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0) {
        r = qk_error_set_errno(err, -errno, "Could not resize file");
    }
    if (r == 0) {
        bs = qk_co_file_open(filename, QK_OPEN_RDWR, err);
        r = bs ? 0 : err->code;
    }
    if (r < 0) {
        qk_file_lock_release(lock);
        close(fd);
        return r;
    }
    r = file_truncate(bs, opts->size, opts->prealloc, err);
    int cr = qk_co_block_close(bs);
    qk_file_lock_release(lock);
    close(fd);
    if (r == 0 && cr < 0) {
        r = qk_error_set_errno(err, cr, "Could not close '%s'", filename);
    }
    return r;
}

const QkBlockDriver qk_drv_file = {
    .format_name = "file",
    .instance_size = sizeof(FileState),
    .is_protocol = true,
    .co_open = file_open,
    .co_close = file_close,
    .co_create = file_create,
    .co_preadv = file_preadv,
    .co_pwritev = file_pwritev,
    .co_pwrite_zeroes = file_pwrite_zeroes,
    .co_pdiscard = file_pdiscard,
    .co_flush = file_flush,
    .co_block_status = file_block_status,
    .co_truncate = file_truncate,
    .get_length = file_get_length,
    .get_allocated_size = file_allocated,
};
