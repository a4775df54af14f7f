#!/usr/bin/env python3
"""Seeded random sequences on twin images where QEMU's tools are the judge,
in three kinds:

- snap: writes (plain, compressed, zero with and without unmap, discard),
  internal snapshots taken, applied and deleted, and the disk grown.
- bitmap: writes, zero writes and discards with persistent dirty bitmaps
  added, removed, cleared, enabled, disabled and merged, snapshots, and
  the disk grown.
- datafile: writes, zero writes and discards on images whose data lives
  in an external data file, raw (data_file_raw=on: the file must then
  hold the disk as QEMU's does) or not.
- aio: writes and zero writes packed into 1-4 clusters, issued all at once
  by `qcowkit io` (aio_write) so that they race on the same L2 entries,
  subclusters and copies from a backing file; QEMU gets them one by one.
- nbd: writes, zero writes, discards and such bursts sent by qemu-io
  through an export of `qcowkit serve` (cache none, writeback or unsafe),
  against qemu-io on the twin directly; serve must stop cleanly on
  SIGTERM.

snap, bitmap and datafile run each sequence three times: on Q by qemu-io/qemu-img
alone, on K by qcowkit alone, and on M with every step (a run of I/O
commands or one snapshot or bitmap command) done by either program,
picked at random, so that each reads and changes what the other wrote.
Afterwards K and M must read as Q does (the active disk, and every
snapshot through qemu-img convert -l; qcowkit's own reading of Q's
snapshots too), list the same snapshots, hold the same bitmaps with the
same flags and the same dirty ranges (qemu-nbd -B and nbdinfo --map), and
pass both checks.

Usage: mixed_tools.py QCOWKIT WORKDIR [--kinds snap,bitmap,datafile,aio,nbd] [--seeds N]
                      [--first S] [--asan QCOWKIT_ASAN] [--keep DIR]
--seeds N runs N sequences of snap, bitmap, datafile and nbd, and 3N of
aio (a tenth of their cost each); --asan runs the aio and nbd kinds with
that binary (the races are where a sanitizer sees most); --keep saves
failing images.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

QK = None
KEEP = None


class QemuSelfCorrupt(Exception):
    """qemu-io 7.2 refuses some compressed writes on 512-byte clusters after
    an unmapping zero write freed earlier compressed ones: it marks its own
    image corrupt ("Preventing invalid write on metadata"). No reference
    for such a sequence: counted as skipped."""


def run(cmd, ok=(0,)):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok is not None and p.returncode not in ok:
        raise RuntimeError("%s -> %d\n%s" % (" ".join(cmd)[:800], p.returncode, p.stdout[-2000:]))
    return p


def io_batch(tool, img, cmds, extra=()):
    if not cmds:
        return
    prog = ["qemu-io"] if tool == "q" else [QK, "io"] + list(extra)
    p = run(prog + ["-f", "qcow2"] + [a for c in cmds for a in ("-c", c)] + [img], ok=None)
    if p.returncode != 0 or "failed" in p.stdout:
        if tool == "q" and img.endswith("/q.qcow2") and "Marking image as corrupt" in p.stdout:
            raise QemuSelfCorrupt()
        raise RuntimeError("%s io on %s -> %d\n%s\ncommands: %s" %
                           ("qemu" if tool == "q" else "qcowkit", img, p.returncode, p.stdout[-1500:], cmds))


def ranged(rng, lo, span, cl):
    """(offset, length) inside [lo, lo+span): whole clusters, sectors or bytes."""
    r = rng.random()
    if r < 0.4:
        n = rng.randint(1, min(3, span // cl))
        return lo + rng.randrange(0, span // cl - n + 1) * cl, n * cl
    if r < 0.7:
        ln = rng.randint(1, min(3 * cl, span) // 512)
        return lo + rng.randrange(0, (span - ln * 512) // 512 + 1) * 512, ln * 512
    ln = rng.randint(1, min(3 * cl, span))
    return lo + rng.randrange(0, span - ln + 1), ln


def data_op(rng, kind, off, ln):
    if kind == "write":
        return "write -P 0x%02x %d %d" % (rng.randint(1, 255), off, ln)
    if kind == "zero":
        return "write -z %d %d" % (off, ln)
    return "write -z -u %d %d" % (off, ln)


def layout(rng, v2_ok):
    cl = rng.choice([512, 4096, 65536, 65536, 2 << 20])
    ext = cl >= 16384 and rng.random() < 0.35
    v2 = v2_ok and not ext and rng.random() < 0.2
    opts = ["cluster_size=%d" % cl, "compat=0.10" if v2 else "compat=1.1"]
    if ext:
        opts.append("extended_l2=on")
    if not v2:
        # wide enough for a dozen snapshots sharing a cluster
        opts.append("refcount_bits=%d" % rng.choice([8, 16, 16, 64]))
        if rng.random() < 0.3:
            opts.append("compression_type=zstd")
        if rng.random() < 0.2:
            opts.append("lazy_refcounts=on")
    return cl, opts


def gen_snap(rng):
    cl, opts = layout(rng, True)
    size = rng.choice([4, 8]) * max(cl, 65536) * 4
    # QEMU compresses only into clusters not allocated in the image: the
    # first quarter takes compressed writes, each cluster once, from the
    # front; other writes go to the rest or to clusters already written
    # compressed.
    clim, cnext = size // cl // 4, 0
    ops, snaps, nsn = [], [], 0
    for _ in range(rng.randint(8, 50)):
        k = rng.choices(["write", "cwrite", "zero", "zerou", "discard", "snapc", "snapa", "snapd", "grow"],
                        weights=[40, 10, 8, 6, 8, 10, 6, 6, 5])[0]
        if k == "grow":
            # snapshots then differ in size from the disk; applying one
            # shrinks it back (neither tool resizes a v2 image that has
            # snapshots)
            if not ("compat=0.10" in opts and nsn):
                ops.append(("resize", ["-q"], "+%d" % (rng.randint(1, 40) * rng.choice([512, 65536]))))
        elif k == "snapc":
            nsn += 1
            snaps.append("s%d" % nsn)
            ops.append(("snapshot", ["-c"], "s%d" % nsn))
        elif k in ("snapa", "snapd"):
            if snaps:
                name = rng.choice(snaps)
                if k == "snapd":
                    snaps.remove(name)
                ops.append(("snapshot", ["-a" if k == "snapa" else "-d"], name))
        elif k == "cwrite":
            n = rng.randint(1, 3)
            if cnext + n <= clim:
                ops.append(("io", "write -c -P 0x%02x %d %d" % (rng.randint(1, 255), cnext * cl, n * cl)))
                cnext += n
        else:
            lo, span = clim * cl, size - clim * cl
            if cnext >= 4 and rng.random() < 0.3:
                lo, span = 0, cnext * cl
            if k == "discard":
                # whole clusters: QEMU 7.2 ignores discards of part of an
                # extended-L2 cluster, where qcowkit zeroes its subclusters
                n = rng.randint(1, 3)
                ops.append(("io", "discard %d %d" % (lo + rng.randrange(0, span // cl - n + 1) * cl, n * cl)))
            else:
                off, ln = ranged(rng, lo, span, cl)
                ops.append(("io", data_op(rng, k, off, ln)))
    return opts, size, ops


def gen_bitmap(rng):
    cl, opts = layout(rng, False)
    size = rng.choice([1, 2, 4]) * max(cl, 65536) * 4 + rng.choice([0, 0, 512, 65536 + 512])
    ops, live, snaps = [], [], []
    nb = nsn = 0
    cur = size
    for _ in range(rng.randint(8, 50)):
        k = rng.choices(["write", "zero", "zerou", "discard", "add", "remove", "clear", "enable",
                         "disable", "merge", "snapc", "snapa", "grow"],
                        weights=[40, 8, 6, 8, 10, 3, 3, 3, 4, 4, 4, 3, 3])[0]
        if k == "grow":
            # The bitmaps grow with the disk, clean over the new part. From
            # a size that is not a cluster multiple qcowkit zeroes the rest
            # of the last cluster, a write its enabled bitmaps record (a
            # known difference): grown from whole clusters only.
            if cur % cl == 0:
                n = rng.randint(1, 8) * cl
                cur += n
                ops.append(("resize", ["-q"], "+%d" % n))
        elif k == "add":
            if len(live) < 5:
                nb += 1
                g = rng.choice([512, 4096, 65536, 65536, 1 << 20, None])
                live.append("b%d" % nb)
                ops.append(("bitmap", ["--add"] + (["-g", str(g)] if g else []), "b%d" % nb))
        elif k in ("remove", "clear", "enable", "disable", "merge"):
            if live:
                name = rng.choice(live)
                if k == "remove":
                    live.remove(name)
                    ops.append(("bitmap", ["--remove"], name))
                elif k == "merge":
                    src = rng.choice(live)
                    if src != name:
                        ops.append(("bitmap", ["--merge", src], name))
                else:
                    ops.append(("bitmap", ["--" + k], name))
        elif k == "snapc":
            nsn += 1
            snaps.append(("s%d" % nsn, cur))
            ops.append(("snapshot", ["-c"], "s%d" % nsn))
        elif k == "snapa":
            # qemu-img refuses -a on an image with bitmaps, where qcowkit
            # marks the enabled ones dirty everywhere (bitmap.sh)
            if snaps and not live:
                name, cur = rng.choice(snaps)
                ops.append(("snapshot", ["-a"], name))
        elif k == "discard":
            n = rng.randint(1, 3)
            off = rng.randrange(0, max(1, size // cl - n + 1)) * cl
            ops.append(("io", "discard %d %d" % (off, min(n * cl, size - off))))
        else:
            off, ln = ranged(rng, 0, size, cl)
            ops.append(("io", data_op(rng, k, off, ln)))
    return opts, size, ops


def gen_datafile(rng):
    cl = rng.choice([512, 4096, 65536, 65536, 2 << 20])
    opts = ["cluster_size=%d" % cl, "data_file_raw=%s" % rng.choice(["on", "off"])]
    if cl >= 16384 and rng.random() < 0.35:
        opts.append("extended_l2=on")
    size = rng.choice([4, 8]) * max(cl, 65536) * 4
    ops = []
    for _ in range(rng.randint(6, 40)):
        k = rng.choices(["write", "zero", "zerou", "discard"], weights=[60, 12, 10, 10])[0]
        if k == "discard":
            n = rng.randint(1, 3)
            ops.append(("io", "discard %d %d" % (rng.randrange(0, size // cl - n + 1) * cl, n * cl)))
        else:
            ops.append(("io", data_op(rng, k, *ranged(rng, 0, size, cl))))
        if rng.random() < 0.15:
            ops.append(("step", None, None))  # ends a run of I/O: M may switch programs
    return opts, size, ops


def make(d, opts, size, names, backing_fill=False):
    base = None
    if backing_fill:
        base = os.path.join(d, "base.qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", base, str(size)])
        run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x77 0 %d" % size, base])
    imgs = {}
    for t in names:
        imgs[t] = os.path.join(d, t + ".qcow2")
        each = list(opts)
        if any(o.startswith("data_file_raw=") for o in opts):
            # an absolute name: qemu-img create makes a relative one in its
            # working directory, while opening looks beside the image
            each.append("data_file=" + os.path.join(d, t + ".data"))
        cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", ",".join(each)]
        if base:
            cmd += ["-b", base, "-F", "qcow2"]
        run(cmd + [imgs[t], str(size)])
    return imgs


def play(imgs, ops, seed):
    """Q by QEMU, K by qcowkit, M by either for each step."""
    pick = random.Random(seed * 7 + 1)
    for t in ("q", "k", "m"):
        who = (lambda: pick.choice("qk")) if t == "m" else (lambda t=t: t)
        batch = []
        for op in ops:
            if op[0] == "io":
                batch.append(op[1])
                continue
            io_batch(who(), imgs[t], batch)
            batch = []
            prog = "qemu-img" if who() == "q" else QK
            if op[0] == "step":
                continue
            if op[0] == "snapshot":
                run([prog, "snapshot"] + op[1] + [op[2], imgs[t]])
            elif op[0] == "resize":
                run([prog, "resize"] + op[1] + [imgs[t], op[2]])
            else:
                run([prog, "bitmap"] + op[1] + [imgs[t], op[2]])
        io_batch(who(), imgs[t], batch)


def checks(imgs, judged, fails):
    for t in judged:
        p = run(["qemu-img", "check", imgs[t]], ok=None)
        if p.returncode != 0:
            fails.append("qemu-img check of %s: %d\n%s" % (t, p.returncode, p.stdout[-800:]))
    for t in imgs:
        p = run([QK, "check", imgs[t]], ok=None)
        if p.returncode != 0:
            fails.append("qcowkit check of %s: %d\n%s" % (t, p.returncode, p.stdout[-800:]))
        if t != "q":
            p = run(["qemu-img", "compare", imgs["q"], imgs[t]], ok=None)
            if p.returncode != 0:
                fails.append("the disk of %s differs from q's: %s" % (t, p.stdout[-300:]))


def snapshot_names(prog, img):
    out = run([prog, "snapshot", "-l", img]).stdout.splitlines()[2:]
    return [ln.split()[1] for ln in out if ln.strip()]


def check_snapshots(d, imgs, fails):
    names = snapshot_names("qemu-img", imgs["q"])
    for t in ("k", "m"):
        got = snapshot_names(QK, imgs[t])
        if got != names:
            fails.append("snapshots of %s: %s, q has %s" % (t, got, names))
            return
    # Each snapshot copied out (qcow2: only what it maps is written), then
    # compared by qemu-img.
    for n in names:
        ref = os.path.join(d, "q-%s.qcow2" % n)
        run(["qemu-img", "convert", "-O", "qcow2", "-l", "snapshot.name=" + n, imgs["q"], ref])
        for t in ("k", "m"):
            o = os.path.join(d, "%s-%s.qcow2" % (t, n))
            run(["qemu-img", "convert", "-O", "qcow2", "-l", "snapshot.name=" + n, imgs[t], o])
            if run(["qemu-img", "compare", "-q", ref, o], ok=None).returncode != 0:
                fails.append("snapshot %s of %s differs from q's" % (n, t))
        o = os.path.join(d, "qk-%s.qcow2" % n)
        run([QK, "convert", "-O", "qcow2", "-l", "snapshot.name=" + n, imgs["q"], o])
        if run(["qemu-img", "compare", "-q", ref, o], ok=None).returncode != 0:
            fails.append("qcowkit reads snapshot %s of q differently" % n)


def bitmap_list(img):
    j = json.loads(run(["qemu-img", "info", "--output=json", img]).stdout)
    bms = j.get("format-specific", {}).get("data", {}).get("bitmaps", [])
    return sorted((b["name"], b["granularity"], tuple(sorted(b["flags"]))) for b in bms)


def bitmap_ranges(img, name, sock):
    """The dirty ranges of a bitmap as QEMU reads them."""
    p = subprocess.Popen(["qemu-nbd", "-r", "-t", "-k", sock, "-B", name, "-f", "qcow2", img],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.025)
        out = run(["nbdinfo", "--map=qemu:dirty-bitmap:" + name, "--json", "nbd+unix:///?socket=" + sock]).stdout
        return [(e["offset"], e["length"], e["type"]) for e in json.loads(out)]
    finally:
        p.kill()
        p.wait()
        if os.path.exists(sock):
            os.unlink(sock)


def check_bitmaps(d, imgs, fails):
    ref = bitmap_list(imgs["q"])
    for t in ("k", "m"):
        got = bitmap_list(imgs[t])
        if got != ref:
            fails.append("bitmaps of %s: %s, q has %s" % (t, got, ref))
            return
    sock = os.path.join(d, "nbd.sock")
    for name, _, _ in ref:
        want = bitmap_ranges(imgs["q"], name, sock)
        for t in ("k", "m"):
            got = bitmap_ranges(imgs[t], name, sock)
            if got != want:
                fails.append("bitmap %s of %s: %s..., q has %s..." % (name, t, got[:6], want[:6]))


def taking_turns(d, seed, gen, judge, backing_odds):
    """A snap or bitmap case: the sequence on Q, K and M, then the judge."""
    rng = random.Random(seed)
    opts, size, ops = gen(rng)
    imgs = make(d, opts, size, ("q", "k", "m"), backing_fill=rng.random() < backing_odds)
    play(imgs, ops, seed)
    fails = []
    checks(imgs, ("k", "m"), fails)
    judge(d, imgs, fails)
    return opts, ops, fails


def case_snap(d, seed):
    return taking_turns(d, seed, gen_snap, check_snapshots, 0.3)


def case_bitmap(d, seed):
    return taking_turns(d, seed, gen_bitmap, check_bitmaps, 0)


def check_raw_data_files(d, imgs, fails):
    info = json.loads(run(["qemu-img", "info", "--output=json", imgs["q"]]).stdout)
    if not info["format-specific"]["data"].get("data-file-raw"):
        return
    ref = os.path.join(d, "q.data")
    for t in ("k", "m"):
        got = os.path.join(d, t + ".data")
        if run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", ref, got], ok=None).returncode != 0:
            fails.append("the raw data file of %s differs from q's" % t)


def case_datafile(d, seed):
    return taking_turns(d, seed, gen_datafile, check_raw_data_files, 0)


def case_aio(d, seed):
    rng = random.Random(seed)
    cl = rng.choice([512, 4096, 32768, 65536, 65536, 1 << 20])
    opts = ["cluster_size=%d" % cl]
    if cl >= 16384 and rng.random() < 0.5:
        opts.append("extended_l2=on")
    if rng.random() < 0.2:
        opts.append("lazy_refcounts=on")
    size = max(cl * 64, 8 << 20)
    imgs = make(d, opts, size, ("q", "k"), backing_fill=rng.random() < 0.5)
    first = [data_op(rng, "write", *ranged(rng, 0, size, 512)) for _ in range(rng.randint(0, 6))]
    rounds = []
    for _ in range(rng.randint(1, 4)):
        nc = rng.randint(1, 4)
        start, span = rng.randrange(0, size // cl - nc) * cl, nc * cl
        unit = rng.choice([1, 512, 512, 4096])
        if span // unit < 2:
            unit = 1
        cuts = sorted(set(rng.randrange(1, span // unit) * unit for _ in range(rng.randint(1, 24))))
        pts = [0] + cuts + [span]
        ops = [data_op(rng, rng.choices(["write", "zero", "zerou"], weights=[75, 15, 10])[0], start + a, b - a)
               for a, b in zip(pts, pts[1:]) if rng.random() >= 0.2]
        rng.shuffle(ops)
        rounds.append(ops)
    io_batch("q", imgs["q"], first + [o for r in rounds for o in r])
    kcmds = list(first)
    for r in rounds:
        kcmds += ["aio_" + o.replace("write ", "write -q ", 1) for o in r] + ["aio_flush"]
    io_batch("k", imgs["k"], kcmds, ["-t", rng.choice(["none", "writeback"])])
    fails = []
    checks(imgs, ("k",), fails)
    return opts, kcmds, fails


def case_nbd(d, seed):
    rng = random.Random(seed)
    cl = rng.choice([512, 4096, 65536, 65536, 2 << 20])
    opts = ["cluster_size=%d" % cl]
    if cl >= 16384 and rng.random() < 0.4:
        opts.append("extended_l2=on")
    size = rng.choice([4, 8]) * max(cl, 65536) * 4
    imgs = make(d, opts, size, ("q", "k"), backing_fill=rng.random() < 0.3)
    cmds = []
    for _ in range(rng.randint(6, 60)):
        k = rng.choices(["write", "zero", "zerou", "discard", "burst"], weights=[50, 10, 8, 10, 20])[0]
        if k == "discard":
            n = rng.randint(1, 3)
            cmds.append("discard %d %d" % (rng.randrange(0, size // cl - n + 1) * cl, n * cl))
        elif k == "burst":
            # writes in flight at once inside two clusters
            start = rng.randrange(0, size // cl - 2) * cl
            cuts = sorted(set(rng.randrange(1, 2 * cl // 512) * 512 for _ in range(rng.randint(1, 12))))
            pts = [0] + cuts + [2 * cl]
            cmds += ["aio_write -q -P 0x%02x %d %d" % (rng.randint(1, 255), start + a, b - a)
                     for a, b in zip(pts, pts[1:])] + ["aio_flush"]
        else:
            cmds.append(data_op(rng, k, *ranged(rng, 0, size, cl)))
    sock = os.path.join(d, "nbd.sock")
    cache = rng.choice(["none", "writeback", "unsafe"])
    srv = subprocess.Popen([QK, "serve", "--socket", sock, "--export",
                            "name=e,file=%s,format=qcow2,cache=%s" % (imgs["k"], cache)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fails = []
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.025)
        io_batch("q", imgs["q"], cmds)
        p = run(["qemu-io", "-f", "raw"] + [a for c in cmds for a in ("-c", c)] + ["nbd+unix:///e?socket=" + sock],
                ok=None)
        if p.returncode != 0 or "failed" in p.stdout:
            fails.append("qemu-io through the export: %d\n%s" % (p.returncode, p.stdout[-800:]))
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            err = srv.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            srv.kill()
            err = srv.communicate()[1]
            fails.append("serve did not stop on SIGTERM")
        if srv.returncode != 0:
            fails.append("serve exited %s: %s" % (srv.returncode, err[-800:]))
    checks(imgs, ("k",), fails)
    return opts + ["cache=" + cache], cmds, fails


CASES = {"snap": case_snap, "bitmap": case_bitmap, "datafile": case_datafile, "aio": case_aio, "nbd": case_nbd}


def main():
    global QK, KEEP
    plain, work = sys.argv[1], sys.argv[2]
    asan = plain
    kinds, seeds, first = ["snap", "bitmap", "datafile", "aio", "nbd"], 10, 1
    args = sys.argv[3:]
    while args:
        if args[0] == "--kinds":
            kinds = args[1].split(",")
        elif args[0] == "--seeds":
            seeds = int(args[1])
        elif args[0] == "--first":
            first = int(args[1])
        elif args[0] == "--asan":
            asan = args[1]
        elif args[0] == "--keep":
            KEEP = args[1]
        else:
            sys.exit("unknown argument " + args[0])
        args = args[2:]
    total = 0
    for kind in kinds:
        QK = asan if kind in ("aio", "nbd") else plain
        done = failed = skipped = 0
        for seed in range(first, first + (3 * seeds if kind == "aio" else seeds)):
            d = os.path.join(work, "%s-%d" % (kind, seed))
            os.makedirs(d)
            try:
                opts, ops, fails = CASES[kind](d, seed)
            except QemuSelfCorrupt:
                skipped += 1
                shutil.rmtree(d)
                continue
            except RuntimeError as e:
                opts, ops, fails = "?", [], [str(e)]
            done += 1
            if fails:
                failed += 1
                print("FAIL %s seed %d (%s)\n  %s\n  ops: %s" %
                      (kind, seed, ",".join(opts), "\n  ".join(fails), ops), flush=True)
                if KEEP:
                    shutil.copytree(d, os.path.join(KEEP, os.path.basename(d)), dirs_exist_ok=True)
            shutil.rmtree(d)
        print("%s: %d sequences, %d failures, %d without a reference (qemu-io corrupted its own image)" %
              (kind, done, failed, skipped), flush=True)
        total += failed
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
