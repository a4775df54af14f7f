#!/usr/bin/env bash
# check and check -r leaks|all against qemu-img on twin copies of images
# damaged in one known way, where the report must be qemu-img's line for
# line (stdout, stderr, exit status, JSON) and the repaired images check
# the same:
#  - a leak (refcount raised), an OFLAG_COPIED flag cleared, both at once:
#    -r leaks fixes the flag too once the refcounts are right, as qemu-img
#    does, and reports each mismatch before repairing it;
#  - two in-use clusters with refcount 0, alone and with a leak: every
#    mismatch is named, then the structure is rebuilt (-r all) or refused
#    (-r leaks);
#  - an external data file's cluster without OFLAG_COPIED: its refcount
#    counts as 1, so check reports it and -r all sets the flag;
#  - the corrupt bit set: -r leaks|all repair the image and clear it;
#  - metadata that cannot be read whole: -r all lowers no refcount.
#  - a refcount too low next to a leak, under a snapshot: -r leaks frees
#    the leak and names the OFLAG_COPIED flag it may not fix yet;
#  - a snapshot's L1 table unaligned, too large or past the end of the
#    file: check names it in qemu-img's words; -r all keeps the leaks
#    (what that table references is unknown) and names each once;
#    deleting the snapshot, then -r leaks, frees them;
#  - a zero-flag entry at an offset inside a cluster: -r all makes it a
#    plain zero entry, as qemu-img does (line for line), and says so when
#    a later step refuses;
#  - an L2 table the end of the file cuts short (it starts in the last,
#    partial cluster): its clusters are counted, not freed as leaks;
#    -r all extends the file over it; the data reads back throughout;
#  - reserved bits in an L1 and an L2 entry: named in qemu-img's words;
#  - the active L1 table past the end of the file (far past it, or right
#    at it): check and info report it as qemu-img does; -r and map refuse
#    (qemu-img's repair frees the data);
#  - an active L2 entry naming a snapshot's L1 table: the sharing shows
#    as the refcount too low that it is, and -r all raises it, so a later
#    write copies the cluster instead of writing over the table;
#  - a compressed cluster whose data starts right at the end of the file
#    (the cluster just past it): its refcount 0 is an error that -r all
#    repairs by a rebuild, its refcount 2 one repaired in place, each as
#    qemu-img repairs it (line for line, then check clean), and a
#    refcount width change keeps it;
#  - OFLAG_COPIED on a compressed cluster's entry: named by the entry's
#    host offset, as qemu-img names it.
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

# damage IMAGE KIND: leak (cluster 0's refcount 2), copied (L2 entry 1
# without OFLAG_COPIED), both, zero (refcounts of clusters 6 and 7, which
# hold data, set to 0), zeroleak (zero and leak). Offsets come from the header (qcow2 specification).
damage() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
kind = sys.argv[2]
h = f.read(104)
l1 = struct.unpack(">Q", h[40:48])[0]
rt = struct.unpack(">Q", h[48:56])[0]
f.seek(rt)
rb = struct.unpack(">Q", f.read(8))[0]
if kind in ("leak", "both", "zeroleak"):
    f.seek(rb)
    f.write(struct.pack(">H", 2))
if kind in ("zero", "zeroleak"):
    for c in (6, 7):
        f.seek(rb + 2 * c)
        f.write(struct.pack(">H", 0))
if kind in ("copied", "both"):
    f.seek(l1)
    l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
    f.seek(l2 + 8)
    e = struct.unpack(">Q", f.read(8))[0]
    f.seek(l2 + 8)
    f.write(struct.pack(">Q", e & ~(1 << 63)))
PY
}

# run TOOL ARGS...: what the tool printed (both streams, the tool's name
# neutralised) and its exit status.
run() {
  "$@" >o.txt 2>e.txt
  echo "rc=$?"
  sed -e 's/^qemu-img:/TOOL:/' -e 's/^qcowkit:/TOOL:/' o.txt e.txt
}

same() { # WHAT: q.out and k.out (qemu-img's and ours) are equal
  if ! diff q.out k.out >d.out; then
    bad "$1: differs from qemu-img"
    cat d.out
  fi
}

