/* The public synchronous API on a raw image (VM state: refused, no snapshots). */
#include "qktest.h"
#include "qcowkit/qcowkit.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    const char *path = "api.raw";
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    QK_CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
    close(fd);

    char msg[256];
    QK_CHECK(qk_image_open("missing.raw", "raw", 0, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "missing.raw") != NULL);

    QkImage *img = qk_image_open(path, NULL, QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (!img) {
        QK_TEST_DONE();
    }
    QK_CHECK_EQ(qk_image_size(img), 1 << 20);
    char buf[1000], back[1000];
    memset(buf, 0x5a, sizeof(buf));
    QK_CHECK_EQ(qk_image_pwrite(img, 12345, buf, sizeof(buf)), 0);
    QK_CHECK_EQ(qk_image_pread(img, 12345, back, sizeof(back)), 0);
    QK_CHECK(memcmp(buf, back, sizeof(buf)) == 0);
    QK_CHECK_EQ(qk_image_zero(img, 12345, 500, 0), 0);
    QK_CHECK_EQ(qk_image_pread(img, 12345, back, sizeof(back)), 0);
    QK_CHECK(back[0] == 0 && back[499] == 0 && back[500] == 0x5a);
    QK_CHECK_EQ(qk_image_flush(img), 0);
    /* Past the end of the virtual disk. */
    QK_CHECK_EQ(qk_image_pwrite(img, (1 << 20) - 10, buf, 20), -EINVAL);
    qk_image_close(img);

    img = qk_image_open(path, "raw", 0, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    QK_CHECK_EQ(qk_image_pwrite(img, 0, buf, 10), -EACCES);
    qk_image_close(img);

    /* VM state needs a format with internal snapshots. */
    img = qk_image_open(path, "raw", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    msg[0] = 0;
    QK_CHECK(qk_image_vmstate_writer_open(img, NULL, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "internal snapshots") != NULL);
    uint64_t vsize;
    msg[0] = 0;
    QK_CHECK(qk_image_vmstate_reader_open(img, "s", NULL, &vsize, msg, sizeof(msg)) == NULL);
    QK_CHECK(strstr(msg, "internal snapshots") != NULL);
    qk_image_close(img);

    /* Tuning knobs: names, ranges, and images still work with them set
     * (each knob changes how I/O is issued, never what is read). */
    QK_CHECK_EQ(qk_set_tunable("no-such-knob", "1"), -ENOENT);
    QK_CHECK_EQ(qk_set_tunable("uring-writer", "2"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-async-min", "-1"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-async-min", "12k"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-async-min", NULL), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-async-min", "0"), 0);
    QK_CHECK_EQ(qk_set_tunable("uring-async-min-write", "0"), 0);
    QK_CHECK_EQ(qk_set_tunable("uring-coop-taskrun", "1"), 0);
    QK_CHECK_EQ(qk_set_tunable("bulk-read-direct", "0"), 0);
    QK_CHECK_EQ(qk_set_tunable("uring-submit-batch", "257"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-submit-batch", "1"), 0);
    QK_CHECK_EQ(qk_set_tunable("uring-seq-max", "-5"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("uring-seq-max", "65536"), 0);
    QK_CHECK_EQ(qk_set_tunable("loop-reap-batch", "4097"), -EINVAL);
    QK_CHECK_EQ(qk_set_tunable("loop-reap-batch", "2"), 0);
    img = qk_image_open(path, "raw", QK_IMAGE_RDWR, msg, sizeof(msg));
    QK_CHECK(img != NULL);
    if (img) {
        memset(buf, 0x77, sizeof(buf));
        QK_CHECK_EQ(qk_image_pwrite(img, 4096, buf, sizeof(buf)), 0);
        QK_CHECK_EQ(qk_image_pread(img, 4096, back, sizeof(back)), 0);
        QK_CHECK(memcmp(buf, back, sizeof(buf)) == 0);
        QK_CHECK_EQ(qk_image_close(img), 0);
    }
    QK_TEST_DONE();
}
