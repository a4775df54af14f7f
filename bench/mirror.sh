#!/usr/bin/env bash
# Live-mirror benchmark: a writer (fio --ioengine=nbd, randwrite, BS, depth
# DEPTH, DURATION seconds) against an export of a fully allocated qcow2 of
# SIZE while a mirror job copies it; reports writer IOPS idle and during the
# mirror (and their ratio), how long copying the image once took, bytes
# copied per second, time to ready and total time, for background and
# write-blocking modes, two ablations (background passes that chase every
# write instead of waiting for writes to slow; rescan and drain per chunk),
# background mode with the copy at low CPU priority, a plain cp of another
# file of the same size (what any copy costs the writer here), and QEMU's
# blockdev-mirror through qemu-storage-daemon when it is installed.
# Targets on tmpfs (/dev/shm) and on the same disk as the source.
#
# Usage: bench/mirror.sh [tmpfs|disk|both]   env: SIZE=2G DURATION=20 BS=4k DEPTH=32
#        CASES="idle background background-chase background-low write-blocking rescan external
#               qemu-background qemu-write-blocking"
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.bash"
QK=${QCOWKIT:-$top/build/tools/qcowkit}
SIZE=${SIZE:-2G}
DURATION=${DURATION:-20}
BS=${BS:-4k}
DEPTH=${DEPTH:-32}
CASES=${CASES:-"idle background background-chase background-low write-blocking rescan external qemu-background qemu-write-blocking"}
where=${1:-both}
work=$(mktemp -d /var/tmp/qk-mirror-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work" /dev/shm/qk-mirror-bench.*; }
trap cleanup EXIT

src=$work/src.qcow2
sock=$work/nbd.sock
ctl_sock=$work/ctl.sock
uri="nbd+unix:///disk?socket=$sock"

echo "# live mirror: SIZE=$SIZE writer fio nbd randwrite bs=$BS depth=$DEPTH ${DURATION}s; $(nproc) CPUs"
qemu-img create -q -f qcow2 "$src" "$SIZE"
# Fully allocated source, so the mirror has SIZE bytes to copy.
bytes=$(numfmt --from=iec "$SIZE")
for ((off = 0; off < bytes; off += 268435456)); do
  qemu-io -f qcow2 -c "write -P 0x5a $off 256M" "$src" > /dev/null
done
qemu-img map "$src" --output=json | grep -q '"data": true' || { echo "could not fill the source"; exit 1; }

fio_run() { # output-json
  fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs="$BS" --iodepth="$DEPTH" \
    --time_based --runtime="$DURATION" --size="$SIZE" --output-format=json > "$1" 2>/dev/null
}
iops() { # fio may print notes before its JSON
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); print(round(json.loads(t[t.index('{'):])['jobs'][0]['write']['iops']))" "$1"
}


start_qk() {
  drop_caches
  rm -f "$work/pid"
  "$QK" serve --pidfile "$work/pid" --socket "$sock" --control "$ctl_sock" \
    --export "name=disk,file=$src,format=qcow2" &
  pids+=($!)
  SERVE=$!
  for _ in $(seq 200); do [ -s "$work/pid" ] && return; sleep 0.05; done
  echo "serve did not start"; exit 1
}
stop_qk() { kill -TERM "$SERVE"; wait "$SERVE" 2>/dev/null; }
qctl() { "$QK" ctl "$ctl_sock" "$@"; }
field() { python3 -c "import json,sys; j=json.load(sys.stdin)['return']; j=j[0] if isinstance(j,list) else j; print(j.get(sys.argv[1],''))" "$1"; }

seq_bw() { # target-dir: sequential copy bandwidth (idle mirror == sparse-aware parallel copy)
  rm -f "$1/seq.qcow2"
  local t0 t1
  t0=$(date +%s.%N)
  qemu-img convert -f qcow2 -O qcow2 "$src" "$1/seq.qcow2"
  t1=$(date +%s.%N)
  python3 -c "import sys; print(round($(numfmt --from=iec "$SIZE")/($t1-$t0)/1e6))"
  rm -f "$1/seq.qcow2"
}

