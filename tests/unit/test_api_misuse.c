/* The public API under the mistakes a caller can make: NULL handles,
 * unknown flags, error codes of either sign, and VM-state streams used the
 * wrong way (no snapshot named, two at once, a writer read from, an image
 * closed under an open stream). None may crash, and none may change the
 * disk. */
#include "qktest.h"
#include "qcowkit/qcowkit.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int qemu_img(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "qemu-img %s >/dev/null 2>&1", args);
    return system(cmd);
}

static int read_byte(QkImage *img, uint64_t off)
{
    unsigned char b = 0xee;
    return qk_image_pread(img, off, &b, 1) == 0 ? b : -1;
}

int main(void)
{
    char msg[256];
    char buf[512] = {0};

    /* NULL and unknown flags: refused with a message, never a crash. */
    msg[0] = 0;
    QK_CHECK(qk_image_open(NULL, NULL, 0, msg, sizeof(msg)) == NULL);
    QK_CHECK(msg[0] != 0);
    QK_CHECK_EQ(qemu_img("create -q -f qcow2 m.qcow2 4M"), 0);
    msg[0] = 0;
    QK_CHECK(qk_image_open("m.qcow2", "qcow2", 0x7000, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "flags") != NULL);
    QK_CHECK_EQ(qk_image_size(NULL), 0);
    QK_CHECK_EQ(qk_image_pread(NULL, 0, buf, sizeof(buf)), -EINVAL);
    QK_CHECK_EQ(qk_image_pwrite(NULL, 0, buf, sizeof(buf)), -EINVAL);
    QK_CHECK_EQ(qk_image_zero(NULL, 0, 512, 0), -EINVAL);
    QK_CHECK_EQ(qk_image_discard(NULL, 0, 512), -EINVAL);
    QK_CHECK_EQ(qk_image_flush(NULL), -EINVAL);
    QK_CHECK_EQ(qk_image_close(NULL), 0);
    QK_CHECK_EQ(qk_image_vmstate_write(NULL, buf, 1), -EINVAL);
    QK_CHECK_EQ(qk_image_vmstate_read(NULL, buf, 1), -EINVAL);
    QK_CHECK_EQ(qk_image_vmstate_writer_close(NULL, "x", msg, sizeof(msg)), -EINVAL);
    qk_image_vmstate_reader_close(NULL);
    QK_CHECK_EQ(qk_image_vmstate_peak_memory(NULL), 0);
    uint64_t vsize = 0;
    QK_CHECK(qk_image_vmstate_writer_open(NULL, NULL, msg, sizeof(msg)) == NULL);
    QK_CHECK(qk_image_vmstate_reader_open(NULL, "s", NULL, &vsize, msg, sizeof(msg)) == NULL);

    /* Error codes of either sign, and the one no errno has. */
    QK_CHECK(strcmp(qk_strerror(-EIO), qk_strerror(EIO)) == 0);
    QK_CHECK(strcmp(qk_strerror(EIO), "Success") != 0);
    QK_CHECK(strcmp(qk_strerror(-QK_ECORRUPT), "image is corrupt") == 0);
    QK_CHECK(strcmp(qk_strerror(0), "Success") == 0);
    QK_CHECK(qk_strerror(INT_MIN) != NULL);

    /* A snapshot "s1" holding 'A' and some state; the active disk then 'B'. */
    QkImage *img = qk_image_open("m.qcow2", "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (!img) {
        QK_TEST_DONE();
    }
    memset(buf, 'A', sizeof(buf));
    QK_CHECK_EQ(qk_image_pwrite(img, 0, buf, sizeof(buf)), 0);
    QkVmStateStream *w = qk_image_vmstate_writer_open(img, NULL, msg, sizeof(msg));
    QK_CHECK(w != NULL);
    if (!w) {
        QK_TEST_DONE();
    }
    /* One stream at a time: both would use the same state area. */
    QK_CHECK(qk_image_vmstate_writer_open(img, NULL, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "already open") != NULL);
    QK_CHECK_EQ(qk_image_vmstate_write(w, "state", 5), 0);
    QK_CHECK_EQ(qk_image_vmstate_read(w, buf, 5), -EINVAL);
    qk_image_vmstate_reader_close(w); /* a writer: left alone */
    QK_CHECK_EQ(qk_image_vmstate_write(w, "!", 1), 0);
    QK_CHECK_EQ(qk_image_vmstate_writer_close(w, "s1", msg, sizeof(msg)), 0);
    memset(buf, 'B', sizeof(buf));
    QK_CHECK_EQ(qk_image_pwrite(img, 0, buf, sizeof(buf)), 0);

    /* No snapshot named: nothing reverted (it once meant "the first"). */
    msg[0] = 0;
    QK_CHECK(qk_image_vmstate_reader_open(img, NULL, NULL, &vsize, msg, sizeof(msg)) == NULL);
    QK_CHECK(msg[0] != 0);
    QK_CHECK(qk_image_vmstate_reader_open(img, "s1", NULL, NULL, msg, sizeof(msg)) == NULL);
    QK_CHECK_EQ(read_byte(img, 0), 'B');
    /* A snapshot that is not there: named in the message, nothing changed. */
    QK_CHECK(qk_image_vmstate_reader_open(img, "nope", NULL, &vsize, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "'nope'") != NULL);
    QK_CHECK_EQ(read_byte(img, 0), 'B');

    /* A reader, misused as a writer, then the image closed under it. */
    QkVmStateStream *r = qk_image_vmstate_reader_open(img, "s1", NULL, &vsize, msg, sizeof(msg));
    QK_CHECK(r != NULL);
    QK_CHECK_EQ(vsize, 6);
    QK_CHECK_EQ(read_byte(img, 0), 'A');
    if (r) {
        QK_CHECK_EQ(qk_image_vmstate_write(r, "x", 1), -EINVAL);
        QK_CHECK_EQ(qk_image_vmstate_writer_close(r, "s2", msg, sizeof(msg)), -EINVAL);
        char st[8] = {0};
        QK_CHECK_EQ(qk_image_vmstate_read(r, st, 6), 6);
        QK_CHECK(memcmp(st, "state!", 6) == 0);
    }
    QK_CHECK_EQ(qk_image_close(img), 0);

    /* A writer left open at close: finished without a snapshot. */
    img = qk_image_open("m.qcow2", "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (img) {
        w = qk_image_vmstate_writer_open(img, NULL, msg, sizeof(msg));
        QK_CHECK(w != NULL);
        QK_CHECK_EQ(qk_image_vmstate_write(w, "lost", 4), 0);
        QK_CHECK_EQ(qk_image_close(img), 0);
    }
    QK_CHECK_EQ(qemu_img("check -q m.qcow2"), 0);
    /* Only s1: the abandoned save took no snapshot. */
    QK_CHECK_EQ(system("qemu-img snapshot -l m.qcow2 | grep -c '^[0-9]' | grep -qx 1"), 0);

    /* An image found corrupt on the way (an L2 entry pointing inside a
     * cluster): -QK_ECORRUPT, not a plain I/O error, for the read that
     * finds it and for the writes refused after it. */
    QK_CHECK_EQ(qemu_img("create -q -f qcow2 c.qcow2 4M"), 0);
    QK_CHECK_EQ(system("qemu-io -c 'write -P 1 0 128k' c.qcow2 >/dev/null"), 0);
    {
        /* A fresh qemu-img image: L2 table at 0x40000, data from 0x50000. */
        unsigned char e[8] = {0x80, 0, 0, 0, 0, 0x05, 0x02, 0x00};
        FILE *f = fopen("c.qcow2", "r+b");
        QK_CHECK(f && fseek(f, 0x40000, SEEK_SET) == 0 && fwrite(e, 8, 1, f) == 1);
        if (f) {
            fclose(f);
        }
    }
    img = qk_image_open("c.qcow2", "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (img) {
        QK_CHECK_EQ(qk_image_pread(img, 0, buf, sizeof(buf)), -QK_ECORRUPT);
        QK_CHECK_EQ(read_byte(img, 65536), 1);
        QK_CHECK_EQ(qk_image_pwrite(img, 65536, buf, sizeof(buf)), -QK_ECORRUPT);
        qk_image_close(img);
    }
    QK_CHECK_EQ(system("qemu-img info c.qcow2 | grep -q 'corrupt: true'"), 0);
    QK_TEST_DONE();
}
