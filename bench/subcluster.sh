#!/usr/bin/env bash
# Small O_DIRECT writes into a fresh 1G extended_l2 image, the workload of
# the subcluster work: `bench -c COUNT -d 8 -w -t none -n` with -s 2K,
# -s 2K -o 512 and -s 2560, for qcowkit (default allocation dependencies),
# qcowkit --strict-alloc-deps and qemu-img bench. Runs are interleaved
# (the disk is noisy) and each uses a fresh image; prints a Markdown table
# of medians in seconds, with min-max.
# Usage: bench/subcluster.sh   (env: RUNS=3 COUNT=100000 BENCH_DIR=/var/tmp QCOWKIT=...)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
QK=${QCOWKIT:-$top/build/tools/qcowkit}
runs=${RUNS:-3}
count=${COUNT:-100000}
dir=$(mktemp -d "${BENCH_DIR:-/var/tmp}/qk-subcluster.XXXXXX")
trap 'rm -rf "$dir"' EXIT
img="$dir/b.qcow2"

sizes=("-s 2K" "-s 2K -o 512" "-s 2560")
variants=("qcowkit" "qcowkit --strict-alloc-deps" "qemu-img")
declare -A times

one() { # variant size-args
    rm -f "$img"
    qemu-img create -q -f qcow2 -o extended_l2=on "$img" 1G
    local out
    case "$1" in
        qemu-img) out=$(qemu-img bench -c "$count" -d 8 -w -t none -n $2 "$img") ;;
        "qcowkit --strict-alloc-deps") out=$("$QK" bench -c "$count" -d 8 -w -t none -n $2 --strict-alloc-deps "$img") ;;
        *) out=$("$QK" bench -c "$count" -d 8 -w -t none -n $2 "$img") ;;
    esac
    qemu-img check -q "$img" || { echo "qemu-img check failed after $1 $2" >&2; exit 1; }
    sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' <<<"$out"
}

for ((r = 1; r <= runs; r++)); do
    for si in "${!sizes[@]}"; do
        for vi in "${!variants[@]}"; do
            t=$(one "${variants[$vi]}" "${sizes[$si]}")
            echo "run $r: ${variants[$vi]} ${sizes[$si]}: $t s" >&2
            times[$vi,$si]+="$t "
        done
    done
done

cell() { # "t1 t2 ..." -> "median (min–max)"
    tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {
        m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2;
        printf "%.2f (%.2f–%.2f)", m, a[1], a[NR] }'
}

echo
echo "Small O_DIRECT writes into a fresh 1G extended_l2 image: \`bench -c $count -d 8 -w -t none -n\`, seconds, median of $runs (min–max)"
echo
printf '| |'; for s in "${sizes[@]}"; do printf ' %s |' "$s"; done; echo
printf '|---|'; for s in "${sizes[@]}"; do printf -- '---|'; done; echo
for vi in "${!variants[@]}"; do
    printf '| %s |' "${variants[$vi]}"
    for si in "${!sizes[@]}"; do printf ' %s |' "$(cell "${times[$vi,$si]}")"; done
    echo
done
