#!/usr/bin/env bash
# Runtime micro-benchmarks, side by side in one run: coroutine switch cost,
# and 4 KiB random reads from a page-cached file at depth 32 through each
# qcowkit backend against fio --ioengine=io_uring on the same file.
# Usage: bench/runtime.sh [RUNS] [SECONDS]     (medians over RUNS)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
secs=${2:-3}
bin="$top/build/bench/qk-aio-bench"
dir=$(mktemp -d /var/tmp/qk-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
file="$dir/cached.raw"
dd if=/dev/urandom of="$file" bs=1M count=256 status=none
cat "$file" > /dev/null   # into the page cache

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; if (m>0) printf "%.0f", 100*(a[NR]-a[1])/(2*m); else print 0}'; }

sw=() ur=() th=() fi=() fb=()
for ((i = 0; i < runs; i++)); do
  sw+=("$("$bin" switch 20000000 | sed 's/.*"ns_per_switch":\([0-9.]*\).*/\1/')")
  ur+=("$(QCOWKIT_AIO=io_uring "$bin" randread "$file" 32 "$secs" | sed 's/.*"iops":\([0-9]*\).*/\1/')")
  th+=("$(QCOWKIT_AIO=threads "$bin" randread "$file" 32 "$secs" | sed 's/.*"iops":\([0-9]*\).*/\1/')")
  fi+=("$(fio --name=rr --filename="$file" --ioengine=io_uring --rw=randread --bs=4k --iodepth=32 \
          --runtime="$secs" --time_based --output-format=json 2>/dev/null |
          python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')")
  fb+=("$(fio --name=rr --filename="$file" --ioengine=io_uring --rw=randread --bs=4k --iodepth=32 \
          --iodepth_batch_submit=32 --iodepth_batch_complete_min=1 --iodepth_batch_complete_max=32 \
          --runtime="$secs" --time_based --output-format=json 2>/dev/null |
          python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')")
done

m_sw=$(printf '%s\n' "${sw[@]}" | median); s_sw=$(printf '%s\n' "${sw[@]}" | spread)
m_ur=$(printf '%s\n' "${ur[@]}" | median); s_ur=$(printf '%s\n' "${ur[@]}" | spread)
m_th=$(printf '%s\n' "${th[@]}" | median); s_th=$(printf '%s\n' "${th[@]}" | spread)
m_fi=$(printf '%s\n' "${fi[@]}" | median); s_fi=$(printf '%s\n' "${fi[@]}" | spread)
m_fb=$(printf '%s\n' "${fb[@]}" | median); s_fb=$(printf '%s\n' "${fb[@]}" | spread)

echo "## Runtime ($runs runs, median ± spread; $(nproc) cores, $(uname -r))"
echo
echo "| measurement | value | ratio vs fio io_uring |"
echo "|---|---|---|"
echo "| coroutine switch | ${m_sw} ns ± ${s_sw}% | – |"
echo "| 4k randread d32, qcowkit io_uring | ${m_ur} IOPS ± ${s_ur}% | $(awk -v a="$m_ur" -v b="$m_fi" 'BEGIN{printf "%.2f", a/b}') |"
echo "| 4k randread d32, qcowkit threads | ${m_th} IOPS ± ${s_th}% | $(awk -v a="$m_th" -v b="$m_fi" 'BEGIN{printf "%.2f", a/b}') |"
echo "| 4k randread d32, fio io_uring | ${m_fi} IOPS ± ${s_fi}% | 1.00 |"
echo "| 4k randread d32, fio io_uring, batched submit/complete 32 | ${m_fb} IOPS ± ${s_fb}% | $(awk -v a="$m_fb" -v b="$m_fi" 'BEGIN{printf "%.2f", a/b}') |"
