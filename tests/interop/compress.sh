#!/usr/bin/env bash
# Compressed cluster writes: qcowkit io write -c against qemu-io write -c
# on twin images (compress.py): output, content, check, compressed share.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run compress