# Seconds until the job's bytes copied first reach the image size: the
# time to copy the image once, whatever the dirty passes do afterwards.
qk_case() { # target-dir mode rescan [copy-priority] [chase-writes]
  local tdir=$1 mode=$2 rescan=$3 prio=${4:-auto} chase=${5:-false} tgt=$1/dst.qcow2
  rm -f "$tgt"
  start_qk
  fio_run "$work/fio.json" &
  local fpid=$!
  sleep 1
  local t0 ready="" once="" st q
  t0=$(date +%s.%N)
  qctl mirror-start export=disk target="$tgt" mode="$mode" id=m rescan-per-chunk="$rescan" \
    copy-priority="$prio" chase-writes="$chase" > /dev/null
  while kill -0 "$fpid" 2>/dev/null; do
    q=$(qctl query-jobs)
    st=$(echo "$q" | field status)
    if [ -z "$ready" ] && [ "$st" = ready ]; then ready=$(python3 -c "print(round($(date +%s.%N)-$t0,1))"); fi
    if [ -z "$once" ] && [ "$(echo "$q" | field bytes-done)" -ge "$bytes" ]; then
      once=$(python3 -c "print(round($(date +%s.%N)-$t0,1))")
    fi
    sleep 0.25
  done
  wait "$fpid"
  q=$(qctl query-jobs)
  local done_b; done_b=$(echo "$q" | field bytes-done)
  local dirty; dirty=$(echo "$q" | field dirty-bytes)
  local waited; waited=$(echo "$q" | field writer-wait-ms)
  now=$(date +%s.%N)
  local tput; tput=$(python3 -c "print(round($done_b/($now-$t0)/1e6))")
  local rate="-"
  [ -n "$once" ] && rate=$(python3 -c "print(round($bytes/$once/1e6))")
  [ -z "$ready" ] && { st=$(echo "$q" | field status); [ "$st" = ready ] && ready="after writer"; }
  local total="-"
  # A background mirror the writes outpaced converges once they stop.
  for _ in $(seq 120); do
    [ "$(qctl query-jobs | field status)" = ready ] && break
    sleep 0.25
  done
  q=$(qctl query-jobs)
  if [ "$(echo "$q" | field status)" = ready ]; then
    qctl job-complete id=m wait=true > "$work/done.json"
    total=$(python3 -c "print(round($(date +%s.%N)-$t0,1))")
  else
    qctl job-cancel id=m wait=true > /dev/null
  fi
  local label="qcowkit $mode"
  [ "$rescan" = true ] && label="$label (rescan+drain per chunk)"
  [ "$prio" = low ] && label="$label (copy at low CPU priority)"
  [ "$chase" = true ] && label="$label (passes chase every write)"
  row "$label" "$(iops "$work/fio.json")" "${once:--}" "$rate" "$tput" \
    "${ready:-not ready while the writer ran}" "$total" \
    "dirty at writer end $(( ${dirty:-0} / 1048576 )) MiB; waited for writes $(( ${waited:-0} / 1000 )) s"
  stop_qk
  rm -f "$tgt"
}

# row label writer-iops rest...: the writer's share of its idle IOPS is added.
row() {
  local label=$1 w=$2; shift 2
  local pct=""
  [ -n "${IDLE_IOPS:-}" ] && pct="$(( w * 100 / IDLE_IOPS ))%"
  local IFS='|'
  echo "| $label | $w | $pct | $* |" | sed 's/|/ | /g; s/  */ /g; s/^ //; s/ $//'
}

