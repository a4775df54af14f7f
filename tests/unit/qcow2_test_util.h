/*
 * Helpers shared by the qcow2 unit tests: synchronous wrappers around the
 * coroutine request functions, an in-memory model with a raw reference
 * file, and QEMU's tools as the judge (qemu-img check / compare).
 */
#ifndef QK_TESTS_QCOW2_TEST_UTIL_H
#define QK_TESTS_QCOW2_TEST_UTIL_H

#include "qktest.h"
#include "aio/loop.h"
#include "block/block.h"
#include "qcow2/qcow2.h"
#include "common/checked.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct TReq {
    QkBlock *bs;
    int op; /* 0 read, 1 write, 2 zero, 3 discard, 4 flush */
    uint64_t off, len;
    void *buf;
    int flags;
    int ret;
    int *outstanding;
} TReq;

static void coroutine_fn treq_co(void *opaque)
{
    TReq *t = opaque;
    switch (t->op) {
    case 0: t->ret = qk_co_pread(t->bs, t->off, t->len, t->buf, t->flags); break;
    case 1: t->ret = qk_co_pwrite(t->bs, t->off, t->len, t->buf, t->flags); break;
    case 2: t->ret = qk_co_pwrite_zeroes(t->bs, t->off, t->len, t->flags); break;
    case 3: t->ret = qk_co_pdiscard(t->bs, t->off, t->len); break;
    default: t->ret = qk_co_flush(t->bs); break;
    }
    if (t->outstanding) {
        (*t->outstanding)--;
    }
}

static inline int t_io(QkBlock *bs, int op, uint64_t off, uint64_t len, void *buf, int flags)
{
    TReq t = {.bs = bs, .op = op, .off = off, .len = len, .buf = buf, .flags = flags};
    qk_co_run(treq_co, &t);
    return t.ret;
}
#define t_read(bs, off, len, buf) t_io(bs, 0, off, len, buf, 0)
#define t_write(bs, off, len, buf) t_io(bs, 1, off, len, buf, 0)
#define t_zero(bs, off, len, fl) t_io(bs, 2, off, len, NULL, fl)
#define t_discard(bs, off, len) t_io(bs, 3, off, len, NULL, 0)
#define t_flush(bs) t_io(bs, 4, 0, 0, NULL, 0)

/* Starts every request at once (each its own coroutine) and waits for all. */
static inline void t_run_all(TReq *reqs, int n)
{
    int outstanding = n;
    for (int i = 0; i < n; i++) {
        reqs[i].outstanding = &outstanding;
        qk_coroutine_enter(qk_coroutine_create(treq_co, &reqs[i]));
    }
    QkLoop *loop = qk_loop_get();
    while (outstanding) {
        qk_loop_run_once(loop, true);
    }
}

typedef struct TStat {
    QkBlock *bs;
    uint64_t off, len, pnum, map;
    int ret;
} TStat;

static void coroutine_fn tstat_co(void *opaque)
{
    TStat *t = opaque;
    QkBlock *file = NULL;
    t->ret = qk_co_block_status(t->bs, t->off, t->len, &t->pnum, &t->map, &file);
}

/* Block status flags of [off, off+len) (first extent); *pnum its length. */
static inline int t_status(QkBlock *bs, uint64_t off, uint64_t len, uint64_t *pnum, uint64_t *map)
{
    TStat t = {.bs = bs, .off = off, .len = len};
    qk_co_run(tstat_co, &t);
    *pnum = t.pnum;
    if (map) {
        *map = t.map;
    }
    return t.ret;
}

static inline int t_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int t_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int r = system(cmd);
    if (r == -1 || !WIFEXITED(r)) {
        return -1;
    }
    return WEXITSTATUS(r);
}

static inline bool t_have_qemu(void)
{
    return t_sh("qemu-img --version >/dev/null 2>&1") == 0 && t_sh("qemu-io --version >/dev/null 2>&1") == 0;
}

/* qemu-img check must be clean (exit 0). */
static inline int t_qemu_check(const char *path)
{
    int r = t_sh("qemu-img check -q '%s' >qemu-check.log 2>&1", path);
    if (r != 0) {
        fprintf(stderr, "qemu-img check %s: exit %d\n", path, r);
        t_sh("head -20 qemu-check.log >&2");
    }
    return r;
}

static inline int t_qemu_compare(const char *img, const char *raw)
{
    int r = t_sh("qemu-img compare -q -f qcow2 -F raw '%s' '%s' 2>&1", img, raw);
    if (r != 0) {
        fprintf(stderr, "qemu-img compare %s %s: exit %d\n", img, raw, r);
    }
    return r;
}

static inline QkBlock *t_open(const char *path, int flags)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = flags, .format = "qcow2"};
    QkBlock *bs = qk_block_open(path, &o, &err);
    if (!bs) {
        fprintf(stderr, "open %s: %s\n", path, err.msg);
    }
    return bs;
}

static inline int t_create(const char *path, const QkCreateOptions *o)
{
    QkError err = {0};
    QkCreateOptions c = *o;
    c.format = "qcow2";
    int r = qk_block_create(path, &c, &err);
    if (r < 0) {
        fprintf(stderr, "create %s: %s\n", path, err.msg);
    }
    return r;
}

static inline int t_write_raw(const char *path, const uint8_t *data, uint64_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return -1;
    }
    ssize_t w = pwrite(fd, data, len, 0);
    int r = ftruncate(fd, (off_t)len);
    close(fd);
    return w == (ssize_t)len && r == 0 ? 0 : -1;
}

/* Reads the whole image through the driver and compares with the model. */
static inline int t_verify(QkBlock *bs, const uint8_t *model, uint64_t len)
{
    uint8_t *buf = malloc(len);
    memset(buf, 0xa5, len);
    int r = t_read(bs, 0, len, buf);
    if (r == 0 && memcmp(buf, model, len) != 0) {
        for (uint64_t i = 0; i < len; i++) {
            if (buf[i] != model[i]) {
                fprintf(stderr, "mismatch at %llu: got %02x want %02x\n", (unsigned long long)i, buf[i], model[i]);
                break;
            }
        }
        r = -1;
    }
    free(buf);
    return r;
}

static inline uint64_t t_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

#endif
