#!/usr/bin/env python3
"""qcowkit compare against qemu-img compare (compare.sh): both tools on the
same images (made by qemu-img/qemu-io: qcow2 with 512 B, 64 KiB and 2 MiB
clusters, extended L2, raw, backing chains, zero clusters, images of
different sizes); the same exit status and messages (program name aside,
progress redraws taken out), in plain and strict (-s) mode.
Usage: compare.py QCOWKIT WORKDIR
"""
import os
import re
import sys

from twin import finish, new_case, random_chain, run_both, same_name, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20


def norm(t):
    # The progress line's redraws depend on the walk's steps (and text
    # mode reads their \r as \n); what is printed around it must match.
    return re.sub(r" *\(\d+\.\d\d/100%\)[\r\n]", "", same_name(t))


def img(name, size, cmds=(), fmt="qcow2", opts=None, backing=None, bfmt="qcow2"):
    args = ["qemu-img", "create", "-q", "-f", fmt]
    if opts:
        args += ["-o", opts]
    if backing:
        args += ["-b", backing, "-F", bfmt]
    sh(args + [name, str(size)], WORK)
    for c in cmds:
        sh(["qemu-io", "-f", fmt, "-c", c, name], WORK)
    return name


def case(name, args, modes=("", "-s")):
    for m in modes:
        new_case()
        a = ([m] if m else []) + args
        run_both("%s%s" % (name, " " + m if m else ""), QK, "compare", a, WORK, WORK, norm=norm)


# Plain data, the same content laid out differently, and raw copies.
img("a.qcow2", 8 * M, ["write -P 1 0 3M", "write -P 2 5M 1M"])
img("a2.qcow2", 8 * M, ["write -P 2 5M 1M", "write -P 1 2M 1M", "write -P 1 0 2M"])
sh(["qemu-img", "convert", "-O", "raw", "a.qcow2", "a.raw"], WORK)
sh(["qemu-img", "convert", "-S", "0", "-O", "raw", "a.qcow2", "a-full.raw"], WORK)
case("identical qcow2/qcow2", ["a.qcow2", "a2.qcow2"])
case("same image twice", ["a.qcow2", "a.qcow2"])
case("identical qcow2/raw", ["a.qcow2", "a.raw"])
case("identical raw/raw (sparse vs full)", ["a.raw", "a-full.raw"])
case("identical, -f/-F given", ["-f", "qcow2", "-F", "raw", "a.qcow2", "a.raw"])

# One byte changed: first, inside a cluster, a cluster edge, the middle, the last.
for off in (0, 1, 511, 512, 65535, 65536, 1234567, 4 * M, 5 * M + 77, 8 * M - 1):
    n = img("m%d.qcow2" % off, 8 * M, ["write -P 1 0 3M", "write -P 2 5M 1M", "write -P 9 %d 1" % off])
    case("byte %d differs" % off, ["a.qcow2", n])
    case("byte %d differs (reversed)" % off, [n, "a.qcow2"], modes=("",))
case("raw vs changed qcow2", ["a.raw", "m1234567.qcow2"])
case("two mismatches, the first wins", ["m65536.qcow2", "m1234567.qcow2"])

# Zeros three ways: unallocated, zero clusters, explicit zero data.
img("z-unalloc.qcow2", 4 * M)
img("z-cluster.qcow2", 4 * M, ["write -z 0 4M"])
img("z-data.qcow2", 4 * M, ["write -P 0 0 4M"])
img("z-mixed.qcow2", 4 * M, ["write -z 1M 1M", "write -P 0 3M 64k"])
img("z.raw", 4 * M, fmt="raw")
for x, y in (("z-unalloc", "z-cluster"), ("z-unalloc", "z-data"), ("z-cluster", "z-data"),
             ("z-mixed", "z-unalloc"), ("z-mixed", "z-data")):
    case("zeros: %s vs %s" % (x, y), [x + ".qcow2", y + ".qcow2"])
