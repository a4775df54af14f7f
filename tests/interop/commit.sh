#!/usr/bin/env bash
# qcowkit commit against qemu-img commit on twin copies of the same backing chains
# (commit.py): exit codes, messages, content of every layer, check, and
# the top's allocation after the commit.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run commit
