#!/usr/bin/env bash
# qcowkit convert against qemu-img convert on the same inputs (convert.py):
# exit codes, messages, output content, format, sizes, backing file and a
# clean `qemu-img check`.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run convert
