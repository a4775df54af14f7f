#!/usr/bin/env bash
# Persistent dirty bitmaps against QEMU:
#  - `qcowkit bitmap` against `qemu-img bitmap` on twin images, command by
#    command (valid and refused operations, several in one call, merges
#    within and across images, other granularities): same messages (the
#    node name QEMU prints aside), exit status, `info` and a clean check;
#  - bitmaps track writes: the same writes, zero writes and discards
#    through `qcowkit io` and `qemu-io` leave the same dirty ranges, as
#    qemu-nbd exports them (nbdinfo --map=qemu:dirty-bitmap:NAME), over
#    several opens, and after a resize;
#  - a bitmap left in use (after a crash) is kept as it is, refused for
#    use with QEMU's message, removable; a SIGKILL during writes leaves the
#    enabled bitmaps in use and the image clean;
#  - an injected write or flush failure at any point of a session leaves a
#    clean image and the enabled bitmap in use or holding the write;
#  - convert --bitmaps [--skip-broken-bitmaps] against qemu-img's: the same
#    messages, bitmaps and dirty ranges in the new image;
#  - bitmaps this code cannot keep (unknown flags) refuse a read-write open
#    and the image stays as it was;
#  - a bitmap table entry the specification forbids: named by check, kept
#    (unusable) by a read-write open, and freed safely by --remove; one
#    past the end of the file refuses a read-write open (a write could
#    reuse its cluster), and convert copies the disk without it.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

norm() { sed -e 's/^qemu-img:/TOOL:/' -e 's/^qcowkit:/TOOL:/' -e "s/persistent in '[^']*'/persistent in NODE/" \
             -e 's/persistent bitmaps to [^:]*:/persistent bitmaps to NODE:/'; }
run_both() { # WHAT ARGS... (on ours.qcow2 and theirs.qcow2; IMG stands for the image)
  local what=$1 a b
  shift
  a=$("$QK" bitmap "${@//IMG/ours.qcow2}" 2>&1; echo "rc=$?")
  b=$(qemu-img bitmap "${@//IMG/theirs.qcow2}" 2>&1; echo "rc=$?")
  a=$(echo "$a" | sed 's/ours\.qcow2/IMG/g' | norm)
  b=$(echo "$b" | sed 's/theirs\.qcow2/IMG/g' | norm)
  [ "$a" = "$b" ] || { bad "$what: bitmap $* differs"; echo "ours: $a"; echo "qemu: $b"; }
  diff <($QK info ours.qcow2 | mask | grep -v '^image:') <(qemu-img info theirs.qcow2 | mask | grep -v '^image:') \
    >diff.out || { bad "$what: info after bitmap $* differs"; cat diff.out; }
  qemu-img check -q ours.qcow2 || bad "$what: check after bitmap $*"
}
bmap() { # IMG NAME: the bitmap's dirty ranges as qemu-nbd exports them
  # (nbdinfo starts qemu-nbd on a socket it hands over: no startup race)
  nbdinfo --map="qemu:dirty-bitmap:$2" -- [ qemu-nbd -r -f qcow2 -B "$2" "$1" ] 2>&1
}
same_maps() { # WHAT NAMES...: ours.qcow2 and theirs.qcow2 have the same dirty ranges
  local what=$1 n
  shift
  for n in "$@"; do
    diff <(bmap ours.qcow2 "$n") <(bmap theirs.qcow2 "$n") >diff.out || { bad "$what: bitmap $n differs"; cat diff.out; }
  done
}

