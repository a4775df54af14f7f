#!/usr/bin/env bash
# Live-mirror benchmark: a writer (fio --ioengine=nbd, randwrite, BS, depth
# DEPTH, DURATION seconds) against an export of a fully allocated qcow2 of
# SIZE while a mirror job copies it to a target on the same disk with
# O_DIRECT (target-cache=none, as a VM's disk would be). Per case: the
# writer's IOPS and its share of the idle writer's, how long copying the
# image once took, time to ready and to complete, and the copier's CPU per
# GiB copied. Cases:
#   idle             the writer alone
#   background       background mirror
#   write-blocking   write-blocking mirror (must reach ready under the writer)
#   rescan           background with rescan+drain per chunk and passes that
#                    chase every write (the seed's behaviour, an ablation)
#   dd               dd iflag=direct oflag=direct bs=4M of another file of
#                    SIZE on the same disk (the reference copy)
#   qemu-background, qemu-write-blocking
#                    QEMU's blockdev-mirror in qemu-storage-daemon, both
#                    nodes with cache.direct=on
#   copy-cost, qemu-copy-cost
#                    the mirror alone (no writer): CPU seconds of the
#                    server process per GiB until ready (QEMU's process
#                    likewise), and the copy rate
# Every case runs RUNS times (default 3), the order alternating between
# runs (forward, then reversed); the table shows medians and the spread.
#
# Usage: bench/mirror.sh [disk|tmpfs]
#   env: SIZE=2G DURATION=20 BS=4k DEPTH=32 RUNS=3 EXPORT_CACHE=writeback CASES="..."
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.bash"
QK=${QCOWKIT:-$top/build/tools/qcowkit}
SIZE=${SIZE:-2G}
DURATION=${DURATION:-20}
BS=${BS:-4k}
DEPTH=${DEPTH:-32}
RUNS=${RUNS:-3}
EXPORT_CACHE=${EXPORT_CACHE:-writeback}   # the source export's cache mode
CASES=${CASES:-"idle background write-blocking rescan dd qemu-background qemu-write-blocking copy-cost qemu-copy-cost"}
where=${1:-disk}
work=$(mktemp -d /var/tmp/qk-mirror-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work" /dev/shm/qk-mirror-bench.*; }
trap cleanup EXIT
case $where in
  disk) tdir=$work/t; mkdir -p "$tdir" ;;
  tmpfs) tdir=$(mktemp -d /dev/shm/qk-mirror-bench.XXXXXX) ;;
  *) echo "usage: bench/mirror.sh [disk|tmpfs]"; exit 2 ;;
esac

src=$work/src.qcow2
sock=$work/nbd.sock
ctl_sock=$work/ctl.sock
uri="nbd+unix:///disk?socket=$sock"
results=$work/results.tsv
: > "$results"

qemu-img create -q -f qcow2 "$src" "$SIZE"
# Fully allocated source, so the mirror has SIZE bytes to copy.
bytes=$(numfmt --from=iec "$SIZE")
for ((off = 0; off < bytes; off += 268435456)); do
  qemu-io -f qcow2 -c "write -P 0x5a $off 256M" "$src" > /dev/null
done
qemu-img map "$src" --output=json | grep -q '"data": true' || { echo "could not fill the source"; exit 1; }
other=$work/other.raw
dd if=/dev/urandom of="$other" bs=1M count=$((bytes / 1048576)) status=none

now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.2f' % ($(now) - $1))"; }
cpu_s() { # pid: user+system seconds of a process
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}
fio_run() { # output-json
  fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs="$BS" --iodepth="$DEPTH" \
    --time_based --runtime="$DURATION" --size="$SIZE" --output-format=json > "$1" 2>/dev/null
}
iops() { # fio may print notes before its JSON
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); print(round(json.loads(t[t.index('{'):])['jobs'][0]['write']['iops']))" "$1"
}
# result case writer-iops once ready total cpu-per-gib ("-" where none)
result() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$results"; }

start_qk() {
  drop_caches
  rm -f "$work/pid"
  "$QK" serve --pidfile "$work/pid" --socket "$sock" --control "$ctl_sock" \
    --export "name=disk,file=$src,format=qcow2,cache=$EXPORT_CACHE" &
  SERVE=$!
  pids+=("$SERVE")
  for _ in $(seq 200); do [ -s "$work/pid" ] && return; sleep 0.05; done
  echo "serve did not start"; exit 1
}
stop_qk() { kill -TERM "$SERVE"; wait "$SERVE" 2>/dev/null; }
qctl() { "$QK" ctl "$ctl_sock" "$@"; }
field() { python3 -c "import json,sys; j=json.load(sys.stdin)['return']; j=j[0] if isinstance(j,list) else j; print(j.get(sys.argv[1],''))" "$1"; }

# Waits for ready (up to 60 s), completes the job; prints seconds since t0
# or "-" when it never became ready (then cancels).
qk_finish() { # t0
  for _ in $(seq 240); do
    [ "$(qctl query-jobs | field status)" = ready ] && break
    sleep 0.25
  done
  if [ "$(qctl query-jobs | field status)" = ready ]; then
    qctl job-complete id=m wait=true > "$work/done.json"
    since "$1"
  else
    qctl job-cancel id=m wait=true > /dev/null
    echo "-"
  fi
}

