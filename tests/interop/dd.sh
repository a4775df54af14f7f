#!/usr/bin/env bash
# qcowkit dd against qemu-img dd on the same inputs (dd.py): exit codes,
# messages, output size, format and content.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run dd