# --- the command, step by step ---
qemu-img create -q -f qcow2 ours.qcow2 64M
cp ours.qcow2 theirs.qcow2
qemu-img create -q -f qcow2 src.qcow2 64M
qemu-img bitmap --add src.qcow2 s
qemu-io -c 'write 5M 3M' src.qcow2 >/dev/null
qemu-img create -q -f qcow2 small.qcow2 32M
qemu-img bitmap --add small.qcow2 s
qemu-img create -q -f raw plain.raw 16M
run_both "add" --add IMG a
run_both "add twice" --add IMG a
run_both "no op" IMG a
run_both "no name" --add IMG
run_both "empty name" --add IMG ""
run_both "bad granularity" --add -g 100 IMG g
run_both "huge granularity" --add -g 4G IMG g
run_both "small granularity" --add -g 1k IMG g
run_both "granularity without add" -g 1k --remove IMG g
run_both "large granularity" --add -g 2M --disable IMG big
run_both "remove missing" --remove IMG zz
run_both "clear missing" --clear IMG zz
run_both "add and remove" --add --remove IMG n
run_both "disable" --disable IMG a
run_both "enable" --enable IMG a
run_both "-F without -b" -F qcow2 --add IMG f
run_both "-b without merge" --add -b src.qcow2 IMG f2
run_both "merge missing source" --merge zz IMG a
run_both "merge into missing" --merge a IMG newone
run_both "merge within" --merge g IMG big
run_both "merge across images" --merge s -b src.qcow2 -F qcow2 IMG a
run_both "merge other size" --merge s -b small.qcow2 IMG a
run_both "merge missing file" --merge s -b nonexistent.qcow2 IMG a
run_both "long name" --add IMG "$(printf 'x%.0s' $(seq 1024))"
run_both "longest name" --add IMG "$(printf 'y%.0s' $(seq 1023))"
run_both "remove then add" --remove --add IMG g
run_both "clear" --clear IMG a
a=$("$QK" bitmap --add -f raw plain.raw x 2>&1 | norm; echo "rc=${PIPESTATUS[0]}")
b=$(qemu-img bitmap --add -f raw plain.raw x 2>&1 | norm; echo "rc=${PIPESTATUS[0]}")
[ "$a" = "$b" ] || { bad "bitmap on a raw image differs"; echo "$a"; echo "$b"; }
qemu-img create -q -f qcow2 -o compat=0.10 v2.qcow2 16M
a=$("$QK" bitmap --add v2.qcow2 x 2>&1 | norm; echo "rc=${PIPESTATUS[0]}")
b=$(qemu-img bitmap --add v2.qcow2 x 2>&1 | norm; echo "rc=${PIPESTATUS[0]}")
[ "$a" = "$b" ] || { bad "bitmap on a v2 image differs"; echo "$a"; echo "$b"; }

# --- tracking writes ---
for cs in 64k 4k 2M; do
  rm -f ours.qcow2 theirs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs ours.qcow2 64M
  qemu-img bitmap --add ours.qcow2 def
  qemu-img bitmap --add -g 512 ours.qcow2 fine
  qemu-img bitmap --add -g 4M ours.qcow2 coarse
  qemu-img bitmap --add --disable ours.qcow2 off
  qemu-io -c 'write -P 1 0 64k' ours.qcow2 >/dev/null
  cp ours.qcow2 theirs.qcow2
  w1=(-c 'write -P 2 1M 4k' -c 'write -P 3 1000000 70000' -c 'write -z 10M 128k' -c 'discard 20M 1M')
  w2=(-c 'write -z -u 30M 3M' -c 'write -P 4 63M 1M' -c 'write -P 5 12345 1')
  "$QK" io "${w1[@]}" ours.qcow2 >/dev/null || bad "io (cluster $cs)"
  "$QK" io "${w2[@]}" ours.qcow2 >/dev/null || bad "io (cluster $cs)"
  qemu-io "${w1[@]}" theirs.qcow2 >/dev/null
  qemu-io "${w2[@]}" theirs.qcow2 >/dev/null
  qemu-img check -q ours.qcow2 || bad "check after tracked writes (cluster $cs)"
  same_info ours.qcow2 "after tracked writes (cluster $cs)"
  same_maps "tracked writes (cluster $cs)" def fine coarse off