qk_case() { # case mode rescan chase
  local name=$1 mode=$2 rescan=$3 chase=$4 tgt=$tdir/dst.qcow2
  rm -f "$tgt"
  start_qk
  fio_run "$work/fio.json" &
  local fpid=$!
  sleep 2
  local t0 ready="-" once="-" q
  t0=$(now)
  qctl mirror-start export=disk target="$tgt" mode="$mode" id=m rescan-per-chunk="$rescan" \
    chase-writes="$chase" target-cache=none > /dev/null
  while kill -0 "$fpid" 2>/dev/null; do
    q=$(qctl query-jobs)
    [ "$ready" = - ] && [ "$(echo "$q" | field status)" = ready ] && ready=$(since "$t0")
    [ "$once" = - ] && [ "$(echo "$q" | field bytes-done)" -ge "$bytes" ] && once=$(since "$t0")
    sleep 0.25
  done
  wait "$fpid"
  local cpu; cpu=$(qctl query-jobs | field cpu-ms-per-gib)
  local total; total=$(qk_finish "$t0")
  result "$name" "$(iops "$work/fio.json")" "$once" "$ready" "$total" \
    "$(python3 -c "print('%.2f' % (${cpu:-0} / 1000))")"
  stop_qk
  rm -f "$tgt"
}

qk_copy_cost() {
  local tgt=$tdir/dst.qcow2
  rm -f "$tgt"
  start_qk
  local c0 t0 ready="-"
  c0=$(cpu_s "$SERVE")
  t0=$(now)
  qctl mirror-start export=disk target="$tgt" mode=background id=m target-cache=none > /dev/null
  for _ in $(seq 1200); do
    [ "$(qctl query-jobs | field status)" = ready ] && { ready=$(since "$t0"); break; }
    sleep 0.05
  done
  local cpu; cpu=$(python3 -c "print('%.2f' % (($(cpu_s "$SERVE") - $c0) * (1 << 30) / $bytes))")
  qctl job-complete id=m wait=true > /dev/null
  result copy-cost - "$ready" "$ready" "-" "$cpu"
  stop_qk
  rm -f "$tgt"
}

dd_case() {
  start_qk
  fio_run "$work/fio.json" &
  local fpid=$!
  sleep 2
  local t0; t0=$(now)
  dd if="$other" of="$tdir/other.raw" bs=4M iflag=direct oflag=direct status=none
  local once; once=$(since "$t0")
  wait "$fpid"
  result dd "$(iops "$work/fio.json")" "$once" - - -
  stop_qk
  rm -f "$tdir/other.raw"
}

start_qsd() { # target
  rm -f "$work/qmp.sock"
  drop_caches
  qemu-storage-daemon --blockdev "driver=file,filename=$src,node-name=f0,cache.direct=on" \
    --blockdev "driver=qcow2,file=f0,node-name=src" \
    --blockdev "driver=file,filename=$1,node-name=f1,cache.direct=on" \
    --blockdev "driver=qcow2,file=f1,node-name=dst" \
    --nbd-server "addr.type=unix,addr.path=$sock" --export "type=nbd,id=e,node-name=src,name=disk,writable=on" \
    --chardev "socket,path=$work/qmp.sock,server=on,wait=off,id=c" --monitor chardev=c &
  QSD=$!
  pids+=("$QSD")
  for _ in $(seq 100); do [ -S "$sock" ] && [ -S "$work/qmp.sock" ] && break; sleep 0.05; done
}

qsd_case() { # case copy-mode ("" for the copy-cost case: no writer)
  local name=$1 mode=$2 tgt=$tdir/dst.qcow2
  command -v qemu-storage-daemon > /dev/null || { result "$name" - - - - -; return; }
  rm -f "$tgt"
  qemu-img create -q -f qcow2 "$tgt" "$SIZE"
  start_qsd "$tgt"
  local fpid=0
  if [ -n "$mode" ]; then
    fio_run "$work/fio.json" &
    fpid=$!
    sleep 2
  fi
  # prints: once ready total cpu-s-per-GiB
  local r
  r=$(python3 "$top/bench/qmp_mirror.py" "$work/qmp.sock" "${mode:-background}" "$fpid" "$bytes" "$QSD")
  local w=-
  if [ -n "$mode" ]; then wait "$fpid"; w=$(iops "$work/fio.json"); fi
  # shellcheck disable=SC2086
  result "$name" "$w" $r
  kill -TERM "$QSD"; wait "$QSD" 2>/dev/null
  rm -f "$tgt"
}

run_case() {
  case $1 in
    idle) start_qk; fio_run "$work/fio.json"; stop_qk; result idle "$(iops "$work/fio.json")" - - - - ;;
    background) qk_case background background false false ;;
    write-blocking) qk_case write-blocking write-blocking false false ;;
    rescan) qk_case rescan background true true ;;
    dd) dd_case ;;
    qemu-background) qsd_case qemu-background background ;;
    qemu-write-blocking) qsd_case qemu-write-blocking write-blocking ;;
    copy-cost) qk_copy_cost ;;
    qemu-copy-cost) qsd_case qemu-copy-cost "" ;;
    *) echo "unknown case $1"; exit 2 ;;
  esac
}

echo "# live mirror: SIZE=$SIZE, writer fio nbd randwrite bs=$BS depth=$DEPTH ${DURATION}s," \
  "source export cache=$EXPORT_CACHE, target on $where" \
  "with O_DIRECT; $RUNS runs, alternating order; $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M') UTC," \
  "commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null)"
read -r -a order <<< "$CASES"
for ((r = 1; r <= RUNS; r++)); do
  if ((r % 2 == 0)); then
    list=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do list+=("${order[i]}"); done
  else
    list=("${order[@]}")
  fi
  for c in "${list[@]}"; do
    run_case "$c"
    echo "run $r: $(tail -n 1 "$results")" >&2
  done
done
python3 "$top/bench/mirror_table.py" "$results" "$bytes" $CASES
