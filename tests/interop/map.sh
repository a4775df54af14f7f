#!/usr/bin/env bash
# map (human and JSON) and check's allocation figures against qemu-img on
# the same images, byte for byte with exit status:
#  - a backing file shorter than the image (qcow2 and raw): past its end
#    the range is told at the depth of the layer above, as qemu-img does;
#  - compressed clusters: JSON lists them; the human table stops there
#    with qemu-img's error and exit status 1;
#  - data, zero writes, discards, extended L2 subclusters, a 3-layer chain;
#  - extended L2 subclusters past the end of a shorter backing file, an
#    empty image and empty ranges (one empty extent in JSON);
#  - check's allocated/fragmented/compressed counts with compressed
#    clusters between plain ones;
#  - a raw file of 1000 bytes: a 1024-byte disk whose tail reads as zeros
#    (info, map, io, convert, resize).
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

same() { # WHAT ARGS...: qemu-img ARGS and ours print the same (each stream) and exit alike
  local what=$1 q k
  shift
  q=$(qemu-img "$@" 2>err.txt; echo "rc=$?"; echo "stderr:"; cat err.txt)
  k=$("$QK" "$@" 2>err.txt; echo "rc=$?"; echo "stderr:"; cat err.txt)
  q=$(echo "$q" | sed 's/^qemu-img:/TOOL:/')
  k=$(echo "$k" | sed 's/^qcowkit:/TOOL:/')
  if [ "$q" != "$k" ]; then
    bad "$what: $*: differs from qemu-img"
    diff <(echo "$q") <(echo "$k")
  fi
}

qemu-img create -q -f qcow2 b2.qcow2 1M
qemu-io -c 'write -P 1 0 512k' b2.qcow2 >/dev/null
qemu-img create -q -f qcow2 -b b2.qcow2 -F qcow2 t2.qcow2 3M
qemu-io -c 'write -P 2 2M 64k' t2.qcow2 >/dev/null
qemu-img create -q -f raw b.raw 1M
qemu-io -f raw -c 'write -P 3 0 4k' b.raw >/dev/null
qemu-img create -q -f qcow2 -b b.raw -F raw t3.qcow2 3M
qemu-img create -q -f qcow2 -b t2.qcow2 -F qcow2 t4.qcow2 4M
qemu-io -c 'write -z 0 64k' -c 'discard 2M 64k' t4.qcow2 >/dev/null

qemu-img create -q -f qcow2 c.qcow2 1M
qemu-io -c 'write -P 1 0 64k' -c 'write -c -P 2 64k 64k' -c 'write -P 3 128k 64k' -c 'write -c -P 4 256k 64k' c.qcow2 >/dev/null

qemu-img create -q -f qcow2 -o extended_l2=on e.qcow2 2M
qemu-io -c 'write -P 5 2k 2k' -c 'write -P 6 70000 3000' -c 'write -z 1M 4k' -c 'discard 128k 8k' e.qcow2 >/dev/null

# Extended L2 over a shorter backing file: past its end, the unallocated
# subclusters of an allocated cluster keep their host offset, as in
# qemu-img (in a 3-layer chain too, the middle layer longer than the base).
qemu-img create -q -f qcow2 -o extended_l2=on -b b2.qcow2 -F qcow2 e2.qcow2 2M
qemu-io -c 'write -P 7 0 4k' -c 'write -P 7 1M 4k' -c 'write -P 7 1600k 2k' e2.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o extended_l2=on -b e2.qcow2 -F qcow2 e3.qcow2 3M
qemu-io -c 'write -P 8 2M 2k' e3.qcow2 >/dev/null
# An empty image, or a range that is empty or past the end: one empty extent.
qemu-img create -q -f qcow2 z.qcow2 0

for img in t2.qcow2 t3.qcow2 t4.qcow2 c.qcow2 e.qcow2 e2.qcow2 e3.qcow2 z.qcow2; do
  same "$img" map "$img"
  same "$img" map --output=json "$img"
  same "$img" map --output=json -s 768k -l 1M "$img"
done
for range in "-s 5M" "-s 1M" "-l 0" "-s 64k -l 0"; do
  # shellcheck disable=SC2086
  same "empty range" map --output=json $range e3.qcow2
  # shellcheck disable=SC2086
  same "empty range" map $range e3.qcow2
done
same "check counts" check --output=json c.qcow2
same "check counts" check c.qcow2

# A raw file whose size is not a multiple of 512: the disk ends on a whole
# sector, the tail reading as zeros, as in QEMU's block layer.
head -c 1000 /dev/urandom > odd.raw
same "odd raw" info --output=json -f raw odd.raw
same "odd raw" map --output=json -f raw odd.raw
cp odd.raw odd2.raw
qemu-io -f raw -c 'read -v 990 34' odd.raw > q.txt
"$QK" io -f raw -c 'read -v 990 34' odd2.raw > k.txt 2>&1
diff <(sed 's/[0-9.]* sec (.*)$//' q.txt) <(sed 's/[0-9.]* sec (.*)$//' k.txt) > /dev/null ||
  { bad "odd raw: reading the partial last sector differs from qemu-io"; cat k.txt; }
same "odd raw" convert -f raw -O raw odd.raw odd.out
cp odd.raw odd2.raw
cp odd.raw odd3.raw
qemu-img resize -q -f raw odd2.raw 1500
"$QK" resize -q -f raw odd3.raw 1500 || bad "odd raw: resize to 1500"
cmp odd2.raw odd3.raw || bad "odd raw: resize to 1500 differs from qemu-img's"
same "odd raw" info --output=json -f raw odd3.raw
exit $fail