case("zeros: raw vs zero clusters", ["z.raw", "z-cluster.qcow2"])
case("zeros: data at 3M+5 vs unallocated", ["z-unalloc.qcow2", img("z-one.qcow2", 4 * M, ["write -P 3 3145733 1"])])

# Different sizes: the extra part reads as zeros or not.
img("s4.qcow2", 4 * M, ["write -P 1 0 1M"])
img("s6.qcow2", 6 * M, ["write -P 1 0 1M"])
img("s6z.qcow2", 6 * M, ["write -P 1 0 1M", "write -z 4M 2M"])
img("s6d.qcow2", 6 * M, ["write -P 1 0 1M", "write -P 5 %d 3" % (5 * M + 4097)])
img("s6e.qcow2", 6 * M, ["write -P 1 0 1M", "write -P 5 %d 1" % (6 * M - 1)])
img("s6m.qcow2", 6 * M, ["write -P 1 0 1M", "write -P 5 2M 1", "write -P 5 5M 1"])
for big in ("s6", "s6z", "s6d", "s6e", "s6m"):
    case("sizes: s4 vs %s" % big, ["s4.qcow2", big + ".qcow2"])
    case("sizes: %s vs s4" % big, [big + ".qcow2", "s4.qcow2"], modes=("",))
img("s4.raw", 4 * M, ["write -P 1 0 1M"], fmt="raw")
case("sizes: raw s4 vs s6d", ["s4.raw", "s6d.qcow2"])

# Strict mode: runs that end at the image's end, L2-table boundaries.
img("e1.qcow2", 4 * M, ["write -P 1 0 1M"])
img("e2.qcow2", 4 * M, ["write -P 1 0 1M", "write -P 1 3M 1M"])
img("e3.qcow2", 700 * M, ["write -P 1 0 1M"])
img("e4.qcow2", 700 * M, ["write -P 1 0 1M", "write -P 1 699M 1M"])
case("status: run to the end vs not", ["e1.qcow2", "e2.qcow2"])
case("status: across an L2 table", ["e3.qcow2", "e4.qcow2"])
case("status: raw vs qcow2", ["s4.raw", "s4.qcow2"])

# Cluster sizes and extended L2.
for opts in ("cluster_size=512", "cluster_size=2M", "cluster_size=64k,extended_l2=on",
             "cluster_size=2M,extended_l2=on"):
    tag = opts.replace("cluster_size=", "").replace(",extended_l2=on", "-ext")
    p = img("c%s-a.qcow2" % tag, 6 * M, ["write -P 4 1000 7000", "write -z 1M 512k", "write -P 6 3M 1M"],
            opts=opts)
    q = img("c%s-b.qcow2" % tag, 6 * M, ["write -P 4 1000 7000", "write -P 0 1M 512k", "write -P 6 3M 1M"],
            opts=opts)
    r = img("c%s-c.qcow2" % tag, 6 * M, ["write -P 4 1000 7000", "write -P 6 3M 1M", "write -P 7 %d 1" % (3 * M + 4000)],
            opts=opts)
    case("clusters %s: zero vs data zeros" % tag, [p, q])
    case("clusters %s: one byte" % tag, [p, r])
    case("clusters %s: vs 64k default" % tag, [p, "a.qcow2"], modes=("",))

