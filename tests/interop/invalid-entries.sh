#!/usr/bin/env bash
# L2 entries no reader can follow, treated as QEMU treats them: a zero
# flag in a version 2 image, an extended-L2 entry with a subcluster both
# allocated and zero (judged over the whole bitmap, so a request for
# another subcluster of that cluster fails too), allocation bits on an
# unallocated cluster, and a host offset inside a cluster. For each, a
# read, a write into a good subcluster of the bad cluster and a write of
# the whole cluster:
#  - fail with EIO and the same "Marking image as corrupt" line (the same
#    reason, L2 offset and index) as qemu-io's; except the version 2 zero
#    flag under a write of its whole cluster, which QEMU's write path
#    takes as a zero cluster and replaces (the same there too);
#  - leave the image file byte for byte as qemu-io leaves it (the corrupt
#    bit set on version 3, nothing else written);
#  - read-only: the same "Image is corrupt" line as qemu-img's;
#  - the rest of the image still reads back;
#  - check and check -r all say and do what qemu-img's do (the same
#    bytes, but in the clusters qemu-img's leak repair discards);
#  - convert over a bad entry after good ones names its offset.
# A discard or an unmapping zero write over a host offset inside a
# cluster goes on as qemu-io's does: the entry goes, the cluster leaks,
# QEMU's non-fatal line is said once and the image stays unmarked.
# A data cluster whose refcount is already 0: a discard or an unmapping
# zero write drops the entry and goes on, as qemu-io's does (the same
# bytes and status; the line is ours, qemu-io's names an internal call).
# amend -o compat=0.10 looks at zero entries only, as qemu-img's does:
# an unaligned entry elsewhere does not stop it (the same bytes).
# resize grows over an L1 entry at an offset inside a cluster without
# reading that table, as qemu-img does (the image unmarked, the same
# check report); a shrink fails as qemu-img's does.
# And a refcount block at an offset inside a cluster: a write that needs
# a new cluster fails as qemu-io's does (its line, the corrupt bit, the
# same bytes); check reports it as qemu-img's does (line for line);
# check -r leaks refuses and says the image is marked corrupt; check -r
# all rebuilds the structure and leaves the image clean and unmarked.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

# make IMAGE KIND: 1 MiB, clusters 0-3 written with 0x01 by qemu-io, then
# cluster 2's L2 entry damaged as KIND says.
make() {
  rm -f "$1"
  case "$2" in
    v2zero) qemu-img create -q -f qcow2 -o compat=0.10 "$1" 1M ;;
    unaligned) qemu-img create -q -f qcow2 "$1" 1M ;;
    *) qemu-img create -q -f qcow2 -o extended_l2=on "$1" 1M ;;
  esac
  qemu-io -c 'write -P 1 0 256k' "$1" >/dev/null
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, kind = sys.argv[1], sys.argv[2]
f = open(path, "r+b")
h = f.read(104)
l1 = struct.unpack(">Q", h[40:48])[0]
ext = kind not in ("v2zero", "unaligned")
size = 16 if ext else 8
f.seek(l1)
l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
at = l2 + 2 * size
f.seek(at)
e = struct.unpack(">Q", f.read(8))[0]
if kind == "v2zero":
    e |= 1
elif kind == "unaligned":
    e += 0x200
f.seek(at)
f.write(struct.pack(">Q", e))
if kind == "alloczero":        # subcluster 3 allocated and zero
    f.seek(at + 8)
    bm = struct.unpack(">Q", f.read(8))[0]
    f.seek(at + 8)
    f.write(struct.pack(">Q", bm | (1 << 35)))
elif kind == "unallocbits":    # no host cluster, yet subcluster 5 allocated
    f.seek(at)
    f.write(struct.pack(">QQ", 0, 1 << 5))
PY
}
# same_but_free A B: the files are equal but in clusters both count as
# free (refcount 0: qemu-img's leak repair discards what it frees).
same_but_free() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
def refcount(img, c):   # 64 KiB clusters, 16-bit refcounts
    rt = struct.unpack(">Q", img[48:56])[0]
    rb = struct.unpack(">Q", img[rt + 8 * (c >> 15):rt + 8 * (c >> 15) + 8])[0]
    return struct.unpack(">H", img[rb + 2 * (c & 0x7fff):rb + 2 * (c & 0x7fff) + 2])[0] if rb else 0
ok = len(a) == len(b)
for c in range(0, len(a) >> 16 if ok else 0):
    if a[c << 16:(c + 1) << 16] != b[c << 16:(c + 1) << 16] and (refcount(a, c) or refcount(b, c)):
        ok = False
sys.exit(0 if ok else 1)
PY
}
norm() { sed -e 's/^qemu-io:/TOOL:/' -e 's/^qcowkit:/TOOL:/' -e '/bytes at offset/d' -e '/ops\/sec/d'; }

