#!/usr/bin/env python3
"""qcowkit amend against qemu-img amend on twin copies (amend.sh).

Each case builds an image (and a backing file where it needs one) with
qemu-img/qemu-io, copies it, amends one copy with each tool and requires:
the same exit status and messages (program name aside; progress reduced
to its first and last state), the same `qemu-img info` (size, compat,
refcount bits, lazy refcounts, backing file), `qemu-img check` clean on
ours, the same content as qemu-img's result and as before, and snapshots
reading as before. Where qcowkit refuses on purpose and qemu-img goes on
(see src/qcow2/amend.c), ours must refuse and leave the image unchanged.
Usage: amend.py QCOWKIT WORKDIR
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

from twin import bad, finish, new_case, run, run_both, same_name, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20


def norm(t):
    lines = same_name(t).split("\n")
    prog = [i for i, l in enumerate(lines) if re.fullmatch(r" *\(\d+\.\d\d/100%\)", l)]
    drop = set(prog[1:-1])
    return "\n".join(l for i, l in enumerate(lines) if i not in drop)


def build(d, opts, cmds, snapshot=None, backing=False, bitmap=False, size=8 * M, bsize=8 * M):
    os.makedirs(d)
    c = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if opts:
        c += ["-o", opts]
    if backing:
        sh(["qemu-img", "create", "-q", "-f", "qcow2", "b.qcow2", str(bsize)], d)
        sh(["qemu-io", "-c", "write -P 0x11 0 %d" % bsize, "b.qcow2"], d)
        c += ["-b", "b.qcow2", "-F", "qcow2"]
    sh(c + ["t.qcow2", str(size)], d)
    if cmds:
        sh(["qemu-io"] + [a for w in cmds for a in ("-c", w)] + ["t.qcow2"], d)
    if snapshot:
        sh(["qemu-img", "snapshot", "-c", "s1", "t.qcow2"], d)
        sh(["qemu-io"] + [a for w in snapshot for a in ("-c", w)] + ["t.qcow2"], d)
    if bitmap:
        sh(["qemu-img", "bitmap", "--add", "t.qcow2", "b0"], d)


def info(d):
    rc, out, _ = run(["qemu-img", "info", "--output=json", "t.qcow2"], d)
    if rc != 0:
        return None
    j = json.loads(out)
    spec = j.get("format-specific", {}).get("data", {})
    return (j["virtual-size"], j.get("backing-filename"), spec.get("compat"), spec.get("refcount-bits"),
            spec.get("lazy-refcounts"), spec.get("extended-l2"))


def snap_raw(d, out):
    """The snapshot's content as raw (empty string when there is none)."""
    rc, o, _ = run(["qemu-img", "snapshot", "-l", "t.qcow2"], d)
    if "s1" not in o:
        return False
    rc, _, e = run(["qemu-img", "convert", "-O", "raw", "-l", "snapshot.name=s1", "t.qcow2", out], d)
    return rc == 0


def case(name, args, opts="", cmds=(), snapshot=None, backing=False, bitmap=False, deliberate=False, size=8 * M,
         bsize=8 * M):
    n = new_case()
    p, q, k = (os.path.join(WORK, "%s%d" % (x, n)) for x in "pqk")
    try:
        build(p, opts, list(cmds), snapshot, backing, bitmap, size, bsize)
    except RuntimeError as e:
        bad(name, "setup: %s" % e)
        return
    shutil.copytree(p, q)
    shutil.copytree(p, k)
    if deliberate:
        rk = run([QK, "amend"] + args, k)
        if rk[0] != 1:
            bad(name, "expected a refusal, got exit %d: %s" % (rk[0], rk[2]))
        rc, o, e = run(["cmp", os.path.join(p, "t.qcow2"), os.path.join(k, "t.qcow2")])
        if rc != 0:
            bad(name, "refused, but the image changed: %s%s" % (o, e))
        return
    rq, rk = run_both(name, QK, "amend", args, q, k, norm=norm)
    if info(q) != info(k):
        bad(name, "info differs: qemu-img %s, qcowkit %s" % (info(q), info(k)))
    rc, out, _ = run(["qemu-img", "check", "t.qcow2"], k)
    if rc != 0:
        bad(name, "qemu-img check: %s" % out.strip())
    rc, o, e = run(["qemu-img", "compare", os.path.join(q, "t.qcow2"), os.path.join(k, "t.qcow2")])
    if rc != 0:
        bad(name, "reads differently from qemu-img's: %s%s" % (o, e))
    if rk[0] == 0 and not any(a.startswith("size=") for a in ",".join(args).split(",")):
        rc, o, e = run(["qemu-img", "compare", os.path.join(p, "t.qcow2"), os.path.join(k, "t.qcow2")])
        if rc != 0:
            bad(name, "content changed: %s%s" % (o, e))
    if snapshot:
        # Against the snapshot before the amend, not qemu-img's result:
        # qemu-img 7.2's downgrade writes zeros into a cluster a snapshot
        # shares (its own check then reports OFLAG_COPIED errors).
        sp, sk = os.path.join(p, "s.raw"), os.path.join(k, "s.raw")
        if snap_raw(p, sp) != snap_raw(k, sk):
            bad(name, "snapshot lost")
        elif os.path.exists(sp):
            rc, o, e = run(["cmp", sp, sk])
            if rc != 0:
                bad(name, "snapshot reads differently from before: %s%s" % (o, e))


