#!/usr/bin/env python3
"""Hostile and truncated images: every damaged image must be refused (or,
for damage deep in the tables, reported) with a clear message and exit
status 1, without a crash or sanitizer report and without a single byte of
the file changing.

Usage: hostile.py QCOWKIT WORKDIR
"""
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import zlib

def sh(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

def make_base(work):
    path = os.path.join(work, "base.qcow2")
    sh(["qemu-img", "create", "-q", "-f", "qcow2", path, "64M"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 256k", "-c", "write -P 0x22 32M 64k", path])
    with open(path, "rb") as f:
        return bytearray(f.read())

def new_image(path, size, writes, opts=None):
    """A fresh qcow2 image at path (create options opts), written by the qemu-io commands in writes."""
    sh(["rm", "-f", path])
    sh(["qemu-img", "create", "-q", "-f", "qcow2"] + (["-o", opts] if opts else []) + [path, size])
    sh(["qemu-io", "-f", "qcow2"] + [a for w in writes for a in ("-c", w)] + [path])

def be(fmt, buf, off, val):
    struct.pack_into(">" + fmt, buf, off, val)

def field(fmt, off, val):
    def f(img):
        be(fmt, img, off, val)
        return img
    return f

def truncate(n):
    return lambda img: img[:n]

def l1_entry(img):
    return struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 40)[0])[0]

def bad_l1_entry(val):
    def f(img):
        l1 = struct.unpack_from(">Q", img, 40)[0]
        be("Q", img, l1, val)
        return img
    return f

def bad_l2_entry(val):
    def f(img):
        l2 = l1_entry(img) & 0x00fffffffffffe00
        be("Q", img, l2, val)
        return img
    return f

def patch(path, mut):
    """Applies a mutation (bytes -> bytes, as the ones above) to a file in place."""
    with open(path, "rb") as f:
        img = mut(bytearray(f.read()))
    with open(path, "wb") as f:
        f.write(img)

def refcount_table_names_itself(img):
    rt = struct.unpack_from(">Q", img, 48)[0]
    be("Q", img, rt, rt)
    return img

def l1_names_itself(img):
    return bad_l1_entry(struct.unpack_from(">Q", img, 40)[0])(img)

def bad_refblock_entry(img):
    rt = struct.unpack_from(">Q", img, 48)[0]
    be("Q", img, rt, 0x7fffffff0000)  # refcount block far outside the file
    return img

def header_exts(img):
    """The header extensions as (type, data), and where the area starts."""
    pos = start = struct.unpack_from(">I", img, 100)[0]
    exts = []
    while True:
        t, n = struct.unpack_from(">II", img, pos)
        if t == 0:
            return start, pos, exts
        exts.append((t, bytes(img[pos + 8:pos + 8 + n])))
        pos += 8 + (n + 7) // 8 * 8

def end_marker_len(n):
    # QEMU refuses an end marker whose length runs past the header area.
    def f(img):
        _, end, _ = header_exts(img)
        be("I", img, end + 4, n)
        return img
    return f

def backing_format_ext(name):
    # QEMU keeps the backing format in 16 bytes and refuses a longer one.
    def f(img):
        start, _, exts = header_exts(img)
        area = b""
        for t, d in [(0xe2792aca, name)] + exts:
            area += struct.pack(">II", t, len(d)) + d + b"\0" * (-len(d) % 8)
        area += b"\0" * 8
        img[start:start + len(area)] = area
        return img
    return f

# (name, mutation, commands that must fail with exit 1, expected message fragment)
OPEN_FAIL = ["info", "io -c 'read 0 4k'"]
CASES = [
    ("empty file", truncate(0), OPEN_FAIL, ""),
    ("truncated header", truncate(50), OPEN_FAIL, ""),
    ("tables cut off", truncate(70000), OPEN_FAIL, ""),
    ("version 4", field("I", 4, 4), OPEN_FAIL, "version"),
    ("cluster_bits 8", field("I", 20, 8), OPEN_FAIL, "cluster"),
    ("cluster_bits 30", field("I", 20, 30), OPEN_FAIL, "cluster"),
    ("encrypted", field("I", 32, 1), OPEN_FAIL, "encrypt"),
    ("huge l1_size", field("I", 36, 0x7fffffff), OPEN_FAIL, "L1"),
    ("l1 unaligned", field("Q", 40, 0x30200), OPEN_FAIL, "L1"),
    ("l1 in header", field("Q", 40, 0), OPEN_FAIL, ""),
    ("l1 beyond eof", field("Q", 40, 0x10000000000), OPEN_FAIL, ""),
    ("refcount table in header", field("Q", 48, 0), OPEN_FAIL, "refcount"),
    ("refcount table unaligned", field("Q", 48, 0x10100), OPEN_FAIL, "refcount"),
    ("refcount table huge", field("I", 56, 0x7fffffff), OPEN_FAIL, "refcount"),
    ("snapshot table beyond eof", lambda img: (be("I", img, 60, 5), be("Q", img, 64, 0x100000000), img)[2], OPEN_FAIL, "snapshot"),
    ("unknown incompatible bit", field("Q", 72, 1 << 60), OPEN_FAIL, "incompatible feature"),
    ("refcount_order 7", field("I", 96, 7), OPEN_FAIL, "refcount"),
    ("header_length 50", field("I", 100, 50), OPEN_FAIL, "header"),
    ("virtual size 2^63", field("Q", 24, 1 << 63), OPEN_FAIL, ""),
    ("backing name beyond eof", lambda img: (be("Q", img, 8, 0x7fff0000), be("I", img, 16, 100), img)[2], OPEN_FAIL, "backing"),
    ("backing name too long", lambda img: (be("Q", img, 8, 0x200), be("I", img, 16, 5000), img)[2], OPEN_FAIL, "backing"),
    ("end marker overruns", end_marker_len(0x10000), OPEN_FAIL, "overruns"),
    ("backing format 16 bytes", backing_format_ext(b"qcow2" + b"\0" * 11), OPEN_FAIL, "backing format"),
    ("corrupt bit set, opened rw", field("Q", 72, 2), ["io -c 'write 0 4k'"], "corrupt"),
    # The raw-data-file bit without a data file: refused as QEMU refuses
    # it (a writer used to clear it); info still shows the image.
    ("data-file-raw, no data file", field("Q", 88, 2), ["io -c 'write 0 4k'", "io -r -c 'read 0 4k'", "check", "map"],
     "data-file-raw requires a data file"),
    # Damage inside the tables: opening may succeed, but damaged metadata is
    # never trusted: reads through it fail, and allocation never uses a
    # refcount block it cannot read.
    ("L1 entry unaligned", bad_l1_entry(0x8000000000030200), ["io -c 'read 0 4k'"], ""),
    ("L1 entry beyond eof", bad_l1_entry(0x8000100000000000), ["io -c 'read 0 4k'"], ""),
    ("L2 entry unaligned", bad_l2_entry(0x8000000000050200), ["io -c 'read 0 4k'"], ""),
    ("refcount block beyond eof", bad_refblock_entry, ["io -c 'write 1M 4k'"], ""),
]

# Damage that reads harmlessly (as QEMU reads it: a data cluster past the end
# of the file reads as zeros) but that check must report as corruption.
CHECK_ONLY = [
    ("L2 entry beyond eof", bad_l2_entry(0x8000100000000000)),
    ("L1 entry unaligned", bad_l1_entry(0x8000000000030200)),
    ("refcount block beyond eof", bad_refblock_entry),
]

# Hostile compressed clusters, in zlib and zstd images written by qemu-io:
# a read of the cluster and a convert must fail with a clear error; qemu-io
# reads the same images, and must still read the undamaged originals.
def compressed_base(work, ct):
    p = os.path.join(work, "comp-%s.qcow2" % ct)
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "compression_type=" + ct, p, "1M"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -c -P 0x33 0 64k", "-c", "write -c -P 0x44 64k 64k", p])
    with open(p, "rb") as f:
        return bytearray(f.read())

def compressed_entry(img):
    """(where the L2 entry of guest cluster 0 is, bits of its offset field, host offset)."""
    l1 = struct.unpack_from(">Q", img, 40)[0]
    l2 = struct.unpack_from(">Q", img, l1)[0] & 0x00fffffffffffe00
    e = struct.unpack_from(">Q", img, l2)[0]
    assert e & (1 << 62), "cluster 0 is not compressed"
    x = 62 - (struct.unpack_from(">I", img, 20)[0] - 8)
    return l2, x, e & ((1 << x) - 1)

def set_compressed(img, off, sectors, data=None):
    pos, x, _ = compressed_entry(img)
    be("Q", img, pos, (1 << 62) | ((sectors - 1) << x) | off)
    if data is not None:
        img[off:off + len(data)] = data
    return img

def compressed_stream(ct, data):
    if ct == "zlib":
        c = zlib.compressobj(6, zlib.DEFLATED, -12, 9)
        return c.compress(data) + c.flush()
    return subprocess.run(["zstd", "-q", "-c"], input=data, stdout=subprocess.PIPE, check=True).stdout

def compressed_cases(work):
    out = []
    for ct in ("zlib", "zstd"):
        b = compressed_base(work, ct)
        _, _, off = compressed_entry(b)
        big = compressed_stream(ct, bytes(1 << 20))
        rnd = random.Random(1)
        out += [
            ("%s: data past the end of the file" % ct, set_compressed(bytearray(b), len(b) - 512, 256)),
            ("%s: offset far past the end" % ct, set_compressed(bytearray(b), 1 << 40, 1)),
            ("%s: inflates past the cluster" % ct,
             set_compressed(bytearray(b), off, (len(big) + 511) // 512 + 1, big)),
            ("%s: inflates short of the cluster" % ct,
             set_compressed(bytearray(b), off, 1, compressed_stream(ct, bytes(1000)))),
            ("%s: garbage" % ct,
             set_compressed(bytearray(b), off, 1, bytes(rnd.randrange(256) for _ in range(512)))),
        ]
    return out

def only_marked_as_qemu_marks(img, path, cmd):
    """Whether the file at path differs from img by the header's corrupt
    bit alone, and qemu-io, given the same image and command, sets it too
    (it marks a writable image corrupt when a read finds an L2 entry no
    reader can follow)."""
    now = open(path, "rb").read()
    marked = bytearray(img)
    marked[79] |= 2
    if now != bytes(marked):
        return False
    q = path + ".qemu"
    with open(q, "wb") as f:
        f.write(img)
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", cmd, q], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    same = open(q, "rb").read() == now
    os.unlink(q)
    return same

def qemu_refuses(path):
    """Whether qemu-io fails to read the first (damaged) cluster too."""
    p = subprocess.run(["qemu-io", "-f", "qcow2", "-c", "read 0 64k", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return "read failed" in p.stdout

def run_compressed(qcowkit, work, env):
    fails = 0
    cases = compressed_cases(work)
    for ct in ("zlib", "zstd"):
        p = os.path.join(work, "comp-%s.qcow2" % ct)
        rd = subprocess.run([qcowkit, "io", "-f", "qcow2", "-c", "read -P 0x33 0 64k", "-c", "read -P 0x44 64k 64k", p],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if rd.stdout.count("read 65536/65536") != 2:
            fails += 1
            print("FAIL %s: the undamaged image does not read back\n%s" % (ct, rd.stdout))
    for name, img in cases:
        path = os.path.join(work, "hostile.qcow2")
        with open(path, "wb") as f:
            f.write(img)
        before = hashlib.sha256(img).hexdigest()
        rd = subprocess.run([qcowkit, "io", "-f", "qcow2", "-c", "read 0 64k", path], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cv = subprocess.run([qcowkit, "convert", "-O", "raw", path, os.path.join(work, "out.raw")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        chk = subprocess.run([qcowkit, "check", path], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        # --salvage: the damaged cluster becomes zeros with a warning per
        # 512 bytes, the rest is copied, exit 0: as qemu-img --salvage does.
        sv_out, q_out = os.path.join(work, "salvaged.raw"), os.path.join(work, "q-salvaged.raw")
        sv = subprocess.run([qcowkit, "convert", "--salvage", "-O", "raw", path, sv_out], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        qsv = subprocess.run(["qemu-img", "convert", "--salvage", "-O", "raw", path, q_out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        after = hashlib.sha256(open(path, "rb").read()).hexdigest()
        why = []
        warns = sv.stderr.count("warning: error while reading offset")
        qwarns = qsv.stderr.count("warning: error while reading offset")
        if sv.returncode != 0 or warns < 128 or warns % 128:
            why.append("salvage: exit %d, %d warnings, %r" % (sv.returncode, warns, sv.stderr.strip()[-200:]))
        elif qemu_refuses(path) and (qwarns != warns or open(sv_out, "rb").read() != open(q_out, "rb").read()):
            # (where qemu reads the damaged cluster, taking the first 64 KiB
            # of a zlib stream that inflates past it, it is not a judge)
            why.append("salvage: %d warnings and output, qemu-img --salvage %d and other bytes" % (warns, qwarns))
        if "read failed" not in rd.stdout or rd.returncode not in (0, 1):
            why.append("read: exit %d, %r" % (rd.returncode, rd.stdout.strip()[:200]))
        # The damage is named, as all other damage met on a read is (it
        # used to be a bare "Structure needs cleaning").
        if (cv.returncode != 1 or "error while reading at byte 0" not in cv.stdout or
                "qcow2: Image is corrupt: Compressed cluster at 0x" not in cv.stdout):
            why.append("convert: exit %d, %r" % (cv.returncode, cv.stdout.strip()[:300]))
        if chk.returncode not in (0, 2):
            why.append("check: exit %d" % chk.returncode)
        out = rd.stdout + cv.stdout + chk.stdout
        if "Sanitizer" in out or "runtime error" in out:
            why.append("sanitizer report")
        if before != after:
            why.append("file changed")
        print("%s %-40s %s" % ("FAIL" if why else "ok  ", name, "; ".join(why)))
        fails += 1 if why else 0
    # A damaged compressed cluster after plain data: the error names the
    # cluster's offset, as qemu-img's does, not the start of the copy.
    p = os.path.join(work, "mid.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", p, "4M"], check=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x22 0 256k", "-c", "write -c -P 0x11 256k 64k",
                    "-c", "write -P 0x22 320k 64k", p], check=True, stdout=subprocess.DEVNULL)
    img = bytearray(open(p, "rb").read())
    l2 = l1_entry(img) & 0x00fffffffffffe00
    host = struct.unpack_from(">Q", img, l2 + 4 * 8)[0] & ((1 << 54) - 1)
    img[host:host + 64] = b"\xff" * 64
    open(p, "wb").write(img)
    msgs = []
    for tool in ("qemu-img", qcowkit):
        cv = subprocess.run([tool, "convert", "-O", "raw", p, os.path.join(work, "mid.raw")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        msgs.append((cv.returncode, "at byte 262144:" in cv.stdout))
    ok = msgs[0] == msgs[1] == (1, True)
    print("%s %-40s %s" % ("ok  " if ok else "FAIL", "damaged cluster at 256k: error offset", msgs))
    return len(cases) + 1, fails + (0 if ok else 1)

# An L2 entry whose host offset is inside a cluster (0x50200: guest
# cluster 0's data at 0x50000, guest cluster 1's at 0x60000). Freeing it
# (discard, zero writes that unmap) must drop no refcount: that of "its"
# range would free guest cluster 1's host cluster too, and the next
# allocation would write over that data. As QEMU does, the entry goes,
# the cluster leaks (check exits 3) and the image stays writable, with
# QEMU's non-fatal line. With standard and extended L2 entries.
def run_unaligned_free(qcowkit, work, env):
    fails = 0
    for ext in ("off", "on"):
        path = os.path.join(work, "unaligned.qcow2")
        for op in ("discard 0 64k", "write -z -u 0 64k"):
            new_image(path, "64M", ["write -P 0x11 0 64k", "write -P 0x12 64k 64k"], "extended_l2=" + ext)
            with open(path, "r+b") as f:
                img = bytearray(f.read())
                l2 = l1_entry(img) & 0x00fffffffffffe00
                assert struct.unpack_from(">Q", img, l2)[0] & 0x00fffffffffffe00 == 0x50000, "layout changed"
                be("Q", img, l2, 0x8000000000050200)
                f.seek(0)
                f.write(img)
            p = subprocess.run([qcowkit, "io", "-f", "qcow2", "-c", op, "-c", "write -P 0x99 48M 128k", path], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x12 64k 64k", "-c", "read -P 0x99 48M 128k",
                     "-c", "read -P 0 0 64k", path])
            info = sh(["qemu-img", "info", path]).stdout
            chk = sh(["qemu-img", "check", path]).returncode
            ok = (p.returncode == 0 and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout and
                  "qcow2: Image is corrupt: Cannot free unaligned cluster 0x50200;" in p.stdout and
                  "verification failed" not in rd.stdout and rd.returncode == 0 and "corrupt: false" in info and
                  chk == 3)
            print("%s unaligned L2 entry, extended_l2=%s, %s" % ("ok  " if ok else "FAIL", ext, op))
            if not ok:
                fails += 1
                print("     " + (p.stdout + rd.stdout + info).strip().replace("\n", "\n     ")[:2000])
    return fails

def snapshot_image(path, size, before, after, opts=None):
    """A fresh image (create options opts): BEFORE written, snapshot s1 taken, AFTER written (qemu-io commands)."""
    new_image(path, size, [before], opts)
    sh(["qemu-img", "snapshot", "-c", "s1", path])
    sh(["qemu-io", "-f", "qcow2", "-c", after, path])

def small_snapshot_image(path):
    """A fresh 1 MiB image, 512-byte clusters and 64-bit refcounts: data,
    snapshot s0, then a write over part of it (s0 and the disk share the rest)."""
    new_image(path, "1M", ["write -P 0x31 0 40k", "write -P 0x32 600k 8k"], "cluster_size=512,refcount_bits=64")
    sh(["qemu-img", "snapshot", "-c", "s0", path])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x33 4k 4k", path])

# snapshot -a of a snapshot whose L1 table is the refcount table, or whose
# L1 names the refcount table as an L2 table: refused before anything changes (the
# file stays byte for byte as it was), as qemu-img refuses; applying it
# made garbage the active L1 and failed only afterwards.
def run_bad_snapshot_apply(qcowkit, work, env):
    fails = 0
    path = os.path.join(work, "snap.qcow2")
    for what in ("L1 table is the refcount table", "L1 entry names the refcount table"):
        snapshot_image(path, "4M", "write -P 0x11 0 1M", "write -P 0x33 0 64k")
        with open(path, "r+b") as f:
            img = bytearray(f.read())
            sn = struct.unpack_from(">Q", img, 64)[0]
            if what.startswith("L1 table"):
                be("Q", img, sn, struct.unpack_from(">Q", img, 48)[0])
            else:
                be("Q", img, struct.unpack_from(">Q", img, sn)[0], (1 << 63) | struct.unpack_from(">Q", img, 48)[0])
            f.seek(0)
            f.write(img)
        before = hashlib.sha256(open(path, "rb").read()).hexdigest()
        p = subprocess.run([qcowkit, "snapshot", "-a", "s1", path], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        after = hashlib.sha256(open(path, "rb").read()).hexdigest()
        rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x33 0 64k", "-c", "read -P 0x11 64k 960k", path])
        ok = (p.returncode == 1 and "Failed to load snapshot" in p.stdout and before == after and
              "verification failed" not in rd.stdout and "Sanitizer" not in p.stdout)
        print("%s snapshot -a, %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails += 1
            print("     exit %d, file %s\n     %s" % (p.returncode, "unchanged" if before == after else "CHANGED",
                                                    (p.stdout + rd.stdout).strip().replace("\n", "\n     ")[:2000]))
    return fails

# A snapshot whose L1 table lies past the end of the file: as in qemu-img,
# the snapshots are listed, the other one is deleted, and the bad one is
# deleted too (what it referenced leaks: check exits 3). Applying it is
# refused with the file unchanged (qemu-img 7.2 goes ahead, and the disk
# then reads as what 8 bytes past the end of the file give). Every
# listing, deletion's exit status and the check's is qemu-img's; the
# guest data reads back.
def run_snapshot_l1_past_eof(qcowkit, work, env):
    fails = 0
    orig = os.path.join(work, "snl1.qcow2")
    snapshot_image(orig, "4M", "write -P 0x11 0 1M", "write -P 0x33 0 64k")
    sh(["qemu-img", "snapshot", "-c", "s2", orig])
    img = bytearray(open(orig, "rb").read())
    be("Q", img, struct.unpack_from(">Q", img, 64)[0], 1 << 40)   # s1's l1_table_offset
    imgs = {}
    for tool in ("qemu-img", qcowkit):   # the same bytes (and dates) for both
        imgs[tool] = os.path.join(work, "snl1-%d.qcow2" % len(imgs))
        with open(imgs[tool], "wb") as f:
            f.write(img)
    steps = []
    for tool, path in imgs.items():
        before = open(path, "rb").read()
        a = subprocess.run([tool, "snapshot", "-a", "s1", path], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        unchanged = open(path, "rb").read() == before
        out = []
        for cmd in (["-l"], ["-d", "s2"], ["-l"], ["-d", "s1"], ["-l"]):
            p = subprocess.run([tool, "snapshot"] + cmd + [path], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
            out.append((cmd[0], p.returncode, p.stdout))
        chk = sh(["qemu-img", "check", path]).returncode
        rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x33 0 64k", "-c", "read -P 0x11 64k 960k", path])
        steps.append((a.returncode, unchanged, out, chk, "verification failed" not in rd.stdout, a.stdout))
    q, k = steps
    ok = (k[0] == 1 and k[1] and k[2] == q[2] and k[3] == q[3] == 3 and k[4] and "Sanitizer" not in k[5])
    print("%s snapshot L1 past the end of the file: list, delete" % ("ok  " if ok else "FAIL"))
    if not ok:
        fails += 1
        print("     qcowkit %r\n     qemu-img %r" % (k, q))
    return fails

# Two snapshots' L1 tables named past the end of the file, a cluster
# apart, and a guest write that grows the file over them: refused as
# qemu-io refuses it ("overlaps with inactive L1 table"), the image marked
# corrupt, and no guest data where the tables are said to be. The write
# used to land there, so reverting to a snapshot would have read guest
# data as its L1 table.
def run_write_over_far_snapshot_l1(qcowkit, work, env):
    orig = os.path.join(work, "snfar.qcow2")
    snapshot_image(orig, "64M", "write -P 0x11 0 1M", "write -P 0x33 0 64k")
    sh(["qemu-img", "snapshot", "-c", "s2", orig])
    img = bytearray(open(orig, "rb").read())
    far = (len(img) + 2 * 65536) // 65536 * 65536
    sn = struct.unpack_from(">Q", img, 64)[0]
    be("Q", img, sn, far)                       # s1's l1_table_offset
    extra = struct.unpack_from(">I", img, sn + 36)[0]
    idl, namel = struct.unpack_from(">HH", img, sn + 12)
    sn2 = sn + (40 + extra + idl + namel + 7) // 8 * 8
    be("Q", img, sn2, far + 2 * 65536)          # s2's
    res = {}
    for tool in ("qemu-io", qcowkit):
        path = os.path.join(work, "snfar-%d.qcow2" % len(res))
        with open(path, "wb") as f:
            f.write(img)
        args = [tool] + (["-f", "qcow2"] if tool == "qemu-io" else ["io"]) + ["-c", "write -P 0x22 8M 4M", path]
        p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        data = open(path, "rb").read()
        landed = any(data[o:o + 8] == b"\x22" * 8 for o in (far, far + 2 * 65536))
        corrupt = bool(struct.unpack_from(">Q", data, 72)[0] & 2)
        res[tool] = (p.returncode, landed, corrupt, "overlaps with inactive L1 table" in p.stdout, p.stdout)
    q, k = res["qemu-io"], res[qcowkit]
    ok = (q[:4] == (1, False, True, True) and k[:4] == q[:4] and "Sanitizer" not in k[4] and
          "runtime error" not in k[4])
    print("%s a write growing the file over snapshots' L1 tables named past its end" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     qcowkit %r\n     qemu-io %r" % (k, q))
    return 0 if ok else 1

# A 64-bit refcount stored above the format's limit (2^63 - 1; here
# 2^64 - 1, which qemu-img check counts as a leak): snapshot -c added 1
# to it, which wrapped it to 0, so the cluster was handed out again and
# the disk's data changed while the command exited 0. Now refused, as
# qemu-img refuses it, with the disk as it was; and check -r all repairs
# it with qemu-img's report (its delta once fitted a signed step only by
# wrapping around).
def run_refcount_above_limit(qcowkit, work, env):
    path = os.path.join(work, "rcmax.qcow2")
    small_snapshot_image(path)
    img = bytearray(open(path, "rb").read())
    rb = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 48)[0])[0]
    be("Q", img, rb + 8 * 8, (1 << 64) - 1)  # cluster 8: data the snapshot shares
    open(path, "wb").write(img)
    sh(["qemu-img", "convert", "-O", "raw", path, path + ".before"])
    p = subprocess.run([qcowkit, "snapshot", "-c", "new", path], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    sh(["qemu-img", "convert", "-O", "raw", path, path + ".after"])
    same = open(path + ".before", "rb").read() == open(path + ".after", "rb").read()
    chk = sh(["qemu-img", "check", path]).returncode
    reports = []
    for tool in ("qemu-img", qcowkit):
        c = path + "." + os.path.basename(tool)
        with open(c, "wb") as f:
            f.write(img)
        r = subprocess.run([tool, "check", "-r", "all", c], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        reports.append((r.returncode, [l for l in r.stdout.splitlines() if "Image end offset" not in l]))
    ok = (p.returncode == 1 and same and chk == 3 and reports[0] == reports[1] and reports[0][0] == 0 and
          "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s a 64-bit refcount above the limit: snapshot -c refused, check -r all as qemu-img" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d, data %s, check %d\n     %s\n     qemu-img %r\n     qcowkit  %r" %
              (p.returncode, "same" if same else "CHANGED", chk, p.stdout.strip(), reports[0], reports[1]))
    return 0 if ok else 1

# A snapshot table that claims more than the file holds (entry 0's id
# length set to 65535) cannot be read, and a read-write open used to
# protect none of it: a guest write that grew the file landed where the
# table says it goes. qemu-io reads the missing part as zeros and
# refuses the write ("overlaps with snapshot table"); so do we now, over
# the length the table claims, and the table's bytes stay as they were.
def run_write_over_unreadable_snapshot_table(qcowkit, work, env):
    path = os.path.join(work, "sntl.qcow2")
    small_snapshot_image(path)
    img = bytearray(open(path, "rb").read())
    so = struct.unpack_from(">Q", img, 64)[0]
    be("H", img, so + 12, 65535)
    open(path, "wb").write(img)
    p = subprocess.run([qcowkit, "io", "-c", "write -P 0xee 64k 68k", path], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    after = open(path, "rb").read()
    ok = (p.returncode == 1 and "overlaps with snapshot table" in p.stdout and after[so:len(img)] == img[so:] and
          b"\xee" * 512 not in after[len(img):] and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s a write growing the file into a snapshot table that cannot be read: refused" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d\n     %s" % (p.returncode, p.stdout.strip()[-600:]))
    return 0 if ok else 1

# A grow that moves the L1 table, where L1[0] names the L1 table itself
# as its L2 table: the old table was freed although the new one still
# names it, so its refcount fell to 0 under a live reference and the next
# allocation took it (qemu-img check went from 2 errors to 4). Now it is
# left allocated, and the resize completes as qemu-img's does.
def run_grow_l1_named_by_itself(qcowkit, work, env):
    path = os.path.join(work, "l1self.qcow2")
    new_image(path, "4M", ["write -P 0x31 0 1M"], "cluster_size=4096,refcount_bits=1")
    patch(path, lambda img: bad_l1_entry((1 << 63) | struct.unpack_from(">Q", img, 40)[0])(img))
    count = lambda: int(([l for l in sh(["qemu-img", "check", path]).stdout.splitlines() if "errors were" in l] or
                         ["0"])[0].split()[0])
    before = count()
    p = subprocess.run([qcowkit, "resize", path, "+3M"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    after = count()
    ok = (p.returncode == 0 and after <= before and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s a grow moving an L1 table that L1[0] names: the old table stays allocated" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d, errors %d -> %d\n     %s" % (p.returncode, before, after, p.stdout.strip()[-600:]))
    return 0 if ok else 1

# snapshot -c over an active L2 entry naming a cluster past the end of
# the file: sharing it counted a cluster that is not there (a refcount
# block grown for it, one error more), where qemu-img refuses. Now
# refused before any change, naming the cluster.
def run_snapshot_create_entry_past_end(qcowkit, work, env):
    path = os.path.join(work, "snpe.qcow2")
    new_image(path, "1M", ["write -P 0x31 0 40k"], "cluster_size=512")
    img = bytearray(open(path, "rb").read())
    far = (len(img) + 512 * 64) // 512 * 512
    l2 = l1_entry(img) & 0x00fffffffffffe00
    be("Q", img, l2 + 8, (1 << 63) | far)
    open(path, "wb").write(img)
    before = open(path, "rb").read()
    p = subprocess.run([qcowkit, "snapshot", "-c", "x", path], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    ok = (p.returncode == 1 and open(path, "rb").read() == before and
          ("Data cluster %#x lies past the end of the file" % far) in p.stdout and "Sanitizer" not in p.stdout)
    print("%s snapshot -c over an entry past the end of the file: refused before any change" %
          ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d\n     %s" % (p.returncode, p.stdout.strip()[-600:]))
    return 0 if ok else 1

# An update of an active L1 entry lands where the active L1 table is also
# something else: a snapshot's L1 table (the snapshot table names the
# active one), or an "L2 table" (an L1 entry names the L1 table itself).
# The entry was written without the overlap check, so the snapshot's
# content changed, or guest bytes outside the write did. Now refused as
# qemu-io refuses it: the write fails, the image is marked corrupt, and
# neither the snapshot nor the disk changes.
def run_l1_entry_over_other_metadata(qcowkit, work, env):
    fails = 0
    for what in ("a snapshot's L1 table", "an L2 table"):
        path = os.path.join(work, "l1x.qcow2")
        sh(["rm", "-f", path])
        if what.endswith("L1 table"):
            # 4 KiB clusters: an L2 table maps 2 MiB, so the disk (and
            # the raw copies compared below) can be small.
            snapshot_image(path, "8M", "write -P 0xa1 0 300k", "write -P 0xa2 100k 100k", "cluster_size=4k")
            img = bytearray(open(path, "rb").read())
            be("Q", img, struct.unpack_from(">Q", img, 64)[0], struct.unpack_from(">Q", img, 40)[0])
            view = ["-l", "s1"]
            at = "6M"  # no L2 table there yet: the write sets L1[3]
        else:
            sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, "1M"])
            sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x31 0 40k", path])
            img = bytearray(open(path, "rb").read())
            l1 = struct.unpack_from(">Q", img, 40)[0]
            be("Q", img, l1, (1 << 63) | l1)
            view = []
            at = "64k"  # past the first L2 tables: new ones, and their L1 entries
        res = {}
        for tool in ("qemu-io", qcowkit):
            p2 = os.path.join(work, "l1x-%d.qcow2" % len(res))
            with open(p2, "wb") as f:
                f.write(img)
            sh(["qemu-img", "convert", "-O", "raw"] + view + [p2, p2 + ".before"])
            args = [tool] + (["-f", "qcow2"] if tool == "qemu-io" else ["io"]) + ["-c", "write -P 0xee %s 68k" % at, p2]
            p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sh(["qemu-img", "convert", "-U", "-O", "raw"] + view + [p2, p2 + ".after"])
            same = open(p2 + ".before", "rb").read() == open(p2 + ".after", "rb").read()
            corrupt = bool(struct.unpack_from(">Q", open(p2, "rb").read(72 + 8), 72)[0] & 2)
            res[tool] = (p.returncode, same, corrupt, p.stdout)
        q, k = res["qemu-io"], res[qcowkit]
        ok = q[:3] == (1, True, True) and k[:3] == q[:3] and "Sanitizer" not in k[3] and "runtime error" not in k[3]
        print("%s an L1 entry update where the active L1 table is also %s: refused" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails += 1
            print("     qcowkit %r\n     qemu-io %r" % (k, q))
    return fails

# snapshot -c on an image whose active tree names a cluster (or an L2
# table) at an offset inside a cluster: refused before anything changes,
# with QEMU's "Marking image as corrupt" line and its corrupt bit (the
# file otherwise byte for byte as it was). It used to clear the COPIED
# flags, fail half way, and leave more errors than it found.
def run_snapshot_create_bad_tree(qcowkit, work, env):
    fails = 0
    for what, at, val in (("data cluster", 0x40000, 0x8000000000050200), ("L2 table", 0x30000, 0x8000000000040200)):
        path = os.path.join(work, "sncb.qcow2")
        new_image(path, "4M", ["write -P 0x11 0 128k", "write -P 0x33 1M 64k"])
        img = bytearray(open(path, "rb").read())
        be("Q", img, at, val)
        open(path, "wb").write(img)
        qpath = path + ".q"
        open(qpath, "wb").write(img)
        k = subprocess.run([qcowkit, "snapshot", "-c", "x", path], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        q = sh(["qemu-img", "snapshot", "-c", "x", qpath])
        marked = bytearray(img)
        marked[79] |= 2
        kline = [l for l in k.stdout.splitlines() if l.startswith("qcow2: ")]
        qline = [l for l in q.stdout.splitlines() if l.startswith("qcow2: ")]
        ok = (k.returncode == q.returncode == 1 and open(path, "rb").read() == bytes(marked) and
              kline == qline and len(kline) == 1 and "Sanitizer" not in k.stdout)
        print("%s snapshot -c over an unaligned %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails += 1
            print("     qcowkit exit %d: %s\n     qemu-img exit %d: %s" % (k.returncode, k.stdout.strip(),
                                                                     q.returncode, q.stdout.strip()))
    return fails

# Writes img to path, runs a snapshot command over it, and checks that it
# was refused before any change: exit 1, only the corrupt bit set, the same
# error count from qemu-img check, and `says` in the message.
def refused_unchanged(qcowkit, env, path, img, cmd, says, label):
    open(path, "wb").write(img)
    before = sh(["qemu-img", "check", path]).stdout
    k = subprocess.run([qcowkit] + cmd + [path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    after = sh(["qemu-img", "check", path]).stdout
    marked = bytearray(img)
    marked[79] |= 2
    count = lambda out: [l for l in out.splitlines() if "errors were found" in l]
    ok = (k.returncode == 1 and open(path, "rb").read() == bytes(marked) and count(before) == count(after) and
          len(count(before)) == 1 and says in k.stdout and "Sanitizer" not in k.stdout)
    print("%s %s: refused before any change" % ("ok  " if ok else "FAIL", label))
    if not ok:
        print("     exit %d: %s\n     before %s, after %s" % (k.returncode, k.stdout.strip(), count(before),
                                                              count(after)))
    return 0 if ok else 1

# snapshot -c on an image whose active L1 entry names the refcount block
# as its (COPIED) L2 table: the flag pass would write the refcount block
# back as an L2 table, which the overlap check refuses. That refusal used
# to come half way (flags cleared, the image worse than before); now the
# active tree is checked first: exit 1, only the corrupt bit set, and
# qemu-img check counts what it counted before (qemu-img itself goes from
# 2 errors to 36 here).
def run_snapshot_create_tree_on_metadata(qcowkit, work, env):
    path = os.path.join(work, "sncm.qcow2")
    new_image(path, "1M", ["write -P 0x11 0 40k", "write -P 0x33 600k 8k"], "cluster_size=512,refcount_bits=64")
    img = bytearray(open(path, "rb").read())
    l1 = struct.unpack_from(">Q", img, 40)[0]
    rb = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 48)[0])[0]
    be("Q", img, l1, (1 << 63) | rb)
    return refused_unchanged(qcowkit, env, path, img, ["snapshot", "-c", "x"], "overlaps with refcount block",
                             "snapshot -c with the active L1 naming a refcount block")

# An image whose external data file is a FIFO: opening it used to wait for
# a writer forever, in every command. info describes the image (as
# qemu-img does); commands that need the data fail at once.
def run_fifo_data_file(qcowkit, work, env):
    fails = 0
    d = os.path.join(work, "fifo")
    sh(["rm", "-rf", d])
    os.makedirs(d)
    img, data = os.path.join(d, "df.qcow2"), os.path.join(d, "df.raw")
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "data_file=" + data, img, "4M"])
    os.unlink(data)
    os.mkfifo(data)
    for cmd, want in ((["info"], 0), (["check"], 1), (["map"], 1), (["io", "-r", "-c", "read 0 4k"], 1),
                      (["convert", "-O", "raw", img, os.path.join(d, "out.raw")], 1)):
        args = [qcowkit] + cmd + ([] if cmd[0] == "convert" else [img])
        try:
            p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
            ok = p.returncode == want and (want == 0 or "pipe" in p.stdout)
            out = p.stdout
        except subprocess.TimeoutExpired:
            ok, out = False, "hung (30 s)"
        print("%s data file is a FIFO: %s" % ("ok  " if ok else "FAIL", cmd[0]))
        if not ok:
            fails += 1
            print("     " + out.strip().replace("\n", "\n     ")[:1000])
    return fails

# A stored bitmap whose table names the active L1 table as a data cluster:
# changing the bitmap (clear, remove) freed "its" clusters, the L1 table
# among them, and the next allocation wrote over the L1 table (qemu-img
# 7.2 does the same). The L1 table must survive: the guest data reads
# back after the bitmap is changed and new clusters are written.
def run_bitmap_names_l1(qcowkit, work, env):
    fails = 0
    path = os.path.join(work, "bm.qcow2")
    for op in (["bitmap", "--clear", path, "b1"], ["bitmap", "--remove", path, "b1"]):
        new_image(path, "4M", ["write -P 0x44 0 1M"])
        sh(["qemu-img", "bitmap", "--add", path, "b1"])
        sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x45 1M 64k", path])  # dirty: b1 gets a data cluster
        with open(path, "r+b") as f:
            img = bytearray(f.read())
            off, dir_off = struct.unpack_from(">I", img, 100)[0], None  # extensions follow the header
            while off + 8 <= len(img):
                typ, ln = struct.unpack_from(">II", img, off)
                if typ == 0:
                    break
                if typ == 0x23852875:
                    dir_off = struct.unpack_from(">Q", img, off + 8 + 16)[0]
                off += 8 + ((ln + 7) & ~7)
            table = struct.unpack_from(">Q", img, dir_off)[0]
            be("Q", img, table, struct.unpack_from(">Q", img, 40)[0])  # entry 0 -> the active L1 table
            f.seek(0)
            f.write(img)
        p = subprocess.run([qcowkit] + op, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        w = subprocess.run([qcowkit, "io", "-c", "write -P 0x99 2M 1M", path], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x44 0 1M", "-c", "read -P 0x45 1M 64k", path])
        ok = ("Sanitizer" not in p.stdout + w.stdout and rd.returncode == 0 and "verification failed" not in rd.stdout
              and "ailed" not in rd.stdout)
        print("%s bitmap table names the L1 table: %s" % ("ok  " if ok else "FAIL", op[1]))
        if not ok:
            fails += 1
            print("     " + (p.stdout + w.stdout + rd.stdout).strip().replace("\n", "\n     ")[:1500])
    return fails

# Extended L2: a compressed cluster whose entry has subcluster bits set.
# check reports it as qemu-img does; check -r all clears the bits and the
# compressed data reads back (qemu-img 7.2 leaves the error and frees the
# data cluster as leaked).
def run_compressed_subcluster_bits(qcowkit, work, env):
    path = os.path.join(work, "xc.qcow2")
    new_image(path, "4M", ["write -c -P 0x66 0 64k"], "extended_l2=on")
    with open(path, "r+b") as f:
        img = bytearray(f.read())
        l2 = l1_entry(img) & 0x00fffffffffffe00
        assert struct.unpack_from(">Q", img, l2)[0] & (1 << 62), "not compressed"
        be("Q", img, l2 + 8, 1)
        f.seek(0)
        f.write(img)
    chk = subprocess.run([qcowkit, "check", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    fix = subprocess.run([qcowkit, "check", "-r", "all", path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x66 0 64k", path])
    qchk = sh(["qemu-img", "check", path])
    ok = (chk.returncode == 2 and "compressed cluster 0 with non-zero subcluster allocation bitmap" in chk.stdout and
          fix.returncode == 0 and qchk.returncode == 0 and rd.returncode == 0 and "ailed" not in rd.stdout)
    print("%s compressed cluster with subcluster bits: check, check -r all" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     " + (chk.stdout + fix.stdout + rd.stdout + qchk.stdout).strip().replace("\n", "\n     ")[:2000])
    return 0 if ok else 1

# A header size that is not a multiple of 512: the disk is its whole
# sectors, as qemu-img sees it (info said 64M+1 and convert wrote 64M+512).
def run_unaligned_size(qcowkit, work, base, env):
    path, out = os.path.join(work, "odd.qcow2"), os.path.join(work, "odd.raw")
    with open(path, "wb") as f:
        f.write(field("Q", 24, 64 * 1024 * 1024 + 1)(bytearray(base)))
    info = subprocess.run([qcowkit, "info", "--output=json", path], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    conv = subprocess.run([qcowkit, "convert", "-O", "raw", path, out], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    qinfo = sh(["qemu-img", "info", "--output=json", path]).stdout
    want = json.loads(qinfo)["virtual-size"]
    ok = (info.returncode == 0 and json.loads(info.stdout)["virtual-size"] == want and conv.returncode == 0 and
          os.path.getsize(out) == want)
    print("%s header size not a multiple of 512: info and convert see %d bytes" % ("ok  " if ok else "FAIL", want))
    if not ok:
        print("     " + (info.stdout + conv.stdout).strip().replace("\n", "\n     ")[:1500])
    return 0 if ok else 1

# Damaged bitmap directories (qemu-img refuses to open each one, except a
# name with a NUL byte, which it shows cut short). check reports each with
# exit 2; a read-write open is refused with the file unchanged (a NUL name
# used to be stored back empty, a directory no reader accepts); read-only
# use still works, since the bitmaps play no part in reading.
def bitmap_image(work):
    path = os.path.join(work, "bmdir.qcow2")
    sh(["rm", "-f", path])
    sh(["qemu-img", "create", "-q", "-f", "qcow2", path, "4M"])
    sh(["qemu-img", "bitmap", "--add", path, "b1"])
    sh(["qemu-img", "bitmap", "--add", path, "b2"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", path])
    return path, bytearray(open(path, "rb").read())

def bitmap_ext(img):
    _, _, exts = header_exts(img)
    pos = struct.unpack_from(">I", img, 100)[0]
    for t, d in exts:
        if t == 0x23852875:
            return pos
        pos += 8 + (len(d) + 7) // 8 * 8
    raise AssertionError("no bitmaps extension")

def bitmap_entry(img, i):
    p = struct.unpack_from(">Q", img, bitmap_ext(img) + 8 + 16)[0]
    for _ in range(i):
        name, extra = struct.unpack_from(">HI", img, p + 18)
        p += (24 + extra + name + 7) // 8 * 8
    return p

def bm_set(where, fmt, val):
    def f(img):
        be(fmt, img, where(img), val)
        return img
    return f

BITMAP_DAMAGE = [
    ("two bitmaps named b1", bm_set(lambda img: bitmap_entry(img, 1) + 24 + 1, "B", ord("1")), "appears more than once", True),
    ("extension length 32", bm_set(lambda img: bitmap_ext(img) + 4, "I", 32), "length 32", True),
    ("extension reserved field", bm_set(lambda img: bitmap_ext(img) + 12, "I", 1), "reserved field", True),
    ("name with a NUL byte", bm_set(lambda img: bitmap_entry(img, 0) + 24, "B", 0), "NUL byte", False),
    ("unknown flag", bm_set(lambda img: bitmap_entry(img, 0) + 12, "I", 0xa), "unknown flags", True),
    ("granularity bits 8", bm_set(lambda img: bitmap_entry(img, 0) + 17, "B", 8), "granularity bits 8", True),
    ("table size 5", bm_set(lambda img: bitmap_entry(img, 0) + 8, "I", 5), "table has 5 entries", True),
    # check once sized its name list by this count: 64 GiB asked for.
    ("4294967295 bitmaps", bm_set(lambda img: bitmap_ext(img) + 8, "I", 0xffffffff), "at most 65535 allowed", True),
]

def run_bitmap_dir_damage(qcowkit, work, env):
    fails = 0
    for name, mut, msg, qemu_refuses_it in BITMAP_DAMAGE:
        path, img = bitmap_image(work)
        img = mut(img)
        with open(path, "wb") as f:
            f.write(img)
        q = sh(["qemu-img", "info", path])
        chk = subprocess.run([qcowkit, "check", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        w = subprocess.run([qcowkit, "io", "-c", "write -P 0x77 0 4k", path], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        changed = open(path, "rb").read() != img
        rd = subprocess.run([qcowkit, "io", "-r", "-c", "read -P 0x5a 0 64k", path], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        inf = subprocess.run([qcowkit, "info", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out = chk.stdout + w.stdout + rd.stdout + inf.stderr
        why = []
        if (q.returncode != 0) != qemu_refuses_it:
            why.append("qemu-img info exit %d (the case is not what it means to be)" % q.returncode)
        if chk.returncode != 2 or msg not in chk.stdout:
            why.append("check: exit %d, no %r" % (chk.returncode, msg))
        if w.returncode != 1 or "opened read-only" not in w.stdout and "open the image read-only" not in w.stdout \
                and "corrupt" not in w.stdout:
            why.append("read-write open: exit %d" % w.returncode)
        if changed:
            why.append("file changed")
        if rd.returncode != 0 or "read 65536/65536" not in rd.stdout:
            why.append("read-only read failed")
        if inf.returncode != 0 or "warning: the persistent bitmaps of" not in inf.stderr:
            why.append("info: exit %d, no warning" % inf.returncode)
        if "Sanitizer" in out or "runtime error" in out:
            why.append("sanitizer report")
        print("%s bitmap directory: %-26s %s" % ("FAIL" if why else "ok  ", name, "; ".join(why)))
        if why:
            fails += 1
            print("     " + out.strip().replace("\n", "\n     ")[:1500])
    return len(BITMAP_DAMAGE), fails

def snapshot_entries(img):
    """The snapshot table's entries as (offset, fixed part + extra + id + name)."""
    nb, pos = struct.unpack_from(">IQ", img, 60)
    out = []
    for _ in range(nb):
        id_len, name_len = struct.unpack_from(">HH", img, pos + 12)
        extra = struct.unpack_from(">I", img, pos + 36)[0]
        out.append((pos, bytes(img[pos:pos + 40 + extra + id_len + name_len])))
        pos += (40 + extra + id_len + name_len + 7) // 8 * 8
    return out

# Entries of a v3 image with less extra data than the disk size needs
# (8 bytes: the VM state size only; none at all): check reports each as
# incomplete, and -r all writes the table anew with all of it (the disk
# size the image's, no instruction count), byte for byte the table
# qemu-img's repair writes; the snapshots still read back, and so does
# the disk in every crash state of the repair. check -r all used to leave
# them (exit 2).
def run_snapshot_incomplete(qcowkit, work, env):
    path = os.path.join(work, "sninc.qcow2")
    snapshot_image(path, "64M", "write -P 0x11 0 1M", "write -P 0x22 0 512k")
    sh(["qemu-img", "snapshot", "-c", "s2", path])
    img = bytearray(open(path, "rb").read())
    ents = snapshot_entries(img)
    table = bytearray()
    for keep, (_, e) in zip((8, 0), ents):
        extra = struct.unpack_from(">I", e, 36)[0]
        new = bytearray(e[:40 + keep]) + e[40 + extra:]
        be("I", new, 36, keep)
        table += new + bytes(-len(new) % 8)
    img[ents[0][0]:ents[0][0] + len(table)] = table
    open(path, "wb").write(img)
    qpath = path + ".q"
    open(qpath, "wb").write(img)
    chk = subprocess.run([qcowkit, "check", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = path + ".wlog"
    fix = subprocess.run([qcowkit, "check", "-r", "all", path], env=dict(env, QCOWKIT_LOG_WRITES=log),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    qfix = sh(["qemu-img", "check", "-r", "all", qpath])

    def reads(p, fmt, cmds):
        r = sh(["qemu-io", "-r", "-f", fmt] + [a for c in cmds for a in ("-c", c)] + [p])
        return r.returncode == 0 and r.stdout.count("read ") == len(cmds) and "fail" not in r.stdout
    # A crash at any point of the repair: no worse an image, the disk intact.
    why = cut_repair_crash_states(bytes(img), log, path, ["read -P 0x22 0 512k", "read -P 0x11 512k 512k"], reads)
    if chk.returncode != 2 or chk.stdout.count("ERROR snapshot table entry") != 2 or "0 is incomplete" not in chk.stdout:
        why.append("check: exit %d" % chk.returncode)
    if fix.returncode != 0 or "Repairing snapshot table entry 1 is incomplete" not in fix.stdout or \
            "2 corruptions" not in fix.stdout:
        why.append("check -r all: exit %d" % fix.returncode)
    if qfix.returncode != 0:
        why.append("qemu-img check -r all: exit %d (the case is not what it means to be)" % qfix.returncode)
    mine = [e for _, e in snapshot_entries(open(path, "rb").read())]
    theirs = [e for _, e in snapshot_entries(open(qpath, "rb").read())]
    if mine != theirs:
        why.append("the repaired table differs from qemu-img's")
    if sh(["qemu-img", "check", path]).returncode != 0:
        why.append("qemu-img check after the repair is not clean")
    raw = path + ".raw"
    sh(["qemu-img", "convert", "-l", "snapshot.name=s1", "-O", "raw", path, raw])
    rd = sh(["qemu-io", "-r", "-f", "raw", "-c", "read -P 0x11 0 1M", raw])
    if rd.returncode != 0 or "read 1048576/1048576" not in rd.stdout:
        why.append("snapshot s1 does not read back")
    out = chk.stdout + fix.stdout
    if "Sanitizer" in out or "runtime error" in out:
        why.append("sanitizer report")
    ok = not why
    print("%s snapshot entries with too little extra data: reported, repaired as qemu-img repairs them" %
          ("ok  " if ok else "FAIL"))
    if not ok:
        print("     " + "; ".join(why) + "\n     " + out.strip().replace("\n", "\n     ")[-1500:])
    return 0 if ok else 1

# A snapshot entry with 2000 bytes of extra data (QEMU's limit is 1024):
# every open of the table refuses it; check -r all keeps the first 1024
# bytes, as qemu-img's does, and the repaired table is byte for byte
# qemu-img's, with the snapshot's data intact (check -r all used to leave
# it, exit 2).
def run_snapshot_extra(qcowkit, work, env):
    path = os.path.join(work, "snx.qcow2")
    new_image(path, "4M", ["write -P 0x11 0 64k"])
    sh(["qemu-img", "snapshot", "-c", "s1", path])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x22 0 64k", path])
    img = bytearray(open(path, "rb").read())
    sn = struct.unpack_from(">Q", img, 64)[0]
    id_len, name_len = struct.unpack_from(">HH", img, sn + 12)
    extra = struct.unpack_from(">I", img, sn + 36)[0]
    names = bytes(img[sn + 40 + extra:sn + 40 + extra + id_len + name_len])
    big = bytes(img[sn + 40:sn + 40 + extra]) + bytes(i % 251 for i in range(2000 - extra))
    entry = bytearray(img[sn:sn + 40]) + big + names
    be("I", entry, 36, 2000)
    entry += bytes(-len(entry) % 8)
    img[sn:sn + len(entry)] = entry  # the table's one cluster holds it
    open(path, "wb").write(img)
    qpath = os.path.join(work, "snx-q.qcow2")
    open(qpath, "wb").write(img)
    info = subprocess.run([qcowkit, "snapshot", "-l", path], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    chk = subprocess.run([qcowkit, "check", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    fix = subprocess.run([qcowkit, "check", "-r", "all", path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    qfix = sh(["qemu-img", "check", "-r", "all", qpath])
    def table(p):
        b = open(p, "rb").read()
        o = struct.unpack_from(">Q", b, 64)[0]
        e = struct.unpack_from(">I", b, o + 36)[0]
        il, nl = struct.unpack_from(">HH", b, o + 12)
        return b[o:o + 40 + e + il + nl]
    qchk = sh(["qemu-img", "check", path])
    sh(["qemu-img", "snapshot", "-a", "s1", path])
    rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x11 0 64k", path])
    why = []
    if info.returncode != 1 or "too much extra data" not in info.stdout:
        why.append("snapshot -l: exit %d" % info.returncode)
    if chk.returncode != 2 or "Too much extra metadata in snapshot table entry 0 (2000 > 1024)" not in chk.stdout:
        why.append("check: exit %d" % chk.returncode)
    if fix.returncode != 0 or "Discarding too much extra metadata in snapshot table entry 0" not in fix.stdout:
        why.append("check -r all: exit %d" % fix.returncode)
    if qfix.returncode != 0 or table(path) != table(qpath):
        why.append("the repaired table differs from qemu-img's")
    if qchk.returncode != 0 or rd.returncode != 0 or "verification failed" in rd.stdout:
        why.append("qemu-img check exit %d, snapshot data %r" % (qchk.returncode, rd.stdout.strip()[:100]))
    out = info.stdout + chk.stdout + fix.stdout
    if "Sanitizer" in out or "runtime error" in out:
        why.append("sanitizer report")
    print("%s snapshot entry with 2000 bytes of extra data: check -r all %s" % ("FAIL" if why else "ok  ", "; ".join(why)))
    if why:
        print("     " + out.strip().replace("\n", "\n     ")[:2000])
    return 1 if why else 0

# A refcount of 0 on a live table (the L1 or an L2 table): the next
# allocation hands that cluster out again. bitmap --add, snapshot -c and
# resize wrote their new directory, L1 copy or grown L1 over the table
# (exit 0, every guest read wrong afterwards). Each must be refused with
# the image marked corrupt and the data intact, as qemu-img refuses
# ("Preventing invalid write on metadata").
def run_new_metadata_over_tables(qcowkit, work, env):
    fails = 0
    path = os.path.join(work, "rc0.qcow2")
    for cluster, what, cmd in ((3, "L1", ["bitmap", "--add", path, "b0"]),
                               (4, "L2", ["snapshot", "-c", "s1", path]),
                               (4, "L2", ["resize", path, "20G"])):
        new_image(path, "16M", ["write -P 0x11 0 128k", "write -P 0x22 1M 64k"])
        with open(path, "r+b") as f:
            img = bytearray(f.read())
            assert struct.unpack_from(">Q", img, 40)[0] == 0x30000, "layout changed"
            rb = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 48)[0])[0]
            be("H", img, rb + 2 * cluster, 0)
            f.seek(0)
            f.write(img)
        p = subprocess.run([qcowkit] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x11 0 128k", "-c", "read -P 0x22 1M 64k", path])
        info = sh(["qemu-img", "info", path]).stdout
        ok = (p.returncode == 1 and rd.returncode == 0 and "verification failed" not in rd.stdout and
              "corrupt: true" in info and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
        print("%s refcount 0 on the %s table: %s refused, data intact" % ("ok  " if ok else "FAIL", what, cmd[0]))
        if not ok:
            fails += 1
            print("     exit %d\n     %s" % (p.returncode, (p.stdout + rd.stdout + info).strip().replace("\n", "\n     ")[:1500]))
    return fails

# The same with a refcount of 0 on a snapshot's L1 table (which qemu-img's
# default overlap check also protects): the new tables went over the
# snapshot's L1, so the snapshot no longer applied. Refused, the
# snapshot's L1 table byte for byte as it was.
def run_new_metadata_over_snapshot_l1(qcowkit, work, env):
    fails = 0
    path = os.path.join(work, "snl1.qcow2")
    for cmd in (["bitmap", "--add", path, "b0"], ["snapshot", "-c", "s2", path], ["resize", path, "20G"]):
        snapshot_image(path, "16M", "write -P 0x11 0 128k", "write -P 0x22 0 64k")
        with open(path, "r+b") as f:
            img = bytearray(f.read())
            sl1 = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 64)[0])[0]
            rb = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 48)[0])[0]
            be("H", img, rb + 2 * (sl1 >> 16), 0)
            f.seek(0)
            f.write(img)
        before = bytes(img[sl1:sl1 + 65536])
        p = subprocess.run([qcowkit] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        after = open(path, "rb").read()[sl1:sl1 + 65536]
        ok = (p.returncode == 1 and after == before and "Sanitizer" not in p.stdout and
              "runtime error" not in p.stdout)
        print("%s refcount 0 on a snapshot's L1 table: %s refused, the table intact" % ("ok  " if ok else "FAIL", cmd[0]))
        if not ok:
            fails += 1
            print("     exit %d, table %s\n     %s" % (p.returncode, "intact" if after == before else "OVERWRITTEN",
                                                       p.stdout.strip()[-500:]))
    return fails

# Refcount damage met by a command is named (the cluster or the table),
# never a bare "Structure needs cleaning", and qemu-img check counts no
# more errors afterwards. A shrink dropping a cluster whose refcount is
# already 0 goes on (the reference goes, which is what the count said);
# a grow with metadata preallocation whose refcount block lies past the
# end of the file is refused at the open (qemu-img reads that block as
# zeros and goes on).
def run_refcount_damage_named(qcowkit, work, env):
    fails = 0
    path = os.path.join(work, "rcmsg.qcow2")
    for what, cmd, frag, rc in (("a refcount of 0 under a shrink", ["resize", "--shrink", path, "32M"],
                                 "Cannot free cluster %#x: its refcount is already 0", 0),
                                ("a refcount block past the end of the file", ["resize", "--preallocation=metadata",
                                                                              path, "+2M"],
                                 "refcount table entry 0 is invalid (0x10000000000): the refcount block lies "
                                 "past the end of the file", 1)):
        new_image(path, "64M", ["write -P 0x11 0 256k", "write -P 0x22 48M 64k"])
        with open(path, "r+b") as f:
            img = bytearray(f.read())
            rt = struct.unpack_from(">Q", img, 48)[0]
            rb = struct.unpack_from(">Q", img, rt)[0]
            if "shrink" in what:
                l2 = struct.unpack_from(">Q", img, struct.unpack_from(">Q", img, 40)[0])[0] & 0x00fffffffffffe00
                host = struct.unpack_from(">Q", img, l2 + 8 * (48 << 4))[0] & 0x00fffffffffffe00
                be("H", img, rb + 2 * (host >> 16), 0)
                frag = frag % host
            else:
                be("Q", img, rt, 1 << 40)
            f.seek(0)
            f.write(img)
        count = lambda: [l for l in sh(["qemu-img", "check", path]).stdout.splitlines() if "errors were" in l]
        before = count()
        p = subprocess.run([qcowkit] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        after = count()
        fewer = len(before) == len(after) == 1 and int(after[0].split()[0].replace("No", "0")) <= int(before[0].split()[0])
        ok = (p.returncode == rc and frag in p.stdout and fewer and
              "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
        print("%s %s: named, exit %d" % ("ok  " if ok else "FAIL", what, rc))
        if not ok:
            fails += 1
            print("     exit %d, errors %s -> %s\n     %s" % (p.returncode, before, after, p.stdout.strip()[-500:]))
    return fails

# A shrink of an image with an external data file whose refcount table
# names itself as its first refcount block, so every refcount read is
# garbage (the live L2 table's among them: 0). Nothing on the way was
# freed, so nothing was noted, and the trim after the shrink believed
# the refcounts: it cut the file below the live L2 table, and the disk
# read as zeros. The trim now stays above every live table, and does
# nothing when one of them counts 0.
def run_shrink_trim_garbage_refcounts(qcowkit, work, env):
    d = os.path.join(work, "trimdf")
    sh(["rm", "-rf", d])
    os.makedirs(d)
    path = os.path.join(d, "img.qcow2")
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "data_file=%s,cluster_size=4096" % os.path.join(d, "img.data"),
        path, "2M"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x81 0 64k", "-c", "write -P 0x82 1M 8k", path])
    patch(path, refcount_table_names_itself)
    sh(["qemu-img", "convert", "-O", "raw", path, path + ".before"])
    size = os.path.getsize(path)
    p = subprocess.run([qcowkit, "resize", "--shrink", path, "1M"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    sh(["qemu-img", "convert", "-O", "raw", path, path + ".after"])
    kept = open(path + ".before", "rb").read()[:1 << 20] == open(path + ".after", "rb").read()
    ok = (p.returncode == 0 and kept and os.path.getsize(path) == size and "Sanitizer" not in p.stdout and
          "runtime error" not in p.stdout)
    print("%s shrink with a data file and garbage refcounts: the tables stay, the disk reads as before" %
          ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d, disk %s, file %d -> %d bytes\n     %s" % (p.returncode, "kept" if kept else "LOST", size,
                                                                     os.path.getsize(path), p.stdout.strip()[-500:]))
    sh(["rm", "-rf", d])
    return 0 if ok else 1

# An overlay's L2 entry naming its own refcount table (cluster 1). commit
# emptied the overlay by counting that "data cluster" down, so the
# refcount table ended with refcount 0 and the next metadata allocation
# wrote over it. Now the bogus reference goes without a refcount change
# (the overlay checks clean, as after qemu-img commit), and a discard of
# that entry is refused with the image marked corrupt.
def run_entry_names_refcount_table(qcowkit, work, env):
    fails = 0
    base, top = os.path.join(work, "nb-base.qcow2"), os.path.join(work, "nb-top.qcow2")
    for op in ("commit", "discard"):
        sh(["rm", "-f", base, top])
        sh(["qemu-img", "create", "-q", "-f", "qcow2", base, "16M"])
        sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top])
        sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x44 0 64k", top])
        with open(top, "r+b") as f:
            img = bytearray(f.read())
            l2 = l1_entry(img) & 0x00fffffffffffe00
            be("Q", img, l2 + 8 * 5, (1 << 63) | struct.unpack_from(">Q", img, 48)[0])
            f.seek(0)
            f.write(img)
        if op == "commit":
            p = subprocess.run([qcowkit, "commit", top], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            chk = sh(["qemu-img", "check", top])
            rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x44 0 64k", base])
            ok = (p.returncode == 0 and chk.returncode == 0 and rd.returncode == 0 and
                  "verification failed" not in rd.stdout)
        else:
            p = subprocess.run([qcowkit, "io", "-c", "discard 320k 64k", top], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            chk = sh(["qemu-img", "check", top])
            ok = ("failed" in p.stdout and "ERROR cluster 1 refcount=1 reference=2" in chk.stdout and
                  "refcount=0" not in chk.stdout and "corrupt: true" in sh(["qemu-img", "info", top]).stdout)
        ok = ok and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout
        print("%s L2 entry naming the refcount table: %s" % ("ok  " if ok else "FAIL", op))
        if not ok:
            fails += 1
            print("     exit %d\n     %s" % (p.returncode, (p.stdout + chk.stdout).strip().replace("\n", "\n     ")[:1500]))
    return fails

# A shrink of an image whose refcount table names itself as its first
# block (so live clusters read refcount 0): freeing the cut-off clusters
# notes the corruption, and then the file must not be cut where those
# refcounts say it may (that cut took the L1 table and the data with it).
# Both widths, by resize --shrink and by amend -o size=; the data below
# the new size reads back.
def run_shrink_bad_refcounts(qcowkit, work, env):
    fails = 0
    img = os.path.join(work, "shrink-rc.qcow2")
    for rb in (16, 32):
        for op in (["resize", "--shrink", img, "2M"], ["amend", "-o", "size=2M", img]):
            new_image(img, "4M", ["write -P 0x71 0 1M", "write -P 0x72 3M 64k"], "cluster_size=16k,refcount_bits=%d" % rb)
            patch(img, refcount_table_names_itself)
            size = os.path.getsize(img)
            p = subprocess.run([qcowkit] + op, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            rd = sh(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x71 0 1M", img])
            ok = (os.path.getsize(img) == size and rd.returncode == 0 and "verification failed" not in rd.stdout and
                  "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
            print("%s shrink with refcounts that name the refcount table (%d-bit, %s)" % ("ok  " if ok else "FAIL", rb, op[0]))
            if not ok:
                fails += 1
                print("     exit %d, file %d -> %d bytes\n     %s" % (p.returncode, size, os.path.getsize(img),
                                                                 (p.stdout + rd.stdout).strip()[:1500]))
    return fails

# An overlay whose first L1 entry names the L1 table itself: emptying it
# after a commit dropped that "L2 table" and freed the live L1 table's
# cluster, so the next write tripped the overlap check. The table is now
# left alone (it leaks, check exits 3) and a later write works.
def run_commit_l1_as_l2(qcowkit, work, env):
    base, top = os.path.join(work, "l1l2-base.qcow2"), os.path.join(work, "l1l2-top.qcow2")
    sh(["rm", "-f", base, top])
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=16k", base, "4M"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x71 0 2M", base])
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=16k", "-b", base, "-F", "qcow2", top])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x73 600k 64k", top])
    patch(top, l1_names_itself)
    p = subprocess.run([qcowkit, "commit", top], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    chk = sh(["qemu-img", "check", top])
    w = sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x74 1M 32k", "-c", "read -P 0x74 1M 32k", top])
    chk2 = sh(["qemu-img", "check", top])
    ok = (chk.returncode in (0, 3) and w.returncode == 0 and "verification failed" not in w.stdout and
          chk2.returncode in (0, 3) and "corrupt: false" in sh(["qemu-img", "info", top]).stdout and
          "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s commit of an overlay whose L1 names itself" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d\n     %s" % (p.returncode, (p.stdout + chk.stdout + w.stdout + chk2.stdout).strip()[:1500]))
    return 0 if ok else 1

# snapshot -d where the file ends inside the last L2 table (1 byte into
# it): the walk over the snapshot's tables stops there, after shared
# refcounts were lowered. OFLAG_COPIED must still follow them: the image
# had only leaks before and must have only leaks after (it had 34
# OFLAG_COPIED errors), as with qemu-img; the disk reads the same.
def run_snapshot_delete_cut_table(qcowkit, work, env):
    img = os.path.join(work, "sncut.qcow2")
    small_snapshot_image(img)
    os.truncate(img, 54273)
    before = sh(["qemu-img", "check", img]).returncode
    sh(["qemu-img", "convert", "-O", "raw", img, img + ".before.raw"])
    p = subprocess.run([qcowkit, "snapshot", "-d", "s0", img], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    chk = sh(["qemu-img", "check", img])
    # The guest's view as qemu-img reads it (the cut table's missing part
    # as zeros) is the same before and after.
    rd = sh(["qemu-img", "compare", "-f", "raw", "-F", "qcow2", img + ".before.raw", img])
    ok = (before == 3 and chk.returncode == 3 and rd.returncode == 0 and
          "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s snapshot -d with the last L2 table cut short" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d, check before %d\n     %s" % (p.returncode, before,
                                                          (p.stdout + chk.stdout + rd.stdout).strip()[:1500]))
    return 0 if ok else 1

# Every crash state of that repair (its write log replayed as tests/crash
# does) is no worse for qemu-img check than the cut image (0 < 3 < 2) and
# reads the active disk as before.
def cut_repair_crash_states(init, log, path, disk, reads):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crash"))
    import replay, wlog  # noqa: E402
    rank = {0: 0, 3: 1, 2: 2}
    st_path = path + ".state"
    open(st_path, "wb").write(init)
    base = rank.get(sh(["qemu-img", "check", st_path]).returncode, 9)
    recs = wlog.records_for(wlog.read_log(log), os.path.abspath(path))
    n = 0
    for st, data in replay.states(init, recs, 1, 6):
        n += 1
        open(st_path, "wb").write(data)
        rc = sh(["qemu-img", "check", st_path]).returncode
        if rank.get(rc, 9) > base:
            return ["crash state at record %d (durable %d): qemu-img check exit %d" % (st.point, st.durable, rc)]
        if not reads(st_path, "qcow2", disk):
            return ["crash state at record %d (durable %d): the disk does not read back" % (st.point, st.durable)]
    return [] if n >= 3 else ["only %d crash states of the repair" % n]

# A file cut short inside its snapshot table (written last, when the
# snapshots were taken): in the third of three entries, at the table's
# start, and in the last entry's name. Every open used to refuse the
# first two, so check could not even report them; a writer was let grow
# the file over the lost part, and check called the third clean.
# Now a read-only open reads the active disk (convert copies it out), info
# names the table, check reports it (exit 2), -r leaks frees nothing (what
# the lost entries referenced is unknown), and -r all keeps the whole
# entries: qemu-img then finds the image clean, lists s1 and s2 (none for
# the cut at the start) and reads the disk and the kept snapshots as they
# were; for the cut name the file grows over it and s3 is kept as "s".
# The cut in the third entry's fixed part spares its L1 table's offset
# and size: s3 is kept too, without a name or an id (qemu-img keeps it too).
# A cut in the second entry's extra data is a cut too (no room is left
# for the third entry's fixed part): s1 is kept, and s2 without a name.
# Each write is refused, and a crash at any point of the repair leaves no
# worse an image.
def run_snapshot_table_cut_short(qcowkit, work, env):
    fails = []
    orig = os.path.join(work, "sntab.qcow2")
    new_image(orig, "64M", ["write -P 0x11 0 1M"])
    for snap, pat, length in (("s1", 0x22, "512k"), ("s2", 0x33, "256k")):
        sh(["qemu-img", "snapshot", "-c", snap, orig])
        sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x%x 0 %s" % (pat, length), orig])
    sh(["qemu-img", "snapshot", "-c", "s3", orig])
    img = open(orig, "rb").read()
    table = struct.unpack_from(">Q", img, 64)[0]
    starts = [p for p, _ in snapshot_entries(img)]  # s1, s2, s3
    disk = [("read -P 0x33 0 256k"), ("read -P 0x22 256k 256k"), ("read -P 0x11 512k 512k")]
    snaps = {"s1": ["read -P 0x11 0 1M"], "s2": ["read -P 0x22 0 512k", "read -P 0x11 512k 512k"],
             "s": disk}  # s3, its name cut to one letter

    said = []  # everything qcowkit printed, for sanitizer reports

    def run(*cmd, extra_env=None):
        p = subprocess.run([qcowkit] + list(cmd), env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        said.append(p.stdout)
        return p

    def reads(path, fmt, cmds):
        r = sh(["qemu-io", "-r", "-f", fmt] + [a for c in cmds for a in ("-c", c)] + [path])
        return r.returncode == 0 and r.stdout.count("read ") == len(cmds) and "fail" not in r.stdout

    # (what, where, the snapshots kept by name, what each holds, info's
    # message). A nameless snapshot ("") is one whose L1 table's place
    # survives the cut.
    cases = (("in its third entry", starts[2] + 20, ["s1", "s2", ""], ["s1", "s2", "s"], "snapshot table is truncated"),
             ("at its start", table, [], [], "lies past the end of the file"),
             ("in its last name", len(img) - 1, ["s1", "s2", "s"], ["s1", "s2", "s"],
              "snapshot table is truncated or too large"),
             # 10 bytes into s2's extra data: no room for s3's fixed part
             # after it, whatever s2's lengths, so a cut (not a damaged
             # length): s3 is dropped, s2 kept without a name.
             ("in the second entry's extra data", starts[1] + 50, ["s1", ""], ["s1", "s2"],
              "snapshot table is truncated or too large"))
    for what, cut, kept, holds, info_msg in cases:
        path = os.path.join(work, "sntab-cut.qcow2")
        open(path, "wb").write(img[:cut])
        out = []
        # info shows the image (as qemu-img does) and says why its
        # snapshots are not listed.
        i = run("info", path)
        if i.returncode != 0 or info_msg not in i.stdout or "snapshots of" not in i.stdout or \
                "virtual size: 64 MiB" not in i.stdout:
            out.append("info: exit %d: %s" % (i.returncode, i.stdout.strip()[-300:]))
        raw = path + ".raw"
        c = run("convert", "-O", "raw", path, raw)
        if c.returncode != 0 or not reads(raw, "raw", disk):
            out.append("convert: exit %d: %s" % (c.returncode, c.stdout.strip()[-300:]))
        k = run("check", path)
        if k.returncode != 2 or "ERROR snapshot table is truncated" not in k.stdout:
            out.append("check: exit %d: %s" % (k.returncode, k.stdout.strip()[-300:]))
        before = open(path, "rb").read()
        # A writer would grow the file over the lost part: refused.
        w = run("io", "-c", "write -P 0x66 8M 64k", path)
        if w.returncode != 1 or "the end of the file" not in w.stdout or open(path, "rb").read() != before:
            out.append("a write: exit %d: %s" % (w.returncode, w.stdout.strip()[-300:]))
        k = run("check", "-r", "leaks", path)
        if k.returncode != 2 or (kept != ["s1", "s2", "s"] and "not freeing the" not in k.stdout) or \
                open(path, "rb").read() != before:
            out.append("check -r leaks: exit %d: %s" % (k.returncode, k.stdout.strip()[-300:]))
        log = path + ".wlog"
        if os.path.exists(log):
            os.unlink(log)
        k = run("check", "-r", "all", path, extra_env={"QCOWKIT_LOG_WRITES": log})
        if k.returncode != 0 or "Repairing the snapshot table" not in k.stdout:
            out.append("check -r all: exit %d: %s" % (k.returncode, k.stdout.strip()[-600:]))
        out += cut_repair_crash_states(before, log, path, disk, reads)
        q = sh(["qemu-img", "check", path])
        if q.returncode != 0:
            out.append("qemu-img check after the repair: exit %d: %s" % (q.returncode, q.stdout.strip()[-300:]))
        names = [sn["name"] for sn in json.loads(sh(["qemu-img", "info", "--output=json", path]).stdout or "{}")
                 .get("snapshots", [])]
        if names != kept:
            out.append("snapshots after the repair: %r, not %r" % (names, kept))
        if not reads(path, "qcow2", disk):
            out.append("the disk after the repair does not read back")
        for snap, key in zip(kept, holds):
            sraw = path + "." + key + ".raw"
            # The nameless one has no id either: qemu-img finds it by its empty id.
            sh(["qemu-img", "convert", "-l", ("snapshot.name=" + snap) if snap else "snapshot.id=", "-O", "raw",
                path, sraw])
            if not reads(sraw, "raw", snaps[key]):
                out.append("snapshot %s after the repair does not read back" % snap)
        text = "".join(said)
        del said[:]
        if "Sanitizer" in text or "runtime error" in text:
            out.append("a sanitizer report:\n" + text[-1500:])
        ok = not out
        print("%s snapshot table cut short by the end of the file %s: check, -r all" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails.append(what)
            print("     " + "\n     ".join(out))
    return len(fails)

# The same cut where the bitmap directory survives it: with 512-byte
# clusters the ninth snapshot's table (two clusters) no longer fits where
# the eighth one was freed and goes to the end of the file, while the
# bitmap directory and table written after it go into freed clusters
# before it. The end of the file inside the fourth entry's extra data:
# -r all keeps three snapshots, the fourth without a name (its data read
# back), and the bitmap; qemu-img then finds the image clean, lists the
# bitmap and can use it.
def run_snapshot_table_cut_bitmap_kept(qcowkit, work, env):
    path = os.path.join(work, "sntab-bm.qcow2")
    sh(["rm", "-f", path])
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, "1M"])
    out = []
    said = []

    def run(*cmd):
        p = subprocess.run([qcowkit] + list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        said.append(p.stdout)
        return p
    run("bitmap", "--add", path, "b1")
    for i in range(1, 10):
        run("io", "-c", "write -P 0x%d%d %dk 4k" % (i, i, 4 * i), path)
        run("snapshot", "-c", "snap-number-%d" % i, path)
    img = open(path, "rb").read()
    table = struct.unpack_from(">Q", img, 64)[0]
    start, _, exts = header_exts(img)
    bm_dir = [struct.unpack_from(">Q", d, 16)[0] for t, d in exts if t == 0x23852875]
    if not bm_dir or bm_dir[0] > table or table + 9 * 72 > len(img):
        print("FAIL snapshot table cut short with the bitmap directory before it: the layout is not what the "
              "case needs (table %#x, bitmap directory %r, file %d bytes)" % (table, bm_dir, len(img)))
        return 1
    open(path, "wb").write(img[:snapshot_entries(img)[3][0] + 44])  # 4 bytes into the fourth's extra data
    k = run("check", path)
    if k.returncode != 2 or "snapshot table is truncated" not in k.stdout:
        out.append("check: exit %d: %s" % (k.returncode, k.stdout.strip()[-300:]))
    k = run("check", "-r", "all", path)
    if k.returncode != 0 or "keeping 4 of 9 entries, the last without a name" not in k.stdout:
        out.append("check -r all: exit %d: %s" % (k.returncode, k.stdout.strip()[-600:]))
    q = sh(["qemu-img", "check", path])
    if q.returncode != 0:
        out.append("qemu-img check after the repair: exit %d: %s" % (q.returncode, q.stdout.strip()[-300:]))
    names = [sn["name"] for sn in json.loads(sh(["qemu-img", "info", "--output=json", path]).stdout or "{}")
             .get("snapshots", [])]
    if names != ["snap-number-1", "snap-number-2", "snap-number-3", ""]:
        out.append("snapshots after the repair: %r" % names)
    # The fourth, kept without a name, holds the first four writes.
    raw = path + ".4.raw"
    sh(["qemu-img", "convert", "-l", "snapshot.id=", "-O", "raw", path, raw])
    rd = sh(["qemu-io", "-r", "-f", "raw"] + [a for i in range(1, 6) for a in
                                             ("-c", "read -P 0x%d%d %dk 4k" % (i, i, 4 * i) if i < 5 else
                                              "read -P 0 20k 4k")] + [raw])
    if rd.returncode != 0 or rd.stdout.count("read 4096/4096") != 5:
        out.append("the nameless snapshot does not read back: %s" % rd.stdout[-300:])
    info = sh(["qemu-img", "info", "--output=json", path]).stdout
    if '"name": "b1"' not in info:
        out.append("the bitmap is gone: %s" % info[-500:])
    rd = sh(["qemu-io", "-r", "-f", "qcow2"] + [a for i in range(1, 10) for a in
                                                ("-c", "read -P 0x%d%d %dk 4k" % (i, i, 4 * i))] + [path])
    if rd.returncode != 0 or rd.stdout.count("read 4096/4096") != 9:
        out.append("the disk after the repair does not read back: %s" % rd.stdout[-300:])
    d = sh(["qemu-img", "bitmap", "--disable", path, "b1"])
    if d.returncode != 0 or sh(["qemu-img", "check", path]).returncode != 0:
        out.append("qemu-img bitmap --disable: exit %d: %s" % (d.returncode, d.stdout[-300:]))
    text = "".join(said)
    if "Sanitizer" in text or "runtime error" in text:
        out.append("a sanitizer report:\n" + text[-1500:])
    ok = not out
    print("%s snapshot table cut short with the bitmap directory before it: 4 of 9 kept, the bitmap too" %
          ("ok  " if ok else "FAIL"))
    if not ok:
        print("     " + "\n     ".join(out))
    return 0 if ok else 1

# snapshot -d where the file ends inside an active L2 table: the flags of
# that table could not follow the lowered refcounts (it ended with 24
# OFLAG_COPIED errors more than it had). Now refused before any change,
# the table named.
def run_snapshot_delete_active_table_cut(qcowkit, work, env):
    img = os.path.join(work, "sncut2.qcow2")
    small_snapshot_image(img)
    os.truncate(img, 54528)
    before = open(img, "rb").read()
    p = subprocess.run([qcowkit, "snapshot", "-d", "s0", img], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    ok = (p.returncode == 1 and open(img, "rb").read() == before and "extends past the end of the file" in p.stdout
          and "Sanitizer" not in p.stdout and "runtime error" not in p.stdout)
    print("%s snapshot -d with an active L2 table cut short: refused, the image unchanged" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     exit %d, image %s\n     %s" % (p.returncode, "unchanged" if open(img, "rb").read() == before
                                                    else "CHANGED", p.stdout.strip()[-800:]))
    return 0 if ok else 1

# snapshot -d sets OFLAG_COPIED in any active table the deleted snapshot
# shared. With the active L1 entry naming the L1 table itself as its L2
# table, that write was refused by the overlap check only after the
# snapshot had gone and its refcounts had dropped (5 errors to 9, qemu-img
# the same). Refused before any change now: only the corrupt bit is set.
def run_snapshot_delete_tree_on_metadata(qcowkit, work, env):
    path = os.path.join(work, "sndm.qcow2")
    new_image(path, "1M", ["write -P 0x11 0 40k", "write -P 0x33 600k 8k"], "cluster_size=512")
    sh(["qemu-img", "snapshot", "-c", "s1", path])
    img = bytearray(open(path, "rb").read())
    l1 = struct.unpack_from(">Q", img, 40)[0]
    be("Q", img, l1, l1)  # shared (no COPIED), as the snapshot left it
    return refused_unchanged(qcowkit, env, path, img, ["snapshot", "-d", "s1"], "overlaps with",
                             "snapshot -d with the active L1 naming itself as an L2 table")

# A backing chain at the depth limit (128 images, data in the bottom one
# and one in the middle) reads and maps through the ASan build: each
# layer's open used to keep a 3 KiB error on the coroutine's stack, which
# overflowed at about 58 layers. One layer more is refused.
def run_deep_chain(qcowkit, work, env):
    d = os.path.join(work, "deep")
    sh(["rm", "-rf", d])
    os.makedirs(d)
    sh(["qemu-img", "create", "-q", "-f", "qcow2", os.path.join(d, "c000.qcow2"), "4M"])
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", os.path.join(d, "c000.qcow2")])
    # One overlay made by qemu-img, copied with its backing file's name
    # changed (all names are as long): 128 qemu-img runs took 15 s.
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "c000.qcow2", "-F", "qcow2", os.path.join(d, "c001.qcow2")])
    tmpl = bytearray(open(os.path.join(d, "c001.qcow2"), "rb").read())
    name_off, name_len = struct.unpack_from(">QI", tmpl, 8)
    assert bytes(tmpl[name_off:name_off + name_len]) == b"c000.qcow2"
    for i in range(2, 129):
        tmpl[name_off:name_off + name_len] = b"c%03d.qcow2" % (i - 1)
        open(os.path.join(d, "c%03d.qcow2" % i), "wb").write(tmpl)
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x6b 1M 64k", os.path.join(d, "c060.qcow2")])
    top = os.path.join(d, "c127.qcow2")
    rd = subprocess.run([qcowkit, "io", "-r", "-c", "read -P 0x5a 0 64k", "-c", "read -P 0x6b 1M 64k", top], env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mp = subprocess.run([qcowkit, "map", top], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    over = subprocess.run([qcowkit, "map", os.path.join(d, "c128.qcow2")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    out = rd.stdout + mp.stdout + over.stdout
    ok = (rd.returncode == 0 and rd.stdout.count("read 65536/65536") == 2 and mp.returncode == 0 and
          "c000.qcow2" in mp.stdout and "c060.qcow2" in mp.stdout and over.returncode == 1 and
          "too deep" in over.stdout and "Sanitizer" not in out and "runtime error" not in out)
    print("%s backing chain of 128 images: read and map; 129 refused" % ("ok  " if ok else "FAIL"))
    if not ok:
        print("     " + out.strip().replace("\n", "\n     ")[-2000:])
    sh(["rm", "-rf", d])
    return 0 if ok else 1

# A refcount table entry past the end of the file: a read-write open is
# refused before anything is written. `bitmap --add` used to mark every
# stored bitmap in use and `resize` to write the new size into the header
# before the first allocation failed on the missing block (qemu-img goes
# on: it grows the file to 2 TiB and loses the bitmaps). Reading still
# works, and check -r all repairs it, after which resize works.
def run_refcount_block_past_eof(qcowkit, work, env):
    path = os.path.join(work, "rbeof.qcow2")
    new_image(path, "64M", ["write -P 0x11 0 256k"])
    sh(["qemu-img", "bitmap", "--add", path, "b1"])
    img = bytearray(open(path, "rb").read())
    rt = struct.unpack_from(">Q", img, 48)[0]
    be("Q", img, rt, struct.unpack_from(">Q", img, rt)[0] | (1 << 41))
    fails = []
    for cmd in (["bitmap", "--add", path, "nb"], ["resize", path, "+1M"], ["io", "-c", "write 0 4k", path]):
        open(path, "wb").write(img)
        k = subprocess.run([qcowkit] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if (k.returncode != 1 or open(path, "rb").read() != bytes(img) or
                "refcount table entry 0 is invalid" not in k.stdout or "Sanitizer" in k.stdout):
            fails.append("%s: exit %d, %s, %s" % (cmd[0], k.returncode, "unchanged" if open(path, "rb").read()
                                                   == bytes(img) else "changed", k.stdout.strip()[-300:]))
    rd = subprocess.run([qcowkit, "io", "-r", "-c", "read -P 0x11 0 256k", path], env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if rd.returncode != 0 or "verification failed" in rd.stdout:
        fails.append("read-only read: " + rd.stdout.strip()[-300:])
    fix = subprocess.run([qcowkit, "check", "-r", "all", path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    rs = subprocess.run([qcowkit, "resize", path, "+1M"], env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    if fix.returncode != 0 or rs.returncode != 0 or sh(["qemu-img", "check", path]).returncode != 0:
        fails.append("check -r all exit %d, then resize exit %d: %s" % (fix.returncode, rs.returncode,
                                                                       rs.stdout.strip()[-300:]))
    print("%s refcount table entry past the end: read-write opens refused unchanged, check -r repairs" %
          ("FAIL" if fails else "ok  "))
    for f in fails:
        print("     " + f)
    return 1 if fails else 0

# QCOW version 1 (the magic with version 1) is QCOW's first format. It used
# to be probed as raw: info said raw, convert copied the file's bytes and
# resize grew it (qemu-img opens it with its qcow driver). Now every
# command refuses it by name, the file unchanged; -f raw still opens it.
def run_qcow_version1(qcowkit, work, env):
    path = os.path.join(work, "v1.qcow2")
    new_image(path, "4M", ["write -P 0x11 0 64k"])
    img = bytearray(open(path, "rb").read())
    be("I", img, 4, 1)
    open(path, "wb").write(img)
    fails = []
    for cmd in (["info", path], ["map", path], ["check", path], ["resize", path, "+1M"],
                ["convert", "-O", "raw", path, os.path.join(work, "v1.raw")], ["io", "-c", "write 0 4k", path]):
        k = subprocess.run([qcowkit] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if k.returncode != 1 or "QCOW version 1 images are not supported" not in k.stdout:
            fails.append("%s: exit %d: %s" % (cmd[0], k.returncode, k.stdout.strip()[-300:]))
    if open(path, "rb").read() != bytes(img):
        fails.append("the file changed")
    raw = subprocess.run([qcowkit, "info", "-f", "raw", path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    if raw.returncode != 0 or "file format: raw" not in raw.stdout:
        fails.append("-f raw: exit %d: %s" % (raw.returncode, raw.stdout.strip()[-300:]))
    print("%s QCOW version 1 refused by every command, not probed as raw" % ("FAIL" if fails else "ok  "))
    for f in fails:
        print("     " + f)
    return 1 if fails else 0

def main():
    qcowkit, work = sys.argv[1], sys.argv[2]
    base = make_base(work)
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "exitcode=99:detect_leaks=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:exitcode=98:print_stacktrace=1"
    fails = 0
    for name, mut, cmds, frag in CASES:
        img = mut(bytearray(base))
        path = os.path.join(work, "hostile.qcow2")
        with open(path, "wb") as f:
            f.write(img)
        before = hashlib.sha256(open(path, "rb").read()).hexdigest()
        for cmd in cmds:
            full = "%s %s -f qcow2 %s" % (qcowkit, cmd.split(" ", 1)[0], cmd.split(" ", 1)[1] + " " if " " in cmd else "") + path
            p = subprocess.run(full, shell=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out = p.stdout
            ok = True
            why = []
            # qemu-io convention: a failing command inside `io` still exits 0
            # there; we treat any exit status except a crash (>= 98, signals) as
            # acceptable only when the message says what is wrong.
            if p.returncode not in (0, 1):
                ok = False; why.append("exit %d" % p.returncode)
            if "Sanitizer" in out or "runtime error" in out:
                ok = False; why.append("sanitizer report")
            low = out.lower()
            if not any(w in low for w in ("corrupt", "invalid", "error", "unsupported", "not supported", "failed", "could not", "can't open", "too ")):
                ok = False; why.append("no clear error message")
            if frag and frag.lower() not in low:
                ok = False; why.append("message lacks %r" % frag)
            after = hashlib.sha256(open(path, "rb").read()).hexdigest()
            qcmd = cmd.split("'")[1] if "'" in cmd else ""
            if after != before and "rw" not in name and not (
                    cmd.startswith("io -c 'read") and only_marked_as_qemu_marks(img, path, qcmd)):
                ok = False; why.append("file changed")
            print("%s %-28s %-22s %s" % ("ok  " if ok else "FAIL", name, cmd.split(" ")[0], out.strip().splitlines()[-1][:110] if out.strip() else ""))
            if not ok:
                fails += 1
                print("     -> " + ", ".join(why))
                print("     " + out.strip().replace("\n", "\n     ")[:2000])
        chk = subprocess.run([qcowkit.split()[0], "check", "-f", "qcow2", path], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if chk.returncode >= 4 or "Sanitizer" in chk.stdout or "runtime error" in chk.stdout:
            fails += 1
            print("FAIL %-28s check crashed or odd exit %d\n%s" % (name, chk.returncode, chk.stdout[-1500:]))
    for name, mut in CHECK_ONLY:
        path = os.path.join(work, "hostile.qcow2")
        with open(path, "wb") as f:
            f.write(mut(bytearray(base)))
        before = hashlib.sha256(open(path, "rb").read()).hexdigest()
        rd = subprocess.run([qcowkit, "io", "-f", "qcow2", "-c", "read 0 64k", path], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        chk = subprocess.run([qcowkit, "check", "-f", "qcow2", path], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        after = hashlib.sha256(open(path, "rb").read()).hexdigest()
        unchanged = before == after or only_marked_as_qemu_marks(mut(bytearray(base)), path, "read 0 64k")
        ok = (rd.returncode in (0, 1) and chk.returncode == 2 and unchanged and
              "Sanitizer" not in rd.stdout + chk.stdout and "runtime error" not in rd.stdout + chk.stdout)
        print("%s %-28s check exit %d" % ("ok  " if ok else "FAIL", name, chk.returncode))
        if not ok:
            fails += 1
            print("     " + (rd.stdout + chk.stdout).strip().replace("\n", "\n     ")[:2000])
    fails += run_unaligned_free(qcowkit, work, env)
    fails += run_bad_snapshot_apply(qcowkit, work, env)
    fails += run_snapshot_l1_past_eof(qcowkit, work, env)
    fails += run_write_over_far_snapshot_l1(qcowkit, work, env)
    fails += run_l1_entry_over_other_metadata(qcowkit, work, env)
    fails += run_write_over_unreadable_snapshot_table(qcowkit, work, env)
    fails += run_grow_l1_named_by_itself(qcowkit, work, env)
    fails += run_snapshot_create_entry_past_end(qcowkit, work, env)
    fails += run_refcount_above_limit(qcowkit, work, env)
    fails += run_snapshot_create_bad_tree(qcowkit, work, env)
    fails += run_snapshot_create_tree_on_metadata(qcowkit, work, env)
    fails += run_fifo_data_file(qcowkit, work, env)
    fails += run_bitmap_names_l1(qcowkit, work, env)
    fails += run_compressed_subcluster_bits(qcowkit, work, env)
    fails += run_unaligned_size(qcowkit, work, base, env)
    fails += run_snapshot_extra(qcowkit, work, env)
    fails += run_snapshot_incomplete(qcowkit, work, env)
    fails += run_new_metadata_over_tables(qcowkit, work, env)
    fails += run_new_metadata_over_snapshot_l1(qcowkit, work, env)
    fails += run_refcount_damage_named(qcowkit, work, env)
    fails += run_shrink_trim_garbage_refcounts(qcowkit, work, env)
    fails += run_entry_names_refcount_table(qcowkit, work, env)
    fails += run_deep_chain(qcowkit, work, env)
    fails += run_shrink_bad_refcounts(qcowkit, work, env)
    fails += run_commit_l1_as_l2(qcowkit, work, env)
    fails += run_snapshot_delete_cut_table(qcowkit, work, env)
    fails += run_snapshot_delete_active_table_cut(qcowkit, work, env)
    fails += run_snapshot_delete_tree_on_metadata(qcowkit, work, env)
    fails += run_refcount_block_past_eof(qcowkit, work, env)
    fails += run_qcow_version1(qcowkit, work, env)
    fails += run_snapshot_table_cut_short(qcowkit, work, env)
    fails += run_snapshot_table_cut_bitmap_kept(qcowkit, work, env)
    ncomp, cfails = run_compressed(qcowkit, work, env)
    fails += cfails
    nbm, bfails = run_bitmap_dir_damage(qcowkit, work, env)
    fails += bfails
    print("%d cases, %d failures" % (len(CASES) + len(CHECK_ONLY) + ncomp + nbm, fails))
    sys.exit(1 if fails else 0)

if __name__ == "__main__":
    main()
