#!/usr/bin/env python3
"""qcowkit commit against qemu-img commit on twin backing chains (commit.sh).

Each case builds a chain with qemu-img/qemu-io (base, optional middle,
top; data, zero writes, a compressed cluster, subclusters with extended
L2, a top larger than its base, a raw base), copies it, commits one copy
with each tool and requires: the same exit status and messages (program
name aside), `qemu-img check` clean on our images, every layer of ours
reading the same as QEMU's (each with its own chain), and what the top
itself still holds (qemu-img map, depth 0: ranges, zero, data) the same.
Usage: commit.py QCOWKIT WORKDIR
"""
import json
import os
import shutil
import sys

from twin import bad, finish, new_case, random_chain, run, run_both, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20


def build(d, layers):
    """layers: [(file, fmt, size, create options, [qemu-io commands])], base first."""
    os.makedirs(d)
    prev = None
    for f, fmt, size, opts, cmds in layers:
        c = ["qemu-img", "create", "-q", "-f", fmt]
        if opts:
            c += ["-o", opts]
        if prev:
            c += ["-b", prev[0], "-F", prev[1]]
        sh(c + [f, str(size)], d)
        if cmds:
            sh(["qemu-io", "-f", fmt] + [a for w in cmds for a in ("-c", w)] + [f], d)
        prev = (f, fmt)


def layer_map(d, f):
    rc, out, _ = run(["qemu-img", "map", "--output=json", f], d)
    if rc != 0:
        return None
    # What the layer itself holds (depth 0), neighbours merged: how the
    # layers below map their data is theirs to choose.
    own = []
    for e in json.loads(out):
        if e["depth"] != 0:
            continue
        t = (e["zero"], e["data"])
        if own and own[-1][0] + own[-1][1] == e["start"] and own[-1][2] == t:
            own[-1] = (own[-1][0], own[-1][1] + e["length"], t)
        else:
            own.append((e["start"], e["length"], t))
    return own


def case(name, layers, args, cwd=""):
    """cwd: a subdirectory of the chain's to run the tools in."""
    n = new_case()
    q, k = os.path.join(WORK, "q%d" % n), os.path.join(WORK, "k%d" % n)
    try:
        build(q, layers)
        if cwd:
            os.makedirs(os.path.join(q, cwd))
    except RuntimeError as e:
        bad(name, "setup: %s" % e)
        return
    shutil.copytree(q, k)
    rq, rk = run_both(name, QK, "commit", args, os.path.join(q, cwd), os.path.join(k, cwd))
    for f, fmt, _, _, _ in layers:
        if fmt == "qcow2":
            rc, out, _ = run(["qemu-img", "check", f], k)
            if rc != 0:
                bad(name, "qemu-img check %s: %s" % (f, out.strip()))
        rc, out, err = run(["qemu-img", "compare", os.path.join(q, f), os.path.join(k, f)])
        if rc != 0:
            bad(name, "%s reads differently: %s%s" % (f, out, err))
    top = layers[-1][0]
    # The emptied top gives its freed clusters back to the host, as
    # qemu-img's does (the file ends at its last cluster in use).
    tq, tk = os.path.join(q, top), os.path.join(k, top)
    if os.path.exists(tq) and os.path.exists(tk) and os.path.getsize(tk) > os.path.getsize(tq):
        bad(name, "%s is %d bytes, qemu-img's %d" % (top, os.path.getsize(tk), os.path.getsize(tq)))
    if layer_map(q, top) != layer_map(k, top):
        bad(name, "allocation of %s differs:\n  qemu-img: %s\n  qcowkit:  %s" % (
            top, layer_map(q, top), layer_map(k, top)))


top_data = ["write -P 0x21 512k 1M", "write -z 3M 128k", "write -P 0x22 %d 4096" % (7 * M - 100)]
base_data = ["write -P 0x11 0 8M"]
mid_data = ["write -P 0x31 2M 2M", "write -z 6M 64k"]

