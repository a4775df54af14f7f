#!/usr/bin/env python3
"""A failed flush or header write, then power loss: each command that
switches the header to new metadata (a new refcount structure, a
snapshot's L1 table, a new snapshot table, a grown refcount table,
another compat bit or backing file) is run once per flush and per header
write it makes (with many flushes, those around each header write), with
that one made to fail (QCOWKIT_INJECT) and its writes logged
(QCOWKIT_LOG_WRITES). Every crash state rebuilt from the log
(tests/crash/replay.py) must pass qemu-img check (0, or 3 for leaks) and
read as the image did before the command or after it; so must the image
the command left. (Snapshot operations may leave entries without COPIED
at refcount 1, as in tests/crash/check.py.)

After such a failure the disk may hold the old header or the new one. The
refcount width change once put the old structure back in memory and went
on writing into clusters the new one (named by the header in the file)
used: a crash before the close left refcounts of 0 under every cluster.
Since then the image takes no more writes once such a write fails.

Usage: fault-powerloss.py QCOWKIT WORKDIR.  Exit 0 pass, 1 fail.
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crash"))
import replay  # noqa: E402
import wlog  # noqa: E402
from check import _copied_window_only  # noqa: E402

QK, WORK = sys.argv[1], sys.argv[2]
STATS = re.compile(r"inject: write \d+ \(data \d+, header (\d+),.*\), flush (\d+);")
fails = 0


def run(cmd, env=None):
    return subprocess.run(cmd, cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def sh(*cmds):
    for c in cmds:
        p = run(c)
        if p.returncode != 0:
            raise RuntimeError("%s -> %d: %s" % (" ".join(c), p.returncode, p.stdout))


def bad(name, msg):
    global fails
    fails += 1
    print("FAIL: %s: %s" % (name, msg))


def create(opts, size):
    sh(["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts, "img.qcow2", size])


# Each case: a name, the set-up (on img.qcow2), the command, and the
# alternatives the image may read as (each a list of qemu-io reads that
# must all pass): before and after the command.
def setup_refcount():
    create("cluster_size=65536", "8M")
    sh(["qemu-io", "-c", "write -P 0x11 0 1M", "img.qcow2"],
       ["qemu-img", "bitmap", "--add", "-g", "512", "img.qcow2", "on"])


def setup_goto():
    create("cluster_size=65536", "8M")
    sh(["qemu-io", "-c", "write -P 0x11 0 1M", "img.qcow2"],
       ["qemu-img", "snapshot", "-c", "s0", "img.qcow2"],
       ["qemu-io", "-c", "write -P 0x22 0 1M", "img.qcow2"])


def setup_snap():
    create("cluster_size=4096", "8M")
    sh(["qemu-io", "-c", "write -P 0x11 0 1M", "img.qcow2"],
       ["qemu-img", "snapshot", "-c", "s0", "img.qcow2"])


def setup_reftable():
    # 512-byte clusters, 64-bit refcounts: a refcount block covers 32 KiB
    # of file and the one-cluster refcount table 2 MiB; the file is close
    # to that, and the command's writes take it past.
    create("cluster_size=512,refcount_bits=64", "8M")
    sh(["qemu-io", "-c", "write -P 0x11 0 1950k", "img.qcow2"])


def setup_lazy():
    create("cluster_size=65536,lazy_refcounts=on", "8M")
    sh(["qemu-io", "-c", "write -P 0x11 0 1M", "img.qcow2"])


OLD = ["read -P 0x11 0 1M"]
CASES = [
    ("amend refcount_bits=32", setup_refcount, ["amend", "-o", "refcount_bits=32", "img.qcow2"], [OLD]),
    ("snapshot -a", setup_goto, ["snapshot", "-a", "s0", "img.qcow2"], [["read -P 0x22 0 1M"], OLD]),
    ("snapshot -c", setup_snap, ["snapshot", "-c", "s1", "img.qcow2"], [OLD]),
    ("snapshot -d", setup_snap, ["snapshot", "-d", "s0", "img.qcow2"], [OLD]),
    ("refcount table growth", setup_reftable,
     ["io", "-c", "write -P 0x33 6M 4k", "-c", "write -P 0x44 2M 64k", "-c", "flush", "img.qcow2"],
     [["read -P 0x11 0 1950k"]]),
    ("amend lazy_refcounts=off", setup_lazy, ["amend", "-o", "lazy_refcounts=off", "img.qcow2"], [OLD]),
    ("amend compat=0.10", setup_lazy, ["amend", "-o", "compat=0.10", "img.qcow2"], [OLD]),
    ("rebase -u", setup_lazy, ["rebase", "-u", "-b", "other.qcow2", "-F", "qcow2", "img.qcow2"], [OLD]),
]


def reads_ok(path, alternatives):
    for reads in alternatives:
        ok = True
        for r in reads:
            p = run(["qemu-io", "-r", "-f", "qcow2", "-U", "-c", r, path])
            if p.returncode != 0 or "verification failed" in p.stdout or "Could not" in p.stdout:
                ok = False
                break
        if ok:
            return True
    return False


def judge(name, path, alternatives):
    c = run(["qemu-img", "check", "-f", "qcow2", path])
    # A snapshot operation's refcounts and COPIED flags change in separate
    # writes: entries left without COPIED at refcount 1 are the harmless
    # window the crash tests accept too (tests/crash/check.py).
    if c.returncode not in (0, 3) and not (name.startswith("snapshot") and _copied_window_only(c.returncode, c.stdout)):
        return "qemu-img check exit %d:\n%s" % (c.returncode, c.stdout.strip()[-500:])
    if not reads_ok(path, alternatives):
        return "reads neither as before nor as after the command"
    return None


def one_case(name, setup, cmd, alternatives):
    img = os.path.join(WORK, "img.qcow2")
    for f in ("img.qcow2", "w.log"):
        if os.path.exists(os.path.join(WORK, f)):
            os.unlink(os.path.join(WORK, f))
    setup()
    init = open(img, "rb").read()
    # A rule that never fires counts the flushes and header writes.
    log = os.path.join(WORK, "w.log")
    p = run([QK] + cmd, env=dict(os.environ, QCOWKIT_INJECT="flush:nth=1000000", QCOWKIT_LOG_WRITES=log))
    m = STATS.search(p.stdout)
    if p.returncode != 0 or not m:
        bad(name, "the command failed without a fault: %s" % p.stdout.strip()[-400:])
        return 0
    faults = [("header", n) for n in range(1, int(m.group(1)) + 1)]
    nflush = int(m.group(2))
    if nflush <= 12:
        faults += [("flush", n) for n in range(1, nflush + 1)]
    else:
        # Many flushes (small clusters): those around each header write.
        recs = wlog.records_for(wlog.read_log(log), img)
        near = set()
        for i, r in enumerate(recs):
            if r.type == wlog.WRITE and r.off < 512:
                k = sum(1 for x in recs[:i] if x.type == wlog.FLUSH_BEGIN)
                near |= {k, k + 1, k + 2}
        faults += [("flush", n) for n in sorted(near) if 1 <= n <= nflush]
    checked = 0
    for kind, n in faults:
        with open(img, "wb") as f:
            f.write(init)
        if os.path.exists(log):
            os.unlink(log)
        env = dict(os.environ, QCOWKIT_INJECT="%s:nth=%d:errno=EIO" % (kind, n), QCOWKIT_LOG_WRITES=log)
        p = run([QK] + cmd, env=env)
        what = "%s (%s %d failing)" % (name, kind, n)
        if "1 fault(s) injected" in p.stdout and p.returncode == 0:
            bad(what, "the fault did not surface")
        if "Sanitizer" in p.stdout:
            bad(what, "the sanitizer spoke:\n" + p.stdout[-1500:])
        why = judge(what, "img.qcow2", alternatives)
        if why:
            bad(what, "the image left: " + why)
        recs = wlog.records_for(wlog.read_log(log), img)
        # Up to the flush that fails (an injected failure is not logged)
        # the log is that of a run without the fault, and so are its
        # crash points: only the later ones are new.
        ends = [i for i, r in enumerate(recs) if r.type == wlog.FLUSH_END]
        after = ends[n - 2] if kind == "flush" and 2 <= n <= len(ends) + 1 else -1
        nbad = 0
        for st, data in replay.states(init, recs, n, 3):
            if st.point <= after:
                continue
            checked += 1
            with open(os.path.join(WORK, "s.qcow2"), "wb") as f:
                f.write(data)
            why = judge(what, "s.qcow2", alternatives)
            if why:
                nbad += 1
                if nbad <= 2:
                    bad(what, "crash state %s: %s" % (st.describe(recs)[:300], why))
    return checked


sh(["qemu-img", "create", "-q", "-f", "qcow2", "other.qcow2", "8M"])
total = 0
only = os.environ.get("FAULT_POWERLOSS_ONLY")
for case in CASES:
    if only and only != case[0]:
        continue
    t0 = time.time()
    n = one_case(*case)
    total += n
    print("%s: %d crash states, %.1f s" % (case[0], n, time.time() - t0), flush=True)
print("%d crash states checked, %d failures" % (total, fails))
sys.exit(1 if fails else 0)
