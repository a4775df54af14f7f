#!/usr/bin/env python3
"""Convert rows of the benchmark suite: qcowkit convert against qemu-img
convert with qemu-img's fastest flags (-m 16 -W -t none -T none; qcowkit
gets the same), on the same inputs, side by side, the order alternating
per run. Each timed run writes a fresh target (the previous one deleted)
with the page cache dropped before it (when allowed), and is timed end to
end (process start to exit, flush included) under /usr/bin/time for the
peak RSS.

- A 4 GiB qcow2 source (1/8 with --quick) in 1 MiB pieces shuffled over
  the disk: half data (16 KiB blocks, half random bytes and half Zipf
  distributed words, which deflate to about a third), a quarter explicit
  zero bytes written as data, a quarter unallocated. Converted to qcow2
  and to raw, against a plain sequential O_DIRECT copy (dd bs=4M) of a
  raw file as large as the source's allocated bytes: the disk's limit.
- An empty 1 TiB qcow2 to qcow2 and to raw.
- The source to compressed qcow2 (-c), zlib and zstd, with the output
  sizes; for zstd against `zstd -T0 -3` (qcow2's zstd level) compressing
  a raw copy of the source to /dev/null, the compressor's limit. There is
  no parallel zlib CLI installed, so zlib has no limit column.

Every output is checked once (first run, outside the timing) against its
source with qemu-img compare, and qcow2 outputs with qemu-img check; the
results go in the row's `verify` field and its note.

Used by bench/suite.py (--only convert); alone:
  bench/convert.py [--quick] [--runs N] [--dir SCRATCH] [--qcowkit BIN]
prints the rows as JSON (and their table on stderr).
"""
import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

K = 1 << 10
M = 1 << 20
G = 1 << 30
T = 1 << 40

QEMU_FLAGS = ["-m", "16", "-W", "-t", "none", "-T", "none"]
DD = "dd bs=4M O_DIRECT copy"
ZSTD = "zstd -T0 -3"


# Shared with the lifecycle rows: the same way of running, timing and
# dropping the page cache.
from lifecycle import drop_caches, qemu_io, sh, timed  # noqa: E402


def background():
    """Other processes busy on the CPUs while the rows run, for the note:
    names, nice values and CPU share over one second."""
    def ticks():
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    s = f.read()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            f = s[s.rindex(")") + 2:].split()
            out[pid] = (name, int(f[16]), int(f[11]) + int(f[12]))  # nice, utime + stime
        return out
    a = ticks()
    time.sleep(1)
    b = ticks()
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(((b[p][2] - a[p][2]) / hz, b[p][0], b[p][1]) for p in b if p in a)
    busy = [x for x in busy if x[0] >= 0.2]
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    if not busy:
        return "no other busy process (load average %s)" % load
    return "%d other busy process(es): %s (load average %s)" % (
        len(busy), ", ".join("%s nice %d at %.0f%% CPU" % (n, ni, 100 * c) for c, n, ni in reversed(busy)), load)


def text_pool(rng, size):
    """size bytes of lines of words drawn Zipf-like from 4096 random words."""
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(4096)]
    cw = list(itertools.accumulate(1.0 / (i + 1) for i in range(4096)))
    out, n = [], 0
    while n < size:
        line = " ".join(rng.choices(vocab, cum_weights=cw, k=rng.randint(4, 16))).encode() + b"\n"
        out.append(line)
        n += len(line)
    return b"".join(out)[:size]