done
bmap ours.qcow2 def | grep -q "1048576 .*dirty" || bad "the tracked write at 1M is not dirty: the comparison saw nothing"
# Resize, then writes in the new area.
"$QK" resize ours.qcow2 96M >/dev/null && qemu-img resize theirs.qcow2 96M >/dev/null || bad "resize"
"$QK" io -c 'write -P 6 80M 64k' ours.qcow2 >/dev/null
qemu-io -c 'write -P 6 80M 64k' theirs.qcow2 >/dev/null
qemu-img check -q ours.qcow2 || bad "check after a resize"
same_maps "after a resize" def fine coarse
# A growth that leaves a bitmap's number of bits as it was (its last bit
# covers the new part), and no other bitmap that changes: the resize marks
# it in use first, and the close must store the directory again, or a
# disabled one stays in use for good ("inconsistent and cannot be used").
# Found by mixed-tools.sh.
for state in --disable --enable; do
  rm -f g1.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=512 g1.qcow2 512k
  qemu-img bitmap --add -g 1M g1.qcow2 wide
  qemu-io -c 'write -P 7 0 4k' g1.qcow2 >/dev/null
  qemu-img bitmap $state g1.qcow2 wide
  "$QK" resize -q g1.qcow2 +2560 || bad "grow within the last bit ($state)"
  flags=$(qemu-img info --output=json g1.qcow2 | python3 -c 'import json,sys; print(sorted((b["name"], tuple(b["flags"])) for b in json.load(sys.stdin)["format-specific"]["data"]["bitmaps"]))')
  want="[('wide', ($( [ $state = --enable ] && echo "'auto',")))]"
  [ "$flags" = "$want" ] || bad "grow within the last bit ($state): flags $flags, want $want"
  qemu-img check -q g1.qcow2 || bad "grow within the last bit ($state): check"
  "$QK" resize -q g1.qcow2 +512 || bad "a second grow within the last bit ($state)"
  [ "$(bmap g1.qcow2 wide | awk '$4 == "dirty" {print $1, $2}')" = "0 527360" ] ||
    { bad "grow within the last bit ($state): the bit is lost"; bmap g1.qcow2 wide; }
done

# --- in use (not saved after a crash) ---
rm -f ours.qcow2 theirs.qcow2
qemu-img create -q -f qcow2 ours.qcow2 16M
qemu-img bitmap --add ours.qcow2 a
qemu-img bitmap --add ours.qcow2 b
bitmap_flag ours.qcow2 1
cp ours.qcow2 theirs.qcow2
"$QK" io -c 'write 0 64k' ours.qcow2 >/dev/null || bad "write next to an in-use bitmap"
qemu-io -c 'write 0 64k' theirs.qcow2 >/dev/null
same_info ours.qcow2 "in use, after a write"
same_maps "next to an in-use bitmap" b
for op in --clear --enable --disable "--merge b"; do
  run_both "in use: $op" $op IMG a
done
run_both "in use: remove" --remove IMG a

# SIGKILL while writing: the enabled bitmap is in use, the image checks clean.
rm -f k.qcow2
qemu-img create -q -f qcow2 k.qcow2 256M
qemu-img bitmap --add k.qcow2 live
qemu-img bitmap --add --disable k.qcow2 frozen
# Each write is flushed: the stream takes seconds, and the kill lands inside it.
( for i in $(seq 0 4000); do echo "write -P 7 $(( (i * 65536) % (256 << 20) )) 64k"; echo flush; done ) > script
"$QK" io k.qcow2 <script >/dev/null 2>&1 &
pid=$!
sleep 0.3
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
qemu-img check -q k.qcow2 >/dev/null 2>&1; rc=$?
[ $rc = 0 ] || [ $rc = 3 ] || bad "check after SIGKILL exited $rc"
qemu-img info k.qcow2 >info.txt
grep -A4 '\[0\]:' info.txt | grep -q 'in-use' || { bad "the live bitmap is not in use after SIGKILL"; cat info.txt; }
grep -A6 '\[1\]:' info.txt | grep -q 'in-use' && { bad "the disabled bitmap became in use"; cat info.txt; }

