#!/usr/bin/env bash
# `qcowkit serve` against real NBD peers: nbdinfo (size, contexts, map),
# nbdcopy both ways, qemu-img info/compare, qemu-io writing patterns that
# are then verified in the image file itself, and a short fio run. For raw
# and qcow2 images, with the plain and the ASan build.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

run_case() { # binary format
  local bin=$1 fmt=$2
  local img=img.$fmt sock=$PWD/nbd.sock uri
  uri="nbd+unix:///disk?socket=$sock"
  rm -f "$img"
  qemu-img create -q -f "$fmt" "$img" 64M || fail "create $fmt"
  start_serve "$bin" pid --socket "$sock" --export "name=disk,file=$img,format=$fmt"
  local pid=$SERVE_PID

  [ "$(nbdinfo --size "$uri")" = 67108864 ] || fail "$fmt: nbdinfo size"
  nbdinfo "$uri" > info.txt || fail "$fmt: nbdinfo"
  grep -q 'base:allocation' info.txt || fail "$fmt: no base:allocation context"
  grep -q 'block_size_maximum: 33554432' info.txt || fail "$fmt: block size"
  nbdinfo --list "$uri" | grep -q 'export="disk"' || fail "$fmt: export list"

  qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'write -P 0xcd 5M 64k' -c 'write -z 10M 1M' \
    -c 'write -P 0xee 20M 8k' -c 'discard 20M 8k' -c 'flush' "$uri" > qio.txt || fail "$fmt: qemu-io"
  # (Discarded bytes are unspecified by the protocol: not checked.)
  qemu-io -f raw -c 'read -P 0xab 0 1M' -c 'read -P 0xcd 5M 64k' -c 'read -P 0 10M 1M' \
    "$uri" > qio2.txt || fail "$fmt: qemu-io read back"
  grep -q 'Pattern verification failed' qio2.txt && fail "$fmt: pattern mismatch over NBD"

  nbdinfo --map "$uri" > map.txt || fail "$fmt: map"
  grep -q 'data' map.txt || fail "$fmt: map has no data"
  grep -q 'hole,zero' map.txt || fail "$fmt: map has no hole"

  qemu-img info "$uri" | grep -q 'virtual size: 64 MiB' || fail "$fmt: qemu-img info"

  # nbdcopy in: random data with a sparse tail; then out again.
  head -c 6M /dev/urandom > in.raw
  truncate -s 64M in.raw
  nbdcopy in.raw "$uri" || fail "$fmt: nbdcopy in"
  rm -f out.raw
  nbdcopy "$uri" out.raw || fail "$fmt: nbdcopy out"
  cmp in.raw out.raw || fail "$fmt: nbdcopy round trip differs"
  qemu-img compare -q -f raw -F raw in.raw "$uri" || fail "$fmt: qemu-img compare over NBD"

  # Short fio smoke run through its NBD engine.
  fio --name=smoke --ioengine=nbd --uri="$uri" --rw=randrw --bs=4k --iodepth=16 \
      --size=64M --time_based=1 --runtime=2 --output=fio.txt || fail "$fmt: fio"
  grep -q 'err= 0' fio.txt || fail "$fmt: fio reported errors"
  # fio wrote random data: put the known content back for the file check.
  nbdcopy in.raw "$uri" || fail "$fmt: nbdcopy restore"

  stop_serve "$pid"
  # The image itself, read without the server.
  qemu-img compare -q -f raw -F "$fmt" in.raw "$img" || fail "$fmt: image differs from what was copied in"
  if [ "$fmt" = qcow2 ]; then
    qemu-img check -q "$img" || fail "qcow2: qemu-img check"
  fi
  echo "ok $fmt $(basename "$bin")"
}

for bin in "$QK_PLAIN" "$QK_ASAN"; do
  for fmt in raw qcow2; do
    run_case "$bin" "$fmt"
  done
done
