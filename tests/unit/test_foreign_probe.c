/* Recognising formats qcowkit does not read by their first sector
 * (block/foreign.c): each magic, the extra fields some formats need, the
 * VMDK descriptor's line rules, and buffers too short to hold them. */
#include "qktest.h"
#include "block/block.h"

#include <stdint.h>
#include <string.h>

static uint8_t sec[QK_PROBE_SIZE];

static void fill(size_t off, const void *p, size_t n)
{
    memset(sec, 0, sizeof(sec));
    memcpy(sec + off, p, n);
}

static const char *probe(void)
{
    return qk_block_foreign_format(sec, sizeof(sec));
}

static int same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void text(const char *t, const char *want)
{
    fill(0, t, strlen(t));
    const char *got = probe();
    if (!same(got, want)) {
        fprintf(stderr, "descriptor %s: got %s, want %s\n", t, got ? got : "none", want ? want : "none");
    }
    QK_CHECK(same(got, want));
}

int main(void)
{
    memset(sec, 0, sizeof(sec));
    QK_CHECK(probe() == NULL);
    fill(0, "KDMV", 4);
    QK_CHECK(same(probe(), "VMDK"));
    fill(0, "COWD", 4);
    QK_CHECK(same(probe(), "VMDK"));
    fill(0x40, "\x7f\x10\xda\xbe", 4);
    QK_CHECK(same(probe(), "VDI"));
    QK_CHECK(qk_block_foreign_format(sec, 0x44) == NULL); /* shorter than a VDI header */
    fill(0, "vhdxfile", 8);
    QK_CHECK(same(probe(), "VHDX"));
    fill(0, "conectix", 8);
    QK_CHECK(same(probe(), "VHD"));
    QK_CHECK(qk_block_foreign_format(sec, 7) == NULL);
    fill(0, "QED", 4);
    QK_CHECK(same(probe(), "QED"));

    /* Parallels: either magic, and version 2. */
    fill(0, "WithoutFreeSpace\x02", 17);
    QK_CHECK(same(probe(), "Parallels"));
    fill(0, "WithouFreSpacExt\x02", 17);
    QK_CHECK(same(probe(), "Parallels"));
    fill(0, "WithoutFreeSpace\x03", 17);
    QK_CHECK(probe() == NULL);

    /* LUKS: version 1 only. */
    fill(0, "LUKS\xba\xbe\x00\x01", 8);
    QK_CHECK(same(probe(), "LUKS"));
    fill(0, "LUKS\xba\xbe\x00\x02", 8);
    QK_CHECK(probe() == NULL);

    /* Bochs: magic, redolog type, growing subtype, version 1 or 2. */
    memset(sec, 0, sizeof(sec));
    memcpy(sec, "Bochs Virtual HD Image", 22);
    memcpy(sec + 32, "Redolog", 7);
    memcpy(sec + 48, "Growing", 7);
    sec[66] = 2;
    QK_CHECK(same(probe(), "Bochs"));
    sec[66] = 1;
    QK_CHECK(same(probe(), "Bochs"));
    sec[66] = 3;
    QK_CHECK(probe() == NULL);
    sec[66] = 2;
    memcpy(sec + 48, "Undoabl", 7);
    QK_CHECK(probe() == NULL);

    text("#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n", "cloop");
    text("#!/bin/sh\n#V2.0 Format\n", NULL);

    /* VMDK descriptors: comments and lines of spaces, then version=1..3. */
    text("# Disk DescriptorFile\nversion=1\nCID=fffffffe\n", "VMDK");
    text("version=2\n", "VMDK");
    text("# a\n# b\n   \nversion=3\r\n", "VMDK");
    text("  \r\nversion=1\n", "VMDK");
    text("version=4\n", NULL);
    text("version=1", NULL);            /* the line must end */
    text("version=1x\n", NULL);
    text("# Disk DescriptorFile\nCID=1\nversion=1\n", NULL);
    text("\nversion=1\n", NULL);        /* an empty line is not a comment */
    text("  x\nversion=1\n", NULL);
    text("# Disk DescriptorFile", NULL);

    /* qcow2 and plain data are not foreign. */
    fill(0, "QFI\xfb\x00\x00\x00\x03", 8);
    QK_CHECK(probe() == NULL);
    memset(sec, 0xab, sizeof(sec));
    QK_CHECK(probe() == NULL);
    QK_TEST_DONE();
}
