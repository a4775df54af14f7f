#!/usr/bin/env bash
# Pull backup ("fleecing") of a live export: backup-export-start publishes
# the export as it is at that moment as a read-only NBD export with the
# bitmap, as of the same moment, as its qemu:dirty-bitmap context; a
# backup tool (tests/interop/nbd_backup_tool.py, libnbd) reads it while a
# qemu-io writer keeps overwriting the live export. Checks:
#   - a full backup through the view, then two increments (bitmap extents
#     only), each taken under the writer, restore byte for byte to the disk
#     as it was at each view's start (read while nothing wrote);
#   - the view's bitmap context shows the writes made before its start,
#     never those made while it was read; job-complete leaves the live
#     bitmap with only the writes made since the start;
#   - the temporary image's name is gone as soon as it is open (a killed
#     daemon leaves no file); job-complete and job-cancel remove the view
#     export; job-cancel gives the bitmap back what it had; export-del of
#     a view in use and a view named like an existing export are refused;
#   - every guest write is on the live export; qemu-img check clean.
# Plain and ASan builds.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
PY=/usr/bin/python3
tool="$SRC_DIR/tests/interop/nbd_backup_tool.py"
$PY -c 'import nbd' 2>/dev/null || { echo "FAIL: python3-libnbd is missing (scripts/deps.sh installs it)"; exit 1; }
command -v nbdinfo >/dev/null || { echo "FAIL: nbdinfo is missing"; exit 1; }

ctl() { "$BIN" ctl ctl.sock "$@"; }
bm_count() { ctl block-dirty-bitmap-query export=disk | tr -d ' \n' | sed -n 's/.*"export":"disk","name":"b","granularity":[0-9]*,"count":\([0-9]*\).*/\1/p'; }
wait_ready() { job_wait_status ready 100 "the view's job is not ready"; }
dirty_bytes() { # URI: bytes the bitmap context marks dirty
  nbdinfo --map=qemu:dirty-bitmap:b "$1" | awk '$3 == 1 {s += $2} END {print s + 0}'
}

