#!/usr/bin/env python3
"""Power-loss crash test: runs a random workload on a fresh image with the
write log on, then rebuilds crash states from the log (replay.py) and
judges each (check.py). Prints one PASS/FAIL line per configuration, the
first failures in detail (configuration, the guest operations around the
crash, the log records applied and dropped, the check output), and at the
end "states checked N, failures N".

Usage: powerloss.py [--qcowkit PATH] [--config NAME]... [--seed N]
                    [--epochs N] [--cap-per-point N] [--cap-total N]
                    [--keep DIR] [--long]
"""
import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check      # noqa: E402
import replay     # noqa: E402
import wlog       # noqa: E402
import workload   # noqa: E402


def run_config(args, cfg, seed, top):
    work = tempfile.mkdtemp(prefix="pl-%s." % cfg.name, dir=top)
    image = os.path.join(work, "disk.qcow2")
    init = os.path.join(work, "init.qcow2")
    log = os.path.join(work, "writes.log")
    workload.create_image(args.qcowkit, cfg, image)
    shutil.copyfile(image, init)
    hist = workload.run_workload(args.qcowkit, cfg, image, log, work, seed)
    recs = wlog.records_for(wlog.read_log(log), image)
    with open(init, "rb") as f:
        init_bytes = f.read()
    checker = check.Checker(args.qcowkit, work)
    rng = random.Random(seed)
    state_file = os.path.join(work, "state.qcow2")
    n = failed = 0
    shown = 0
    seen = set()
    tolerated = 0
    for st, data in replay.states(init_bytes, recs, seed, args.cap_per_point, args.cap_total):
        # Different subsets often give the same bytes (a dropped write that
        # a later one overwrote); judging them again would say the same.
        key = (hashlib.sha1(data).digest(), st.epoch)
        if key in seen:
            continue
        seen.add(key)
        with open(state_file, "wb") as f:
            f.write(data)
        fails = checker.check(state_file, hist, st.epoch, deep=rng.random() < args.deep, rng=rng)
        n += 1
        tolerated += checker.tolerated
        if fails:
            failed += 1
            if shown < args.show:
                shown += 1
                print("--- FAILURE in %s, seed %d" % (cfg.describe(), seed))
                print("  state: %s" % st.describe(recs))
                for e in range(max(1, st.epoch - 1), min(len(hist.ops), st.epoch + 2)):
                    print("  guest epoch %d: %s" % (e, hist.ops[e]))
                for msg in fails:
                    print("  " + msg.replace("\n", "\n  "))
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    dst = os.path.join(args.keep, "%s-seed%d-state%d" % (cfg.name, seed, n))
                    shutil.copyfile(state_file, dst + ".qcow2")
                    shutil.copyfile(log, dst + ".log")
                    shutil.copyfile(init, dst + ".init.qcow2")
                    print("  kept: %s.{qcow2,log,init.qcow2}" % dst)
    shutil.rmtree(work, ignore_errors=True)
    writes = sum(1 for r in recs if r.type in replay.MODIFY)
    flushes = sum(1 for r in recs if r.type == wlog.FLUSH_END)
    note = ""
    if tolerated:
        note = " (%d in a snapshot operation's COPIED-flag window, as QEMU leaves it: tolerated)" % tolerated
    print("%s powerloss/%s seed %d: %d epochs, %d host writes, %d flushes, states checked %d%s, failures %d"
          % ("FAIL" if failed else "PASS", cfg.name, seed, hist.epochs(), writes, flushes, n, note, failed))
    sys.stdout.flush()
    return n, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qcowkit", default=os.environ.get("QCOWKIT", os.path.join(HERE, "../../build/tools/qcowkit")))
    ap.add_argument("--config", action="append", help="configuration name (default: all)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=1, help="workloads per configuration (seeds)")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--cap-per-point", type=int, default=12)
    ap.add_argument("--cap-total", type=int, default=None)
    ap.add_argument("--deep", type=float, default=0.2, help="share of states whose snapshots are applied")
    ap.add_argument("--show", type=int, default=3, help="failures shown per configuration")
    ap.add_argument("--keep", default=None, help="copy failing states and their logs here")
    ap.add_argument("--workdir", default=os.environ.get("TEST_DIR", "/var/tmp"))
    ap.add_argument("--list", action="store_true", help="print the configuration names")
    args = ap.parse_args()
    if args.list:
        print(" ".join(c.name for c in workload.SHORT))
        return 0
    cfgs = [c for c in workload.SHORT if not args.config or c.name in args.config]
    if not cfgs:
        print("no such configuration: %s" % args.config)
        return 2
    seed0 = args.seed if args.seed is not None else random.randrange(1 << 30)
    print("powerloss: seed %d, %s" % (seed0, args.qcowkit))
    total = bad = 0
    any_fail = False
    for cfg in cfgs:
        if args.epochs:
            cfg.epochs = args.epochs
        for r in range(args.rounds):
            n, f = run_config(args, cfg, seed0 + r, args.workdir)
            total += n
            bad += f
            any_fail |= f > 0
    print("powerloss: states checked %d, failures %d" % (total, bad))
    return 1 if any_fail else 0


if __name__ == "__main__":
    sys.exit(main())
