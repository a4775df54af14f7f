"""Random guest workloads for the crash tests: configurations, epochs of
operations, and running them through `qcowkit io` / `qcowkit snapshot`.

An io epoch is 1..max_ops operations on disjoint byte ranges (aio writes
with a pattern, zero writes with and without unmap, discards, sometimes a
synchronous or FUA write), or alone a cut (the image shrunk by `truncate`
and grown back: its tail reads as zeros), then `aio_flush`, `flush` and
`mark epoch N`.
Offsets mostly fall in a small moving window of clusters so that later
operations land in clusters earlier ones allocated, zeroed or discarded;
the rest go anywhere, which grows the image (new L2 tables, refcount
blocks, and with small clusters a larger refcount table). A snapshot epoch
is one `qcowkit snapshot` run (create, with VM state or not; apply;
delete), marked in the log once it has exited.

Owns: configurations and operation streams.
"""
import os
import random
import subprocess

from model import History, Op
import wlog


class Config:
    def __init__(self, name, cluster=65536, refbits=16, extl2=False, size=64 << 20,
                 aio="io_uring", cache="writeback", snapshots=False, vmstate=False,
                 epochs=30, max_ops=4, big=0.0, window=8, data_file=False, data_raw=False):
        self.name, self.cluster, self.refbits, self.extl2 = name, cluster, refbits, extl2
        self.data_file, self.data_raw = data_file, data_raw
        self.size, self.aio, self.cache = size, aio, cache
        self.snapshots, self.vmstate = snapshots, vmstate
        self.epochs, self.max_ops, self.big, self.window = epochs, max_ops, big, window

    def create_opts(self, image=None):
        o = "cluster_size=%d,refcount_bits=%d,extended_l2=%s" % (
            self.cluster, self.refbits, "on" if self.extl2 else "off")
        if self.data_file:
            # An absolute name: the image finds it wherever the test runs.
            o += ",data_file=%s.data" % os.path.abspath(image)
            if self.data_raw:
                o += ",data_file_raw=on"
        return o

    def describe(self):
        return "%s (cluster_size=%d refcount_bits=%d extended_l2=%s size=%dM aio=%s cache=%s%s%s)" % (
            self.name, self.cluster, self.refbits, "on" if self.extl2 else "off",
            self.size >> 20, self.aio, self.cache, " snapshots" if self.snapshots else "",
            (" data_file" + (" raw" if self.data_raw else "")) if self.data_file else "")


# The short run's configurations: every cluster size class, extended L2,
# refcount widths 1..64, both aio backends, both cache modes, snapshots.
SHORT = [
    Config("c4k", cluster=4096, size=64 << 20, epochs=40, big=0.15),
    Config("c4k-threads-none", cluster=4096, aio="threads", cache="none", epochs=30),
    Config("c512-r64-growth", cluster=512, refbits=64, size=8 << 20, epochs=40, big=0.25),
    Config("c512-r1", cluster=512, refbits=1, size=8 << 20, epochs=30, big=0.1),
    Config("c1k-r32-snap", cluster=1024, refbits=32, size=8 << 20, epochs=30,
           snapshots=True, vmstate=True),
    Config("c64k-extl2-r8", cluster=65536, refbits=8, extl2=True, size=64 << 20, epochs=30),
    Config("c2m-r2", cluster=2 << 20, refbits=2, size=32 << 20, epochs=16, window=4),
    Config("c16k-extl2-snap", cluster=16384, refbits=16, extl2=True, size=32 << 20, epochs=30,
           snapshots=True),
]

# External data files: SIGKILL only (the power-loss replay rebuilds one
# file from its write log, and guest data goes to a second one here). No
# cuts: an image with a data file cannot be resized.
DATA_FILE = [
    Config("c64k-datafile", cluster=65536, size=32 << 20, epochs=30, data_file=True),
    Config("c32k-extl2-datafile-raw", cluster=32768, extl2=True, size=32 << 20, epochs=30,
           data_file=True, data_raw=True),
]


