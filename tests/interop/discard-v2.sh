#!/usr/bin/env bash
# Discard against qemu-io on twin images: on a version 2 image with a
# backing file nothing is discarded (v2 has no zero flag, so the guest
# would read the backing file's old data), as QEMU leaves it; without a
# backing file, or on version 3, the discarded range reads as zeros. Each
# twin then reads the same through qemu-io and qemu-img compare agrees.
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

for compat in 0.10 1.1; do
  for backing in yes no; do
    for t in q k; do
      rm -f $t-base.qcow2 $t.qcow2
      qemu-img create -q -f qcow2 -o compat=$compat $t-base.qcow2 1M
      qemu-io -c 'write -P 0x11 0 1M' $t-base.qcow2 >/dev/null
      if [ $backing = yes ]; then
        qemu-img create -q -f qcow2 -o compat=$compat -b $t-base.qcow2 -F qcow2 $t.qcow2
      else
        qemu-img create -q -f qcow2 -o compat=$compat $t.qcow2 1M
      fi
      qemu-io -c 'write -P 0x22 0 256k' $t.qcow2 >/dev/null
    done
    qemu-io -c 'discard 0 128k' q.qcow2 >/dev/null || bad "compat $compat, backing $backing: qemu-io discard"
    "$QK" io -c 'discard 0 128k' k.qcow2 >o.txt 2>&1 || { bad "compat $compat, backing $backing: discard"; cat o.txt; }
    qemu-img compare q.qcow2 k.qcow2 >o.txt 2>&1 || { bad "compat $compat, backing $backing: differs from qemu-io's"; cat o.txt; }
    qemu-img check -q k.qcow2 || bad "compat $compat, backing $backing: check"
    if [ "$compat/$backing" = 0.10/yes ]; then
      qemu-io -c 'read -P 0x22 0 256k' k.qcow2 >/dev/null || bad "v2 with a backing file: the discard exposed other data"
    fi
  done
done
exit $fail
