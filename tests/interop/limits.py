#!/usr/bin/env python3
"""Bounded resources on hostile images: `info`, `check` and `map` (and a
read for the compressed case) run under prlimit --as=1 GiB --cpu=30 and
must end within a time bound with the expected exit status and a message
naming the problem: never a crash, a hang or an out-of-memory kill. The
limits are listed in doc/limits.md.

Usage: limits.py QCOWKIT WORKDIR
"""
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib

AS_LIMIT = 1 << 30
CPU_LIMIT = 30
WALL_LIMIT = 25.0          # seconds per command


def sh(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit("setup failed: %s\n%s" % (" ".join(cmd), p.stdout))
    return p.stdout


def be(fmt, path, off, val):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack(">" + fmt, val))


def rd(fmt, path, off):
    with open(path, "rb") as f:
        f.seek(off)
        return struct.unpack(">" + fmt, f.read(struct.calcsize(fmt)))[0]


def base(path, size="64M", opts=None, data=True):
    if os.path.exists(path):
        os.unlink(path)
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if opts:
        cmd += ["-o", opts]
    sh(cmd + [path, size])
    if data:
        sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 128k", path])


def snapshot_table(path, n, l1_off, l1_entries, table_off):
    """Writes n snapshot entries at table_off, all naming one L1 table."""
    out = bytearray()
    for i in range(n):
        sid = str(i + 1).encode()
        name = b"s" + sid
        e = struct.pack(">QIHHIIQII", l1_off, l1_entries, len(sid), len(name), 0, 0, 0, 0, 0)
        e += sid + name
        e += b"\0" * (-len(e) % 8)
        out += e
    with open(path, "r+b") as f:
        f.seek(table_off)
        f.write(out)
    be("I", path, 60, n)
    be("Q", path, 64, table_off)


# ---- builders: each makes WORK/img.qcow2 (and friends) and returns its path