for cs in (512, 65536, 2 * M):
    o = "cluster_size=%d" % cs
    two = [("b.qcow2", "qcow2", 8 * M, o, base_data), ("t.qcow2", "qcow2", 8 * M, o, top_data)]
    case("commit, cluster_size=%d" % cs, two, ["t.qcow2"])
    case("commit -d, cluster_size=%d" % cs, two, ["-d", "t.qcow2"])
    case("commit -q -p, cluster_size=%d" % cs, two, ["-q", "-p", "t.qcow2"])

three = [("b.qcow2", "qcow2", 8 * M, "", base_data), ("m.qcow2", "qcow2", 8 * M, "", mid_data),
         ("t.qcow2", "qcow2", 8 * M, "", top_data)]
case("three layers, into the middle", three, ["t.qcow2"])
case("three layers, -b base", three, ["-b", "b.qcow2", "t.qcow2"])
case("three layers, -b middle", three, ["-b", "m.qcow2", "t.qcow2"])
case("-b not in the chain", three, ["-b", "t.qcow2", "t.qcow2"])
# Run from a subdirectory: a relative -b names a file relative to the
# image that has it as backing file, not to the current directory.
case("from a subdirectory, -b base", three, ["-b", "b.qcow2", "../t.qcow2"], cwd="s")
case("from a subdirectory, -b ../base", three, ["-b", "../b.qcow2", "../t.qcow2"], cwd="s")
case("from a subdirectory, -b middle", three, ["-b", "./m.qcow2", "../t.qcow2"], cwd="s")
case("no backing file", three[:1], ["b.qcow2"])
case("compressed cluster in the top", [
    ("b.qcow2", "qcow2", 8 * M, "", base_data),
    ("t.qcow2", "qcow2", 8 * M, "", ["write -c -P 0x41 1M 64k", "write -P 0x42 5M 100k"])], ["t.qcow2"])
case("extended L2 subclusters", [
    ("b.qcow2", "qcow2", 8 * M, "extended_l2=on", base_data),
    ("t.qcow2", "qcow2", 8 * M, "extended_l2=on",
     ["write -P 0x51 2048 2048", "write -P 0x52 70000 3000", "write -z 6M 4096", "discard 1M 8192"])],
     ["t.qcow2"])
case("top larger than its base", [
    ("b.qcow2", "qcow2", 4 * M, "", ["write -P 0x11 0 4M"]),
    ("t.qcow2", "qcow2", 8 * M, "", ["write -P 0x61 3M 3M"])], ["t.qcow2"])
case("raw base", [
    ("b.raw", "raw", 8 * M, "", base_data), ("t.qcow2", "qcow2", 8 * M, "", top_data)], ["t.qcow2"])
case("-f raw on a qcow2 top", three, ["-f", "raw", "t.qcow2"])
two = [("b.qcow2", "qcow2", 8 * M, "", base_data), ("t.qcow2", "qcow2", 8 * M, "", top_data)]
for r in ("0", "64M", "abc", "-5"):
    case("-r %s" % r, two, ["-r", r, "t.qcow2"])

# -p: the progress line goes to stdout, as qemu-img's does, ending at 100%.
n = new_case()
d = os.path.join(WORK, "p%d" % n)
build(d, two)
rc, out, err = run([QK, "commit", "-p", "t.qcow2"], d)
if rc != 0 or "(100.00/100%)" not in out or "/100%" in err:
    bad("commit -p", "exit %d, stdout %r, stderr %r" % (rc, out[-200:], err[-200:]))

# Random chains of 2-5 layers, committed into the backing file or with -b
# into a deeper layer.
for seed in range(int(os.environ.get("QK_RANDOM_CHAINS", "6"))):
    chain = [(f, "qcow2", size, opts, cmds) for f, size, opts, cmds in random_chain(seed)]
    top = chain[-1][0]
    args = [top] if seed % 2 == 0 else ["-b", chain[seed % (len(chain) - 1)][0], top]
    case("random chain %d (%d layers) %s" % (seed, len(chain), " ".join(args)), chain, args)

finish()
