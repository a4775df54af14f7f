/* Extended L2 (subclusters): every subcluster state (unallocated,
 * allocated, zero; in an allocated cluster, and an unallocated cluster)
 * against full, partial (start, middle, end, straddling) writes, zero
 * writes, discards (whole subclusters then read as zeros; partial ones at
 * the edges are left alone) and writes spanning clusters, with and
 * without a backing file. Each case is built twice, by qcowkit and by
 * qemu-io, and checked by content (model), qemu-img check, qemu-img
 * compare of the twins and qemu-img map of the twins (the subcluster
 * allocation must be the same, host offsets aside). QEMU 7.2's tools
 * ignore partial-cluster discards, so the twin gets the same result by
 * other means: a discard of the whole clusters and a zero write of the
 * whole subclusters of the partly covered ones. Then discards that free
 * a host cluster (subcluster by subcluster, and racing with writes into
 * the same clusters), checked by content, block status, reuse of the
 * freed cluster, qemu-img check and compare. */
#include "qcow2_test_util.h"

#define CS 65536ULL
#define SC 2048ULL
#define LEN (4 * CS)
#define BLEN (3 * CS)

typedef struct Op {
    char kind; /* 'w' write, 'z' zero write, 'd' discard */
    uint64_t off, len;
    int pat;
} Op;

static uint8_t model[LEN];
static int ncases;

/* The whole subclusters [*a, *b) a discard of o acts on (the last one
 * may stick out past the end of the image). */
static bool discard_range(const Op *o, uint64_t *a, uint64_t *b)
{
    uint64_t end = o->off + o->len;
    *a = qk_align_up(o->off, SC);
    *b = end == LEN ? qk_align_up(end, SC) : qk_align_down(end, SC);
    return *a < *b;
}

static void model_apply(const Op *o)
{
    uint64_t a, b;
    if (o->kind == 'w') {
        memset(model + o->off, o->pat, o->len);
    } else if (o->kind == 'z') {
        memset(model + o->off, 0, o->len);
    } else if (discard_range(o, &a, &b)) {
        memset(model + a, 0, b - a); /* not the backing file's data */
    }
}

/* Appends a qemu-io command for [a, b) unless that is empty. */
static size_t add_cmd(char *buf, size_t n, const char *verb, uint64_t a, uint64_t b)
{
    if (a >= b) {
        return 0;
    }
    snprintf(buf, n, "-c '%s %llu %llu' ", verb, (unsigned long long)a, (unsigned long long)(b - a));
    return strlen(buf);
}

static void qemu_cmd(const Op *o, char *buf, size_t n)
{
    uint64_t a, b;
    buf[0] = 0;
    if (o->kind == 'd') {
        /* QEMU's discard only where whole clusters are covered; a zero
         * write of the whole subclusters around them. */
        if (discard_range(o, &a, &b)) {
            uint64_t ca = QK_MIN(qk_align_up(a, CS), b), cb = QK_MAX(qk_align_down(b, CS), ca);
            size_t u = add_cmd(buf, n, "write -z", a, ca);
            u += add_cmd(buf + u, n - u, "discard", ca, cb);
            add_cmd(buf + u, n - u, "write -z", cb, b);
        }
        return;
    }
    const char *fmt = o->kind == 'w' ? "-c 'write -P %d %llu %llu' " : "-c 'write -z %.0d%llu %llu' ";
    snprintf(buf, n, fmt, o->pat, (unsigned long long)o->off, (unsigned long long)o->len);
}

static int qk_apply(QkBlock *bs, const Op *o)
{
    if (o->kind == 'w') {
        uint8_t *b = malloc(o->len);
        memset(b, o->pat, o->len);
        int r = t_write(bs, o->off, o->len, b);
        free(b);
        return r;
    }
    if (o->kind == 'z') {
        return t_zero(bs, o->off, o->len, 0);
    }
    return t_discard(bs, o->off, o->len);
}

/* The subclusters of cluster 0 and 1 cycle through unallocated, allocated
 * and zero; cluster 2 stays unallocated; cluster 3 is all allocated. */
static int setup_ops(Op *ops)
{
    int n = 0;
    for (uint64_t c = 0; c < 2; c++) {
        for (uint64_t i = 0; i < 32; i++) {
            int st = (int)((i + c) % 3);
            uint64_t off = c * CS + i * SC;
            if (st == 1) {
                ops[n++] = (Op){'w', off, SC, 0x10 + (int)i};
            } else if (st == 2) {
                ops[n++] = (Op){'z', off, SC, 0};
            }
        }
    }
    ops[n++] = (Op){'w', 3 * CS, CS, 0x33};
    return n;
}

