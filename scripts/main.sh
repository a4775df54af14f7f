#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs qcowkit on
# scratch images: a short tour of the tool, then the benchmarks.
# Usage: scripts/main.sh [--quick | --full] [--runs N] [--only SUBSTR]
#   (default: 3 runs of every workload, about half an hour; --quick: 1 run
#   with smaller counts, a few minutes)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash scripts/deps.sh
bash scripts/build.sh >/dev/null
qk="$top/build/tools/qcowkit"
dir=$(mktemp -d /var/tmp/qcowkit-main.XXXXXX)
trap 'rm -rf "$dir"' EXIT

echo "== tour: create, write, read back, info, check, map"
set -x
"$qk" create -f qcow2 "$dir/disk.qcow2" 1G
"$qk" io -c 'write -P 0xab 0 1M' -c 'write -z 4M 64k' -c 'read -P 0xab 0 1M' "$dir/disk.qcow2"
"$qk" info "$dir/disk.qcow2"
"$qk" check "$dir/disk.qcow2"
"$qk" map "$dir/disk.qcow2"
set +x

echo
echo "== benchmark suite (qcowkit vs qemu-img vs fio; tables also in bench/results/)"
python3 bench/suite.py "$@"
echo
echo "== runtime micro-benchmarks"
runs=3
[ "${1:-}" = "--quick" ] && runs=1
bash bench/runtime.sh "$runs" 2
