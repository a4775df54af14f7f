#!/usr/bin/env bash
# Seeded random write/zero/discard/flush sequences through qemu-io and
# qcowkit io on twin images: identical content, clean qemu-img check.
set -eu
# Images live on tmpfs when there is one: the test is about content, and
# flushes to a shared disk would dominate its run time.
work=$TEST_DIR
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  work=$(mktemp -d /dev/shm/qk-diff.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
python3 "$SRC_DIR/tests/interop/diffops.py" "$QCOWKIT" "$work" --seeds "${DIFF_SEEDS:-160}"