/* qemu-img map of path as one letter per subcluster: depth, then present,
 * zero and data as bits. */
static int map_units(const char *path, char *units)
{
    memset(units, '?', LEN / SC + 1);
    if (t_sh("qemu-img map --output=json %s >sq.map", path) != 0) {
        return -1;
    }
    FILE *f = fopen("sq.map", "r");
    if (!f) {
        return -1;
    }
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        unsigned long long st, len;
        int depth;
        char pr[8], z[8], d[8];
        if (sscanf(line, "%*[[{ ]\"start\": %llu, \"length\": %llu, \"depth\": %d, \"present\": %7[a-z], "
                   "\"zero\": %7[a-z], \"data\": %7[a-z]", &st, &len, &depth, pr, z, d) != 6) {
            continue;
        }
        char c = (char)('A' + depth * 8 + (pr[0] == 't') * 4 + (z[0] == 't') * 2 + (d[0] == 't'));
        for (unsigned long long u = st / SC; u < (st + len) / SC && u < LEN / SC; u++) {
            units[u] = c;
        }
    }
    fclose(f);
    units[LEN / SC] = 0;
    return 0;
}

/* The twin comparisons test the format's behaviour against QEMU's, which
 * neither the aio backend nor the sanitizers change: the plain build on
 * io_uring runs them; the other variants (run by tests/run.sh too) check
 * content against the model and run qemu-img check, at a fraction of the
 * time (the twins were most of this test's four minutes). */
static bool with_twins(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return false;
#else
    const char *b = getenv("QCOWKIT_AIO");
    return !b || strcmp(b, "threads") != 0;
#endif
}

static void run_case(bool backing, const char *name, const Op *op)
{
    ncases++;
    char cmds[16384];
    size_t used = 0;
    Op setup[80];
    int ns = setup_ops(setup);
    t_sh("rm -f sq.qcow2 sq-twin.qcow2 sq-raw");
    const char *bopt = backing ? "-b sb.qcow2 -F qcow2" : "";
    bool twins = with_twins();
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k %s sq.qcow2 %llu",
                     bopt, (unsigned long long)LEN), 0);
    if (twins) {
        QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k %s sq-twin.qcow2 %llu",
                         bopt, (unsigned long long)LEN), 0);
    }
    memset(model, 0, sizeof(model));
    if (backing) {
        memset(model, 0x77, BLEN);
    }
    QkBlock *bs = t_open("sq.qcow2", QK_OPEN_RDWR);
    QK_CHECK(bs != NULL);
    if (!bs) {
        return;
    }
    for (int i = 0; i <= ns; i++) {
        const Op *o = i < ns ? &setup[i] : op;
        int r = qk_apply(bs, o);
        if (r != 0) {
            fprintf(stderr, "%s%s: op %c %llu+%llu failed: %d\n", name, backing ? " (backing)" : "", o->kind,
                    (unsigned long long)o->off, (unsigned long long)o->len, r);
        }
        QK_CHECK_EQ(r, 0);
        model_apply(o);
        qemu_cmd(o, cmds + used, sizeof(cmds) - used);
        used += strlen(cmds + used);
    }
    int vr = t_verify(bs, model, LEN);
    if (vr) {
        fprintf(stderr, "case %s%s: content differs from the model\n", name, backing ? " (backing)" : "");
    }
    QK_CHECK_EQ(vr, 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check("sq.qcow2"), 0);
    if (!twins) {
        return;
    }
    /* The twin is only a reference: no flushes (-t unsafe), which on a slow
     * disk would make up most of this test's time. */
    QK_CHECK_EQ(t_sh("qemu-io -f qcow2 -t unsafe %s sq-twin.qcow2 >/dev/null", cmds), 0);
    int cr = t_sh("qemu-img compare -q sq.qcow2 sq-twin.qcow2");
    if (cr) {
        fprintf(stderr, "case %s%s: twins differ\n", name, backing ? " (backing)" : "");
    }
    QK_CHECK_EQ(cr, 0);
    /* Same subcluster allocation as QEMU's twin (host offsets, and so the
     * merging of neighbouring extents, may differ). */
    char a[LEN / SC + 1], b[LEN / SC + 1];
    int mr = map_units("sq.qcow2", a) || map_units("sq-twin.qcow2", b) || memcmp(a, b, sizeof(a)) != 0;
    if (mr) {
        fprintf(stderr, "case %s%s: map differs from the twin's:\n  %.*s\n  %.*s\n", name,
                backing ? " (backing)" : "", (int)sizeof(a), a, (int)sizeof(b), b);
    }
    QK_CHECK_EQ(mr, 0);
}