# Reference: what a plain copy of another file of the same size to the
# target directory costs the writer (no qcowkit code on the copy side).
external_case() { # target-dir
  local other=$work/other.raw
  [ -e "$other" ] || dd if=/dev/urandom of="$other" bs=1M count=$((bytes / 1048576)) status=none
  start_qk
  fio_run "$work/fio.json" &
  local fpid=$!
  sleep 1
  local t0 t1; t0=$(date +%s.%N)
  cp "$other" "$1/other.raw"
  t1=$(date +%s.%N)
  wait "$fpid"
  local once; once=$(python3 -c "print(round($t1-$t0,1))")
  row "cp of another $SIZE file (reference)" "$(iops "$work/fio.json")" "$once" \
    "$(python3 -c "print(round($bytes/($t1-$t0)/1e6))")" "" "" "" "not a mirror: any copy's cost"
  stop_qk
  rm -f "$1/other.raw"
}

qsd_case() { # target-dir copy-mode
  local tdir=$1 mode=$2 tgt=$1/dst.qcow2
  command -v qemu-storage-daemon > /dev/null || { echo "| QEMU $mode | qemu-storage-daemon not installed | | | | | | | |"; return; }
  rm -f "$tgt" "$work/qmp.sock"
  qemu-img create -q -f qcow2 "$tgt" "$SIZE"
  drop_caches
  qemu-storage-daemon --blockdev "driver=file,filename=$src,node-name=f0" \
    --blockdev "driver=qcow2,file=f0,node-name=src" \
    --blockdev "driver=file,filename=$tgt,node-name=f1" \
    --blockdev "driver=qcow2,file=f1,node-name=dst" \
    --nbd-server "addr.type=unix,addr.path=$sock" --export "type=nbd,id=e,node-name=src,name=disk,writable=on" \
    --chardev "socket,path=$work/qmp.sock,server=on,wait=off,id=c" --monitor chardev=c &
  local qpid=$!
  pids+=($qpid)
  for _ in $(seq 100); do [ -S "$sock" ] && [ -S "$work/qmp.sock" ] && break; sleep 0.05; done
  fio_run "$work/fio.json" &
  local fpid=$!
  sleep 1
  python3 "$top/bench/qmp_mirror.py" "$work/qmp.sock" "$mode" "$fpid" "$(numfmt --from=iec "$SIZE")" > "$work/qemu.txt"
  wait "$fpid"
  local w; w=$(iops "$work/fio.json")
  local pct=""; [ -n "${IDLE_IOPS:-}" ] && pct="$(( w * 100 / IDLE_IOPS ))%"
  printf '| QEMU blockdev-mirror %s | %s | %s | %s\n' "$mode" "$w" "$pct" "$(cat "$work/qemu.txt")"
  kill -TERM "$qpid"; wait "$qpid" 2>/dev/null
  rm -f "$tgt"
}

run_where() { # label dir
  echo
  echo "## target on $1 ($2); sequential copy (qemu-img convert, no writer): $(seq_bw "$2") MB/s"
  echo "| case | writer IOPS | of idle | image copied once in (s) | at (MB/s) | MB copied per s while writing | time to ready (s) | time to complete (s) | note |"
  echo "|---|---|---|---|---|---|---|---|---|"
  IDLE_IOPS=""
  for c in $CASES; do
    case $c in
      idle) start_qk; fio_run "$work/fio.json"; stop_qk
            IDLE_IOPS=$(iops "$work/fio.json"); row "no mirror" "$IDLE_IOPS" "" "" "" "" "" "" ;;
      background) qk_case "$2" background false ;;
      background-chase) qk_case "$2" background false auto true ;;
      background-low) qk_case "$2" background false low ;;
      write-blocking) qk_case "$2" write-blocking false ;;
      rescan) qk_case "$2" background true auto true ;;
      external) external_case "$2" ;;
      qemu-background) qsd_case "$2" background ;;
      qemu-write-blocking) qsd_case "$2" write-blocking ;;
    esac
  done
}

shm=$(mktemp -d /dev/shm/qk-mirror-bench.XXXXXX)
case $where in
  tmpfs) run_where tmpfs "$shm" ;;
  disk) run_where "the same disk" "$work" ;;
  *) run_where tmpfs "$shm"; run_where "the same disk" "$work" ;;
esac
