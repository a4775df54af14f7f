/* Fault injection rules (block/inject.h): parsing, which operation fails
 * in each mode, and the public API reporting a failed write-back on close
 * (qk_image_close) and a failed flush (qk_image_flush). */
#include "qktest.h"
#include "block/block.h"
#include "block/inject.h"
#include "qcowkit/qcowkit.h"

#include <errno.h>
#include <string.h>

static int w(QkIoKind k)
{
    return qk_inject_write("/scratch/src.qcow2", QK_REQ_KIND(k));
}

static void rules(void)
{
    QkError err = {0};
    QK_CHECK(qk_inject_configure("l3:nth=1", &err) == -EINVAL && strstr(err.msg, "unknown operation"));
    qk_error_clear(&err);
    QK_CHECK(qk_inject_configure("l2:nth=0", &err) == -EINVAL && strstr(err.msg, "nth"));
    qk_error_clear(&err);
    QK_CHECK(qk_inject_configure("l2:errno=EWHAT", &err) == -EINVAL && strstr(err.msg, "errno"));
    qk_error_clear(&err);
    QK_CHECK(qk_inject_configure("l2:mode=often", &err) == -EINVAL && strstr(err.msg, "mode"));
    qk_error_clear(&err);
    QK_CHECK(qk_inject_configure("l2:bogus", &err) == -EINVAL && strstr(err.msg, "KEY=VALUE"));
    QK_CHECK_EQ(qk_inject_on, 0);

    /* once: only the 2nd L2 write; other kinds and the total count on. */
    QK_CHECK_EQ(qk_inject_configure("l2:nth=2:errno=ENOSPC", NULL), 0);
    QK_CHECK_EQ(w(QK_IO_L2), 0);
    QK_CHECK_EQ(w(QK_IO_DATA), 0);
    QK_CHECK_EQ(w(QK_IO_L2), -ENOSPC);
    QK_CHECK_EQ(w(QK_IO_L2), 0);
    QK_CHECK_EQ(qk_inject_flush(NULL), 0);
    QK_CHECK_EQ(qk_inject_seen(QK_INJ_WRITE), 4);
    QK_CHECK_EQ(qk_inject_seen(QK_IO_L2), 3);
    QK_CHECK_EQ(qk_inject_seen(QK_INJ_FLUSH), 1);
    QK_CHECK_EQ(qk_inject_injected(), 1);
    char line[256];
    qk_inject_stats(line, sizeof(line));
    QK_CHECK(strstr(line, "write 4 (data 1, header 0, l1 0, l2 3, reftable 0, refblock 0, snapshot 0, bitmap 0), "
                          "flush 1; 1 fault(s) injected") != NULL);

    /* sticky: the 2nd write of any kind and every later one. */
    QK_CHECK_EQ(qk_inject_configure("write:nth=2:mode=sticky", NULL), 0);
    QK_CHECK_EQ(w(QK_IO_HEADER), 0);
    QK_CHECK_EQ(w(QK_IO_REFBLOCK), -EIO);
    QK_CHECK_EQ(w(QK_IO_DATA), -EIO);
    QK_CHECK_EQ(qk_inject_flush(NULL), 0);

    /* dead: from the 1st flush on, writes fail as well; two rules. */
    QK_CHECK_EQ(qk_inject_configure("snapshot:nth=5,flush:mode=dead:errno=EROFS", NULL), 0);
    QK_CHECK_EQ(w(QK_IO_DATA), 0);
    QK_CHECK_EQ(qk_inject_flush(NULL), -EROFS);
    QK_CHECK_EQ(w(QK_IO_DATA), -EROFS);
    QK_CHECK_EQ(qk_inject_flush(NULL), -EROFS);
    QK_CHECK_EQ(qk_inject_injected(), 3);

    /* file: only writes to the matching path count and fail; dead stays
     * with that file. */
    qk_error_clear(&err);
    QK_CHECK(qk_inject_configure("write:file=", &err) == -EINVAL && strstr(err.msg, "file must be"));
    qk_error_clear(&err);
    QK_CHECK_EQ(qk_inject_configure("write:nth=2:mode=dead:file=dst.qcow2", NULL), 0);
    QK_CHECK_EQ(w(QK_IO_DATA), 0);
    QK_CHECK_EQ(qk_inject_write("/scratch/dst.qcow2", 0), 0);
    QK_CHECK_EQ(w(QK_IO_DATA), 0);
    QK_CHECK_EQ(qk_inject_write("/scratch/dst.qcow2", QK_REQ_KIND(QK_IO_L2)), -EIO);
    QK_CHECK_EQ(qk_inject_flush("/scratch/dst.qcow2"), -EIO);
    QK_CHECK_EQ(w(QK_IO_REFBLOCK), 0);
    QK_CHECK_EQ(qk_inject_flush("/scratch/src.qcow2"), 0);
    QK_CHECK_EQ(qk_inject_flush(NULL), 0);
    QK_CHECK_EQ(qk_inject_seen(QK_INJ_WRITE), 5);
    QK_CHECK_EQ(qk_inject_injected(), 2);

    QK_CHECK_EQ(qk_inject_configure("count", NULL), 0);
    QK_CHECK_EQ(qk_inject_on, 1);
    QK_CHECK_EQ(w(QK_IO_L1), 0);
    QK_CHECK_EQ(qk_inject_seen(QK_IO_L1), 1);
    QK_CHECK_EQ(qk_inject_configure(NULL, NULL), 0);
    QK_CHECK_EQ(qk_inject_on, 0);
}

/* A write-back that fails at close is reported by qk_image_close. */
static void close_reports(void)
{
    QkCreateOptions co = {.format = "qcow2", .size = 16 << 20, .size_set = true};
    QkError err = {0};
    QK_CHECK_EQ(qk_block_create("inj.qcow2", &co, &err), 0);
    char msg[256], buf[4096];
    memset(buf, 0x3c, sizeof(buf));

    QkImage *img = qk_image_open("inj.qcow2", "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (!img) {
        return;
    }
    /* A new L2 table is written at once; a change to it stays in the
     * cache until the flush, which fails... */
    QK_CHECK_EQ(qk_image_pwrite(img, 65536, buf, sizeof(buf)), 0);
    QK_CHECK_EQ(qk_image_flush(img), 0);
    QK_CHECK_EQ(qk_inject_configure("l2:nth=1", NULL), 0);
    QK_CHECK_EQ(qk_image_pwrite(img, 0, buf, sizeof(buf)), 0);
    QK_CHECK_EQ(qk_image_flush(img), -EIO);
    /* ...and the close (no rule left) writes it. */
    QK_CHECK_EQ(qk_image_close(img), 0);

    img = qk_image_open("inj.qcow2", "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (!img) {
        return;
    }
    char back[4096];
    QK_CHECK_EQ(qk_image_pread(img, 0, back, sizeof(back)), 0);
    QK_CHECK(memcmp(buf, back, sizeof(back)) == 0);
    QK_CHECK_EQ(qk_image_pwrite(img, 1 << 20, buf, sizeof(buf)), 0);
    /* Every flush fails from now on: close must say so. */
    QK_CHECK_EQ(qk_inject_configure("flush:mode=sticky", NULL), 0);
    QK_CHECK_EQ(qk_image_close(img), -EIO);
    QK_CHECK(qk_inject_injected() >= 1);
    qk_inject_configure(NULL, NULL);
}

int main(void)
{
    rules();
    close_reports();
    QK_TEST_DONE();
}
