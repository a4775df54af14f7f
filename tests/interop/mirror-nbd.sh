#!/usr/bin/env bash
# Live mirror through `qcowkit serve`: qemu-io writes seeded patterns over
# NBD while a mirror job copies the export to a new qcow2; background mode
# completes without a switch (then source and target must be identical),
# write-blocking mode completes under the running writer and switches the
# export, after which every write is found on the target. Both images must
# pass qemu-img check. Plain and ASan builds.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

ctl() { "$BIN" ctl ctl.sock "$@"; }
job_field() { ctl query-jobs | sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }

# writer URI SEED ROUNDS LOG: 64 KiB writes at random 64 KiB-aligned offsets.
writer() {
  local uri=$1 rounds=$3 log=$4 r i off pat args
  RANDOM=$2
  : > "$log"
  for r in $(seq "$rounds"); do
    args=()
    for i in $(seq 16); do
      off=$(( (RANDOM % 1024) * 65536 ))
      pat=$(( RANDOM % 255 + 1 ))
      args+=(-c "write -P $pat $off 64k")
      echo "$off $pat" >> "$log"
    done
    qemu-io -f raw "${args[@]}" "$uri" > /dev/null || { echo "writer failed"; return 1; }
    [ -e stop.writer ] && break
  done
  return 0
}

# verify URI LOG: the last pattern written at each offset is there.
verify() {
  local uri=$1 log=$2
  tac "$log" | awk '!seen[$1]++' | sort -n > final.txt
  local args=()
  while read -r off pat; do args+=(-c "read -P $pat $off 64k"); done < final.txt
  qemu-io -f raw "${args[@]}" "$uri" > verify.txt || fail "verify read"
  ! grep -q 'Pattern verification failed' verify.txt || fail "a write is missing on the target"
}

wait_ready() {
  local i st
  for i in $(seq 600); do
    st=$(job_field status)
    [ "$st" = ready ] && return 0
    [ "$st" = failed ] && { ctl query-jobs; fail "job failed"; }
    sleep 0.1
  done
  ctl query-jobs
  fail "job never became ready"
}

run_case() { # binary mode
  BIN=$1
  local mode=$2 sock=$PWD/nbd.sock uri
  uri="nbd+unix:///disk?socket=$sock"
  rm -f src.qcow2 dst.qcow2 stop.writer
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-io -f qcow2 -c 'write -P 0x5a 0 8M' -c 'write -P 0x6b 40M 4M' src.qcow2 > /dev/null
  start_serve "$BIN" pid --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  local pid=$SERVE_PID
  writer "$uri" 4242 200 w.log &
  local wpid=$!
  sleep 0.3
  ctl mirror-start export=disk target="$PWD/dst.qcow2" mode="$mode" id=m > /dev/null \
    || fail "$mode: mirror-start"
  if [ "$mode" = background ]; then
    sleep 1
    touch stop.writer
    wait "$wpid" || fail "writer"
    wait_ready
    ctl job-complete id=m wait=true > done.json || fail "job-complete"
    grep -q '"status": "completed"' done.json || { cat done.json; fail "not completed"; }
    stop_serve "$pid"
    qemu-img compare -f qcow2 -F qcow2 src.qcow2 dst.qcow2 || fail "$mode: images differ"
  else
    wait_ready
    kill -0 "$wpid" 2>/dev/null || fail "writer ended before ready (make it longer)"
    ctl job-complete id=m switch=true wait=true > done.json || fail "job-complete"
    grep -q '"switched": true' done.json || { cat done.json; fail "not switched"; }
    sleep 0.5
    touch stop.writer
    wait "$wpid" || fail "writer"
    ctl query-exports | grep -q "dst.qcow2" || fail "export not switched"
    verify "$uri" w.log
    stop_serve "$pid"
  fi
  qemu-img check -q src.qcow2 || fail "$mode: source check"
  qemu-img check -q dst.qcow2 || fail "$mode: target check"
  echo "ok: $mode ($(basename "$(dirname "$(dirname "$BIN")")"))"
}

run_case "$QK_PLAIN" background
run_case "$QK_PLAIN" write-blocking
run_case "$QK_ASAN" write-blocking
echo "all ok"
