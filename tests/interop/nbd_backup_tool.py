"""A backup tool as backup programs drive a storage daemon, with libnbd:
it connects to an export with the meta contexts base:allocation and
qemu:dirty-bitmap:NAME, and either reads the whole disk (a full backup)
or only the extents the bitmap marks dirty (an increment), writing a
backup file: for a full one a raw image, for an increment a list of
(offset, length) ranges and their data.

Usage: nbd_backup_tool.py full URI BITMAP OUT
       nbd_backup_tool.py incremental URI BITMAP OUT
       nbd_backup_tool.py restore FULL [INCREMENT...] OUT
Prints the bytes read from the export.
"""
import struct
import sys

import nbd

CHUNK = 4 << 20


def connect(uri, bitmap):
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.add_meta_context("qemu:dirty-bitmap:" + bitmap)
    h.connect_uri(uri)
    if not h.can_meta_context("qemu:dirty-bitmap:" + bitmap):
        sys.exit("the export offers no qemu:dirty-bitmap:" + bitmap)
    return h


def extents(h, ctx, off, length):
    """(offset, length, flags) of one context over [off, off + length)."""
    out = []

    def cb(metacontext, offset, entries, err):
        if metacontext != ctx:
            return
        pos = offset
        for i in range(0, len(entries), 2):
            out.append((pos, entries[i], entries[i + 1]))
            pos += entries[i]

    done = off
    end = off + length
    while done < end:
        out.clear()
        h.block_status(min(end - done, 1 << 30), done, cb)
        if not out:
            sys.exit("no extents for %s at %d" % (ctx, done))
        for o, n, f in out:
            if o >= end:
                break
            yield o, min(n, end - o), f
        done = min(out[-1][0] + out[-1][1], end)


def full(uri, bitmap, path):
    h = connect(uri, bitmap)
    size = h.get_size()
    read = 0
    with open(path, "wb") as f:
        f.truncate(size)
        for o, n, fl in list(extents(h, "base:allocation", 0, size)):
            if fl & 2:  # reads as zeros: nothing to copy
                continue
            for p in range(o, o + n, CHUNK):
                m = min(CHUNK, o + n - p)
                f.seek(p)
                f.write(h.pread(m, p))
                read += m
    h.shutdown()
    return read


def incremental(uri, bitmap, path):
    h = connect(uri, bitmap)
    size = h.get_size()
    read = 0
    with open(path, "wb") as f:
        f.write(struct.pack(">Q", size))
        for o, n, fl in list(extents(h, "qemu:dirty-bitmap:" + bitmap, 0, size)):
            if not fl & 1:
                continue
            for p in range(o, o + n, CHUNK):
                m = min(CHUNK, o + n - p)
                f.write(struct.pack(">QQ", p, m))
                f.write(h.pread(m, p))
                read += m
    h.shutdown()
    return read


def restore(full_path, incs, out):
    with open(full_path, "rb") as f:
        data = bytearray(f.read())
    for inc in incs:
        with open(inc, "rb") as f:
            size = struct.unpack(">Q", f.read(8))[0]
            if size != len(data):
                sys.exit("size changed")
            while True:
                hdr = f.read(16)
                if not hdr:
                    break
                p, m = struct.unpack(">QQ", hdr)
                data[p:p + m] = f.read(m)
    with open(out, "wb") as f:
        f.write(data)
    return 0


def main():
    cmd = sys.argv[1]
    if cmd == "full":
        print(full(sys.argv[2], sys.argv[3], sys.argv[4]))
    elif cmd == "incremental":
        print(incremental(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        print(restore(sys.argv[2], sys.argv[3:-1], sys.argv[-1]))


if __name__ == "__main__":
    main()