def l1_2g(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    be("I", p, 36, 1 << 31)
    return p


def l1_over_cap(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    be("I", p, 36, (32 << 20) // 8 + 1)
    return p


def l1_at_cap(w):
    # A 32 MiB active L1 table (the cap), all unallocated, in a sparse file.
    p = os.path.join(w, "img.qcow2"); base(p)
    off = 16 << 20
    with open(p, "r+b") as f:
        f.truncate(off + (32 << 20))
    be("I", p, 36, (32 << 20) // 8)
    be("Q", p, 40, off)
    return p


def reftable_1g(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    be("I", p, 56, 1 << 30)
    return p


def reftable_over_cap(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    be("I", p, 56, (8 << 20) // 65536 + 1)
    return p


def size_4e(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    be("Q", p, 24, 1 << 62)
    return p


def snapshots_huge_l1(w):
    # 65536 snapshots, each naming the same 32 MiB L1 table (sparse file).
    p = os.path.join(w, "img.qcow2"); base(p)
    l1_off = 16 << 20
    with open(p, "r+b") as f:
        f.truncate(l1_off + (32 << 20))
    snapshot_table(p, 65536, l1_off, (32 << 20) // 8, l1_off + (32 << 20))
    return p


def snapshots_65537(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    snapshot_table(p, 65537, 0x30000, 1, 1 << 20)
    return p


def compressed_bomb(w):
    # A compressed cluster whose deflate stream would inflate to 16 MiB.
    p = os.path.join(w, "img.qcow2"); base(p, data=False)
    sh(["qemu-io", "-f", "qcow2", "-c", "write -c -P 0x11 0 64k", p])
    l1 = rd("Q", p, 40)
    l2 = rd("Q", p, l1) & 0x00fffffffffffe00
    e = rd("Q", p, l2)
    assert e & (1 << 62), "not compressed"
    host = e & ((1 << 54) - 1)
    c = zlib.compressobj(9, zlib.DEFLATED, -12)
    bomb = c.compress(b"\0" * (16 << 20)) + c.flush()
    sectors = (host % 512 + len(bomb) + 511) // 512
    assert sectors <= 256, sectors
    with open(p, "r+b") as f:
        f.seek(host)
        f.write(bomb)
    be("Q", p, l2, (1 << 62) | ((sectors - 1) << 54) | host)
    return p


def ext_endless(w):
    # 2 MiB header cluster filled with empty unknown extensions, no end marker.
    p = os.path.join(w, "img.qcow2"); base(p, opts="cluster_size=2M")
    hl = rd("I", p, 100)
    with open(p, "r+b") as f:
        f.seek(hl)
        f.write(struct.pack(">II", 0x7e57e57e, 0) * (((2 << 20) - hl) // 8))
    return p


def ext_overrun(w):
    p = os.path.join(w, "img.qcow2"); base(p)
    hl = rd("I", p, 100)
    be("I", p, hl, 0x7e57e57e)
    be("I", p, hl + 4, 0xfffffff0)
    return p


def chain_10000(w):
    # c00000 -> c00001 -> ... -> c09999: 10,000 qcow2 files of 512-byte clusters.
    d = os.path.join(w, "chain")
    os.makedirs(d, exist_ok=True)
    t = os.path.join(d, "t.qcow2")
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", "-u",
        "-b", "c99999.qcow2", "-F", "qcow2", t, "1M"])
    tmpl = open(t, "rb").read()
    at = tmpl.index(b"c99999.qcow2")
    for i in range(10000):
        nxt = b"c%05d.qcow2" % (i + 1)
        img = tmpl[:at] + nxt + tmpl[at + len(nxt):]
        if i == 9999:  # the last one has no backing file
            img = bytearray(img)
            struct.pack_into(">QI", img, 8, 0, 0)
            img = bytes(img)
        with open(os.path.join(d, "c%05d.qcow2" % i), "wb") as f:
            f.write(img)
    return os.path.join(d, "c00000.qcow2")


def chain_loop(w):
    a, b = os.path.join(w, "loop-a.qcow2"), os.path.join(w, "loop-b.qcow2")
    for x, y in ((a, "loop-b.qcow2"), (b, "loop-a.qcow2")):
        if os.path.exists(x):
            os.unlink(x)
        sh(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", y, "-F", "qcow2", x, "64M"])
    return a


FAIL, OK, CORRUPT = "fail", "ok", "corrupt"
CASES = [
    ("L1 table of 2^31 entries", l1_2g,
     [("info", FAIL, "L1 table too large"), ("check", FAIL, "L1 table too large"), ("map", FAIL, "L1 table too large")]),
    ("L1 table one entry over 32 MiB", l1_over_cap,
     [("info", FAIL, "L1 table too large"), ("check", FAIL, "L1 table too large"), ("map", FAIL, "L1 table too large")]),
    ("L1 table of exactly 32 MiB", l1_at_cap,
     # The truncate left the table's clusters without refcounts: check says so.
     [("info", OK, ""), ("check", CORRUPT, "errors were found"), ("map", OK, "")]),
    ("refcount table of 2^30 clusters", reftable_1g,
     [("info", FAIL, "refcount table too large"), ("check", FAIL, "refcount table too large"),
      ("map", FAIL, "refcount table too large")]),
    ("refcount table one cluster over 8 MiB", reftable_over_cap,
     [("info", FAIL, "refcount table too large"), ("check", FAIL, "refcount table too large")]),
    ("virtual size 2^62", size_4e,
     [("info", FAIL, "L1 table is too small"), ("check", FAIL, "L1 table is too small"), ("map", FAIL, "L1 table is too small")]),
    ("65536 snapshots each with a 32 MiB L1 table", snapshots_huge_l1,
     # info shows the image, warning that its snapshots are not listed.
     [("info", OK, "do not fit in the file"), ("check", CORRUPT, "referenced by something else too"), ("map", OK, "")]),
    ("65537 snapshots", snapshots_65537,
     [("info", FAIL, "too many snapshots"), ("check", FAIL, "too many snapshots"), ("map", FAIL, "too many snapshots")]),
    ("compressed cluster inflating to 16 MiB", compressed_bomb,
     # Reading it is an error, promptly (QEMU takes its first 64k): no
     # writer makes a stream that outgrows its cluster.
     [("io -c 'read 0 64k'", FAIL, "read failed"), ("check", OK, "No errors"), ("map", FAIL, "compressed clusters"), ("map --output=json", OK, "")]),
    ("header extensions without an end (2 MiB cluster)", ext_endless,
     [("info", FAIL, "too many header extensions"), ("check", FAIL, "too many header extensions"),
      ("map", FAIL, "too many header extensions")]),
    ("header extension overrunning the header", ext_overrun,
     [("info", FAIL, "overruns the header area"), ("check", FAIL, "overruns the header area")]),
    ("backing chain of 10,000 files", chain_10000,
     [("info --backing-chain", FAIL, "too deep"), ("map", FAIL, "too deep"), ("info", OK, "")]),
    ("backing chain loop", chain_loop,
     [("info --backing-chain", FAIL, "loop"), ("map", FAIL, "loop"), ("check", OK, "")]),
]


def main():
    qcowkit, work = sys.argv[1], sys.argv[2]
    prlimit = shutil.which("prlimit")
    if not prlimit or not shutil.which("qemu-img"):
        print("prlimit or qemu-img missing")
        sys.exit(77)
    fails = 0
    ncmds = 0
    for name, build, cmds in CASES:
        path = build(work)
        for cmd, want, frag in cmds:
            ncmds += 1
            parts = cmd.split(" ", 1)
            line = "%s --as=%d --cpu=%d -- %s %s %s %s" % (prlimit, AS_LIMIT, CPU_LIMIT, qcowkit, parts[0],
                                                          parts[1] if len(parts) > 1 else "", path)
            t0 = time.monotonic()
            try:
                p = subprocess.run(line, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=WALL_LIMIT * 2)
                out = p.stdout.decode(errors="replace")
                st = p.returncode
            except subprocess.TimeoutExpired:
                out, st = "", "timeout"
            secs = time.monotonic() - t0
            why = []
            exp_st = {FAIL: 1, OK: 0, CORRUPT: 2}[want]
            if st != exp_st:
                why.append("exit %s, want %d" % (st, exp_st))
            if secs > WALL_LIMIT:
                why.append("took %.1f s" % secs)
            if frag and frag.lower() not in out.lower():
                why.append("message lacks %r" % frag)
            last = [l for l in out.strip().splitlines() if l.strip()]
            shown = (last[-1] if want != CORRUPT else next((l for l in last if frag in l), last[-1] if last else "")) if last else ""
            print("%s %-48s %-20s %5.2fs exit %-4s %s" % ("ok  " if not why else "FAIL", name, cmd.split(" ")[0] +
                  (" --backing-chain" if "backing-chain" in cmd else ""), secs, st, shown[:100]))
            if why:
                fails += 1
                print("     -> " + ", ".join(why))
                print("     " + out.strip()[-1500:].replace("\n", "\n     "))
        if os.path.isdir(os.path.join(work, "chain")):
            shutil.rmtree(os.path.join(work, "chain"))
        for f in os.listdir(work):
            if f.endswith(".qcow2"):
                os.unlink(os.path.join(work, f))
    print("%d hostile images, %d commands, %d failures" % (len(CASES), ncmds, fails))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