/* Creates sp.qcow2 (over sb.qcow2 with backing), resets the model to
 * what it reads and opens it in the given dependency mode. */
static QkBlock *open_scratch(bool backing, bool strict)
{
    ncases++;
    t_sh("rm -f sp.qcow2 sp.raw");
    QK_CHECK_EQ(t_sh("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k %s sp.qcow2 %llu",
                     backing ? "-b sb.qcow2 -F qcow2" : "", (unsigned long long)LEN), 0);
    memset(model, 0, sizeof(model));
    if (backing) {
        memset(model, 0x77, BLEN);
    }
    QkError err = {0};
    QkOpenOptions oo = {.flags = QK_OPEN_RDWR, .format = "qcow2", .strict_alloc_deps = strict};
    QkBlock *bs = qk_block_open("sp.qcow2", &oo, &err);
    QK_CHECK(bs != NULL);
    return bs;
}

/* Checks the content against the model, closes, and has QEMU's tools
 * check the image and compare it with the model. */
static void close_scratch(QkBlock *bs, const char *what)
{
    int vr = t_verify(bs, model, LEN);
    if (vr) {
        fprintf(stderr, "%s: content differs\n", what);
    }
    QK_CHECK_EQ(vr, 0);
    qk_block_close(bs);
    QK_CHECK_EQ(t_qemu_check("sp.qcow2"), 0);
    QK_CHECK_EQ(t_write_raw("sp.raw", model, LEN), 0);
    QK_CHECK_EQ(t_qemu_compare("sp.qcow2", "sp.raw"), 0);
}

/* The benchmark's pattern, checked: NPAR small writes at once, each into
 * the same few clusters (2K aligned, 2K at +512, 2560), in both dependency
 * modes, with and without a backing file; content, check and the twin. */
#define NPAR 96
static void parallel(bool backing, bool strict, uint64_t size, uint64_t step, uint64_t start)
{
    QkBlock *bs = open_scratch(backing, strict);
    if (!bs) {
        return;
    }
    static TReq reqs[NPAR];
    static uint8_t bufs[NPAR][4096];
    for (int i = 0; i < NPAR; i++) {
        uint64_t off = start + (uint64_t)i * step;
        memset(bufs[i], 0x40 + i, size);
        reqs[i] = (TReq){.bs = bs, .op = 1, .off = off, .len = size, .buf = bufs[i]};
        memset(model + off, 0x40 + i, size);
    }
    t_run_all(reqs, NPAR);
    for (int i = 0; i < NPAR; i++) {
        QK_CHECK_EQ(reqs[i].ret, 0);
    }
    char what[96];
    snprintf(what, sizeof(what), "parallel %llu+%llu*k backing=%d strict=%d", (unsigned long long)start,
             (unsigned long long)step, backing, strict);
    close_scratch(bs, what);
}

static void apply(QkBlock *bs, Op o)
{
    int r = qk_apply(bs, &o);
    if (r != 0) {
        fprintf(stderr, "op %c %llu+%llu failed: %d\n", o.kind, (unsigned long long)o.off,
                (unsigned long long)o.len, r);
    }
    QK_CHECK_EQ(r, 0);
    model_apply(&o);
}

/* Discarding the allocated subclusters of a cluster one by one, not in
 * order and half of the time with unaligned edges, frees its host cluster
 * when the last goes (zero and unallocated subclusters, which it also
 * has, keep nothing allocated): the entry loses its offset, unallocated
 * subclusters still show the backing file, and the next new cluster
 * reuses the host cluster (so its refcount went to 0). */
