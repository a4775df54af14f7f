#!/usr/bin/env bash
# A live mirror whose target fails: `qcowkit serve` runs with fault
# injection limited to the target's file (QCOWKIT_INJECT ...:file=dst), a
# qemu-io writer keeps writing over NBD, and the mirror job must end
# "failed" with the target's error, never "ready" or "completed". The
# guest's writes keep succeeding and every one of them is on the source;
# the source passes qemu-img check, the target is consistent (check 0 or 3,
# leaks only) and the daemon keeps serving. Cases: EIO once on the Nth
# target write, EIO sticky from the Nth on, ENOSPC with the target's disk
# dead, a failed target flush (completion fails); background and
# write-blocking modes; plain and ASan builds.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

ctl() { "$BIN" ctl ctl.sock "$@"; }
job_field() { ctl query-jobs | sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }

wait_failed() { # what the job must have said
  local i st
  for i in $(seq 300); do
    st=$(job_field status)
    case "$st" in
      failed) ctl query-jobs > job.json; return 0 ;;
      ready | completed | concluded) ctl query-jobs; fail "$1: the job reached '$st' although the target failed" ;;
    esac
    sleep 0.1
  done
  ctl query-jobs
  fail "$1: the job never failed"
}

run_case() { # binary mode rule
  BIN=$1
  local mode=$2 rule=$3 sock=$PWD/nbd.sock uri name="$2 $3"
  uri="nbd+unix:///disk?socket=$sock"
  rm -f src.qcow2 dst.qcow2 stop.writer
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0x5a 0 8M' -c 'write -P 0x6b 40M 4M' src.qcow2 > /dev/null
  QCOWKIT_INJECT="$rule:file=dst.qcow2" start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID
  nbd_writer "$uri" 4242 60 w.log &
  local wpid=$!
  sleep 0.3
  ctl mirror-start export=disk target="$PWD/dst.qcow2" mode="$mode" id=m > /dev/null \
    || fail "$name: mirror-start"
  if [ "${rule%%:*}" = flush ]; then
    # The target is flushed when the job completes: completion must fail.
    local i
    for i in $(seq 300); do [ "$(job_field status)" = ready ] && break; sleep 0.1; done
    touch stop.writer
    wait "$wpid" || fail "$name: the guest's writes failed"
    if ctl job-complete id=m wait=true > done.json 2>&1 && ! grep -q '"error"' done.json; then
      cat done.json; fail "$name: completion succeeded although the target's flush failed"
    fi
  fi
  wait_failed "$name"
  grep -q '"error": ".*dst.qcow2' job.json || { cat job.json; fail "$name: the error does not name the target"; }
  if [ "$mode" = write-blocking ]; then
    # The guest keeps writing after the job failed: those writes too must
    # succeed and land on the source.
    sleep 0.5
  fi
  touch stop.writer
  wait "$wpid" || fail "$name: the guest's writes failed"
  ctl query-exports | grep -q '"file": ".*src.qcow2"' || { ctl query-exports; fail "$name: export switched"; }
  nbd_verify "$uri" w.log
  stop_serve "$pid"
  qemu-img check -q src.qcow2 || fail "$name: source check"
  local st=0
  qemu-img check -q dst.qcow2 > check.txt 2>&1 || st=$?
  [ "$st" -eq 0 ] || [ "$st" -eq 3 ] || { cat check.txt; fail "$name: target check exited $st"; }
  echo "ok: $name ($(basename "$(dirname "$(dirname "$BIN")")")): $(sed -n 's/.*"error": "\(.*\)".*/\1/p' job.json | head -n 1)"
}

run_case "$QK_PLAIN" background "write:nth=40:errno=EIO"
run_case "$QK_PLAIN" background "write:nth=20:errno=EIO:mode=sticky"
run_case "$QK_PLAIN" write-blocking "data:nth=30:errno=ENOSPC:mode=dead"
run_case "$QK_PLAIN" background "flush:nth=12:errno=EIO"
run_case "$QK_ASAN" write-blocking "write:nth=20:errno=EIO:mode=sticky"
echo "all ok"
