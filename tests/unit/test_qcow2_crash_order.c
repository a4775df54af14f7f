/*
 * Crash ordering of allocations, pinned by the two defects it fixed:
 *  - a refcount block placed in a cluster that an existing block counts:
 *    the refcount table entry must reach the file only after that
 *    block's increment (a SIGKILL in between left "refcount=0
 *    reference=1"). The test pauses writes at every allocation, data
 *    completion, refcount block write and flush while the image grows
 *    over many refcount blocks with holes to reuse, copies the file as a
 *    SIGKILL there would leave it, and has qemu-img check the copy.
 *  - data written into a cluster that keeps its host cluster (zeroed
 *    without unmap, then partly rewritten) must be flushed before the L2
 *    table that exposes it: the test pauses at each flush after such a
 *    write and checks the L2 table on disk has not changed before the
 *    first one (else a power loss could show the old data where a
 *    completed flush had made zeros durable).
 */
#include "qcow2_test_util.h"
#include "block/debug.h"

static int ncopies;

typedef struct Op {
    QkBlock *bs;
    int kind; /* 0 write, 1 discard, 2 flush, 3 zero write (no unmap) */
    uint64_t off, len;
    void *buf;
    bool done;
    int ret;
} Op;

static void coroutine_fn op_co(void *opaque)
{
    Op *o = opaque;
    switch (o->kind) {
    case 0: o->ret = qk_co_pwrite(o->bs, o->off, o->len, o->buf, 0); break;
    case 1: o->ret = qk_co_pdiscard(o->bs, o->off, o->len); break;
    case 2: o->ret = qk_co_flush(o->bs); break;
    default: o->ret = qk_co_pwrite_zeroes(o->bs, o->off, o->len, 0); break;
    }
    o->done = true;
}

/* Runs o; at every event in evs (one-shot breakpoints re-armed each time)
 * calls hook(arg) while the request is paused. Returns o's result. */
static int run_paused(Op *o, const QkDebugEvent *evs, int nev, void (*hook)(void *), void *arg)
{
    static int ntag;
    char tags[8][32];
    for (int i = 0; i < nev; i++) {
        snprintf(tags[i], sizeof(tags[i]), "c%d", ++ntag);
        QK_CHECK_EQ(qk_debug_break(evs[i], tags[i]), 0);
    }
    o->done = false;
    qk_coroutine_enter(qk_coroutine_create(op_co, o));
    QkLoop *loop = qk_loop_get();
    while (!o->done) {
        bool any = false;
        for (int i = 0; i < nev; i++) {
            if (qk_debug_is_paused(tags[i])) {
                hook(arg);
                char next[32];
                snprintf(next, sizeof(next), "c%d", ++ntag);
                QK_CHECK_EQ(qk_debug_break(evs[i], next), 0);
                QK_CHECK_EQ(qk_debug_resume(tags[i]), 0);
                memcpy(tags[i], next, sizeof(next));
                any = true;
            }
        }
        if (!any) {
            qk_loop_run_once(loop, true);
        }
    }
    for (int i = 0; i < nev; i++) {
        qk_debug_remove_break(tags[i]);
    }
    return o->ret;
}

/* The file as a SIGKILL would leave it: every completed write is in it. */
static void check_kill_copy(void *arg)
{
    const char *img = arg;
    ncopies++;
    QK_CHECK_EQ(t_sh("cp --sparse=always '%s' kill.qcow2", img), 0);
    int r = t_sh("qemu-img check kill.qcow2 >kill-check.log 2>&1");
    if (r != 0 && r != 3) {
        fprintf(stderr, "copy %d of %s: qemu-img check exit %d\n", ncopies, img, r);
        t_sh("cat kill-check.log >&2");
        qk_test_failures++;
    }
}

static uint64_t ld64_at(int fd, uint64_t off)
{
    uint8_t b[8] = {0};
    if (pread(fd, b, 8, (off_t)off) != 8) {
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = v << 8 | b[i];
    }
    return v;
}