static void discard_one_by_one(bool backing)
{
    QkBlock *bs = open_scratch(backing, false);
    if (!bs) {
        return;
    }
    apply(bs, (Op){'w', CS, 20 * SC, 0x5a});
    apply(bs, (Op){'w', CS + 22 * SC, 10 * SC, 0x5b}); /* 20 and 21 stay unallocated */
    apply(bs, (Op){'z', CS + 7 * SC, 3 * SC, 0});
    apply(bs, (Op){'w', 3 * CS, CS, 0x33});
    uint64_t pnum = 0, host = 0, map = 0;
    QK_CHECK(t_status(bs, CS, SC, &pnum, &host) & QK_BS_OFFSET_VALID);
    int left = 32 - 3 - 2;
    for (unsigned k = 0; k < 32; k++) {
        unsigned i = (k * 13) % 32;
        if ((i >= 7 && i <= 9) || i == 20 || i == 21) {
            continue;
        }
        uint64_t off = CS + i * SC;
        apply(bs, k % 2 ? (Op){'d', off - 100, SC + 200, 0} : (Op){'d', off, SC, 0});
        QK_CHECK_EQ(t_verify(bs, model, LEN), 0);
        int st = t_status(bs, off, SC, &pnum, &map);
        QK_CHECK_EQ(st & (QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_DATA), QK_BS_ZERO | QK_BS_ALLOCATED);
        /* The host cluster goes with the last allocated subcluster only. */
        QK_CHECK_EQ(!!(st & QK_BS_OFFSET_VALID), --left > 0);
    }
    int st = t_status(bs, CS, CS, &pnum, &map);
    QK_CHECK_EQ(st & (QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_DATA | QK_BS_OFFSET_VALID), QK_BS_ZERO | QK_BS_ALLOCATED);
    QK_CHECK_EQ(pnum, 20 * SC);
    st = t_status(bs, CS + 20 * SC, 2 * SC, &pnum, &map);
    QK_CHECK_EQ(st & (QK_BS_ALLOCATED | QK_BS_OFFSET_VALID), 0);
    QK_CHECK_EQ(pnum, 2 * SC);
    apply(bs, (Op){'w', 2 * CS, CS, 0x66});
    st = t_status(bs, 2 * CS, CS, &pnum, &map);
    QK_CHECK(st & QK_BS_OFFSET_VALID);
    QK_CHECK_EQ(map, host);
    close_scratch(bs, backing ? "discard one by one (backing)" : "discard one by one");
}

#define NRACE 128
static TReq race[NRACE];
static uint8_t race_bufs[NRACE][SC];
static int nrace;

/* Queues o for discard_parallel and applies it to the model (the ranges
 * of one batch never overlap: any completion order gives one result). */
static void race_add(QkBlock *bs, Op o)
{
    memset(race_bufs[nrace], o.pat, SC);
    race[nrace] = (TReq){.bs = bs, .op = o.kind == 'w' ? 1 : 3, .off = o.off, .len = o.len, .buf = race_bufs[nrace]};
    nrace++;
    model_apply(&o);
}

/* Discards racing with writes into the same clusters, all at once.
 * Clusters 0 and 3 have their even subclusters allocated: in cluster 3
 * they are discarded while the odd ones are written, in turns; in
 * cluster 0 they are discarded first, which frees the host cluster while
 * the writes into its odd subclusters are on their way (they must
 * allocate anew). Cluster 1, all allocated, is discarded subcluster by
 * subcluster while cluster 2 is written for the first time (and may get
 * cluster 1's host cluster). */
static void discard_parallel(bool backing, bool strict)
{
    QkBlock *bs = open_scratch(backing, strict);
    if (!bs) {
        return;
    }
    for (uint64_t i = 0; i < 32; i += 2) {
        apply(bs, (Op){'w', i * SC, SC, 0x20 + (int)i});
        apply(bs, (Op){'w', 3 * CS + i * SC, SC, 0x40 + (int)i});
    }
    apply(bs, (Op){'w', CS, CS, 0x31});
    nrace = 0;
    for (uint64_t i = 0; i < 32; i += 2) {
        race_add(bs, (Op){'d', i * SC, SC, 0});
    }
    for (uint64_t i = 0; i < 32; i++) {
        if (i % 2) {
            race_add(bs, (Op){'w', i * SC, SC, 0x80 + (int)i});
        }
        race_add(bs, (Op){i % 2 ? 'w' : 'd', 3 * CS + i * SC, SC, 0xa0 + (int)i});
        race_add(bs, (Op){'d', CS + ((i * 7) % 32) * SC, SC, 0});
        race_add(bs, (Op){'w', 2 * CS + i * SC, SC, 0xc0 + (int)i});
    }
    t_run_all(race, nrace);
    for (int i = 0; i < nrace; i++) {
        QK_CHECK_EQ(race[i].ret, 0);
    }
    uint64_t pnum = 0, map = 0;
    int st = t_status(bs, CS, CS, &pnum, &map);
    QK_CHECK_EQ(st & (QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_DATA | QK_BS_OFFSET_VALID), QK_BS_ZERO | QK_BS_ALLOCATED);
    QK_CHECK_EQ(pnum, CS);
    char what[64];
    snprintf(what, sizeof(what), "discard parallel backing=%d strict=%d", backing, strict);
    close_scratch(bs, what);
}

