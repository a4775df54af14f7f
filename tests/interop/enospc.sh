#!/usr/bin/env bash
# A real full disk: an image on a small tmpfs (buffered writes) and on a
# loop-mounted ext4 (O_DIRECT). Writes past the free space fail with "No
# space left on device" and exit 1; the image stays consistent (qemu-img
# check 0 or 3) with the data flushed before intact; after a filler file is
# removed, writing and flushing work again. Needs root (mount); skips without.
set -u
[ "$(id -u)" = 0 ] || { echo "not root"; exit 77; }
command -v qemu-img >/dev/null || { echo "no qemu-img"; exit 77; }
Q=${QCOWKIT_ASAN:-$QCOWKIT}
mnt="$TEST_DIR/mnt"
mkdir -p "$mnt"
cleanup() {
  mountpoint -q "$mnt" && umount "$mnt"
  [ -n "${loopimg:-}" ] && rm -f "$loopimg"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# run_case NAME CACHE: the file system is mounted at $mnt with ~24 MiB free.
run_case() {
  local name=$1 cache=$2 img="$mnt/full.qcow2" out st
  "$Q" create -q -f qcow2 "$img" 256M || { fail "$name: create"; return; }
  # A filler to free later; then 8 MiB of data that must survive.
  dd if=/dev/zero of="$mnt/filler" bs=1M count=6 status=none
  "$Q" io -t "$cache" -c 'write -P 0x11 0 8M' -c flush "$img" >/dev/null || { fail "$name: first write"; return; }
  # Far more than is free: each write must fail, none may corrupt.
  out=$("$Q" io -t "$cache" -c 'write -P 0x22 16M 32M' -c 'write -P 0x33 64M 32M' -c flush "$img" 2>&1); st=$?
  echo "$name, disk full: exit $st: $(echo "$out" | grep -i 'fail\|error\|space' | head -3 | tr '\n' ' ')"
  [ "$st" = 1 ] || fail "$name: writes past the free space exited $st"
  echo "$out" | grep -q "No space left on device" || fail "$name: no ENOSPC message"
  qemu-img check -q "$img"; st=$?
  [ "$st" = 0 ] || [ "$st" = 3 ] || fail "$name: qemu-img check exit $st when full"
  qemu-io -f qcow2 -c 'read -P 0x11 0 8M' "$img" | grep -q "Pattern verification failed" && fail "$name: flushed data lost"
  # Space back: work goes on.
  rm -f "$mnt/filler"
  out=$("$Q" io -t "$cache" -c 'write -P 0x44 128M 4M' -c flush "$img" 2>&1); st=$?
  [ "$st" = 0 ] || fail "$name: write after freeing space exited $st: $out"
  qemu-img check -q "$img"; st=$?
  [ "$st" = 0 ] || [ "$st" = 3 ] || fail "$name: qemu-img check exit $st after freeing space"
  out=$(qemu-io -f qcow2 -c 'read -P 0x11 0 8M' -c 'read -P 0x44 128M 4M' "$img")
  echo "$out" | grep -q "Pattern verification failed" && fail "$name: data wrong after freeing space"
  echo "$name: ok so far ($fails failures)"
  rm -f "$img"
}

mount -t tmpfs -o size=24m qkfull "$mnt" || { echo "cannot mount tmpfs"; exit 77; }
run_case "tmpfs, cache=writeback" writeback
umount "$mnt"

if command -v mkfs.ext4 >/dev/null; then
  loopimg=$(mktemp /var/tmp/qkfull.XXXXXX)
  truncate -s 32M "$loopimg"
  mkfs.ext4 -q -F "$loopimg" && mount -o loop "$loopimg" "$mnt" && {
    run_case "ext4 on loop, cache=none" none
    umount "$mnt"
  }
fi
echo "$fails failures"
[ "$fails" = 0 ]