# twins MODE AFTER: check MODE by both tools on copies of orig.qcow2
# (q.qcow2 qemu-img's, k.qcow2 ours), then AFTER (a command given the
# image) on each; the lot in q.out and k.out.
twins() {
  cp orig.qcow2 q.qcow2
  cp orig.qcow2 k.qcow2
  # shellcheck disable=SC2086
  { run qemu-img check $1 q.qcow2; $2 q.qcow2; } >q.out
  # shellcheck disable=SC2086
  { run "$QK" check $1 k.qcow2 | sed 's/k\.qcow2/q.qcow2/'; $2 k.qcow2; } >k.out
}
recheck() { qemu-img check "$1" 2>&1; }
corrupt_line() { qemu-img info "$1" | grep corrupt; }

for kind in leak copied both zero zeroleak; do
  qemu-img create -q -f qcow2 orig.qcow2 8M
  qemu-io -c 'write -P 0xaa 0 256k' orig.qcow2 >/dev/null
  damage orig.qcow2 $kind
  for mode in "" "--output=json" "-r leaks" "-r all" "-r leaks --output=json" "-r all --output=json"; do
    twins "$mode" recheck
    case "$kind/$mode" in
      zero*/-r\ leaks*)
        # Refused alike (exit 1, image untouched); our message says why.
        grep -q "must be rebuilt" k.out || bad "zero, $mode: no reason given"
        sed -i '/Check failed/d' q.out k.out ;;
    esac
    same "$kind, check $mode"
    qemu-io -r -c 'read -P 0xaa 0 256k' k.qcow2 >r.out 2>&1 || { bad "$kind, $mode: data changed"; cat r.out; }
  done
done

# OFLAG_COPIED on a compressed cluster's entry: named by its host offset
# (without the sector count), line for line as qemu-img names it.
qemu-img create -q -f qcow2 orig.qcow2 8M
qemu-io -c 'write -c -P 0xab 0 64k' -c 'write -c -P 0xac 64k 64k' orig.qcow2 >/dev/null
python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(104)
f.seek(struct.unpack(">Q", h[40:48])[0])
l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 8)
e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2 + 8)
f.write(struct.pack(">Q", e | (1 << 63)))
PY
for mode in "" "--output=json" "-r all"; do
  twins "$mode" recheck
  grep -q 'coffset=0x[0-9a-f]*: copied flag must never be set' k.out || bad "copied compressed, $mode: not named"
  same "copied compressed, check $mode"
done
qemu-io -r -c 'read -P 0xac 64k 64k' k.qcow2 >r.out 2>&1 || { bad "copied compressed: data changed"; cat r.out; }

# The corrupt bit set (with a leak, or alone): check -r opens the image
# all the same, repairs it and clears the bit, as qemu-img does.
for kind in leak none; do
  qemu-img create -q -f qcow2 orig.qcow2 8M
  qemu-io -c 'write -P 0xaa 0 256k' orig.qcow2 >/dev/null
  [ $kind = leak ] && damage orig.qcow2 leak
  printf '\0\0\0\0\0\0\0\2' | dd of=orig.qcow2 bs=1 seek=72 conv=notrunc 2>/dev/null
  for mode in "-r leaks" "-r all"; do
    twins "$mode" corrupt_line
    same "corrupt bit, $kind, check $mode"
    grep -q "corrupt: false" k.out || bad "corrupt bit, $kind, $mode: still set"
  done
done

# Metadata that holds references but cannot be read whole (a snapshot
# table entry claiming a 64 KiB ID, the bitmap directory cut short, a
# snapshot's L1 table placed on the active one): what it references is
# unknown, so -r all must not lower any refcount. qemu-img check of the
# result may find no refcount below its references that it did not find
# before, and every leak stays.
# refs_low IMAGE: qemu-img check's clusters with refcount < references.
refs_low() {
  qemu-img check "$1" 2>&1 | awk '/^ERROR cluster [0-9]+ refcount=[0-9]+ reference=[0-9]+$/ {
      split($4, a, "="); split($5, b, "="); if (a[2] + 0 < b[2] + 0) print $3 }' | sort -u
}
for kind in snap-id bitmap-dir snap-l1; do
  qemu-img create -q -f qcow2 orig.qcow2 4M
  qemu-io -c 'write -P 1 0 1M' orig.qcow2 >/dev/null
  case $kind in
    bitmap-dir)
      qemu-img bitmap --add orig.qcow2 b0
      qemu-img bitmap --add -g 128k orig.qcow2 b1
      qemu-io -c 'write -P 2 0 512k' orig.qcow2 >/dev/null
      truncate -s -1 orig.qcow2 ;;
    *)
      qemu-img snapshot -c s1 orig.qcow2
      qemu-io -c 'write -P 2 0 512k' orig.qcow2 >/dev/null
      qemu-img snapshot -c s2 orig.qcow2
      python3 - orig.qcow2 $kind <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(72)