int main(void)
{
    if (!t_have_qemu()) {
        return 77;
    }
    QK_CHECK_EQ(t_sh("rm -f sb.qcow2 && qemu-img create -q -f qcow2 sb.qcow2 %llu && "
                     "qemu-io -f qcow2 -c 'write -P 0x77 0 %llu' sb.qcow2 >/dev/null",
                     (unsigned long long)BLEN, (unsigned long long)BLEN), 0);
    /* Targets: subclusters 3, 4, 5 of cluster 0 (unallocated, allocated,
     * zero) and subcluster 5 of the unallocated cluster 2. */
    const uint64_t targets[] = {3 * SC, 4 * SC, 5 * SC, 2 * CS + 5 * SC};
    const char *tnames[] = {"unalloc", "alloc", "zero", "fresh-cluster"};
    for (int b = 0; b < 2; b++) {
        for (int t = 0; t < 4; t++) {
            uint64_t x = targets[t];
            const struct { const char *n; Op op; } ops[] = {
                {"write", {'w', x, SC, 0xa1}},
                {"write-start", {'w', x, 512, 0xa2}},
                {"write-middle", {'w', x + 512, 1024, 0xa3}},
                {"write-end", {'w', x + 1536, 512, 0xa4}},
                {"write-straddle", {'w', x + 1024, SC, 0xa5}},
                {"write-3sc", {'w', x - 100, 2 * SC + 200, 0xa6}},
                {"zero", {'z', x, SC, 0}},
                {"zero-partial", {'z', x + 512, 1024, 0}},
                {"zero-straddle", {'z', x + 1024, SC, 0}},
                {"discard", {'d', x, SC, 0}},
                {"discard-partial", {'d', x + 100, SC, 0}},
            };
            for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                char name[64];
                snprintf(name, sizeof(name), "%s/%s", tnames[t], ops[i].n);
                run_case(b, name, &ops[i].op);
            }
        }
        const struct { const char *n; Op op; } span[] = {
            {"span-write", {'w', CS - 3000, 6000, 0xb1}},
            {"span-write-into-fresh", {'w', CS + 1000, CS + 2000, 0xb2}},
            {"span-write-3-clusters", {'w', CS - 512, 2 * CS + 1024, 0xb3}},
            {"span-zero", {'z', CS - 3000, 6000, 0}},
            {"span-discard", {'d', CS - 4096, 3 * 4096, 0}},
            {"discard-2-clusters", {'d', CS - 4096, 2 * CS + 8192, 0}},
            {"zero-cluster", {'z', CS, CS, 0}},
            {"discard-cluster", {'d', 0, CS, 0}},
            {"discard-fresh-cluster", {'d', 2 * CS, CS, 0}},
            {"discard-middle", {'d', 3 * CS + 5 * SC, 9 * SC, 0}},
            {"discard-middle-unaligned", {'d', 3 * CS + 5 * SC - 700, 9 * SC + 1500, 0}},
            {"discard-across-unaligned", {'d', CS - 5000, 9000, 0}},
            {"discard-into-all-alloc", {'d', 3 * CS - 3000, 7 * SC, 0}},
            {"discard-to-end", {'d', 3 * CS + 29 * SC + 1, 3 * SC - 1, 0}},
            {"discard-last-sc", {'d', 3 * CS + 30 * SC + 100, 2 * SC - 100, 0}},
        };
        for (size_t i = 0; i < sizeof(span) / sizeof(span[0]); i++) {
            run_case(b, span[i].n, &span[i].op);
        }
    }
    for (int b = 0; b < 2; b++) {
        discard_one_by_one(b);
        for (int strict = 0; strict < 2; strict++) {
            discard_parallel(b, strict);
            parallel(b, strict, 2048, 2048, 0);
            parallel(b, strict, 2048, 2048, 512);
            parallel(b, strict, 2560, 2560, 0);
            parallel(b, strict, 1000, 1500, CS - 7000); /* unaligned, across a cluster boundary */
        }
    }
    fprintf(stderr, "%d cases\n", ncases);
    QK_TEST_DONE();
}
