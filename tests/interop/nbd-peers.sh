#!/usr/bin/env bash
# `qcowkit serve` against real NBD peers: nbdinfo (size, contexts, map),
# nbdcopy both ways, qemu-img info/compare, qemu-io writing patterns that
# are then verified in the image file itself, and a short fio run. For raw
# and qcow2 images, with the plain and the ASan build.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
. "$SRC_DIR/tests/interop/nbd-cases.bash"

for bin in "$QK_PLAIN" "$QK_ASAN"; do
  for fmt in raw qcow2; do
    rm -f "img.$fmt"
    qemu-img create -q -f "$fmt" "img.$fmt" 64M || fail "create $fmt"
    nbd_peers_case "$bin" "$fmt" "img.$fmt" "$fmt"
  done
done