def prepare(d, quick):
    """The source image src.qcow2, its raw copy src.raw (sparse), and
    dd.raw, a written raw file the size of the source's allocated bytes.
    Returns (size, data bytes, zero bytes)."""
    s = 8 if quick else 1
    size = 4 * G // s
    n = size // M
    rng = random.Random(20240501)
    kinds = ["d"] * (n // 2) + ["z"] * (n // 4) + ["u"] * (n - n // 2 - n // 4)
    rng.shuffle(kinds)
    pool = text_pool(rng, 64 * M // s)
    blk = 16 * K
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "src.qcow2", str(size)], d)
    pieces = os.path.join(d, "pieces")
    os.makedirs(pieces)
    batch = 256
    for b0 in range(0, n, batch):
        cmds = []
        for i in range(b0, min(b0 + batch, n)):
            if kinds[i] == "z":
                cmds.append("write -q -P 0 %d 1M" % (i * M))
            elif kinds[i] == "d":
                parts = []
                for _ in range(M // blk):
                    if rng.random() < 0.5:
                        parts.append(rng.randbytes(blk))
                    else:
                        o = rng.randrange(len(pool) - blk)
                        parts.append(pool[o:o + blk])
                pf = os.path.join(pieces, "p%d" % i)
                with open(pf, "wb") as f:
                    f.write(b"".join(parts))
                cmds.append("write -q -s %s %d 1M" % (pf, i * M))
        if cmds:
            qemu_io("src.qcow2", cmds, d)
        for f in os.listdir(pieces):
            os.unlink(os.path.join(pieces, f))
    os.rmdir(pieces)
    sh(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", "src.qcow2", "src.raw"], d)
    data, zero = kinds.count("d") * M, kinds.count("z") * M
    sh(["dd", "if=/dev/urandom", "of=dd.raw", "bs=4M", "count=%d" % ((data + zero) // (4 * M)),
        "iflag=fullblock", "oflag=direct", "status=none"], d)
    return size, data, zero


def rm(d, *names):
    for f in names:
        try:
            os.unlink(os.path.join(d, f))
        except FileNotFoundError:
            pass


def human(b):
    if b >= T:
        return "%d TiB" % (b >> 40)
    return "%d GiB" % (b >> 30) if b >= G and b % G == 0 else "%d MiB" % (b >> 20)


def convert_results(quick, runs, scratch, qcowkit):
    d = tempfile.mkdtemp(prefix="convert.", dir=scratch)
    try:
        size, data, zero = prepare(d, quick)
        alloc = data + zero
        sh(["qemu-img", "create", "-q", "-f", "qcow2", "empty.qcow2", str(T)], d)
        dd = ["dd", "if=dd.raw", "of=dd.out", "bs=4M", "iflag=direct", "oflag=direct", "status=none"]
        zstd = ["zstd", "-q", "-T0", "-3", "-f", "-o", "/dev/null", "src.raw"]
        empty = "empty %s" % human(T)
        # (name, source, output, output format, convert flags, limit system, its command)
        cases = [
            ("source to qcow2", "src.qcow2", "out.qcow2", "qcow2", ["-O", "qcow2"], DD, dd),
            ("source to raw", "src.qcow2", "out.raw", "raw", ["-O", "raw"], DD, dd),
            ("%s to qcow2" % empty, "empty.qcow2", "out.qcow2", "qcow2", ["-O", "qcow2"], None, None),
            ("%s to raw" % empty, "empty.qcow2", "out.raw", "raw", ["-O", "raw"], None, None),
            ("source to qcow2 -c (zlib)", "src.qcow2", "out.qcow2", "qcow2", ["-c", "-O", "qcow2"], None, None),
            ("source to qcow2 -c -o compression_type=zstd", "src.qcow2", "out.qcow2", "qcow2",
             ["-c", "-O", "qcow2", "-o", "compression_type=zstd"], ZSTD, zstd),
        ]
        zstd_size = None
        rows = []
        group = ("Convert: qemu-img convert -m 16 -W -t none -T none and qcowkit convert with the same flags; "
                 "source: a %s qcow2 of %s data, %s zeros written as data, the rest unallocated, in 1 MiB "
                 "pieces (end to end, fresh target, page cache dropped before each run)"
                 % (human(size), human(data), human(zero)))
        for name, src, out, fmt, flags, limit, limit_cmd in cases:
            systems = ["qcowkit", "qemu-img"] + ([limit] if limit else [])
            seconds = {k: [] for k in systems}
            rss = {k: [] for k in systems}
            sizes = {"qcowkit": [], "qemu-img": []}
            verify = {}
            bg = [background()]
            for r in range(runs):
                order = systems if r % 2 == 0 else list(reversed(systems))
                for sysname in order:
                    rm(d, out, "dd.out")
                    drop_caches()
                    if sysname == limit:
                        cmd = limit_cmd
                    else:
                        prog = qcowkit if sysname == "qcowkit" else "qemu-img"
                        cmd = [prog, "convert", "-q", "-f", "qcow2"] + flags + QEMU_FLAGS + [src, out]
                    t, m = timed(cmd, d)
                    seconds[sysname].append(t)
                    rss[sysname].append(m)
                    extra = ""
                    if sysname in sizes:
                        st = os.stat(os.path.join(d, out))
                        sizes[sysname].append(dict(file=st.st_size, allocated=st.st_blocks * 512))
                        extra = ", output %d bytes (%d allocated)" % (st.st_size, st.st_blocks * 512)
                        if r == 0:
                            # Outside the timing: does the output read as the source?
                            p = subprocess.run(["qemu-img", "compare", "-f", "qcow2", "-F", fmt, src, out], cwd=d,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                            v = ["compare: %s" % (p.stdout.strip().splitlines() or ["rc %d" % p.returncode])[-1].rstrip(".")]
                            ok = p.returncode == 0
                            if fmt == "qcow2":
                                p = subprocess.run(["qemu-img", "check", "-f", "qcow2", out], cwd=d,
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                                v.append("check: %s" % ("no errors" if p.returncode == 0 else
                                                        "rc %d: %s" % (p.returncode, p.stdout.strip()[-300:])))
                                ok = ok and p.returncode == 0
                            verify[sysname] = dict(ok=ok, detail="; ".join(v))
                            extra += "; " + verify[sysname]["detail"]
                    print("  %-45s %-40s run %d: %.3f s, %d KiB%s" % (name[:45], sysname, r + 1, t, m, extra),
                          file=sys.stderr, flush=True)
            rm(d, out, "dd.out")
            bg.append(background())
            ratios = [("qcowkit / qemu-img", "qcowkit", "qemu-img")]
            if limit:
                ratios.append(("qcowkit / limit", "qcowkit", limit))
                ratios.append(("qemu-img / limit", "qemu-img", limit))
            note = [name + ":"]
            med = {k: (statistics.median(x["file"] for x in v), statistics.median(x["allocated"] for x in v))
                   for k, v in sizes.items()}
            note.append("Output size (median, file / allocated bytes): qcowkit %d / %d, qemu-img %d / %d." % (
                med["qcowkit"] + med["qemu-img"]))
            if limit == DD:
                note.append("The limit is dd copying %s (the source's allocated bytes: data and zeros) from a "
                            "written raw file to a new one, bs=4M, iflag=direct oflag=direct; the converts read "
                            "those %s and write %s." % (human(alloc), human(alloc), human(data)))
            if "-c" in flags:
                note.append("Compressed file size qcowkit / qemu-img %.4f; qcowkit's is %.1f%%, qemu-img's "
                            "%.1f%% of the %s of data." % (
                                med["qcowkit"][0] / med["qemu-img"][0], 100.0 * med["qcowkit"][0] / data,
                                100.0 * med["qemu-img"][0] / data, human(data)))
                if limit == ZSTD:
                    if zstd_size is None:
                        zstd_size = len_of(["zstd", "-q", "-T0", "-3", "-c", "src.raw"], d)
                    note.append("The limit is `zstd -T0 -3 -o /dev/null` on a raw copy of the source (%s, sparse "
                                "where the source has zeros or nothing), after a cache drop; its output is %d "
                                "bytes (a single stream, not per cluster)." % (human(size), zstd_size))
                else:
                    note.append("No limit column: there is no parallel zlib CLI on this machine (pigz is not "
                                "installed), and a single-threaded gzip would not be the compressor's limit.")
            bad = [k for k, v in verify.items() if not v["ok"]]
            note.append("Verified once outside the timing (qemu-img compare against the source%s): %s." % (
                ", qemu-img check" if fmt == "qcow2" else "",
                "; ".join("%s: %s" % (k, v["detail"]) for k, v in verify.items())))
            if bad:
                note.append("OUTPUT MISMATCH OR CHECK ERROR: %s." % ", ".join(bad))
            note.append("Background, sampled for a second before the row: %s; after it: %s." % tuple(bg))
            rows.append(dict(workload=name, group=group, runs=runs, seconds=seconds, peak_rss_kib=rss,
                             ratios=ratios, output_bytes=sizes, verify=verify, command_flags=flags + QEMU_FLAGS,
                             background=bg, note=" ".join(note)))
            if zstd_size is not None:
                rows[-1]["zstd_cli_output_bytes"] = zstd_size
        return rows
    finally:
        shutil.rmtree(d, ignore_errors=True)


def len_of(cmd, cwd):
    """Length of cmd's standard output, read in pieces."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE)
    n = 0
    while True:
        b = p.stdout.read(M)
        if not b:
            break
        n += len(b)
    if p.wait() != 0:
        raise RuntimeError("%s failed (%d)" % (" ".join(cmd), p.returncode))
    return n


def table(rows):
    """The rows as the suite prints them (Markdown, medians ± spread)."""
    from suite import fmt_cell, ratio_cells
    cols, rcols = [], []
    for r in rows:
        cols += [s for s in r["seconds"] if s not in cols]
        rcols += [label for label, _ in ratio_cells(r) if label not in rcols]
    lines = ["| workload | " + " | ".join(cols + rcols) + " | peak RSS KiB (median) |",
             "|---" * (len(cols) + len(rcols) + 2) + "|"]
    for r in rows:
        ratios = dict(ratio_cells(r))
        cells = [fmt_cell(r["seconds"].get(c, [])) for c in cols] + [ratios.get(c, "–") for c in rcols]
        cells.append(", ".join("%s %d" % (k, statistics.median(v)) for k, v in r["peak_rss_kib"].items() if v))
        lines.append("| %s | %s |" % (r["workload"], " | ".join(cells)))
    lines.append("")
    lines += [r["note"] + "\n" for r in rows if r.get("note")]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--qcowkit", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "build", "tools", "qcowkit"))
    a = ap.parse_args()
    res = convert_results(a.quick, a.runs, a.dir, a.qcowkit)
    print(json.dumps(res, indent=1))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(table(res), file=sys.stderr)
