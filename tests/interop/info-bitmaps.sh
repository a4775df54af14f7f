#!/usr/bin/env bash
# `qcowkit info` against `qemu-img info` on images with persistent dirty
# bitmaps, human and JSON, byte for byte apart from the disk size: bitmaps
# made by qemu-img bitmap (enabled and disabled, granularities 512 B to
# 64 MiB, cluster sizes 512 B to 2 MiB, 40 of them, long names), one left
# in use (as after a crash), a chain with --backing-chain, an image
# qcowkit wrote (the bitmaps kept), and one whose autoclear bit another
# writer cleared (no list, and QEMU's warning).
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

qemu-img create -q -f qcow2 two.qcow2 64M
qemu-img bitmap --add -g 128k two.qcow2 b0
qemu-img bitmap --add --disable two.qcow2 b1
qemu-io -c 'write -P 1 0 1M' two.qcow2 >/dev/null
same_info two.qcow2 "enabled and disabled"
$QK info two.qcow2 | grep -q "name: b1" || bad "the bitmap list is missing"

for cs in 512 65536 2M; do
  qemu-img create -q -f qcow2 -o cluster_size=$cs g.qcow2 256M
  for g in 512 4k 64k 1M 64M; do qemu-img bitmap --add -g $g g.qcow2 "g$g"; done
  same_info g.qcow2 "granularities, cluster_size=$cs"
done

qemu-img create -q -f qcow2 many.qcow2 1G
for i in $(seq 40); do qemu-img bitmap --add many.qcow2 "bitmap-$i-$(printf 'x%.0s' $(seq $i))"; done
qemu-img bitmap --add many.qcow2 "$(printf 'n%.0s' $(seq 1000))"
same_info many.qcow2 "41 bitmaps, a 1000-byte name"

# In use: the first bitmap's flags get bit 0.
cp two.qcow2 inuse.qcow2
bitmap_flag inuse.qcow2 1
same_info inuse.qcow2 "a bitmap left in use"
$QK info inuse.qcow2 | grep -q "in-use" || bad "in-use flag not shown"

qemu-img create -q -f qcow2 -b two.qcow2 -F qcow2 top.qcow2
qemu-img bitmap --add top.qcow2 top0
same_info top.qcow2 "backing chain" --backing-chain

# A write through qcowkit keeps the bitmaps (they are maintained).
cp two.qcow2 written.qcow2
$QK io -c 'write 0 64k' written.qcow2 >/dev/null
same_info written.qcow2 "after a qcowkit write"
$QK info written.qcow2 | grep -q "name: b1" || bad "the bitmaps are gone after a qcowkit write"
# A writer that does not maintain them clears the autoclear bit (header
# byte 95, bit 0): both tools then show none...
python3 - written.qcow2 <<'PY'
import sys
f = open(sys.argv[1], "r+b")
f.seek(95)
b = f.read(1)[0]
f.seek(95)
f.write(bytes([b & ~1]))
PY
same_info written.qcow2 "invalidated by another writer"
$QK info written.qcow2 2>/dev/null | grep -q "bitmaps:" && bad "invalidated bitmaps still listed"
# ...and both warn the same way (program names aside; qemu-img ends the
# warning without a new line, qcowkit with one).
if ! diff <($QK info written.qcow2 2>&1 >/dev/null | sed -e 's/qcowkit/PROG/g' -e '$a\') \
          <(qemu-img info written.qcow2 2>&1 >/dev/null | sed -e 's/qemu-img/PROG/g' -e '$a\') >diff.out; then
  bad "the warning about invalidated bitmaps differs"
  cat diff.out
fi
exit $fail