data = ["write -P 5 0 1M", "write -z 2M 1M", "write -z 4M 64k", "write -P 6 6M 64k", "discard 7M 64k"]
snap_after = ["write -P 7 0 64k", "write -z 6M 64k"]
for cs in (512, 65536, 2 * M):
    o = "cluster_size=%d" % cs
    case("downgrade, cluster_size=%d" % cs, ["-o", "compat=0.10", "t.qcow2"], o, data)
    case("downgrade over a backing file, cluster_size=%d" % cs, ["-o", "compat=0.10", "t.qcow2"], o, data,
         backing=True)
    case("upgrade, cluster_size=%d" % cs, ["-o", "compat=1.1", "t.qcow2"], o + ",compat=0.10",
         ["write -P 5 0 1M", "write -P 6 6M 64k"], backing=True)
for bits in (1, 2, 4, 8, 32, 64):
    case("refcount_bits=%d" % bits, ["-o", "refcount_bits=%d" % bits, "t.qcow2"], "", data)
case("refcount_bits=1 with a snapshot (a refcount of 2)", ["-o", "refcount_bits=1", "t.qcow2"], "", data,
     snapshot=snap_after)
case("refcount_bits=2 with a snapshot", ["-o", "refcount_bits=2", "t.qcow2"], "", data, snapshot=snap_after)
case("refcount_bits=16 from 4, 512-byte clusters", ["-o", "refcount_bits=16", "t.qcow2"],
     "refcount_bits=4,cluster_size=512", data)
case("downgrade with refcount_bits=16 from 8", ["-o", "compat=0.10,refcount_bits=16", "t.qcow2"],
     "refcount_bits=8", data)
case("downgrade from refcount_bits=8", ["-o", "compat=0.10", "t.qcow2"], "refcount_bits=8", data)
case("downgrade, snapshot without zero clusters", ["-o", "compat=0.10", "t.qcow2"], "",
     ["write -P 5 0 1M"], snapshot=["write -z 0 64k"])
case("lazy_refcounts=on", ["-o", "lazy_refcounts=on", "t.qcow2"], "", data)
case("lazy_refcounts (no value)", ["-o", "lazy_refcounts", "t.qcow2"], "", data)
case("lazy_refcounts=off", ["-o", "lazy_refcounts=off", "t.qcow2"], "lazy_refcounts=on", data)
case("downgrade of a lazy_refcounts image", ["-o", "compat=0.10", "t.qcow2"], "lazy_refcounts=on", data)
case("size=16M", ["-o", "size=16M", "t.qcow2"], "", data)
case("size=4M (smaller)", ["-o", "size=4M", "t.qcow2"], "", data)
case("two -o", ["-o", "compat=1.1", "-o", "lazy_refcounts=on", "t.qcow2"], "compat=0.10", data[:1])
case("-p downgrade", ["-p", "-o", "compat=0.10", "t.qcow2"], "", data)
case("-q -p --force", ["-q", "-p", "--force", "-o", "compat=0.10", "t.qcow2"], "", data)
case("-t none", ["-t", "none", "-o", "refcount_bits=8", "t.qcow2"], "", data)
case("backing_file unchanged", ["-o", "backing_file=b.qcow2,backing_fmt=qcow2", "t.qcow2"], "", data,
     backing=True)
# Growing an overlay: the new area reads as zeros, not as the (bigger)
# backing file, and the backing data under the last, partial cluster of
# the old size stays visible.
for o in ("", "extended_l2=on", "cluster_size=2M"):
    case("size=16M over a 16M backing file, old size 8M-512 %s" % o, ["-o", "size=16M", "t.qcow2"], o, data[:2],
         backing=True, size=8 * M - 512, bsize=16 * M)
case("size=16M over a 16M backing file, old size 8M", ["-o", "size=16M", "t.qcow2"], "", data[:2], backing=True,
     bsize=16 * M)
case("backing_file alone (the format recorded too)", ["-o", "backing_file=b.qcow2", "t.qcow2"], "", data,
     backing=True)
