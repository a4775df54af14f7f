#!/usr/bin/env python3
"""Table of bench/mirror.sh: medians per case of the raw rows
(case, writer IOPS, image copied once in s, ready s, complete s, CPU s per
GiB; '-' where a case has none), with the writer's share of the idle
writer's median and the copy time against dd's.

Usage: mirror_table.py RESULTS.tsv BYTES CASE..."""
import statistics
import sys

LABELS = {
    "idle": "no copy (writer alone)",
    "background": "qcowkit mirror, background",
    "write-blocking": "qcowkit mirror, write-blocking",
    "rescan": "qcowkit background, rescan+drain per chunk, passes chase writes (ablation)",
    "dd": "dd iflag=direct oflag=direct bs=4M (reference copy)",
    "qemu-background": "QEMU blockdev-mirror, background, cache.direct=on",
    "qemu-write-blocking": "QEMU blockdev-mirror, write-blocking, cache.direct=on",
    "copy-cost": "qcowkit mirror alone (no writer)",
    "qemu-copy-cost": "QEMU blockdev-mirror alone (no writer)",
}


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def main():
    path, nbytes, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    rows = {}
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        rows.setdefault(f[0], []).append(f[1:])

    def med(case, col):
        vals = [num(r[col]) for r in rows.get(case, [])]
        ok = [v for v in vals if v is not None]
        if not ok:
            return None, "-"
        m = statistics.median(ok)
        spread = "%g-%g" % (min(ok), max(ok)) if len(ok) > 1 else ""
        missing = len(vals) - len(ok)
        note = spread + (" (%d of %d runs without)" % (missing, len(vals)) if missing else "")
        return m, note

    idle, _ = med("idle", 0)
    dd, _ = med("dd", 1)
    print("| case | writer IOPS (median, range) | of idle | image copied once (s) | vs dd | ready (s) "
          "| complete (s) | copier CPU s per GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for c in cases:
        if c not in rows:
            continue
        w, wr = med(c, 0)
        once, _ = med(c, 1)
        ready, rnote = med(c, 2)
        total, _ = med(c, 3)
        cpu, _ = med(c, 4)
        share = "%d%%" % round(100 * w / idle) if w and idle else ""
        vs = "%.2f×" % (once / dd) if once and dd and c != "dd" else ""
        rate = " (%d MB/s)" % (nbytes / once / 1e6) if once else ""
        fmt = lambda v, d=1: "-" if v is None else ("%." + str(d) + "f") % v  # noqa: E731
        print("| %s | %s | %s | %s%s | %s | %s | %s | %s |" % (
            LABELS.get(c, c), "-" if w is None else "%d (%s)" % (w, wr), share, fmt(once), rate, vs,
            fmt(ready) + (" " + rnote if "without" in rnote else ""), fmt(total), fmt(cpu, 2)))


if __name__ == "__main__":
    main()
