#!/usr/bin/env bash
# The nbd client driver (libnbd, asynchronous) against qemu-nbd and against
# `qcowkit serve` over TCP on 127.0.0.1: the loopback unit test's client
# checks pointed at qemu-nbd (QK_NBD_TEST_URI), then `qcowkit info`, `io`
# and `map` on nbd URIs with the results compared to qemu's tools.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
UNIT=$SRC_DIR/build/tests/test_nbd_loopback
UNIT_ASAN=$SRC_DIR/build-asan/tests/test_nbd_loopback

truncate -s 16M q.raw
qemu-nbd -f raw -x d -k "$PWD/q.sock" -t --cache=writeback q.raw &
NBD_PIDS+=("$!")
for i in $(seq 200); do [ -S q.sock ] && break; sleep 0.05; done
quri="nbd+unix:///d?socket=$PWD/q.sock"
QK_NBD_TEST_URI=$quri "$UNIT" || fail "client checks against qemu-nbd"
QK_NBD_TEST_URI=$quri "$UNIT_ASAN" || fail "client checks against qemu-nbd (ASan)"

port=$((20000 + $$ % 20000))
qemu-img create -q -f qcow2 s.qcow2 32M
start_serve "$QK_ASAN" pid --bind 127.0.0.1 --port "$port" --export name=s,file=s.qcow2
spid=$SERVE_PID
suri=nbd://127.0.0.1:$port/s
for bin in "$QK_PLAIN" "$QK_ASAN"; do
  for uri in "$quri" "$suri"; do
    "$bin" info "$uri" > info.txt || fail "info $uri"
    grep -q '^file format: raw' info.txt || fail "info format $uri"
    "$bin" io -c 'write -P 0x3c 64k 64k' -c 'write -z 1M 64k' "$uri" > /dev/null || fail "io write $uri"
    "$bin" io -c 'read -P 0x3c 64k 64k' -c 'read -P 0 1M 64k' "$uri" > io.txt || fail "io read $uri"
    grep -q 'verification failed' io.txt && fail "pattern mismatch $uri"
    qemu-io -f raw -c 'read -P 0x3c 64k 64k' "$uri" | grep -q 'verification failed' && fail "qemu-io disagrees $uri"
    "$bin" map "$uri" > map.qk || fail "map $uri"
    qemu-img map -f raw "$uri" > map.qemu
    diff -u map.qemu map.qk || fail "map differs from qemu-img map for $uri"
  done
done
# A missing export and a dead server fail cleanly.
"$QK_PLAIN" info "nbd+unix:///nope?socket=$PWD/q.sock" >/dev/null 2>&1 && fail "opened a missing export"
"$QK_PLAIN" info "nbd+unix:///d?socket=$PWD/none.sock" >/dev/null 2>&1 && fail "opened a missing socket"
stop_serve "$spid"
qemu-img check -q s.qcow2 || fail "qemu-img check"
echo ok
