#!/usr/bin/env bash
# qcowkit resize against qemu-img resize on twin copies of the same images
# (resize.py): exit codes, messages, sizes, content, check, snapshots,
# backing files, preallocation, raw.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run resize