case("backing_fmt alone", ["-o", "backing_fmt=qcow2", "t.qcow2"], "", data, backing=True)
case("-o help", ["-o", "help", "t.qcow2"])
# help anywhere in the list; with -f no image is needed; other formats
case("-o lazy_refcounts=on,?", ["-o", "lazy_refcounts=on,?", "t.qcow2"])
case("-f qcow2 -o help, no image", ["-f", "qcow2", "-o", "help"])
case("-f raw -o help", ["-f", "raw", "-o", "help"])
case("-f bogus -o help", ["-f", "bogus", "-o", "help"])
case("-f raw -o help on a qcow2 image", ["-f", "raw", "-o", "help", "t.qcow2"])
for args in (["t.qcow2"], ["-o", "compat=1.2", "t.qcow2"], ["-o", "compat=", "t.qcow2"],
             ["-o", "lazy_refcounts=maybe", "t.qcow2"], ["-o", "cluster_size=4096", "t.qcow2"],
             ["-o", "extended_l2=on", "t.qcow2"], ["-o", "compression_type=zstd", "t.qcow2"],
             ["-o", "preallocation=full", "t.qcow2"], ["-o", "refcount_bits=3", "t.qcow2"],
             ["-o", "refcount_bits=128", "t.qcow2"], ["-o", "refcount_bits=abc", "t.qcow2"],
             ["-o", "size=abc", "t.qcow2"], ["-o", "backing_file=x.qcow2", "t.qcow2"],
             ["-o", "lazy_refcounts=on,", "t.qcow2"], ["-o", ",lazy_refcounts=on", "t.qcow2"],
             ["-o", "bogus=1", "t.qcow2"], ["-o", "data_file=x", "t.qcow2"],
             ["-o", "data_file_raw=on", "t.qcow2"], ["-o", "encrypt.new-secret=x", "t.qcow2"],
             ["-o", "compat=0.10,lazy_refcounts=on", "t.qcow2"], ["-o", "compat=0.10,refcount_bits=8", "t.qcow2"],
             ["-t", "bogus", "-o", "compat=1.1", "t.qcow2"], ["-o", "compat=1.1", "nope.qcow2"],
             ["-f", "raw", "-o", "size=4M", "t.qcow2"], ["-o", "compat=1.1", "t.qcow2", "extra"]):
    case("error: %s" % " ".join(args), args, "", data[:1])
case("error: downgrade with extended L2", ["-o", "compat=0.10", "t.qcow2"], "extended_l2=on", data[:1])

# Refusals where qemu-img goes on (v2 could not keep what the image means).
case("refused: downgrade with zstd", ["-o", "compat=0.10", "t.qcow2"], "compression_type=zstd",
     ["write -c -P 9 0 64k"], deliberate=True)
case("refused: downgrade with a persistent bitmap", ["-o", "compat=0.10", "t.qcow2"], "", data[:1],
     bitmap=True, deliberate=True)
case("refused: downgrade, snapshot holding zero clusters", ["-o", "compat=0.10", "t.qcow2"], "",
     ["write -z 0 1M"], snapshot=["write -P 3 0 1M"], deliberate=True)

# A snapshot taken at another size (or with VM state over 4 GiB): a v2
# entry cannot say so, and qemu-img refuses with the same words.
def snapshot_twins(write, grow):
    """Twin directories with a 16M image holding snapshot s1 (WRITE
    first, when set), grown to 32M afterwards if GROW."""
    n = new_case()
    q, k = (os.path.join(WORK, "%s%d" % (x, n)) for x in "qk")
    for d in (q, k):
        os.makedirs(d)
        t = os.path.join(d, "t.qcow2")
        sh(["qemu-img", "create", "-q", "-f", "qcow2", t, "16M"])
        if write:
            sh(["qemu-io", "-c", write, t])
        sh(["qemu-img", "snapshot", "-c", "s1", t])
        if grow:
            sh(["qemu-img", "resize", "-q", t, "32M"])
    return q, k


q, k = snapshot_twins(None, True)
rq, rk = run_both("error: downgrade with a snapshot of another size", QK, "amend", ["-o", "compat=0.10", "t.qcow2"],
                  q, k, norm=norm)
if not info(k) or info(k)[2] != "1.1":
    bad("error: downgrade with a snapshot of another size", "the image was downgraded: %s" % (info(k),))

# With size= in the same amend, the size the image will have is the one a
# v2 entry assumes (qemu-img resizes first, then downgrades). Back to the
# snapshot's size: both downgrade. Away from it: both refuse with the same
# words; qemu-img has grown the image by then, ours is left unchanged
# (the check comes before any change). Once accepted, then refused.
q, k = snapshot_twins("write -P 5 0 1M", True)
name = "downgrade with size= back to the snapshot's size"
rq, rk = run_both(name, QK, "amend", ["-o", "compat=0.10,size=16M", "t.qcow2"], q, k, norm=norm)
if info(q) != info(k) or not info(k) or info(k)[2] != "0.10":
    bad(name, "info: qemu-img %s, qcowkit %s" % (info(q), info(k)))
