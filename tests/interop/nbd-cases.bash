# The NBD checks a file export and an RBD export must both pass
# (nbd-peers.sh and nbd-badinput.sh run them on files, rbd.sh on rbd:
# images). Needs nbd-lib.bash sourced first.

# IMG (a file or an rbd: name, FMT raw or qcow2, 64 MiB, made by the
# caller) exported as "disk" by BIN; TAG names the case in messages.
nbd_peers_case() { # binary format image tag
  local bin=$1 fmt=$2 img=$3 tag=$4
  local sock=$PWD/nbd.sock uri
  uri="nbd+unix:///disk?socket=$sock"
  start_serve "$bin" pid --socket "$sock" --export "name=disk,file=$img,format=$fmt"
  local pid=$SERVE_PID

  [ "$(nbdinfo --size "$uri")" = 67108864 ] || fail "$tag: nbdinfo size"
  nbdinfo "$uri" > info.txt || fail "$tag: nbdinfo"
  grep -q 'base:allocation' info.txt || fail "$tag: no base:allocation context"
  grep -q 'block_size_maximum: 33554432' info.txt || fail "$tag: block size"
  nbdinfo --list "$uri" | grep -q 'export="disk"' || fail "$tag: export list"

  qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'write -P 0xcd 5M 64k' -c 'write -z 10M 1M' \
    -c 'write -P 0xee 20M 8k' -c 'discard 20M 8k' -c 'flush' "$uri" > qio.txt || fail "$tag: qemu-io"
  # (Discarded bytes are unspecified by the protocol: not checked.)
  qemu-io -f raw -c 'read -P 0xab 0 1M' -c 'read -P 0xcd 5M 64k' -c 'read -P 0 10M 1M' \
    "$uri" > qio2.txt || fail "$tag: qemu-io read back"
  grep -q 'Pattern verification failed' qio2.txt && fail "$tag: pattern mismatch over NBD"

  nbdinfo --map "$uri" > map.txt || fail "$tag: map"
  grep -q 'data' map.txt || fail "$tag: map has no data"
  grep -q 'hole,zero' map.txt || fail "$tag: map has no hole"

  qemu-img info "$uri" | grep -q 'virtual size: 64 MiB' || fail "$tag: qemu-img info"

  # nbdcopy in: random data with a sparse tail; then out again.
  head -c 6M /dev/urandom > in.raw
  truncate -s 64M in.raw
  nbdcopy in.raw "$uri" || fail "$tag: nbdcopy in"
  rm -f out.raw
  nbdcopy "$uri" out.raw || fail "$tag: nbdcopy out"
  cmp in.raw out.raw || fail "$tag: nbdcopy round trip differs"
  qemu-img compare -q -f raw -F raw in.raw "$uri" || fail "$tag: qemu-img compare over NBD"

  # Short fio smoke run through its NBD engine.
  fio --name=smoke --ioengine=nbd --uri="$uri" --rw=randrw --bs=4k --iodepth=16 \
      --size=64M --time_based=1 --runtime=2 --output=fio.txt || fail "$tag: fio"
  grep -q 'err= 0' fio.txt || fail "$tag: fio reported errors"
  # fio wrote random data: put the known content back for the file check.
  nbdcopy in.raw "$uri" || fail "$tag: nbdcopy restore"

  stop_serve "$pid"
  # The image itself, read without the server.
  qemu-img compare -q -f raw -F "$fmt" in.raw "$img" || fail "$tag: image differs from what was copied in"
  if [ "$fmt" = qcow2 ]; then
    qemu-img check -q -f qcow2 "$img" || fail "$tag: qemu-img check"
  fi
  echo "ok $tag $(basename "$bin")"
}

# Hostile clients against BIN serving RW (a 64 MiB qcow2: a file or an
# rbd: name) as "rw" and RO (64 MiB raw) read-only as "ro".
nbd_badinput_case() { # binary rw-image ro-image
  local bin=$1 rw=$2 ro=$3
  start_serve "$bin" pid --socket "$PWD/nbd.sock" \
    --export "name=rw,file=$rw,format=qcow2" --export "name=ro,file=$ro,format=raw,readonly=on"
  local pid=$SERVE_PID
  python3 "$SRC_DIR/tests/interop/nbd-badclient.py" "$PWD/nbd.sock" "$pid" || fail "bad client checks ($bin, $rw)"
  kill -0 "$pid" || fail "server died ($rw)"
  [ "$(nbdinfo --size "nbd+unix:///rw?socket=$PWD/nbd.sock")" = 67108864 ] || fail "server no longer serves ($rw)"
  nbdinfo "nbd+unix:///ro?socket=$PWD/nbd.sock" | grep -q 'is_read_only: true' || fail "ro flag ($rw)"
  stop_serve "$pid"
  qemu-img check -q -f qcow2 "$rw" || fail "qemu-img check after a client died mid-write ($rw)"
  qemu-io -f qcow2 -c 'read -P 0x42 1M 4k' "$rw" | grep -q 'verification failed' && fail "FUA write lost ($rw)"
  echo "ok $rw $(basename "$bin")"
}
