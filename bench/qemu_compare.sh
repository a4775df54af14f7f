#!/usr/bin/env bash
# qcowkit bench vs qemu-img bench with the same flags, side by side in one
# run: 4k and 64k, sequential and strided-random (-S over the whole image),
# reads and writes, cache none and writeback, on an allocated qcow2 image.
# Usage: bench/qemu_compare.sh [RUNS] [COUNT_4K] [COUNT_64K]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}; c4=${2:-50000}; c64=${3:-4000}
qk=${QCOWKIT_BIN:-$top/build/tools/qcowkit}
dir=$(mktemp -d /var/tmp/qk-cmp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
img="$dir/img.qcow2"
qemu-img create -q -f qcow2 "$img" 1G
qemu-io -f qcow2 -t none -c 'write -P 0x5a 0 1G' "$img" >/dev/null

med() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
secs() { sed -n 's/.*Run completed in \([0-9.]*\) seconds.*/\1/p'; }

echo "| workload | qcowkit (s) | qemu-img (s) | qcowkit / qemu-img |"
echo "|---|---|---|---|"
for size in 4096 65536; do
  count=$c4; [ "$size" = 65536 ] && count=$c64
  for pattern in seq rand; do
    step=$size; [ "$pattern" = rand ] && step=$((size * 4051))
    for cache in none writeback; do
      for rw in read write; do
        flags=(-c "$count" -d 32 -s "$size" -S "$step" -t "$cache")
        [ "$cache" = none ] && flags+=(-n)
        [ "$rw" = write ] && flags+=(-w)
        a=() b=()
        for ((i = 0; i < runs; i++)); do
          a+=("$("$qk" bench -f qcow2 "${flags[@]}" "$img" | secs)")
          b+=("$(qemu-img bench -f qcow2 "${flags[@]}" "$img" | secs)")
        done
        ma=$(printf '%s\n' "${a[@]}" | med); mb=$(printf '%s\n' "${b[@]}" | med)
        printf '| %s %s %s, cache=%s | %s | %s | %.2f |\n' "$((size / 1024))k" "$pattern" "$rw" "$cache" \
          "$ma" "$mb" "$(awk -v a="$ma" -v b="$mb" 'BEGIN{print a/b}')"
      done
    done
  done
done
