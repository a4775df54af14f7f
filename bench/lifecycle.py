#!/usr/bin/env python3
"""Image lifecycle rows of the benchmark suite: commit, safe rebase and
resize, qcowkit against qemu-img on identical copies, side by side, the
order alternating per run. Each timed run starts from fresh copies of the
prepared images with the page cache dropped (when allowed), and is timed
end to end (process start to exit, flush included) under /usr/bin/time
for the peak RSS.

- commit: a 4 GiB overlay with 1 GiB written (1 MiB pieces spread over
  the disk) into a 4 GiB base holding 1 GiB (1/8 of each with --quick).
- rebase: an overlay with 256 MiB written, moved from base A onto base B,
  where B is A with 10% of its written clusters changed (1 GiB written in
  A; 1/8 with --quick).
- resize: a fresh 64 GiB qcow2 image grown to 16 TiB.

Used by bench/suite.py (--only lifecycle); alone:
  bench/lifecycle.py [--quick] [--runs N] [--dir SCRATCH] [--qcowkit BIN]
prints the rows as JSON.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

M = 1 << 20
G = 1 << 30


def sh(cmd, cwd=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def qemu_io(img, cmds, cwd):
    # Many -c per process: one open for the whole batch.
    for i in range(0, len(cmds), 256):
        sh(["qemu-io", "-f", "qcow2"] + [a for c in cmds[i:i + 256] for a in ("-c", c)] + [img], cwd)


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def timed(cmd, cwd):
    """(wall seconds, peak RSS KiB) of cmd."""
    fd, tfile = tempfile.mkstemp()
    os.close(fd)
    try:
        t0 = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tfile] + cmd, cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t = time.monotonic() - t0
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
        with open(tfile) as f:
            return t, int(f.read().strip().splitlines()[-1])
    finally:
        os.unlink(tfile)


def prepare(d, quick):
    s = 8 if quick else 1
    size, written = 4 * G // s, G // s
    # commit: base with `written` bytes at the start, overlay with 1 MiB
    # pieces every 4 MiB (a quarter of the disk, spread).
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "cb.qcow2", str(size)], d)
    qemu_io("cb.qcow2", ["write -P 0x11 0 %d" % written], d)
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "cb.qcow2", "-F", "qcow2", "ct.qcow2", str(size)], d)
    qemu_io("ct.qcow2", ["write -P 0x22 %d 1M" % (i * 4 * M) for i in range(written // M)], d)
    # rebase: A written over `written` bytes; B = A with every tenth
    # 64 KiB cluster of that changed; the overlay written in 256 MiB / s.
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "ra.qcow2", str(size)], d)
    qemu_io("ra.qcow2", ["write -P 0x33 0 %d" % written], d)
    shutil.copy(os.path.join(d, "ra.qcow2"), os.path.join(d, "rb.qcow2"))
    qemu_io("rb.qcow2", ["write -P 0x44 %d 64k" % (i * 640 * 1024) for i in range(written // (640 * 1024))], d)
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "ra.qcow2", "-F", "qcow2", "rt.qcow2", str(size)], d)
    qemu_io("rt.qcow2", ["write -P 0x55 %d 1M" % (i * 16 * M) for i in range(256 // s)], d)
    return size, written


def lifecycle_results(quick, runs, scratch, qcowkit):
    d = tempfile.mkdtemp(prefix="lifecycle.", dir=scratch)
    try:
        size, written = prepare(d, quick)
        w = os.path.join(d, "w")
        os.makedirs(w)

        def fresh(files):
            for f in files:
                shutil.copy(os.path.join(d, f), os.path.join(w, f))

        human = lambda b: "%d GiB" % (b >> 30) if b >= G else "%d MiB" % (b >> 20)
        cases = [
            ("commit: %s overlay, %s written, into its base" % (human(size), human(written)),
             lambda: fresh(["cb.qcow2", "ct.qcow2"]), ["commit", "-q", "ct.qcow2"]),
            ("rebase (safe) onto a base differing in 10%% of %s" % human(written),
             lambda: fresh(["rt.qcow2"]), ["rebase", "-b", "rb.qcow2", "-F", "qcow2", "rt.qcow2"]),
            ("resize: 64 GiB qcow2 to 16 TiB",
             lambda: sh(["qemu-img", "create", "-q", "-f", "qcow2", "z.qcow2", "64G"], w),
             ["resize", "-q", "z.qcow2", "16T"]),
        ]
        for f in ("ra.qcow2", "rb.qcow2"):
            shutil.copy(os.path.join(d, f), os.path.join(w, f))
        rows = []
        group = "Image lifecycle: commit, safe rebase, resize (end to end, page cache dropped before each run)"
        for name, setup, args in cases:
            seconds = {"qcowkit": [], "qemu-img": []}
            rss = {"qcowkit": [], "qemu-img": []}
            for r in range(runs):
                order = ["qcowkit", "qemu-img"] if r % 2 == 0 else ["qemu-img", "qcowkit"]
                for sysname in order:
                    setup()
                    drop_caches()
                    prog = qcowkit if sysname == "qcowkit" else "qemu-img"
                    t, m = timed([prog] + args, w)
                    seconds[sysname].append(t)
                    rss[sysname].append(m)
                    print("  %-45s %-40s run %d: %.3f s, %d KiB" % (name, sysname, r + 1, t, m),
                          file=sys.stderr, flush=True)
            rows.append(dict(workload=name, group=group, runs=runs, seconds=seconds, peak_rss_kib=rss,
                             ratios=[("qcowkit / qemu-img", "qcowkit", "qemu-img")]))
        return rows
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--qcowkit", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "build", "tools", "qcowkit"))
    a = ap.parse_args()
    print(json.dumps(lifecycle_results(a.quick, a.runs, a.dir, a.qcowkit), indent=1))
