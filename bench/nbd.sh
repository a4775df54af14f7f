#!/usr/bin/env bash
# NBD server benchmark: fio's nbd engine, 4k random reads and writes at
# queue depth 32, against `qcowkit serve` and `qemu-nbd` exporting the
# same image over a unix socket. The servers take turns (never both on the
# image at once; who goes first rotates per round), each run is RUNTIME
# seconds, REPS rounds; the table shows medians (min-max) of IOPS and the
# ratio qcowkit / qemu-nbd. The image lives once on the disk and once on
# tmpfs: on the disk, buffered writes can be bound by the file system's
# writeback for both servers alike; on tmpfs the servers' own costs show. A third column is the file's own
# ceiling: fio (io_uring, O_DIRECT with cache=none) on the image file
# itself, inside its largest run of guest data so the image stays valid:
# the same blocks of the same disk, with no server and no format between.
# A fourth is the client's ceiling: the same fio nbd job against nbdkit's
# null plugin (no disk, no format, every request answered at once), the
# most fio's client and the socket pass on this machine.
# Usage: bench/nbd.sh   (env: RUNTIME=10 REPS=3 SIZE=1G FORMAT=qcow2
#                       CACHE=writeback|none (both servers; none: O_DIRECT,
#                       qemu-nbd with --aio=native)
#                       DIRS="/var/tmp /dev/shm"
#                       QK_AIO=io_uring|threads to pick qcowkit's I/O backend)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.bash"
RUNTIME=${RUNTIME:-10}
REPS=${REPS:-3}
SIZE=${SIZE:-1G}
FORMAT=${FORMAT:-qcow2}
CACHE=${CACHE:-writeback}
QK=${QCOWKIT:-$top/build/tools/qcowkit}
[ -x "$QK" ] || bash "$top/scripts/build.sh" >/dev/null
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "fio has no nbd engine" >&2; exit 1; }

srv=""
work=""
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; wait 2>/dev/null; [ -z "$work" ] || rm -rf "$work"; }
trap cleanup EXIT

