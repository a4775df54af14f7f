#!/usr/bin/env bash
# A backup tool's flow end to end over NBD (tests/interop/nbd_backup_tool.py,
# libnbd): `qcowkit serve` exports a VM's image read-write with a
# persistent bitmap; the tool takes a full backup, the guest (qemu-io over
# NBD) writes, the tool takes an increment and the control socket clears
# the bitmap, and so on. Each increment reads only the dirty extents of
# qemu:dirty-bitmap:NAME; restoring the full backup plus the increments
# gives back the image as it was at each backup (compared with a raw copy
# made then), and an increment reads little more than what changed.
# Plain and ASan builds.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || { echo "python3-libnbd missing (scripts/deps.sh installs it)"; exit 1; }
tool="$SRC_DIR/tests/interop/nbd_backup_tool.py"
work=$(mktemp -d "${TEST_DIR:-/tmp}/qk-nbdbk.XXXXXX")
trap 'nbd_cleanup; rm -rf "$work"' EXIT
cd "$work" || exit 1
status=0
bad() { echo "FAIL: $*"; status=1; }

for build in "$QK_PLAIN" "$QK_ASAN"; do
  [ -x "$build" ] || continue
  rm -f vm.qcow2 *.bk *.raw
  qemu-img create -q -f qcow2 vm.qcow2 64M
  qemu-io -c 'write -P 1 0 24M' -c 'write -P 2 40M 1M' vm.qcow2 >/dev/null
  "$build" bitmap --add vm.qcow2 inc
  start_serve "$build" pid --export name=vm,file=vm.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
  u="nbd+unix:///vm?socket=$work/s.sock"
  clear() { "$build" ctl "$work/c.sock" block-dirty-bitmap-clear export=vm name=inc >/dev/null || bad "$build: clear"; }
  # Full backup: the bitmap starts afresh from here.
  clear
  nbdcopy "$u" at0.raw || bad "$build: nbdcopy"
  $PY "$tool" full "$u" inc full.bk >read.txt || bad "$build: full backup"
  guest=(
    "-c|write -P 3 5M 1M|-c|write -z 10M 64k|-c|write -P 4 50M 100k"
    "-c|write -P 5 0 4k|-c|write -P 6 63M 1M"
  )
  n=0
  for g in "${guest[@]}"; do
    IFS='|' read -r -a args <<<"$g"
    qemu-io -f raw "${args[@]}" "$u" >/dev/null || bad "$build: guest writes $n"
    n=$((n + 1))
    changed=$(nbdinfo --map="qemu:dirty-bitmap:inc" "$u" | awk '$3 == 1 {s += $2} END {print s + 0}')
    # The snapshot of the disk this increment must give back.
    nbdcopy "$u" "at$n.raw" || bad "$build: nbdcopy"
    r=$($PY "$tool" incremental "$u" inc "inc$n.bk") || bad "$build: increment $n"
    clear
    [ "$r" -gt 0 ] || bad "$build: increment $n read nothing"
    [ "$r" -le $(( changed * 11 / 10 + 65536 )) ] || bad "$build: increment $n read $r bytes for $changed dirty"
  done
  stop_serve "$SERVE_PID"
  $PY "$tool" restore full.bk r0.raw >/dev/null
  cmp -s r0.raw at0.raw || bad "$build: the full backup does not restore the disk as it was"
  incs=()
  for i in $(seq 1 $n); do
    incs+=("inc$i.bk")
    $PY "$tool" restore full.bk "${incs[@]}" "r$i.raw" >/dev/null
    cmp -s "r$i.raw" "at$i.raw" || bad "$build: full + $i increment(s) do not restore the disk as it was"
  done
  qemu-img check -q vm.qcow2 || bad "$build: the image does not check clean after serving"
  qemu-img info vm.qcow2 | grep -q "name: inc" || bad "$build: the bitmap was not stored"
done
exit $status
