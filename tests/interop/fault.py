#!/usr/bin/env python3
"""Fault injection: a workload of qcowkit commands (writes, flushes,
snapshot create/delete, refcount table growth) is run again and again with
one host operation made to fail (QCOWKIT_INJECT), for every operation N of
every kind (long form) or a sample of them (short form). After each run:

  - a fault that was injected surfaced: the command exited 1 with a message;
  - `qemu-img check` exits 0 or 3 (leaks are allowed, corruption is not);
  - every write acknowledged and then covered by a successful flush (or a
    clean exit) reads back intact through QEMU;
  - the rest of the workload then runs without faults and succeeds, and the
    image is checked and compared again.

Usage: fault.py [--long] [--mode once|sticky|dead] [--errno EIO|ENOSPC]
                [--cache writeback|none] QCOWKIT WORKDIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

SIZE = 16 << 20
CREATE = ["create", "-q", "-f", "qcow2", "-o", "cluster_size=512,refcount_bits=64"]
# 512-byte clusters with 64-bit refcounts: an L2 table maps 32 KiB, a
# refcount block covers 32 KiB of host file and the one-cluster refcount
# table 2 MiB, so a few MiB of writes exercise every kind of metadata.
STEPS = [
    ("io", [("write", 0x11, 0, 64 << 10), ("flush",),
            ("write", 0x12, 1 << 20, 1 << 20), ("flush",),
            ("write", 0x13, 0, 4096), ("flush",)]),
    ("snapshot", ["-c", "s1"]),
    ("io", [("write", 0x14, 8192, 4096), ("flush",),
            ("write", 0x15, 4 << 20, 1 << 20), ("write", 0x16, 3 << 20, 8192), ("flush",)]),
    ("snapshot", ["-d", "s1"]),
    ("io", [("write", 0x17, 12 << 20, 64 << 10), ("flush",)]),
]
KINDS = ["write", "data", "header", "l1", "l2", "reftable", "refblock", "snapshot", "bitmap", "flush"]
STATS = re.compile(r"inject: write (\d+) \(data (\d+), header (\d+), l1 (\d+), l2 (\d+), "
                   r"reftable (\d+), refblock (\d+), snapshot (\d+), bitmap (\d+)\), flush (\d+); (\d+) fault")


def run(cmd, env=None):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


class Model:
    """Expected content of the virtual disk, and which bytes are certain."""

    def __init__(self):
        self.data = bytearray(SIZE)
        self.certain = bytearray(b"\x01") * SIZE

    def durable(self, pat, off, n):
        self.data[off:off + n] = bytes([pat]) * n
        self.certain[off:off + n] = b"\x01" * n

    def unsure(self, off, n):
        self.certain[off:off + n] = b"\x00" * n

    def copy(self):
        m = Model.__new__(Model)
        m.data = bytearray(self.data)
        m.certain = bytearray(self.certain)
        return m


class Runner:
    def __init__(self, qcowkit, work, cache):
        self.q = qcowkit
        self.work = work
        self.img = os.path.join(work, "f.qcow2")
        self.raw = os.path.join(work, "f.raw")
        self.cache = cache
        self.allow_copied = False
        self.copied_only = 0

    def step(self, idx, model, inject=None):
        """Runs step idx; updates model from what was acknowledged. Returns
        (exit status, output, stats tuple or None)."""
        env = dict(os.environ)
        env.pop("QCOWKIT_INJECT", None)
        if inject:
            env["QCOWKIT_INJECT"] = inject
        kind, args = STEPS[idx]
        if kind == "snapshot":
            p = run([self.q, "snapshot", "-t", self.cache] + args + [self.img], env)
            out = p.stdout + p.stderr
        else:
            cmd = [self.q, "io", "-t", self.cache]
            for op in args:
                if op[0] == "write":
                    cmd += ["-c", "write -P %#x %d %d" % (op[1], op[2], op[3])]
                else:
                    cmd += ["-c", "flush", "-c", "length"]
            p = run(cmd + [self.img], env)
            out = p.stdout + p.stderr
            self.account(args, p.stdout, p.returncode, model)
        m = STATS.search(p.stderr)
        return p.returncode, out, tuple(int(x) for x in m.groups()) if m else None

    @staticmethod
    def account(ops, stdout, status, model):
        # stdout: per write "wrote N/N bytes at offset O" (+ a rate line) or
        # "write failed: ..."; per flush "flush failed: ..." or nothing, then
        # the length marker ("16 MiB").
        segs = re.split(r"^16 MiB$", stdout, flags=re.M)
        seg = 0
        pending = []
        for op in ops:
            if op[0] == "write":
                _, pat, off, n = op
                ok = ("wrote %d/%d bytes at offset %d" % (n, n, off)) in segs[seg] if seg < len(segs) else False
                if ok:
                    pending.append(op)
                else:
                    model.unsure(off, n)
            else:
                flushed = seg < len(segs) - 1 and "flush failed" not in segs[seg]
                if flushed:
                    for _, pat, off, n in pending:
                        model.durable(pat, off, n)
                    pending = []
                seg += 1
        for _, pat, off, n in pending:
            if status == 0:
                model.durable(pat, off, n)   # the close flushed them
            else:
                model.unsure(off, n)

    def verify(self, model, what):
        errs = []
        c = run(["qemu-img", "check", self.img])
        errors = [l for l in (c.stdout + c.stderr).splitlines() if l.startswith("ERROR")]
        if c.returncode == 2 and self.allow_copied and errors and \
                all(l.startswith("ERROR OFLAG_COPIED") for l in errors):
            # Snapshot create/delete changes refcounts and COPIED flags in
            # separate clusters: when writes stop for good half way, no
            # order leaves both agreeing (QEMU's the same). No data is at
            # risk: the flags only decide copy-on-write. Counted, not failed.
            self.copied_only += 1
        elif c.returncode not in (0, 3):
            errs.append("qemu-img check exit %d after %s:\n%s" % (c.returncode, what, (c.stdout + c.stderr)[-1500:]))
            return errs
        r = run(["qemu-img", "convert", "-O", "raw", self.img, self.raw])
        if r.returncode != 0:
            errs.append("qemu-img convert failed after %s: %s" % (what, r.stderr))
            return errs
        with open(self.raw, "rb") as f:
            got = f.read()
        os.unlink(self.raw)
        if len(got) != SIZE:
            errs.append("virtual size %d after %s" % (len(got), what))
            return errs
        bad = [i for i in range(0, SIZE, 512)
               if model.certain[i] and got[i:i + 512] != model.data[i:i + 512]]
        if bad:
            errs.append("data lost after %s: %d sectors differ, first at %#x (have %#x, want %#x)"
                        % (what, len(bad), bad[0], got[bad[0]], model.data[bad[0]]))
        return errs

    def fresh(self):
        for p in (self.img, self.raw):
            if os.path.exists(p):
                os.unlink(p)
        p = run([self.q] + CREATE + [self.img, str(SIZE)])
        if p.returncode != 0:
            raise SystemExit("create failed: " + p.stdout + p.stderr)

    def prefix(self, i):
        return os.path.join(self.work, "before-step%d.qcow2" % i)

    def snapshot_exists(self):
        return "s1" in run(["qemu-img", "snapshot", "-l", self.img]).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--long", action="store_true", help="every N, not a sample")
    ap.add_argument("--mode", default="once", choices=["once", "sticky", "dead"])
    ap.add_argument("--errno", default="EIO")
    ap.add_argument("--cache", default="writeback")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--case", help="STEP:N: only this step and N (with --kinds)")
    ap.add_argument("qcowkit")
    ap.add_argument("work")
    a = ap.parse_args()
    R = Runner(a.qcowkit, a.work, a.cache)
    R.allow_copied = a.mode != "once"
    kinds = a.kinds.split(",")

    # Clean run: counts per step, and the model every injected run starts from.
    R.fresh()
    base_models = []
    counts = []
    model = Model()
    for i in range(len(STEPS)):
        base_models.append(model.copy())
        # The image every run that injects into step i starts from: the
        # clean steps before it, run once here rather than again per run.
        shutil.copyfile(R.img, R.prefix(i))
        st, out, stats = R.step(i, model, "count")
        if st != 0 or not stats:
            print("FAIL clean step %d exit %d\n%s" % (i, st, out))
            sys.exit(1)
        counts.append(dict(zip(KINDS, stats[:len(KINDS)])))
    errs = R.verify(model, "the clean workload")
    if errs:
        print("FAIL clean run:\n" + "\n".join(errs))
        sys.exit(1)
    print("clean workload: " + "; ".join(
        "step %d %s %s" % (i, STEPS[i][0], " ".join("%s=%d" % (k, counts[i][k]) for k in KINDS))
        for i in range(len(STEPS))))

    injected = {k: 0 for k in kinds}
    runs = 0
    failures = 0
    for i in range(len(STEPS)):
        if a.case and int(a.case.split(":")[0]) != i:
            continue
        for kind in kinds:
            total = counts[i][kind]
            if a.case:
                ns = [int(a.case.split(":")[1])]
            elif a.long:
                ns = range(1, total + 1)
            else:
                # The first and last of each kind; the middle of all writes too.
                pick = (1, total // 2, total) if kind == "write" else (1, total)
                ns = sorted(set(n for n in pick if 1 <= n <= total))
            for n in ns:
                runs += 1
                rule = "%s:nth=%d:errno=%s:mode=%s" % (kind, n, a.errno, a.mode)
                shutil.copyfile(R.prefix(i), R.img)
                model = base_models[i].copy()
                st, out, stats = R.step(i, model, rule)
                errs = []
                nf = stats[9] if stats else 0
                injected[kind] += nf
                if nf and st != 1:
                    errs.append("%d fault(s) injected but exit status %d" % (nf, st))
                if st == 1 and not re.search(r"failed|error|qcowkit:", out.split("inject:")[0], re.I):
                    errs.append("exit 1 without a message")
                if st not in (0, 1):
                    errs.append("exit status %d (crash?)" % st)
                if "Sanitizer" in out or "runtime error" in out:
                    errs.append("sanitizer report")
                errs += R.verify(model, "the fault")
                if not errs:
                    for j in range(i + 1, len(STEPS)):
                        if STEPS[j][0] == "snapshot" and STEPS[j][1][0] == "-d" and not R.snapshot_exists():
                            continue
                        st2, out2, _ = R.step(j, model)
                        if st2 != 0:
                            errs.append("step %d after the fault exit %d: %s" % (j, st2, out2[-600:]))
                            break
                    if not errs:
                        errs += R.verify(model, "finishing the workload")
                if errs:
                    failures += 1
                    print("FAIL step %d %s rule %s (exit %d)\n  %s\n  output: %s" % (
                        i, STEPS[i][0], rule, st, "\n  ".join(errs), out.strip()[-800:].replace("\n", "\n          ")))
    print("faults injected per kind: " + ", ".join("%s %d" % (k, injected[k]) for k in kinds))
    if R.allow_copied:
        print("check found only COPIED flags disagreeing with refcounts (writes stopped for good inside "
              "a snapshot operation) %d time(s)" % R.copied_only)
    print("%d runs, %d faults injected, %d failures" % (runs, sum(injected.values()), failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