# --- convert --bitmaps ---
rm -f cs.qcow2
qemu-img create -q -f qcow2 cs.qcow2 16M
qemu-img bitmap --add cs.qcow2 a
qemu-img bitmap --add -g 1M --disable cs.qcow2 b
qemu-io -c 'write 1M 64k' -c 'write 7M 3M' cs.qcow2 >/dev/null
qemu-img bitmap --merge a cs.qcow2 b
cp cs.qcow2 csi.qcow2
bitmap_flag csi.qcow2 1
conv_both() { # WHAT ARGS... (OUT stands for the output image)
  local what=$1 a b
  shift
  rm -f ours.qcow2 theirs.qcow2 ours.raw theirs.raw
  a=$("$QK" convert "${@//OUT/ours}" 2>&1; echo "rc=$?")
  b=$(qemu-img convert "${@//OUT/theirs}" 2>&1; echo "rc=$?")
  a=$(echo "$a" | sed -e 's/ours/OUT/g' -e 's/qcowkit bitmap/TOOL bitmap/' | norm)
  b=$(echo "$b" | sed -e 's/theirs/OUT/g' -e 's/qemu-img bitmap/TOOL bitmap/' | norm)
  [ "$a" = "$b" ] || { bad "convert $what differs"; echo "ours: $a"; echo "qemu: $b"; }
  # qemu-img creates a raw output before it finds raw cannot hold bitmaps
  # (an existing file is emptied); qcowkit refuses before creating it.
  [ "$what" = "--bitmaps to raw" ] && { [ ! -e ours.raw ] || bad "convert $what created the output"; return; }
  [ "$(ls ours.* 2>/dev/null | sed 's/ours//')" = "$(ls theirs.* 2>/dev/null | sed 's/theirs//')" ] ||
    bad "convert $what: one tool left an image, the other not"
}
conv_both "--bitmaps" --bitmaps -O qcow2 cs.qcow2 OUT.qcow2
same_info ours.qcow2 "convert --bitmaps"
diff <($QK info ours.qcow2 | mask | grep -v '^image:') <(qemu-img info theirs.qcow2 | mask | grep -v '^image:') >diff.out ||
  { bad "convert --bitmaps: info differs from qemu-img's result"; cat diff.out; }
same_maps "convert --bitmaps" a b
conv_both "--bitmaps to raw" --bitmaps -O raw cs.qcow2 OUT.raw
conv_both "--bitmaps, one in use" --bitmaps -O qcow2 csi.qcow2 OUT.qcow2
conv_both "--skip-broken-bitmaps" --bitmaps --skip-broken-bitmaps -O qcow2 csi.qcow2 OUT.qcow2
same_maps "convert --skip-broken-bitmaps" b
conv_both "--skip-broken-bitmaps alone" --skip-broken-bitmaps -O qcow2 cs.qcow2 OUT.qcow2
conv_both "--bitmaps, two sources" --bitmaps -O qcow2 cs.qcow2 cs.qcow2 OUT.qcow2
# -n into an image that has a bitmap of that name already: "Failed to
# create bitmap a", as qemu-img says it.
for t in ours theirs; do
  qemu-img create -q -f qcow2 "nb-$t.qcow2" 16M
  qemu-img bitmap --add "nb-$t.qcow2" a
done
a=$("$QK" convert -n --bitmaps -O qcow2 cs.qcow2 nb-ours.qcow2 2>&1; echo "rc=$?")
b=$(qemu-img convert -n --bitmaps -O qcow2 cs.qcow2 nb-theirs.qcow2 2>&1; echo "rc=$?")
[ "$(echo "$a" | norm)" = "$(echo "$b" | norm)" ] ||
  { bad "convert -n --bitmaps onto an existing bitmap differs"; echo "ours: $a"; echo "qemu: $b"; }

# --- a failure anywhere while bitmaps are marked, written or switched ---
# Each host write or flush of a session (one guest write) fails in turn:
# the image checks 0 or 3, and the enabled bitmap is either left in use or
# stored holding the write; the disabled one is never in use.
for n in $(seq 1 14); do
  for rule in "write:nth=$n:errno=EIO" "flush:nth=$n:errno=EIO"; do
    rm -f fi.qcow2
    qemu-img create -q -f qcow2 fi.qcow2 64M
    qemu-img bitmap --add fi.qcow2 a
    qemu-img bitmap --add --disable fi.qcow2 d
    QCOWKIT_INJECT="$rule" "$QK" io -c 'write -P 1 1M 64k' fi.qcow2 >/dev/null 2>&1
    qemu-img check -q fi.qcow2 >/dev/null 2>&1
    rc=$?
    [ $rc = 0 ] || [ $rc = 3 ] || bad "$rule: check exited $rc"
    qemu-img info fi.qcow2 >info.txt
    # Where the write's data reached the image, a stored (not in use) bitmap holds it.
    if ! grep -A3 '\[0\]:' info.txt | grep -q in-use &&
       ! qemu-io -r -c 'read -P 1 1M 64k' fi.qcow2 2>&1 | grep -q 'Pattern verification failed'; then
      bmap fi.qcow2 a | grep -q "^ *1048576 *65536 *1 *dirty" ||
        { bad "$rule: bitmap a is stored (not in use) but does not hold the write"; bmap fi.qcow2 a; }
    fi
    grep -A6 '\[1\]:' info.txt | grep -q in-use && bad "$rule: the disabled bitmap is in use"
  done
