#!/usr/bin/env python3
"""check -r all against qemu-img check -r all on damaged images.

For each case: an image made by qemu-img/qemu-io (damage.make_image), one
damage (damage.KINDS), one copy repaired by qemu-img, one by qcowkit.
A case passes when
  - qemu-img check of qcowkit's result is no worse than of qemu-img's
    (exit status 0 < 3 < 2 < 1, then corruption and leak counts), unless
    qemu-img's repair dropped snapshots that qcowkit kept (counted apart);
  - every persistent bitmap qemu-img's repair keeps is still there;
  - qcowkit's repair exit status and a second qcowkit check (status and
    counts) agree with qemu-img check of qcowkit's result;
  - the guest data (active image and every snapshot) of qcowkit's result
    reads back, 512 bytes at a time, as either the undamaged original or
    what qemu-img's repair reads; where qemu-img's repair kept the original,
    qcowkit's must have kept it too;
  - a VM state saved with a snapshot (by qcowkit: qemu-img cannot) reads
    back as saved, or as from the damaged image, if qemu-img's repair kept
    the snapshot;
  - no sanitizer report (the repair runs on the ASan build).
Prints per-kind counts; exits 1 on any failure.

Usage: repair.py QCOWKIT QCOWKIT_ASAN WORKDIR [--long] [--seeds N] [--kinds a,b]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import damage  # noqa: E402

RANK = {0: 0, 3: 1, 2: 2, 1: 3}


def sh(cmd, env=None):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=300)


def qemu_check(path):
    p = sh(["qemu-img", "check", "--output=json", path])
    try:
        j = json.loads(p.stdout)
    except ValueError:
        j = {}
    return p.returncode, j.get("corruptions", 0), j.get("leaks", 0)


def qk_check(qk, path):
    p = sh([qk, "check", "--output=json", path])
    try:
        j = json.loads(p.stdout)
    except ValueError:
        j = {}
    return p.returncode, j.get("corruptions", 0), j.get("leaks", 0)


def bitmaps(path):
    """Names of the persistent bitmaps qemu-img info sees."""
    p = sh(["qemu-img", "info", "--output=json", path])
    try:
        data = json.loads(p.stdout)["format-specific"]["data"]
    except (ValueError, KeyError):
        return set()
    return {b["name"] for b in data.get("bitmaps", [])}


def snapshots(path):
    p = sh(["qemu-img", "snapshot", "-l", path])
    return {line.split()[1] for line in p.stdout.splitlines()[2:] if len(line.split()) > 1}


def vmstate_of(qk, path, snap, work):
    """The VM state of snapshot snap (reverting a copy to it), or None."""
    copy, out = os.path.join(work, "vm.qcow2"), os.path.join(work, "vm.bin")
    shutil.copy(path, copy)
    p = sh([qk, "snapshot", "-a", snap, "--vmstate-out", out, copy])
    data = open(out, "rb").read() if p.returncode == 0 and os.path.exists(out) else None
    for f in (copy, out):
        if os.path.exists(f):
            os.unlink(f)
    return data


def read_view(path, snap, out):
    cmd = ["qemu-img", "convert", "-O", "raw"]
    if snap:
        cmd += ["-l", "snapshot.name=" + snap]
    p = sh(cmd + [path, out])
    if p.returncode:
        return None
    with open(out, "rb") as f:
        data = f.read()
    os.unlink(out)
    return data


def compare_data(orig, dmg, q, k, lenient=False):
    """None when k keeps what it must, else a description of the first bad chunk.

    Where qemu-img's repair reads the original data, k must too; elsewhere k
    may read the original, qemu-img's result or what the damaged image read
    (a repair need not change what the guest sees). lenient (qemu-img's
    repair dropped snapshots, so its result is no reference for clusters
    the damage had already cross-linked): where neither the damaged image
    nor qemu-img's result reads the original, anything goes."""
    if k == orig or k == q:
        return None
    if len(k) != len(orig):
        return "size %d != %d" % (len(k), len(orig))
    for i in range(0, len(orig), 512):
        o, qq, kk = orig[i:i + 512], q[i:i + 512], k[i:i + 512]
        if kk == o:
            continue
        if qq == o:
            return "offset 0x%x: qemu-img kept the data, qcowkit did not" % i
        if lenient and dmg is not None and dmg[i:i + 512] != o:
            continue
        if kk != qq and (dmg is None or kk != dmg[i:i + 512]):
            return "offset 0x%x: neither the original, nor qemu-img's result, nor the damaged image's" % i
    return None


