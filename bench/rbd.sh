#!/usr/bin/env bash
# RBD on a throwaway single-node Ceph cluster (tests/interop/ceph-lib.bash:
# one bluestore OSD on a sparse file, all on this machine's disk):
#  - import: a SIZE qcow2 (default 4 GiB; every other 64 MiB holds data,
#    a quarter of that written as zeros) converted into a new RBD image by
#    `qcowkit convert`, `qemu-img convert -m 16 -W`, and `rbd import` of
#    the equivalent (sparse) raw file;
#  - 4k random writes at depth 32 on a written 1 GiB RBD image:
#    `qcowkit bench` against `rbd bench` (COUNT writes each), both
#    without librbd's cache (qcowkit never turns it on by itself).
# RUNS runs (default 3) in rotating order, medians; every import is
# checked against the source by qemu-img compare once. Prints a Markdown
# table. QCOWKIT overrides the binary.
# Usage: bench/rbd.sh [--runs N] [--dir DIR] [--size SIZE]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
QK=${QCOWKIT:-$top/build/tools/qcowkit}
runs=3 dir=/var/tmp size=4G count=${COUNT:-50000}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --dir) dir=$2; shift ;;
    --size) size=$2; shift ;;
    *) echo "usage: bench/rbd.sh [--runs N] [--dir DIR] [--size SIZE]" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$QK" ] || bash "$top/scripts/build.sh" >/dev/null
. "$top/tests/interop/ceph-lib.bash"
work=$(mktemp -d "$dir/qk-rbd-bench.XXXXXX")
trap 'ceph_stop; rm -rf "$work"' EXIT
ceph_start "$work/ceph" >&2 || exit 1
P=$CEPH_POOL

median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The source: data in every other 64 MiB, a quarter of it zeros.
qemu-img create -q -f qcow2 "$work/src.qcow2" "$size"
bytes=$("$QK" info --output=json "$work/src.qcow2" | sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')
python3 -c "
c = 64 << 20
for i, off in enumerate(range(0, $bytes, 2 * c)):
    print('write -P 0x%02x %d %d' % (i % 200 + 17, off, c))
    print('write -z %d %d' % (off + c // 4, c // 4))" | "$QK" io "$work/src.qcow2" > /dev/null
qemu-img convert -O raw "$work/src.qcow2" "$work/src.raw"
data=$("$QK" map --output=json "$work/src.qcow2" | python3 -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["data"]))')

import_run() { # SYSTEM: the seconds (ms) one import into a fresh image took
  rbd rm --no-progress "$P/t" >/dev/null 2>&1 || true
  local t0 t1
  t0=$(ms)
  case "$1" in
    qcowkit) "$QK" convert -O raw "$work/src.qcow2" "rbd:$P/t" ;;
    qemu-img) qemu-img convert -m 16 -W -O raw "$work/src.qcow2" "rbd:$P/t" ;;
    rbd-import) rbd import --no-progress "$work/src.raw" "$P/t" >/dev/null ;;
  esac
  t1=$(ms)
  echo $((t1 - t0))
}

systems=(qcowkit qemu-img rbd-import)
for s in "${systems[@]}"; do : > "$work/imp.$s"; done
for ((r = 0; r < runs; r++)); do
  for ((k = 0; k < ${#systems[@]}; k++)); do
    s=${systems[$(( (k + r) % ${#systems[@]} ))]}
    import_run "$s" >> "$work/imp.$s"
    if [ "$r" -eq 0 ]; then
      qemu-img compare -q -F raw "$work/src.qcow2" "rbd:$P/t" || { echo "$s: the import differs" >&2; exit 1; }
    fi
    echo "import $s run $((r + 1)): $(tail -n 1 "$work/imp.$s") ms" >&2
  done
done
rbd rm --no-progress "$P/t" >/dev/null 2>&1 || true

# 4k random writes at depth 32 on a written image.
rbd create --size 1G "$P/w"
rbd bench --io-type write --io-size 4M --io-threads 4 --io-total 1G --io-pattern seq "$P/w" >/dev/null 2>&1
: > "$work/bench.qcowkit"; : > "$work/bench.rbd"
bench_run() { # SYSTEM: IOPS
  local t0 t1
  case "$1" in
    qcowkit)
      # Its own timing, as rbd bench's: the requests, not the connection.
      "$QK" bench -c "$count" -d 32 -w -s 4k -S 165900288 "rbd:$P/w" |
        awk -v n="$count" '/^Run completed in/ {printf "%d\n", n / $4}' ;;
    rbd)
      # librbd's cache off, as qcowkit runs it (see block/rbd.c).
      rbd bench --rbd_cache=false --io-type write --io-size 4K --io-threads 32 --io-total $((count * 4096)) \
        --io-pattern rand "$P/w" 2>/dev/null | awk '/^elapsed:/ {for (i = 1; i <= NF; i++) if ($i == "ops/sec:") print int($(i + 1))}' ;;
  esac
}
for ((r = 0; r < runs; r++)); do
  for s in $([ $((r % 2)) -eq 0 ] && echo "qcowkit rbd" || echo "rbd qcowkit"); do
    bench_run "$s" >> "$work/bench.$s"
    echo "bench $s run $((r + 1)): $(tail -n 1 "$work/bench.$s") IOPS" >&2
  done
done

qi=$(median < "$work/imp.qcowkit"); qq=$(median < "$work/imp.qemu-img"); qr=$(median < "$work/imp.rbd-import")
bq=$(median < "$work/bench.qcowkit"); br=$(median < "$work/bench.rbd")
echo "| RBD, one bluestore OSD on this disk ($runs runs, medians) | qcowkit | qemu-img | rbd | qcowkit / other |"
echo "|---|---|---|---|---|"
awk -v a="$qi" -v b="$qq" -v c="$qr" -v sz="$size" -v d="$data" 'BEGIN {
  printf "| import a %s qcow2 (%.1f GiB of data) | %.2f s | %.2f s (-m 16 -W) | %.2f s (rbd import) | %.2f× qemu-img, %.2f× rbd import |\n",
         sz, d / 1073741824, a / 1000, b / 1000, c / 1000, a / b, a / c }'
awk -v a="$bq" -v c="$br" -v n="$count" 'BEGIN {
  printf "| 4k random writes, depth 32, %d writes | %d IOPS | – | %d IOPS (rbd bench) | %.2f× rbd bench |\n", n, a, c, a / c }'
