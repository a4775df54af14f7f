#!/usr/bin/env bash
# Hostile and broken NBD clients (tests/interop/nbd-badclient.py): every
# mistake gets the NBD error proto.md asks for, or closes only that
# client; afterwards the server still serves others (nbdinfo), a client
# killed mid-write leaves a qcow2 image qemu-img check accepts, and
# SIGTERM still shuts down cleanly. Plain and ASan builds.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
. "$SRC_DIR/tests/interop/nbd-cases.bash"

for bin in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f rw.qcow2 ro.raw
  qemu-img create -q -f qcow2 rw.qcow2 64M || fail "create"
  # Written, not sparse: a read of it must fill its buffer (the memory check).
  head -c 64M /dev/zero | tr "\\0" "\\1" >ro.raw
  nbd_badinput_case "$bin" rw.qcow2 ro.raw
done