# Backing chains: content through the chain, shorter backing files.
img("b-base.qcow2", 4 * M, ["write -P 1 0 4M"])
img("b-top.qcow2", 6 * M, ["write -P 2 1M 64k"], backing="b-base.qcow2")
img("b-flat.qcow2", 6 * M, ["write -P 1 0 4M", "write -P 2 1M 64k"])
img("b-flat2.qcow2", 6 * M, ["write -P 1 0 4M", "write -P 2 1M 64k", "write -z 4M 2M"])
img("b-flat3.qcow2", 6 * M, ["write -P 1 0 4M", "write -P 2 1M 64k", "write -P 3 %d 1" % (4 * M + 512)])
img("b-empty.qcow2", 2 * M)
img("b-mid.qcow2", 3 * M, backing="b-empty.qcow2")
img("b-top2.qcow2", 4 * M, backing="b-mid.qcow2")
img("b-zero.qcow2", 4 * M)
img("b-raw.raw", 4 * M, ["write -P 1 0 4M"], fmt="raw")
img("b-top3.qcow2", 4 * M, ["write -z 0 1M"], backing="b-raw.raw", bfmt="raw")
img("b-flat4.qcow2", 4 * M, ["write -P 1 1M 3M"])
case("chain vs flat", ["b-top.qcow2", "b-flat.qcow2"])
case("chain vs flat with zero clusters past the backing", ["b-top.qcow2", "b-flat2.qcow2"])
case("chain vs flat, data past the backing", ["b-top.qcow2", "b-flat3.qcow2"])
case("chain vs its base", ["b-top.qcow2", "b-base.qcow2"])
case("empty three-layer chain vs empty image", ["b-top2.qcow2", "b-zero.qcow2"])
case("chain over raw", ["b-top3.qcow2", "b-flat4.qcow2"])
for seed in range(3):
    layers = random_chain(1000 + seed)
    prev = None
    for f, size, opts, cmds in layers:
        f = "r%d-%s" % (seed, f)
        img(f, size, cmds, opts=opts, backing=prev)
        prev = f
    sh(["qemu-img", "convert", "-O", "qcow2", prev, "r%d-flat.qcow2" % seed], WORK)
    sh(["qemu-img", "convert", "-O", "raw", prev, "r%d-flat.raw" % seed], WORK)
    case("random chain %d vs converted" % seed, [prev, "r%d-flat.qcow2" % seed])
    case("random chain %d vs raw" % seed, [prev, "r%d-flat.raw" % seed])
    sh(["qemu-io", "-f", "raw", "-c", "write -P 222 %d 1" % (1 * M + 4321 * (seed + 1)), "r%d-flat.raw" % seed], WORK)
    case("random chain %d vs changed raw" % seed, [prev, "r%d-flat.raw" % seed], modes=("",))

# Options: -q, -p, -U, -T.
case("-q identical", ["-q", "a.qcow2", "a2.qcow2"])
case("-q mismatch", ["-q", "a.qcow2", "m1234567.qcow2"])
case("-q size warning", ["-q", "s4.qcow2", "s6.qcow2"])
case("-p identical", ["-p", "a.qcow2", "a2.qcow2"])
case("-p mismatch", ["-p", "a.qcow2", "m1234567.qcow2"])
case("-p sizes", ["-p", "s4.qcow2", "s6d.qcow2"])
case("-p -q", ["-p", "-q", "a.qcow2", "a2.qcow2"], modes=("",))
case("-U", ["-U", "a.qcow2", "a.raw"], modes=("",))
case("--force-share", ["--force-share", "a.qcow2", "a.raw"], modes=("",))
case("-T none", ["-T", "none", "a.qcow2", "m8388607.qcow2"], modes=("",))
case("-T writethrough", ["-T", "writethrough", "a.qcow2", "a.raw"], modes=("",))

# Errors.
for args in (["nope", "a.qcow2"], ["a.qcow2", "nope"], ["-f", "qcow2", "a.raw", "a.qcow2"],
             ["-F", "qcow2", "a.qcow2", "a.raw"], ["-f", "raw", "a.qcow2", "a.raw"],
             ["-f", "bogus", "a.qcow2", "a.raw"], ["-F", "bogus", "a.qcow2", "a.raw"],
             ["-T", "bogus", "a.qcow2", "a.raw"], ["-p", "-T", "bogus", "a.qcow2", "a.raw"],
             ["-p", "nope", "a.qcow2"], ["-q", "nope", "a.qcow2"],
             ["a.qcow2"], [], ["a.qcow2", "a.raw", "a2.qcow2"], ["-x", "a.qcow2", "a.raw"],
             ["--bogus", "a.qcow2", "a.raw"], ["a.qcow2", "a.raw", "-f"]):
    case("error: %s" % " ".join(args), args, modes=("",))

finish()
