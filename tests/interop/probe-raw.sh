#!/usr/bin/env bash
# A raw image whose format was guessed (no -f) keeps its first sector
# guessed raw, as QEMU keeps it:
#  - writing a qcow2 header there fails with EPERM, and the warning and
#    message are qemu-io's byte for byte; with -f raw the same write works;
#  - two partial writes that together would make a header: the second is
#    refused, whichever order, and the sector keeps what the first wrote;
#  - ordinary writes, zero writes and discards of the first sector, and
#    writes elsewhere, go through;
#  - an NBD client of `qcowkit serve` exporting the file without a format
#    cannot write a header either, and the server goes on serving;
#  - read-only opens print no warning;
#  - write -s repeats a source file shorter than the write, as qemu-io.
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"
. "$SRC_DIR/tests/interop/nbd-lib.bash"
trap 'nbd_cleanup; rm -rf "$work"' EXIT

qemu-img create -q -f qcow2 hdr.qcow2 1M
head -c 512 hdr.qcow2 >hdr.bin
printf 'QFI\xfb' >magic.bin
printf '\0\0\0\3' >version.bin

fresh() { rm -f r.raw; qemu-img create -q -f raw r.raw 1M; }
norm() { sed -e 's/^qemu-io:/TOOL:/' -e 's/^qcowkit:/TOOL:/' -e 's/[0-9.]* sec (.*ops\/sec)$/TIME/'; }
both() { # ARGS...: our io and qemu-io on twin fresh images, same output and status
  local qo ko
  fresh; qo=$(qemu-io "$@" r.raw 2>&1; echo "rc=$?"); cp r.raw q.raw
  fresh; ko=$("$QK" io "$@" r.raw 2>&1; echo "rc=$?")
  if [ "$(echo "$qo" | norm)" != "$(echo "$ko" | norm)" ]; then
    bad "io $*: differs from qemu-io"
    diff <(echo "$qo" | norm) <(echo "$ko" | norm)
  fi
  cmp -s q.raw r.raw || bad "io $*: the image differs from qemu-io's"
}

both -c 'write -s hdr.bin 0 512'
both -c 'write -P 5 0 4k'
both -c 'write -s magic.bin 0 4' -c 'write -s version.bin 4 4'
both -c 'write -s version.bin 4 4' -c 'write -s magic.bin 0 4'
both -c 'write -P 7 0 512' -c 'write -z 0 512' -c 'discard 0 4k' -c 'write -s hdr.bin 4096 512'
both -r -c 'read 0 512'
# A source file shorter than the write is repeated to fill it; an empty one is refused.
printf 'abc' >short.bin
: >empty.bin
both -c 'write -s short.bin 4096 1000'
both -c 'write -s empty.bin 4096 10'

fresh
"$QK" io -c 'write -s hdr.bin 0 512' r.raw >o.txt 2>&1 && bad "a header was written into a guessed raw image"
grep -q "Operation not permitted" o.txt || { bad "no EPERM"; cat o.txt; }
qemu-img info r.raw | grep -q "file format: raw" || bad "the image no longer guesses raw"
"$QK" io -f raw -c 'write -s hdr.bin 0 512' r.raw >o.txt 2>&1 || { bad "-f raw: the write was refused"; cat o.txt; }
grep -q WARNING o.txt && bad "-f raw: warned"
qemu-img info r.raw | grep -q "file format: qcow2" || bad "-f raw: the header was not written"
fresh
"$QK" io -c 'write -s magic.bin 0 4' -c 'write -s version.bin 4 4' r.raw >/dev/null 2>&1 && bad "two partial writes made a header"
cmp -n 4 magic.bin r.raw || bad "the first partial write is not on disk"

# Over NBD: the export's format is guessed the same way.
fresh
start_serve "$QK" serve.pid --socket nbd.sock --export name=d,file=r.raw
uri="nbd+unix:///d?socket=nbd.sock"
qemu-io -f raw -c 'write -s hdr.bin 0 512' "$uri" >o.txt 2>&1 && bad "NBD: a header was written"
qemu-io -f raw -c 'write -P 3 64k 4k' -c 'write -P 4 0 4k' "$uri" >o.txt 2>&1 || { bad "NBD: ordinary writes failed"; cat o.txt; }
stop_serve "$SERVE_PID"
qemu-io -f raw -c 'read -P 4 0 4k' -c 'read -P 3 64k 4k' r.raw >/dev/null || bad "NBD: the ordinary writes are not in the file"
exit $fail