for kind in v2zero alloczero unallocbits unaligned; do
  # 136k-138k is subcluster 4 of cluster 2 on extended L2: a good one.
  for op in "read 136k 2k" "write -P 0xaa 136k 2k" "write -P 0xaa 128k 64k"; do
    make k.qcow2 $kind
    cp k.qcow2 q.qcow2
    ko=$("$QK" io -c "$op" k.qcow2 2>&1; echo "rc=$?")
    qo=$(qemu-io -c "$op" q.qcow2 2>&1; echo "rc=$?")
    if [ "$(echo "$ko" | norm)" != "$(echo "$qo" | norm)" ]; then
      bad "$kind, $op: differs from qemu-io"
      diff <(echo "$qo" | norm) <(echo "$ko" | norm)
    fi
    if [ $kind = v2zero ] && [ "$op" = "write -P 0xaa 128k 64k" ]; then
      # QEMU's write path takes the flag as a zero cluster: replaced whole.
      "$QK" io -c 'read -P 0xaa 128k 64k' k.qcow2 >/dev/null || bad "v2zero: the whole-cluster write was lost"
      qemu-img check -q k.qcow2 || bad "v2zero: not clean after the whole-cluster write"
    else
      echo "$ko" | grep -q "Input/output error" || bad "$kind, $op: did not fail with EIO"
    fi
    cmp -s k.qcow2 q.qcow2 || bad "$kind, $op: the image differs from what qemu-io left"
    if [ $kind != v2zero ]; then
      qemu-img info k.qcow2 | grep -q "corrupt: true" || bad "$kind, $op: not marked corrupt"
    fi
  done
  make k.qcow2 $kind
  ko=$("$QK" io -r -c "read 136k 2k" k.qcow2 2>&1)
  qo=$(qemu-io -r -c "read 136k 2k" k.qcow2 2>&1)
  [ "$(echo "$ko" | norm)" = "$(echo "$qo" | norm)" ] || {
    bad "$kind: read-only differs from qemu-io"
    diff <(echo "$qo" | norm) <(echo "$ko" | norm)
  }
  echo "$ko" | grep -q "^qcow2: Image is corrupt: " || bad "$kind: read-only message"
  "$QK" io -r -c 'read -P 1 0 128k' -c 'read -P 1 192k 64k' k.qcow2 >/dev/null ||
    bad "$kind: the good clusters do not read back"
  qemu-img info k.qcow2 | grep -q "corrupt: true" && bad "$kind: a read-only open marked it corrupt"
  # check and check -r all: qemu-img's report (printed once where nothing
  # could be fixed), exit code and resulting bytes.
  cp k.qcow2 q.qcow2
  for fix in "" "-r all"; do
    ko=$("$QK" check $fix k.qcow2 2>&1; echo "rc=$?")
    qo=$(qemu-img check $fix q.qcow2 2>&1; echo "rc=$?")
    [ "$ko" = "$qo" ] || { bad "$kind: check $fix differs from qemu-img's"; diff <(echo "$qo") <(echo "$ko"); }
    same_but_free k.qcow2 q.qcow2 || bad "$kind: check $fix left other bytes than qemu-img's"
  done
