#!/usr/bin/env bash
# qcowkit resize against qemu-img resize on twin copies of the same images
# (resize.py): exit codes, messages, sizes, content, check, snapshots,
# backing files, preallocation, raw.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
QCOWKIT=${QCOWKIT:-$top/build/tools/qcowkit}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || { echo "qemu-img/qemu-io missing"; exit 77; }
# Images live on tmpfs when there is one: flushes to a shared disk would
# dominate the run time.
base=${TEST_DIR:-/tmp}
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
work=$(mktemp -d "$base/qk-resize.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$top/tests/interop/resize.py" "$QCOWKIT" "$work"
