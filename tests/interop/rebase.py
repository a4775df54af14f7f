#!/usr/bin/env python3
"""qcowkit rebase against qemu-img rebase on twin backing chains (rebase.sh).

Each case builds images with qemu-img/qemu-io, copies the directory three
times (one for each tool, one kept as it was), rebases with each tool and
requires: the same exit status and messages (program name aside, progress
lines reduced to their last state), `qemu-img check` clean on our image,
the backing file and format qemu-img info shows the same, and the
content: in safe mode the same as before the rebase (read through the old
chain), and in every mode the same as qemu-img's result, except where
qcowkit differs on purpose (safe rebase of an image without a backing
file keeps its content; qemu-img only writes the header).
Usage: rebase.py QCOWKIT WORKDIR
"""
import json
import os
import re
import shutil
import sys

from twin import bad, finish, new_case, random_chain, run, run_both, same_name, sh

QK, WORK = sys.argv[1], sys.argv[2]
M = 1 << 20


def build(d, images):
    """images: [(file, fmt, size, create options, backing (file, fmt) or None, [qemu-io commands])]."""
    os.makedirs(d)
    for f, fmt, size, opts, backing, cmds in images:
        c = ["qemu-img", "create", "-q", "-f", fmt]
        if opts:
            c += ["-o", opts]
        if backing:
            c += ["-u", "-b", backing[0], "-F", backing[1]]
        sh(c + [f, str(size)], d)
        if cmds:
            sh(["qemu-io", "-f", fmt] + [a for w in cmds for a in ("-c", w)] + [f], d)


def norm(t):
    t = same_name(t)
    # Progress: only the first and the last state count (how often the
    # line is redrawn depends on timing and piece sizes). Output is read
    # as text, so the redraws' carriage returns arrive as line breaks.
    lines = t.split("\n")
    prog = [i for i, l in enumerate(lines) if re.fullmatch(r"    \(\d+\.\d\d/100%\)", l)]
    drop = set(prog[1:-1])
    return "\n".join(l for i, l in enumerate(lines) if i not in drop)


def backing_of(d, f):
    rc, out, _ = run(["qemu-img", "info", "--output=json", "-U", f], d)
    if rc != 0:
        return None
    j = json.loads(out)
    return j.get("backing-filename"), j.get("backing-filename-format")


def case(name, images, args, top="t.qcow2", same_content_as_qemu=True, readable=True):
    n = new_case()
    p, q, k = (os.path.join(WORK, "%s%d" % (x, n)) for x in "pqk")
    try:
        build(p, images)
    except RuntimeError as e:
        bad(name, "setup: %s" % e)
        return
    shutil.copytree(p, q)
    shutil.copytree(p, k)
    rq, rk = run_both(name, QK, "rebase", args, q, k, norm=norm)
    fmt = "raw" if "-f" in args and args[args.index("-f") + 1] == "raw" else "qcow2"
    if fmt == "qcow2":
        # Without its backing file: it may be missing (-u).
        spec = {"driver": "qcow2", "backing": None, "file": {"driver": "file", "filename": top}}
        rc, out, _ = run(["qemu-img", "check", "-U", "json:" + json.dumps(spec)], k)
        if rc != 0:
            bad(name, "qemu-img check: %s" % out.strip())
    if backing_of(q, top) != backing_of(k, top):
        bad(name, "backing file differs: qemu-img %s, qcowkit %s" % (backing_of(q, top), backing_of(k, top)))
    unsafe = "-u" in args
    if rk[0] == 0 and (not unsafe):
        rc, out, err = run(["qemu-img", "compare", "-f", fmt, "-F", fmt, os.path.join(p, top), os.path.join(k, top)])
        if rc != 0:
            bad(name, "content changed by the rebase: %s%s" % (out, err))
    if readable and (same_content_as_qemu or rk[0] != 0):
        rc, out, err = run(["qemu-img", "compare", "-f", fmt, "-F", fmt, os.path.join(q, top), os.path.join(k, top)])
        if rc != 0:
            bad(name, "reads differently from qemu-img's: %s%s" % (out, err))