done

# --- bitmaps we cannot keep: the read-write open is refused ---
rm -f u.qcow2
qemu-img create -q -f qcow2 u.qcow2 16M
qemu-img bitmap --add u.qcow2 a
bitmap_flag u.qcow2 16
cp u.qcow2 u.before
out=$("$QK" io -c 'write 0 4k' u.qcow2 2>&1) && bad "opened read-write over a bitmap with unknown flags"
echo "$out" | grep -q "unknown flags" || { bad "unknown flags message"; echo "$out"; }
cmp -s u.qcow2 u.before || bad "a refused open changed the image"
"$QK" info u.qcow2 >/dev/null || bad "info (read-only) refused an image with unknown bitmap flags"

# check names what the specification forbids in a directory entry (an
# image qemu-img will not open at all): the type, the granularity, unknown
# flags, a table whose size does not match the image.
qemu-img create -q -f qcow2 bd.qcow2 64M
qemu-img bitmap --add bd.qcow2 bm
qemu-io -c 'write 0 64k' bd.qcow2 >/dev/null
dir=$(python3 - bd.qcow2 <<'PY'
import struct, sys
h = open(sys.argv[1], "rb").read(4096)
p = struct.unpack(">I", h[100:104])[0]
while p + 8 <= len(h):
    t, l = struct.unpack(">II", h[p:p + 8])
    if t == 0:
        break
    if t == 0x23852875:
        print(struct.unpack(">Q", h[p + 24:p + 32])[0])
    p += 8 + ((l + 7) & ~7)
PY
)
for d in "16 \x02 has type 2" "17 \x08 granularity bits 8" "12 \x00\x00\x00\x10 unknown flags 0x10" \
         "8 \x00\x00\x00\x05 table has 5 entries"; do
  read -r off bytes msg <<<"$d"
  cp bd.qcow2 bdd.qcow2
  printf "$bytes" | dd of=bdd.qcow2 bs=1 seek=$((dir + off)) conv=notrunc 2>/dev/null
  out=$("$QK" check bdd.qcow2 2>&1)
  st=$?
  [ $st -eq 2 ] || bad "bitmap entry, $msg: check exit $st, not 2"
  echo "$out" | grep -q "$msg" || { bad "bitmap entry, $msg: not named"; echo "$out"; }
  qemu-img check bdd.qcow2 >/dev/null 2>&1 && bad "bitmap entry, $msg: qemu-img accepts it (the damage is wrong)"
done
"$QK" check bd.qcow2 >/dev/null || bad "bitmap entry: the undamaged image does not check clean"

