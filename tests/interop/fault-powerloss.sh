#!/usr/bin/env bash
# A failed flush or header write, then power loss, in each command that
# switches the header to new metadata (fault-powerloss.py): every crash
# state passes qemu-img check and reads as before or after the command.
# The commands run under the sanitizer build: these are error paths.
set -eu
. "$(dirname "$0")/twin-lib.bash"
QCOWKIT=${QCOWKIT_ASAN:-${QCOWKIT:-}} twin_run fault-powerloss
