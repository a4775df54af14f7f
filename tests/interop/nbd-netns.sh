#!/usr/bin/env bash
# Two hosts: two network namespaces joined by a veth pair. `qcowkit serve`
# listens on TCP inside one; nbdinfo, qemu-io and nbdcopy in the other
# reach it over nbd://. Also checks that the server is not reachable on
# the address it was not bound to. Skips (77) only where namespaces cannot
# be created (no root or no netns support).
. "$SRC_DIR/tests/interop/nbd-lib.bash"

netns_pair qk 10.200.7

qemu-img create -q -f qcow2 disk.qcow2 32M || fail "create"
for bin in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f pid
  ip netns exec "$ns1" "$bin" serve --pidfile "$PWD/pid" --bind 10.200.7.1 --port 10809 \
    --export name=disk,file=disk.qcow2,format=qcow2 &
  pid=$!
  NBD_PIDS+=("$pid")
  for i in $(seq 400); do [ -s pid ] && break; sleep 0.05; done
  [ -s pid ] || fail "server did not start"
  uri=nbd://10.200.7.1:10809/disk
  [ "$(ip netns exec "$ns2" nbdinfo --size "$uri")" = 33554432 ] || fail "nbdinfo across namespaces"
  ip netns exec "$ns2" qemu-io -f raw -c 'write -P 0x5c 1M 256k' "$uri" >/dev/null || fail "qemu-io write"
  ip netns exec "$ns2" qemu-io -f raw -c 'read -P 0x5c 1M 256k' "$uri" | grep -q 'verification failed' &&
    fail "pattern mismatch across namespaces"
  ip netns exec "$ns2" nbdcopy "$uri" "$PWD/copy.raw" || fail "nbdcopy across namespaces"
  # The export is not on the namespace's loopback: bound to one address only.
  ip netns exec "$ns1" nbdinfo --size nbd://127.0.0.1:10809/disk >/dev/null 2>&1 &&
    fail "reachable on an address it was not bound to"
  stop_serve "$pid"
  qemu-img compare -q -f raw -F qcow2 copy.raw disk.qcow2 || fail "copy differs"
  qemu-img check -q disk.qcow2 || fail "qemu-img check"
  echo "ok $(basename "$bin")"
done
