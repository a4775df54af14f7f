"""What the guest may read back after a crash.

The workload runs in epochs: the operations of one epoch are issued
together (byte ranges disjoint, so their order does not matter), then the
guest flushes and marks the epoch. After a crash whose last mark was epoch
E, every byte must hold its value after epoch E, or a value that an
operation of epoch E+1 could have left there. A discard leaves "old value or
zero" (qcow2 may ignore the unaligned part of a discard), forever after.

Contents are kept as sorted segments (start, value, zero_ok), each running
to the next start, so a 64 MiB disk with a few hundred writes costs a few
hundred tuples, not 64 MiB per epoch.

Owns: the expected-contents model and the allowed values of a byte range.
"""
import bisect


class Op:
    """One guest operation. kind: write, zero, discard, cut (shrink to off
    and grow back: [off, off+length) becomes zeros), snap_create,
    snap_apply, snap_delete. For data ops, pattern is the byte written
    (0 for zero); a snapshot op carries its snapshot name."""

    def __init__(self, kind, off=0, length=0, pattern=0, name=None, flags="", vmstate=None):
        self.kind, self.off, self.length, self.pattern = kind, off, length, pattern
        self.name, self.flags, self.vmstate = name, flags, vmstate

    def __repr__(self):
        if self.kind.startswith("snap"):
            return "%s %s%s" % (self.kind, self.name, " +vmstate" if self.vmstate else "")
        p = " P=0x%02x" % self.pattern if self.kind == "write" else ""
        f = " " + self.flags if self.flags else ""
        return "%s%s %d+%d%s" % (self.kind, f, self.off, self.length, p)


def _key(seg):
    return seg[0]


class Image:
    """Guest contents as segments [(start, value, zero_ok)]; segment i ends
    where segment i+1 starts (the last at size)."""

    def __init__(self, size, segs=None):
        self.size = size
        self.segs = segs if segs is not None else [(0, 0, False)]

    def copy(self):
        return Image(self.size, list(self.segs))

    def _split(self, x):
        """Ensures a segment starts at x; returns its index."""
        if x >= self.size:
            return len(self.segs)
        i = bisect.bisect_right(self.segs, x, key=_key) - 1
        if self.segs[i][0] != x:
            _, v, z = self.segs[i]
            self.segs.insert(i + 1, (x, v, z))
            i += 1
        return i

    def set(self, off, length, value, zero_ok):
        a = self._split(off)
        b = self._split(off + length)
        self.segs[a:b] = [(off, value, zero_ok)]

    def discard(self, off, length):
        a = self._split(off)
        b = self._split(off + length)
        for i in range(a, b):
            s, v, _ = self.segs[i]
            self.segs[i] = (s, v, True)

    def apply(self, op, snaps):
        if op.kind == "write":
            self.set(op.off, op.length, op.pattern, False)
        elif op.kind in ("zero", "cut"):
            self.set(op.off, op.length, 0, False)
        elif op.kind == "discard":
            self.discard(op.off, op.length)
        elif op.kind == "snap_create":
            snaps[op.name] = (self.copy(), op.vmstate)
        elif op.kind == "snap_apply":
            self.segs = list(snaps[op.name][0].segs)
        elif op.kind == "snap_delete":
            del snaps[op.name]

    def boundaries(self):
        return [s[0] for s in self.segs]

    def at(self, x):
        """(value, zero_ok) of the segment holding byte x."""
        i = bisect.bisect_right(self.segs, x, key=_key) - 1
        return self.segs[i][1], self.segs[i][2]


class History:
    """Guest contents and snapshots after each epoch (epoch 0 = fresh)."""

    def __init__(self, size):
        self.images = [Image(size)]
        self.snaps = [{}]
        self.ops = [[]]  # ops[e]: the operations of epoch e

    def add_epoch(self, ops):
        img = self.images[-1].copy()
        snaps = dict(self.snaps[-1])
        for op in ops:
            img.apply(op, snaps)
        self.images.append(img)
        self.snaps.append(snaps)
        self.ops.append(list(ops))
        return len(self.images) - 1

    def epochs(self):
        return len(self.images) - 1


def allowed_ranges(image, pending, snaps_before):
    """Splits the disk into ranges with one set of allowed byte values each:
    yields (start, end, frozenset of values, durable value)."""
    cuts = set(image.boundaries())
    cuts.add(image.size)
    snap_imgs = []
    for op in pending:
        if op.kind == "snap_apply" and op.name in snaps_before:
            si = snaps_before[op.name][0]
            snap_imgs.append(si)
            cuts.update(si.boundaries())
        elif op.kind in ("write", "zero", "discard", "cut"):
            cuts.add(op.off)
            cuts.add(op.off + op.length)
    cuts = sorted(c for c in cuts if c <= image.size)
    for a, b in zip(cuts, cuts[1:]):
        if a >= b:
            continue
        v, z = image.at(a)
        vals = {v}
        if z:
            vals.add(0)
        for op in pending:
            if op.kind in ("write", "zero", "discard", "cut") and op.off <= a < op.off + op.length:
                vals.add(op.pattern if op.kind == "write" else 0)
        for si in snap_imgs:
            sv, sz = si.at(a)
            vals.add(sv)
            if sz:
                vals.add(0)
        yield a, b, frozenset(vals), v
