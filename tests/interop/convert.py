#!/usr/bin/env python3
"""qcowkit convert against qemu-img convert (convert.sh): the same inputs
(made by qemu-img/qemu-io: data, zero clusters, discards, backing chains,
random chains from twin.random_chain), each tool writing its own output.
Requires the same exit status and messages (program name aside, progress
reduced to its first and last state), outputs that read the same (qemu-img
compare), the same virtual size, format, cluster size and backing file,
and `qemu-img check` clean on our qcow2 outputs.
Usage: convert.py QCOWKIT WORKDIR
"""
import json
import os
import re
import shutil
import sys

from twin import bad, finish, new_case, random_chain, run, run_both, same_name, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20

src = os.path.join(WORK, "src")
os.makedirs(src)


def io(f, *cmds, fmt="qcow2"):
    sh(["qemu-io", "-f", fmt] + [a for c in cmds for a in ("-c", c)] + [f], src)


sh(["qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", str(8 * M)], src)
io("base.qcow2", "write -P 0x11 0 8M")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2", str(8 * M + 3072)], src)
io("top.qcow2", "write -P 7 1M 3M", "write -z 5M 1M", "discard 6M 512k", "write -P 3 %d 3072" % (8 * M),
   "write -P 0 7M 64k", "write -P 9 7340032 4096")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "other.qcow2", str(8 * M)], src)
io("other.qcow2", "write -P 0x22 0 8M")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", "small.qcow2", str(M)], src)
io("small.qcow2", "write -P 5 1000 7000", "write -z 100k 20k")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "empty1t.qcow2", "1T"], src)
sh(["qemu-img", "convert", "-O", "raw", "top.qcow2", "in.raw"], src)
sh(["qemu-img", "create", "-q", "-f", "raw", "big.raw", str(40 * M)], src)
sh(["qemu-img", "create", "-q", "-f", "qcow2", "big.qcow2", str(40 * M)], src)
io("big.qcow2", "write -P 0x44 0 40M")
chain = random_chain(1234)
prev = None
for f, size, opts, cmds in chain:
    c = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts]
    if prev:
        c += ["-b", prev, "-F", "qcow2"]
    sh(c + [f, str(size)], src)
    io(f, *cmds)
    prev = f
chain_top = prev
# A middle layer shorter than the base and the top: past its end the top
# reads zeros, not the base's 0x55.
sh(["qemu-img", "create", "-q", "-f", "qcow2", "mbase.qcow2", str(2 * M)], src)
io("mbase.qcow2", "write -P 0x55 0 2M")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "mbase.qcow2", "-F", "qcow2", "mmid.qcow2", str(M // 2)], src)
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "mmid.qcow2", "-F", "qcow2", "mtop.qcow2", str(2 * M)], src)
io("mtop.qcow2", "write -P 0x66 1536k 64k")
sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "mbase.qcow2", "-F", "qcow2", "mtarget.qcow2", str(2 * M)], src)
with open(os.path.join(src, "odd.raw"), "wb") as f:
    f.write(b"qcowkit compresses clusters; " * 40000)
# Internal snapshots (-l): s1 at 8M with 0x31, s2 after a rewrite and a
# growth to 12M, then the active disk changes again.
sh(["qemu-img", "create", "-q", "-f", "qcow2", "snap.qcow2", str(8 * M)], src)
io("snap.qcow2", "write -P 0x31 0 1M", "write -z 3M 1M")
sh(["qemu-img", "snapshot", "-c", "s1", "snap.qcow2"], src)
io("snap.qcow2", "write -P 0x32 512k 2M")
sh(["qemu-img", "resize", "-q", "snap.qcow2", str(12 * M)], src)
io("snap.qcow2", "write -P 0x33 10M 1M")
sh(["qemu-img", "snapshot", "-c", "s2", "snap.qcow2"], src)
io("snap.qcow2", "write -P 0x34 0 12M")


def norm(t):
    t = same_name(t)
    lines = t.split("\n")
    prog = [i for i, l in enumerate(lines) if re.fullmatch(r"    \(\d+\.\d\d/100%\)", l)]
    drop = set(prog[1:-1])
    return "\n".join(l for i, l in enumerate(lines) if i not in drop)


def info(d, f, fmt):
    rc, out, _ = run(["qemu-img", "info", "--output=json", "-U", "-f", fmt, f], d)
    if rc != 0:
        return None
    j = json.loads(out)
    return (j["virtual-size"], j["format"], j.get("cluster-size"), j.get("backing-filename"),
            j.get("backing-filename-format"))


