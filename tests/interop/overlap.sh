#!/usr/bin/env bash
# Writes over the image's own metadata are refused, as qemu-io refuses
# them: an L2 entry made to point at the L1 table, an L2 table,
# the refcount table or a refcount block (a corrupt image). For each:
#  - a write there fails (EIO) with qemu-io's "Marking image as corrupt"
#    line naming the same table, later writes fail too, and the image is
#    marked corrupt (read-write opens refused until check -r);
#  - the table is left as it was, byte for byte;
#  - a discard of that entry fails and drops no refcount of the table;
#  - check -r all repairs the image as qemu-img's does (both then clean,
#    the same guest data everywhere else);
#  - writes to the healthy parts of an image are never refused (a guest
#    filling a fresh image; new L2 tables and refcount blocks on the way).
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

# damaged IMAGE TARGET: 4 MiB of 0x01, then guest cluster 1's L2 entry
# (byte 0x40008: 64 KiB clusters, L2 table at 0x40000, as qemu-img lays
# out a fresh image) pointed at TARGET with OFLAG_COPIED.
damaged() {
  rm -f "$1"
  qemu-img create -q -f qcow2 "$1" 4M
  qemu-io -c 'write -P 1 0 4M' "$1" >/dev/null
  python3 - "$1" "$2" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(56)
l1, rt = struct.unpack(">Q", h[40:48])[0], struct.unpack(">Q", h[48:56])[0]
f.seek(l1)
l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
assert (l1, rt, l2) == (0x30000, 0x10000, 0x40000), (hex(l1), hex(rt), hex(l2))
f.seek(l2 + 8)
f.write(struct.pack(">Q", (1 << 63) | int(sys.argv[2], 0)))
PY
}
norm() { sed -e 's/^qemu-io:/TOOL:/' -e 's/^qcowkit:/TOOL:/' -e '/bytes at offset/d' -e '/ops\/sec/d'; }

for target in 0x10000 0x20000 0x30000 0x40000; do
  damaged k.qcow2 $target
  cp k.qcow2 q.qcow2
  head -c $((0x50000)) k.qcow2 >meta.before
  ko=$("$QK" io -c 'write -P 0xaa 64k 64k' k.qcow2 2>&1; echo "rc=$?")
  qo=$(qemu-io -c 'write -P 0xaa 64k 64k' q.qcow2 2>&1; echo "rc=$?")
  if [ "$(echo "$ko" | norm)" != "$(echo "$qo" | norm)" ]; then
    bad "target $target: the refused write differs from qemu-io's"
    diff <(echo "$qo" | norm) <(echo "$ko" | norm)
  fi
  # Only the header's corrupt bit (byte 79) may differ.
  cmp -l meta.before <(head -c $((0x50000)) k.qcow2) | awk '$1 != 80' | grep -q . &&
    bad "target $target: metadata changed"
  qemu-img info k.qcow2 | grep -q "corrupt: true" || bad "target $target: not marked corrupt"
  o=$("$QK" io -c 'write 2M 4k' k.qcow2 2>&1) && bad "target $target: reopened read-write"
  echo "$o" | grep -q "Image is corrupt" || { bad "target $target: reopen message"; echo "$o"; }
  for t in k q; do
    qemu-img check -r all $t.qcow2 >$t.rep 2>&1
    qemu-img check $t.qcow2 >/dev/null 2>&1 || { bad "target $target: $t image not clean after repair"; cat $t.rep; }
  done
  qemu-img compare k.qcow2 q.qcow2 >/dev/null || bad "target $target: data differs from qemu-io's after repair"
  qemu-io -c 'read -P 1 0 64k' -c 'read -P 1 128k 3968k' k.qcow2 >/dev/null || bad "target $target: data lost"

  # Discarding the entry must not free the table's cluster.
  damaged k.qcow2 $target
  "$QK" io -c 'discard 64k 64k' k.qcow2 >/dev/null 2>&1 && bad "target $target: discard of the entry succeeded"
  qemu-img check k.qcow2 2>&1 | grep -E "^ERROR cluster [0-9]+ refcount=0" && bad "target $target: discard dropped a table's refcount"
done

# Healthy images are never refused: 512-byte clusters, so the guest's
# writes need many L2 tables and refcount blocks, interleaved with data.
qemu-img create -q -f qcow2 -o cluster_size=512 h.qcow2 8M
"$QK" io -c 'write -P 3 0 8M' -c 'discard 1M 1M' -c 'write -z 3M 512k' -c 'write -c -P 4 5M 64k' h.qcow2 >o.txt 2>&1 ||
  { bad "healthy image: writes refused"; cat o.txt; }
qemu-img check h.qcow2 >/dev/null || bad "healthy image: check"
qemu-io -c 'read -P 3 0 1M' -c 'read -P 0 1M 1M' -c 'read -P 3 2M 1M' -c 'read -P 4 5M 64k' h.qcow2 >/dev/null ||
  bad "healthy image: data"
exit $fail
