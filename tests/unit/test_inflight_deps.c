/*
 * Who waits for whom among requests in flight, made deterministic with
 * debug breakpoints: a request is paused while holding its place in the
 * in-flight lists, a second one that must wait for it is started, and the
 * test checks that the second does not finish before the first is resumed
 * and that the data ends up as the order of issue says.
 *
 * File node under O_DIRECT: a write of whole blocks and a write that
 * reads-modifies-writes the same block wait for each other, either way
 * round. qcow2: a read of a cluster that an allocating write is newly
 * allocating waits for that write (plain requests are kept apart from the
 * allocating ones but must still see them).
 */
#include "qcow2_test_util.h"
#include "block/debug.h"

#define CS 65536ULL

static void start(TReq *t, int *outstanding)
{
    *outstanding = 1;
    t->outstanding = outstanding;
    qk_coroutine_enter(qk_coroutine_create(treq_co, t));
}

static void coroutine_fn wait_done(int *outstanding)
{
    while (*outstanding) {
        qk_co_sleep_ns(1000000);
    }
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            return false;
        }
    }
    return true;
}

typedef struct FileCase {
    const char *path;
} FileCase;

/* First paused, second started: the second must not finish while the
 * first holds the block. */
static void coroutine_fn pair(QkBlock *bs, const char *tag, TReq *first, TReq *second)
{
    int d1, d2;
    QK_CHECK_EQ(qk_debug_break(QK_DBG_DIRECT_WRITE, tag), 0);
    start(first, &d1);
    qk_debug_wait_break(tag);
    start(second, &d2);
    qk_co_sleep_ns(30000000);
    QK_CHECK_EQ(d2, 1);
    QK_CHECK_EQ(qk_debug_resume(tag), 0);
    wait_done(&d1);
    wait_done(&d2);
    QK_CHECK_EQ(first->ret, 0);
    QK_CHECK_EQ(second->ret, 0);
    (void)bs;
}

static void coroutine_fn file_body(void *opaque)
{
    FileCase *fc = opaque;
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR | QK_OPEN_NOCACHE, .format = "raw"};
    QkBlock *bs = qk_co_block_open(fc->path, &o, &err);
    QK_CHECK(bs != NULL);
    if (!bs) {
        fprintf(stderr, "open: %s\n", err.msg);
        return;
    }
    uint64_t a = bs->file->request_alignment;
    QK_CHECK(a >= 512 && a <= 8192);
    unsigned char *b11 = qk_aligned_alloc(4096, a), *b22 = qk_aligned_alloc(4096, a);
    unsigned char *b33 = qk_aligned_alloc(4096, a), *b44 = qk_aligned_alloc(4096, a);
    unsigned char *back = qk_aligned_alloc(4096, 2 * a);
    memset(b11, 0x11, a);
    memset(b22, 0x22, a);
    memset(b33, 0x33, a);
    memset(b44, 0x44, a);

    /* A partial-block write holds block 0; a whole-block write of it waits
     * and lands last. */
    TReq w1 = {.bs = bs, .op = 1, .off = 100, .len = 100, .buf = b11};
    TReq w2 = {.bs = bs, .op = 1, .off = 0, .len = a, .buf = b22};
    pair(bs, "rmw-first", &w1, &w2);
    /* A whole-block write holds block 1; a partial one waits and lands
     * last, inside it. */
    TReq w3 = {.bs = bs, .op = 1, .off = a, .len = a, .buf = b33};
    TReq w4 = {.bs = bs, .op = 1, .off = a + 100, .len = 100, .buf = b44};
    pair(bs, "plain-first", &w3, &w4);

    QK_CHECK_EQ(qk_co_pread(bs, 0, 2 * a, back, 0), 0);
    QK_CHECK(all_bytes(back, a, 0x22));
    QK_CHECK(all_bytes(back + a, 100, 0x33));
    QK_CHECK(all_bytes(back + a + 100, 100, 0x44));
    QK_CHECK(all_bytes(back + a + 200, a - 200, 0x33));
    qk_co_block_close(bs);
    free(b11);
    free(b22);
    free(b33);
    free(b44);
    free(back);
}

static void coroutine_fn qcow2_body(void *opaque)
{
    const char *path = opaque;
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "qcow2"};
    QkBlock *bs = qk_co_block_open(path, &o, &err);
    QK_CHECK(bs != NULL);
    if (!bs) {
        fprintf(stderr, "open: %s\n", err.msg);
        return;
    }
    unsigned char *data = malloc(CS), *got = malloc(4096);
    memset(data, 0x55, CS);
    memset(got, 0, 4096);
    int dw, dr;
    /* The allocating write of cluster 1 pauses before its data goes out:
     * the cluster has no L2 entry yet. */
    QK_CHECK_EQ(qk_debug_break(QK_DBG_WRITE_AIO, "alloc"), 0);
    TReq w = {.bs = bs, .op = 1, .off = CS, .len = CS, .buf = data};
    start(&w, &dw);
    qk_debug_wait_break("alloc");
    TReq r = {.bs = bs, .op = 0, .off = CS + 4096, .len = 4096, .buf = got};
    start(&r, &dr);
    qk_co_sleep_ns(30000000);
    QK_CHECK_EQ(dr, 1);
    QK_CHECK_EQ(qk_debug_resume("alloc"), 0);
    wait_done(&dw);
    wait_done(&dr);
    QK_CHECK_EQ(w.ret, 0);
    QK_CHECK_EQ(r.ret, 0);
    QK_CHECK(all_bytes(got, 4096, 0x55));
    qk_co_block_close(bs);
    free(data);
    free(got);
}

int main(void)
{
    const char *raw = "deps.raw";
    int fd = open(raw, O_CREAT | O_TRUNC | O_RDWR, 0644);
    QK_CHECK(fd >= 0);
    QK_CHECK_EQ(ftruncate(fd, 1 << 20), 0);
    close(fd);
    FileCase fc = {.path = raw};
    qk_co_run(file_body, &fc);

    const char *img = "deps.qcow2";
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 %s 4M", img), 0);
    qk_co_run(qcow2_body, (void *)img);
    QK_CHECK_EQ(t_sh("qemu-img check -q %s", img), 0);
    qk_loop_destroy_current();
    QK_TEST_DONE();
}
