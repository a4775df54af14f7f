#!/usr/bin/env python3
"""qcowkit benchmark suite: runs each workload on every system side by side,
N times, on fresh scratch images, and prints Markdown tables of medians with
their spread plus ratio columns. Results also go to JSON, and a gnuplot PNG
shows the ratios per workload.

Usage: bench/suite.py [--quick | --full] [--runs N] [--only SUBSTR]
                      [--out DIR] [--dir SCRATCH]

Systems: qcowkit, qcowkit with an ablation option where a workload has one,
qemu-img bench (QEMU from Debian), fio on a raw file (fully written, or
preallocated with fallocate, and fresh) as the physical limit.
Timing comes from each tool's own report ("Run completed in X seconds." or
fio's job runtime), so image creation is never counted. Peak resident memory
is measured with /usr/bin/time.

The convert rows (--only convert) come from bench/convert.py: qcowkit
convert against qemu-img convert -m 16 -W -t none -T none on a generated
4 GiB qcow2 (to qcow2, to raw, compressed with zlib and zstd) and an empty
1 TiB one, end to end, with dd and zstd -T0 as the disk's and the
compressor's limits.

The persistent-bitmap rows (--only bitmaps) come from bench/bitmaps.sh,
the incremental-backup rows (--only backup) from bench/backup.sh, the
RBD rows (--only rbd) from bench/rbd.sh, which starts a Ceph cluster.
The VM-state rows (--only vmstate) come from bench/vmstate.sh: saving a
migration-like stream of pseudo-random pages (256 MiB with --quick, else
2 GiB) through the buffered writer, the unbuffered path and the CLI pipe,
against fio writing the same number of bytes sequentially in 1 MiB blocks;
loading it back against fio's sequential read. qemu-img has no VM-state
path, so the ratios are against fio.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lifecycle import lifecycle_results  # noqa: E402
from convert import convert_results  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QCOWKIT = os.environ.get("QCOWKIT_BIN", os.path.join(TOP, "build", "tools", "qcowkit"))
GIB = 1 << 30


def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def must(cmd):
    p = sh(cmd)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p.stdout


def timed(cmd):
    """Runs cmd under /usr/bin/time; returns (stdout, peak RSS KiB)."""
    fd, tfile = tempfile.mkstemp()
    os.close(fd)
    try:
        p = sh(["/usr/bin/time", "-f", "%M", "-o", tfile] + cmd)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
        with open(tfile) as f:
            rss = int(f.read().strip().splitlines()[-1])
        return p.stdout, rss
    finally:
        os.unlink(tfile)


def bench_seconds(out):
    m = re.search(r"Run completed in ([0-9.]+) seconds", out)
    if not m:
        raise RuntimeError("no 'Run completed' line in:\n" + out[-2000:])
    return float(m.group(1))


# ---- image preparation -------------------------------------------------

def prep_qcow2(path, size, ext_l2, fill=False):
    if os.path.exists(path):
        os.unlink(path)
    must(["qemu-img", "create", "-q", "-f", "qcow2", "-o",
          "extended_l2=%s" % ("on" if ext_l2 else "off"), path, str(size)])
    if fill:
        must(["qemu-io", "-f", "qcow2", "-t", "none", "-c", "write -P 0x5a 0 %d" % size, path])


def prep_raw(path, size, mode):
    if os.path.exists(path):
        os.unlink(path)
    if mode == "fresh":
        must(["truncate", "-s", str(size), path])
    elif mode == "falloc":
        must(["fallocate", "-l", str(size), path])
    else:  # fully written
        must(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=%d" % (size >> 20),
              "oflag=direct", "status=none"])


def prepare_cache(w, path):
    """With cache=writeback every system starts from the same page cache:
    reads from the whole image cached (otherwise whoever runs first pays
    for the disk reads and the others get them for free), writes from an
    empty cache (a sequential read-in leaves large folios, and 4k writes
    into those cost the file system about ten times more, for everyone)."""
    if w["cache"] != "writeback" or w["fresh"]:
        return
    if w["write"]:
        sh(["sync"])
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass  # not allowed here: every system gets the cache as it is
        return
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


# ---- systems -----------------------------------------------------------

def bench_args(w):
    a = ["-c", str(w["count"]), "-d", str(w["depth"]), "-s", str(w["size"]), "-t", w["cache"]]
    if w.get("offset"):
        a += ["-o", str(w["offset"])]
    if w.get("step"):
        a += ["-S", str(w["step"])]
    if w["write"]:
        a += ["-w"]
    if w["cache"] in ("none", "directsync"):
        a += ["-n"]
    return a


def run_qcowkit(w, img, extra):
    out, rss = timed([QCOWKIT, "bench", "-f", "qcow2"] + bench_args(w) + extra + [img])
    return bench_seconds(out), rss


def run_qemu(w, img):
    out, rss = timed(["qemu-img", "bench", "-f", "qcow2"] + bench_args(w) + [img])
    return bench_seconds(out), rss


def run_fio(w, raw):
    rw = ("rand" if w.get("random") else "") + ("write" if w["write"] else "read")
    cmd = ["fio", "--name=job", "--filename=" + raw, "--ioengine=io_uring",
           "--direct=%d" % (1 if w["cache"] in ("none", "directsync") else 0),
           "--rw=" + rw, "--bs=%d" % w["size"], "--iodepth=%d" % w["depth"],
           "--io_size=%d" % (w["count"] * w["size"]), "--size=%d" % w["image"],
           "--offset=%d" % w.get("offset", 0), "--output-format=json"]
    if w.get("random"):
        cmd += ["--randrepeat=1", "--norandommap"]
    out, rss = timed(cmd)
    j = json.loads(out[out.index("{"):])
    return j["jobs"][0]["job_runtime"] / 1000.0, rss


# ---- workloads ---------------------------------------------------------

def workloads(quick):
    c_small = 20000 if quick else 100000
    c_4k = 50000 if quick else 200000
    c_64k = 4000 if quick else 16384
    wl = []
    for ext in (True, False):
        for name, size, off in (("2K", 2048, 0), ("2K -o 512", 2048, 512), ("2560", 2560, 0)):
            wl.append(dict(group="small writes into a fresh 1G image (-d 8 -w -t none -n)",
                           name="-s %s, extended_l2=%s" % (name, "on" if ext else "off"),
                           count=c_small, depth=8, size=size, offset=off, write=True, cache="none",
                           image=GIB, ext_l2=ext, fresh=True,
                           ablation=["--strict-alloc-deps"] if ext else None,
                           fio=["falloc", "written", "fresh"]))
    for cache in ("none", "writeback"):
        for write in (True, False):
            wl.append(dict(group="4k random I/O at depth 32 on an allocated 1G image",
                           name="4k rand%s, cache=%s" % ("write" if write else "read", cache),
                           count=c_4k, depth=32, size=4096, step=4096 * 40503, write=write,
                           random=True, cache=cache, image=GIB, ext_l2=False, fresh=False,
                           fio=["written"]))
            wl.append(dict(group="64k sequential I/O on an allocated 1G image",
                           name="64k seq %s, cache=%s" % ("write" if write else "read", cache),
                           count=c_64k, depth=8, size=65536, write=write, cache=cache,
                           image=GIB, ext_l2=False, fresh=False, fio=["written"]))
    return wl


# ---- VM state (measured by bench/vmstate.sh) ----------------------------

VM_FIO = "fio raw 1M seq"
# (column, bench/vmstate.sh's key, ratio column)
VM_SYSTEMS = (("qcowkit", "buf", "qcowkit / fio"), ("qcowkit unbuffered", "unbuf", "unbuffered / fio"),
              ("qcowkit snapshot -c (pipe)", "cli", "pipe / fio"), (VM_FIO, None, None))


def vmstate_results(quick, runs, scratch):
    """Runs bench/vmstate.sh once (every system in each of its runs, side
    by side) and turns its per-run seconds into suite rows."""
    size = (256 << 20) if quick else (2 << 30)
    jf = os.path.join(scratch, "vmstate.json")
    env = dict(os.environ, QCOWKIT_BIN=QCOWKIT)
    p = sh(["bash", os.path.join(TOP, "bench", "vmstate.sh"), "--json", jf, "--dir", scratch,
            str(runs), str(size)], env=env)
    if p.returncode != 0:
        raise RuntimeError("bench/vmstate.sh failed (%d):\n%s" % (p.returncode, p.stdout[-3000:]))
    with open(jf) as f:
        j = json.load(f)
    sec = j["seconds"]
    group = "VM state: a %d MiB migration-like stream of pseudo-random pages (131,328-byte pieces)" % (size >> 20)
    out = []
    for cache in ("none", "writeback"):
        seconds = {name: sec["fio-write-" + cache] if key is None else sec["save-%s-%s" % (key, cache)]
                   for name, key, _ in VM_SYSTEMS}
        out.append(dict(workload="save, cache=%s" % cache, group=group, runs=runs, seconds=seconds,
                        peak_rss_kib={"qcowkit": j["save_maxrss_kib"]} if cache == "none" else {},
                        ratios=[(label, name, VM_FIO) for name, key, label in VM_SYSTEMS if key]))
    out.append(dict(workload="load, cache=none", group=group, runs=runs,
                    seconds={"qcowkit": sec["load-buf-none"], VM_FIO: sec["fio-read-none"]},
                    peak_rss_kib={}, ratios=[("qcowkit / fio", "qcowkit", VM_FIO)]))
    note = ("qcowkit is the buffered writer (reader with read-ahead for the load) driven through the "
            "public API; fio writes a fresh raw file (O_DIRECT io_uring depth 8 for none, buffered + "
            "fsync for writeback) and reads it back with O_DIRECT. Writer buffers at peak: %d bytes; "
            "max RSS: generator + library %d KiB (includes its 64 MiB data pool), qcowkit snapshot "
            "(pipe) %d KiB." % (statistics.median(j["writer_peak_buffers"]),
                                statistics.median(j["save_maxrss_kib"]),
                                statistics.median(j["cli_maxrss_kib"])))
    out[0]["note"] = note
    for r in out:
        for name, vals in r["seconds"].items():
            print("  %-45s %-40s runs: %s s" % (r["workload"], name, ", ".join("%.3f" % v for v in vals)),
                  file=sys.stderr, flush=True)
    return out


def ratio_cells(r):
    """(column, text) pairs of a result row's ratio columns."""
    med = {c: statistics.median(v) for c, v in r["seconds"].items() if v}
    if "ratios" in r:
        return [(label, "%.2f" % (med[a] / med[b]) if med.get(a) and med.get(b) else "–")
                for label, a, b in r["ratios"]]
    ratio_q = "%.2f" % (med["qcowkit"] / med["qemu-img"]) if med.get("qemu-img") else "–"
    fio_keys = [c for c in med if c.startswith("fio") and ("falloc" in c or c.endswith("written"))]
    fk = "fio raw falloc" if "fio raw falloc" in med else (fio_keys[0] if fio_keys else None)
    ratio_f = "%.2f (%s)" % (med["qcowkit"] / med[fk], fk.split()[-1]) if fk else "–"
    rs = r["peak_rss_kib"]
    ratio_m = "%.2f" % (statistics.median(rs["qcowkit"]) / statistics.median(rs["qemu-img"])) if rs.get("qemu-img") else "–"
    return [("qcowkit / qemu-img", ratio_q), ("qcowkit / fio", ratio_f), ("qcowkit RSS / qemu-img RSS", ratio_m)]


