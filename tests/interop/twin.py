"""Helpers of the differential tests that run qcowkit and qemu-img on twin
copies of the same images (resize.py, commit.py, ...): running the tools,
and counting cases and failures the same way in each."""
import random
import subprocess
import sys

tally = {"cases": 0, "failures": 0}


def run(cmd, cwd=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def sh(cmd, cwd=None):
    rc, out, err = run(cmd, cwd)
    if rc != 0:
        raise RuntimeError("%s: %s%s" % (" ".join(cmd), out, err))
    return out


def same_name(t):
    """Output with the program's name taken out."""
    return t.replace("qemu-img", "PROG").replace("qcowkit", "PROG")


def run_both(name, qk, sub, args, q, k, norm=same_name):
    """Runs `qemu-img SUB ARGS` in q and `QCOWKIT SUB ARGS` in k; a failure
    unless the exit status, stdout and stderr (each after norm) are the same.
    Returns both results as (status, stdout, stderr)."""
    rq = run(["qemu-img", sub] + args, q)
    rk = run([qk, sub] + args, k)
    if rq[0] != rk[0]:
        bad(name, "exit %d, qemu-img %d (stderr: %s)" % (rk[0], rq[0], rk[2].strip()))
    # Each stream on its own: scripts read stdout (progress, reports) and
    # stderr (errors) apart.
    for i, stream in ((1, "stdout"), (2, "stderr")):
        if norm(rq[i]) != norm(rk[i]):
            bad(name, "%s differs:\n  qemu-img: %r\n  qcowkit:  %r" % (stream, rq[i], rk[i]))
    return rq, rk


def new_case():
    """Counts a case; returns its number (from 1)."""
    tally["cases"] += 1
    return tally["cases"]


def bad(name, msg):
    tally["failures"] += 1
    print("FAIL %s: %s" % (name, msg))


def finish():
    print("%d cases, %d failures" % (tally["cases"], tally["failures"]))
    sys.exit(1 if tally["failures"] else 0)


def random_chain(seed, layers=None):
    """A random backing chain, base first: [(file, size, create options,
    [qemu-io commands])], 2-5 layers (or `layers`), each with random
    cluster size, extended L2 on some, and random writes, zero writes and
    discards; sizes vary so some layers are larger than what lies below."""
    rng = random.Random(seed)
    n = layers or rng.randint(2, 5)
    M = 1 << 20
    out = []
    for i in range(n):
        cs = rng.choice([512, 4096, 65536, 65536, 2 * M])
        ext = cs >= 16384 and rng.random() < 0.4
        opts = "cluster_size=%d%s" % (cs, ",extended_l2=on" if ext else "")
        size = rng.choice([6, 8, 8, 10]) * M
        cmds = []
        for _ in range(rng.randint(2, 8)):
            off = rng.randrange(0, size - 4096) & ~511
            ln = min(rng.choice([512, 4096, 65536, 300000, M]), size - off) & ~511 or 512
            k = rng.random()
            if k < 0.6:
                cmds.append("write -P %d %d %d" % (rng.randint(1, 255), off, ln))
            elif k < 0.85:
                cmds.append("write -z %d %d" % (off, ln))
            else:
                cmds.append("discard %d %d" % (off, ln))
        out.append(("l%d.qcow2" % i, size, opts, cmds))
    return out
