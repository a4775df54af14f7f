#!/usr/bin/env bash
# qcowkit compare against qemu-img compare on the same images (compare.py):
# exit codes and messages, first mismatch offsets, strict mode.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run compare
