/*
 * Crash safety of freeing clusters: the change that drops a reference (an
 * L2 entry, a snapshot's tables) must be on disk before the refcount block
 * that lowers the cluster's refcount, and a freed cluster must not be
 * reused before the drop is on disk. The test pauses the image at every
 * refcount block write (the refblock_update breakpoint) during discards,
 * zero writes with unmap, subcluster discards and snapshot deletion, copies
 * the image file there as a crash would leave it, and has qemu-img check
 * the copy: leaks are fine, a referenced cluster with too low a refcount
 * is not. It also pauses a write that reuses a just-freed cluster after
 * its data reached the host and checks that the discarded guest cluster
 * of the copy does not show the new data.
 */
#include "qcow2_test_util.h"
#include "block/debug.h"
#include "block/snapshot.h"

#define CS 65536ULL
#define SIZE (64 * CS)

static int ncrash;

typedef struct Op {
    QkBlock *bs;
    int kind; /* 0 discard, 1 zero+unmap, 2 flush, 3 snapshot create, 4 snapshot delete, 5 write */
    uint64_t off, len;
    void *buf;
    const char *name;
    bool done;
    int ret;
} Op;

static void coroutine_fn op_co(void *opaque)
{
    Op *o = opaque;
    QkError err = {0};
    QkSnapshotInfo info = {.name = (char *)o->name, .icount = -1};
    switch (o->kind) {
    case 0: o->ret = qk_co_pdiscard(o->bs, o->off, o->len); break;
    case 1: o->ret = qk_co_pwrite_zeroes(o->bs, o->off, o->len, QK_REQ_MAY_UNMAP); break;
    case 2: o->ret = qk_co_flush(o->bs); break;
    case 3: o->ret = qk_co_snapshot_create(o->bs, &info, &err); break;
    case 4: o->ret = qk_co_snapshot_delete(o->bs, NULL, o->name, &err); break;
    default: o->ret = qk_co_pwrite(o->bs, o->off, o->len, o->buf, 0); break;
    }
    if (o->ret < 0) {
        fprintf(stderr, "op %d: %d %s\n", o->kind, o->ret, err.msg);
    }
    o->done = true;
}

/* Copies the image as a crash at this point would leave it (every write
 * that completed is in the file) and checks the copy with qemu-img. */
static void check_crash_copy(const char *img)
{
    ncrash++;
    QK_CHECK_EQ(t_sh("cp --sparse=always '%s' crash.qcow2", img), 0);
    /* 0: clean, 3: leaks only, 2: errors. A snapshot operation cannot
     * change a refcount and the COPIED flags that go with it in one
     * write, so a crash in between leaves flags qemu-img check reports;
     * both kinds of mismatch are harmless once the references are right
     * (a COPIED flag is only set on a cluster with one reference left).
     * Every other error is a failure. */
    int r = t_sh("qemu-img check crash.qcow2 >crash-check.log 2>&1");
    if (r == 2 && t_sh("grep -v 'OFLAG_COPIED' crash-check.log | grep -q '^ERROR'") != 0) {
        r = 3;
    }
    if (r != 0 && r != 3) {
        fprintf(stderr, "crash copy %d of %s: qemu-img check exit %d\n", ncrash, img, r);
        t_sh("cat crash-check.log >&2");
        qk_test_failures++;
    }
}

/* Runs o, pausing at every event ev for hook(img); returns o's result. */
static int run_paused(Op *o, QkDebugEvent ev, const char *img, void (*hook)(const char *))
{
    static int ntag;
    char tag[32];
    snprintf(tag, sizeof(tag), "t%d", ++ntag);
    QK_CHECK_EQ(qk_debug_break(ev, tag), 0);
    o->done = false;
    qk_coroutine_enter(qk_coroutine_create(op_co, o));
    QkLoop *loop = qk_loop_get();
    while (!o->done) {
        if (qk_debug_is_paused(tag)) {
            hook(img);
            char next[32];
            snprintf(next, sizeof(next), "t%d", ++ntag);
            QK_CHECK_EQ(qk_debug_break(ev, next), 0);
            QK_CHECK_EQ(qk_debug_resume(tag), 0);
            memcpy(tag, next, sizeof(tag));
            continue;
        }
        qk_loop_run_once(loop, true);
    }
    qk_debug_remove_break(tag);
    return o->ret;
}

static int run(QkBlock *bs, int kind, uint64_t off, uint64_t len, const char *img)
{
    Op o = {.bs = bs, .kind = kind, .off = off, .len = len};
    return run_paused(&o, QK_DBG_REFBLOCK_UPDATE, img, check_crash_copy);
}

