"""Reads a crash state's guest contents through qcowkit and checks them
against the model. `qcowkit map` says which ranges read as zero without
data (no read needed: zero must be allowed there); data ranges with one
allowed value are checked with `read -P` inside one `qcowkit io -r`
process, ranges with several allowed values (pending writes, discards) are
dumped with `read -v` and every byte is checked against its set.

Owns: reading the guest contents and reporting where they differ.
"""
import json
import os
import subprocess

from model import allowed_ranges

MAX_READ = 4 << 20     # one read -P at most this long
MAX_DUMP = 1 << 20     # bytes dumped per state; past that, the whole disk is copied out


def _io(qcowkit, image, cmds, env):
    p = subprocess.run([qcowkit, "io", "-r", "-f", "qcow2", image], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def _parse_dump(text):
    """{offset: byte value} from `read -v` hex dump lines."""
    out = {}
    for line in text.splitlines():
        c = line.find(": ")
        if c < 8:
            continue
        try:
            base = int(line[:c], 16)
        except ValueError:
            continue
        hexpart = line[c + 2:].split("  ")[0].split()
        for j, h in enumerate(hexpart):
            if len(h) != 2:
                break
            out[base + j] = int(h, 16)
    return out


def _pieces(extents, ranges):
    """Intersects map extents (start, end, reads_zero) with allowed ranges."""
    i = 0
    for a, b, vals, dv in ranges:
        while i < len(extents) and extents[i][1] <= a:
            i += 1
        j = i
        while j < len(extents) and extents[j][0] < b:
            s, e, z = extents[j]
            yield max(a, s), min(b, e), vals, dv, z
            j += 1


def _fmt(vals):
    return "/".join("0x%02x" % v for v in sorted(vals))


def verify_guest(qcowkit, image, expected, pending, snaps_before, env, limit=6):
    p = subprocess.run([qcowkit, "map", "-f", "qcow2", "--output=json", image],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return ["qcowkit map exited %d: %s" % (p.returncode, (p.stdout + p.stderr)[-1500:])]
    try:
        ext = [(e["start"], e["start"] + e["length"], e.get("zero", False) and not e.get("data", True))
               for e in json.loads(p.stdout)]
    except (ValueError, KeyError) as e:
        return ["qcowkit map printed something that is not its JSON (%s): %s" % (e, p.stdout[:500])]
    errors = []
    # A crash inside a cut (shrink, then grow back) may leave the image
    # small: what it lost must be allowed to read as zeros.
    end = ext[-1][1] if ext else 0
    if end < expected.size:
        for a, b, vals, _ in allowed_ranges(expected, pending, snaps_before):
            if b > end and 0 not in vals:
                errors.append("image ends at %d, guest bytes %d..%d expected %s" % (
                    end, max(a, end), b - 1, _fmt(vals)))
    reads = []   # (off, len, value)
    dumps = []   # (off, len, vals)
    dumped = 0
    for a, b, vals, dv, zero in _pieces(ext, list(allowed_ranges(expected, pending, snaps_before))):
        if zero:
            if 0 not in vals:
                errors.append("guest bytes %d..%d read as zero (map: no data), expected %s" % (
                    a, b - 1, _fmt(vals)))
            continue
        if len(vals) == 1:
            v = next(iter(vals))
            if reads and reads[-1][0] + reads[-1][1] == a and reads[-1][2] == v and reads[-1][1] < MAX_READ:
                reads[-1] = (reads[-1][0], reads[-1][1] + b - a, v)
            else:
                reads.append((a, b - a, v))
        else:
            dumped += b - a
            dumps.append((a, b - a, vals))
    if errors:
        return errors[:limit]
    cmds = ["read -q -P %d %d %d" % (v, a, n) for a, n, v in reads]
    if dumped > MAX_DUMP:
        # Large ranges with several allowed values (big pending writes with
        # 2 MiB clusters, a pending snapshot apply): one copy of the whole
        # disk through qcowkit beats megabytes of hex dump.
        bad = _check_copied(qcowkit, image, dumps, env, limit)
        if bad:
            return bad
        dumps = []
    cmds += ["read -q -v %d %d" % (a, n) for a, n, _ in dumps]
    rc, out, err = _io(qcowkit, image, cmds, env)
    bad_reads = []
    for line in out.splitlines():
        if line.startswith("Pattern verification failed at offset"):
            parts = line.replace(",", "").split()
            bad_reads.append((int(parts[5]), int(parts[6])))
        elif "failed" in line:
            errors.append("qcowkit io: " + line)
    if rc != 0 and not bad_reads and not errors:
        errors.append("qcowkit io -r exited %d: %s" % (rc, err[-1000:]))
    got = _parse_dump(out)
    for a, n, vals in dumps:
        for x in range(a, a + n):
            if got.get(x) not in vals:
                errors.append("guest byte %d read %s, allowed %s (range %d..%d)" % (
                    x, "nothing" if got.get(x) is None else "0x%02x" % got[x], _fmt(vals), a, a + n - 1))
                break
        if len(errors) >= limit:
            return errors
    for a, n in bad_reads[:limit]:
        v = next(r[2] for r in reads if r[0] == a)
        errors.append("guest bytes %d..%d should all read 0x%02x: %s" % (
            a, a + n - 1, v, _describe(qcowkit, image, env, a, n, v)))
    return errors[:limit]


def _check_copied(qcowkit, image, dumps, env, limit):
    raw = image + ".guest.raw"
    if os.path.exists(raw):
        os.unlink(raw)
    p = subprocess.run([qcowkit, "mirror", "-f", "qcow2", "-O", "raw", image, raw],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return ["qcowkit mirror (copying the guest contents out) exited %d: %s" % (
            p.returncode, (p.stdout + p.stderr)[-1000:])]
    errors = []
    with open(raw, "rb") as f:
        for a, n, vals in dumps:
            f.seek(a)
            data = f.read(n)
            data += bytes(n - len(data))
            if sum(data.count(bytes([v])) for v in vals) == n:
                continue
            for j, x in enumerate(data):
                if x not in vals:
                    errors.append("guest byte %d read 0x%02x, allowed %s (range %d..%d)" % (
                        a + j, x, _fmt(vals), a, a + n - 1))
                    break
            if len(errors) >= limit:
                break
    os.unlink(raw)
    return errors


def _describe(qcowkit, image, env, a, n, v):
    """Where in a failed pattern read the bytes differ (first 64 KiB)."""
    m = min(n, 65536)
    _, out, _ = _io(qcowkit, image, ["read -q -v %d %d" % (a, m)], env)
    got = _parse_dump(out)
    wrong = [x for x in range(a, a + m) if got.get(x) != v]
    if not wrong:
        return "differences past the first %d bytes" % m
    runs = []
    s = p = wrong[0]
    for x in wrong[1:] + [None]:
        if x is not None and x == p + 1:
            p = x
            continue
        runs.append("%d..%d=0x%02x" % (s, p, got.get(s, -1) & 0xff))
        if x is not None:
            s = p = x
        if len(runs) >= 4:
            break
    return "differ at " + ", ".join(runs)