def case(name, args, out="o", out_fmt="raw"):
    n = new_case()
    q, k = os.path.join(WORK, "q%d" % n), os.path.join(WORK, "k%d" % n)
    shutil.copytree(src, q)
    shutil.copytree(src, k)
    rq, rk = run_both(name, QK, "convert", args, q, k, norm)
    qo, ko = os.path.join(q, out), os.path.join(k, out)
    if os.path.exists(qo) != os.path.exists(ko):
        bad(name, "output exists: qemu-img %s, qcowkit %s" % (os.path.exists(qo), os.path.exists(ko)))
    elif rq[0] == 0 and os.path.exists(qo):
        iq, ik = info(q, out, out_fmt), info(k, out, out_fmt)
        if iq != ik:
            bad(name, "info: qemu-img %s, qcowkit %s" % (iq, ik))
        rc, o, e = run(["qemu-img", "compare", "-U", "-f", out_fmt, "-F", out_fmt, qo, ko], q)
        if rc != 0:
            bad(name, "outputs read differently: %s%s" % (o, e))
        if out_fmt == "qcow2":
            rc, o, _ = run(["qemu-img", "check", ko], k)
            if rc != 0:
                bad(name, "qemu-img check: %s" % o.strip())
    shutil.rmtree(q)
    shutil.rmtree(k)


Q = ["-O", "qcow2"]
case("qcow2->qcow2 (chain flattened)", Q + ["top.qcow2", "o"], out_fmt="qcow2")
case("qcow2->raw", ["top.qcow2", "o"])
case("raw->qcow2", Q + ["-f", "raw", "in.raw", "o"], out_fmt="qcow2")
case("raw->raw", ["in.raw", "o"])
case("random chain flattened", Q + [chain_top, "o"], out_fmt="qcow2")
case("random chain -> raw, -m 1", ["-m", "1", chain_top, "o"])
case("-B other", Q + ["-B", "other.qcow2", "-F", "qcow2", "top.qcow2", "o"], out_fmt="qcow2")
case("-B base of a random chain", Q + ["-B", chain[0][0], "-F", "qcow2", chain_top, "o"], out_fmt="qcow2")
case("-o backing_file", Q + ["-o", "backing_file=base.qcow2,backing_fmt=qcow2", "top.qcow2", "o"], out_fmt="qcow2")
case("several sources", Q + ["top.qcow2", "small.qcow2", "in.raw", "o"], out_fmt="qcow2")
case("several sources -> raw, -W", ["-W", "small.qcow2", "top.qcow2", "o"])
case("-n raw target", ["-n", "top.qcow2", "big.raw"], out="big.raw")
case("-n qcow2 target with data", Q + ["-n", "top.qcow2", "big.qcow2"], out="big.qcow2", out_fmt="qcow2")
case("-n --target-is-zero", Q + ["-n", "--target-is-zero", "small.qcow2", "big.qcow2"], out="big.qcow2",
     out_fmt="qcow2")
case("-n -B (top layer only)", Q + ["-n", "-B", "base.qcow2", "-F", "qcow2", "top.qcow2", "big.qcow2"],
     out="big.qcow2", out_fmt="qcow2")
case("-n -B without -F (nothing created)", Q + ["-n", "-B", "base.qcow2", "top.qcow2", "big.qcow2"],
     out="big.qcow2", out_fmt="qcow2")
case("-n -B into a raw target", ["-n", "-B", "base.qcow2", "top.qcow2", "big.raw"], out="big.raw")
case("-S 0", Q + ["-S", "0", "top.qcow2", "o"], out_fmt="qcow2")
case("-S 64k", Q + ["-S", "64k", "small.qcow2", "o"], out_fmt="qcow2")
case("-S 0 raw", ["-S", "0", "small.qcow2", "o"])
case("cluster_size=512", Q + ["-o", "cluster_size=512", "top.qcow2", "o"], out_fmt="qcow2")
case("cluster_size=2M", Q + ["-o", "cluster_size=2M", "top.qcow2", "o"], out_fmt="qcow2")
case("extended_l2=on", Q + ["-o", "extended_l2=on", "top.qcow2", "o"], out_fmt="qcow2")
case("compat=0.10", Q + ["-o", "compat=0.10,refcount_bits=16", "top.qcow2", "o"], out_fmt="qcow2")
case("two -o lists, lazy_refcounts", Q + ["-o", "cluster_size=4k", "-o", "lazy_refcounts=on", "top.qcow2", "o"],
     out_fmt="qcow2")
