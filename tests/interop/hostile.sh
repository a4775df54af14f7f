#!/usr/bin/env bash
# Hostile and truncated images against the ASan/UBSan build: clear errors,
# no crash, file unchanged.
set -eu
exec python3 "$SRC_DIR/tests/interop/hostile.py" "$QCOWKIT_ASAN" "$TEST_DIR"
