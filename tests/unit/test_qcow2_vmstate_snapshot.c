/*
 * Internal snapshots and VM state in qcow2 images: disk content after
 * revert equals the content at snapshot time and later writes do not
 * change a snapshot (cluster sizes 4k..2M, extended L2, a resize between);
 * VM-state streams of several sizes written in random pieces of 1 B..64 KiB
 * with cache none and writeback read back byte for byte; a write error in
 * the middle of a save fails it and leaves no snapshot and no leak; drain
 * and close wait for state writes in flight. qemu-img check judges.
 */
#include "qcow2_test_util.h"
#include "block/snapshot.h"
#include "block/vmstate.h"

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct Op {
    QkBlock *bs;
    int kind;
    const char *name;
    const char *id;            /* create: NULL picks the next number */
    uint64_t vm_size;
    QkSnapshotInfo *list;
    int n;
    int ret;
    QkError err;
} Op;

static void coroutine_fn op_co(void *opaque)
{
    Op *o = opaque;
    QkError err = {0};
    QkSnapshotInfo info = {.id = (char *)o->id, .name = (char *)o->name, .vm_state_size = o->vm_size,
                           .icount = -1};
    switch (o->kind) {
    case 0: o->ret = qk_co_snapshot_create(o->bs, &info, &err); break;
    case 1: o->ret = qk_co_snapshot_goto(o->bs, o->name, NULL, &err); break;
    case 2: o->ret = qk_co_snapshot_delete(o->bs, NULL, o->name, &err); break;
    case 3: o->ret = qk_co_snapshot_list(o->bs, &o->list, &o->n, &err); break;
    default: o->ret = qk_co_vmstate_discard(o->bs, &err); break;
    }
    if (o->ret < 0) {
        fprintf(stderr, "snapshot op %d '%s': %s\n", o->kind, o->name ? o->name : "", err.msg);
        o->err = err;
    }
}

static int snap(QkBlock *bs, int kind, const char *name, uint64_t vm_size)
{
    Op o = {.bs = bs, .kind = kind, .name = name, .vm_size = vm_size};
    qk_co_run(op_co, &o);
    if (kind == 3) {
        qk_snapshot_list_free(o.list, o.n);
        return o.ret < 0 ? o.ret : o.n;
    }
    return o.ret;
}

static void random_writes(QkBlock *bs, uint8_t *model, uint64_t size, int n, uint64_t cs)
{
    uint8_t *buf = malloc(2 * cs + 8192);
    for (int i = 0; i < n; i++) {
        uint64_t lim = QK_MIN(2 * cs + 8192, size / 4);
        uint64_t len = 1 + rnd() % lim;
        uint64_t off = rnd() % (size - len);
        memset(buf, (int)(rnd() & 0xff), len);
        buf[0] ^= 0x5a;
        QK_CHECK_EQ(t_write(bs, off, len, buf), 0);
        memcpy(model + off, buf, len);
    }
    free(buf);
}

