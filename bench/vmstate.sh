#!/usr/bin/env bash
# VM-state save and load, side by side in one run (medians of RUNS):
#   save SIZE bytes of a migration-like stream (8-byte headers, 4 KiB pages,
#   small sections; 131,328-byte pieces) into a fresh qcow2 image through the
#   public API: the buffered writer and the unbuffered path (each piece as it
#   comes), cache none and writeback; the CLI (`snapshot -c --vmstate -` fed
#   by a pipe); and fio writing the same number of bytes sequentially in
#   1 MiB blocks to a fresh raw file (the limit: O_DIRECT io_uring depth 8
#   for none, buffered + fsync for writeback).
#   load the state back (read-ahead reader) vs fio sequential 1 MiB reads.
# Peak memory: the writer's buffers (from the library) and the process's
# maximum RSS from /usr/bin/time -v.
# Usage: bench/vmstate.sh [--json FILE] [--dir SCRATCH] [RUNS] [SIZE]
#   (default 3 runs of 2 GiB in /var/tmp; --json also writes every run's
#   seconds per measurement and the memory figures, for bench/suite.py)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
json="" scratch=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=$2; shift 2 ;;
    --dir) scratch=$2; shift 2 ;;
    *) break ;;
  esac
done
runs=${1:-3}
size=${2:-$((2 << 30))}
gen="$top/build/bench/qk-vmstate-gen"
qk="${QCOWKIT_BIN:-$top/build/tools/qcowkit}"
dir=$(mktemp -d "$scratch/qk-vmbench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
img="$dir/vm.qcow2"
raw="$dir/limit.raw"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; if (m>0) printf "%.0f", 100*(a[NR]-a[1])/(2*m); else print 0}'; }

declare -A res
add() { res[$1]="${res[$1]:-} $2"; }
maxrss=() bufpeak=() clirss=()

fresh() { rm -f "$img"; "$qk" create -q -f qcow2 "$img" $((64 << 30)); }

# seconds from `gen save/load`, recording memory for the buffered writer
gen_run() { # label args...
  local label=$1; shift
  local out
  out=$(/usr/bin/time -v "$gen" "$@" 2>"$dir/time.log")
  add "$label" "$(sed 's/.*seconds=\([0-9.]*\).*/\1/' <<<"$out")"
  if [ "$label" = save-buf-none ]; then
    bufpeak+=("$(sed 's/.*peak_buffers=\([0-9]*\).*/\1/' <<<"$out")")
    maxrss+=("$(awk '/Maximum resident/ {print $6}' "$dir/time.log")")
  fi
}

fio_run() { # label rw direct
  local label=$1 rw=$2 direct=$3 extra=()
  if [ "$direct" = 1 ]; then extra=(--ioengine=io_uring --iodepth=8); else extra=(--ioengine=psync --end_fsync=1); fi
  [ "$rw" = write ] && rm -f "$raw"
  local bw
  bw=$(fio --name=vm --filename="$raw" --rw="$rw" --bs=1M --size="$size" --direct="$direct" \
         --fallocate=none "${extra[@]}" --output-format=json 2>/dev/null |
       python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$rw']; print('%.3f' % (j['io_bytes']/j['bw_bytes'] if j['bw_bytes'] else 0))")
  add "$label" "$bw"
}

for ((i = 0; i < runs; i++)); do
  for cache in none writeback; do
    fresh; gen_run "save-buf-$cache" save "$img" s "$size" -t "$cache"
    if [ "$cache" = none ]; then gen_run load-buf-none load "$img" s -t none; fi
    fresh; gen_run "save-unbuf-$cache" save "$img" s "$size" -t "$cache" -u
    fresh
    t0=$(date +%s.%N)
    "$gen" stream "$size" | /usr/bin/time -v "$qk" snapshot -c s --vmstate - -t "$cache" "$img" 2>"$dir/cli.log"
    add "save-cli-$cache" "$(printf "%.3f" "$(echo "$(date +%s.%N) - $t0" | bc)")"
    [ "$cache" = none ] && clirss+=("$(awk '/Maximum resident/ {print $6}' "$dir/cli.log")")
    fio_run "fio-write-$cache" write "$([ $cache = none ] && echo 1 || echo 0)"
  done
  fio_run fio-read-none read 1
  rm -f "$img" "$raw"
done

if [ -n "$json" ]; then
  {
    printf '{"size": %s, "runs": %s, "seconds": {' "$size" "$runs"
    sep=""
    for k in "${!res[@]}"; do
      printf '%s"%s": [%s]' "$sep" "$k" "$(echo ${res[$k]} | tr ' ' ',')"
      sep=", "
    done
    printf '}, "writer_peak_buffers": [%s], "save_maxrss_kib": [%s], "cli_maxrss_kib": [%s]}\n' \
      "$(IFS=,; echo "${bufpeak[*]}")" "$(IFS=,; echo "${maxrss[*]}")" "$(IFS=,; echo "${clirss[*]}")"
  } >"$json"
fi

gib=$(echo "scale=3; $size / 1073741824" | bc)
row() { # label key
  local vals m s
  vals=$(tr ' ' '\n' <<<"${res[$2]}" | grep .)
  m=$(median <<<"$vals"); s=$(spread <<<"$vals")
  printf '| %s | %.2f ± %s%% | %.0f |\n' "$1" "$m" "$s" "$(echo "$size / 1048576 / $m" | bc -l)"
}
echo "## VM state, $gib GiB migration-like stream ($runs runs, median ± spread; $(nproc) cores)"
echo
echo "| save | seconds | MB/s |"
echo "|---|---|---|"
row "qcowkit buffered writer (API), cache=none" save-buf-none
row "qcowkit unbuffered (each piece as it comes), cache=none" save-unbuf-none
row "qcowkit snapshot -c --vmstate - (pipe), cache=none" save-cli-none
row "fio sequential 1 MiB O_DIRECT io_uring depth 8 (limit)" fio-write-none
row "qcowkit buffered writer (API), cache=writeback" save-buf-writeback
row "qcowkit unbuffered, cache=writeback" save-unbuf-writeback
row "qcowkit snapshot -c --vmstate - (pipe), cache=writeback" save-cli-writeback
row "fio sequential 1 MiB buffered + fsync (limit)" fio-write-writeback
echo
echo "| load | seconds | MB/s |"
echo "|---|---|---|"
row "qcowkit reader with read-ahead, cache=none" load-buf-none
row "fio sequential 1 MiB O_DIRECT read depth 8" fio-read-none
echo
echo "Writer buffers at peak: $(printf '%s\n' "${bufpeak[@]}" | median) bytes (4 workers + 1 of 1 MiB allowed)."
echo "Max RSS: generator + library $(printf '%s\n' "${maxrss[@]}" | median) KiB (includes its 64 MiB data pool);" \
     "qcowkit snapshot (pipe) $(printf '%s\n' "${clirss[@]}" | median) KiB."