def selected(only, *fields):
    return not only or any(only.lower() in f.lower() for f in fields)


def fmt_cell(vals, unit="s"):
    if not vals:
        return "–"
    med = statistics.median(vals)
    spread = 100.0 * (max(vals) - min(vals)) / (2 * med) if med else 0
    return "%.3f %s ± %.0f%%" % (med, unit, spread)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--only", default="")
    extra_md = []
    ap.add_argument("--out", default=os.path.join(TOP, "bench", "results"))
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    runs = a.runs or (1 if a.quick else 5 if a.full else 3)
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="qk-suite.", dir=a.dir)
    results = []
    try:
        qimg = os.path.join(scratch, "img.qcow2")
        raw = os.path.join(scratch, "img.raw")
        filled = {}
        for w in workloads(a.quick):
            if not selected(a.only, w["name"], w["group"]):
                continue
            systems = {"qcowkit": [], "qemu-img": []}
            if w.get("ablation"):
                systems["qcowkit " + " ".join(w["ablation"])] = []
            for m in w["fio"]:
                systems["fio raw " + m] = []
            rss = {k: [] for k in systems}
            for r in range(runs):
                # Alternate the order so drift on a shared disk hits every system.
                order = list(systems) if r % 2 == 0 else list(reversed(list(systems)))
                for sysname in order:
                    if sysname.startswith("fio"):
                        mode = sysname.split()[-1]
                        if w["fresh"] or mode != "written" or raw not in filled:
                            prep_raw(raw, w["image"], mode)
                            filled[raw] = mode == "written"
                        prepare_cache(w, raw)
                        t, m = run_fio(w, raw)
                    else:
                        key = ("q", w["ext_l2"])
                        if w["fresh"] or filled.get(qimg) != key:
                            prep_qcow2(qimg, w["image"], w["ext_l2"], fill=not w["fresh"])
                            filled[qimg] = None if w["fresh"] else key
                        prepare_cache(w, qimg)
                        if sysname == "qemu-img":
                            t, m = run_qemu(w, qimg)
                        else:
                            extra = w["ablation"] if sysname != "qcowkit" else []
                            t, m = run_qcowkit(w, qimg, extra)
                    systems[sysname].append(t)
                    rss[sysname].append(m)
                    print("  %-45s %-40s run %d: %.3f s, %d KiB" % (w["name"], sysname, r + 1, t, m),
                          file=sys.stderr, flush=True)
            results.append(dict(workload=w["name"], group=w["group"], runs=runs,
                                seconds=systems, peak_rss_kib=rss))
        if selected(a.only, "vmstate", "VM state"):
            results += vmstate_results(a.quick, runs, scratch)
        if selected(a.only, "lifecycle", "commit", "rebase", "resize"):
            results += lifecycle_results(a.quick, runs, scratch, QCOWKIT)
        if selected(a.only, "convert", "compress"):
            results += convert_results(a.quick, runs, scratch, QCOWKIT)
        if selected(a.only, "bitmaps"):
            # Its own table (costs against the same image without bitmaps).
            p = sh(["bash", os.path.join(TOP, "bench", "bitmaps.sh"), "--runs", str(runs), "--dir", scratch])
            if p.returncode != 0:
                raise RuntimeError("bench/bitmaps.sh failed (%d):\n%s" % (p.returncode, p.stdout[-3000:]))
            extra_md.append("### Persistent dirty bitmaps\n\n" + p.stdout.strip() + "\n")
        if selected(a.only, "backup", "incremental"):
            # Its own table: an incremental backup against a full one.
            size = "2G" if a.quick else "16G"
            p = sh(["bash", os.path.join(TOP, "bench", "backup.sh"), "--runs", str(min(runs, 3)), "--dir", scratch,
                    "--size", size])
            if p.returncode != 0:
                raise RuntimeError("bench/backup.sh failed (%d):\n%s" % (p.returncode, p.stdout[-3000:]))
            extra_md.append("### Incremental backup\n\n" + p.stdout.strip() + "\n")
        if selected(a.only, "rbd", "ceph"):
            # Its own table: it starts a Ceph cluster of its own.
            p = sh(["bash", os.path.join(TOP, "bench", "rbd.sh"), "--runs", str(min(runs, 3)), "--dir", scratch,
                    "--size", "1G" if a.quick else "4G"])
            if p.returncode != 0:
                raise RuntimeError("bench/rbd.sh failed (%d):\n%s" % (p.returncode, p.stdout[-3000:]))
            extra_md.append("### Ceph RBD\n\n" + p.stdout.strip() + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    machine = "%s cores, %s, kernel %s" % (os.cpu_count(), sh(["sh", "-c", "df -h /var/tmp | tail -1 | awk '{print $1}'"]).stdout.strip(),
                                           os.uname().release)
    with open(os.path.join(a.out, "latest.json"), "w") as f:
        json.dump(dict(date=stamp, machine=machine, runs=runs, results=results), f, indent=1)

    lines = ["Benchmark suite, %s; %s; %d run(s) each, median ± spread (half the range, %% of median)." % (stamp, machine, runs), ""]
    groups = []
    for r in results:
        if r["group"] not in groups:
            groups.append(r["group"])
    for g in groups:
        rows = [r for r in results if r["group"] == g]
        cols, rcols = [], []
        for r in rows:
            for s in r["seconds"]:
                if s not in cols:
                    cols.append(s)
            for label, _ in ratio_cells(r):
                if label not in rcols:
                    rcols.append(label)
        lines.append("### " + g)
        lines.append("")
        lines.append("| workload | " + " | ".join(cols + rcols) + " |")
        lines.append("|---" * (len(cols) + len(rcols) + 1) + "|")
        for r in rows:
            cells = [fmt_cell(r["seconds"].get(c, [])) for c in cols]
            ratios = dict(ratio_cells(r))
            cells += [ratios.get(c, "–") for c in rcols]
            lines.append("| %s | %s |" % (r["workload"], " | ".join(cells)))
        lines.append("")
        for r in rows:
            if r.get("note"):
                lines += [r["note"], ""]
    lines += extra_md
    table = "\n".join(lines)
    with open(os.path.join(a.out, "latest.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    plot(results, a.out)


def plot(results, out):
    if not shutil.which("gnuplot") or not results:
        return
    dat = os.path.join(out, "ratios.dat")
    with open(dat, "w") as f:
        for i, r in enumerate(results):
            med = {c: statistics.median(v) for c, v in r["seconds"].items() if v}
            if "qemu-img" in med and "qcowkit" in med:
                f.write('%d "%s" %.4f\n' % (i, r["workload"].replace('"', ""), med["qcowkit"] / med["qemu-img"]))
    script = """set terminal png size 1200,600
set output '%s'
set style fill solid
set boxwidth 0.6
set ylabel 'qcowkit time / qemu-img time (lower is better)'
set xtics rotate by 30 right font ',8'
set grid ytics
set yrange [0:*]
plot '%s' using 1:3:xtic(2) with boxes notitle, 1 with lines lc 'red' title 'qemu-img', 0.5 with lines lc 'green' title 'target 0.5'
""" % (os.path.join(out, "ratios.png"), dat)
    # One command per line is a script file's syntax; -e wants them
    # separated by semicolons.
    p = sh(["gnuplot", "-e", "; ".join(l for l in script.splitlines() if l)])
    if p.returncode != 0:
        print("gnuplot failed, no plot: %s" % p.stdout.strip(), file=sys.stderr)


if __name__ == "__main__":
    main()