case("preallocation=metadata", Q + ["-o", "preallocation=metadata", "small.qcow2", "o"], out_fmt="qcow2")
case("empty 1T", Q + ["empty1t.qcow2", "o"], out_fmt="qcow2")
case("empty 1T -> raw", ["empty1t.qcow2", "o"])
case("-c", Q + ["-c", "top.qcow2", "o"], out_fmt="qcow2")
case("-c zstd, -B", Q + ["-c", "-o", "compression_type=zstd", "-B", "base.qcow2", "-F", "qcow2", "top.qcow2", "o"],
     out_fmt="qcow2")
case("-p", Q + ["-p", "top.qcow2", "o"], out_fmt="qcow2")
case("-q -p -t none -T writeback -U", Q + ["-q", "-p", "-t", "none", "-T", "writeback", "-U", "top.qcow2", "o"],
     out_fmt="qcow2")
case("output replaced", ["small.qcow2", "in.raw"], out="in.raw")
for l in ("s1", "1", "s2", "2", "snapshot.name=s1", "snapshot.id=2", "snapshot.id=1,snapshot.name=s1"):
    case("-l %s" % l, Q + ["-l", l, "snap.qcow2", "o"], out_fmt="qcow2")
case("-l s1 -> raw", ["-l", "s1", "snap.qcow2", "o"])
case("-l s1 -c", Q + ["-c", "-l", "s1", "snap.qcow2", "o"], out_fmt="qcow2")
case("-r 64M", Q + ["-r", "64M", "top.qcow2", "o"], out_fmt="qcow2")
case("--salvage, nothing damaged", Q + ["--salvage", "top.qcow2", "o"], out_fmt="qcow2")
case("-c from a raw file of 1,160,000 bytes", Q + ["-c", "-f", "raw", "odd.raw", "o"], out_fmt="qcow2")
for args in ([], ["top.qcow2"], ["nope", "o"], ["-O", "bogus", "top.qcow2", "o"], ["-f", "bogus", "top.qcow2", "o"],
             ["-c", "top.qcow2", "o"], ["-n", "top.qcow2", "missing"], ["-n", "top.qcow2", "small.qcow2"],
             Q + ["-o", "cluster_size=3", "top.qcow2", "o"], Q + ["-o", "bogus=1", "top.qcow2", "o"],
             ["-o", "cluster_size=4k", "top.qcow2", "o"], Q + ["-o", "", "top.qcow2", "o"],
             Q + ["-o", "lazy_refcounts=maybe", "top.qcow2", "o"], Q + ["-o", "size=abc", "top.qcow2", "o"],
             Q + ["-o", "compat=0.10,lazy_refcounts=on", "top.qcow2", "o"],
             Q + ["-o", "compat=0.11", "top.qcow2", "o"], Q + ["-o", "extended_l2=on,cluster_size=4k", "top.qcow2", "o"],
             Q + ["-o", "refcount_bits=3", "top.qcow2", "o"], Q + ["-o", "preallocation=bogus", "top.qcow2", "o"],
             Q + ["-o", "backing_fmt=qcow2", "top.qcow2", "o"], Q + ["-o", "backing_file=base.qcow2", "top.qcow2", "o"],
             Q + ["-c", "-o", "preallocation=falloc", "top.qcow2", "o"],
             ["-S", "abc", "top.qcow2", "o"], ["-S", "1000", "top.qcow2", "o"], ["-m", "0", "top.qcow2", "o"],
             ["-m", "17", "top.qcow2", "o"], ["-t", "bogus", "top.qcow2", "o"], ["-T", "bogus", "top.qcow2", "o"],
             ["-B", "base.qcow2", "top.qcow2", "o"], Q + ["-B", "base.qcow2", "top.qcow2", "o"],
             Q + ["-F", "qcow2", "top.qcow2", "o"], ["--target-is-zero", "top.qcow2", "o"],
             ["-n", "-o", "cluster_size=4k", "top.qcow2", "o"],
             Q + ["-n", "--target-is-zero", "-B", "base.qcow2", "-F", "qcow2", "top.qcow2", "big.qcow2"],
             ["-Z", "top.qcow2", "o"], ["--bogus", "top.qcow2", "o"], ["-O"],
             Q + ["top.qcow2", "top.qcow2"], Q + ["-n", "top.qcow2", "top.qcow2"],
             ["-l", "nope", "snap.qcow2", "o"], ["-l", "snapshot.name=nope", "snap.qcow2", "o"],
             ["-l", "snapshot.id=2,snapshot.name=s1", "snap.qcow2", "o"], ["-l", "", "snap.qcow2", "o"],
             ["-l", "snapshot.foo=1", "snap.qcow2", "o"], ["-l", "snapshot.id=1,x=2", "snap.qcow2", "o"],
             ["-l", "s1", "snap.qcow2", "top.qcow2", "o"], ["-l", "s1", "-f", "raw", "in.raw", "o"],
             ["-l", "s1", "top.qcow2", "o"], ["-r", "abc", "top.qcow2", "o"],
             # a backing file for a concatenation would lose what the later
             # sources' own backing files hold
             Q + ["-B", "base.qcow2", "-F", "qcow2", "top.qcow2", "top.qcow2", "o"],
             Q + ["-o", "backing_file=base.qcow2,backing_fmt=qcow2", "top.qcow2", "small.qcow2", "o"],
             ["-C", "-c", "top.qcow2", "o"], ["-C", "-S", "0", "top.qcow2", "o"],
             ["-C", "--salvage", "top.qcow2", "o"],
             Q + ["-o", "cluster_size=4k,", "top.qcow2", "o"], Q + ["-o", ",cluster_size=4k", "top.qcow2", "o"]):
    case("error: %s" % " ".join(args), args)


