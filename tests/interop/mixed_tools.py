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
- chain: a backing chain base <- mid <- top (each layer with its own
  cluster size, version, refcount width, extended L2 or not) taking
  writes into any layer, commit (into the backing file, with -d, or -b
  further down), rebase (safe and -u, onto another layer or none), amend
  (compat, lazy_refcounts, refcount_bits) and growth; every layer must
  then read as Q's (each through its own chain), have the same size,
  backing file name and options, and hold the same ranges itself.

snap, bitmap, datafile and chain run each sequence three times: on Q by
qemu-io/qemu-img alone, on K by qcowkit alone, and on M with every step (a
run of I/O commands or one snapshot, bitmap or chain command) done by
either program, picked at random, so that each reads and changes what the
other wrote. Afterwards K and M must read as Q does (the active disk, and
every snapshot through qemu-img convert -l; qcowkit's own reading of Q's
snapshots too), hold the same ranges themselves (what a backing file
attached later would show through), list the same snapshots, hold the
same bitmaps with the same flags and the same dirty ranges (qemu-nbd -B
and nbdinfo --map), and pass both checks.

Usage: mixed_tools.py QCOWKIT WORKDIR [--kinds snap,bitmap,datafile,aio,nbd,chain] [--seeds N]
                      [--first S] [--asan QCOWKIT_ASAN] [--keep DIR]
--seeds N runs N sequences of snap, bitmap, datafile, nbd and chain, and 3N of
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
            # What the image holds itself decides what a backing file
            # attached later would show.
            own = own_ranges(json.loads(run(["qemu-img", "map", "--output=json", imgs[t]]).stdout))
            want = own_ranges(json.loads(run(["qemu-img", "map", "--output=json", imgs["q"]]).stdout))
            if own != want:
                fails.append("what %s holds itself: %s..., q: %s..." % (t, own[:6], want[:6]))


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


LAYERS = ("base", "mid", "top")