Q = lambda f: (f, "qcow2")
a_data = ["write -P 0x11 0 8M", "write -z 5M 1M"]
b_data = ["write -P 0x11 0 2M", "write -P 0x22 2M 2M", "write -z 6M 1M"]
t_data = ["write -P 0x33 1M 64k", "write -z 3M 128k", "write -P 0x34 %d 4096" % (7 * M - 100)]

for cs in (512, 65536, 2 * M):
    o = "cluster_size=%d" % cs
    imgs = [("a.qcow2", "qcow2", 8 * M, o, None, a_data), ("b.qcow2", "qcow2", 8 * M, o, None, b_data),
            ("t.qcow2", "qcow2", 8 * M, o, Q("a.qcow2"), t_data)]
    case("onto another base, cluster_size=%d" % cs, imgs, ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
    case("-u onto another base, cluster_size=%d" % cs, imgs, ["-u", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
    case("standalone (-b ''), cluster_size=%d" % cs, imgs, ["-b", "", "t.qcow2"])

three = [("a.qcow2", "qcow2", 8 * M, "", None, a_data),
         ("m.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), ["write -P 0x44 1M 3M", "write -z 6M 64k"]),
         ("t.qcow2", "qcow2", 8 * M, "", Q("m.qcow2"), t_data)]
case("drop the middle layer", three, ["-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])
case("onto the middle layer's own chain (no change)", three, ["-b", "m.qcow2", "-F", "qcow2", "t.qcow2"])
case("-q -p", three, ["-q", "-p", "-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])
case("-p", three, ["-p", "-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])
case("-t none -T none", three, ["-t", "none", "-T", "none", "-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])
case("extended L2 subclusters, backing with smaller clusters", [
    ("a.qcow2", "qcow2", 8 * M, "cluster_size=4096", None, a_data),
    ("b.qcow2", "qcow2", 8 * M, "cluster_size=512", None, ["write -P 0x22 1000 70000", "write -P 0x23 3M 512"]),
    ("t.qcow2", "qcow2", 8 * M, "extended_l2=on", Q("a.qcow2"),
     ["write -P 0x51 2048 2048", "write -P 0x52 70000 3000", "write -z 6M 4096", "discard 1M 8192"])],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
case("overlay larger than both backing files", [
    ("a.qcow2", "qcow2", 4 * M, "", None, ["write -P 0x11 0 4M"]),
    ("b.qcow2", "qcow2", 2 * M, "", None, ["write -P 0x11 0 1M"]),
    ("t.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), ["write -P 0x61 3M 3M"])],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
case("new backing file larger than the overlay", [
    ("a.qcow2", "qcow2", 4 * M, "", None, ["write -P 0x11 0 4M"]),
    ("b.qcow2", "qcow2", 16 * M, "", None, ["write -P 0x22 0 16M"]),
    ("t.qcow2", "qcow2", 4 * M, "", Q("a.qcow2"), ["write -P 0x61 1M 1M"])],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
case("raw new backing file", [
    ("a.qcow2", "qcow2", 8 * M, "", None, a_data), ("b.raw", "raw", 8 * M, "", None, b_data),
    ("t.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), t_data)], ["-b", "b.raw", "-F", "raw", "t.qcow2"])
case("raw old backing file", [
    ("a.raw", "raw", 8 * M, "", None, a_data), ("b.qcow2", "qcow2", 8 * M, "", None, b_data),
    ("t.qcow2", "qcow2", 8 * M, "", ("a.raw", "raw"), t_data)], ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
case("compat=0.10 overlay", [
    ("a.qcow2", "qcow2", 8 * M, "compat=0.10", None, a_data), ("b.qcow2", "qcow2", 8 * M, "", None, b_data),
    ("t.qcow2", "qcow2", 8 * M, "compat=0.10", Q("a.qcow2"), t_data)], ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
# An image without a backing file given one: wherever the new backing
# file has data and the image holds nothing (no L2 table there at all, or
# an unallocated entry), the image must record zeros (data zeros in v2,
# which has no zero flag: there qemu-img lets the new file show through).
for o in ("cluster_size=4096", "cluster_size=512", "cluster_size=4096,compat=0.10", "extended_l2=on"):
    case("from no backing file onto one (%s)" % o, [
        ("b.qcow2", "qcow2", 8 * M, "", None, ["write -P 0x22 1M 64k", "write -P 0x22 3M 64k", "write -P 0x23 %d 96k" % (7 * M)]),
        ("t.qcow2", "qcow2", 8 * M, o, None, ["write -P 0x71 0 4k", "write -P 0x72 %d 1000" % (3 * M + 4096)])],
        ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"], same_content_as_qemu="compat=0.10" not in o)
case("backing in a subdirectory, name relative to the overlay", [
    ("a.qcow2", "qcow2", 8 * M, "", None, a_data), ("t.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), t_data)],
    ["-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])

# Random chains of 2-5 layers: the top moved onto a deeper layer, onto an
# unrelated image, or made standalone.
for seed in range(int(os.environ.get("QK_RANDOM_CHAINS", "6"))):
    layers = random_chain(100 + seed)
    imgs = [(f, "qcow2", size, opts, Q(layers[i - 1][0]) if i else None, cmds)
            for i, (f, size, opts, cmds) in enumerate(layers)]
    imgs.append(("other.qcow2", "qcow2", 8 * M, "cluster_size=4096", None, ["write -P 0x77 1M 3M"]))
    top = layers[-1][0]
    target = [layers[seed % (len(layers) - 1)][0], "other.qcow2", ""][seed % 3]
    args = ["-b", target] + (["-F", "qcow2"] if target else []) + [top]
    case("random chain %d (%d layers) onto %r" % (seed, len(layers), target), imgs, args, top=top)

# Keeping the guest's view where qemu-img changes it (see rebase.py's doc).
case("safe rebase of an image without a backing file", [
    ("b.qcow2", "qcow2", 8 * M, "", None, b_data), ("t.qcow2", "qcow2", 8 * M, "", None, t_data)],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"], same_content_as_qemu=False)

# Unsafe mode needs neither backing file.
case("-u with the old backing file missing", [
    ("b.qcow2", "qcow2", 8 * M, "", None, b_data), ("t.qcow2", "qcow2", 8 * M, "", Q("gone.qcow2"), [])],
    ["-u", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
case("-u onto a file that does not exist", [
    ("a.qcow2", "qcow2", 8 * M, "", None, a_data), ("t.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), t_data)],
    ["-u", "-b", "gone.qcow2", "-F", "qcow2", "t.qcow2"], readable=False)
case("-u -b ''", three, ["-u", "-b", "", "t.qcow2"])

# Errors: nothing may change.
imgs = [("a.qcow2", "qcow2", 8 * M, "", None, a_data), ("b.qcow2", "qcow2", 8 * M, "", None, b_data),
        ("t.qcow2", "qcow2", 8 * M, "", Q("a.qcow2"), t_data)]
for args in (["t.qcow2"], ["-b", "b.qcow2", "t.qcow2"], ["-b", "x.qcow2", "-F", "qcow2", "t.qcow2"],
             ["-t", "bogus", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"],
             ["-T", "bogus", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"],
             ["-b", "b.qcow2", "-F", "bogus", "t.qcow2"], ["-u", "-b", "b.qcow2", "t.qcow2"],
             ["-b", "b.qcow2", "-F", "qcow2", "nosuch.qcow2"],
             ["-f", "raw", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"]):
    case("error: %s" % " ".join(args), imgs, args)
case("error: old backing file missing (safe)", [
    ("b.qcow2", "qcow2", 8 * M, "", None, b_data), ("t.qcow2", "qcow2", 8 * M, "", Q("gone.qcow2"), [])],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"], readable=False)


# -c (qemu-img 7.2 has no rebase -c): qemu-img rebases a copy without it;
# qcowkit's -c result must read as before the rebase and as qemu-img's, be
# clean, and hold the copied clusters compressed.
def compress_case(name, images, args, top="t.qcow2", ctype=None):
    n = new_case()
    p, q, k = (os.path.join(WORK, "%s%d" % (x, n)) for x in "pqk")
    build(p, images)
    shutil.copytree(p, q)
    shutil.copytree(p, k)
    rc, out, err = run(["qemu-img", "rebase"] + args, q)
    if rc != 0:
        bad(name, "qemu-img rebase failed: %s%s" % (out, err))
    rc, out, err = run([QK, "rebase", "-c"] + args, k)
    if rc != 0:
        bad(name, "qcowkit rebase -c failed: %s%s" % (out, err))
        return
    for ref, what in ((os.path.join(p, top), "before the rebase"), (os.path.join(q, top), "qemu-img's result")):
        rc, out, err = run(["qemu-img", "compare", ref, os.path.join(k, top)])
        if rc != 0:
            bad(name, "reads differently from %s: %s%s" % (what, out, err))
    rc, out, _ = run(["qemu-img", "check", "--output=json", top], k)
    if rc != 0:
        bad(name, "qemu-img check: %s" % out)
    elif json.loads(out).get("compressed-clusters", 0) == 0:
        bad(name, "no compressed cluster in the result")


for o in ("", "cluster_size=4096", "compression_type=zstd", "extended_l2=on"):
    imgs = [("a.qcow2", "qcow2", 8 * M, o, None, a_data), ("b.qcow2", "qcow2", 8 * M, o, None, b_data),
            ("t.qcow2", "qcow2", 8 * M, o, Q("a.qcow2"), t_data)]
    compress_case("-c onto another base (%s)" % (o or "defaults"), imgs, ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
    compress_case("-c standalone (%s)" % (o or "defaults"), imgs, ["-b", "", "t.qcow2"])
compress_case("-c drop the middle layer", three, ["-b", "a.qcow2", "-F", "qcow2", "t.qcow2"])
compress_case("-c, extended L2 overlay, backing with smaller clusters", [
    ("a.qcow2", "qcow2", 8 * M, "cluster_size=4096", None, a_data),
    ("b.qcow2", "qcow2", 8 * M, "cluster_size=512", None, ["write -P 0x22 1000 70000", "write -P 0x23 3M 512"]),
    ("t.qcow2", "qcow2", 8 * M, "extended_l2=on", Q("a.qcow2"),
     ["write -P 0x51 2048 2048", "write -P 0x52 70000 3000", "write -z 6M 4096", "discard 1M 8192"])],
    ["-b", "b.qcow2", "-F", "qcow2", "t.qcow2"])
for args, msg in ((["-c", "-u", "-b", "b.qcow2", "-F", "qcow2", "t.qcow2"], "Compression can't be used with unsafe"),
                  (["-c", "-b", "b.qcow2", "-F", "qcow2", "-f", "raw", "t.qcow2"], "Compression not supported")):
    n = new_case()
    k = os.path.join(WORK, "k%d" % n)
    build(k, imgs)
    before = open(os.path.join(k, "t.qcow2"), "rb").read()
    rc, out, err = run([QK, "rebase"] + args, k)
    if rc != 1 or msg not in err:
        bad("error: rebase %s" % " ".join(args), "exit %d, %r" % (rc, err))
    if open(os.path.join(k, "t.qcow2"), "rb").read() != before:
        bad("error: rebase %s" % " ".join(args), "the image changed")

finish()
