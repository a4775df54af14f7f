"""Judges one crash state of an image: QEMU's check must find no
corruption (exit 0, or 3 for leaked clusters only), qcowkit must open and
check it the same way, the guest contents read through qcowkit must match
the model, and the snapshot table must hold the snapshots the model says
are durable (with their contents and VM state, when deep).

Owns: the per-state checks and their failure messages.
"""
import json
import os
import re
import subprocess

from verify import verify_guest


def _run(argv, env=None):
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    return p.returncode, (p.stdout + p.stderr).strip()


class Checker:
    def __init__(self, qcowkit, workdir, env=None):
        self.qcowkit, self.workdir = qcowkit, workdir
        self.env = dict(env or os.environ)
        self.env.pop("QCOWKIT_LOG_WRITES", None)  # judging must not add to the log

    def _snapshots(self, image):
        rc, out = _run(["qemu-img", "info", "-f", "qcow2", "--output=json", image], self.env)
        if rc != 0:
            return None, "qemu-img info exited %d: %s" % (rc, out[-1500:])
        try:
            info = json.loads(out[out.index("{"):])
        except ValueError:
            return None, "qemu-img info printed no JSON: %s" % out[-500:]
        return [s["name"] for s in info.get("snapshots", [])], None

    def check(self, image, hist, epoch, deep=False, rng=None):
        """Returns a list of failure messages (empty: the state is fine)."""
        fails = []
        pending = hist.ops[epoch + 1] if epoch + 1 < len(hist.ops) else []
        snap_pending = any(op.kind.startswith("snap") for op in pending)
        self.tolerated = False
        rc, out = _run(["qemu-img", "check", "-f", "qcow2", image], self.env)
        if rc not in (0, 3) and not (snap_pending and _copied_window_only(rc, out)):
            fails.append("qemu-img check exited %d:\n%s" % (rc, _tail(out)))
        elif rc not in (0, 3):
            self.tolerated = True
        rc, out2 = _run([self.qcowkit, "check", "-f", "qcow2", image], self.env)
        if rc not in (0, 3) and not (snap_pending and _copied_window_only(rc, out2)):
            fails.append("qcowkit check exited %d:\n%s" % (rc, _tail(out2)))
        if fails and rc not in (0, 2, 3):
            return fails  # qcowkit could not even open it; reading would say the same
        bad = verify_guest(self.qcowkit, image, hist.images[epoch], pending, hist.snaps[epoch], self.env)
        if bad:
            fails.append("guest data after epoch %d (pending: %s):\n  %s" % (
                epoch, pending, "\n  ".join(bad)))
        fails += self._check_snapshots(image, hist, epoch, pending, deep, rng)
        return fails

    def _check_snapshots(self, image, hist, epoch, pending, deep, rng):
        durable = hist.snaps[epoch]
        created = {op.name for op in pending if op.kind == "snap_create"}
        deleted = {op.name for op in pending if op.kind == "snap_delete"}
        if not durable and not created:
            return []
        names, err = self._snapshots(image)
        if err:
            return [err]
        fails = []
        for n in durable:
            if n not in names and n not in deleted:
                fails.append("snapshot %s was created (and flushed) in epoch <= %d but is missing; "
                             "table: %s" % (n, epoch, names))
        for n in names:
            if n not in durable and n not in created:
                fails.append("snapshot %s is in the table but was never durably created; "
                             "table: %s" % (n, names))
        if len(set(names)) != len(names):
            fails.append("snapshot names repeat: %s" % names)
        if fails or not deep:
            return fails
        present = [n for n in names if n in durable or n in created]
        if not present:
            return fails
        name = rng.choice(present) if rng else present[0]
        snap_img, vmfile = (durable[name] if name in durable else
                            _created(hist, epoch + 1, name))
        vm_out = os.path.join(self.workdir, "vm.out")
        argv = [self.qcowkit, "snapshot", "-a", name]
        if vmfile:
            argv += ["--vmstate-out", vm_out]
        rc, out = _run(argv + [image], self.env)
        if rc != 0:
            return ["qcowkit snapshot -a %s exited %d: %s" % (name, rc, _tail(out))]
        if vmfile:
            with open(vmfile, "rb") as a, open(vm_out, "rb") as b:
                want, got = a.read(), b.read()
            if want != got:
                fails.append("snapshot %s: VM state read back differs (%d bytes saved, %d read%s)" % (
                    name, len(want), len(got), _first_diff(want, got)))
        bad = verify_guest(self.qcowkit, image, snap_img, [], {}, self.env)
        if bad:
            fails.append("snapshot %s contents after applying it:\n  %s" % (name, "\n  ".join(bad)))
        return fails


# A snapshot operation changes refcounts and the L1/L2 COPIED flags, which
# qcow2 wants to agree (COPIED iff refcount 1), in separate writes; without
# lazy refcounts some crash window between them is unavoidable. QEMU clears
# COPIED first (flushed) and raises refcounts after, so its window reads
# "ERROR OFLAG_COPIED ... refcount=1" for entries that lost COPIED: harmless,
# the next write copies. The other direction, COPIED still set on a cluster
# whose refcount is already 2, lets a write land in place in a cluster a
# snapshot shares; that stays a failure. So while a snapshot operation is
# pending, a check whose only errors are the harmless kind is tolerated.
_COPIED = re.compile(r"^ERROR OFLAG_COPIED (data|L2) cluster: (l2_entry|l1_index=\d+ l1_entry)=([0-9a-f]+) "
                     r"refcount=(\d+)$")


def _copied_window_only(rc, out):
    if rc != 2:
        return False
    errors = [x.strip() for x in out.splitlines() if x.strip().startswith("ERROR")]
    if not errors:
        return False
    for e in errors:
        m = _COPIED.match(e)
        if not m:
            return False
        copied = int(m.group(3), 16) >> 63
        if copied or int(m.group(4)) != 1:
            return False
    return True


def _created(hist, epoch, name):
    snaps = {}
    img = hist.images[epoch - 1].copy()
    for op in hist.ops[epoch]:
        img.apply(op, snaps)
    return snaps[name]


def _first_diff(a, b):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return ", first difference at byte %d" % i
    return ""


def _tail(text, lines=25):
    """The check's ERROR lines first (leak lines are noise next to them),
    then its summary."""
    t = text.splitlines()
    errs = [x for x in t if "ERROR" in x or "Warning" in x][:12]
    rest = [x for x in t if x not in errs and not x.startswith("Leaked cluster")]
    return "\n".join(("    " + x) for x in (errs + rest)[:lines])