def gen_chain(rng):
    """A chain base <- mid <- top, each layer with its own layout, and a
    sequence of writes into any layer mixed with commit, rebase, amend and
    resize. The generator keeps a model of the chain and of each layer's
    options so that every command is one both programs accept, and steers
    clear of the documented differences (README): a safe rebase only of a
    layer that has a backing file, no downgrade of zstd images, no growth of
    a v2 image with a backing file, growth by whole clusters only."""
    lay = {}
    for name in LAYERS:
        cl, opts = layout(rng, True)
        opts = [o for o in opts if o != "compression_type=zstd"]
        lay[name] = {"cl": cl, "opts": opts, "v2": "compat=0.10" in opts, "was_v2": "compat=0.10" in opts,
                     "ext": "extended_l2=on" in opts, "lazy": "lazy_refcounts=on" in opts,
                     "bits": next((int(o.split("=")[1]) for o in opts if o.startswith("refcount_bits=")), 16)}
    big = max(v["cl"] for v in lay.values())
    size = rng.choice([2, 4]) * max(big, 65536) * 4
    for v in lay.values():
        v["size"] = size
    size0 = size
    back = {"base": None, "mid": "base", "top": "mid"}
    ops = []
    # Compressed clusters in base's first quarter, before anything else
    # (QEMU compresses only into unallocated clusters).
    cb = lay["base"]["cl"]
    if rng.random() < 0.4:
        n = rng.randint(1, max(1, size // cb // 4))
        ops.append(("io", "base", "write -c -P 0x%02x 0 %d" % (rng.randint(1, 255), n * cb)))

    def chain_of(name):
        out = []
        while back[name]:
            name = back[name]
            out.append(name)
        return out

    for _ in range(rng.randint(8, 45)):
        k = rng.choices(["write", "zero", "zerou", "discard", "commit", "rebase", "amend", "grow", "step"],
                        weights=[40, 8, 6, 8, 9, 9, 7, 3, 4])[0]
        if k in ("write", "zero", "zerou", "discard"):
            name = rng.choices(LAYERS, weights=[25, 25, 50])[0]
            if lay[name].get("frozen"):
                continue
            cl, lsize = lay[name]["cl"], lay[name]["size"]
            if k == "discard":
                n = rng.randint(1, 3)
                off = rng.randrange(0, lsize // cl - n + 1) * cl
                ops.append(("io", name, "discard %d %d" % (off, n * cl)))
            else:
                ops.append(("io", name, data_op(rng, k, *ranged(rng, 0, lsize, cl))))
        elif k == "step":
            ops.append(("step", None, None))
        elif k == "commit":
            name = rng.choice(["mid", "top"])
            below = chain_of(name)
            if not below:
                continue
            r = rng.random()
            if r < 0.3 and len(below) > 1:
                ops.append(("commit", name, ["-b", "@" + below[-1]]))
                into, done = below[-1], [name] + below[:-1]
            else:
                ops.append(("commit", name, ["-d"] if r < 0.5 else []))
                into, done = below[0], [name]
            # qemu-img's commit copies whole blocks of 4 KiB or more,
            # data from below included, where qcowkit copies only what the
            # overlays hold: both read the same until what lies below
            # changes. So from now on nothing below `into` is written to,
            # and `into` is not rebased unsafely.
            lay[into]["took_commit"] = True
            for x in chain_of(into):
                lay[x]["frozen"] = True
            # A base smaller than what is committed into it grows.
            lay[into]["size"] = max([lay[into]["size"]] + [lay[x]["size"] for x in done])
        elif k == "rebase":
            name = rng.choice(["mid", "top"])
            cands = [""] + [c for c in (["base"] if name == "mid" else ["base", "mid"]) if c != back[name]]
            new = rng.choice(cands)
            if new == "" and back[name] is None:
                continue
            # Without a backing file a safe rebase differs on purpose (README).
            unsafe = back[name] is None or rng.random() < 0.3
            if unsafe and lay[name].get("took_commit"):
                continue
            ops.append(("rebase", name, (["-u"] if unsafe else []) +
                        (["-b", new + ".qcow2", "-F", "qcow2"] if new else ["-b", ""])))
            back[name] = new or None
        elif k == "amend":
            name = rng.choice(LAYERS)
            v = lay[name]
            if v["v2"]:
                v["v2"] = False
                ops.append(("amend", name, "compat=1.1"))
                continue
            r = rng.random()
            if r < 0.35:
                v["lazy"] = not v["lazy"]
                ops.append(("amend", name, "lazy_refcounts=" + ("on" if v["lazy"] else "off")))
            elif r < 0.7 and v["cl"] < 262144:
                # (qemu-img 7.2's amend of refcount_bits did not finish
                # on clusters of 256 KiB and more here: 20 s each, and 9
                # minutes at 100% CPU on a 32 MiB image with 2 MiB ones)
                v["bits"] = rng.choice([8, 16, 32, 64] if any(o[0] == "io" and " -c " in o[2] for o in ops)
                                       else [1, 2, 4, 8, 16, 32, 64])
                ops.append(("amend", name, "refcount_bits=%d" % v["bits"]))
            elif not v["ext"] and not v["lazy"] and v["bits"] == 16:
                v["v2"] = v["was_v2"] = True
                ops.append(("amend", name, "compat=0.10"))
        elif k == "grow":
            name = rng.choice(LAYERS)
            v = lay[name]
            if v["v2"] and back[name]:
                continue
            n = rng.randint(1, 4) * max(big, 65536)
            v["size"] += n
            ops.append(("resize", name, "+%d" % n))
    return lay, size0, ops


def own_ranges(m):
    """The ranges an image holds itself (present at depth 0 of qemu-img
    map), merged without regard to host offsets, which differ between the
    twins. How each holds them may differ: a zero write that covers part
    of a cluster allocates zeros here where QEMU sets the zero flag when
    the chain below reads as zeros there too."""
    out = []
    for e in m:
        if e["depth"] != 0:
            continue
        key = e.get("present", True)
        if out and out[-1][3] == key and out[-1][0] + out[-1][1] == e["start"]:
            out[-1][1] += e["length"]
        else:
            out.append([e["start"], e["length"], None, key])
    return [(a, b, k) for a, b, _, k in out]


def case_chain(d, seed):
    rng = random.Random(seed)
    lay, size0, ops = gen_chain(rng)
    tw = {}
    for t in ("q", "k", "m"):
        td = os.path.join(d, t)
        os.makedirs(td)
        prev = None
        for name in LAYERS:
            cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", ",".join(lay[name]["opts"])]
            if prev:
                cmd += ["-b", prev + ".qcow2", "-F", "qcow2"]
            run(cmd + [os.path.join(td, name + ".qcow2"), str(size0)])
            prev = name
        tw[t] = td
    pick = random.Random(seed * 7 + 1)
    for t in ("q", "k", "m"):
        who = (lambda: pick.choice("qk")) if t == "m" else (lambda t=t: t)
        path = lambda name, t=t: os.path.join(tw[t], name + ".qcow2")
        batch, blayer = [], None
        for op in ops + [("step", None, None)]:
            if op[0] == "io" and op[1] == blayer:
                batch.append(op[2])
                continue
            if batch:
                io_batch(who(), path(blayer), batch)
            batch, blayer = [], None
            if op[0] == "io":
                batch, blayer = [op[2]], op[1]
                continue
            if op[0] == "step":
                continue
            prog = "qemu-img" if who() == "q" else QK
            if op[0] == "commit":
                args = [path(a[1:]) if a.startswith("@") else a for a in op[2]]
                run([prog, "commit", "-q"] + args + [path(op[1])])
            elif op[0] == "rebase":
                run([prog, "rebase", "-q"] + op[2] + [path(op[1])])
            elif op[0] == "amend":
                run([prog, "amend", "-q", "-o", op[2], path(op[1])])
            else:
                run([prog, "resize", "-q", path(op[1]), op[2]])
    fails = []
    keys = ("virtual-size", "backing-filename", "backing-filename-format")
    fkeys = ("compat", "lazy-refcounts", "refcount-bits", "extended-l2")
    for name in LAYERS:
        want = None
        for t in ("q", "k", "m"):
            img = os.path.join(tw[t], name + ".qcow2")
            p = run(["qemu-img", "check", img], ok=None)
            if t != "q" and p.returncode != 0:
                fails.append("qemu-img check of %s/%s: %d\n%s" % (t, name, p.returncode, p.stdout[-800:]))
            p = run([QK, "check", img], ok=None)
            if p.returncode != 0:
                fails.append("qcowkit check of %s/%s: %d\n%s" % (t, name, p.returncode, p.stdout[-800:]))
            j = json.loads(run(["qemu-img", "info", "--output=json", img]).stdout)
            got = [j.get(x) for x in keys] + [j["format-specific"]["data"].get(x) for x in fkeys]
            m = json.loads(run(["qemu-img", "map", "--output=json", img]).stdout)
            own = own_ranges(m)
            if t == "q":
                want, wown = got, own
                continue
            if got != want:
                fails.append("info of %s/%s: %s, q has %s" % (t, name, got, want))
            # Not compared where the two differ on purpose: qemu-img's
            # commit copies whole 4 KiB blocks or more, backing data
            # included, where qcowkit copies what the overlay holds; and
            # v2 has no zero flag: zeros committed into a v2 image with no
            # backing file are data from qemu-img and holes from qcowkit
            # (and from qemu-io's zero writes), which read the same.
            if own != wown and not lay[name]["was_v2"] and not lay[name].get("took_commit"):
                fails.append("what %s/%s holds itself: %s..., q: %s..." % (t, name, own[:6], wown[:6]))
            p = run(["qemu-img", "compare", os.path.join(tw["q"], name + ".qcow2"), img], ok=None)
            if p.returncode != 0:
                fails.append("%s/%s reads differently from q's: %s" % (t, name, p.stdout[-300:]))
    opts = ["%s:%s" % (n, "+".join(lay[n]["opts"])) for n in LAYERS]
    return opts, ops, fails


CASES = {"chain": case_chain, "snap": case_snap, "bitmap": case_bitmap, "datafile": case_datafile, "aio": case_aio, "nbd": case_nbd}


def main():
    global QK, KEEP
    plain, work = sys.argv[1], sys.argv[2]
    asan = plain
    kinds, seeds, first = ["snap", "bitmap", "datafile", "aio", "nbd", "chain"], 10, 1
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
