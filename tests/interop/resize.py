#!/usr/bin/env python3
"""qcowkit resize against qemu-img resize on twin copies (resize.sh).

Each case makes an image with qemu-img/qemu-io (known data, some of it
written compressed, across L2 table boundaries; optional snapshots,
backing file, extended L2, v2), copies it, resizes one copy with each
tool, and requires: the same exit status, the same messages (program
name aside), the same virtual size, `qemu-img check` clean on ours, the
same content (`qemu-img compare`), ours no longer than QEMU's by more
than a cluster's worth of slack, and after growing both again the same
content (a shrink must not leave old data to reappear). With snapshots,
each snapshot is then applied (by qemu-img) on both copies and compared.
Usage: resize.py QCOWKIT WORKDIR
"""
import json
import os
import shutil
import sys

from twin import bad, finish, new_case, run, sh

QK, WORK = sys.argv[1], sys.argv[2]


def vsize(path, fmt):
    return json.loads(sh(["qemu-img", "info", "-f", fmt, "--output=json", path]))["virtual-size"]


made = {}


def make(path, fmt, size, copts="", writes=(), backing=None, snaps=0):
    """Makes the case's image once per distinct setup (kept as a master
    copy in WORK/masters); cases that share a setup copy it."""
    key = repr((fmt, size, copts, tuple(writes), backing, snaps))
    for f in os.listdir(WORK):
        if f != "masters":
            os.unlink(os.path.join(WORK, f))
    os.makedirs(os.path.join(WORK, "masters"), exist_ok=True)
    master = made.get(key)
    if master:
        shutil.copy(master, path)
        if backing:
            shutil.copy(master + ".b", "b.qcow2")
        return
    cs = 65536
    for o in copts.split(","):
        if o.startswith("cluster_size="):
            cs = int(o.split("=")[1])
    if backing:
        sh(["qemu-img", "create", "-q", "-f", "qcow2", "b.qcow2", str(backing)])
        sh(["qemu-io", "-f", "qcow2", "-c", "write -P 0x77 0 %d" % backing, "b.qcow2"])
    cmd = ["qemu-img", "create", "-q", "-f", fmt]
    if copts:
        cmd += ["-o", copts]
    if backing:
        cmd += ["-b", "b.qcow2", "-F", "qcow2"]
    sh(cmd + [path, str(size)])
    # A compressed write covers a whole cluster: the first from 3M on.
    writes = [w.replace("COMPRESSED", "write -c -P 0x33 %d %d" % (-(-(3 << 20) // cs) * cs, cs)) for w in writes]
    # One qemu-io run for the writes before each snapshot and after the last.
    groups = [[w] for w in writes[:snaps]] + [writes[snaps:]]
    for i, g in enumerate(groups):
        if g:
            sh(["qemu-io", "-f", fmt] + [a for w in g for a in ("-c", w)] + [path])
        if i < snaps:
            sh(["qemu-img", "snapshot", "-c", "s%d" % i, path])
    master = os.path.join(WORK, "masters", "m%d" % len(made))
    shutil.copy(path, master)
    if backing:
        shutil.copy("b.qcow2", master + ".b")
    made[key] = master


def normalize(text):
    return text.replace(QK, "PROG").replace("qemu-img", "PROG").replace("qcowkit", "PROG")


def compare(name, fmt, a, b, what):
    rc, out, err = run(["qemu-img", "compare", "-f", fmt, "-F", fmt, a, b])
    if rc != 0:
        bad(name, "%s: content differs: %s%s" % (what, out, err))


def own_ranges(path):
    """The ranges an image holds itself (present at depth 0 of qemu-img
    map), merged whatever their host offsets."""
    out = []
    for e in json.loads(sh(["qemu-img", "map", "--output=json", path])):
        if e["depth"] == 0 and e.get("present", True):
            if out and out[-1][1] == e["start"]:
                out[-1][1] += e["length"]
            else:
                out.append([e["start"], e["start"] + e["length"]])
    return out


def case(name, fmt, size, args, copts="", writes=(), backing=None, snaps=0, regrow="+64M"):
    new_case()
    os.chdir(WORK)
    img = "i." + fmt
    try:
        make(img, fmt, size, copts, writes, backing, snaps)
    except RuntimeError as e:
        bad(name, "setup: %s" % e)
        return
    shutil.copy(img, "q." + fmt)
    shutil.copy(img, "k." + fmt)
    # Absolute paths of the backing file stay valid in the copies.
    rq = run(["qemu-img", "resize"] + [a.replace("IMG", "q." + fmt) for a in args])
    rk = run([QK, "resize"] + [a.replace("IMG", "k." + fmt) for a in args])
    if rq[0] != rk[0]:
        bad(name, "exit %d, qemu-img %d (stderr: %s)" % (rk[0], rq[0], rk[2].strip()))
    # qemu-img also warns when it probes a raw image: not ours to copy.
    qerr = "".join(l for l in rq[2].splitlines(True) if "probing guessed raw" not in l and not l.startswith(" "))
    qerr = qerr.replace("WARNING: Image format was not specified for 'q.raw' and ", "")
    if normalize(rq[1] + qerr).replace("q." + fmt, "F") != normalize(rk[1] + rk[2]).replace("k." + fmt, "F"):
        bad(name, "output differs:\n  qemu-img: %r\n  qcowkit:  %r" % (rq[1] + qerr, rk[1] + rk[2]))
    if fmt == "qcow2":
        rc, out, _ = run(["qemu-img", "check", "k.qcow2"])
        if rc != 0:
            bad(name, "qemu-img check: %s" % out.strip())
    if vsize("q." + fmt, fmt) != vsize("k." + fmt, fmt):
        bad(name, "virtual size %d, qemu-img's %d" % (vsize("k." + fmt, fmt), vsize("q." + fmt, fmt)))
        return
    compare(name, fmt, "q." + fmt, "k." + fmt, "after resize")
    if fmt == "qcow2" and own_ranges("q.qcow2") != own_ranges("k.qcow2"):
        # What the image holds itself decides what a backing file that
        # grows or is swapped later shows.
        bad(name, "holds %s itself, qemu-img's %s" % (own_ranges("k.qcow2")[:6], own_ranges("q.qcow2")[:6]))
    slack = 1 << 21
    if os.path.getsize("k." + fmt) > os.path.getsize("q." + fmt) + slack:
        bad(name, "file %d bytes, qemu-img's %d" % (os.path.getsize("k." + fmt), os.path.getsize("q." + fmt)))
    if rq[0] == 0 and regrow:
        # Both grown again by qemu-img: what was cut must read as zeros.
        sh(["qemu-img", "resize", "-q", "-f", fmt, "q." + fmt, regrow])
        sh(["qemu-img", "resize", "-q", "-f", fmt, "k." + fmt, regrow])
        compare(name, fmt, "q." + fmt, "k." + fmt, "grown again")
        if fmt == "qcow2":
            rc, out, _ = run(["qemu-img", "check", "k.qcow2"])
            if rc != 0:
                bad(name, "qemu-img check after growing again: %s" % out.strip())
    for i in range(snaps):
        sh(["qemu-img", "snapshot", "-a", "s%d" % i, "q." + fmt])
        sh(["qemu-img", "snapshot", "-a", "s%d" % i, "k." + fmt])
        compare(name, fmt, "q." + fmt, "k." + fmt, "snapshot s%d applied" % i)


M = 1 << 20
data = ["write -P 0x11 0 1M", "write -P 0x22 1500k 700k", "COMPRESSED",
        "write -P 0x44 %d 1M" % (6 * M), "write -z 5M 64k", "write -P 0x55 %d 512" % (8 * M - 512)]

# Messages and refusals.
case("grow", "qcow2", 8 * M, ["IMG", "16M"], writes=data)
case("grow relative", "qcow2", 8 * M, ["IMG", "+1G"], writes=data)
case("grow same size", "qcow2", 8 * M, ["IMG", "+0"], writes=data)
case("grow -q", "qcow2", 8 * M, ["-q", "IMG", "9M"], writes=data)
case("shrink refused", "qcow2", 8 * M, ["IMG", "4M"], writes=data)
case("shrink refused relative", "qcow2", 8 * M, ["IMG", "--", "-1M"], writes=data)
case("size zero", "qcow2", 8 * M, ["IMG", "0"], writes=data)
case("below zero", "qcow2", 8 * M, ["--shrink", "IMG", "--", "-1G"], writes=data)
case("bad size", "qcow2", 8 * M, ["IMG", "1x"], writes=data)
case("size out of range", "qcow2", 8 * M, ["IMG", "+16E"], writes=data)
case("not 512-aligned", "qcow2", 8 * M, ["IMG", "9000001"], writes=data)
case("not 512-aligned shrink", "qcow2", 8 * M, ["--shrink", "IMG", "5000001"], writes=data)
case("bad prealloc", "qcow2", 8 * M, ["--preallocation=bogus", "IMG", "16M"], writes=data)
case("prealloc shrink", "qcow2", 8 * M, ["--preallocation=falloc", "--shrink", "IMG", "4M"], writes=data)
case("no size", "qcow2", 8 * M, ["IMG"], writes=data)
case("options after the file", "qcow2", 8 * M, ["IMG", "-f", "qcow2", "+1M"], writes=data)
for p in ("metadata", "falloc", "full"):
    case("grow prealloc=" + p, "qcow2", 8 * M, ["--preallocation=" + p, "IMG", "24M"], writes=data)
    case("grow prealloc=%s (raw)" % p, "raw", 8 * M, ["-f", "raw", "--preallocation=" + p, "IMG", "24M"],
         writes=data[:2] + data[3:])

# Shrinks over the layouts that matter: cut inside an L2 table, at and across
# table boundaries (512 B and 4 KiB clusters have small tables), subclusters.
for copts in ("cluster_size=512", "cluster_size=4096,refcount_bits=1", "cluster_size=65536,refcount_bits=64",
              "cluster_size=2097152", "cluster_size=16384,extended_l2=on", "cluster_size=65536,extended_l2=on",
              "compat=0.10,cluster_size=4096"):
    for new in ("5M", "4608k", "1536k", "512"):
        case("shrink %s to %s" % (copts, new), "qcow2", 8 * M, ["--shrink", "IMG", new], copts=copts, writes=data)
    case("grow %s" % copts, "qcow2", 8 * M, ["IMG", "100M"], copts=copts, writes=data)

# Snapshots: v3 may shrink below a snapshot's size (the snapshot keeps its
# data); v2 refuses any resize.
case("shrink with snapshots", "qcow2", 8 * M, ["--shrink", "IMG", "2M"], copts="cluster_size=4096",
     writes=data, snaps=3)
case("grow with snapshots", "qcow2", 8 * M, ["IMG", "32M"], copts="cluster_size=4096", writes=data, snaps=3)
case("v2 with snapshots", "qcow2", 8 * M, ["IMG", "32M"], copts="compat=0.10", writes=data, snaps=1)

# A backing file larger than the image: the new area reads as zeros, and
# what a shrink cut shows the backing file again when grown.
case("grow over a bigger backing file", "qcow2", 4 * M, ["IMG", "12M"], writes=data[:3], backing=10 * M)
case("shrink over a backing file", "qcow2", 8 * M, ["--shrink", "IMG", "3M"], writes=data, backing=8 * M)
# Growing from inside a cluster that holds nothing (no backing file, or
# one that ends before it): nothing to zero, the cluster stays unallocated.
case("grow from a partial cluster, nothing there", "qcow2", 4 * M + 1536, ["IMG", "12M"], writes=data[:2])
case("grow from a partial cluster past a shorter backing file", "qcow2", 4 * M + 1536, ["IMG", "12M"],
     writes=data[:2], backing=2 * M)
# Preallocated growth over a bigger backing file: the old last cluster's
# tail and unallocated subclusters must not show the backing file.
for mode in ("metadata", "falloc", "full"):
    case("preallocation=%s over a bigger backing file" % mode, "qcow2", 4 * M - 512,
         ["--preallocation=" + mode, "IMG", "12M"], writes=data[:2], backing=10 * M)
    case("preallocation=%s over a bigger backing file, extended L2" % mode, "qcow2", 4 * M,
         ["--preallocation=" + mode, "IMG", "12M"], copts="extended_l2=on", writes=data[:2], backing=10 * M)

# raw
case("raw grow", "raw", 8 * M, ["-f", "raw", "IMG", "+3M"], writes=data[:2] + data[3:])
case("raw shrink", "raw", 8 * M, ["-f", "raw", "--shrink", "IMG", "5000001"], writes=data[:2] + data[3:])
case("raw shrink refused", "raw", 8 * M, ["-f", "raw", "IMG", "1M"], writes=data[:2] + data[3:])

finish()
