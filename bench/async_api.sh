#!/usr/bin/env bash
# The public asynchronous API (qk-async-bench: one queue, qk_queue_do_io)
# against `qcowkit bench` on the same allocated image: 4k random reads and
# writes at depth 32, cache=none, medians of runs that rotate which of the
# three goes first. Two kinds of async image: with an engine thread (the
# default) and inline (QK_ASYNC_INLINE, the engine on the caller's thread).
# Ratio = async API IOPS / qcowkit bench IOPS (target >= 0.95).
#   bash bench/async_api.sh [RUNS]      (default 5; COUNT=100000)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-5}
count=${COUNT:-100000}
qk="$top/build/tools/qcowkit"
ab="$top/build/bench/qk-async-bench"
[ -x "$qk" ] && [ -x "$ab" ] || bash "$top/scripts/build.sh" >/dev/null
. "$top/bench/lib.bash"
dir=$(mktemp -d /var/tmp/qk-async-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
img="$dir/a.qcow2"
"$qk" create -q -f qcow2 "$img" 1G
"$qk" io -t none -c 'write -P 0x5c 0 1G' "$img" >/dev/null
# A step that is prime to the image size in 4k units scatters the requests.
step=165900288

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for mode in read write; do
  wflag=""; [ "$mode" = write ] && wflag="-w"
  : >"$dir/qk.$mode"; : >"$dir/as.$mode"; : >"$dir/in.$mode"
  for ((i = 0; i < runs; i++)); do
    order=(qk as in)
    order=("${order[@]:i % 3}" "${order[@]:0:i % 3}")
    for sys in "${order[@]}"; do
      drop_caches
      case $sys in
      qk)
        s=$("$qk" bench -c "$count" -d 32 -s 4096 -S "$step" $wflag -t none -n "$img" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
        echo "$count $s" | awk '{printf "%.0f\n", $1 / $2}' >>"$dir/qk.$mode" ;;
      as) "$ab" -c "$count" -d 32 -s 4096 -S "$step" $wflag -t none "$img" | awk '{print $3}' >>"$dir/as.$mode" ;;
      in) "$ab" -i -c "$count" -d 32 -s 4096 -S "$step" $wflag -t none "$img" | awk '{print $3}' >>"$dir/in.$mode" ;;
      esac
    done
  done
  q=$(median <"$dir/qk.$mode"); a=$(median <"$dir/as.$mode"); n=$(median <"$dir/in.$mode")
  printf '| 4k rand%s d32, cache=none | %s | %s | %.2f | %s | %.2f |\n' "$mode" "$q" "$a" \
    "$(echo "$a $q" | awk '{print $1 / $2}')" "$n" "$(echo "$n $q" | awk '{print $1 / $2}')"
  echo "  runs: qcowkit bench $(tr '\n' ' ' <"$dir/qk.$mode"); engine thread $(tr '\n' ' ' <"$dir/as.$mode"); inline $(tr '\n' ' ' <"$dir/in.$mode")" >&2
done
