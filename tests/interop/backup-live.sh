#!/usr/bin/env bash
# Push backup of a live export (`backup-start` on the control socket of
# `qcowkit serve`) while qemu-io keeps writing over NBD:
#   - sync=full with a persistent bitmap: the backup equals the image as it
#     was when the job started, byte for byte (qemu-img compare), although
#     the writer overwrote chunks the job had not copied yet (cbw-copies >
#     0); every guest write is on the source; the bitmap then holds the
#     writes made since the start;
#   - sync=incremental over the full backup as backing file, again under the
#     writer: the chain equals the image at the second start, and the
#     increment holds only the chunks the bitmap named;
#   - a cancelled incremental gives the bitmap back what it had (on-success);
#     bitmap-mode=never leaves it as it was after a successful job;
#   - refusals: incremental without a bitmap, an unknown bitmap, incremental
#     with bitmap-mode=never, a bitmap in use by a running backup, the
#     export's own image as the target (of a backup, and of a mirror through
#     a symlink);
#   - a full backup into an NBD export of qemu-nbd, under the writer;
#   - the ASan build runs the full case too.
# Every image passes qemu-img check.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

ctl() { "$BIN" ctl ctl.sock "$@"; }
bm_count() { ctl block-dirty-bitmap-query export=disk | tr -d ' \n' | sed -n 's/.*"count":\([0-9]*\).*/\1/p'; }

wait_done() { # NAME: the job's final state must be completed
  local i st
  for i in $(seq 600); do
    st=$(job_field status)
    case "$st" in
      completed) ctl query-jobs > job.json; return 0 ;;
      failed | cancelled) ctl query-jobs; fail "$1: the job ended '$st'" ;;
    esac
    sleep 0.1
  done
  ctl query-jobs
  fail "$1: the job did not end"
}

wait_running() { job_wait_status running 100 "the job never ran"; }

# A live full backup, then an increment, both under the writer.
chain_case() { # binary
  BIN=$1
  local sock=$PWD/nbd.sock uri build
  build=$(basename "$(dirname "$(dirname "$BIN")")")
  uri="nbd+unix:///disk?socket=$sock"
  rm -f src.qcow2 ref0.qcow2 full.qcow2 inc1.qcow2 ref1.raw stop.writer
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0x5a 0 24M' -c 'write -P 0x6b 40M 8M' -c 'write -z 44M 1M' src.qcow2 > /dev/null
  cp src.qcow2 ref0.qcow2 # nothing writes before the job starts
  start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID
  ctl block-dirty-bitmap-add export=disk name=b persistent=true > /dev/null || fail "bitmap add"

  # Full, at 16 MiB/s for the background copy: about 2 s for the data, so
  # the writer reaches chunks not copied yet.
  ctl backup-start export=disk target="$PWD/full.qcow2" sync=full bitmap=b id=full speed=16M > /dev/null \
    || fail "$build: backup-start full"
  wait_running
  ctl block-dirty-bitmap-remove export=disk name=b > rm.txt 2>&1 && fail "$build: a bitmap in use was removed"
  grep -q "in use" rm.txt || { cat rm.txt; fail "$build: removing a busy bitmap: wrong message"; }
  nbd_writer "$uri" 4242 12 w0.log || fail "$build: writer during the full backup"
  wait_done "$build full"
  ctl job-dismiss id=full > /dev/null || fail "dismiss"
  qemu-img compare -q ref0.qcow2 full.qcow2 || fail "$build: the full backup is not the image at its start"
  local cbw
  cbw=$(sed -n 's/.*"cbw-copies": \([0-9]*\).*/\1/p' job.json)
  [ "${cbw:-0}" -gt 0 ] || { cat job.json; fail "$build: no write reached a chunk before its copy (cbw-copies 0)"; }
  nbd_verify "$uri" w0.log
  # The bitmap now holds what the writer wrote, nothing before the start.
  local count written
  count=$(bm_count)
  written=$(awk '{print $1}' w0.log | sort -u | wc -l)
  [ "$count" -eq $((written * 65536)) ] || fail "$build: bitmap counts $count bytes, the writer wrote $((written * 65536)) distinct"

  # The state the increment must capture: read while nothing writes.
  qemu-img convert -f raw -O raw "$uri" ref1.raw || fail "read the export"
  ctl backup-start export=disk target="$PWD/inc1.qcow2" sync=incremental bitmap=b backing="$PWD/full.qcow2" \
    id=inc speed=4M > /dev/null || fail "$build: backup-start incremental"
  wait_running
  nbd_writer "$uri" 777 6 w1.log || fail "$build: writer during the increment"
  wait_done "$build incremental"
  ctl job-dismiss id=inc > /dev/null || fail "dismiss"
  nbd_verify "$uri" w1.log
  stop_serve "$pid"
  qemu-img check -q src.qcow2 || fail "$build: source check"
  qemu-img check -q full.qcow2 || fail "$build: full backup check"
  qemu-img check -q inc1.qcow2 || fail "$build: increment check"
  qemu-img compare -q -f qcow2 -F raw inc1.qcow2 ref1.raw || fail "$build: full + increment is not the image at the increment's start"
  # The increment holds the bitmap's chunks only.
  local top
  top=$(qemu-img map --output=json inc1.qcow2 | python3 -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["depth"] == 0 and e["data"]))')
  [ "$top" -le "$count" ] || fail "$build: the increment holds $top bytes, the bitmap named $count"
  [ "$top" -gt 0 ] || fail "$build: the increment holds nothing"
  # The bitmap was stored with the image, consistent.
  qemu-img info -U --output=json src.qcow2 | tr -d ' \n' | grep -q '"flags":\["auto"\],"name":"b"' \
    || { qemu-img info src.qcow2; fail "$build: bitmap b not stored consistent"; }
  echo "ok: $build: full (cbw-copies $cbw) and incremental ($top of $count bitmap bytes) under a writer"
}

