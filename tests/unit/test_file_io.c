/* Host file I/O through the file driver, buffered and O_DIRECT, including
 * concurrent unaligned writes that share blocks (read-modify-write must not
 * lose neighbours' bytes), runs of adjacent writes, bulk reads and
 * write-behind against the page cache. Runs on whichever backend QCOWKIT_AIO selects. */
#include "qktest.h"
#include "aio/coroutine.h"
#include "aio/loop.h"
#include "block/block.h"
#include "common/checked.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FSIZE (1 << 20)

static unsigned char model[FSIZE];
static QkBlock *bs;
static int outstanding;

typedef struct W {
    uint64_t off;
    uint32_t len;
    unsigned char pat;
} W;

static void coroutine_fn write_co(void *opaque)
{
    W *w = opaque;
    unsigned char *buf = malloc(w->len);
    memset(buf, w->pat, w->len);
    int r = qk_co_pwrite(bs, w->off, w->len, buf, 0);
    QK_CHECK_EQ(r, 0);
    free(buf);
    outstanding--;
}

static int run_case(int flags, const char *path)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR | flags, .format = "raw"};
    bs = qk_block_open(path, &o, &err);
    if (!bs) {
        fprintf(stderr, "open: %s\n", err.msg);
        return -1;
    }
    if (flags & QK_OPEN_NOCACHE) {
        QK_CHECK(bs->file->request_alignment >= 512);
        QK_CHECK(qk_is_pow2(bs->file->request_alignment));
    }
    /* Many small unaligned writes in flight at once; each touches bytes
     * that share an aligned block with others. Non-overlapping ranges, so the
     * final content is defined regardless of completion order. */
    static W ws[600];
    srand(42);
    uint64_t pos = 0;
    int n = 0;
    while (n < 600 && pos + 13000 < FSIZE) {
        /* Runs of three adjacent writes of 4 KiB or more between the small
         * scattered ones: the io_uring backend's writer thread merges
         * buffered runs like that into one system call. */
        bool run = n % 6 < 3;
        ws[n].off = pos + (run && n % 6 ? 0 : (uint64_t)(rand() % 300));
        ws[n].len = run ? 4096 + (uint32_t)(rand() % 8000) : 1 + (uint32_t)(rand() % 2000);
        ws[n].pat = (unsigned char)(1 + n % 250);
        pos = ws[n].off + ws[n].len;
        memset(model + ws[n].off, ws[n].pat, ws[n].len);
        n++;
    }
    QkLoop *loop = qk_loop_get();
    outstanding = n;
    for (int i = 0; i < n; i++) {
        qk_coroutine_enter(qk_coroutine_create(write_co, &ws[i]));
    }
    while (outstanding) {
        qk_loop_run_once(loop, true);
    }
    qk_block_close(bs);

    int fd = open(path, O_RDONLY);
    unsigned char *back = calloc(1, FSIZE);
    ssize_t got = pread(fd, back, FSIZE, 0);
    close(fd);
    QK_CHECK(got >= (ssize_t)pos);
    QK_CHECK(memcmp(back, model, (size_t)pos) == 0);
    free(back);
    return 0;
}

static void coroutine_fn read_back_co(void *opaque)
{
    const char *path = opaque;
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_NOCACHE, .format = "raw"};
    QkBlock *b = qk_co_block_open(path, &o, &err);
    QK_CHECK(b != NULL);
    if (!b) {
        return;
    }
    /* Unaligned read through a bounce buffer. */
    unsigned char buf[777];
    QK_CHECK_EQ(qk_co_pread(b, 1001, sizeof(buf), buf, 0), 0);
    QK_CHECK(memcmp(buf, model + 1001, sizeof(buf)) == 0);
    /* Zero write and discard. */
    qk_co_block_close(b);

    o.flags = QK_OPEN_RDWR;
    b = qk_co_block_open(path, &o, &err);
    QK_CHECK_EQ(qk_co_pwrite_zeroes(b, 4096, 8192, 0), 0);
    QK_CHECK_EQ(qk_co_pwrite_zeroes(b, 100, 50, 0), 0);
    memset(model + 4096, 0, 8192);
    memset(model + 100, 0, 50);
    unsigned char big[16384];
    QK_CHECK_EQ(qk_co_pread(b, 0, sizeof(big), big, 0), 0);
    QK_CHECK(memcmp(big, model, sizeof(big)) == 0);
    QK_CHECK_EQ(qk_co_flush(b), 0);
    /* Reads past EOF of a protocol node are zeros. */
    unsigned char tail[100];
    memset(tail, 0xff, sizeof(tail));
    int64_t len = qk_block_length(b->file);
    QK_CHECK_EQ(qk_co_pread(b->file, (uint64_t)len + 10, sizeof(tail), tail, 0), 0);
    QK_CHECK(qk_buf_is_zero(tail, sizeof(tail)));
    QK_CHECK_EQ(qk_co_truncate(b, 2 * FSIZE, QK_PREALLOC_OFF, &err), 0);
    QK_CHECK_EQ(qk_block_length(b), 2 * FSIZE);
    qk_co_block_close(b);
}