# qcowkit's own options (qemu-img 7.2 has none of them): the output must
# read as the source, and qemu-img must find it clean.
def own_case(name, args, srcimg, out_fmt="qcow2", expect_rc=0, expect_err=None, check=None, check_fail=None,
             out="o"):
    n = new_case()
    k = os.path.join(WORK, "k%d" % n)
    shutil.copytree(src, k)
    rc, o, e = run([QK, "convert"] + args + [srcimg, out], k)
    if rc != expect_rc:
        bad(name, "exit %d (expected %d): %s%s" % (rc, expect_rc, o, e))
    elif expect_err and expect_err not in e:
        bad(name, "stderr %r lacks %r" % (e, expect_err))
    elif rc != 0 and check_fail:
        check_fail(name, k)
    elif rc == 0:
        rc2, o2, e2 = run(["qemu-img", "compare", "-U", "-F", out_fmt, srcimg, out], k)
        if rc2 != 0:
            bad(name, "output reads differently from the source: %s%s" % (o2, e2))
        if out_fmt == "qcow2":
            rc2, o2, _ = run(["qemu-img", "check", out], k)
            if rc2 != 0:
                bad(name, "qemu-img check: %s" % o2.strip())
        if check:
            check(name, k)
    shutil.rmtree(k)


def compressed_share(d):
    rc, o, _ = run(["qemu-img", "check", "--output=json", "o"], d)
    j = json.loads(o)
    return j.get("compressed-clusters", 0) / max(1, j.get("allocated-clusters", 1))


def all_compressed(name, d):
    if compressed_share(d) < 0.9:
        bad(name, "only %.0f%% of the clusters are compressed" % (100 * compressed_share(d)))


own_case("--compress-level 19 zstd", Q + ["-c", "-o", "compression_type=zstd", "--compress-level", "19"], "big.qcow2",
         check=all_compressed)
own_case("--compress-level 1 zlib, --compress-threads 1", Q + ["-c", "--compress-level", "1", "--compress-threads", "1"],
         "big.qcow2", check=all_compressed)
own_case("--compress-level 9 zlib, --compress-threads 3", Q + ["-c", "--compress-level", "9", "--compress-threads", "3"],
         "top.qcow2")
own_case("--compress-level 12 on zlib", Q + ["-c", "--compress-level", "12"], "top.qcow2", expect_rc=1,
         expect_err="Invalid compression level 12 for zlib",
         check_fail=lambda name, d: os.path.exists(os.path.join(d, "o")) and bad(name, "an image was created"))
own_case("--compress-level 12, -n into a zlib image", Q + ["-n", "-c", "--compress-level", "12"], "small.qcow2",
         expect_rc=1, expect_err="Invalid compression level 12 for zlib", out="big.qcow2")
