#!/usr/bin/env bash
# qcowkit backup, judged by qemu-img: a full backup, then increments from a
# persistent dirty bitmap (each a new qcow2 image backed by the previous
# backup) after writes, zero writes and discards through qcowkit and
# qemu-io; every backup in the chain must read exactly as the source did
# when it was taken (qemu-img compare against a raw copy made then), every
# image must check clean, the bitmap must be clear after each backup and
# keep recording afterwards; refusals (no bitmap, a bitmap left in use, a
# failed backup) leave the bitmap as it was. Cluster sizes 64k and 4k, a
# source with a backing file of its own. Plain and ASan builds.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

dirty_bytes() { # IMG NAME: bytes the bitmap marks, as qemu-nbd exports it
  # (nbdinfo starts qemu-nbd on a socket it hands over: no startup race)
  nbdinfo --map="qemu:dirty-bitmap:$2" -- [ qemu-nbd -r -f qcow2 -B "$2" "$1" ] |
    awk '$3 == 1 {s += $2} END {print s + 0}'
}

for build in "$QCOWKIT" ${QCOWKIT_ASAN:+"$QCOWKIT_ASAN"}; do
  for cs in 64k 4k; do
    what="$(basename "$(dirname "$(dirname "$build")")") cluster_size=$cs"
    rm -f base.qcow2 vm.qcow2 b*.qcow2 p*.raw
    qemu-img create -q -f qcow2 base.qcow2 64M
    qemu-io -c 'write -P 9 30M 2M' base.qcow2 >/dev/null
    qemu-img create -q -f qcow2 -o cluster_size=$cs -b base.qcow2 -F qcow2 vm.qcow2
    qemu-io -c 'write -P 1 0 20M' vm.qcow2 >/dev/null
    "$build" bitmap --add vm.qcow2 bk || bad "$what: bitmap --add"
    "$build" backup --bitmap bk vm.qcow2 b0.qcow2 || bad "$what: full backup"
    qemu-img convert -O raw vm.qcow2 p0.raw
    [ "$(dirty_bytes vm.qcow2 bk)" = 0 ] || bad "$what: the bitmap is not clear after the full backup"
    steps=(
      "-c|write -P 2 5M 1M|-c|write -z 10M 64k|-c|discard 15M 2M|-c|write -P 3 40M 100k|-c|write -P 4 31M 4k"
      "-c|write -P 5 0 4k|-c|write -P 6 63M 1M|-c|write -z -u 30M 1M"
      "-c|write -P 7 12345 6789"
    )
    n=0
    for st in "${steps[@]}"; do
      IFS='|' read -r -a args <<<"$st"
      if [ $n = 1 ]; then
        qemu-io "${args[@]}" vm.qcow2 >/dev/null || bad "$what: qemu-io step $n"
      else
        "$build" io "${args[@]}" vm.qcow2 >/dev/null || bad "$what: io step $n"
      fi
      [ "$(dirty_bytes vm.qcow2 bk)" != 0 ] || bad "$what: step $n's writes are not in the bitmap"
      n=$((n + 1))
      "$build" backup --sync=incremental --bitmap bk -B "b$((n - 1)).qcow2" vm.qcow2 "b$n.qcow2" ||
        bad "$what: increment $n"
      qemu-img convert -O raw vm.qcow2 "p$n.raw"
      [ "$(dirty_bytes vm.qcow2 bk)" = 0 ] || bad "$what: the bitmap is not clear after increment $n"
    done
    for i in $(seq 0 $n); do
      qemu-img compare -q -f raw -F qcow2 "p$i.raw" "b$i.qcow2" || bad "$what: backup $i does not read as the source did"
      qemu-img check -q "b$i.qcow2" || bad "$what: backup $i does not check clean"
    done
    qemu-img check -q vm.qcow2 || bad "$what: the source does not check clean"
    # An increment holds only what changed (plus metadata).
    s3=$(stat -c %s b3.qcow2)
    [ "$s3" -lt $((2 << 20)) ] || bad "$what: the last increment is $s3 bytes for a 6789-byte write"
  done

  # Refusals leave the bitmap as it is.
  "$build" io -c 'write 1M 64k' vm.qcow2 >/dev/null
  before=$(dirty_bytes vm.qcow2 bk)
  "$build" backup --sync=incremental vm.qcow2 x.qcow2 2>/dev/null && bad "incremental without a bitmap accepted"
  "$build" backup --sync=incremental --bitmap nope -B b0.qcow2 vm.qcow2 x.qcow2 2>err.txt && bad "a missing bitmap accepted"
  grep -q "Dirty bitmap 'nope' not found" err.txt || { bad "missing bitmap message"; cat err.txt; }
  "$build" backup --bitmap bk vm.qcow2 no/such/dir/x.qcow2 2>/dev/null && bad "a backup into a missing directory succeeded"
  [ "$(dirty_bytes vm.qcow2 bk)" = "$before" ] || bad "a failed backup changed the bitmap"
  cp vm.qcow2 iu.qcow2
  bitmap_flag iu.qcow2 1
  "$build" backup --bitmap bk iu.qcow2 x.qcow2 2>err.txt && bad "a bitmap left in use was used"
  grep -q "inconsistent" err.txt || { bad "in-use bitmap message"; cat err.txt; }
done
exit $fail