/* Opens PATH as a raw read-write node (NULL with a failed check). */
static QkBlock *coroutine_fn open_rw(const char *path)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
    QkBlock *b = qk_co_block_open(path, &o, &err);
    QK_CHECK(b != NULL);
    return b;
}

/* QK_REQ_BULK_READ on a file opened through the page cache: right after a
 * write the reads stay buffered; once writes have stopped for a second,
 * aligned ones go through the O_DIRECT descriptor and must still see the
 * data written before (dirty in the page cache, not yet on disk);
 * unaligned ones stay buffered. All must read what was written. */
static void coroutine_fn bulk_read_co(void *opaque)
{
    QkBlock *b = open_rw(opaque);
    if (!b) {
        return;
    }
    enum { N = 256 << 10, ROUNDS = 3 };
    unsigned char *w = qk_aligned_alloc(4096, (size_t)N * ROUNDS), *r1 = qk_aligned_alloc(4096, N + 4096);
    for (int i = 0; i < N * ROUNDS; i++) {
        w[i] = (unsigned char)(i * 7 + (i >> 12) * 31);
    }
    const uint64_t base = 65536;
    for (int pass = 0; pass < 2; pass++) {
        for (int round = 0; round < ROUNDS; round++) {
            uint64_t off = base + (uint64_t)round * N;
            const unsigned char *want = w + (size_t)round * N;
            if (pass == 0) {
                QK_CHECK_EQ(qk_co_pwrite(b, off, N, want, 0), 0);
            }
            memset(r1, 0, N);
            QK_CHECK_EQ(qk_co_pread(b, off, N, r1, QK_REQ_BULK_READ), 0);
            QK_CHECK(memcmp(r1, want, N) == 0);
            /* Unaligned start, length and buffer. */
            QK_CHECK_EQ(qk_co_pread(b, off + 3, N - 100, r1 + 1, QK_REQ_BULK_READ), 0);
            QK_CHECK(memcmp(r1 + 1, want + 3, N - 100) == 0);
        }
        if (pass == 0) {
            qk_co_sleep_ns(1100 * 1000 * 1000LL); /* writes quiet: bulk reads may go direct */
        }
    }
    /* A bulk read that runs past the end of the file reads zeros there. */
    int64_t len = qk_block_length(b->file);
    memset(r1, 0xee, 8192);
    QK_CHECK_EQ(qk_co_pread(b->file, (uint64_t)len - 4096, 8192, r1, QK_REQ_BULK_READ), 0);
    QK_CHECK(qk_buf_is_zero(r1 + 4096, 4096));
    free(w);
    free(r1);
    qk_co_block_close(b);
}

typedef struct CacheStat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
} CacheStat;

