#!/usr/bin/env python3
"""Compressed cluster writes (compress.sh): the same `write -c` scripts run
by qemu-io on one twin image and by `qcowkit io` on the other, for both
compression types, cluster sizes from 512 B to 2 MiB, extended L2,
compat 0.10, refcount widths 1 and 64, a backing file and a snapshot
sharing the clusters; then the same output and exit status (timings
aside), images that read the same (qemu-img compare), `qemu-img check`
clean on ours with the same share of compressed clusters, and qcowkit
reading qemu's compressed image the way qemu-img does (dd to raw).
Usage: compress.py QCOWKIT WORKDIR
"""
import os
import re
import sys

from twin import bad, finish, new_case, run, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20

with open(os.path.join(WORK, "rnd.bin"), "wb") as f:
    f.write(os.urandom(4 * M))
# Half random, half a repeated byte: compresses to about half.
with open(os.path.join(WORK, "half.bin"), "wb") as f:
    for _ in range(64):
        f.write(os.urandom(32768) + b"\x5a" * 32768)


def norm(out):
    # Timing lines differ from run to run; discards are dropped because
    # some qemu-io scripts have one more (see Q below).
    return [l for l in out.splitlines() if not re.search(r"ops; ", l) and not l.startswith("discard ")]


def Q(cmd):
    """A command for qemu-io only. QEMU 7.2 refuses a compressed write
    over a cluster with a host offset (EIO); qcowkit replaces the cluster
    and frees the old one, so qemu-io's script discards it first to reach
    the same content."""
    return ("Q", cmd)


def stats(path):
    rc, out, err = run(["qemu-img", "check", path])
    m = re.search(r"(\d+)/(\d+) = .* allocated.*?([\d.]+)% compressed", out)
    return rc, (m.group(1), m.group(2), m.group(3)) if m else out + err


def case(name, opts, size, cmds, setup=None, backing=None):
    n = new_case()
    imgs = []
    for side in ("q", "k"):
        d = os.path.join(WORK, "%s%d" % (side, n))
        os.makedirs(d)
        if backing:
            sh(["qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", str(size)], d)
            sh(["qemu-io", "-c", "write -P 0x33 0 %d" % size, "base.qcow2"], d)
            opts = opts + ["-b", "base.qcow2", "-F", "qcow2"]
        sh(["qemu-img", "create", "-q", "-f", "qcow2"] + opts + ["img.qcow2", str(size)], d)
        for s in setup or []:
            sh(s + ["img.qcow2"], d)
        imgs.append(d)
    q, k = imgs
    qargs, kargs = [], []
    for c in cmds:
        only_q = isinstance(c, tuple)
        c = (c[1] if only_q else c).replace("@", WORK + "/")
        qargs += ["-c", c]
        if not only_q:
            kargs += ["-c", c]
    rq, oq, eq = run(["qemu-io", "-f", "qcow2"] + qargs + ["img.qcow2"], q)
    rk, ok, ek = run([QK, "io", "-f", "qcow2"] + kargs + ["img.qcow2"], k)
    if rq != rk:
        bad(name, "exit status: qemu-io %d, qcowkit %d (%s)" % (rq, rk, ek.strip()))
    if norm(oq) != norm(ok):
        bad(name, "output:\nqemu-io: %s\nqcowkit: %s" % (norm(oq), norm(ok)))
    qi, ki = os.path.join(q, "img.qcow2"), os.path.join(k, "img.qcow2")
    rc, o, e = run(["qemu-img", "compare", qi, ki])
    if rc != 0:
        bad(name, "images read differently: %s%s" % (o, e))
    sq, sk = stats(qi), stats(ki)
    if sk[0] != 0:
        bad(name, "qemu-img check of ours: %s" % (sk[1],))
    elif sq[1] != sk[1]:
        bad(name, "allocated/compressed: qemu-img %s, qcowkit %s" % (sq[1], sk[1]))
    # qcowkit reads qemu's compressed clusters as qemu-img does.
    rc, o, e = run([QK, "dd", "-f", "qcow2", "-O", "raw", "if=" + qi, "of=" + os.path.join(q, "k.raw")])
    rc2, o2, e2 = run(["qemu-img", "convert", "-O", "raw", qi, os.path.join(q, "q.raw")])
    if rc != 0 or rc2 != 0:
        bad(name, "reading qemu's image: %s%s %s%s" % (o, e, o2, e2))
    else:
        rc, o, e = run(["cmp", os.path.join(q, "k.raw"), os.path.join(q, "q.raw")])
        if rc != 0:
            bad(name, "qcowkit reads qemu's compressed image differently: %s%s" % (o, e))


SCRIPT = ["write -c -P 1 0 256k", "write -c -s @rnd.bin 256k 128k", "write -c -s @half.bin 1M 1M",
          "write -P 2 3M 64k", Q("discard 3M 64k"), "write -c -P 3 3M 64k", "write -c 4M 64k", "read -P 1 0 256k"]
for ctype in ("zlib", "zstd"):
    for cl in ("512", "4k", "64k", "2M"):
        script = SCRIPT if cl != "2M" else ["write -c -P 1 0 2M", "write -c -s @rnd.bin 2M 2M",
                                             "write -c -s @half.bin 4M 2M", "read -P 1 0 2M"]
        case("%s %s clusters" % (ctype, cl), ["-o", "cluster_size=%s,compression_type=%s" % (cl, ctype)],
             8 * M, script)
    case("%s extended L2" % ctype, ["-o", "extended_l2=on,compression_type=%s" % ctype], 8 * M,
         SCRIPT + ["write -P 4 4M 4k", Q("discard 4M 64k"), "write -c -P 5 4M 64k"])
    case("%s refcount_bits=1" % ctype, ["-o", "refcount_bits=1,compression_type=%s" % ctype], 8 * M, SCRIPT)
    case("%s refcount_bits=64" % ctype, ["-o", "refcount_bits=64,compression_type=%s" % ctype], 8 * M, SCRIPT)
case("compat 0.10", ["-o", "compat=0.10"], 8 * M, SCRIPT)
case("over a backing file", [], 8 * M, ["write -c -P 7 64k 64k", "write -c 1M 128k", "read -P 0x33 0 64k"],
     backing=True)
case("image end inside a cluster", [], 100 * 1024,
     ["write -c -P 1 64k 36k", "write -c 0 64k", Q("discard 64k 36k"), "write -c -P 2 64k 36k"])
case("errors: partial, unaligned, with -f, zero write with -c", [], M,
     ["write -c 1k 64k", "write -c 0 4k", "write -c -f 0 64k", "write -c -z 0 64k", "write -c -P 9 64k 64k"])
case("over allocated clusters and a zero cluster", [], 2 * M,
     ["write -P 1 0 128k", "write -z 128k 64k", "write -c -P 2 128k 64k", Q("discard 0 64k"),
      "write -c -P 3 0 64k", "read -P 3 0 64k", "read -P 1 64k 64k"])
case("packed clusters freed one by one", [], 4 * M,
     ["write -c -P 1 0 1M", "discard 0 512k", "write -c -P 2 2M 512k", "discard 512k 512k",
      "write -c -P 3 0 64k", Q("discard 2M 64k"), "write -c -P 4 2M 64k"])
case("a snapshot shares the clusters", [], 4 * M, ["write -c -P 4 0 1M", Q("discard 2M 64k"), "write -c -P 5 2M 64k"],
     setup=[["qemu-io", "-c", "write -c -P 1 2M 1M"], ["qemu-img", "snapshot", "-c", "s1"]])

finish()