rc, o, e = run(["qemu-img", "compare", os.path.join(q, "t.qcow2"), os.path.join(k, "t.qcow2")])
if rc != 0:
    bad(name, "reads differently from qemu-img's: %s%s" % (o, e))
q, k = snapshot_twins(None, False)
before = open(os.path.join(k, "t.qcow2"), "rb").read()
name = "error: downgrade with size= away from the snapshot's size"
rq, rk = run_both(name, QK, "amend", ["-o", "compat=0.10,size=32M", "t.qcow2"], q, k, norm=norm)
if open(os.path.join(k, "t.qcow2"), "rb").read() != before:
    bad(name, "refused, but the image changed: %s" % (info(k),))

# A leak on a cluster in use (refcount 2 for its one reference, the L2
# entry without OFLAG_COPIED, as an interrupted snapshot deletion leaves
# it). Its count carries over as qemu-img carries it: kept at 32 bits (the
# leak stays, check exits 3), refused at 1 bit with qemu-img's message.
# The count used to become the reference count, with the flag written
# after the header switch: a power loss between the two left OFLAG_COPIED
# errors. Every crash state of the width change's write log (replayed as
# tests/crash does) must pass qemu-img check (0 or 3) and read as before.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crash"))
import replay  # noqa: E402
import wlog  # noqa: E402


def leak_in_use(d):
    os.makedirs(d)
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "t.qcow2", "1M"], d)
    sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 64k", "t.qcow2"], d)
    path = os.path.join(d, "t.qcow2")
    with open(path, "r+b") as f:
        b = bytearray(f.read())
        l1 = struct.unpack_from(">Q", b, 40)[0]
        l2 = struct.unpack_from(">Q", b, l1)[0] & 0x00fffffffffffe00
        e = struct.unpack_from(">Q", b, l2)[0]
        struct.pack_into(">Q", b, l2, e & ~(1 << 63))
        rb = struct.unpack_from(">Q", b, struct.unpack_from(">Q", b, 48)[0])[0]
        struct.pack_into(">H", b, rb + 2 * ((e & 0x00fffffffffffe00) >> 16), 2)
        f.seek(0)
        f.write(b)
    return path


for width in (1, 32, 64):
    name = "refcount_bits=%d over a leak on a cluster in use" % width
    base = os.path.join(WORK, "leak%d" % new_case())
    q, k = base + "q", base + "k"
    leak_in_use(q)
    path = leak_in_use(k)
    before = open(path, "rb").read()
    rq, rk = run_both(name, QK, "amend", ["-o", "refcount_bits=%d" % width, "t.qcow2"], q, k)
    if rk[0] != 0:
        if open(path, "rb").read() != before:
            bad(name, "refused, but the image changed")
        continue
    cq, ck = run(["qemu-img", "check", "t.qcow2"], q), run(["qemu-img", "check", "t.qcow2"], k)
    if ck[0] != 3 or ck[0] != cq[0] or "Leaked cluster 5 refcount=2 reference=1" not in ck[1] + ck[2]:
        bad(name, "qemu-img check on ours exit %d, on qemu-img's %d:\n%s" % (ck[0], cq[0], ck[1].strip()))
    # The same change under power loss: every state of its write log.
    d = base + "p"
    init = open(leak_in_use(d), "rb").read()
    env = dict(os.environ, QCOWKIT_LOG_WRITES=os.path.join(d, "w.log"))
    p = subprocess.run([QK, "amend", "-o", "refcount_bits=%d" % width, "t.qcow2"], cwd=d, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        bad(name, "amend with its write log failed: %s" % p.stdout.strip())
        continue
    recs = wlog.records_for(wlog.read_log(os.path.join(d, "w.log")), os.path.join(d, "t.qcow2"))
    states = failed = 0
    for st, data in replay.states(init, recs, 1, 12):
        states += 1
        with open(os.path.join(d, "s.qcow2"), "wb") as f:
            f.write(data)
        c = run(["qemu-img", "check", "s.qcow2"], d)
        r = run(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x11 0 64k", "s.qcow2"], d)
        if c[0] not in (0, 3) or r[0] != 0 or "verification failed" in r[1]:
            failed += 1
            if failed <= 2:
                bad(name, "crash state at record %d (durable %d): check exit %d:\n%s" %
                    (st.point, st.durable, c[0], c[1].strip()[-600:]))
    if states < 3:
        bad(name, "only %d crash states" % states)

finish()
