#!/usr/bin/env python3
"""Differential test: seeded random operation sequences run through qemu-io
and `qcowkit io` on twin images must leave identical guest content, and the
qcowkit image must pass `qemu-img check`.

Usage: diffops.py QCOWKIT WORKDIR [--seeds N] [--first S]
Each seed picks an image layout (cluster size, refcount bits, extended L2,
backing file or not) and 5..60 operations: aligned and unaligned writes with
patterns, zero writes with and without unmap, discards and flushes.

With extended L2, qcowkit's discard makes the whole subclusters of a partly
covered cluster read as zeros, while QEMU 7.2's tools ignore discards of
partial clusters. There the qemu-io twin gets the operations with the same
defined result instead: a discard of the whole clusters in the range and a
zero write of the whole subclusters of the partly covered ones.
"""
import os
import random
import subprocess
import sys

def run(cmd, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("%s -> %d\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p

def gen_ops(rng, size, cluster):
    ops = []
    for _ in range(rng.randint(5, 60)):
        kind = rng.choices(["write", "zero", "zero_unmap", "discard", "flush"],
                           weights=[60, 12, 8, 12, 4])[0]
        if kind == "flush":
            ops.append("flush")
            continue
        if rng.random() < 0.5:
            # cluster-aligned
            n = rng.randint(1, 4)
            off = rng.randrange(0, size // cluster - n + 1) * cluster
            ln = n * cluster
        elif rng.random() < 0.5:
            # sector-aligned
            ln = rng.randint(1, 3 * cluster // 512 + 1) * 512
            off = rng.randrange(0, (size - ln) // 512 + 1) * 512
        else:
            # byte-granular
            ln = rng.randint(1, 3 * cluster)
            off = rng.randrange(0, size - ln + 1)
        if kind == "write":
            ops.append("write -P 0x%02x %d %d" % (rng.randint(1, 255), off, ln))
        elif kind == "zero":
            ops.append("write -z %d %d" % (off, ln))
        elif kind == "zero_unmap":
            ops.append("write -z -u %d %d" % (off, ln))
        else:
            ops.append("discard %d %d" % (off, ln))
    return ops

def io_args(ops):
    args = []
    for o in ops:
        args += ["-c", o]
    return args

def qemu_equivalent(op, size, cluster):
    """qemu-io commands with the result qcowkit's discard has on an image
    with extended L2 (other operations stay as they are)."""
    if not op.startswith("discard "):
        return [op]
    off, ln = (int(x) for x in op.split()[1:])
    sc = cluster // 32
    end = off + ln
    a = -(-off // sc) * sc
    b = -(-end // sc) * sc if end == size else end // sc * sc
    if a >= b:
        return []
    ca = min(-(-a // cluster) * cluster, b)
    cb = max(b // cluster * cluster, ca)
    out = []
    for verb, x, y in (("write -z", a, ca), ("discard", ca, cb), ("write -z", cb, b)):
        if x < y:
            out.append("%s %d %d" % (verb, x, y - x))
    return out

def one(qcowkit, work, seed):
    rng = random.Random(seed)
    cluster = rng.choice([512, 4096, 65536, 65536, 65536, 2 * 1024 * 1024])
    ext_l2 = cluster >= 16384 and rng.random() < 0.3
    refbits = rng.choice([1, 2, 4, 8, 16, 16, 16, 32, 64])
    size = rng.choice([1, 4, 16]) * 1024 * 1024
    if cluster == 2 * 1024 * 1024:
        size = 16 * 1024 * 1024
    backing = rng.random() < 0.35
    a = os.path.join(work, "a.qcow2")
    b = os.path.join(work, "b.qcow2")
    base = os.path.join(work, "base.qcow2")
    for f in (a, b, base):
        if os.path.exists(f):
            os.unlink(f)
    opts = "cluster_size=%d,refcount_bits=%d,extended_l2=%s" % (cluster, refbits, "on" if ext_l2 else "off")
    if backing:
        run(["qemu-img", "create", "-q", "-f", "qcow2", base, str(size)])
        run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5c 0 %d" % (size // 2),
             "-c", "write -z %d %d" % (size // 4, cluster), base])
        bopts = ["-b", base, "-F", "qcow2"]
    else:
        bopts = []
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts] + bopts + [a, str(size)])
    run([qcowkit, "create", "-q", "-f", "qcow2", "-o", opts] + bopts + [b, str(size)])
    ops = gen_ops(rng, size, cluster)
    qops = ops
    if ext_l2:
        # Never empty: qemu-io without -c would read commands from stdin.
        qops = [q for o in ops for q in qemu_equivalent(o, size, cluster)] or ["flush"]
    run(["qemu-io", "-f", "qcow2"] + io_args(qops) + [a])
    run([qcowkit, "io", "-f", "qcow2"] + io_args(ops) + [b])
    cmp = run(["qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", a, b], check=False)
    chk = run(["qemu-img", "check", "-f", "qcow2", b], check=False)
    if cmp.returncode != 0 or chk.returncode != 0:
        twin = "" if qops is ops else "\nqemu-io ops:\n  " + "\n  ".join(qops)
        return ("seed %d (%s, backing=%s, size=%d): compare=%d check=%d\n%s\n%s\nops:\n  %s%s" %
                (seed, opts, backing, size, cmp.returncode, chk.returncode,
                 cmp.stdout.strip(), chk.stdout.strip(), "\n  ".join(ops), twin))
    return None

def main():
    qcowkit, work = sys.argv[1], sys.argv[2]
    seeds, first = 200, 1
    args = sys.argv[3:]
    while args:
        if args[0] == "--seeds":
            seeds = int(args[1]); args = args[2:]
        elif args[0] == "--first":
            first = int(args[1]); args = args[2:]
        else:
            sys.exit("unknown argument " + args[0])
    failures = 0
    for seed in range(first, first + seeds):
        err = one(qcowkit, work, seed)
        if err:
            failures += 1
            print("FAIL", err)
            if failures >= 5:
                break
    print("%d sequences, %d failures" % (seed - first + 1, failures))
    sys.exit(1 if failures else 0)

if __name__ == "__main__":
    main()