own_case("--compress-level 0", Q + ["-c", "--compress-level", "0"], "top.qcow2", expect_rc=1,
         expect_err="Invalid compression level '0'")
own_case("--compress-level 23", Q + ["-c", "--compress-level", "23"], "top.qcow2", expect_rc=1,
         expect_err="Invalid compression level '23'")
own_case("--compress-threads 0", Q + ["-c", "--compress-threads", "0"], "top.qcow2", expect_rc=1,
         expect_err="Invalid number of compression threads '0'")

# -B over a chain whose middle layer is shorter: the output reads as the
# source, zeros past the middle layer's end included (qemu-img 7.2 leaves
# the new backing file's data showing over part of that range).
own_case("-B base under a shorter middle layer", Q + ["-B", "mbase.qcow2", "-F", "qcow2"], "mtop.qcow2")
own_case("-n -B base under a shorter middle layer", Q + ["-n", "-B", "mbase.qcow2", "-F", "qcow2"], "mtop.qcow2",
         out="mtarget.qcow2")
own_case("-c -B base under a shorter middle layer", Q + ["-c", "-B", "mbase.qcow2", "-F", "qcow2"], "mtop.qcow2")


# The level reaches the compressor: zstd 19 packs words from a small
# vocabulary clearly tighter than zstd 1 (about 9% at 64k clusters).
def level_size(level):
    import random
    n = new_case()
    k = os.path.join(WORK, "k%d" % n)
    os.makedirs(k)
    r = random.Random(7)
    words = [bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(3000)]
    out = bytearray()
    while len(out) < 4 * M:
        out += r.choice(words) + b" "
    with open(os.path.join(k, "t.raw"), "wb") as f:
        f.write(bytes(out[:4 * M]))
    sh([QK, "convert", "-f", "raw", "-O", "qcow2", "-c", "-o", "compression_type=zstd",
        "--compress-level", str(level), "t.raw", "o"], k)
    size = os.path.getsize(os.path.join(k, "o"))
    shutil.rmtree(k)
    return size


s1, s19 = level_size(1), level_size(19)
if not s19 < s1 * 0.97:
    bad("--compress-level changes the output", "zstd level 19 gave %d bytes, level 1 %d" % (s19, s1))


# -c output sizes within 2% of qemu-img's for the same data, cluster size
# and compression type (6 MiB of words from a small vocabulary, 2 MiB of
# random bytes that stay uncompressed).
def size_cases():
    import random
    n = new_case()
    k = os.path.join(WORK, "k%d" % n)
    os.makedirs(k)
    r = random.Random(11)
    words = [bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(3000)]
    out = bytearray()
    while len(out) < 6 * M:
        out += r.choice(words) + b" "
    with open(os.path.join(k, "mix.raw"), "wb") as f:
        f.write(bytes(out[:6 * M]) + r.randbytes(2 * M))
    for cs in ("4k", "64k", "2M"):
        for ct in ("zlib", "zstd"):
            sizes = []
            for tool in ("qemu-img", QK):
                o = os.path.join(k, "o.qcow2")
                if os.path.exists(o):
                    os.unlink(o)
                sh([tool, "convert", "-c", "-f", "raw", "-O", "qcow2", "-o",
                    "cluster_size=%s,compression_type=%s" % (cs, ct), "mix.raw", "o.qcow2"], k)
                sizes.append(os.path.getsize(o))
            if abs(sizes[1] - sizes[0]) > 0.02 * sizes[0]:
                bad("-c size, %s clusters, %s" % (cs, ct), "qemu-img %d bytes, qcowkit %d" % tuple(sizes))
    shutil.rmtree(k)


size_cases()


# -r: the copy takes at least as long as the rate allows (a lower bound
# only: a loaded machine may make it slower, never faster).
def rate_case():
    import time
    n = new_case()
    k = os.path.join(WORK, "k%d" % n)
    shutil.copytree(src, k)
    t0 = time.monotonic()
    rc, o, e = run([QK, "convert", "-O", "qcow2", "-r", "20M", "-m", "4", "big.qcow2", "o"], k)
    dt = time.monotonic() - t0
    # 40 MiB of data at 20 MiB/s, less the limiter's 0.1 s of burst credit.
    if rc != 0 or dt < 1.8:
        bad("-r 20M on 40 MiB", "exit %d after %.2f s (at least 1.9 s expected): %s" % (rc, dt, e))
    shutil.rmtree(k)


rate_case()

finish()
