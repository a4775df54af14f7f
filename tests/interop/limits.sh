#!/usr/bin/env bash
# Hostile images under prlimit (1 GiB address space, 30 s CPU): info, check
# and map end in time with a clear error (doc/limits.md). The plain build:
# ASan cannot run under a 1 GiB address-space limit.
set -eu
exec python3 "$SRC_DIR/tests/interop/limits.py" "$QCOWKIT" "$TEST_DIR"
