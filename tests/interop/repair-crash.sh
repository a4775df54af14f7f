#!/usr/bin/env bash
# A check -r all interrupted at any point leaves the image no worse than
# before (repair_crash.py: the repair's writes recorded with strace and
# replayed up to every crash point). Short form: the damage kinds that
# rebuild the refcount structure or change OFLAG_COPIED, one seed; every
# kind runs with `bash tests/interop/repair.sh --long`.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
QCOWKIT=${QCOWKIT:-$top/build/tools/qcowkit}
command -v strace >/dev/null && command -v qemu-img >/dev/null || { echo "strace/qemu-img missing"; exit 77; }
base=${TEST_DIR:-/tmp}
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
work=$(mktemp -d "$base/qk-repair-crash.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$top/tests/interop/repair_crash.py" "$QCOWKIT" "$work" \
  --kinds rt_entry_zero,l2_into_refblock,l2_shared,copied_l1,refblock_bitflip --max-states 10 "$@"