one_dir() { # DIR
work=$(mktemp -d "$1/qk-nbd-bench.XXXXXX")
img=$work/img.$FORMAT
sock=$work/nbd.sock
qemu-img create -q -f "$FORMAT" "$img" "$SIZE"
# Fully allocate it so reads hit data and writes overwrite, for both.
qemu-io -f "$FORMAT" -c "write -P 0x5a 0 $SIZE" "$img" >/dev/null
# The largest host range of guest data (adjacent map entries merged).
read -r cap_off cap_len < <(qemu-img map -f "$FORMAT" --output=json "$img" | python3 -c '
import json, sys
best, cur = (0, 0), None
for e in json.load(sys.stdin):
    if not e.get("data") or "offset" not in e:
        cur = None
        continue
    if cur and cur[0] + cur[1] == e["offset"]:
        cur = (cur[0], cur[1] + e["length"])
    else:
        cur = (e["offset"], e["length"])
    best = max(best, cur, key=lambda r: r[1])
print(*best)')

start() { # qcowkit|qemu-nbd
  drop_caches
  rm -f "$sock"
  if [ "$1" = qcowkit ]; then
    "$QK" ${QK_AIO:+--aio "$QK_AIO"} serve --socket "$sock" --export "name=b,file=$img,format=$FORMAT,cache=$CACHE" &
  elif [ "$1" = nbdkit ]; then
    nbdkit -f -U "$sock" -e b null size="$SIZE" &
  else
    local qopt=()
    [ "$CACHE" = none ] && qopt=(--aio=native)
    qemu-nbd -f "$FORMAT" -x b -k "$sock" -t --cache="$CACHE" "${qopt[@]}" "$img" &
  fi
  srv=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.05; done
  echo "$1 did not start" >&2
  exit 1
}
stop() { kill "$srv"; wait "$srv" 2>/dev/null || true; srv=""; }

iops() { # rw [fio target options...]; default: the NBD export
  local key=read rw=$1
  [ "$rw" = randwrite ] && key=write
  shift
  [ $# -gt 0 ] || set -- --ioengine=nbd --uri="nbd+unix:///b?socket=$sock" --size="$SIZE"
  fio --name=b "$@" --rw="$rw" --bs=4k \
      --iodepth=32 --time_based=1 --runtime="$RUNTIME" --ramp_time=1 \
      --output-format=json 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c "import json,sys; print(int(json.load(sys.stdin)['jobs'][0]['$key']['iops']))"
}

declare -A res
direct=0
[ "$CACHE" = none ] && direct=1
systems=(qcowkit qemu-nbd file nbdkit)
for rep in $(seq "$REPS"); do
  # Who goes first rotates per round, so a disk that drifts during a
  # round favours no one.
  k=$(( (rep - 1) % ${#systems[@]} ))
  for s in "${systems[@]:k}" "${systems[@]:0:k}"; do
    if [ "$s" = file ]; then
      drop_caches
      for rw in randread randwrite; do
        res[file,$rw]+="$(iops "$rw" --ioengine=io_uring --filename="$img" --direct=$direct \
                          --offset="$cap_off" --size="$cap_len") "
      done
      continue
    fi
    start "$s"
    for rw in randread randwrite; do
      res[$s,$rw]+="$(iops "$rw") "
    done
    stop
  done
  echo "round $rep done" >&2
done

python3 - "$FORMAT" "$SIZE" "$RUNTIME" "$REPS" "$1" \
  "${res[qcowkit,randread]}" "${res[qemu-nbd,randread]}" \
  "${res[qcowkit,randwrite]}" "${res[qemu-nbd,randwrite]}" \
  "${res[file,randread]}" "${res[file,randwrite]}" \
  "${res[nbdkit,randread]}" "${res[nbdkit,randwrite]}" "$cap_len" <<'PY'
import statistics, sys
fmt, size, rt, reps, where = sys.argv[1:6]
vals = [list(map(int, a.split())) for a in sys.argv[6:14]]
cap_mib = int(sys.argv[14]) >> 20
def cell(v):
    return f"{int(statistics.median(v))} ({min(v)}-{max(v)})"
import os
aio = os.environ.get("QK_AIO") or "default (io_uring)"
cache = os.environ.get("CACHE") or "writeback"
print(f"fio nbd engine, 4k, iodepth 32, {rt}s x {reps} per cell, {fmt} image of {size} in {where}, cache={cache}, unix socket, qcowkit aio {aio}; "
      f"the file's ceiling: fio io_uring{' O_DIRECT' if cache == 'none' else ''} on {cap_mib} MiB of the image file's guest data; "
      f"the client's ceiling: the fio nbd job against nbdkit's null plugin\n")
print("| workload | qcowkit serve IOPS | qemu-nbd IOPS | ratio | the file's ceiling (fio on it) | qcowkit / file | qemu-nbd / file "
      "| the client's ceiling (nbdkit null) | qcowkit / client |")
print("|---|---|---|---|---|---|---|---|---|")
for name, qk, qm, f, k in (("randread", vals[0], vals[1], vals[4], vals[6]),
                           ("randwrite", vals[2], vals[3], vals[5], vals[7])):
    m = statistics.median
    print(f"| {name} | {cell(qk)} | {cell(qm)} | {m(qk) / m(qm):.2f}x | {cell(f)} | {m(qk) / m(f):.2f} | {m(qm) / m(f):.2f} "
          f"| {cell(k)} | {m(qk) / m(k):.2f} |")
PY
rm -rf "$work"; work=""
}

for d in ${DIRS:-/var/tmp /dev/shm}; do
  [ -d "$d" ] && [ -w "$d" ] || { echo "skipping $d: not a writable directory" >&2; continue; }
  one_dir "$d"
  echo
done