l1 = struct.unpack(">Q", h[40:48])[0]
off = struct.unpack(">Q", h[64:72])[0]
if sys.argv[2] == "snap-id":
    f.seek(off + 12)
    f.write(b"\xff\xff")
else:
    f.seek(off)
    f.write(struct.pack(">Q", l1))
PY
      ;;
  esac
  cp orig.qcow2 k.qcow2
  low_before=$(refs_low orig.qcow2)
  "$QK" check -r all k.qcow2 >rep.txt 2>&1
  grep -q -e "Sanitizer" -e "runtime error" rep.txt && { bad "$kind: sanitizer report"; cat rep.txt; }
  low_after=$(refs_low k.qcow2)
  new_low=$(comm -13 <(echo "$low_before") <(echo "$low_after"))
  if [ -n "$new_low" ]; then
    bad "$kind: -r all lowered refcounts below their references (clusters $new_low)"
    cat rep.txt
  fi
  qemu-img check k.qcow2 >/dev/null 2>&1
  [ $? -ne 0 ] || [ "$kind" = bitmap-dir ] || bad "$kind: qemu-img finds the repaired image clean (the leaks should stay)"
  qemu-io -c 'read -P 2 0 512k' -c 'read -P 1 512k 512k' k.qcow2 >/dev/null 2>&1 ||
    [ "$kind" = snap-id ] || bad "$kind: guest data changed"
done

# An external data file: its clusters always count as refcount 1.
qemu-img create -q -f qcow2 -o data_file=orig.data orig.qcow2 8M
qemu-io -c 'write -P 0xaa 0 256k' orig.qcow2 >/dev/null
damage orig.qcow2 copied
for mode in "" "-r leaks" "-r all" "-r all --output=json"; do
  for t in q k; do
    cp orig.qcow2 $t.qcow2
    cp orig.data $t.data
    qemu-img amend -q -o data_file=$t.data $t.qcow2 || bad "amend data_file"
  done
  # shellcheck disable=SC2086
  { run qemu-img check $mode q.qcow2; qemu-img check q.qcow2 2>&1; } >q.out
  # shellcheck disable=SC2086
  { run "$QK" check $mode k.qcow2 | sed 's/k\.qcow2/q.qcow2/'; qemu-img check k.qcow2 2>&1; } >k.out
  same "data file, check $mode"
  grep -q "OFLAG_COPIED data cluster" k.out || bad "data file, check $mode: the cleared flag was not reported"
done
# A refcount too low (cluster 4, the data cluster both the snapshot and
# the active L2 share) and a leak (cluster 5): -r leaks fixes the leak
# only, and OFLAG_COPIED of the L1 entry (refcount now 1 where 2 is
# right) is named, not changed.
qemu-img create -q -f qcow2 orig.qcow2 4M
qemu-io -c 'write -P 0xaa 0 128k' orig.qcow2 >/dev/null
qemu-img snapshot -c s orig.qcow2
python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
rt = struct.unpack(">Q", f.read(56)[48:56])[0]
f.seek(rt)
rb = struct.unpack(">Q", f.read(8))[0]
for c, v in ((4, 1), (5, 3)):
    f.seek(rb + 2 * c)
    f.write(struct.pack(">H", v))
PY
for mode in "" "-r leaks" "-r leaks --output=json"; do
  twins "$mode" recheck
  same "refcount too low and a leak, check $mode"
  cmp -s q.qcow2 k.qcow2 || bad "refcount too low and a leak, check $mode: the images differ"
done

# A snapshot's L1 table that cannot be read: unaligned, too large, past
# the end of the file.
for what in "0 0x10200" "8 0x400001" "0 0x1000000"; do
  qemu-img create -q -f qcow2 orig.qcow2 4M
  qemu-io -c 'write -P 1 0 1M' orig.qcow2 >/dev/null
  qemu-img snapshot -c s1 orig.qcow2
  qemu-io -c 'write -P 2 0 64k' orig.qcow2 >/dev/null
  qemu-img snapshot -c s2 orig.qcow2
  python3 - orig.qcow2 $what <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
