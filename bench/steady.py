#!/usr/bin/env python3
"""Steady-state VM disk I/O with cache=none: 4k, 16k and 64k random and
sequential reads and writes at depths 1, 8, 32 and 128 on an allocated
1 GiB image, for qcowkit bench, qemu-img bench with aio=native and with
aio=io_uring (the better of the two is the bar), and fio on a written raw
file. qcowkit bench runs twice: with its default buffers (one region
advised to use huge pages, as a VM's RAM is) and with --plain-buffers
(one allocation per request buffer, as qemu-img bench does), so the
engine alone compares with the latter. Systems alternate within each
run; every row is repeated (default 5 runs) and medians are shown. Next
to each system's IOPS the device's own view of its run (from
/sys/block/DEV/stat): the average queue depth and the average device
time per request, so a reader can tell whether a difference comes from
the device or from the host.

Usage: bench/steady.py [--runs N] [--quick] [--only REGEX] [--dir SCRATCH] [--out DIR]
"""
import argparse
import json
import re
import os
import statistics
import sys
import tempfile
import shutil
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402  (shared helpers: image preparation, runners)

SIZES = ((4096, "4k"), (16384, "16k"), (65536, "64k"))
DEPTHS = (1, 8, 32, 128)
PATTERNS = (("randread", False, True), ("randwrite", True, True), ("read", False, False), ("write", True, False))


def random_step(size):
    """qemu-img bench's -S for random rows: an odd number of blocks, prime
    to the image's power-of-two block count, so the requests visit every
    block; under 2 GiB."""
    return size * ((165900288 // size) | 1)


def device_of(path):
    """The whole-disk block device holding path (e.g. vda), or None."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysdev = "/sys/dev/block/%d:%d" % (major, minor)
    if not os.path.exists(sysdev):
        return None
    real = os.path.realpath(sysdev)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return os.path.basename(real)


def dev_stat(dev):
    if not dev:
        return None
    with open("/sys/block/%s/stat" % dev) as f:
        v = [int(x) for x in f.read().split()]
    # reads, read ticks, writes, write ticks, time in queue (weighted)
    return dict(ios=v[0] + v[4], ticks=v[3] + v[7], queue=v[10], t=time.monotonic())


def dev_view(a, b):
    if not a or not b:
        return None
    ios = b["ios"] - a["ios"]
    ms = (b["t"] - a["t"]) * 1000
    return dict(depth=(b["queue"] - a["queue"]) / ms if ms else 0, ms_per_io=(b["ticks"] - a["ticks"]) / ios if ios else 0)


def count_for(size, depth, quick):
    base = {1: 8000, 8: 40000, 32: 80000, 128: 80000}[depth] * 4096 // size
    base = max(base, 2000)
    return base // 4 if quick else base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out", default=os.path.join(suite.TOP, "bench", "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="qk-steady.", dir=a.dir)
    dev = device_of(scratch)
    rows = []
    try:
        qimg = os.path.join(scratch, "img.qcow2")
        raw = os.path.join(scratch, "img.raw")
        suite.prep_qcow2(qimg, suite.GIB, False, fill=True)
        suite.prep_raw(raw, suite.GIB, "written")
        for size, sname in SIZES:
            for pname, write, random in PATTERNS:
                for depth in DEPTHS:
                    name = "%s %s d%d" % (sname, pname, depth)
                    if a.only and not re.search(a.only, name):
                        continue
                    w = dict(count=count_for(size, depth, a.quick), depth=depth, size=size, write=write,
                             random=random, cache="none", image=suite.GIB)
                    if random:
                        w["step"] = random_step(size)
                    systems = ("qcowkit", "qcowkit plain", "qemu-img native", "qemu-img io_uring", "fio",
                               "qcowkit raw")
                    iops = {s: [] for s in systems}
                    view = {s: [] for s in systems}
                    for r in range(a.runs):
                        order = systems if r % 2 == 0 else tuple(reversed(systems))
                        for s in order:
                            before = dev_stat(dev)
                            if s == "qcowkit":
                                t, _ = suite.run_qcowkit(w, qimg, [])
                            elif s == "qcowkit plain":
                                t, _ = suite.run_qcowkit(w, qimg, ["--plain-buffers"])
                            elif s == "qcowkit raw":
                                out, _ = suite.timed([suite.QCOWKIT, "bench", "-f", "raw"] + suite.bench_args(w) + [raw])
                                t = suite.bench_seconds(out)
                            elif s == "fio":
                                t, _ = suite.run_fio(w, raw)
                            else:
                                out, _ = suite.timed(["qemu-img", "bench", "-f", "qcow2", "-i", s.split()[1]]
                                                     + suite.bench_args(w) + [qimg])
                                t = suite.bench_seconds(out)
                            v = dev_view(before, dev_stat(dev))
                            iops[s].append(w["count"] / t if t else 0)
                            if v:
                                view[s].append(v)
                            print("  %-22s %-18s run %d: %.0f IOPS" % (name, s, r + 1, iops[s][-1]),
                                  file=sys.stderr, flush=True)
                    rows.append(dict(workload=name, iops=iops, device=view))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    med = lambda v: statistics.median(v) if v else 0  # noqa: E731
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(os.path.join(a.out, "steady.json"), "w") as f:
        json.dump(dict(date=stamp, device=dev, runs=a.runs, rows=rows), f, indent=1)
    lines = ["Steady-state cache=none matrix, %s; %d cores, device %s, kernel %s; %d runs each, medians."
             % (stamp, os.cpu_count(), dev, os.uname().release, a.runs), "",
             "| workload | qcowkit IOPS | qemu-img best IOPS | fio IOPS | qcowkit / qemu-img "
             "| plain buffers / qemu-img | qcowkit / fio "
             "| qcowkit raw / fio | device depth q/Q/f | device ms per request q/Q/f |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = med(r["iops"]["qcowkit"])
        best = max(("qemu-img native", "qemu-img io_uring"), key=lambda s: med(r["iops"][s]))
        qb, fi = med(r["iops"][best]), med(r["iops"]["fio"])
        dv = lambda s, k: med([x[k] for x in r["device"][s]])  # noqa: E731
        qr = med(r["iops"]["qcowkit raw"])
        qp = med(r["iops"]["qcowkit plain"])
        lines.append("| %s | %.0f | %.0f (%s) | %.0f | %.2f | %.2f | %.2f | %.2f | %.1f / %.1f / %.1f "
                     "| %.3f / %.3f / %.3f |" % (
            r["workload"], q, qb, best.split()[1], fi, q / qb if qb else 0, qp / qb if qb else 0,
            q / fi if fi else 0, qr / fi if fi else 0,
            dv("qcowkit", "depth"), dv(best, "depth"), dv("fio", "depth"),
            dv("qcowkit", "ms_per_io"), dv(best, "ms_per_io"), dv("fio", "ms_per_io")))
    table = "\n".join(lines)
    with open(os.path.join(a.out, "steady.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
