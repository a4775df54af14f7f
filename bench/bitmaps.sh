#!/usr/bin/env bash
# Persistent dirty bitmaps: what keeping them costs.
#  - tracking: 4k random writes at depth 32 into an allocated 1 GiB image
#    with 8 enabled persistent bitmaps against the same image with none
#    (the same file: the bitmaps are added and removed between runs),
#    alternating, RUNS runs each, medians; on tmpfs with cache=writeback
#    (CPU-bound: where the marking would show) and on the disk with
#    cache=none (the VM's case);
#  - load and store: `qcowkit io` of one 4k write on a 1 TiB image whose
#    64 KiB-granularity bitmap has 16,384 dirty chunks spread over the
#    disk (2 MiB of bitmap data), against the same image without it; the
#    difference is the bitmap's load at open plus its store at close.
# Usage: bench/bitmaps.sh [--runs N] [--dir DISK_SCRATCH]; prints a
# Markdown table. QCOWKIT overrides the binary.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
QK=${QCOWKIT:-$top/build/tools/qcowkit}
runs=5 dir=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --dir) dir=$2; shift ;;
    *) echo "usage: bench/bitmaps.sh [--runs N] [--dir DIR]" >&2; exit 2 ;;
  esac
  shift
done
shm=$(mktemp -d /dev/shm/qk-bmbench.XXXXXX)
disk=$(mktemp -d "$dir/qk-bmbench.XXXXXX")
trap 'rm -rf "$shm" "$disk"' EXIT

median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
bench_s() { # IMG CACHE: seconds of 200,000 4k random writes at depth 32
  local flags=(-t "$2")
  [ "$2" = none ] && flags+=(-n)
  "$QK" bench -f qcow2 -c 200000 -d 32 -s 4096 -S $((4096 * ((165900288 / 4096) | 1))) -w "${flags[@]}" "$1" |
    tail -1 | grep -o '[0-9.]* seconds' | cut -d' ' -f1
}
# One image for both cases, its 8 bitmaps added before the "eight" runs
# and removed before the "none" runs: two files (a copy) land on
# different parts of the disk, and that alone moved the disk row by 2x
# in an A/A check, far more than anything being measured here.
set_bitmaps() { # IMG none|eight
  local i
  for i in 1 2 3 4 5 6 7 8; do
    if [ "$2" = eight ]; then "$QK" bitmap --add "$1" "b$i"; else "$QK" bitmap --remove "$1" "b$i"; fi
  done
}
tracking() { # DIR CACHE
  local d=$1 r f have=none
  qemu-img create -q -f qcow2 "$d/img.qcow2" 1G
  qemu-io -c 'write 0 1G' "$d/img.qcow2" >/dev/null
  : >"$d/t.none"
  : >"$d/t.eight"
  for r in $(seq "$runs"); do
    for f in none eight; do
      [ $((r % 2)) = 0 ] && f=$([ $f = none ] && echo eight || echo none)
      [ "$f" = "$have" ] || set_bitmaps "$d/img.qcow2" "$f"
      have=$f
      bench_s "$d/img.qcow2" "$2" >>"$d/t.$f"
    done
  done
  local a b
  a=$(median <"$d/t.none")
  b=$(median <"$d/t.eight")
  printf '| 4k random writes, depth 32, %s | %s s | %s s | %s |\n' \
    "$([ "$2" = none ] && echo "disk, cache=none" || echo "tmpfs, cache=writeback")" "$a" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%+.1f%%", (b / a - 1) * 100}')"
}

echo "Persistent bitmaps, $(date '+%Y-%m-%d %H:%M'); $runs runs each, alternating, medians."
echo
echo "| workload | no bitmaps | 8 enabled bitmaps | cost |"
echo "|---|---|---|---|"
tracking "$shm" writeback
tracking "$disk" none

qemu-img create -q -f qcow2 "$shm/plain.qcow2" 1T
cp "$shm/plain.qcow2" "$shm/bm.qcow2"
"$QK" bitmap --add -g 64k "$shm/bm.qcow2" big
python3 -c 'for i in range(0, 1 << 40, 1 << 26): print("write -P 1 %d 4k" % i)' >"$shm/spread"
"$QK" io "$shm/bm.qcow2" <"$shm/spread" >/dev/null
"$QK" io "$shm/plain.qcow2" <"$shm/spread" >/dev/null
: >"$shm/m.plain"
: >"$shm/m.bm"
for r in $(seq $((runs * 2))); do
  for f in plain bm; do
    s=$(date +%s%N)
    "$QK" io -c 'write -P 2 0 4k' "$shm/$f.qcow2" >/dev/null
    e=$(date +%s%N)
    echo $(((e - s) / 1000)) >>"$shm/m.$f"
  done
done
a=$(median <"$shm/m.plain")
b=$(median <"$shm/m.bm")
printf '| open, one 4k write, close: 1 TiB image, 64 KiB bitmap with 16,384 dirty chunks (tmpfs) | %.1f ms | %.1f ms | %+.1f ms load and store |\n' \
  "$(echo "$a / 1000" | bc -l)" "$(echo "$b / 1000" | bc -l)" "$(echo "($b - $a) / 1000" | bc -l)"