/* cachestat(2) of a range of PATH; false where the kernel has none. */
static bool cache_stat(const char *path, uint64_t off, uint64_t len, CacheStat *cs)
{
    struct {
        uint64_t off, len;
    } range = {off, len};
    int fd = open(path, O_RDONLY);
    bool ok = fd >= 0 && syscall(451 /* cachestat */, fd, &range, cs, 0) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* Drops [off, off + len) of PATH from the page cache (written back first). */
static void evict(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY);
    QK_CHECK(fd >= 0);
    QK_CHECK_EQ(fdatasync(fd), 0);
    QK_CHECK_EQ(posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* A bulk read of [off, off + len) into r must return want and leave
 * `after` pages of it in the page cache, when `before` were there first
 * (else the kernel did not set the case up: read-ahead, a failed evict). */
static void coroutine_fn bulk_read_cached(QkBlock *b, const char *path, uint64_t off, size_t len,
                                          unsigned char *r, const unsigned char *want, uint64_t before,
                                          uint64_t after, const char *what)
{
    CacheStat cs;
    QK_CHECK(cache_stat(path, off, len, &cs));
    if (cs.nr_cache != before) {
        printf("bulk reads and the page cache: %s not checked (%llu pages cached, not %llu)\n", what,
               (unsigned long long)cs.nr_cache, (unsigned long long)before);
        return;
    }
    memset(r, 0, len);
    QK_CHECK_EQ(qk_co_pread(b, off, len, r, QK_REQ_BULK_READ), 0);
    QK_CHECK(memcmp(r, want, len) == 0);
    QK_CHECK(cache_stat(path, off, len, &cs));
    QK_CHECK_EQ(cs.nr_cache, after);
}

/* QK_REQ_BULK_READ and the page cache, once writes have been quiet for a
 * second: a range mostly in the cache is read through it (its dirty pages
 * stay dirty, a missing page is read in), a range mostly not in it goes
 * O_DIRECT and leaves the cache as it was. Every read returns what was
 * written. A direct read of the dirty range would have written it back;
 * a buffered read of the others would have filled the cache. */
static void coroutine_fn bulk_cache_co(void *opaque)
{
    const char *path = opaque;
    CacheStat cs;
    if (!cache_stat(path, 0, 4096, &cs)) {
        printf("bulk reads and the page cache: not checked, no cachestat(2) here\n");
        return;
    }
    int dfd = open(path, O_RDONLY | O_DIRECT);
    if (dfd < 0) {
        printf("bulk reads and the page cache: not checked, no O_DIRECT here\n");
        return;
    }
    close(dfd);
    QkBlock *b = open_rw(path);
    if (!b) {
        return;
    }
    QkError err = {0};
    enum { N = 256 << 10, PAGES = N / 4096 };
    const uint64_t dirty_off = 1 << 20, clean_off = 2 << 20;
    unsigned char *w = qk_aligned_alloc(4096, 2 * N), *r = qk_aligned_alloc(4096, N);
    for (int i = 0; i < 2 * N; i++) {
        w[i] = (unsigned char)(i * 13 + (i >> 12));
    }
    QK_CHECK_EQ(qk_co_truncate(b, 4 << 20, QK_PREALLOC_OFF, &err), 0);
    QK_CHECK_EQ(qk_co_pwrite(b, clean_off, N, w + N, 0), 0);
    QK_CHECK_EQ(qk_co_flush(b), 0);
    QK_CHECK_EQ(qk_co_pwrite(b, dirty_off, N, w, 0), 0);
    qk_co_sleep_ns(1100 * 1000 * 1000LL); /* writes quiet: bulk reads may go direct */

    /* Cached and dirty: read through the cache, still dirty after. */
    QK_CHECK(cache_stat(path, dirty_off, N, &cs));
    uint64_t dirty = cs.nr_dirty;
    QK_CHECK_EQ(qk_co_pread(b, dirty_off, N, r, QK_REQ_BULK_READ), 0);
    QK_CHECK(memcmp(r, w, N) == 0);
    QK_CHECK(cache_stat(path, dirty_off, N, &cs));
    if (dirty == 0) {
        printf("bulk reads and the page cache: the dirty pages were written back before the read\n");
    } else {
        QK_CHECK_EQ(cs.nr_dirty, dirty);
    }

    /* Not cached at all: direct, and the cache stays empty. */
    evict(path, clean_off, N);
    bulk_read_cached(b, path, clean_off, N, r, w + N, 0, 0, "an uncached range");

    /* All but one page cached: through the cache, which reads the page in. */
    QK_CHECK_EQ(qk_co_pread(b, clean_off, N, r, 0), 0); /* a plain read fills the cache */
    evict(path, clean_off + 4096, 4096);
    bulk_read_cached(b, path, clean_off, N, r, w + N, PAGES - 1, PAGES, "a range missing one page");

    /* One page cached: direct, the other pages stay out. */
    evict(path, clean_off, N);
    QK_CHECK_EQ(qk_co_pread(b, clean_off, 4096, r, 0), 0);
    bulk_read_cached(b, path, clean_off, N, r, w + N, 1, 1, "a range with one page cached");
    free(w);
    free(r);
    qk_co_block_close(b);
}

/* Counts this process's threads running at nice 19 (the background pool). */
typedef struct BehindW {
    QkBlock *b;
    uint64_t off;
    const unsigned char *buf;
    int flags;
    int *left;
} BehindW;

static void coroutine_fn behind_write_co(void *opaque)
{
    BehindW *w = opaque;
    QK_CHECK_EQ(qk_co_pwrite(w->b, w->off, 128 << 10, w->buf, w->flags), 0);
    (*w->left)--;
}

/* QK_REQ_WRITE_BEHIND on a file opened through the page cache: the writes
 * (eight at once, so the backend may merge them) start their own
 * writeback, so hardly a page of them is still dirty when they complete,
 * while the same writes without the hint leave their pages dirty (else
 * the kernel wrote them back on its own and nothing can be told). Both
 * read back what was written. */
static void coroutine_fn write_behind_co(void *opaque)
{
    const char *path = opaque;
    CacheStat cs;
    if (!cache_stat(path, 0, 4096, &cs)) {
        printf("write-behind: not checked, no cachestat(2) here\n");
        return;
    }
    QkBlock *b = open_rw(path);
    if (!b) {
        return;
    }
    enum { N = 1 << 20, PIECE = 128 << 10, PAGES = N / 4096 };
    const uint64_t plain_off = 4 << 20, behind_off = 6 << 20;
    unsigned char *w = qk_aligned_alloc(4096, 2 * N), *r = qk_aligned_alloc(4096, N);
    for (int i = 0; i < 2 * N; i++) {
        w[i] = (unsigned char)(i * 11 + (i >> 12) * 3);
    }
    QkError err = {0};
    QK_CHECK_EQ(qk_co_truncate(b, 8 << 20, QK_PREALLOC_OFF, &err), 0);
    uint64_t dirty[2];
    for (int hint = 0; hint < 2; hint++) {
        uint64_t off = hint ? behind_off : plain_off;
        int left = N / PIECE;
        BehindW ws[N / PIECE];
        for (int i = 0; i < N / PIECE; i++) {
            ws[i] = (BehindW){b, off + (uint64_t)i * PIECE, w + (size_t)hint * N + (size_t)i * PIECE,
                              hint ? QK_REQ_WRITE_BEHIND : 0, &left};
            qk_coroutine_enter(qk_coroutine_create(behind_write_co, &ws[i]));
        }
        while (left) {
            qk_co_sleep_ns(1000 * 1000);
        }
        QK_CHECK(cache_stat(path, off, N, &cs));
        dirty[hint] = cs.nr_dirty;
        QK_CHECK_EQ(qk_co_pread(b, off, N, r, 0), 0);
        QK_CHECK(memcmp(r, w + (size_t)hint * N, N) == 0);
    }
    if (dirty[0] < PAGES * 3 / 4) {
        printf("write-behind: not checked, %llu of %d pages written without the hint were still dirty\n",
               (unsigned long long)dirty[0], PAGES);
    } else {
        QK_CHECK(dirty[1] <= PAGES / 4);
    }
    free(w);
    free(r);
    qk_co_block_close(b);
}

static int low_priority_threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[300], buf[1024];
        snprintf(p, sizeof(p), "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) {
            continue;
        }
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = 0;
        /* Field 19 is nice; fields after the ")" of comm start at 3. */
        char *q = strrchr(buf, ')');
        int field = 2, nice = 0;
        for (char *t = q ? strtok(q + 1, " ") : NULL; t; t = strtok(NULL, " ")) {
            if (++field == 19) {
                nice = atoi(t);
                break;
            }
        }
        n += nice == 19;
    }
    if (d) {
        closedir(d);
    }
    return n;
}

