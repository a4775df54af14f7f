#!/usr/bin/env bash
# Two hosts: two network namespaces joined by a veth pair. `qcowkit serve`
# listens on TCP inside one; nbdinfo, qemu-io and nbdcopy in the other
# reach it over nbd://. Also checks that the server is not reachable on
# the address it was not bound to. Skips (77) only where namespaces cannot
# be created (no root or no netns support).
. "$SRC_DIR/tests/interop/nbd-lib.bash"

tag=qk$$
ns1=${tag}a ns2=${tag}b
cleanup_ns() {
  nbd_cleanup
  ip netns del "$ns1" 2>/dev/null
  ip netns del "$ns2" 2>/dev/null
}
trap cleanup_ns EXIT

if ! ip netns add "$ns1" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and netns support)"
  exit 77
fi
ip netns add "$ns2" || fail "second namespace"
ip link add "${tag}v1" type veth peer name "${tag}v2" || fail "veth pair"
ip link set "${tag}v1" netns "$ns1" || fail "move veth 1"
ip link set "${tag}v2" netns "$ns2" || fail "move veth 2"
ip -n "$ns1" addr add 10.200.7.1/24 dev "${tag}v1"
ip -n "$ns2" addr add 10.200.7.2/24 dev "${tag}v2"
for ns in "$ns1" "$ns2"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns1" link set "${tag}v1" up
ip -n "$ns2" link set "${tag}v2" up

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