run() { # binary
  BIN=$1
  local sock=$PWD/nbd.sock build live view
  build=$(basename "$(dirname "$(dirname "$BIN")")")
  live="nbd+unix:///disk?socket=$sock"
  view="nbd+unix:///view?socket=$sock"
  rm -rf src.qcow2 tmp ./*.raw ./*.bk stop.writer
  mkdir tmp
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0x5a 0 20M' -c 'write -P 0x6b 40M 8M' src.qcow2 > /dev/null
  TMPDIR=$PWD/tmp start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID n
  ctl block-dirty-bitmap-add export=disk name=b persistent=true > /dev/null || fail "bitmap add"

  for n in 0 1 2; do
    if [ "$n" -gt 0 ]; then
      qemu-io -f raw -c "write -P $((n + 1)) $((n * 3))M 1M" -c "write -P 9 $((50 + n))M 64k" "$live" > /dev/null \
        || fail "$build: writes before view $n"
    fi
    local before
    before=$(bm_count)
    # The disk as the view must show it: read while nothing writes.
    nbdcopy "$live" "at$n.raw" || fail "$build: nbdcopy"
    ctl backup-export-start export=disk name=view bitmap=b id=v > /dev/null || fail "$build: backup-export-start $n"
    wait_ready
    # The temporary image lives under TMPDIR, its name already removed
    # (held open only: a killed daemon leaves nothing behind).
    ls -l "/proc/$pid/fd" | grep -q "$PWD/tmp/qcowkit-view-.* (deleted)" ||
      fail "$build: no unlinked temporary image under TMPDIR"
    ls tmp/qcowkit-view-* > /dev/null 2>&1 && fail "$build: the temporary image still has a name"
    [ "$(dirty_bytes "$view")" -eq "$before" ] || fail "$build: view $n's bitmap context is not the bitmap at its start"
    nbd_writer "$live" $((100 + n)) 40 "w$n.log" &
    local wpid=$!
    sleep 0.2
    local r
    if [ "$n" -eq 0 ]; then
      r=$($PY "$tool" full "$view" b full.bk) || fail "$build: full backup through the view"
    else
      r=$($PY "$tool" incremental "$view" b "inc$n.bk") || fail "$build: increment $n through the view"
      [ "$r" -le $(( before * 11 / 10 + 65536 )) ] || fail "$build: increment $n read $r bytes for $before dirty"
    fi
    [ "$(dirty_bytes "$view")" -eq "$before" ] || fail "$build: view $n's bitmap context changed while the writer wrote"
    touch stop.writer
    wait "$wpid" || fail "$build: writer $n"
    rm -f stop.writer
    nbd_verify "$live" "w$n.log"
    ctl query-jobs | grep -q '"view-export": "view"' || { ctl query-jobs; fail "$build: query-jobs does not name the view"; }
    ctl job-complete id=v wait=true > /dev/null || fail "$build: job-complete $n"
    [ "$(job_field status)" = completed ] || { ctl query-jobs; fail "$build: view $n's job did not complete"; }
    ctl job-dismiss id=v > /dev/null
    ctl query-exports | grep -q '"name": "view"' && fail "$build: the view export outlived its job"
    ls tmp/qcowkit-view-* > /dev/null 2>&1 && fail "$build: the temporary image outlived its job"
    # Only the writes made while the view existed are left in the bitmap.
    local written
    written=$(awk '{print $1}' "w$n.log" | sort -u | wc -l)
    [ "$(bm_count)" -eq $((written * 65536)) ] || fail "$build: after view $n the bitmap counts $(bm_count), the writer wrote $((written * 65536))"
  done

  # Cancelled: the bitmap gets back what it had, plus what came meanwhile.
  before=$(bm_count)
  ctl backup-export-start export=disk name=disk bitmap=b > e.txt 2>&1 && fail "$build: a view named like its export"
  grep -q "already exists" e.txt || { cat e.txt; fail "$build: message: view name taken"; }
  ctl backup-export-start export=disk name=view bitmap=b id=c > /dev/null || fail "$build: backup-export-start to cancel"
  wait_ready
  ctl export-del name=view > e.txt 2>&1 && fail "$build: export-del of a view in use"
  grep -q "in use by job" e.txt || { cat e.txt; fail "$build: message: export-del of a view"; }
  qemu-io -f raw -c 'write -P 7 62M 1M' "$live" > /dev/null || fail "write"
  ctl job-cancel id=c wait=true > /dev/null || fail "cancel"
  [ "$(job_field status)" = cancelled ] || { ctl query-jobs; fail "$build: not cancelled"; }
  ctl job-dismiss id=c > /dev/null
  ctl query-exports | grep -q '"name": "view"' && fail "$build: the cancelled view export is still there"
  ls tmp/qcowkit-view-* > /dev/null 2>&1 && fail "$build: the cancelled view's temporary image is still there"
  local now
  now=$(bm_count)
  [ "$before" -gt $((1 << 20)) ] || fail "$build: too little in the bitmap before the cancelled view ($before)"
  [ "$now" -ge "$before" ] && [ "$now" -le "$((before + (1 << 20)))" ] \
    || fail "$build: after cancel the bitmap counts $now; before the view it counted $before, then 1 MiB was written"
  stop_serve "$pid"
  qemu-img check -q src.qcow2 || fail "$build: source check"

  $PY "$tool" restore full.bk r0.raw > /dev/null
  cmp -s r0.raw at0.raw || fail "$build: the full backup through the view is not the disk at the view's start"
  $PY "$tool" restore full.bk inc1.bk r1.raw > /dev/null
  cmp -s r1.raw at1.raw || fail "$build: full + increment 1 is not the disk at view 1's start"
  $PY "$tool" restore full.bk inc1.bk inc2.bk r2.raw > /dev/null
  cmp -s r2.raw at2.raw || fail "$build: full + 2 increments are not the disk at view 2's start"
  echo "ok: $build: full and 2 increments pulled under a writer, cancel, refusals"
}

run "$QK_PLAIN"
run "$QK_ASAN"
echo "all ok"