# A bitmap table entry the specification forbids (reserved bits, an
# offset inside a cluster, the all-ones flag with an offset): qemu-img
# will not open the image. check names it once per bitmap and counts only
# the cluster the entry points into (no second cluster, nothing leaked),
# so -r all changes no refcount for it; a read-write open keeps the
# bitmap as it is, unusable, and the image writable; removing the bitmap
# frees its table and leaks its data clusters (here the one under the
# broken entry), which check -r leaks then frees.
read -r toff entry < <(python3 - bd.qcow2 "$dir" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb").read()
d = int(sys.argv[2])
t = struct.unpack(">Q", f[d:d + 8])[0]
print(t, struct.unpack(">Q", f[t:t + 8])[0])
PY
)
[ "$entry" -gt 0 ] && [ $((entry % 65536)) -eq 0 ] || bad "bitmap table entry: the image has no data cluster ($entry)"
for e in $((entry | 2)) $((entry + 512)) $((entry | 1)) $((entry | (1 << 60))); do
  cp bd.qcow2 bdd.qcow2
  python3 -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(struct.pack(">Q", int(sys.argv[3])))' \
    bdd.qcow2 "$toff" "$e"
  what="bitmap table entry $(printf '%#x' "$e")"
  qemu-img check bdd.qcow2 >/dev/null 2>&1 && bad "$what: qemu-img accepts it (the damage is wrong)"
  out=$("$QK" check bdd.qcow2 2>&1)
  st=$?
  want="ERROR bitmap 0: 1 table entry is invalid (the first, entry 0, is $(printf '0x%x' "$e")); remove the bitmap"
  [ $st -eq 2 ] || bad "$what: check exit $st, not 2"
  [ "$(echo "$out" | grep -c -e '^ERROR' -e '^Leaked')" = 1 ] && echo "$out" | grep -qxF "$want" ||
    { bad "$what: check does not name it alone"; echo "$out"; }
  "$QK" check -r all bdd.qcow2 >/dev/null 2>&1
  [ "$("$QK" check bdd.qcow2 2>&1)" = "$out" ] || { bad "$what: check -r all changed what check finds"; "$QK" check bdd.qcow2; }
  out=$("$QK" io -c 'write -P 0x5a 1M 64k' bdd.qcow2 2>&1) ||
    { bad "$what: a write next to the broken bitmap failed"; echo "$out"; }
  echo "$out" | grep -q "^qcow2: Image is corrupt: Bitmap 'bm' has an invalid table entry" ||
    { bad "$what: the write did not say why the bitmap is kept"; echo "$out"; }
  out=$("$QK" bitmap --enable bdd.qcow2 bm 2>&1) && bad "$what: --enable of the broken bitmap succeeded"
  echo "$out" | grep -q "Bitmap 'bm' is inconsistent and cannot be used" || { bad "$what: --enable message"; echo "$out"; }
  "$QK" bitmap --remove bdd.qcow2 bm 2>/dev/null || bad "$what: --remove of the broken bitmap failed"
  out=$(qemu-img check bdd.qcow2 2>&1)
  st=$?
  [ $st -eq 3 ] && echo "$out" | grep -q '^1 leaked clusters' || { bad "$what: after --remove, check exit $st"; echo "$out"; }
  "$QK" check -q -r leaks bdd.qcow2 2>/dev/null || bad "$what: check -r leaks after --remove"
  qemu-img check -q bdd.qcow2 || bad "$what: not clean after -r leaks"
  qemu-io -c 'read -P 0xcd 0 64k' -c 'read -P 0x5a 1M 64k' bdd.qcow2 >/dev/null || bad "$what: data read back"
done
# An entry past the end of the file: a writer would grow the file over
# that cluster and put data there, which a later removal (the entry then
# good) would free under the data. So a read-write open refuses the image,
# unchanged, as qemu-img does; a read-only one works, and convert copies
# the disk without the bitmap.
cp bd.qcow2 bdd.qcow2
python3 -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(struct.pack(">Q", int(sys.argv[3])))' \
  bdd.qcow2 "$toff" $(( ($(stat -c %s bdd.qcow2) + 65535) / 65536 * 65536 ))
cp bdd.qcow2 bdd.before
out=$("$QK" io -c 'write -P 0x5a 0 4k' bdd.qcow2 2>&1) && bad "bitmap entry past the end: a write was let through"
echo "$out" | grep -q "bitmap 'bm' has a table entry past the end of the file" ||
  { bad "bitmap entry past the end: the refusal does not say why"; echo "$out"; }
"$QK" bitmap --remove bdd.qcow2 bm >/dev/null 2>&1 && bad "bitmap entry past the end: --remove was let through"
cmp -s bdd.qcow2 bdd.before || bad "bitmap entry past the end: a refused open changed the image"
"$QK" info bdd.qcow2 >/dev/null || bad "bitmap entry past the end: info (read-only) refused"
"$QK" convert -O qcow2 bdd.qcow2 bdd.copy.qcow2 || bad "bitmap entry past the end: convert refused"
qemu-img compare -q bd.qcow2 bdd.copy.qcow2 || bad "bitmap entry past the end: the copy differs from the undamaged image"
qemu-img check -q bdd.copy.qcow2 || bad "bitmap entry past the end: the copy does not check clean"

