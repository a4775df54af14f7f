#!/usr/bin/env python3
"""Depth-1 latency with cache=none: the median and 99th percentile of single
requests (4k, 16k and 64k; random and sequential; reads and writes) on an
allocated 1 GiB qcow2, qcowkit against QEMU's block layer.

qemu-img bench reports only a total time, so both sides are measured the
same way through their interactive I/O tools: `qcowkit io` and `qemu-io`
(aio=native and aio=io_uring; the better median is the bar) each read the
same list of commands from standard input, one request at a time, and
print each one's rate ("... and N ops/sec"); 1/N is that request's
latency, timed by the tool around the request alone (command parsing and
printing are outside it). Beside them, two figures measured by other
means and not part of the ratio: `qcowkit bench -d 1 --output=json`'s own
percentiles on the same image, and fio's (io_uring, O_DIRECT) on a
written raw file, the device's floor. Systems alternate within each run;
each row is repeated (default 5 runs) and the medians of the runs'
percentiles are shown.

Usage: bench/latency.py [--runs N] [--count N] [--only REGEX] [--dir SCRATCH] [--out DIR]
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402  (image preparation, tool paths)
from steady import PATTERNS, SIZES, random_step  # noqa: E402  (the matrix's rows, at depth 1)
SYSTEMS = ("qcowkit io", "qemu-io native", "qemu-io io_uring", "qcowkit bench", "fio")
RATE = re.compile(r" and ([0-9.]+) ops/sec\)")


def offsets(size, random_order, count, seed):
    blocks = suite.GIB // size
    if random_order:
        rng = random.Random(seed)
        return [rng.randrange(blocks) * size for _ in range(count)]
    start = random.Random(seed).randrange(blocks - count) if blocks > count else 0
    return [(start + i) * size % suite.GIB for i in range(count)]


def percentile(sorted_v, p):
    """Nearest rank, as the tools' own percentiles are."""
    if not sorted_v:
        return 0.0
    k = max(0, min(len(sorted_v) - 1, int(round(p * len(sorted_v) + 0.5)) - 1))
    return sorted_v[k]


def per_request_us(cmd, script):
    p = subprocess.run(cmd, input=script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, (p.stdout + p.stderr)[-2000:]))
    lat = sorted(1e6 / float(m) for m in RATE.findall(p.stdout))
    return lat


def run_bench(size, write, random_order, count, img):
    cmd = [suite.QCOWKIT, "bench", "-f", "qcow2", "-c", str(count), "-d", "1", "-s", str(size),
           "-t", "none", "-n", "--output=json"]
    if random_order:
        cmd += ["-S", str(random_step(size))]
    if write:
        cmd += ["-w"]
    out = suite.must(cmd + [img])
    j = json.loads(out[out.index("{"):])
    return j["latency_us"]["p50"], j["latency_us"]["p99"]


