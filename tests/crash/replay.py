"""Crash states from an initial image and its write log.

At a crash point P (a position in the log), the durable records are those
before the FLUSH_BEGIN of the latest flush that completed (FLUSH_END with
result 0) before P. Of the modifying records after that and before P, any
subset may have reached the disk; applied in log order. The durable prefix
only grows at a FLUSH_END, so the strongest crash point for each durable
prefix is just before the FLUSH_END that moves it (or the end of the log):
every subset possible earlier is possible there too, and the guest's last
mark there is the latest. Those are the points we take.

Subsets enumerated per point: all, none, each prefix, each one dropped, and
random ones; deduplicated and sampled down to a bound.

Owns: crash-point selection, subset enumeration and building state files.
"""
import random

import wlog

MODIFY = (wlog.WRITE, wlog.ZERO, wlog.DISCARD, wlog.TRUNCATE)


def apply(img, r):
    """Applies one modifying record to the bytearray img, as the host
    file would see it."""
    end = r.off + r.len
    if r.type == wlog.WRITE:
        if end > len(img):
            img.extend(bytes(end - len(img)))
        img[r.off:end] = r.data
    elif r.type == wlog.ZERO:
        # FALLOC_FL_ZERO_RANGE extends the file; the punch-hole form is
        # only used inside it.
        if end > len(img):
            img.extend(bytes(end - len(img)))
        img[r.off:end] = bytes(r.len)
    elif r.type == wlog.DISCARD:
        end = min(end, len(img))
        if r.off < end:
            img[r.off:end] = bytes(end - r.off)
    elif r.type == wlog.TRUNCATE:
        if r.off < len(img):
            del img[r.off:]
        else:
            img.extend(bytes(r.off - len(img)))


def mark_epoch(r):
    text = r.data.decode(errors="replace")
    if text.startswith("epoch "):
        try:
            return int(text.split()[1])
        except ValueError:
            return None
    return None


def crash_points(recs):
    """[(P, D, epoch)]: crash just before recs[P]; recs[:D] durable;
    epoch = the guest's last mark before P (0: none)."""
    begins = {}
    durable = 0
    epoch = 0
    points = []
    for i, r in enumerate(recs):
        if r.type == wlog.FLUSH_BEGIN:
            begins[r.off] = i
        elif r.type == wlog.FLUSH_END and r.result() == 0:
            b = begins.pop(r.off, None)
            if b is not None and b > durable:
                points.append((i, durable, epoch))
                durable = b
        elif r.type == wlog.MARK:
            e = mark_epoch(r)
            if e is not None:
                epoch = e
    points.append((len(recs), durable, epoch))
    return points


def subsets(n, rng, cap, nrandom=8):
    """Index tuples of the subsets of range(n) to try, at most cap."""
    full = tuple(range(n))
    cands = [full, ()]
    cands += [full[:j] + full[j + 1:] for j in range(n)]
    cands += [full[:k] for k in range(1, n)]
    for _ in range(nrandom):
        cands.append(tuple(i for i in full if rng.random() < 0.5))
    seen, out = set(), []
    for c in cands:
        if c not in seen:
            seen.add(c)
            out.append(c)
    if len(out) > cap:
        head, rest = out[:2], out[2:]
        out = head + rng.sample(rest, cap - 2)
    return out


class State:
    def __init__(self, point, durable, epoch, pending, chosen):
        self.point, self.durable, self.epoch = point, durable, epoch
        self.pending = pending  # record indices after the durable prefix
        self.chosen = chosen    # the subset of pending applied

    def describe(self, recs):
        dropped = [i for i in self.pending if i not in set(self.chosen)]
        return ("crash before log record %d (guest epoch %d done); durable: records < %d; "
                "%d later records, applied %s, dropped %s" % (
                    self.point, self.epoch, self.durable, len(self.pending),
                    _fmt(recs, self.chosen), _fmt(recs, dropped)))


def _fmt(recs, idx):
    if not idx:
        return "none"
    if len(idx) > 12:
        return "%d records" % len(idx)
    return "[" + ", ".join("#%d %r" % (i, recs[i]) for i in idx) + "]"


def states(init, recs, seed, cap_per_point, cap_total=None):
    """Yields (State, image bytes). With cap_total, the states are spread
    over all crash points (at least 3 each) instead of stopping early."""
    rng = random.Random(seed)
    points = crash_points(recs)
    cap = cap_per_point
    if cap_total:
        cap = max(3, min(cap_per_point, cap_total // max(1, len(points))))
    img = bytearray(init)
    applied = 0
    for point, durable, epoch in points:
        while applied < durable:
            if recs[applied].type in MODIFY:
                apply(img, recs[applied])
            applied += 1
        pending = [i for i in range(durable, point) if recs[i].type in MODIFY]
        for sub in subsets(len(pending), rng, cap):
            chosen = [pending[j] for j in sub]
            st = bytearray(img)
            for i in chosen:
                apply(st, recs[i])
            yield State(point, durable, epoch, pending, chosen), st