/* Disk snapshots: COW after the snapshot, revert, delete, on one geometry. */
static void test_disk(uint32_t cs, bool ext)
{
    const char *path = "snap.qcow2";
    uint64_t size = QK_MAX(16ULL << 20, 8ULL * cs);
    QkCreateOptions co = {.size = size, .cluster_size = cs, .extended_l2 = ext, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    QkBlock *bs = t_open(path, QK_OPEN_RDWR);
    uint8_t *m1 = calloc(1, size), *m2 = malloc(size), *m3 = malloc(size);
    random_writes(bs, m1, size, 40, cs);
    QK_CHECK_EQ(snap(bs, 0, "one", 0), 0);
    memcpy(m2, m1, size);
    random_writes(bs, m2, size, 40, cs);
    QK_CHECK_EQ(t_verify(bs, m2, size), 0);
    QK_CHECK_EQ(snap(bs, 0, "two", 0), 0);
    memcpy(m3, m2, size);
    random_writes(bs, m3, size, 20, cs);
    QK_CHECK_EQ(snap(bs, 3, NULL, 0), 2);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);

    bs = t_open(path, QK_OPEN_RDWR);
    QK_CHECK_EQ(t_verify(bs, m3, size), 0);
    QK_CHECK_EQ(snap(bs, 1, "one", 0), 0);
    QK_CHECK_EQ(t_verify(bs, m1, size), 0);
    /* Writing after a revert must leave both snapshots as they were. */
    memcpy(m3, m1, size);
    random_writes(bs, m3, size, 20, cs);
    QK_CHECK_EQ(snap(bs, 1, "2", 0), 0); /* by id */
    QK_CHECK_EQ(t_verify(bs, m2, size), 0);
    QK_CHECK_EQ(snap(bs, 2, "one", 0), 0);
    QK_CHECK(snap(bs, 1, "one", 0) == -ENOENT);
    QK_CHECK_EQ(t_verify(bs, m2, size), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    QK_CHECK_EQ(t_sh("qemu-img snapshot -a two %s", path), 0);
    bs = t_open(path, QK_OPEN_RDWR);
    QK_CHECK_EQ(t_verify(bs, m2, size), 0);
    QK_CHECK_EQ(snap(bs, 2, "two", 0), 0);
    QK_CHECK_EQ(snap(bs, 3, NULL, 0), 0);
    QK_CHECK_EQ(t_verify(bs, m2, size), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    free(m1);
    free(m2);
    free(m3);
}

/* A revert restores the virtual size the snapshot had. */
static void test_resize(void)
{
    const char *path = "resize.qcow2";
    QkCreateOptions co = {.size = 8 << 20, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    QkBlock *bs = t_open(path, QK_OPEN_RDWR);
    uint8_t *m = calloc(1, 8 << 20);
    random_writes(bs, m, 8 << 20, 10, 65536);
    QK_CHECK_EQ(snap(bs, 0, "small", 0), 0);
    QkError err = {0};
    QK_CHECK_EQ(qk_block_length(bs), 8 << 20);
    qk_block_close(bs);
    QK_CHECK_EQ(t_sh("qemu-img resize -q %s 1G", path), 0);
    QK_CHECK_EQ(t_sh("qemu-io -c 'write -P 7 900M 1M' %s >/dev/null", path), 0);
    bs = t_open(path, QK_OPEN_RDWR);
    QK_CHECK_EQ(qk_block_length(bs), 1 << 30);
    QK_CHECK_EQ(snap(bs, 1, "small", 0), 0);
    QK_CHECK_EQ(qk_block_length(bs), 8 << 20);
    QK_CHECK_EQ(t_verify(bs, m, 8 << 20), 0);
    qk_block_close(bs);
    (void)err;
    QK_CHECK_EQ(t_qemu_check(path), 0);
    QK_CHECK_EQ(t_sh("qemu-img info %s | grep -q 'virtual size: 8 MiB'", path), 0);
    free(m);
}

/* ---- VM state ---- */

static uint64_t fail_pos = UINT64_MAX;
static int sink_calls, sink_done;
static int64_t sink_delay_ns;

static int coroutine_fn test_sink(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    sink_calls++;
    if (sink_delay_ns) {
        qk_co_sleep_ns(sink_delay_ns);
    }
    int r = pos + qiov->size > fail_pos ? -EIO : bs->drv->co_save_vmstate(bs, qiov, pos);
    sink_done++;
    return r;
}

typedef struct Save {
    QkBlock *bs;
    const uint8_t *data;
    uint64_t len;
    QkVmStateOptions o;
    bool read;
    bool no_flush;
    int ret;
    QkVmStateWriter *w;
} Save;

static void coroutine_fn save_co(void *opaque)
{
    Save *s = opaque;
    if (s->read) {
        QkVmStateReader *r = qk_vmstate_reader_new(s->bs, s->len, &s->o, NULL);
        uint8_t *buf = malloc(65536);
        s->ret = 0;
        for (uint64_t pos = 0; pos < s->len && s->ret == 0;) {
            size_t want = 1 + rnd() % 65536;
            int64_t n = qk_vmstate_read(r, pos, buf, want);
            if (n <= 0 || memcmp(buf, s->data + pos, (size_t)n) != 0) {
                fprintf(stderr, "read back at %llu: %lld\n", (unsigned long long)pos, (long long)n);
                s->ret = -1;
                break;
            }
            pos += (uint64_t)n;
        }
        free(buf);
        qk_vmstate_reader_close(r);
        return;
    }
    QkVmStateWriter *w = qk_vmstate_writer_new(s->bs, &s->o, test_sink);
    int r = 0;
    for (uint64_t pos = 0; pos < s->len && r == 0;) {
        uint64_t piece = 1 + rnd() % 65536; /* once: QK_MIN evaluates twice */
        size_t n = (size_t)QK_MIN(piece, s->len - pos);
        r = qk_vmstate_write(w, pos, s->data + pos, n);
        pos += n;
    }
    if (s->no_flush) {
        s->w = w;
        s->ret = r;
        return;
    }
    int fr = qk_vmstate_writer_flush(w);
    qk_vmstate_writer_free(w);
    s->ret = r < 0 ? r : fr;
}

static void test_roundtrip(int flags, uint64_t len)
{
    const char *path = "vm.qcow2";
    QkCreateOptions co = {.size = 10 << 20, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    uint8_t *data = malloc(QK_MAX(len, 1));
    for (uint64_t i = 0; i < len; i++) {
        data[i] = (uint8_t)(rnd() >> 24);
    }
    QkBlock *bs = t_open(path, QK_OPEN_RDWR | flags);
    Save s = {.bs = bs, .data = data, .len = len, .o = {.buf_size = 256 << 10, .workers = 3}};
    qk_co_run(save_co, &s);
    QK_CHECK_EQ(s.ret, 0);
    QK_CHECK_EQ(snap(bs, 0, "vm", len), 0);
    QK_CHECK_EQ(snap(bs, 4, NULL, 0), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    QK_CHECK_EQ(t_sh("qemu-img snapshot -l %s | grep -q ' vm '", path), 0);
    bs = t_open(path, QK_OPEN_RDWR | flags);
    QK_CHECK_EQ(snap(bs, 1, "vm", 0), 0);
    s.bs = bs;
    s.read = true;
    s.o.workers = 2;
    qk_co_run(save_co, &s);
    QK_CHECK_EQ(s.ret, 0);
    QK_CHECK_EQ(snap(bs, 4, NULL, 0), 0);
    QK_CHECK_EQ(snap(bs, 2, "vm", 0), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    free(data);
}

static void test_write_error(void)
{
    const char *path = "err.qcow2";
    QkCreateOptions co = {.size = 10 << 20, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    uint64_t len = 3 << 20;
    uint8_t *data = malloc(len);
    memset(data, 0x3c, len);
    QkBlock *bs = t_open(path, QK_OPEN_RDWR | QK_OPEN_NOCACHE);
    fail_pos = len / 2;
    Save s = {.bs = bs, .data = data, .len = len, .o = {.buf_size = 256 << 10, .workers = 4}};
    qk_co_run(save_co, &s);
    fail_pos = UINT64_MAX;
    QK_CHECK_EQ(s.ret, -EIO);
    /* What a failed save does instead of taking the snapshot. */
    QK_CHECK_EQ(snap(bs, 4, NULL, 0), 0);
    QK_CHECK_EQ(snap(bs, 3, NULL, 0), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    QK_CHECK_EQ(t_sh("test -z \"$(qemu-img snapshot -l %s)\"", path), 0);
    free(data);
}

typedef struct DrainRun {
    Save s;
    int close;
    int done_at_drain;
    unsigned in_flight_after;
} DrainRun;

static void coroutine_fn drain_co(void *opaque)
{
    DrainRun *d = opaque;
    save_co(&d->s);
    if (d->close) {
        qk_co_block_close(d->s.bs);
    } else {
        qk_co_drain(d->s.bs);
        d->in_flight_after = d->s.bs->in_flight;
    }
    d->done_at_drain = sink_done;
    /* Nothing is buffered (the stream is whole buffers), so flushing
     * does not touch the node again. */
    qk_vmstate_writer_flush(d->s.w);
    qk_vmstate_writer_free(d->s.w);
}

static void test_drain(int close)
{
    const char *path = "drain.qcow2";
    QkCreateOptions co = {.size = 10 << 20, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    uint64_t buf = 256 << 10, len = 6 * buf;
    uint8_t *data = malloc(len);
    for (uint64_t i = 0; i < len; i++) {
        data[i] = (uint8_t)(i * 7);
    }
    QkBlock *bs = t_open(path, QK_OPEN_RDWR);
    sink_calls = sink_done = 0;
    sink_delay_ns = 20 * 1000 * 1000;
    DrainRun d = {.s = {.bs = bs, .data = data, .len = len, .o = {.buf_size = buf, .workers = 4},
                        .no_flush = true}, .close = close};
    qk_co_run(drain_co, &d);
    sink_delay_ns = 0;
    QK_CHECK_EQ(d.s.ret, 0);
    QK_CHECK_EQ(sink_calls, 6);
    QK_CHECK_EQ(d.done_at_drain, 6);
    if (!close) {
        QK_CHECK_EQ(d.in_flight_after, 0);
        qk_block_close(bs);
    }
    /* Everything reached the image before it was closed. */
    bs = t_open(path, QK_OPEN_RDWR);
    Save r = {.bs = bs, .data = data, .len = len, .read = true, .o = {.buf_size = buf}};
    qk_co_run(save_co, &r);
    QK_CHECK_EQ(r.ret, 0);
    QK_CHECK_EQ(snap(bs, 4, NULL, 0), 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    free(data);
}

/* Names may repeat, ids may not (as in qemu-img): apply takes the id
 * first, then the first snapshot of that name; delete goes by name. */
static void test_same_name(void)
{
    const char *path = "same.qcow2";
    const uint64_t size = 8 << 20, len = 1 << 20;
    QkCreateOptions co = {.size = size, .size_set = true};
    QK_CHECK_EQ(t_create(path, &co), 0);
    QkBlock *bs = t_open(path, QK_OPEN_RDWR);
    uint8_t *model[4], *buf = malloc(len);
    /* model[k]: the disk after writing pattern k+1 at 0 (taken as ids 1..3). */
    for (int k = 0; k < 4; k++) {
        model[k] = calloc(1, size);
        memset(model[k], k + 1, len);
        memset(buf, k + 1, len);
        QK_CHECK_EQ(t_write(bs, 0, len, buf), 0);
        if (k < 3) {
            QK_CHECK_EQ(snap(bs, 0, k < 2 ? "a" : "1", 0), 0); /* ids 1 "a", 2 "a", 3 "1" */
        }
    }
    QK_CHECK_EQ(snap(bs, 3, NULL, 0), 3);
    Op dup = {.bs = bs, .kind = 0, .name = "b", .id = "2"};
    qk_co_run(op_co, &dup);
    QK_CHECK_EQ(dup.ret, -EEXIST);
    QK_CHECK_EQ(snap(bs, 1, "a", 0), 0);
    QK_CHECK_EQ(t_verify(bs, model[0], size), 0);
    QK_CHECK_EQ(snap(bs, 1, "3", 0), 0);
    QK_CHECK_EQ(t_verify(bs, model[2], size), 0);
    QK_CHECK_EQ(snap(bs, 1, "1", 0), 0); /* id 1, not the snapshot named "1" */
    QK_CHECK_EQ(t_verify(bs, model[0], size), 0);
    QK_CHECK_EQ(snap(bs, 2, "a", 0), 0); /* the first "a": id 1 */
    QK_CHECK_EQ(snap(bs, 1, "a", 0), 0);
    QK_CHECK_EQ(t_verify(bs, model[1], size), 0);
    QK_CHECK_EQ(snap(bs, 2, "1", 0), 0); /* by name: id 3 */
    Op l = {.bs = bs, .kind = 3};
    qk_co_run(op_co, &l);
    QK_CHECK(l.ret == 0 && l.n == 1 && strcmp(l.list[0].id, "2") == 0);
    qk_snapshot_list_free(l.list, l.n);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check(path), 0);
    for (int k = 0; k < 4; k++) {
        free(model[k]);
    }
    free(buf);
    unlink(path);
}

/* A format without internal snapshots: every call fails with -ENOTSUP
 * and a message naming the format, through the same driver-table path. */
static void test_unsupported(void)
{
    const char *path = "plain.raw";
    FILE *f = fopen(path, "w");
    QK_CHECK(f && ftruncate(fileno(f), 1 << 20) == 0);
    fclose(f);
    QkError err = {0};
    QkOpenOptions oo = {.flags = QK_OPEN_RDWR, .format = "raw"};
    QkBlock *bs = qk_block_open(path, &oo, &err);
    QK_CHECK(bs != NULL);
    if (!bs) {
        return;
    }
    QK_CHECK(!qk_block_has_snapshots(bs));
    for (int kind = 0; kind <= 4; kind++) {
        Op o = {.bs = bs, .kind = kind, .name = "s"};
        qk_co_run(op_co, &o);
        QK_CHECK_EQ(o.ret, -ENOTSUP);
        QK_CHECK(strstr(o.err.msg, "'raw' format does not support internal snapshots") != NULL);
        QK_CHECK(o.list == NULL && o.n == 0);
    }
    qk_block_close(bs);
    unlink(path);
}

int main(void)
{
    if (!t_have_qemu()) {
        QK_TEST_SKIP("qemu-img/qemu-io not installed");
    }
    static const uint32_t sizes[] = {4096, 65536, 2 << 20};
    for (size_t i = 0; i < QK_ARRAY_SIZE(sizes); i++) {
        test_disk(sizes[i], false);
    }
    test_disk(65536, true);
    test_resize();
    static const uint64_t lens[] = {0, 1, 65536 + 123, 5 * (256 << 10) + 777};
    for (int f = 0; f < 2; f++) {
        for (size_t i = 0; i < QK_ARRAY_SIZE(lens); i++) {
            test_roundtrip(f ? QK_OPEN_NOCACHE : 0, lens[i]);
        }
    }
    test_write_error();
    test_drain(0);
    test_drain(1);
    test_same_name();
    test_unsupported();
    QK_TEST_DONE();
}
