#!/usr/bin/env bash
# Two hosts: the source daemon runs in one network namespace, the target
# daemon in another, joined by a veth pair. A writer writes seeded patterns
# to the source export while a mirror job copies it to the target over
# nbd://; after the job completes both daemons stop and the target image
# must equal the source (qemu-img compare) and both must pass qemu-img
# check. Background mode with the plain build, write-blocking with the
# ASan build. Skips (77) only where namespaces cannot be created.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

netns_pair qm 10.200.8

in1() { ip netns exec "$ns1" "$@"; }
in2() { ip netns exec "$ns2" "$@"; }
ctl() { in1 "$BIN" ctl "$PWD/ctl.sock" "$@"; }
job_field() { ctl query-jobs | sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }

# writer URI SEED ROUNDS: 64 KiB writes at random 64 KiB-aligned offsets
# until stop.writer appears.
writer() {
  local uri=$1 rounds=$3 r i args
  RANDOM=$2
  for r in $(seq "$rounds"); do
    args=()
    for i in $(seq 16); do
      args+=(-c "write -P $(( RANDOM % 255 + 1 )) $(( (RANDOM % 1024) * 65536 )) 64k")
    done
    in1 qemu-io -f raw "${args[@]}" "$uri" > /dev/null || { echo "writer failed"; return 1; }
    [ -e stop.writer ] && break
  done
  return 0
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
  local mode=$2 sock=$PWD/nbd.sock
  local uri="nbd+unix:///disk?socket=$sock" turi=nbd://10.200.8.2:10809/disk
  rm -f src.qcow2 dst.qcow2 stop.writer
  qemu-img create -q -f qcow2 src.qcow2 64M || fail "create source"
  qemu-img create -q -f qcow2 dst.qcow2 64M || fail "create target"
  qemu-io -f qcow2 -c 'write -P 0x5a 0 8M' -c 'write -P 0x6b 40M 4M' src.qcow2 > /dev/null
  rm -f pid2
  # Daemons start through ip netns exec itself, not in1/in2: $! must be the
  # daemon (ip execs it), or stop_serve would signal a subshell.
  ip netns exec "$ns2" "$BIN" serve --pidfile "$PWD/pid2" --bind 10.200.8.2 --port 10809 \
    --export name=disk,file=dst.qcow2,format=qcow2 &
  local tpid=$!
  NBD_PIDS+=("$tpid")
  local i
  for i in $(seq 400); do [ -s pid2 ] && break; sleep 0.05; done
  [ -s pid2 ] || fail "target daemon did not start"
  # The target host is reachable from the source host only over the veth.
  [ "$(in1 nbdinfo --size "$turi")" = 67108864 ] || fail "target not reachable across namespaces"
  rm -f pid1
  ip netns exec "$ns1" "$BIN" serve --pidfile "$PWD/pid1" --socket "$sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2" &
  local spid=$!
  NBD_PIDS+=("$spid")
  for i in $(seq 400); do [ -s pid1 ] && break; sleep 0.05; done
  [ -s pid1 ] || fail "source daemon did not start"

  writer "$uri" 777 200 &
  local wpid=$!
  sleep 0.3
  ctl mirror-start export=disk target="$turi" format=raw mode="$mode" id=m > start.json ||
    { cat start.json; fail "$mode: mirror-start"; }
  sleep 1
  kill -0 "$wpid" 2>/dev/null || fail "writer ended before the mirror ran (make it longer)"
  touch stop.writer
  wait "$wpid" || fail "writer"
  wait_ready
  ctl job-complete id=m wait=true > done.json || fail "job-complete"
  grep -q '"status": "completed"' done.json || { cat done.json; fail "$mode: not completed"; }
  stop_serve "$spid"
  stop_serve "$tpid"
  qemu-img compare -f qcow2 -F qcow2 src.qcow2 dst.qcow2 || fail "$mode: target differs from source"
  qemu-img check -q src.qcow2 || fail "$mode: source check"
  qemu-img check -q dst.qcow2 || fail "$mode: target check"
  echo "ok: $mode across namespaces ($(basename "$(dirname "$(dirname "$BIN")")"))"
}

run_case "$QK_PLAIN" background
run_case "$QK_ASAN" write-blocking
echo "all ok"