class Generator:
    def __init__(self, cfg, rng):
        self.cfg, self.rng = cfg, rng
        self.pattern = 0
        self.snap_seq = 0
        self.live = []  # snapshot names that exist
        self.queued = []  # ops forced into the coming epochs, one list per epoch
        self._move_window()

    def _move_window(self):
        c = self.cfg.cluster
        span = min(self.cfg.window * c, self.cfg.size)
        self.win = self.rng.randrange(0, self.cfg.size - span + 1, c) if span < self.cfg.size else 0
        self.win_len = span

    def _range(self, whole_clusters=False):
        rng, c, size = self.rng, self.cfg.cluster, self.cfg.size
        if rng.random() < self.cfg.big:
            length = rng.choice([16, 32, 64, 128, 256]) * 1024
            length = min(length, size)
            off = rng.randrange(0, size - length + 1, 512)
            return off, length
        shape = 0.0 if whole_clusters else rng.random()
        if shape < 0.3:      # whole clusters
            length = c * rng.randint(1, 3)
        elif shape < 0.6:    # sectors
            length = 512 * rng.randint(1, max(1, min(16, 3 * c // 512)))
        else:                # anything, small
            length = rng.randint(1, min(3 * c, 20000))
        if rng.random() < 0.8:
            base, span = self.win, self.win_len
        else:
            base, span = 0, size
        length = min(length, span)
        align = c if whole_clusters else rng.choice([c, 512, 1])
        off = base + rng.randrange(0, span - length + 1)
        off -= off % align
        return off, length

    def _rezero(self):
        """Queues a cluster's life that random ops rarely line up: filled,
        zeroed in place (it keeps its host cluster and gets the zero flag),
        then a small write inside it (which must not expose the old data);
        each step in its own epoch."""
        c = self.cfg.cluster
        base = self.rng.randrange(0, self.cfg.size, c)
        self.pattern = self.pattern % 255 + 1
        small = self.rng.randint(1, max(1, min(c // 2, 4096)))
        inner = base + self.rng.randrange(0, c - small + 1)
        self.queued = [[Op("write", base, c, self.pattern)], [Op("zero", base, c)]]
        self.pattern = self.pattern % 255 + 1
        self.queued.append([Op("write", inner, small, self.pattern)])

    def io_epoch(self):
        if not self.queued and self.rng.random() < 0.2:
            self._rezero()
        if self.rng.random() < 0.1:
            self._move_window()
        if self.queued:
            # Alone in its epoch, so the crash points around it have few
            # pending writes and every subset of them gets checked.
            return self.queued.pop(0)
        if self.rng.random() < 0.05 and not self.cfg.data_file:
            # The image shrunk (its tail cut off) and grown back: alone too.
            new = self.rng.randrange(self.cfg.size * 3 // 4, self.cfg.size, 512)
            return [Op("cut", new, self.cfg.size - new)]
        ops = []
        for _ in range(self.rng.randint(1, self.cfg.max_ops)):
            k = self.rng.random()
            # Zeroing and discarding whole clusters is what changes a
            # cluster's state (zero flag, unallocated); do it often.
            whole = k >= 0.55 and self.rng.random() < 0.6
            for _try in range(10):
                off, length = self._range(whole)
                if all(off + length <= o.off or o.off + o.length <= off for o in ops):
                    break
            else:
                continue
            if k < 0.55:
                self.pattern = self.pattern % 255 + 1
                flags = self.rng.choice(["", "", "", "", "", "sync", "fua"])
                ops.append(Op("write", off, length, self.pattern, flags=flags))
            elif k < 0.7:
                ops.append(Op("zero", off, length))
            elif k < 0.85:
                ops.append(Op("zero", off, length, flags="-u"))
            else:
                ops.append(Op("discard", off, length))
        return ops

    def snap_epoch(self, workdir):
        rng = self.rng
        choices = ["create"]
        if self.live:
            choices += ["apply", "delete"]
        if len(self.live) >= 3:
            choices.remove("create")
        what = rng.choice(choices)
        if what == "create":
            self.snap_seq += 1
            name = "s%d" % self.snap_seq
            vm = None
            if self.cfg.vmstate and rng.random() < 0.6:
                vm = os.path.join(workdir, "vmstate-%s" % name)
                with open(vm, "wb") as f:
                    f.write(rng.randbytes(rng.randint(1, 300000)))
            self.live.append(name)
            return [Op("snap_create", name=name, vmstate=vm)]
        name = rng.choice(self.live)
        if what == "delete":
            self.live.remove(name)
            return [Op("snap_delete", name=name)]
        return [Op("snap_apply", name=name)]

    def epoch(self, workdir):
        if self.cfg.snapshots and self.rng.random() < 0.12:
            return self.snap_epoch(workdir)
        ops = []
        while not ops:
            ops = self.io_epoch()
        return ops


def io_commands(op):
    """The `qcowkit io` command for one data operation."""
    if op.kind == "write":
        if op.flags == "sync":
            return "write -q -P %d %d %d" % (op.pattern, op.off, op.length)
        if op.flags == "fua":
            return "write -q -f -P %d %d %d" % (op.pattern, op.off, op.length)
        return "aio_write -q -P %d %d %d" % (op.pattern, op.off, op.length)
    if op.kind == "zero":
        return "aio_write -q -z %s %d %d" % (op.flags, op.off, op.length)
    if op.kind == "discard":
        return "discard -q %d %d" % (op.off, op.length)
    raise ValueError(op.kind)


def epoch_script(ops, n):
    lines = []
    for op in ops:
        if op.kind == "cut":
            lines += ["truncate %d" % op.off, "truncate %d" % (op.off + op.length)]
        else:
            lines.append(io_commands(op))
    return lines + ["aio_flush", "flush", "mark epoch %d" % n]


class Runner:
    """Runs a workload on an image, logging to log (or not, when None)."""

    def __init__(self, qcowkit, cfg, image, log, workdir):
        self.qcowkit, self.cfg, self.image, self.log, self.workdir = qcowkit, cfg, image, log, workdir
        self.env = dict(os.environ, QCOWKIT_AIO=cfg.aio)
        self.env.pop("QCOWKIT_LOG_WRITES", None)
        if log:
            self.env["QCOWKIT_LOG_WRITES"] = log

    def io_argv(self):
        return [self.qcowkit, "io", "-f", "qcow2", "-t", self.cfg.cache, self.image]

    def run_io(self, lines):
        p = subprocess.run(self.io_argv(), input="\n".join(lines) + "\n", env=self.env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("qcowkit io failed (%d): %s %s" % (p.returncode, p.stdout[-2000:],
                                                                p.stderr[-2000:]))

    def run_snap(self, op, n):
        argv = [self.qcowkit, "snapshot", "-t", self.cfg.cache]
        if op.kind == "snap_create":
            argv += ["-c", op.name]
            if op.vmstate:
                argv += ["--vmstate", op.vmstate]
        elif op.kind == "snap_apply":
            argv += ["-a", op.name]
        else:
            argv += ["-d", op.name]
        p = subprocess.run(argv + [self.image], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), p.returncode, p.stderr[-2000:]))
        if self.log:
            wlog.append_mark(self.log, "epoch %d" % n)


def create_image(qcowkit, cfg, image):
    subprocess.run([qcowkit, "create", "-q", "-f", "qcow2", "-o", cfg.create_opts(image), image,
                    str(cfg.size)], check=True)


def run_workload(qcowkit, cfg, image, log, workdir, seed):
    """Runs cfg.epochs epochs; returns the History of expected contents."""
    rng = random.Random(seed)
    gen = Generator(cfg, rng)
    hist = History(cfg.size)
    runner = Runner(qcowkit, cfg, image, log, workdir)
    batch = []
    for _ in range(cfg.epochs):
        ops = gen.epoch(workdir)
        n = hist.add_epoch(ops)
        if ops[0].kind.startswith("snap"):
            if batch:
                runner.run_io(batch)
                batch = []
            runner.run_snap(ops[0], n)
        else:
            batch += epoch_script(ops, n)
    if batch:
        runner.run_io(batch)
    return hist