static bool child_was_background;

static void coroutine_fn child_co(void *opaque)
{
    (void)opaque;
    child_was_background = qk_coroutine_is_background();
}

/* Background coroutines' host I/O goes to the low-priority pool, gives
 * the same results, and coroutines they create inherit the mark. */
static void coroutine_fn background_co(void *opaque)
{
    const char *path = opaque;
    int before = low_priority_threads();
    QK_CHECK(!qk_coroutine_is_background());
    qk_coroutine_set_background(true);
    QK_CHECK(qk_coroutine_is_background());
    qk_coroutine_enter(qk_coroutine_create(child_co, NULL));
    QK_CHECK(child_was_background);

    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
    QkBlock *b = qk_co_block_open(path, &o, &err);
    QK_CHECK(b != NULL);
    unsigned char w[8192], r[8192];
    memset(w, 0xb7, sizeof(w));
    QK_CHECK_EQ(qk_co_pwrite(b, 12288, sizeof(w), w, 0), 0);
    QK_CHECK_EQ(qk_co_pread(b, 12288, sizeof(r), r, 0), 0);
    QK_CHECK(memcmp(w, r, sizeof(r)) == 0);
    QK_CHECK_EQ(qk_co_flush(b), 0);
    /* Idle workers linger for seconds, so the one that served us is there. */
    QK_CHECK(low_priority_threads() > before);
    qk_coroutine_set_background(false);
    qk_co_block_close(b);
}