/* Refcount blocks that sit in a cluster another block counts. */
static int foreign_blocks(const char *img, unsigned cluster_bits, unsigned rb_bits)
{
    int fd = open(img, O_RDONLY);
    if (fd < 0) {
        return -1;
    }
    uint64_t rt = ld64_at(fd, 48);
    uint64_t n = (ld64_at(fd, 56) >> 32) << (cluster_bits - 3);
    int foreign = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t b = ld64_at(fd, rt + 8 * i) & ~511ULL;
        if (b && (b >> cluster_bits) >> rb_bits != i) {
            foreign++;
        }
    }
    close(fd);
    return foreign;
}

static void test_refblock_in_counted_cluster(void)
{
    enum { CB = 9, CS = 1 << CB, L2SPAN = 64 * CS };
    const char *img = "rb.qcow2";
    QkCreateOptions co = {.size = 64ULL << 20, .size_set = true, .cluster_size = CS};
    QK_CHECK_EQ(t_create(img, &co), 0);
    QkBlock *bs = t_open(img, QK_OPEN_RDWR);
    if (!bs) {
        qk_test_failures++;
        return;
    }
    uint8_t *buf = malloc(L2SPAN);
    static const QkDebugEvent evs[] = {QK_DBG_CLUSTER_ALLOC, QK_DBG_WRITE_DONE, QK_DBG_REFBLOCK_UPDATE,
                                       QK_DBG_FLUSH};
    uint64_t next = 0;
    uint32_t seed = 7;
    /* Each round makes a new L2 table (writing one cluster of its span),
     * frees two lone clusters in what is written, then writes the rest of
     * the table's span: the contiguous run crosses into ranges no block covers yet,
     * and the search for a block finds a hole left behind. */
    for (int round = 0; round < 14; round++) {
        memset(buf, 0x40 + round, L2SPAN);
        Op w0 = {.bs = bs, .kind = 0, .off = next, .len = CS, .buf = buf};
        QK_CHECK_EQ(run_paused(&w0, evs, 4, check_kill_copy, (void *)img), 0);
        for (int h = 0; h < 2 && next; h++) {
            seed = seed * 1103515245 + 12345;
            uint64_t c = (seed >> 8) % (next / CS);
            Op d = {.bs = bs, .kind = 1, .off = c * CS, .len = CS};
            QK_CHECK_EQ(run_paused(&d, evs, 4, check_kill_copy, (void *)img), 0);
        }
        /* The holes' zero refcounts on disk, as a guest flush leaves them. */
        Op fh = {.bs = bs, .kind = 2};
        QK_CHECK_EQ(run_paused(&fh, evs, 4, check_kill_copy, (void *)img), 0);
        Op w = {.bs = bs, .kind = 0, .off = next + CS, .len = L2SPAN - CS, .buf = buf};
        QK_CHECK_EQ(run_paused(&w, evs, 4, check_kill_copy, (void *)img), 0);
        next += L2SPAN;
    }
    free(buf);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(img), 0);
    /* 16-bit refcounts: a 512-byte block counts 256 clusters. */
    int foreign = foreign_blocks(img, CB, CB - 1);
    fprintf(stderr, "refcount blocks in clusters counted by another block: %d\n", foreign);
    QK_CHECK(foreign > 0); /* else the case this test is for never happened */
}

/* Defect 2: the L2 table on disk at the first flush after the data write. */
typedef struct L2Watch {
    const char *img;
    uint8_t *before;
    uint32_t cs;
    int flushes;
    bool changed_at_first;
} L2Watch;

static int read_l2_table(const char *img, uint32_t cs, uint8_t *out)
{
    int fd = open(img, O_RDONLY);
    if (fd < 0) {
        return -1;
    }
    uint64_t l1 = ld64_at(fd, 40);
    uint64_t l2 = ld64_at(fd, l1) & 0x00fffffffffffe00ULL;
    ssize_t n = l2 ? pread(fd, out, cs, (off_t)l2) : -1;
    close(fd);
    return n == (ssize_t)cs ? 0 : -1;
}

static void watch_flush(void *arg)
{
    L2Watch *w = arg;
    uint8_t *now = malloc(w->cs);
    QK_CHECK_EQ(read_l2_table(w->img, w->cs, now), 0);
    if (w->flushes++ == 0) {
        w->changed_at_first = memcmp(now, w->before, w->cs) != 0;
    }
    free(now);
}

