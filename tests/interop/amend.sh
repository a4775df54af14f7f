#!/usr/bin/env bash
# qcowkit amend against qemu-img amend on twin copies (amend.py): compat
# up and down, refcount widths, lazy refcounts, size, qemu-img's messages
# and exit codes, content and snapshots kept, check clean.
set -eu
. "$(dirname "$0")/twin-lib.bash"
twin_run amend
