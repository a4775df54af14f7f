#!/usr/bin/env bash
# Hostile and broken NBD clients (tests/interop/nbd-badclient.py): every
# mistake gets the NBD error proto.md asks for, or closes only that
# client; afterwards the server still serves others (nbdinfo), a client
# killed mid-write leaves a qcow2 image qemu-img check accepts, and
# SIGTERM still shuts down cleanly. Plain and ASan builds.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

for bin in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f rw.qcow2 ro.raw
  qemu-img create -q -f qcow2 rw.qcow2 64M || fail "create"
  truncate -s 64M ro.raw
  start_serve "$bin" pid --socket "$PWD/nbd.sock" \
    --export name=rw,file=rw.qcow2,format=qcow2 --export name=ro,file=ro.raw,format=raw,readonly=on
  pid=$SERVE_PID
  python3 "$SRC_DIR/tests/interop/nbd-badclient.py" "$PWD/nbd.sock" || fail "bad client checks ($bin)"
  kill -0 "$pid" || fail "server died"
  [ "$(nbdinfo --size "nbd+unix:///rw?socket=$PWD/nbd.sock")" = 67108864 ] || fail "server no longer serves"
  nbdinfo "nbd+unix:///ro?socket=$PWD/nbd.sock" | grep -q 'is_read_only: true' || fail "ro flag"
  stop_serve "$pid"
  qemu-img check -q rw.qcow2 || fail "qemu-img check after a client died mid-write"
  qemu-io -f qcow2 -c 'read -P 0x42 1M 4k' rw.qcow2 | grep -q 'verification failed' && fail "FUA write lost"
  echo "ok $(basename "$bin")"
done
