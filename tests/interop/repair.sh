#!/usr/bin/env bash
# check -r all against qemu-img check -r all on damaged images (repair.py):
# qcowkit's repair must leave an image qemu-img judges no worse, keep every
# piece of guest data qemu-img's repair keeps, and report what a fresh
# check finds. Short form here (2 seeds, every damage kind, 512 B and
# 64 KiB clusters, refcount widths 1/16/64); the long form runs by hand:
#   bash tests/interop/repair.sh --long [--seeds N]   (cluster sizes 512 B..2 MiB,
#   refcount widths 1..64, extended L2; then repair_crash.py on every kind)
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
QCOWKIT=${QCOWKIT:-$top/build/tools/qcowkit}
QCOWKIT_ASAN=${QCOWKIT_ASAN:-$top/build-asan/tools/qcowkit}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || { echo "qemu-img/qemu-io missing"; exit 77; }
# Images live on tmpfs when there is one: flushes to a shared disk would
# dominate the run time.
base=${TEST_DIR:-/tmp}
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
work=$(mktemp -d "$base/qk-repair.XXXXXX")
trap 'rm -rf "$work"' EXIT
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--seeds 2)
python3 "$top/tests/interop/repair.py" "$QCOWKIT" "$QCOWKIT_ASAN" "$work" "${args[@]}"
if [ "${1:-}" = "--long" ] && command -v strace >/dev/null; then
  # Crash points of the repair, every damage kind.
  python3 "$top/tests/interop/repair_crash.py" "$QCOWKIT" "$work" --seeds 3 --max-states 20
fi
