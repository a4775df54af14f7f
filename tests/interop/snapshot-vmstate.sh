#!/usr/bin/env bash
# Internal snapshots and VM state against QEMU's tools, cluster sizes 4k..2M:
# qemu-img lists our snapshots with the right VM SIZE; snapshots made by
# qemu-img are listed, applied and deleted by qcowkit and ours by qemu-img;
# disk content after a revert equals a raw copy taken at snapshot time, and
# writes after a snapshot leave it unchanged; qemu-img check is clean after
# every create, write, revert and delete. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"
clean() { qemu-img check -q "$1" >/dev/null 2>&1 || { bad "qemu-img check after $2"; qemu-img check "$1" | head; }; }
same() { qemu-img compare -q -f qcow2 -F raw "$1" "$2" || bad "$3: content differs"; }

head -c 3000000 /dev/urandom > state.bin
for cs in 4k 16k 64k 512k 2M; do
  echo "== cluster size $cs"
  img=img-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 32M
  qemu-io -c 'write -P 1 0 3M' -c 'write -P 2 7M 100k' -c 'write -P 3 20M 1M' "$img" >/dev/null
  qemu-img convert -O raw "$img" at-qs1.raw
  qemu-img snapshot -c qs1 "$img"
  qemu-io -c 'write -P 4 1M 1M' -c 'write -z 20M 512k' "$img" >/dev/null
  qemu-img convert -O raw "$img" at-ks1.raw
  $QK snapshot -c ks1 --vmstate state.bin "$img" || bad "create ks1"
  clean "$img" "create"
  qemu-img snapshot -l "$img" | grep -q '^2  *ks1  *2.86 MiB ' || bad "qemu-img lists ks1 with the wrong VM SIZE"
  same_list "$img" "cluster size $cs"
  # Writes after the snapshots must not reach them.
  qemu-io -c 'write -P 5 0 8M' -c 'discard 20M 1M' "$img" >/dev/null
  $QK io -c 'write -P 6 30M 1M' "$img" >/dev/null
  clean "$img" "write"
  $QK snapshot -a qs1 "$img" || bad "apply qs1"
  same "$img" at-qs1.raw "revert to qemu-img's snapshot"
  clean "$img" "revert to qs1"
  $QK snapshot -a ks1 --vmstate-out out.bin "$img" || bad "apply ks1"
  cmp -s out.bin state.bin || bad "VM state read back differs"
  same "$img" at-ks1.raw "revert to our snapshot"
  clean "$img" "revert to ks1"
  qemu-img snapshot -a ks1 "$img" || bad "qemu-img applies ks1"
  same "$img" at-ks1.raw "qemu-img reverting to our snapshot"
  $QK snapshot -d qs1 "$img" || bad "delete qs1"
  clean "$img" "delete qs1"
  qemu-img snapshot -l "$img" | grep -q qs1 && bad "qs1 still listed"
  same "$img" at-ks1.raw "content after deleting another snapshot"
  qemu-img snapshot -d ks1 "$img" || bad "qemu-img deletes ks1"
  clean "$img" "qemu-img deleting ks1"
  $QK snapshot -c again "$img" && $QK snapshot -d again "$img" || bad "create/delete after all deleted"
  clean "$img" "last delete"
  [ -z "$(qemu-img snapshot -l "$img")" ] || bad "snapshots left over"
  rm -f "$img" at-*.raw out.bin
done
exit $fail
