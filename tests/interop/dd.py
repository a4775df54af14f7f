#!/usr/bin/env python3
"""qcowkit dd against qemu-img dd (dd.sh): the same input (made by
qemu-img/qemu-io: data, zeros, a backing file, a compressed cluster),
each tool writing its own output; the same exit status and messages
(program name aside), outputs that read the same (qemu-img compare) with
the same virtual size and format, and `qemu-img check` clean on qcow2
outputs.
Usage: dd.py QCOWKIT WORKDIR
"""
import json
import os
import shutil
import sys

from twin import bad, finish, new_case, run, run_both, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20

src = os.path.join(WORK, "src")
os.makedirs(src)
sh(["qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", str(10 * M)], src)
sh(["qemu-io", "-c", "write -P 0x11 0 10M", "base.qcow2"], src)
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "in.qcow2", str(10 * M + 3000)], src)
sh(["qemu-io", "-c", "write -P 7 1M 3M", "-c", "write -z 5M 1M", "-c", "write -c -P 9 7M 64k",
    "-c", "write -P 3 %d 3000" % (10 * M), "in.qcow2"], src)
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512,extended_l2=off", "small.qcow2", str(M)], src)
sh(["qemu-io", "-c", "write -P 5 1000 7000", "small.qcow2"], src)
sh(["qemu-img", "convert", "-O", "raw", "in.qcow2", "in.raw"], src)


def info(d, f, fmt):
    rc, out, _ = run(["qemu-img", "info", "--output=json", "-f", fmt, f], d)
    if rc != 0:
        return None
    j = json.loads(out)
    return j["virtual-size"], j["format"]


def case(name, args, out="o", out_fmt="raw"):
    n = new_case()
    q, k = os.path.join(WORK, "q%d" % n), os.path.join(WORK, "k%d" % n)
    shutil.copytree(src, q)
    shutil.copytree(src, k)
    rq, rk = run_both(name, QK, "dd", args, q, k)
    qo, ko = os.path.join(q, out), os.path.join(k, out)
    if os.path.exists(qo) != os.path.exists(ko):
        bad(name, "output file exists: qemu-img %s, qcowkit %s" % (os.path.exists(qo), os.path.exists(ko)))
        return
    if not os.path.exists(qo):
        return
    if out_fmt == "raw" and os.path.getsize(qo) != os.path.getsize(ko):
        bad(name, "file size: qemu-img %d, qcowkit %d" % (os.path.getsize(qo), os.path.getsize(ko)))
    if info(q, out, out_fmt) != info(k, out, out_fmt):
        bad(name, "size/format: qemu-img %s, qcowkit %s" % (info(q, out, out_fmt), info(k, out, out_fmt)))
    rc, o, e = run(["qemu-img", "compare", "-f", out_fmt, "-F", out_fmt, qo, ko])
    if rc != 0:
        bad(name, "outputs read differently: %s%s" % (o, e))
    if out_fmt == "qcow2":
        rc, o, _ = run(["qemu-img", "check", ko])
        if rc != 0:
            bad(name, "qemu-img check: %s" % o.strip())


case("whole image", ["if=in.qcow2", "of=o"])
case("bs=1M count=4 skip=1", ["bs=1M", "count=4", "skip=1", "if=in.qcow2", "of=o"])
case("bs=64k skip=3", ["bs=64k", "skip=3", "if=in.qcow2", "of=o"])
case("-O qcow2 bs=64k count=100", ["-O", "qcow2", "bs=64k", "count=100", "if=in.qcow2", "of=o"], out_fmt="qcow2")
case("-O qcow2, whole image", ["-O", "qcow2", "if=in.qcow2", "of=o"], out_fmt="qcow2")
case("bs=3 count=5 (odd sizes)", ["bs=3", "count=5", "if=in.qcow2", "of=o"])
case("bs=1000 skip=1 count=9", ["bs=1000", "skip=1", "count=9", "if=small.qcow2", "of=o"])
case("unaligned skip into a small-cluster image", ["bs=777", "skip=2", "-O", "qcow2", "if=small.qcow2", "of=o"],
     out_fmt="qcow2")
case("count=0", ["count=0", "if=in.qcow2", "of=o"])
case("skip past the end", ["bs=1M", "skip=20", "if=in.qcow2", "of=o"])
case("skip past count", ["bs=1M", "skip=3", "count=2", "if=in.qcow2", "of=o"])
case("raw input", ["-f", "raw", "bs=4k", "skip=100", "if=in.raw", "of=o"])
case("-f raw on a qcow2 input", ["-f", "raw", "if=in.qcow2", "of=o"])
case("the last if= counts", ["if=nope", "if=in.qcow2", "of=o"])
case("output replaced", ["bs=1M", "count=1", "if=in.qcow2", "of=in.raw"], out="in.raw")
case("-U", ["-U", "if=in.qcow2", "of=o"])
for args in (["if=in.qcow2"], ["of=o"], ["bs=0", "if=in.qcow2", "of=o"], ["bs=3G", "if=in.qcow2", "of=o"],
             ["bs=abc", "if=in.qcow2", "of=o"], ["count=-1", "if=in.qcow2", "of=o"],
             ["skip=x", "if=in.qcow2", "of=o"], ["foo=1", "if=in.qcow2", "of=o"],
             ["bogus", "if=in.qcow2", "of=o"], ["conv=notrunc", "if=in.qcow2", "of=o"],
             ["if=nope", "of=o"], ["-O", "bogus", "if=in.qcow2", "of=o"], ["-f", "bogus", "if=in.qcow2", "of=o"]):
    case("error: %s" % " ".join(args), args)

finish()
