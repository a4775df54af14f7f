#!/usr/bin/env bash
# qcowkit rebase against qemu-img rebase on twin copies of the same images
# (rebase.py): exit codes, messages, backing file recorded, content kept,
# check clean.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run rebase