done
# A bad entry after good clusters: the copy fails at that cluster, and
# says so with its offset (458752), as qemu-img's does.
qemu-img create -q -f qcow2 c.qcow2 1M
qemu-io -c 'write -P 1 0 512k' c.qcow2 >/dev/null
python3 - c.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
f.seek(40); l1 = struct.unpack(">Q", f.read(8))[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 7 * 8); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2 + 7 * 8); f.write(struct.pack(">Q", e + 0x200))
PY
ko=$("$QK" convert -O raw c.qcow2 k.raw 2>&1; echo "rc=$?")
qo=$(qemu-img convert -O raw c.qcow2 q.raw 2>&1; echo "rc=$?")
[ "$(echo "$ko" | norm)" = "$(echo "$qo" | sed 's/^qemu-img:/TOOL:/')" ] || {
  bad "convert over a bad entry at cluster 7 differs from qemu-img's"
  diff <(echo "$qo" | sed 's/^qemu-img:/TOOL:/') <(echo "$ko" | norm)
}
# twin_io WHAT WHOSE LINE OP...: the io commands OP on twin copies of
# orig.qcow2 (k.qcow2 ours, q.qcow2 qemu-io's): the same output, status
# and bytes, and LINE (a pattern) said, by both when WHOSE is "both".
# qemu-io's "qcow2_free_clusters failed" names an internal call, and our
# own line stands in for it.
twin_io() {
  local what=$1 whose=$2 line=$3 args=() op
  shift 3
  for op in "$@"; do args+=(-c "$op"); done
  cp orig.qcow2 k.qcow2
  cp orig.qcow2 q.qcow2
  ko=$("$QK" io "${args[@]}" k.qcow2 2>&1; echo "rc=$?")
  qo=$(qemu-io "${args[@]}" q.qcow2 2>&1; echo "rc=$?")
  local drop='^qcow2_free_clusters failed'
  [ "$whose" = both ] || drop="$drop|$line"
  [ "$(echo "$ko" | norm | grep -Ev "$drop")" = "$(echo "$qo" | norm | grep -Ev "$drop")" ] || {
    bad "$what: differs from qemu-io"
    diff <(echo "$qo" | norm) <(echo "$ko" | norm)
  }
  echo "$ko" | grep -q "$line" || bad "$what: '$line' not said"
  cmp -s k.qcow2 q.qcow2 || bad "$what: other bytes than qemu-io's"
  qemu-img info k.qcow2 | grep -q "corrupt: false" || bad "$what: marked corrupt"
}
# hurt IMAGE KIND: one known damage, by the layout the specification
# gives (guest cluster 2 of a fresh image written from offset 0 is host
# cluster 7, at 0x70000):
#   l2     guest cluster 2's L2 entry moved inside its cluster (0x70200)
#   l2ext  the same, extended L2 entries
#   l1     L1 entry 0 moved inside its cluster
#   rc0    host cluster 7's refcount set to 0
#   rb     refcount table entry 0 moved inside its cluster
hurt() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
kind = sys.argv[2]
def q(off, add=None):
    f.seek(off)
    v = struct.unpack(">Q", f.read(8))[0]
    if add is not None:
        f.seek(off)
        f.write(struct.pack(">Q", v + add))
    return v
l1, rt = q(40), q(48)
if kind in ("l2", "l2ext"):
    q((q(l1) & 0x00fffffffffffe00) + 2 * (16 if kind == "l2ext" else 8), 0x200)
elif kind == "l1":
    q(l1, 0x200)
elif kind == "rc0":
    f.seek(q(rt) + 2 * 7)
    f.write(struct.pack(">H", 0))
elif kind == "rb":
    q(rt, 0x200)
PY
}
# fresh [CREATE OPTIONS...]: orig.qcow2, 1 MiB, its first 256 KiB written.
fresh() {
  rm -f orig.qcow2
  qemu-img create -q -f qcow2 "$@" orig.qcow2 1M
  qemu-io -c 'write -P 1 0 256k' orig.qcow2 >/dev/null
}
# Discard and unmapping zero writes over an unaligned entry (standard
# and extended L2): qemu-io's lines, exit status and bytes.
for kind in l2 l2ext; do
  if [ $kind = l2 ]; then fresh; else fresh -o extended_l2=on; fi
  hurt orig.qcow2 $kind
  for op in "discard 128k 64k" "discard 0 1M" "write -z -u 128k 64k" "write -z -u 0 256k"; do
    twin_io "unaligned entry ($kind), $op" both \
      "^qcow2: Image is corrupt: Cannot free unaligned cluster 0x70200; further non-fatal" "$op" "$op"
    case "$op" in
      *" 128k 64k") want=(-c 'read -P 1 0 128k' -c 'read -P 0 128k 64k' -c 'read -P 1 192k 64k') ;;
      *) want=(-c 'read -P 0 0 256k') ;;
    esac
    "$QK" io -r "${want[@]}" k.qcow2 >/dev/null || bad "unaligned entry ($kind), $op: reads back wrong"
  done
done
# A data cluster (guest cluster 2, host cluster 7) with refcount 0.
fresh
hurt orig.qcow2 rc0
for op in "discard 128k 64k" "write -z -u 0 1M"; do
  twin_io "refcount 0 under a live entry, $op" ours "^qcow2: Image is corrupt: Cannot free cluster 0x70000: " "$op"
done
# amend -o compat=0.10 with an unaligned entry beside zero clusters,
# with a backing file (zeros written) and without (zeros unmapped).
qemu-img create -q -f qcow2 base.qcow2 4M
qemu-io -c 'write -P 1 0 1M' base.qcow2 >/dev/null
for backing in yes no; do
  rm -f orig.qcow2
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 orig.qcow2 4M
  qemu-io -c 'write -P 1 0 256k' -c 'write -z 512k 128k' -c 'write -z 2M 64k' -c 'write -z -u 3M 64k' orig.qcow2 >/dev/null
  [ $backing = no ] && qemu-img rebase -u -b '' orig.qcow2
  hurt orig.qcow2 l2
  cp orig.qcow2 k.qcow2
  cp orig.qcow2 q.qcow2
  ko=$("$QK" amend -o compat=0.10 k.qcow2 2>&1; echo "rc=$?")
  qo=$(qemu-img amend -o compat=0.10 q.qcow2 2>&1; echo "rc=$?")
  [ "$ko" = "$qo" ] || bad "amend compat=0.10 over an unaligned entry (backing $backing): '$ko', qemu-img '$qo'"
  cmp -s k.qcow2 q.qcow2 || bad "amend compat=0.10 over an unaligned entry (backing $backing): other bytes than qemu-img's"