off = struct.unpack(">Q", f.read(72)[64:72])[0] + int(sys.argv[2])
f.seek(off)
f.write(struct.pack(">Q" if sys.argv[2] == "0" else ">I", int(sys.argv[3], 0)))
PY
  for mode in "" "--output=json"; do
    twins "$mode" true
    same "snapshot L1 ($what), check $mode"
  done
  cp orig.qcow2 k.qcow2
  run "$QK" check -r all k.qcow2 >k.out
  head -1 k.out | grep -qx "rc=2" || bad "snapshot L1 ($what), -r all: $(head -1 k.out), expected rc=2"
  cmp -s orig.qcow2 k.qcow2 || bad "snapshot L1 ($what), -r all: the image changed"
  twice=$(grep "^Leaked cluster" k.out | sort | uniq -d)
  [ -z "$twice" ] || bad "snapshot L1 ($what), -r all: leaks named more than once: $twice"
  grep -q "^ERROR not freeing the 18 leaked clusters" k.out || { bad "snapshot L1 ($what), -r all: no reason given"; cat k.out; }
  # The way out: delete the damaged snapshot, then free the leaks.
  "$QK" snapshot -d s1 k.qcow2 && "$QK" check -r leaks k.qcow2 >/dev/null 2>&1
  qemu-img check k.qcow2 >k.out 2>&1 || { bad "snapshot L1 ($what): not clean after snapshot -d, check -r leaks"; cat k.out; }
  qemu-io -r -c 'read -P 2 0 64k' -c 'read -P 1 64k 960k' k.qcow2 >/dev/null || bad "snapshot L1 ($what): data changed"
done
# A preallocated (zero flag) entry at an offset inside a cluster, the
# data cluster after it live (its refcount must not be raised).
qemu-img create -q -f qcow2 orig.qcow2 1M
qemu-io -c 'write -P 0xaa 0 128k' -c 'write -z 0 64k' orig.qcow2 >/dev/null
python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
f.seek(40); l1 = struct.unpack(">Q", f.read(8))[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2); f.write(struct.pack(">Q", e + 512))
PY
for mode in "" "-r leaks" "-r all" "-r all --output=json"; do
  twins "$mode" recheck
  same "unaligned preallocated entry, check $mode"
  qemu-io -r -c 'read -P 0xaa 64k 64k' k.qcow2 >/dev/null 2>&1 || bad "unaligned preallocated entry, $mode: data changed"
done

# An unaligned preallocated entry beside a snapshot L1 table past the end
# of the file and a table whose refcount is 0: -r all makes the entry a
# zero entry, then refuses the rebuild, and says that entry is all it
# changed (only those bytes differ; the data reads the same).
qemu-img create -q -f qcow2 orig.qcow2 4M
qemu-io -c 'write -P 1 0 1M' orig.qcow2 >/dev/null
qemu-img snapshot -c s1 orig.qcow2
qemu-io -c 'write -P 2 0 128k' -c 'write -z 0 64k' orig.qcow2 >/dev/null
l2=$(python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(104)
l1, rt, sn = (struct.unpack(">Q", h[o:o + 8])[0] for o in (40, 48, 64))
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2); f.write(struct.pack(">Q", e + 512))
f.seek(sn); f.write(struct.pack(">Q", 0x1000000))
f.seek(rt); rb = struct.unpack(">Q", f.read(8))[0]
f.seek(rb + 2 * (l2 >> 16)); f.write(struct.pack(">H", 0))
print(l2)
PY
)
cp orig.qcow2 k.qcow2
out=$("$QK" check -r all k.qcow2 2>&1) && bad "prealloc fix, then a refused rebuild: -r all succeeded"
echo "$out" | grep -qF "not repairing, the image is unchanged but for the preallocated entries repaired above" ||
  { bad "prealloc fix, then a refused rebuild: the message does not say what changed"; echo "$out"; }
changed=$(cmp -l orig.qcow2 k.qcow2 | awk -v lo="$l2" '$1 - 1 < lo || $1 - 1 >= lo + 8' | wc -l)
[ "$changed" = 0 ] || bad "prealloc fix, then a refused rebuild: $changed bytes changed outside the entry"
qemu-io -r -c 'read -P 0 0 64k' -c 'read -P 2 64k 64k' -c 'read -P 1 128k 896k' k.qcow2 >/dev/null ||
  bad "prealloc fix, then a refused rebuild: data changed"

