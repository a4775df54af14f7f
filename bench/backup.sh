#!/usr/bin/env bash
# Incremental against full backup (`qcowkit backup`, an image not in use):
# a SIZE qcow2 image (default 16 GiB) fully written, with a persistent
# bitmap; each run takes a full backup (which clears the bitmap), then
# overwrites PCT percent of the disk (default 5) in 64 KiB pieces at
# random places, then takes an incremental backup over the full one.
# Both start with the page cache dropped; the bytes each read from the
# device come from /sys/block/DEV/stat (sectors read, the whole device:
# other readers count too). RUNS runs (default 3), medians. Prints a
# Markdown table. Needs root (drop_caches). QCOWKIT overrides the binary.
# Usage: bench/backup.sh [--runs N] [--dir DIR] [--size SIZE] [--pct P]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
QK=${QCOWKIT:-$top/build/tools/qcowkit}
runs=3 dir=/var/tmp size=16G pct=5
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --dir) dir=$2; shift ;;
    --size) size=$2; shift ;;
    --pct) pct=$2; shift ;;
    *) echo "usage: bench/backup.sh [--runs N] [--dir DIR] [--size SIZE] [--pct P]" >&2; exit 2 ;;
  esac
  shift
done
work=$(mktemp -d "$dir/qk-backup-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
dev=$(lsblk -no PKNAME "$(df --output=source "$work" | tail -1)" 2>/dev/null | head -1)
[ -n "$dev" ] || dev=$(basename "$(df --output=source "$work" | tail -1)")
[ -r "/sys/block/$dev/stat" ] || { echo "no /sys/block/$dev/stat for $work" >&2; exit 1; }

median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
sectors_read() { awk '{print $3}' "/sys/block/$dev/stat"; }
timed() { # OUT_PREFIX CMD...: appends seconds to PREFIX.t and bytes read to PREFIX.r
  local p=$1
  shift
  sync
  echo 3 > /proc/sys/vm/drop_caches
  local s0 t0 t1 s1
  s0=$(sectors_read)
  t0=$(date +%s%N)
  "$@" > /dev/null
  t1=$(date +%s%N)
  s1=$(sectors_read)
  echo "$(( (t1 - t0) / 1000000 ))" >> "$p.t"
  echo "$(( (s1 - s0) * 512 ))" >> "$p.r"
}

bytes=$("$QK" info --output=json "$(qemu-img create -q -f qcow2 "$work/probe.qcow2" "$size" && echo "$work/probe.qcow2")" |
        sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')
rm -f "$work/probe.qcow2"
qemu-img create -q -f qcow2 "$work/src.qcow2" "$size"
python3 -c "
for off in range(0, $bytes, 256 << 20):
    print('write -P 0x5a %d %d' % (off, min(256 << 20, $bytes - off)))" | "$QK" io "$work/src.qcow2" > /dev/null
"$QK" bitmap --add "$work/src.qcow2" b
nchunks=$(( bytes / 65536 ))
nwrites=$(( nchunks * pct / 100 ))
: > "$work/full.t"; : > "$work/full.r"; : > "$work/inc.t"; : > "$work/inc.r"; : > "$work/changed"
for r in $(seq "$runs"); do
  rm -f "$work/full.qcow2" "$work/inc.qcow2"
  timed "$work/full" "$QK" backup --sync=full --bitmap b "$work/src.qcow2" "$work/full.qcow2"
  python3 -c "
import random
random.seed($r)
for c in random.sample(range($nchunks), $nwrites):
    print('write -P $((r + 1)) %d 64k' % (c * 65536))" | "$QK" io "$work/src.qcow2" > /dev/null
  echo $(( nwrites * 65536 )) >> "$work/changed"
  timed "$work/inc" "$QK" backup --sync=incremental --bitmap b -B "$work/full.qcow2" "$work/src.qcow2" "$work/inc.qcow2"
  qemu-img compare -q "$work/src.qcow2" "$work/inc.qcow2" || { echo "increment $r differs from the source" >&2; exit 1; }
done
ft=$(median < "$work/full.t"); fr=$(median < "$work/full.r")
it=$(median < "$work/inc.t"); ir=$(median < "$work/inc.r")
ch=$(median < "$work/changed")
echo "Incremental backup, $(date '+%Y-%m-%d %H:%M'): $size image, $pct% changed in 64 KiB pieces; $runs runs, medians; page cache dropped before each backup; device reads from /sys/block/$dev/stat."
echo
echo "| backup | time | read from the device | of the changed bytes | time vs full |"
echo "|---|---|---|---|---|"
printf '| full | %.2f s | %.0f MiB | | |\n' "$(echo "$ft / 1000" | bc -l)" "$(echo "$fr / 1048576" | bc -l)"
printf '| incremental (%s changed: %.0f MiB) | %.2f s | %.0f MiB | %.2f× | %.3f× |\n' "$pct%" "$(echo "$ch / 1048576" | bc -l)" \
  "$(echo "$it / 1000" | bc -l)" "$(echo "$ir / 1048576" | bc -l)" "$(echo "$ir / $ch" | bc -l)" "$(echo "$it / $ft" | bc -l)"
