#!/usr/bin/env bash
# Seeded random sequences where qcowkit and QEMU's tools take turns on the
# same images (tests/interop/mixed_tools.py): snapshots with compressed
# clusters, persistent dirty bitmaps, external data files, writes racing
# inside a cluster, an NBD export of qcowkit serve, and backing chains
# under commit, rebase and amend. QEMU's result is the reference. Short
# form here; the long form by hand:
#   bash tests/interop/mixed-tools.sh --seeds 300 [--kinds snap,bitmap,datafile,aio,nbd,chain] [--first S]
set -eu
command -v qemu-nbd >/dev/null && command -v nbdinfo >/dev/null || { echo "qemu-nbd/nbdinfo missing"; exit 77; }
# Images live on tmpfs when there is one: the test is about content.
work=$TEST_DIR/work
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  work=$(mktemp -d /dev/shm/qk-mixed.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--seeds "${MIXED_SEEDS:-4}")
# The racing writes and the NBD server run under the sanitizer build.
python3 "$SRC_DIR/tests/interop/mixed_tools.py" "$QCOWKIT" "$work" --asan "$QCOWKIT_ASAN" "${args[@]}"
