#!/usr/bin/env bash
# `qcowkit info` against `qemu-img info` on images with internal snapshots,
# human and JSON, byte for byte apart from the host-dependent disk size:
# snapshots taken by qemu-img and by qcowkit (with VM state: no ICOUNT),
# an entry patched to wide values, a backing chain whose layers both have
# snapshots, and an image whose snapshots were all deleted (no list).
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

head -c 100000 /dev/urandom > state.bin
qemu-img create -q -f qcow2 base.qcow2 16M
qemu-io -c 'write -P 1 0 1M' base.qcow2 >/dev/null
qemu-img snapshot -c base-snap base.qcow2
same_info base.qcow2 "one qemu-img snapshot"

qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
qemu-img snapshot -c q1 top.qcow2
$QK snapshot -c k1 top.qcow2 || bad "create k1"
$QK snapshot -c kvm --vmstate state.bin top.qcow2 || bad "create kvm"
qemu-img snapshot -c q1 top.qcow2
same_info top.qcow2 "mixed snapshots"
same_info top.qcow2 "backing chain" --backing-chain
$QK info top.qcow2 | grep -q '^Snapshot list:$' || bad "no snapshot list shown"

# Wide values (see patch_kvm).
cp top.qcow2 patched.qcow2
patch_kvm patched.qcow2 || bad "patching the table"
same_info patched.qcow2 "patched entry"

# No snapshots left: neither tool shows a list.
cp base.qcow2 none.qcow2
qemu-img snapshot -d base-snap none.qcow2
same_info none.qcow2 "all deleted"
$QK info --output=json none.qcow2 | grep -q '"snapshots"' && bad "empty snapshot list in JSON"
exit $fail
