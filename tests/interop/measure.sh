#!/usr/bin/env bash
# qcowkit measure against qemu-img measure on the same inputs (measure.py):
# exit codes, messages and every number, human and JSON.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run measure
