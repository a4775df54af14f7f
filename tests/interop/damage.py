#!/usr/bin/env python3
"""Seeded test images and one-way damage for the repair test (repair.py).

make_image() builds an image with qemu-img/qemu-io: known data patterns
(some written compressed), optional backing file, optional internal
snapshots (with writes between them so that snapshots share some clusters
and not others), optional persistent bitmap and VM state. Image reads
the metadata of such a file (header, L1/L2, refcount table and blocks)
so that each damage function can change exactly one thing. Every damage
function takes (Image, random.Random) and returns a short description,
or None when the image has nothing to damage that way.
"""
import os
import random
import struct
import subprocess

COPIED = 1 << 63
COMPRESSED = 1 << 62
OFF_MASK = 0x00fffffffffffe00


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def make_image(work, rng, cluster_size, refcount_bits, extended_l2, backing, nsnap, size=8 << 20,
               bitmap=False, vmstate_tool=None, v2=False):
    """Returns (path, [snapshot names]). With bitmap, a persistent dirty
    bitmap is added after the first writes (the later ones mark it). With
    vmstate_tool (a qcowkit binary: qemu-img cannot save VM state) the
    first snapshot gets a VM state of random bytes, kept in vmstate.bin."""
    path = os.path.join(work, "orig.qcow2")
    for f in ("orig.qcow2", "backing.qcow2"):
        if os.path.exists(os.path.join(work, f)):
            os.unlink(os.path.join(work, f))
    opts = "cluster_size=%d,refcount_bits=%d" % (cluster_size, refcount_bits)
    if v2:
        opts += ",compat=0.10"  # 16-bit refcounts, no extended L2, no bitmaps
    if extended_l2:
        opts += ",extended_l2=on"
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts]
    if backing:
        b = os.path.join(work, "backing.qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", b, str(size)])
        run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 %d" % (size // 2), b])
        cmd += ["-b", "backing.qcow2", "-F", "qcow2"]
    p = run(cmd + [path, str(size)], cwd=work)
    if p.returncode:
        raise RuntimeError("qemu-img create failed: " + p.stdout)
    snaps = []
    # Compressed clusters first, while this layer has nothing allocated
    # (qemu-io cannot compress over an allocated cluster); several may
    # share one host cluster.
    ops = []
    taken = set()
    # (Not with 2-bit refcounts or less: a shared host cluster leaves no
    # room for snapshots.)
    for _ in range(rng.randint(0, 3) if refcount_bits > 2 else 0):
        n = rng.randint(1, 3)
        first = rng.randrange(0, size // cluster_size - n)
        if taken & set(range(first, first + n)):
            continue
        taken |= set(range(first, first + n))
        ops.append("write -c -P 0x%02x %d %d" % (rng.randint(1, 255), first * cluster_size, n * cluster_size))
    for phase in range(nsnap + 1):
        for _ in range(rng.randint(3, 8)):
            length = rng.choice([512, 4096, cluster_size, 3 * cluster_size, 65536, 200 * 1024])
            off = rng.randrange(0, size - length) & ~511
            kind = rng.random()
            if kind < 0.75:
                ops.append("write -P 0x%02x %d %d" % (rng.randint(1, 255), off, length))
            elif kind < 0.9:
                ops.append("write -z %d %d" % (off, length))
            else:
                ops.append("discard %d %d" % (off, length))
        args = ["qemu-io", "-f", "qcow2"]
        for o in ops:
            args += ["-c", o]
        p = run(args + [path], cwd=work)
        if p.returncode:
            raise RuntimeError("qemu-io failed: " + p.stdout)
        ops = []
        if bitmap and phase == 0:
            p = run(["qemu-img", "bitmap", "--add", path, "b0"], cwd=work)
            if p.returncode:
                raise RuntimeError("bitmap failed: " + p.stdout)
        if phase < nsnap:
            name = "s%d" % phase
            if vmstate_tool and phase == 0:
                state = os.path.join(work, "vmstate.bin")
                with open(state, "wb") as f:
                    f.write(rng.randbytes(rng.randint(1000, 300000)))
                p = run([vmstate_tool, "snapshot", "-c", name, "--vmstate", state, path], cwd=work)
            else:
                p = run(["qemu-img", "snapshot", "-c", name, path], cwd=work)
            if p.returncode:
                raise RuntimeError("snapshot failed: " + p.stdout)
            snaps.append(name)
    return path, snaps


class Image:
    def __init__(self, data):
        self.b = bytearray(data)
        h = self.b
        self.cluster_bits = self.u32(20)
        self.cs = 1 << self.cluster_bits
        self.l1_size = self.u32(36)
        self.l1_off = self.u64(40)
        self.rt_off = self.u64(48)
        self.rt_clusters = self.u32(56)
        self.nb_snap = self.u32(60)
        self.snap_off = self.u64(64)
        self.version = self.u32(4)
        incompat = self.u64(72) if self.version >= 3 else 0
        self.extl2 = bool(incompat & (1 << 4))
        self.order = self.u32(96) if self.version >= 3 else 4
        self.rbits = 1 << self.order
        self.l2e_size = 16 if self.extl2 else 8
        self.l2_entries = self.cs // self.l2e_size
        self.rb_entries = self.cs * 8 // self.rbits
        del h

    def u32(self, off):
        return struct.unpack_from(">I", self.b, off)[0]

    def u64(self, off):
        return struct.unpack_from(">Q", self.b, off)[0]

    def p64(self, off, v):
        struct.pack_into(">Q", self.b, off, v)

    def nclusters(self):
        return (len(self.b) + self.cs - 1) // self.cs

    # Tables
    def l1_slots(self):
        """(file offset of the L1 entry, entry) for non-empty active L1 entries."""
        out = []
        for i in range(self.l1_size):
            pos = self.l1_off + 8 * i
            e = self.u64(pos)
            if e & OFF_MASK:
                out.append((pos, e))
        return out

    def l2_slots(self, want_data=True):
        """(file offset of the L2 entry, entry) for active L2 entries with a host cluster."""
        out = []
        for _, l1e in self.l1_slots():
            l2 = l1e & OFF_MASK
            if l2 + self.cs > len(self.b):
                continue
            for j in range(self.l2_entries):
                pos = l2 + j * self.l2e_size
                e = self.u64(pos)
                if e & COMPRESSED:
                    continue
                if (e & OFF_MASK) and want_data:
                    out.append((pos, e))
        return out

    def rt_slots(self):
        out = []
        for i in range(self.rt_clusters * self.cs // 8):
            pos = self.rt_off + 8 * i
            e = self.u64(pos)
            if e:
                out.append((i, pos, e))
        return out

    def refcount_pos(self, cluster):
        ti = cluster // self.rb_entries
        if ti >= self.rt_clusters * self.cs // 8:
            return None
        rb = self.u64(self.rt_off + 8 * ti) & ~511
        if not rb:
            return None
        return rb, cluster % self.rb_entries

    def get_rc(self, cluster):
        p = self.refcount_pos(cluster)
        if p is None:
            return 0
        rb, i = p
        bit = i * self.rbits
        if self.rbits < 8:
            return (self.b[rb + bit // 8] >> (bit % 8)) & ((1 << self.rbits) - 1)
        n = self.rbits // 8
        return int.from_bytes(self.b[rb + i * n: rb + i * n + n], "big")

    def set_rc(self, cluster, v):
        p = self.refcount_pos(cluster)
        if p is None:
            return False
        rb, i = p
        bit = i * self.rbits
        if self.rbits < 8:
            mask = ((1 << self.rbits) - 1) << (bit % 8)
            byte = rb + bit // 8
            self.b[byte] = (self.b[byte] & ~mask & 0xff) | ((v << (bit % 8)) & mask)
        else:
            n = self.rbits // 8
            self.b[rb + i * n: rb + i * n + n] = v.to_bytes(n, "big")
        return True

    def metadata_clusters(self):
        """Clusters of the active L1 table, active L2 tables and the refcount table."""
        out = set()
        for c in range(self.l1_off // self.cs, (self.l1_off + 8 * self.l1_size + self.cs - 1) // self.cs):
            out.add(c)
        for _, e in self.l1_slots():
            out.add((e & OFF_MASK) // self.cs)
        for c in range(self.rt_clusters):
            out.add(self.rt_off // self.cs + c)
        return out


def set_offset(e, off):
    return (e & ~OFF_MASK) | off


# Damage kinds. Each returns a description or None.
def rt_entry_zero(img, rng):
    slots = img.rt_slots()
    if not slots:
        return None
    i, pos, e = rng.choice(slots)
    img.p64(pos, 0)
    return "refcount table entry %d (0x%x) zeroed" % (i, e)


def rt_entry_overlap(img, rng):
    slots, data = img.rt_slots(), img.l2_slots()
    if not slots or not data:
        return None
    i, pos, _ = rng.choice(slots)
    _, e = rng.choice(data)
    img.p64(pos, e & OFF_MASK)
    return "refcount table entry %d points at data cluster 0x%x" % (i, e & OFF_MASK)


def rt_entry_outside(img, rng):
    slots = img.rt_slots()
    if not slots:
        return None
    i, pos, _ = rng.choice(slots)
    off = (len(img.b) + rng.randint(1, 64) * img.cs + img.cs - 1) // img.cs * img.cs
    img.p64(pos, off)
    return "refcount table entry %d points past the end (0x%x)" % (i, off)


def copied_l1(img, rng):
    slots = img.l1_slots()
    if not slots:
        return None
    pos, e = rng.choice(slots)
    img.p64(pos, e ^ COPIED)
    return "L1 entry at 0x%x: COPIED flipped" % pos


def copied_l2(img, rng):
    slots = img.l2_slots()
    if not slots:
        return None
    pos, e = rng.choice(slots)
    img.p64(pos, e ^ COPIED)
    return "L2 entry at 0x%x: COPIED flipped" % pos


def l2_into_refblock(img, rng):
    data, rbs = img.l2_slots(), img.rt_slots()
    if not data or not rbs:
        return None
    pos, e = rng.choice(data)
    _, _, rb = rng.choice(rbs)
    img.p64(pos, set_offset(e, rb & OFF_MASK))
    return "L2 entry at 0x%x points into refcount block 0x%x" % (pos, rb)


def l2_into_metadata(img, rng):
    data = img.l2_slots()
    meta = sorted(img.metadata_clusters() | {0})
    if not data:
        return None
    pos, e = rng.choice(data)
    c = rng.choice(meta)
    img.p64(pos, set_offset(e, c * img.cs))
    return "L2 entry at 0x%x points into metadata cluster %d" % (pos, c)


def l2_shared(img, rng):
    data = img.l2_slots()
    if len(data) < 2:
        return None
    (pa, ea), (pb, eb) = rng.sample(data, 2)
    if ea & OFF_MASK == eb & OFF_MASK:
        return None
    img.p64(pa, set_offset(ea, eb & OFF_MASK))
    return "L2 entry at 0x%x shares cluster 0x%x" % (pa, eb & OFF_MASK)


def l2_outside(img, rng):
    data = img.l2_slots()
    if not data:
        return None
    pos, e = rng.choice(data)
    off = (len(img.b) // img.cs + rng.randint(1, 100)) * img.cs
    img.p64(pos, set_offset(e, off))
    return "L2 entry at 0x%x points past the end (0x%x)" % (pos, off)


def leak(img, rng):
    free = [c for c in range(1, img.nclusters()) if img.get_rc(c) == 0 and img.refcount_pos(c)]
    if not free or rng.random() < 0.5:
        # A cluster appended to the file, as a crash after allocating leaves it.
        c = (len(img.b) + img.cs - 1) // img.cs
        if not img.refcount_pos(c):
            return None
        img.b += bytes(c * img.cs + img.cs - len(img.b))
        free = [c]
    c = rng.choice(free)
    img.set_rc(c, 1)
    return "cluster %d leaked" % c


def rt_entry_duplicate(img, rng):
    """A second refcount table entry naming a block already in use."""
    slots = img.rt_slots()
    n = img.rt_clusters * img.cs // 8
    empty = [i for i in range(n) if not img.u64(img.rt_off + 8 * i)]
    if not slots or not empty:
        return None
    _, _, e = rng.choice(slots)
    i = rng.choice(empty[:8])
    img.p64(img.rt_off + 8 * i, e)
    return "refcount table entry %d repeats block 0x%x" % (i, e)


def rt_entry_unaligned(img, rng):
    slots = img.rt_slots()
    if not slots:
        return None
    i, pos, e = rng.choice(slots)
    img.p64(pos, e + 512 * rng.randint(1, img.cs // 512 - 1) if img.cs > 512 else e | 0x100)
    return "refcount table entry %d misaligned" % i


def l1_into_refblock(img, rng):
    slots, rbs = img.l1_slots(), img.rt_slots()
    if not slots or not rbs:
        return None
    pos, e = rng.choice(slots)
    _, _, rb = rng.choice(rbs)
    img.p64(pos, set_offset(e, rb & OFF_MASK))
    return "L1 entry at 0x%x points at refcount block 0x%x" % (pos, rb)


def refcount_low(img, rng):
    used = [c for c in range(img.nclusters()) if img.get_rc(c) > 0]
    if not used:
        return None
    c = rng.choice(used)
    v = img.get_rc(c)
    img.set_rc(c, v - 1)
    return "cluster %d refcount %d -> %d" % (c, v, v - 1)


def refcount_high(img, rng):
    mx = (1 << img.rbits) - 1
    used = [c for c in range(img.nclusters()) if 0 < img.get_rc(c) < mx]
    if not used:
        return None
    c = rng.choice(used)
    v = img.get_rc(c)
    img.set_rc(c, v + 1)
    return "cluster %d refcount %d -> %d" % (c, v, v + 1)


def refblock_bitflip(img, rng):
    rbs = img.rt_slots()
    if not rbs:
        return None
    _, _, rb = rng.choice(rbs)
    rb &= ~511
    # Within the part of the block that describes the file, so that it matters.
    nbits = min(img.cs * 8, max(img.rbits, img.nclusters() * img.rbits))
    bit = rng.randrange(nbits)
    img.b[rb + bit // 8] ^= 1 << (bit % 8)
    return "refcount block 0x%x bit %d flipped" % (rb, bit)


KINDS = {
    "rt_entry_zero": rt_entry_zero,
    "rt_entry_overlap": rt_entry_overlap,
    "rt_entry_outside": rt_entry_outside,
    "rt_entry_unaligned": rt_entry_unaligned,
    "rt_entry_duplicate": rt_entry_duplicate,
    "l1_into_refblock": l1_into_refblock,
    "copied_l1": copied_l1,
    "copied_l2": copied_l2,
    "l2_into_refblock": l2_into_refblock,
    "l2_into_metadata": l2_into_metadata,
    "l2_shared": l2_shared,
    "l2_outside": l2_outside,
    "leak": leak,
    "refcount_low": refcount_low,
    "refcount_high": refcount_high,
    "refblock_bitflip": refblock_bitflip,
}


def damage(data, kind, rng):
    img = Image(data)
    what = KINDS[kind](img, rng)
    return (bytes(img.b), what) if what else (None, None)


if __name__ == "__main__":
    import sys
    # damage.py KIND SEED IN OUT: damages one image by hand.
    kind, seed, src, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    out, what = damage(open(src, "rb").read(), kind, random.Random(seed))
    if out is None:
        sys.exit("nothing to damage that way")
    open(dst, "wb").write(out)
    print(what)
