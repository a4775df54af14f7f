#!/usr/bin/env bash
# `qcowkit snapshot -l` against `qemu-img snapshot -l` on the same image,
# byte for byte: snapshots taken by qemu-img and by qcowkit (with and
# without VM state; ICOUNT 0 without, as qemu-img records, blank with, as
# QEMU's savevm records), names used twice, and an entry patched to large
# VM SIZE, VM CLOCK (over 99 hours) and ICOUNT values. Then a name used
# twice, or a name that is another snapshot's id, applied and deleted by
# each tool on copies of one image: same snapshot left, same disk content.
# Also QEMU's own savevm/loadvm (qemu-system-x86_64).
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

head -c 200000 /dev/urandom > state.bin
# A table qemu-img wrote at the very end of the file (no padding after it).
qemu-img create -q -f qcow2 fresh.qcow2 1M
qemu-img snapshot -c q fresh.qcow2
$QK snapshot -c k fresh.qcow2 || bad "create after qemu-img on a fresh image"
same_list fresh.qcow2 "fresh image"
img=l.qcow2
qemu-img create -q -f qcow2 "$img" 64M
qemu-io -c 'write -P 1 0 1M' "$img" >/dev/null
qemu-img snapshot -c q1 "$img"
qemu-io -c 'write -P 2 0 1M' "$img" >/dev/null
$QK snapshot -c k1 "$img" || bad "create k1"
$QK snapshot -c kvm --vmstate state.bin "$img" || bad "create kvm"
qemu-io -c 'write -P 3 0 1M' "$img" >/dev/null
qemu-img snapshot -c q1 "$img" || bad "qemu-img: second q1"
$QK snapshot -c k1 "$img" || bad "second k1"
$QK snapshot -c q1 "$img" || bad "third q1"
$QK snapshot -c 1 "$img" || bad "a snapshot named 1"
same_list "$img" "mixed snapshots"
qemu-img snapshot -l "$img"
# ICOUNT: 0 for snapshots without VM state (qemu-img's and ours), blank with.
qemu-img snapshot -l "$img" | awk 'NR > 2 {print $2, $NF}' > icount.txt
grep -qx 'kvm 00:00:00.000' icount.txt || bad "kvm should have no ICOUNT"
[ "$(grep -c ' 0$' icount.txt)" = 6 ] || { bad "ICOUNT 0 expected on 6 snapshots"; cat icount.txt; }

# Patch entry 3 (kvm) to wide values (see patch_kvm).
cp "$img" patched.qcow2
patch_kvm patched.qcow2 || bad "patching the table"
same_list patched.qcow2 "patched entry"
# (qemu-img's columns run together when a value is wider than its column.)
qemu-img snapshot -l patched.qcow2 | grep -q ' kvm  *5 GiB .*100:02:03\.456123456789012$' ||
  { bad "patched entry not listed as expected"; qemu-img snapshot -l patched.qcow2; }
$QK snapshot -l --output=json patched.qcow2 | python3 -c '
import json, sys
e = [s for s in json.load(sys.stdin) if s["name"] == "kvm"][0]
ok = e["icount"] == 123456789012 and e["vm-clock-sec"] == 360123 and e["vm-clock-nsec"] == 456000000 \
     and e["vm-state-size"] == (5 << 30) + 1
sys.exit(0 if ok else 1)' || bad "JSON listing of the patched entry"

# QEMU itself (scripts/deps.sh installs it): a savevm snapshot lists the
# same in both tools, and QEMU's loadvm takes the state qcowkit saved.
if command -v qemu-system-x86_64 >/dev/null; then
  hmp() { # image commands...
    local img=$1; shift
    { for c in "$@"; do echo "$c"; sleep 2; done; echo quit; } |
      timeout 60 qemu-system-x86_64 -M none -nodefaults -display none -monitor stdio \
        -drive file="$img",if=none,id=d0,format=qcow2 2>&1 | tr -d '\033'
  }
  qemu-img create -q -f qcow2 vm.qcow2 64M
  hmp vm.qcow2 "savevm s1" >/dev/null
  same_list vm.qcow2 "QEMU's savevm snapshot"
  $QK snapshot -a s1 --vmstate-out qemu-state.bin vm.qcow2 || bad "reading QEMU's VM state"
  qemu-img create -q -f qcow2 ours.qcow2 64M
  $QK snapshot -c k1 --vmstate qemu-state.bin ours.qcow2 || bad "saving QEMU's VM state"
  same_list ours.qcow2 "our VM-state snapshot"
  out=$(hmp ours.qcow2 "loadvm k1" "loadvm nope")
  grep -q "Snapshot 'nope' does not exist" <<<"$out" || bad "loadvm check did not run: $out"
  [ "$(grep -ci 'error' <<<"$out")" = 1 ] || bad "QEMU's loadvm of our snapshot: $out"
else
  bad "qemu-system-x86_64 is not installed (scripts/deps.sh installs it)"
fi

# The same operation by each tool on a copy of the image must leave the same.
for op in "-a q1" "-a 1" "-a 3" "-d q1" "-d k1" "-d 1"; do
  cp "$img" by-qemu.qcow2
  cp "$img" by-qk.qcow2
  qemu-img snapshot $op by-qemu.qcow2; qs=$?
  $QK snapshot $op by-qk.qcow2; ks=$?
  [ "$qs" = "$ks" ] || bad "$op: exit $ks, qemu-img $qs"
  diff <($QK snapshot -l by-qk.qcow2) <(qemu-img snapshot -l by-qemu.qcow2) >/dev/null ||
    bad "$op: different snapshots left"
  qemu-img compare -q by-qemu.qcow2 by-qk.qcow2 || bad "$op: different disk content"
  qemu-img check -q by-qk.qcow2 || bad "$op: qemu-img check"
done

# Long names: qemu-img keeps the first 255 bytes (and finds the snapshot
# by them); a name of 70,000 bytes is no error and leaks nothing.
for n in 300 70000; do
  long=$(head -c "$n" /dev/zero | tr '\0' 'n')
  qemu-img create -q -f qcow2 by-qemu.qcow2 1M
  cp by-qemu.qcow2 by-qk.qcow2
  qemu-img snapshot -c "$long" by-qemu.qcow2; qs=$?
  $QK snapshot -c "$long" by-qk.qcow2; ks=$?
  [ "$qs" = "$ks" ] || bad "a $n-byte name: exit $ks, qemu-img $qs"
  qemu-img check -q by-qk.qcow2 || bad "a $n-byte name: qemu-img check"
  [ "$(qemu-img info --output=json by-qk.qcow2 | grep -c '"name": "n\{255\}"')" = 1 ] ||
    bad "a $n-byte name: not kept as its first 255 bytes"
  $QK snapshot -a "${long:0:255}" by-qk.qcow2 || bad "a $n-byte name: not found by its first 255 bytes"
done

# No action: the image is opened (so a missing or unreadable one fails, as
# in qemu-img) and nothing else happens.
for img in missing.qcow2 by-qk.qcow2; do
  qemu-img snapshot $img >/dev/null 2>&1; qs=$?
  sum=$(md5sum <by-qk.qcow2)
  $QK snapshot $img >/dev/null 2>&1; ks=$?
  [ $qs = $ks ] || bad "snapshot $img without an action: exit $ks, qemu-img $qs"
  [ "$(md5sum <by-qk.qcow2)" = "$sum" ] || bad "snapshot $img without an action changed the image"
done
exit $fail
