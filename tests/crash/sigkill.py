#!/usr/bin/env python3
"""SIGKILL crash test: a random stream of epochs (writes, zero writes with
and without unmap, discards; each epoch ends with flush and `mark epoch N`)
runs through `qcowkit io` and is killed at a random time. Whatever the
process had not flushed may be lost, but the page cache keeps every write
it completed, so the image must pass qemu-img check (0, or 3 for leaks)
and every epoch it printed the mark of must read back. The same image goes
on through several rounds (a killed image gets used again), then a fresh
one starts.

Usage: sigkill.py [--qcowkit PATH] [--config NAME]... [--rounds N] [--seed N]
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check      # noqa: E402
import workload   # noqa: E402
from model import History, Op   # noqa: E402
from verify import verify_guest  # noqa: E402


def last_mark(path):
    n = 0
    with open(path) as f:
        for line in f:
            if line.startswith("mark epoch "):
                n = int(line.split()[2])
    return n


def settle(runner, hist, epoch):
    """After a kill, ranges the interrupted epoch touched hold old or new
    bytes; rewrite them with known patterns (and flush) so the model is
    exact again. Returns the new History (epoch 0 = settled contents)."""
    img = hist.images[epoch].copy()
    ops = hist.ops[epoch + 1] if epoch + 1 < len(hist.ops) else []
    cmds, fixed = [], []
    for op in ops:
        if op.kind == "cut":
            # Killed after the shrink: the image is small until grown back.
            cmds.insert(0, "truncate %d" % img.size)
        if op.kind in ("write", "zero", "discard", "cut"):
            fixed.append(Op("write", op.off, op.length, 0xEE))
            cmds.append("write -q -P %d %d %d" % (0xEE, op.off, op.length))
    for op in fixed:
        img.apply(op, {})
    if cmds:
        runner.run_io(cmds + ["flush"])
    h = History(img.size)
    h.images[0] = img
    return h


def raw_data_file_check(image, hist, epoch, work):
    """A raw data file reads as the disk after a kill, except where the
    interrupted epoch wrote (a write into an unallocated subcluster reaches
    the data file before its L2 entry: old there, new here, both allowed)."""
    flat = os.path.join(work, "flat.raw")
    p = subprocess.run(["qemu-img", "convert", "-O", "raw", image, flat], capture_output=True, text=True)
    if p.returncode != 0:
        return ["qemu-img convert of the image failed: %s" % p.stderr[-500:]]
    with open(flat, "rb") as f:
        disk = bytearray(f.read())
    with open(image + ".data", "rb") as f:
        raw = bytearray(f.read(len(disk)))
    os.unlink(flat)
    pending = hist.ops[epoch + 1] if epoch + 1 < len(hist.ops) else []
    for op in pending:
        if op.kind in ("write", "zero", "discard"):
            end = min(op.off + op.length, len(disk))
            disk[op.off:end] = bytes(end - op.off)
            raw[op.off:end] = bytes(end - op.off)
    if len(raw) < len(disk):
        return ["the raw data file is shorter (%d bytes) than the disk (%d)" % (len(raw), len(disk))]
    if raw != disk:
        first = next(i for i in range(len(disk)) if raw[i] != disk[i])
        return ["the raw data file differs from the disk at offset %d (outside the pending ranges)" % first]
    return []


def run_config(args, cfg, seed, top):
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="sk-%s." % cfg.name, dir=top)
    image = os.path.join(work, "disk.qcow2")
    checker = check.Checker(args.qcowkit, work)
    runner = workload.Runner(args.qcowkit, cfg, image, None, work)
    rounds = fails = kills = 0
    marks = []
    hist = None
    duration = 0.5  # guess of a whole stream's run time; refined as we go
    shown = 0
    for rnd in range(args.rounds):
        if rnd % args.reuse == 0:
            if os.path.exists(image):
                os.unlink(image)
            workload.create_image(args.qcowkit, cfg, image)
            hist = History(cfg.size)
        gen = workload.Generator(cfg, rng)
        lines = []
        base = hist.epochs()
        for k in range(args.epochs):
            ops = gen.epoch(work)
            n = hist.add_epoch(ops)
            lines += workload.epoch_script(ops, n)
        script = os.path.join(work, "script")
        out = os.path.join(work, "out")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        delay = rng.uniform(0.0, duration)
        t0 = time.monotonic()
        with open(script) as fin, open(out, "w") as fout:
            p = subprocess.Popen(runner.io_argv(), stdin=fin, stdout=fout, stderr=subprocess.STDOUT,
                                 env=runner.env)
            try:
                p.wait(timeout=delay)
                killed = False
                duration = max(0.05, (duration + time.monotonic() - t0) / 2)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                killed = True
        if not killed and p.returncode != 0:
            print("FAIL: qcowkit io exited %d without a kill: %s" % (p.returncode, open(out).read()[-2000:]))
            fails += 1
            break
        done = last_mark(out) if killed else hist.epochs()
        if done < base:
            done = base
        if killed and done > base:
            # Aim the next kill anywhere in a whole stream's run time.
            full = delay * args.epochs / (done - base)
            duration = (duration + full) / 2
        rounds += 1
        kills += killed
        marks.append(done - base)
        bad = checker.check(image, hist, done)
        if cfg.data_raw:
            bad += raw_data_file_check(image, hist, done, work)
        if bad:
            fails += 1
            if shown < args.show:
                shown += 1
                print("--- FAILURE in %s, seed %d, round %d: killed after %.3f s, last mark epoch %d" % (
                    cfg.describe(), seed, rnd, delay, done))
                for e in range(max(1, done - 1), min(len(hist.ops), done + 2)):
                    print("  guest epoch %d: %s" % (e, hist.ops[e]))
                for m in bad:
                    print("  " + m.replace("\n", "\n  "))
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    dst = os.path.join(args.keep, "%s-seed%d-round%d.qcow2" % (cfg.name, seed, rnd))
                    subprocess.run(["cp", image, dst])
                    print("  kept: %s" % dst)
            # A broken image would fail every later round for the same reason.
            if os.path.exists(image):
                os.unlink(image)
            workload.create_image(args.qcowkit, cfg, image)
            hist = History(cfg.size)
            continue
        hist = settle(runner, hist, done)
    subprocess.run(["rm", "-rf", work])
    print("%s sigkill/%s seed %d: rounds %d (%d killed mid-stream, median %d epochs done before the kill), "
          "failures %d" % ("FAIL" if fails else "PASS", cfg.name, seed, rounds, kills,
                           sorted(marks)[len(marks) // 2] if marks else 0, fails))
    sys.stdout.flush()
    return rounds, fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qcowkit", default=os.environ.get("QCOWKIT", os.path.join(HERE, "../../build/tools/qcowkit")))
    ap.add_argument("--config", action="append")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=300, help="epochs in one stream (it is killed before the end)")
    ap.add_argument("--reuse", type=int, default=8, help="rounds on one image before a fresh one")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--keep", default=None)
    ap.add_argument("--workdir", default=os.environ.get("TEST_DIR", "/var/tmp"))
    ap.add_argument("--list-data-file", action="store_true", help="print the data-file configurations' names")
    args = ap.parse_args()
    if args.list_data_file:
        print("\n".join(c.name for c in workload.DATA_FILE))
        return 0
    cfgs = [c for c in workload.SHORT + workload.DATA_FILE if (not args.config or c.name in args.config)]
    if not cfgs:
        print("no such configuration: %s" % args.config)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print("sigkill: seed %d, %s" % (seed, args.qcowkit))
    total = bad = 0
    for cfg in cfgs:
        cfg.snapshots = False  # one io process per stream; snapshots are powerloss.py's
        r, f = run_config(args, cfg, seed, args.workdir)
        total += r
        bad += f
    print("sigkill: states checked %d (one per kill round), failures %d" % (total, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
