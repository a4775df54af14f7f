#!/usr/bin/env python3
"""A repair interrupted at any point leaves an image no worse than before.

For each damage kind (damage.py): records every write, truncate and flush
`qcowkit check -r all` makes (strace on the threads backend), then replays
crash states onto the damaged image: every prefix of the writes, and for
the writes after the last flush (which the disk may have taken in any
order) subsets with some of them missing. Each crash state must be judged
by qemu-img check no worse than the damaged image (exit status 0 < 3 < 2
< 1, then corruptions other than OFLAG_COPIED ones: while a shared
cluster's refcount is raised to 2 the flag disagrees with it for a moment,
as it disagreed with the wrong refcount before), and read back (active image and every snapshot,
512 bytes at a time) as the damaged image or as the finished repair does.

Usage: repair_crash.py QCOWKIT WORKDIR [--seeds N] [--kinds a,b] [--max-states N]
"""
import argparse
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import damage  # noqa: E402
from repair import RANK, read_view, sh  # noqa: E402

LINE = re.compile(r'^\d+\s+(pwritev|pwrite64|fdatasync|fsync|ftruncate)\((\d+)<([^>]*)>(.*)\) = (-?\d+)')
IOV = re.compile(r'iov_base="((?:\\x[0-9a-f]{2})*)"')


def qemu_check(path):
    """(exit status, corruptions other than OFLAG_COPIED disagreements, leaks)."""
    import json
    p = sh(["qemu-img", "check", "--output=json", path])
    try:
        j = json.loads(p.stdout)
    except ValueError:
        j = {}
    copied = sum(1 for line in p.stderr.splitlines() if "OFLAG_COPIED" in line)
    return p.returncode, j.get("corruptions", 0) - copied, j.get("leaks", 0)


def unhex(s):
    return bytes.fromhex(s.replace("\\x", ""))


def trace_repair(qk, path, work):
    out = os.path.join(work, "trace.txt")
    env = dict(os.environ, QCOWKIT_AIO="threads")
    subprocess.run(["strace", "-f", "-qq", "-y", "-xx", "-s", "100000000", "-o", out,
                    "-e", "trace=pwritev,pwrite64,fdatasync,fsync,ftruncate",
                    qk, "check", "-r", "all", path],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=300)
    want = os.path.realpath(path).encode()
    ops = []
    with open(out) as f:
        for line in f:
            m = LINE.match(line)
            if not m or unhex(m.group(3)) != want or int(m.group(5)) < 0:
                continue
            call, rest = m.group(1), m.group(4)
            if call in ("fdatasync", "fsync"):
                ops.append(("sync",))
            elif call == "ftruncate":
                ops.append(("trunc", int(rest.strip(", "))))
            elif call == "pwritev":
                data = b"".join(unhex(b) for b in IOV.findall(rest))
                off = int(rest.rsplit(",", 1)[1])
                ops.append(("write", off, data))
            else:
                data = unhex(re.search(r'"((?:\\x[0-9a-f]{2})*)"', rest).group(1))
                ops.append(("write", int(rest.rsplit(",", 1)[1]), data))
    os.unlink(out)
    return ops


def apply(base, ops):
    img = bytearray(base)
    for op in ops:
        if op[0] == "write":
            off, data = op[1], op[2]
            if len(img) < off + len(data):
                img += bytes(off + len(data) - len(img))
            img[off:off + len(data)] = data
        elif op[0] == "trunc":
            del img[op[1]:]
            if len(img) < op[1]:
                img += bytes(op[1] - len(img))
    return bytes(img)


def crash_states(ops, rng, max_states):
    """Lists of ops that may have reached the disk at a crash."""
    states = []
    done = []       # ops made durable by a flush
    epoch = []      # ops since the last flush
    for op in ops + [("sync",)]:
        if op[0] == "sync":
            # Any subset of the epoch may be on disk; prefixes, and each
            # single op of it missing.
            for n in range(len(epoch) + 1):
                states.append(done + epoch[:n])
            for i in range(len(epoch)):
                states.append(done + epoch[:i] + epoch[i + 1:])
            done = done + epoch
            epoch = []
        else:
            epoch.append(op)
    if len(states) > max_states:
        keep = [states[0], states[-1]]
        states = keep + rng.sample(states[1:-1], max_states - 2)
    return states


def chunk_ok(d, final, c):
    if c == d or c == final:
        return None
    for i in range(0, len(d), 512):
        cc = c[i:i + 512]
        if cc != d[i:i + 512] and cc != final[i:i + 512]:
            return "offset 0x%x reads as neither the damaged image nor the repaired one" % i
    return None


def one(args, rng, kind, stats):
    work = args.work
    cs = rng.choice([512, 4096, 65536])
    rb = rng.choice([1, 16, 64])
    nsnap = 0 if rb == 1 else rng.choice([0, 1, 2])
    try:
        path, snaps = damage.make_image(work, rng, cs, rb, False, rng.random() < 0.3, nsnap)
    except RuntimeError:
        stats[kind][2] += 1
        return True
    broken, what = damage.damage(open(path, "rb").read(), kind, rng)
    if broken is None:
        stats[kind][2] += 1
        return True
    dpath, fpath, cpath = (os.path.join(work, n) for n in ("d.qcow2", "f.qcow2", "c.qcow2"))
    for p in (dpath, fpath):
        with open(p, "wb") as f:
            f.write(broken)
    ops = trace_repair(args.qcowkit, fpath, work)
    before = qemu_check(dpath)
    views = {}
    for snap in [None] + snaps:
        views[snap] = (read_view(dpath, snap, os.path.join(work, "d.raw")),
                       read_view(fpath, snap, os.path.join(work, "f.raw")))
    fails = []
    if apply(broken, ops) != open(fpath, "rb").read():
        fails.append("the trace does not replay to the repaired image (%d ops)" % len(ops))
    states = crash_states(ops, rng, args.max_states)
    for st in states:
        with open(cpath, "wb") as f:
            f.write(apply(broken, st))
        res = qemu_check(cpath)
        if (RANK.get(res[0], 9), res[1]) > (RANK.get(before[0], 9), before[1]):
            fails.append("after %d of %d ops: qemu-img check %s, before the repair %s" % (len(st), len(ops), res, before))
            break
        for snap, (d, final) in views.items():
            if d is None or final is None:
                continue
            c = read_view(cpath, snap, os.path.join(work, "c.raw"))
            bad = "unreadable" if c is None else chunk_ok(d, final, c)
            if bad:
                fails.append("after %d of %d ops: view %s %s" % (len(st), len(ops), snap or "active", bad))
                break
        if fails:
            break
    label = "%s cs=%d rb=%d snaps=%d" % (kind, cs, rb, nsnap)
    if fails:
        stats[kind][1] += 1
        print("FAIL %s: %s" % (label, what))
        for f in fails:
            print("     " + f)
        return False
    stats[kind][0] += 1
    if args.verbose:
        print("ok   %s: %s; %d ops, %d crash states" % (label, what, len(ops), len(states)))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qcowkit")
    ap.add_argument("work")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(damage.KINDS))
    ap.add_argument("--max-states", type=int, default=12)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    stats = {k: [0, 0, 0] for k in kinds}
    ok = True
    for seed in range(args.seeds):
        for kind in kinds:
            rng = random.Random("crash-%d-%s" % (seed, kind))
            ok &= one(args, rng, kind, stats)
    print("crash states: %-18s %5s %5s %8s" % ("kind", "ok", "fail", "n/a"))
    for k in kinds:
        print("crash states: %-18s %5d %5d %8d" % (k, *stats[k]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