done
# resize over an unaligned L1 entry.
fresh
hurt orig.qcow2 l1
for args in "2G" "1100k" "--shrink 512k"; do
  cp orig.qcow2 k.qcow2
  cp orig.qcow2 q.qcow2
  # shellcheck disable=SC2086
  ko=$("$QK" resize k.qcow2 $args 2>&1; echo "rc=$?")
  # shellcheck disable=SC2086
  qo=$(qemu-img resize q.qcow2 $args 2>&1; echo "rc=$?")
  [ "$(echo "$ko" | norm | grep -v '^TOOL:')" = "$(echo "$qo" | sed 's/^qemu-img:/TOOL:/' | grep -v '^TOOL:')" ] ||
    bad "resize $args over an unaligned L1 entry: '$ko', qemu-img '$qo'"
  [ "$(qemu-img check k.qcow2 2>&1; echo $?)" = "$(qemu-img check q.qcow2 2>&1; echo $?)" ] ||
    bad "resize $args over an unaligned L1 entry: check differs from qemu-img's image"
  [ "$(qemu-img info k.qcow2 | grep -E 'corrupt|virtual')" = "$(qemu-img info q.qcow2 | grep -E 'corrupt|virtual')" ] ||
    bad "resize $args over an unaligned L1 entry: size or corrupt bit differ from qemu-img's"
done
# A refcount block at an unaligned offset.
qemu-img create -q -f qcow2 orig.qcow2 1M
hurt orig.qcow2 rb
cp orig.qcow2 k.qcow2
cp orig.qcow2 q.qcow2
ko=$("$QK" io -c 'write -P 1 0 64k' k.qcow2 2>&1; echo "rc=$?")
qo=$(qemu-io -c 'write -P 1 0 64k' q.qcow2 2>&1; echo "rc=$?")
[ "$(echo "$ko" | norm)" = "$(echo "$qo" | norm)" ] || {
  bad "unaligned refcount block: the write differs from qemu-io's"
  diff <(echo "$qo" | norm) <(echo "$ko" | norm)
}
cmp -s k.qcow2 q.qcow2 || bad "unaligned refcount block: the write left other bytes than qemu-io's"
cp orig.qcow2 k.qcow2
# check: qemu-img's report, stream for stream (the refcounts it cannot
# read are internal errors, exit 1).
for mode in "" "--output=json"; do
  # shellcheck disable=SC2086
  "$QK" check $mode k.qcow2 >ko.txt 2>ke.txt
  echo "rc=$?" >>ko.txt
  # shellcheck disable=SC2086
  qemu-img check $mode k.qcow2 >qo.txt 2>qe.txt
  echo "rc=$?" >>qo.txt
  grep -q "Can't get refcount for cluster 0: Input/output error" qe.txt ||
    bad "unaligned refcount block: qemu-img check no longer says it cannot get refcounts"
  if ! diff qo.txt ko.txt || ! diff <(sed 's/^qemu-img:/TOOL:/' qe.txt) <(sed 's/^qcowkit:/TOOL:/' ke.txt); then
    bad "unaligned refcount block: check $mode differs from qemu-img's"
  fi
done
# -r leaks cannot rebuild: it refuses, and says that the damage it met
# marks the image corrupt (the one byte that changes, as with qemu-img).
out=$("$QK" check -r leaks k.qcow2 2>&1) && bad "unaligned refcount block: check -r leaks succeeded"
echo "$out" | grep -qF "repair with -r all (the image is unchanged but marked corrupt)" ||
  { bad "unaligned refcount block: check -r leaks does not say what it changed"; echo "$out"; }
[ "$(cmp -l orig.qcow2 k.qcow2 | awk '{print $1}' | tr '\n' ' ')" = "80 " ] ||
  bad "unaligned refcount block: check -r leaks changed more than the corrupt bit"
"$QK" check -r all k.qcow2 >ko.txt 2>&1 || { bad "unaligned refcount block: check -r all failed"; cat ko.txt; }
qemu-img check k.qcow2 >/dev/null 2>&1 || bad "unaligned refcount block: not clean after check -r all"
qemu-img info k.qcow2 | grep -q "corrupt: false" || bad "unaligned refcount block: marked corrupt after its repair"
qemu-io -c 'write -P 2 0 64k' -c 'read -P 2 0 64k' k.qcow2 >/dev/null 2>&1 ||
  bad "unaligned refcount block: the repaired image takes no write"
exit $fail
