#!/usr/bin/env bash
# Fault injection (tests/interop/fault.py): every kind of host write and
# flush made to fail, the error surfaces, qemu-img check stays 0 or 3 and
# flushed data stays intact.
#   short form (tests/run.sh): the first and last N per kind and step, EIO
#     once (ASan build), then ENOSPC with the disk dead from the Nth write on
#     (O_DIRECT, plain build, to stay within run.sh's 900 s on a busy machine)
#   long form: bash tests/interop/fault.sh --long [BUILD_DIR]
#     every N of every kind: EIO once, EIO sticky, ENOSPC dead with cache=none
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
long=0
[ "${1:-}" = --long ] && { long=1; shift; }
command -v qemu-img >/dev/null || { echo "qemu-img not installed"; exit 77; }
if [ "$long" = 1 ]; then
  q="$top/${1:-build}/tools/qcowkit"
  work=$(mktemp -d /var/tmp/qcowkit-fault.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  python3 "$top/tests/interop/fault.py" --long "$q" "$work"
  python3 "$top/tests/interop/fault.py" --long --mode sticky "$q" "$work"
  python3 "$top/tests/interop/fault.py" --long --mode dead --errno ENOSPC --cache none "$q" "$work"
else
  python3 "$top/tests/interop/fault.py" "$QCOWKIT_ASAN" "$TEST_DIR"
  python3 "$top/tests/interop/fault.py" --mode dead --errno ENOSPC --cache none \
    --kinds write,flush "$QCOWKIT" "$TEST_DIR"
fi
