#!/usr/bin/env python3
"""qcowkit measure against qemu-img measure (measure.sh): --size over a
range of sizes, cluster sizes, refcount widths, extended L2 entries,
preallocation modes and compat levels, raw and qcow2 output; input images
made by qemu-img/qemu-io (empty, scattered writes, zero clusters, a
backing chain, raw with holes, compressed clusters, preallocated metadata,
persistent bitmaps, odd sizes); human and JSON output; every error.
Measure writes nothing, so both tools run on the same files.
Usage: measure.py QCOWKIT WORKDIR
"""
import os
import random
import sys

from twin import finish, new_case, run_both, sh

QK, WORK = sys.argv[1], sys.argv[2]
K, M, G, T, P = 1 << 10, 1 << 20, 1 << 30, 1 << 40, 1 << 50

src = os.path.join(WORK, "src")
os.makedirs(src)


def create(name, size, opts=None, fmt="qcow2", backing=None):
    cmd = ["qemu-img", "create", "-q", "-f", fmt]
    if opts:
        cmd += ["-o", opts]
    if backing:
        cmd += ["-b", backing, "-F", "qcow2"]
    sh(cmd + [name, str(size)], src)


def io(name, *cmds, fmt="qcow2"):
    args = ["qemu-io", "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    sh(args + [name], src)


rng = random.Random(7)


def scattered(name, size, n, fmt="qcow2"):
    """n writes of random length at random (often unaligned) offsets."""
    cmds = []
    for _ in range(n):
        ln = rng.choice([512, 4096, 65536, 200000, M])
        off = rng.randrange(0, size - ln) & ~511
        cmds.append("write -P %d %d %d" % (rng.randint(1, 255), off, ln))
    io(name, *cmds, fmt=fmt)


create("empty.qcow2", G)
create("part.qcow2", 64 * M)
scattered("part.qcow2", 64 * M, 20)
create("part512.qcow2", 8 * M, "cluster_size=512")
scattered("part512.qcow2", 8 * M, 15)
create("ext.qcow2", 16 * M, "extended_l2=on")
io("ext.qcow2", "write -P 1 4096 4096", "write -P 2 %d 2048" % (5 * M + 100 * 512), "write -P 3 8M 1M")
create("zero.qcow2", 16 * M)
io("zero.qcow2", "write -P 1 0 4M", "write -z 1M 2M", "write -z 8M 1M", "write -P 2 12M 64k",
   "write -z 12M 4k")
create("base.qcow2", 8 * M)
io("base.qcow2", "write -P 1 0 4M", "write -P 2 6M 512")
create("top.qcow2", 12 * M, backing="base.qcow2")
io("top.qcow2", "write -P 3 2M 1M", "write -z 0 1M", "write -P 4 10M 4k")
create("hole.raw", 32 * M, fmt="raw")
io("hole.raw", "write -P 1 1M 4k", "write -P 2 5M 1M", "write -P 3 %d 3000" % (20 * M + 777), fmt="raw")
sh(["truncate", "-s", str(10 * M + 3000), "trunc.raw"], src)
io("trunc.raw", "write -P 5 %d 512" % (10 * M), fmt="raw")
create("comp.qcow2", 8 * M)
io("comp.qcow2", "write -c -P 9 0 64k", "write -c -P 8 1M 64k", "write -P 7 3M 4k")
create("pmeta.qcow2", 8 * M, "preallocation=metadata")
io("pmeta.qcow2", "write -P 1 1M 4k")
# Around the point where qemu-img starts to trust host holes in a
# metadata-preallocated image (it depends on how much the host stores).
for k in (110, 116, 117):
    create("pm%d.qcow2" % k, 8 * M, "preallocation=metadata")
    io("pm%d.qcow2" % k, "write -P 1 0 512", "write -P 2 64k %d" % (k * 64 * K))
create("odd.qcow2", 10 * M + 3000)
io("odd.qcow2", "write -P 1 %d 3000" % (10 * M), "write -P 2 0 512")
create("v2.qcow2", 4 * M, "compat=0.10")
io("v2.qcow2", "write -P 1 0 1M")
create("bm.qcow2", 3 * G + 12345)
io("bm.qcow2", "write -P 1 0 1M")
for name, gran in (("a", "512"), ("b" * 100, "64k"), ("c", "2M"), ("dirty", "4k")):
    sh(["qemu-img", "bitmap", "--add", "-g", gran, "bm.qcow2", name], src)
create("snap.qcow2", 4 * M)
io("snap.qcow2", "write -P 1 0 1M")
sh(["qemu-img", "snapshot", "-c", "sn1", "snap.qcow2"], src)
io("snap.qcow2", "write -P 2 2M 2M")
sh(["qemu-img", "snapshot", "-c", "sn2", "snap.qcow2"], src)
io("snap.qcow2", "discard 0 4M")


def case(name, args):
    new_case()
    run_both(name, QK, "measure", args, src, src)


# --size: sizes around cluster, L2 and L1 boundaries (and qcow2's L1 limit)
# for each cluster size and refcount width.
sizes = [0, 1, 511, 512, 513, 65535, 65536, 65537, M, M + 1, 3 * 5 * 7 * 11 * 13 * 17 * 19 * 23,
         G - 1, G, T, T + 12345, 128 * G, 128 * G + 1, 2 * P, 2 * P + 1]
for cs in (512, 4 * K, 64 * K, 2 * M):
    for rb in (1, 16, 64):
        for s in sizes:
            case("--size %d cluster_size=%d refcount_bits=%d" % (s, cs, rb),
                 ["-O", "qcow2", "--size", str(s), "-o", "cluster_size=%d,refcount_bits=%d" % (cs, rb)])
for cs in (1 * K, 8 * K, 16 * K, 32 * K, 128 * K, 256 * K, 512 * K, M):
    for s in (0, 1, 7 * M + 5, 100 * G):
        case("--size %d cluster_size=%d" % (s, cs), ["-O", "qcow2", "--size", str(s), "-o", "cluster_size=%d" % cs])
for rb in (2, 4, 8, 32):
    case("refcount_bits=%d" % rb, ["-O", "qcow2", "--size", "1T", "-o", "refcount_bits=%d,cluster_size=4k" % rb])
for cs in (16 * K, 64 * K, 2 * M):
    for s in (0, 1, 16 * M, 10 * G + 1, 64 * T, 64 * T + 1, P):
        case("extended_l2 --size %d cluster_size=%d" % (s, cs),
             ["-O", "qcow2", "--size", str(s), "-o", "extended_l2=on,cluster_size=%d" % cs])
for pa in ("off", "metadata", "falloc", "full"):
    for extra in ("", ",cluster_size=512", ",extended_l2=on", ",compat=0.10"):
        case("preallocation=%s%s" % (pa, extra), ["-O", "qcow2", "--size", "5G", "-o", "preallocation=" + pa + extra])
        case("raw preallocation=%s" % pa, ["--size", "5G", "-O", "raw", "-o", "preallocation=" + pa])
for s in ("0", "1", "511", "513", "1k", "64k", "1.5M", "1G", "1T", "5P", "0x10", "010", "1b", "5.k", " +7",
          "7.99E", "0.0001k"):
    case("raw --size %r" % s, ["--size", s])
    case("raw --size %r json" % s, ["--size", s, "--output=json", "-O", "raw"])
case("qcow2 json", ["-O", "qcow2", "--size", "1G", "--output=json"])
case("qcow2 human explicit", ["--output=human", "-O", "qcow2", "--size", "1G"])
case("last --size counts", ["-O", "qcow2", "--size", "1G", "--size", "2G"])
case("last -O counts", ["-O", "raw", "-O", "qcow2", "--size", "1G"])
case("two -o lists", ["-O", "qcow2", "-o", "cluster_size=512", "-o", "cluster_size=4k", "--size", "1G"])
case("ignored options", ["-O", "qcow2", "--size", "1G", "-o",
                         "size=5G,lazy_refcounts=on,compression_type=zstd,backing_file=x,backing_fmt=raw,"
                         "encryption=off,data_file=d,compat=1.1"])
case("bare boolean", ["-O", "qcow2", "--size", "1G", "-o", "extended_l2"])
case("compat=0.10 extended_l2", ["-O", "qcow2", "--size", "1G", "-o", "compat=0.10,extended_l2=on"])
case("hex refcount_bits", ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=0x8"])

# Input images, to qcow2 with several layouts, to raw, human and JSON.
inputs = ["empty.qcow2", "part.qcow2", "part512.qcow2", "ext.qcow2", "zero.qcow2", "base.qcow2", "top.qcow2",
          "hole.raw", "trunc.raw", "comp.qcow2", "pmeta.qcow2", "odd.qcow2", "v2.qcow2", "bm.qcow2", "snap.qcow2",
          "pm110.qcow2", "pm116.qcow2", "pm117.qcow2"]
layouts = [[], ["-o", "cluster_size=512"], ["-o", "cluster_size=4k,refcount_bits=1"], ["-o", "cluster_size=2M"],
           ["-o", "extended_l2=on"], ["-o", "preallocation=full"], ["-o", "preallocation=metadata"],
           ["-o", "compat=0.10"]]
for f in inputs:
    for lay in layouts:
        case("%s -O qcow2 %s" % (f, " ".join(lay)), ["-O", "qcow2"] + lay + [f])
    case("%s json" % f, ["-O", "qcow2", "--output=json", f])
    case("%s -O raw" % f, [f])
    case("%s -O raw json" % f, ["--output=json", "-O", "raw", f])
case("-f raw on qcow2", ["-f", "raw", "-O", "qcow2", "top.qcow2"])
case("-f qcow2 explicit", ["-f", "qcow2", "-O", "qcow2", "bm.qcow2"])
case("-U", ["-U", "-O", "qcow2", "part.qcow2"])
case("-o backing_file: every cluster counted", ["-O", "qcow2", "-o", "backing_file=part.qcow2,backing_fmt=qcow2", "top.qcow2"])
case("-o backing_file with --size", ["-O", "qcow2", "-o", "backing_file=part.qcow2", "--size", "1G"])
for l in ("sn1", "1", "sn2", "2", "snapshot.name=sn1", "snapshot.id=2", "snapshot.id=1,snapshot.name=sn1"):
    case("-l %s" % l, ["-l", l, "-O", "qcow2", "--output=json", "snap.qcow2"])
    case("-l %s -> raw" % l, ["-l", l, "snap.qcow2"])

# Errors, in the order qemu-img checks them.
errors = [
    [],
    ["-O", "qcow2"],
    ["--size", "1G", "part.qcow2"],
    ["part.qcow2", "top.qcow2"],
    ["--size", "1G", "-f", "qcow2"],
    ["--size", "1G", "-l", "sn1"],
    ["-f", "qcow2"],
    ["--size", "abc"], ["--size", "-1"], ["--size", ""], ["--size", "1kb"], ["--size", "1.5"], ["--size", "1e3"],
    ["--size", "8E"], ["--size", "9E"], ["--size", "16E"], ["--size", "18446744073709551616"],
    ["--size", "0x"], ["--size", ".5k"], ["--size", "1 "],
    ["--output=xml", "--size", "1G"], ["--size", "abc", "--output=xml"],
    ["-o", ",", "--size", "1G"], ["-o", "", "--size", "1G"], ["-o", "cluster_size=512,", "-O", "qcow2", "--size", "1G"],
    ["nofile"], ["-O", "bogus", "nofile"], ["-O", "qcow2", "-o", "foo=1", "nofile"],
    ["-f", "bogus", "hole.raw"], ["-f", "qcow2", "hole.raw"],
    ["-O", "bogus", "--size", "1G", "-o", "foo"], ["-O", "vmdk", "--size", "1G"], ["-O", "qcow", "--size", "1G"],
    ["-O", "file", "--size", "1G"],
    ["--size", "1G", "-o", "cluster_size=512"], ["--size", "1G", "-o", "foo=1"], ["--size", "1G", "-o", "help"],
    ["--size", "1G", "-o", "size=abc"],
    ["-O", "qcow2", "--size", "1G", "-o", "help"],
    ["-O", "qcow2", "--size", "1G", "-o", "foo=1"],
    ["-O", "qcow2", "--size", "1G", "-o", "=4"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=abc"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=4k,,refcount_bits=8"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=abc"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=16k"],
    ["-O", "qcow2", "--size", "1G", "-o", "extended_l2=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "lazy_refcounts=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=3"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=0"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=4M"],
    ["-O", "qcow2", "--size", "1G", "-o", "cluster_size=1.5k"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=3"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=0"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=128"],
    ["-O", "qcow2", "--size", "1G", "-o", "compat=bogus"], ["-O", "qcow2", "--size", "1G", "-o", "compat=v3"],
    ["-O", "qcow2", "--size", "1G", "-o", "compat=0.10,refcount_bits=8"],
    ["-O", "qcow2", "--size", "1G", "-o", "preallocation=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "extended_l2=on,cluster_size=4k"],
    ["-O", "qcow2", "--size", "1G", "-o", "extended_l2=on,cluster_size=4k,refcount_bits=3,compat=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "preallocation=bogus,compat=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "preallocation=bogus,refcount_bits=3"],
    ["-O", "qcow2", "--size", "1G", "-o", "refcount_bits=3,compat=bogus"],
    ["-O", "qcow2", "--size", "1G", "-o", "compat=0.10,refcount_bits=8,preallocation=bogus"],
    ["-O", "qcow2", "--size", "5P"], ["-O", "qcow2", "--size", "8191P"],
    ["-O", "qcow2", "--size", "4T", "-o", "cluster_size=512"],
    ["-O", "qcow2", "--size", "256T", "-o", "extended_l2=on,cluster_size=16k"],
    ["-O", "qcow2", "-o", "cluster_size=3", "part.qcow2"],
    ["-l", "nosuch", "snap.qcow2"], ["-l", "snapshot.name=nosuch", "snap.qcow2"], ["-l", "x", "hole.raw"],
    ["-l", "snapshot.id=2,snapshot.name=sn1", "snap.qcow2"], ["-l", "snapshot.x=1", "snap.qcow2"],
    ["-l", "", "snap.qcow2"], ["-l", "snapshot.id=1,y", "snap.qcow2"],
    ["-O", "qcow2", "-o", "encrypt.format=luks", "--size", "1G"],
]
for args in errors:
    case("error: %s" % " ".join(repr(a) for a in args), args)

finish()