# Reserved bits set in an L2 entry (a data cluster) and in an L1 entry
# (a table far into the disk): named in qemu-img's words; neither tool
# repairs them.
qemu-img create -q -f qcow2 orig.qcow2 1G
qemu-io -c 'write -P 0xaa 0 128k' -c 'write -P 0xbb 600M 64k' orig.qcow2 >/dev/null
python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
f.seek(40); l1 = struct.unpack(">Q", f.read(8))[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 8); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2 + 8); f.write(struct.pack(">Q", e | (1 << 56)))
f.seek(l1 + 8); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l1 + 8); f.write(struct.pack(">Q", e | (1 << 62)))
PY
for mode in "" "--output=json" "-r all"; do
  twins "$mode" recheck
  same "reserved bits in L1 and L2 entries, check $mode"
  grep -q '^ERROR found l2 entry with reserved bits set: ' k.out || bad "reserved bits: the L2 entry is not named"
done

# The active L1 table past the end of the file (a cluster or more past
# it, or right at it): check reads it as zeros and reports what qemu-img
# reports (line for line: at the end, qemu-img counts the cluster past the
# end and reports its refcount); info shows what qemu-img shows; -r
# refuses to open the image and leaves it as it was, where qemu-img's
# repair frees the clusters the lost table referenced, the data with them.
for where in far end; do
  qemu-img create -q -f qcow2 orig.qcow2 64M
  qemu-io -c 'write -P 7 0 64k' orig.qcow2 >/dev/null
  l1=$((0x100000))
  [ $where = end ] && l1=$(stat -c %s orig.qcow2)
  python3 -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(40); f.write(struct.pack(">Q", int(sys.argv[2])))' \
    orig.qcow2 "$l1"
  what="active L1 table past the end of the file ($where)"
  for mode in "" "--output=json"; do
    twins "$mode" true
    same "$what, check $mode"
  done
  grep -q '^rc=2$' k.out || bad "$what: check exit status"
  for mode in "" "--output=json"; do
    # shellcheck disable=SC2086
    diff <(qemu-img info $mode k.qcow2 2>&1) <("$QK" info $mode k.qcow2 2>&1) || bad "$what: info $mode differs from qemu-img's"
  done
  "$QK" map k.qcow2 >/dev/null 2>&1 && bad "$what: map read the lost table as zeros"
  for mode in "-r leaks" "-r all"; do
    # shellcheck disable=SC2086
    out=$("$QK" check $mode k.qcow2 2>&1) && bad "$what: check $mode succeeded"
    echo "$out" | grep -q "L1 table (offset $(printf '%#x' "$l1"), 8 bytes) lies past the end of the file" ||
      { bad "$what: check $mode does not say why"; echo "$out"; }
    cmp -s orig.qcow2 k.qcow2 || bad "$what: check $mode changed the file"
  done
done

# A compressed cluster cut off by the end of the file, its data starting
# right there: qemu-img counts it in the cluster past the file, and its
# repair sets that refcount (a rebuild when it was 0, in place when it was
# wrong but stored).
for rc in 0 2; do
  qemu-img create -q -f qcow2 orig.qcow2 1M
  qemu-io -c 'write -c -P 5 0 64k' orig.qcow2 >/dev/null
  python3 - orig.qcow2 "$rc" <<'PY'
