/*
 * Image formats qcowkit does not read (VMDK, VDI, VHDX, VHD, QED,
 * Parallels, LUKS, Bochs, cloop), recognised by the magic QEMU probes
 * them by. Guessed raw, such a file would be copied, compared or served
 * as its container's bytes instead of the disk it holds, with nothing to
 * say so; a guessed open refuses it by name instead, and a guessed raw
 * image's first sector may not be made to look like one (raw.c), as QEMU
 * keeps it from becoming another format.
 *
 * Owns: recognising those formats by their first bytes.
 */
#include "block/block.h"

#include <stdbool.h>
#include <string.h>

static bool at(const uint8_t *buf, size_t len, size_t off, const char *magic, size_t n)
{
    return off + n <= len && memcmp(buf + off, magic, n) == 0;
}

#define AT(off, s) at(buf, len, off, s, sizeof(s) - 1)

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A VMDK descriptor: after comment lines (and lines of spaces),
 * "version=1", 2 or 3 ends a line. */
static bool vmdk_descriptor(const uint8_t *buf, size_t len)
{
    size_t p = 0;
    while (p < len) {
        if (buf[p] == '#') {
            while (p < len && buf[p] != '\n') {
                p++;
            }
            p++;
            continue;
        }
        if (buf[p] == ' ') {
            while (p < len && buf[p] == ' ') {
                p++;
            }
            if (p < len && buf[p] == '\r') {
                p++;
            }
            if (p >= len || buf[p] != '\n') {
                return false;
            }
            p++;
            continue;
        }
        if (p + 10 > len || memcmp(buf + p, "version=", 8) != 0 || buf[p + 8] < '1' || buf[p + 8] > '3') {
            return false;
        }
        return buf[p + 9] == '\n' || (buf[p + 9] == '\r' && p + 11 <= len && buf[p + 10] == '\n');
    }
    return false;
}

const char *qk_block_foreign_format(const uint8_t *buf, size_t len)
{
    if (AT(0, "KDMV") || AT(0, "COWD") || vmdk_descriptor(buf, len)) {
        return "VMDK";
    }
    if (len >= 400 && AT(0x40, "\x7f\x10\xda\xbe")) {
        return "VDI";
    }
    if (AT(0, "vhdxfile")) {
        return "VHDX";
    }
    if (AT(0, "conectix")) {
        return "VHD";
    }
    if (len >= 64 && AT(0, "QED\0")) {
        return "QED";
    }
    if (len >= 64 && (AT(0, "WithoutFreeSpace") || AT(0, "WithouFreSpacExt")) && le32(buf + 16) == 2) {
        return "Parallels";
    }
    if (AT(0, "LUKS\xba\xbe") && AT(6, "\0\x01")) {
        return "LUKS";
    }
    if (len >= 512 && AT(0, "Bochs Virtual HD Image\0") && AT(32, "Redolog\0") && AT(48, "Growing\0") &&
        (le32(buf + 64) == 0x00020000 || le32(buf + 64) == 0x00010000)) {
        return "Bochs";
    }
    if (AT(0, "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n")) {
        return "cloop";
    }
    return NULL;
}