def one_case(args, work, rng, params, kind, stats):
    cs, rb, extl2, backing, nsnap, bitmap, vmstate = params
    v2 = args.long and rb == 16 and not extl2 and not bitmap and rng.random() < 0.3
    try:
        path, snaps = damage.make_image(work, rng, cs, rb, extl2, backing, nsnap, bitmap=bitmap,
                                        vmstate_tool=args.qcowkit if vmstate and nsnap else None, v2=v2)
    except RuntimeError as e:
        print("n/a  %s: could not make the image: %s" % (kind, str(e).strip()[:200]))
        stats[kind][2] += 1
        return True
    orig = open(path, "rb").read()
    broken, what = damage.damage(orig, kind, rng)
    label = "%s cs=%d rb=%d extl2=%d backing=%d snaps=%d bitmap=%d vmstate=%d v2=%d" % (
        kind, cs, rb, extl2, backing, nsnap, bitmap, vmstate and nsnap > 0, v2)
    if broken is None:
        stats[kind][2] += 1
        return True
    qpath, kpath = os.path.join(work, "q.qcow2"), os.path.join(work, "k.qcow2")
    dpath = os.path.join(work, "d.qcow2")
    for p in (qpath, kpath, dpath):
        with open(p, "wb") as f:
            f.write(broken)
    sh(["qemu-img", "check", "-r", "all", qpath])
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:exitcode=99"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:exitcode=98:print_stacktrace=1"
    rep = sh([args.qcowkit_asan, "check", "-r", "all", "--output=json", kpath], env=env)
    fails = []
    if "Sanitizer" in rep.stderr or "runtime error" in rep.stderr or rep.returncode >= 90:
        fails.append("sanitizer/crash: " + rep.stderr[-1500:])
    qres, kres = qemu_check(qpath), qemu_check(kpath)
    rk, rq = RANK.get(kres[0], 9), RANK.get(qres[0], 9)
    # qemu-img's repair sometimes drops internal snapshots (seen with 7.2 on
    # an L2 entry past the end in a table snapshots share); the damage it
    # counted through them is gone with them, so counts are not comparable.
    dropped = bool(snaps) and snapshots(qpath) < snapshots(kpath)
    if dropped:
        stats[kind][3] += 1
    elif rk > rq or (rk == rq and (kres[1] > qres[1] or kres[2] > qres[2])):
        fails.append("qemu-img check after qcowkit repair %s worse than after qemu-img repair %s" % (kres, qres))
    if rep.returncode != kres[0]:
        fails.append("qcowkit check -r all exited %d, qemu-img check of its result %d" % (rep.returncode, kres[0]))
    lost = bitmaps(qpath) - bitmaps(kpath) if bitmap else set()
    if lost:
        fails.append("bitmaps %s kept by qemu-img's repair are gone" % sorted(lost))
    again = qk_check(args.qcowkit, kpath)
    if again != kres:
        fails.append("second qcowkit check %s != qemu-img check %s" % (again, kres))
    for snap in [None] + snaps:
        o = read_view(path, snap, os.path.join(work, "o.raw"))
        q = read_view(qpath, snap, os.path.join(work, "q.raw"))
        if q is None:
            continue  # qemu-img's repair lost this view: nothing to keep
        k = read_view(kpath, snap, os.path.join(work, "k.raw"))
        if k is None:
            fails.append("view %s unreadable after qcowkit repair" % (snap or "active"))
            continue
        # The damaged image's view only when k reads neither o nor q.
        d = None if k in (o, q) else read_view(dpath, snap, os.path.join(work, "d.raw"))
        bad = compare_data(o, d, q, k, lenient=dropped)
        if bad:
            fails.append("view %s: %s" % (snap or "active", bad))
    if vmstate and snaps and snaps[0] in snapshots(qpath):
        # qemu-img cannot read VM state: qcowkit's result must give back the
        # saved state, or what the damaged image gives back (nothing, when
        # the damage made it unreadable).
        want = open(os.path.join(work, "vmstate.bin"), "rb").read()
        got, dmg = vmstate_of(args.qcowkit, kpath, snaps[0], work), vmstate_of(args.qcowkit, dpath, snaps[0], work)
        if got != want and got != dmg:
            fails.append("VM state of %s lost (%s bytes read back, %d saved)" % (
                snaps[0], "no" if got is None else len(got), len(want)))
    if fails:
        stats[kind][1] += 1
        print("FAIL %s: %s" % (label, what))
        for f in fails:
            print("     " + f)
        print("     qcowkit repair output: " + (rep.stderr.strip().replace("\n", " | "))[:600])
        if args.keep:
            keep = os.path.join(args.keep, "%s-%d" % (kind, stats[kind][0] + stats[kind][1]))
            os.makedirs(keep, exist_ok=True)
            shutil.copy(path, keep)
            with open(os.path.join(keep, "damaged.qcow2"), "wb") as f:
                f.write(broken)
            if backing:
                shutil.copy(os.path.join(work, "backing.qcow2"), keep)
        return False
    stats[kind][0] += 1
    if args.verbose:
        print("ok   %s: %s -> %s" % (label, what, kres))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qcowkit")
    ap.add_argument("qcowkit_asan")
    ap.add_argument("work")
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--kinds", default=",".join(damage.KINDS))
    ap.add_argument("--keep", default=None, help="copy failing images here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    args.qcowkit, args.qcowkit_asan = os.path.abspath(args.qcowkit), os.path.abspath(args.qcowkit_asan)
    kinds = args.kinds.split(",")
    if args.long:
        sizes = [512, 1024, 4096, 16384, 65536, 1 << 21]
        widths = [1, 2, 4, 8, 16, 32, 64]
        seeds = args.seeds or 6
    else:
        sizes = [512, 65536]
        widths = [1, 16, 64]
        seeds = args.seeds or 1
    stats = {k: [0, 0, 0, 0] for k in kinds}
    ok = True
    for seed in range(seeds):
        rng = random.Random(seed)
        for kind in kinds:
            # One parameter set per (seed, kind), cycling so that every kind
            # meets every cluster size and refcount width across seeds.
            i = seed * len(kinds) + kinds.index(kind)
            cs = sizes[i % len(sizes)]
            rb = widths[(i // len(sizes)) % len(widths)]
            extl2 = args.long and cs >= 16384 and rng.random() < 0.5
            backing = rng.random() < 0.4
            nsnap = rng.choice([0, 1, 2]) if not args.long else rng.choice([0, 1, 2, 3])
            # Snapshots share clusters: their refcounts must fit the width.
            nsnap = min(nsnap, (1 << min(rb, 8)) - 2)
            bitmap = rng.random() < 0.3
            vmstate = rng.random() < 0.3
            ok &= one_case(args, args.work, rng, (cs, rb, extl2, backing, nsnap, bitmap, vmstate), kind, stats)
    print("%-18s %5s %5s %8s  %s" % ("kind", "ok", "fail", "n/a", "qemu-img dropped snapshots"))
    for k in kinds:
        print("%-18s %5d %5d %8d  %d" % (k, *stats[k]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