def run_fio(size, write, random_order, count, raw):
    rw = ("rand" if random_order else "") + ("write" if write else "read")
    cmd = ["fio", "--name=job", "--filename=" + raw, "--ioengine=io_uring", "--direct=1", "--rw=" + rw,
           "--bs=%d" % size, "--iodepth=1", "--io_size=%d" % (count * size), "--size=%d" % suite.GIB,
           "--lat_percentiles=1", "--percentile_list=50:99", "--output-format=json"]
    if random_order:
        cmd += ["--randrepeat=1", "--norandommap"]
    out = suite.must(cmd)
    j = json.loads(out[out.index("{"):])["jobs"][0]["write" if write else "read"]["lat_ns"]["percentile"]
    return j["50.000000"] / 1000.0, j["99.000000"] / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--count", type=int, default=2000, help="requests per run (default 2000)")
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out", default=os.path.join(suite.TOP, "bench", "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="qk-latency.", dir=a.dir)
    rows = []
    try:
        img = os.path.join(scratch, "img.qcow2")
        raw = os.path.join(scratch, "img.raw")
        suite.prep_qcow2(img, suite.GIB, False, fill=True)
        suite.prep_raw(raw, suite.GIB, "written")
        for size, sname in SIZES:
            for pname, write, random_order in PATTERNS:
                name = "%s %s d1" % (sname, pname)
                if a.only and not re.search(a.only, name):
                    continue
                res = {s: [] for s in SYSTEMS}   # per run: (p50, p99) in microseconds
                for r in range(a.runs):
                    offs = offsets(size, random_order, a.count, seed=1000 * r + size)
                    verb = "write -P 0x5a" if write else "read"
                    script = "".join("%s %d %d\n" % (verb, o, size) for o in offs)
                    order = SYSTEMS if r % 2 == 0 else tuple(reversed(SYSTEMS))
                    for s in order:
                        if s == "qcowkit io":
                            lat = per_request_us([suite.QCOWKIT, "io", "-f", "qcow2", "-t", "none", img], script)
                        elif s.startswith("qemu-io"):
                            lat = per_request_us(["qemu-io", "-f", "qcow2", "-t", "none", "-i", s.split()[1], img],
                                                 script)
                        if s in ("qcowkit io", "qemu-io native", "qemu-io io_uring"):
                            if len(lat) != a.count:
                                raise RuntimeError("%s printed %d rates for %d requests" % (s, len(lat), a.count))
                            res[s].append((percentile(lat, 0.50), percentile(lat, 0.99)))
                        elif s == "qcowkit bench":
                            res[s].append(run_bench(size, write, random_order, a.count, img))
                        else:
                            res[s].append(run_fio(size, write, random_order, a.count, raw))
                        print("  %-16s %-16s run %d: p50 %.1f us, p99 %.1f us" % (name, s, r + 1, *res[s][-1]),
                              file=sys.stderr, flush=True)
                rows.append(dict(workload=name, runs=res))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    med = lambda v: statistics.median(v) if v else 0  # noqa: E731
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(os.path.join(a.out, "latency.json"), "w") as f:
        json.dump(dict(date=stamp, runs=a.runs, count=a.count, rows=rows), f, indent=1)
    lines = ["Depth-1 latency, cache=none, %s; %d cores, kernel %s; %d runs of %d requests, medians of the runs' "
             "percentiles, microseconds." % (stamp, os.cpu_count(), os.uname().release, a.runs, a.count), "",
             "| workload | qcowkit io p50 / p99 | qemu-io best p50 / p99 | qcowkit / qemu p50 | qcowkit / qemu p99 "
             "| qcowkit bench p50 / p99 | fio raw p50 / p99 |",
             "|---|---|---|---|---|---|---|"]
    ok50 = ok99 = 0
    for row in rows:
        p = {s: (med([x[0] for x in row["runs"][s]]), med([x[1] for x in row["runs"][s]])) for s in SYSTEMS}
        best = min(("qemu-io native", "qemu-io io_uring"), key=lambda s: p[s][0])
        q, b = p["qcowkit io"], p[best]
        pairs = list(zip(row["runs"]["qcowkit io"], row["runs"][best]))
        r50 = med([x[0] / y[0] for x, y in pairs if y[0]])
        r99 = med([x[1] / y[1] for x, y in pairs if y[1]])
        ok50 += r50 <= 1.0
        ok99 += r99 <= 1.0
        lines.append("| %s | %.1f / %.1f | %.1f / %.1f (%s) | %.2f | %.2f | %.1f / %.1f | %.1f / %.1f |" % (
            row["workload"], q[0], q[1], b[0], b[1], best.split()[1], r50, r99, *p["qcowkit bench"], *p["fio"]))
    lines += ["", "qcowkit's median no worse than QEMU's in %d of %d rows, its 99th percentile in %d of %d "
              "(a ratio below 1.00 is faster)." % (ok50, len(rows), ok99, len(rows))]
    table = "\n".join(lines)
    with open(os.path.join(a.out, "latency.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