static void fill(QkBlock *bs, uint64_t off, uint64_t len, int byte)
{
    uint8_t *buf = malloc(len);
    memset(buf, byte, len);
    QK_CHECK_EQ(t_write(bs, off, len, buf), 0);
    free(buf);
}

static void test_frees(bool extended_l2)
{
    const char *img = "free.qcow2";
    QkCreateOptions co = {.size = SIZE, .size_set = true, .extended_l2 = extended_l2};
    QK_CHECK_EQ(t_create(img, &co), 0);
    QkBlock *bs = t_open(img, QK_OPEN_RDWR);
    if (!bs) {
        qk_test_failures++;
        return;
    }
    fill(bs, 0, 16 * CS, 0x11);
    QK_CHECK_EQ(t_flush(bs), 0);

    /* Whole clusters, then a flush: the flush writes the refcount blocks. */
    QK_CHECK_EQ(run(bs, 0, 2 * CS, 3 * CS, img), 0);
    QK_CHECK_EQ(run(bs, 2, 0, 0, img), 0);
    QK_CHECK_EQ(run(bs, 1, 6 * CS, 2 * CS, img), 0);
    QK_CHECK_EQ(run(bs, 2, 0, 0, img), 0);
    if (extended_l2) {
        /* Halves of a cluster: the second frees it. */
        QK_CHECK_EQ(run(bs, 0, 9 * CS, CS / 2, img), 0);
        QK_CHECK_EQ(run(bs, 0, 9 * CS + CS / 2, CS / 2, img), 0);
        QK_CHECK_EQ(run(bs, 2, 0, 0, img), 0);
    }

    /* Snapshot delete after copy-on-write drops both kinds of reference. */
    Op sc = {.bs = bs, .kind = 3, .name = "s1"};
    QK_CHECK_EQ(run_paused(&sc, QK_DBG_REFBLOCK_UPDATE, img, check_crash_copy), 0);
    fill(bs, 10 * CS, 2 * CS, 0x22);
    QK_CHECK_EQ(run(bs, 0, 12 * CS, CS, img), 0);
    QK_CHECK_EQ(run(bs, 2, 0, 0, img), 0);
    Op sd = {.bs = bs, .kind = 4, .name = "s1"};
    QK_CHECK_EQ(run_paused(&sd, QK_DBG_REFBLOCK_UPDATE, img, check_crash_copy), 0);
    QK_CHECK_EQ(run(bs, 2, 0, 0, img), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(img), 0);
}

/* After the guest discards cluster 0, a write elsewhere may get its host
 * cluster. A crash after that write's data reached the host must not
 * leave cluster 0 mapped to the new data. */
static const char *reuse_img = "reuse.qcow2";

static void check_reuse_copy(const char *img)
{
    ncrash++;
    QK_CHECK_EQ(t_sh("cp --sparse=always '%s' crash.qcow2", img), 0);
    QkBlock *c = t_open("crash.qcow2", 0);
    if (!c) {
        qk_test_failures++;
        return;
    }
    uint8_t *buf = malloc(CS);
    QK_CHECK_EQ(t_read(c, 0, CS, buf), 0);
    bool old = true, zero = true;
    for (uint64_t i = 0; i < CS; i++) {
        old = old && buf[i] == 0x33;
        zero = zero && buf[i] == 0;
    }
    if (!old && !zero) {
        fprintf(stderr, "crash copy: discarded cluster shows other data (%02x)\n", buf[0]);
        qk_test_failures++;
    }
    free(buf);
    qk_block_close(c);
}

static void test_reuse(bool lazy)
{
    QkCreateOptions co = {.size = SIZE, .size_set = true, .lazy_refcounts = lazy};
    QK_CHECK_EQ(t_create(reuse_img, &co), 0);
    QkBlock *bs = t_open(reuse_img, QK_OPEN_RDWR);
    if (!bs) {
        qk_test_failures++;
        return;
    }
    fill(bs, 0, CS, 0x33);
    fill(bs, CS, CS, 0x34);
    QK_CHECK_EQ(t_flush(bs), 0);
    QK_CHECK_EQ(t_discard(bs, 0, CS), 0);
    uint8_t *buf = malloc(CS);
    memset(buf, 0x44, CS);
    Op w = {.bs = bs, .kind = 5, .off = 8 * CS, .len = CS, .buf = buf};
    QK_CHECK_EQ(run_paused(&w, QK_DBG_WRITE_DONE, reuse_img, check_reuse_copy), 0);
    free(buf);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(reuse_img), 0);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img not found");
    }
    char dir[] = "/tmp/qk-free-order-XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0) {
        return 1;
    }
    test_frees(false);
    test_frees(true);
    test_reuse(false);
    test_reuse(true);
    QK_CHECK(ncrash > 10);
    t_sh("rm -rf '%s'", dir);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