# Bitmap hand-back and refusals.
bitmap_case() {
  BIN=$1
  local sock=$PWD/nbd.sock uri
  uri="nbd+unix:///disk?socket=$sock"
  rm -f src.qcow2 t*.qcow2
  qemu-img create -q -f qcow2 src.qcow2 64M
  start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID
  ctl block-dirty-bitmap-add export=disk name=b > /dev/null || fail "bitmap add"
  qemu-io -f raw -c 'write -P 1 0 8M' -c 'write -P 2 32M 4M' "$uri" > /dev/null || fail "write"
  local before
  before=$(bm_count)
  [ "$before" -eq $((12 << 20)) ] || fail "bitmap counts $before before the backups"

  ctl backup-start export=disk target="$PWD/t1.qcow2" sync=incremental > e.txt 2>&1 && fail "incremental without a bitmap"
  grep -q "must provide a valid bitmap name for 'incremental' sync mode" e.txt || { cat e.txt; fail "message: no bitmap"; }
  ctl backup-start export=disk target="$PWD/t1.qcow2" sync=incremental bitmap=nope > e.txt 2>&1 && fail "unknown bitmap"
  grep -q "Dirty bitmap 'nope' not found" e.txt || { cat e.txt; fail "message: unknown bitmap"; }
  ctl backup-start export=disk target="$PWD/t1.qcow2" sync=incremental bitmap=b bitmap-mode=never > e.txt 2>&1 \
    && fail "incremental with bitmap-mode=never"
  grep -q "must be 'on-success'" e.txt || { cat e.txt; fail "message: bitmap-mode"; }
  # The export's own image as the target: a second writer of it.
  ctl backup-start export=disk target="$PWD/src.qcow2" sync=full > e.txt 2>&1 && fail "backup onto the source"
  grep -q "is the export's image" e.txt || { cat e.txt; fail "message: backup onto the source"; }
  ln -sf src.qcow2 alias.qcow2
  ctl mirror-start export=disk target="$PWD/alias.qcow2" > e.txt 2>&1 && fail "mirror onto the source"
  grep -q "is the export's image" e.txt || { cat e.txt; fail "message: mirror onto the source"; }
  # An existing target of another size (larger: its tail would show).
  qemu-img create -q -f qcow2 big.qcow2 $(( $(qemu-img info -U --output=json src.qcow2 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])') + 1048576 ))
  for j in backup mirror; do
    ctl $j-start export=disk target="$PWD/big.qcow2" $([ $j = backup ] && echo sync=full) > e.txt 2>&1 &&
      fail "$j onto a larger target"
    grep -q "Source and target image have different sizes" e.txt || { cat e.txt; fail "message: $j onto a larger target"; }
  done
  ctl backup-start export=disk target="$PWD/t1.qcow2" sync=sideways > e.txt 2>&1 && fail "unknown sync"
  grep -q "Parameter 'sync' expects" e.txt || { cat e.txt; fail "message: sync"; }

  # Cancelled: the bitmap gets back what it had, plus what was written meanwhile.
  ctl backup-start export=disk target="$PWD/t2.qcow2" sync=incremental bitmap=b id=c speed=1M > /dev/null \
    || fail "backup-start to cancel"
  wait_running
  [ "$(bm_count)" -eq 0 ] || fail "the bitmap was not handed to the job"
  ctl backup-start export=disk target="$PWD/t3.qcow2" sync=bitmap bitmap=b > e.txt 2>&1 && fail "a second job on the export"
  grep -q "is in use by job" e.txt || { cat e.txt; fail "message: busy export"; }
  qemu-io -f raw -c 'write -P 3 60M 1M' "$uri" > /dev/null || fail "write during the job"
  ctl job-cancel id=c wait=true > /dev/null || fail "cancel"
  [ "$(job_field status)" = cancelled ] || { ctl query-jobs; fail "not cancelled"; }
  ctl job-dismiss id=c > /dev/null
  [ "$(bm_count)" -eq $((13 << 20)) ] || fail "after cancel the bitmap counts $(bm_count), not 13 MiB"

  # bitmap-mode=never: a successful job leaves the bitmap as it was.
  ctl backup-start export=disk target="$PWD/t4.qcow2" sync=bitmap bitmap=b bitmap-mode=never id=n > /dev/null \
    || fail "backup-start never"
  wait_done "never"
  ctl job-dismiss id=n > /dev/null
  [ "$(bm_count)" -eq $((13 << 20)) ] || fail "bitmap-mode=never changed the bitmap ($(bm_count))"
  stop_serve "$pid"
  qemu-img check -q src.qcow2 || fail "source check"
  qemu-img check -q t4.qcow2 || fail "t4 check"
  qemu-img compare -q src.qcow2 t4.qcow2 || fail "sync=bitmap target differs where the bitmap was set"
  echo "ok: bitmap hand-back (cancel, never) and refusals"
}

# A full backup into an NBD export of another server (qemu-nbd), under the writer.
nbd_target_case() {
  BIN=$1
  local sock=$PWD/nbd.sock tsock=$PWD/t.sock uri
  uri="nbd+unix:///disk?socket=$sock"
  rm -f src.qcow2 ref.qcow2 nt.qcow2 stop.writer "$tsock"
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0x3c 0 16M' -c 'write -P 0x4d 32M 16M' src.qcow2 > /dev/null
  cp src.qcow2 ref.qcow2
  qemu-img create -q -f qcow2 nt.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0xee 0 64M' nt.qcow2 > /dev/null # old contents the backup must replace
  qemu-nbd -f qcow2 -k "$tsock" -t nt.qcow2 &
  local npid=$!
  NBD_PIDS+=("$npid")
  local i
  for i in $(seq 100); do [ -S "$tsock" ] && break; sleep 0.05; done
  start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID
  ctl backup-start export=disk target="nbd+unix:///?socket=$tsock" format=raw sync=full id=n speed=16M > /dev/null \
    || fail "backup-start into NBD"
  wait_running
  nbd_writer "$uri" 99 8 wn.log || fail "writer during the NBD backup"
  wait_done "nbd target"
  ctl job-dismiss id=n > /dev/null
  nbd_verify "$uri" wn.log
  stop_serve "$pid"
  kill "$npid"
  wait "$npid" 2>/dev/null
  qemu-img check -q nt.qcow2 || fail "NBD target check"
  qemu-img compare -q ref.qcow2 nt.qcow2 || fail "the backup into NBD is not the image at its start"
  echo "ok: full backup into an NBD export under a writer"
}

chain_case "$QK_PLAIN"
bitmap_case "$QK_PLAIN"
nbd_target_case "$QK_PLAIN"
chain_case "$QK_ASAN"
echo "all ok"