static void test_data_before_l2(bool extended_l2)
{
    enum { CS = 16384 };
    const char *img = "zero.qcow2";
    QkCreateOptions co = {.size = 1 << 20, .size_set = true, .cluster_size = CS, .extended_l2 = extended_l2};
    QK_CHECK_EQ(t_create(img, &co), 0);
    QkBlock *bs = t_open(img, QK_OPEN_RDWR);
    if (!bs) {
        qk_test_failures++;
        return;
    }
    uint8_t buf[CS];
    memset(buf, 0xaa, sizeof(buf));
    QK_CHECK_EQ(t_write(bs, 0, CS, buf), 0);
    QK_CHECK_EQ(t_flush(bs), 0);
    /* Zeroed without unmap: the cluster keeps its host cluster. */
    QK_CHECK_EQ(t_zero(bs, 0, CS, 0), 0);
    QK_CHECK_EQ(t_flush(bs), 0);

    L2Watch w = {.img = img, .cs = CS, .before = malloc(CS)};
    QK_CHECK_EQ(read_l2_table(img, CS, w.before), 0);
    memset(buf, 0xbb, 300);
    QK_CHECK_EQ(t_write(bs, 1000, 300, buf), 0);
    Op f = {.bs = bs, .kind = 2};
    static const QkDebugEvent ev[] = {QK_DBG_FLUSH};
    QK_CHECK_EQ(run_paused(&f, ev, 1, watch_flush, &w), 0);
    QK_CHECK(w.flushes >= 2);
    if (w.changed_at_first) {
        fprintf(stderr, "extended_l2=%d: the L2 table exposing new data was written before any flush\n",
                extended_l2);
        qk_test_failures++;
    }
    uint8_t back[CS], want[CS];
    memset(want, 0, CS);
    memset(want + 1000, 0xbb, 300);
    QK_CHECK_EQ(t_read(bs, 0, CS, back), 0);
    QK_CHECK(memcmp(back, want, CS) == 0);
    free(w.before);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(img), 0);
}

static int nflush;

static void count_flush(void *arg)
{
    (void)arg;
    nflush++;
}

/* cache=writethrough makes zero writes and discards stable before they
 * complete, as it does data writes: a flush reaches the host in each. */
static void test_writethrough(void)
{
    enum { CS = 65536 };
    const char *img = "wt.qcow2";
    QkCreateOptions co = {.size = 16 * CS, .size_set = true};
    QK_CHECK_EQ(t_create(img, &co), 0);
    static const QkDebugEvent ev[] = {QK_DBG_FLUSH};
    for (int wt = 0; wt < 2; wt++) {
        QkBlock *bs = t_open(img, QK_OPEN_RDWR | (wt ? QK_OPEN_WRITETHROUGH : 0));
        if (!bs) {
            qk_test_failures++;
            return;
        }
        uint8_t *buf = malloc(4 * CS);
        memset(buf, 0x5e, 4 * CS);
        QK_CHECK_EQ(t_write(bs, 0, 4 * CS, buf), 0);
        free(buf);
        /* The switch from allocating to freeing flushes once in any mode:
         * made here, so what follows counts only what writethrough adds. */
        QK_CHECK_EQ(t_discard(bs, 3 * CS, CS), 0);
        for (int kind = 0; kind < 2; kind++) {
            nflush = 0;
            Op o = {.bs = bs, .kind = kind ? 1 : 3, .off = kind ? 2 * CS : 0, .len = CS};
            QK_CHECK_EQ(run_paused(&o, ev, 1, count_flush, NULL), 0);
            if (wt ? nflush < 1 : nflush != 0) {
                fprintf(stderr, "writethrough=%d, %s: %d flushes\n", wt, kind ? "discard" : "zero write", nflush);
                qk_test_failures++;
            }
        }
        qk_block_close(bs);
    }
    QK_CHECK_EQ(t_qemu_check(img), 0);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img not found");
    }
    char dir[] = "/tmp/qk-crash-order-XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0) {
        return 1;
    }
    test_refblock_in_counted_cluster();
    test_data_before_l2(false);
    test_data_before_l2(true);
    test_writethrough();
    fprintf(stderr, "crash copies checked: %d\n", ncopies);
    QK_CHECK(ncopies > 100);
    t_sh("rm -rf '%s'", dir);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