# snapshot -a to a larger snapshot (a deliberate difference: qemu-img
# refuses -a with bitmaps): the enabled bitmap grows with the disk and is
# dirty over all of it, the new part included, which now holds data.
qemu-img create -q -f qcow2 rs.qcow2 32M
qemu-io -c 'write -P 1 0 1M' rs.qcow2 >/dev/null
qemu-img snapshot -c small rs.qcow2
qemu-img resize -q rs.qcow2 64M
qemu-io -c 'write -P 2 40M 1M' rs.qcow2 >/dev/null
qemu-img snapshot -c big rs.qcow2
qemu-img snapshot -a small rs.qcow2
qemu-img bitmap --add rs.qcow2 gb
"$QK" snapshot -a big rs.qcow2 || bad "snapshot -a big with a bitmap"
qemu-img check -q rs.qcow2 || bad "snapshot -a big: check"
m=$(bmap rs.qcow2 gb)
[ "$(echo "$m" | awk '$4 == "dirty" {n += $2} END {print n}')" = 67108864 ] ||
  { bad "snapshot -a big: the bitmap is not dirty over the whole 64 MiB"; echo "$m"; }

# commit empties the overlay; what the overlay reads does not change, so
# its bitmap keeps the ranges it had, as qemu-img commit leaves them (an
# overlay larger than its base: the base grows).
for t in ours theirs; do
  qemu-img create -q -f qcow2 "cb-$t.qcow2" 4M
  qemu-io -c 'write -P 1 0 4M' "cb-$t.qcow2" >/dev/null
  qemu-img create -q -f qcow2 -b "cb-$t.qcow2" -F qcow2 "ct-$t.qcow2" 6M
  qemu-img bitmap --add "ct-$t.qcow2" te
  qemu-io -c 'write -P 2 1M 100k' -c 'write -z 5M 64k' "ct-$t.qcow2" >/dev/null
done
"$QK" commit -q ct-ours.qcow2 || bad "commit of an overlay with a bitmap"
qemu-img commit -q ct-theirs.qcow2
diff <(bmap ct-ours.qcow2 te) <(bmap ct-theirs.qcow2 te) >diff.out || { bad "commit: the overlay's bitmap differs"; cat diff.out; }
qemu-img compare -q ct-ours.qcow2 ct-theirs.qcow2 || bad "commit with a bitmap: the overlays read differently"
qemu-img check -q ct-ours.qcow2 || bad "commit with a bitmap: check"

# An empty disk (size 0) cannot hold a persistent bitmap: its table would
# have no entry, which qemu-img refuses to open ("doesn't satisfy the
# constraints"). Adding one is refused (the file stays as it was), and
# so is applying a snapshot of size 0 to a disk that has one (the disk
# keeps its size and its bitmap, and checks clean).
qemu-img create -q -f qcow2 z0.qcow2 0
cp z0.qcow2 z0.before
out=$("$QK" bitmap --add z0.qcow2 b 2>&1) && bad "bitmap --add on an empty disk succeeded"
echo "$out" | grep -q "the disk is empty (size 0)" || { bad "bitmap --add on an empty disk: message"; echo "$out"; }
cmp -s z0.qcow2 z0.before || bad "bitmap --add on an empty disk changed the image"
qemu-img snapshot -c empty z0.qcow2
qemu-img resize -q z0.qcow2 16M
qemu-img bitmap --add z0.qcow2 b
out=$("$QK" snapshot -a empty z0.qcow2 2>&1) && bad "snapshot -a to an empty disk with a bitmap succeeded"
echo "$out" | grep -q "persistent bitmaps, which cannot describe an empty disk" ||
  { bad "snapshot -a to an empty disk: message"; echo "$out"; }
qemu-img check -q z0.qcow2 || bad "snapshot -a to an empty disk: check"
info=$(qemu-img info --output=json z0.qcow2)
echo "$info" | grep -q '"virtual-size": 16777216' || bad "snapshot -a to an empty disk: the size changed"
echo "$info" | grep -q '"name": "b"' || bad "snapshot -a to an empty disk: the bitmap is gone"
exit $fail