import os, struct, sys
f = open(sys.argv[1], "r+b")
cs = 65536
f.seek(40 + 0)
l1 = struct.unpack(">Q", f.read(8))[0]
f.seek(l1)
l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2)
e = struct.unpack(">Q", f.read(8))[0]
data = e & ((1 << 54) - 1)  # 64 KiB clusters: the host offset's bits
assert e >> 62 == 1 and data % cs == 0, "the compressed cluster does not start a cluster"
f.truncate(data)
f.seek(48)
rt = struct.unpack(">Q", f.read(8))[0]
f.seek(rt)
rb = struct.unpack(">Q", f.read(8))[0]
f.seek(rb + data // cs * 2)
f.write(struct.pack(">H", int(sys.argv[2])))
PY
  what="compressed cluster past the end of the file, refcount $rc"
  for mode in "" "-r leaks" "-r all" "-r all --output=json"; do
    twins "$mode" recheck
    [ "$mode" = "-r leaks" ] && [ "$rc" = 0 ] && sed -i '/Check failed/d' q.out k.out
    same "$what, check $mode"
  done
  qemu-img check k.qcow2 >/dev/null 2>&1 || bad "$what: not clean after -r all"
  # The width change rebuilds the structure from the references: the
  # cluster past the file keeps its count there too.
  "$QK" amend -o refcount_bits=4 k.qcow2 || bad "$what: amend -o refcount_bits=4 failed"
  qemu-img check k.qcow2 >/dev/null 2>&1 || bad "$what: not clean after amend -o refcount_bits=4"
done

# An L2 table in the file's last, partial cluster (its first 512 bytes
# there, refcounts exact). qemu-img reads the rest as zeros.
qemu-img create -q -f qcow2 orig.qcow2 1M
qemu-io -c 'write -P 0x11 0 192k' orig.qcow2 >/dev/null
python3 - orig.qcow2 <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
cs = 65536
l1 = struct.unpack_from(">Q", d, 40)[0]
rb = struct.unpack_from(">Q", d, struct.unpack_from(">Q", d, 48)[0])[0]
old = struct.unpack_from(">Q", d, l1)[0] & 0x00fffffffffffe00
new = len(d)
d += d[old:old + 512]
d[old:old + cs] = bytes(cs)
struct.pack_into(">Q", d, l1, (1 << 63) | new)
struct.pack_into(">H", d, rb + 2 * (old // cs), 0)
struct.pack_into(">H", d, rb + 2 * (new // cs), 1)
open(sys.argv[1], "wb").write(d)
PY
for mode in "" "-r leaks" "-r all"; do
  cp orig.qcow2 k.qcow2
  # shellcheck disable=SC2086
  "$QK" check $mode k.qcow2 >k.out 2>&1
  st=$?
  grep -q "^Leaked cluster" k.out && { bad "cut-short L2 table, check $mode: its clusters taken for leaks"; cat k.out; }
  case "$mode" in
    "-r all") [ $st -eq 0 ] || { bad "cut-short L2 table, -r all: exit $st"; cat k.out; }
              qemu-img check k.qcow2 >/dev/null 2>&1 || bad "cut-short L2 table, -r all: qemu-img check not clean"
              "$QK" io -r -c 'read -P 0x11 0 192k' k.qcow2 >/dev/null || bad "cut-short L2 table, -r all: we cannot read it" ;;
    *) [ $st -eq 2 ] || { bad "cut-short L2 table, check $mode: exit $st, expected 2"; cat k.out; }
       grep -q "L2 table is cut short by the end of the file" k.out || bad "cut-short L2 table, check $mode: not said" ;;
  esac
  qemu-io -c 'write -P 0x99 512k 128k' -c 'read -P 0x11 0 192k' k.qcow2 >/dev/null 2>&1 ||
    bad "cut-short L2 table, check $mode: data lost after a new write"
done
# An active L2 entry (guest cluster 4) naming snapshot s0's L1 table.
qemu-img create -q -f qcow2 orig.qcow2 1M
qemu-io -c 'write -P 0x11 0 128k' orig.qcow2 >/dev/null
qemu-img snapshot -c s0 orig.qcow2
qemu-io -c 'write -P 0x22 256k 64k' orig.qcow2 >/dev/null
python3 - orig.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(104)
l1 = struct.unpack_from(">Q", h, 40)[0]
f.seek(struct.unpack_from(">Q", h, 64)[0]); sl1 = struct.unpack(">Q", f.read(8))[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 32); f.write(struct.pack(">Q", (1 << 63) | sl1))
PY
cp orig.qcow2 k.qcow2
qemu-img check k.qcow2 2>&1 | grep "^ERROR cluster" >q.out
"$QK" check k.qcow2 2>&1 | grep "^ERROR cluster" >k.out
same "snapshot L1 named by an active L2 entry, check (refcount errors)"
"$QK" check -r all k.qcow2 >k.out 2>&1
qemu-img check k.qcow2 >/dev/null 2>&1
st=$?
[ $st -eq 0 ] || [ $st -eq 3 ] || { bad "snapshot L1 named by an active L2 entry: -r all left errors ($st)"; cat k.out; }
qemu-io -c 'write -P 0x55 256k 64k' k.qcow2 >/dev/null 2>&1
qemu-img check k.qcow2 >/dev/null 2>&1
st=$?
[ $st -eq 0 ] || [ $st -eq 3 ] || bad "snapshot L1 named by an active L2 entry: a write after -r all left errors ($st)"
qemu-img info k.qcow2 | grep -q "corrupt: false" || bad "snapshot L1 named by an active L2 entry: marked corrupt after a write"
qemu-io -r -c 'read -P 0x55 256k 64k' k.qcow2 >/dev/null 2>&1 || bad "snapshot L1 named by an active L2 entry: the write does not read back"
exit $fail