/* Buffered writes to many files at once, in runs of adjacent 8 KiB
 * writes: the io_uring backend gives each of the first files a writer
 * thread of its own and sends the rest to io_uring's workers. */
#define NFILES 11
#define PER_FILE 24
static QkBlock *many[NFILES];
typedef struct MW {
    int file;
    int i;
} MW;

static void coroutine_fn many_write_co(void *opaque)
{
    MW *w = opaque;
    unsigned char buf[8192];
    memset(buf, 1 + (w->file * PER_FILE + w->i) % 250, sizeof(buf));
    QK_CHECK_EQ(qk_co_pwrite(many[w->file], (uint64_t)w->i * sizeof(buf), sizeof(buf), buf, 0), 0);
    outstanding--;
}

static void many_files(const char *dir)
{
    char path[NFILES][4096];
    static MW ws[NFILES * PER_FILE];
    for (int f = 0; f < NFILES; f++) {
        snprintf(path[f], sizeof(path[f]), "%s/many-%d.raw", dir, f);
        int fd = open(path[f], O_RDWR | O_CREAT | O_TRUNC, 0644);
        QK_CHECK(fd >= 0 && ftruncate(fd, PER_FILE * 8192) == 0);
        close(fd);
        QkError err = {0};
        QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
        many[f] = qk_block_open(path[f], &o, &err);
        QK_CHECK(many[f] != NULL);
    }
    outstanding = NFILES * PER_FILE;
    for (int i = 0; i < PER_FILE; i++) {
        for (int f = 0; f < NFILES; f++) {
            MW *w = &ws[i * NFILES + f];
            w->file = f;
            w->i = i;
            qk_coroutine_enter(qk_coroutine_create(many_write_co, w));
        }
    }
    QkLoop *loop = qk_loop_get();
    while (outstanding) {
        qk_loop_run_once(loop, true);
    }
    for (int f = 0; f < NFILES; f++) {
        qk_block_close(many[f]);
        int fd = open(path[f], O_RDONLY);
        unsigned char buf[8192];
        for (int i = 0; i < PER_FILE; i++) {
            QK_CHECK_EQ(pread(fd, buf, sizeof(buf), (off_t)i * (off_t)sizeof(buf)), (ssize_t)sizeof(buf));
            QK_CHECK_EQ(buf[0], 1 + (f * PER_FILE + i) % 250);
            QK_CHECK_EQ(buf[sizeof(buf) - 1], 1 + (f * PER_FILE + i) % 250);
        }
        close(fd);
        unlink(path[f]);
    }
}

int main(void)
{
    char path[4096];
    const char *dir = getenv("TEST_DIR");
    snprintf(path, sizeof(path), "%s/file-io.raw", dir ? dir : ".");

    for (int direct = 0; direct < 2; direct++) {
        memset(model, 0, sizeof(model));
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        QK_CHECK(fd >= 0 && ftruncate(fd, FSIZE) == 0);
        close(fd);
        if (run_case(direct ? QK_OPEN_NOCACHE : 0, path) < 0) {
            if (direct) {
                fprintf(stderr, "O_DIRECT not supported here\n");
                break;
            }
            return 1;
        }
        qk_co_run(read_back_co, path);
    }
    qk_co_run(bulk_read_co, path);
    qk_co_run(bulk_cache_co, path);
    qk_co_run(write_behind_co, path);
    qk_co_run(background_co, path);
    many_files(dir ? dir : ".");
    QkError err = {0};
    QkOpenOptions o = {.format = "raw"};
    QK_CHECK(qk_block_open("/nonexistent/x", &o, &err) == NULL);
    QK_CHECK(strstr(err.msg, "Could not open '/nonexistent/x'") != NULL);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
