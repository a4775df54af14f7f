#!/usr/bin/env bash
# Discard against qemu-io on twin images: on a version 2 image with a
# backing file nothing is discarded (v2 has no zero flag, so the guest
# would read the backing file's old data), as QEMU leaves it; without a
# backing file, or on version 3, the discarded range reads as zeros. Each
# twin then reads the same through qemu-io and qemu-img compare agrees.
# Zero writes the same way: on version 2 without a backing file whole
# clusters become unallocated (QEMU resorts to discard), only the edges
# are written, and the map equals qemu-io's twin's; `convert -n` into a
# fresh version 2 image writes no zeros over what reads as zeros already.
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
    zeros=(-c 'write -z 64k 192k' -c 'write -z 300000 5000' -c 'write -z 512k 512k')
    qemu-io "${zeros[@]}" q.qcow2 >/dev/null || bad "compat $compat, backing $backing: qemu-io write -z"
    "$QK" io "${zeros[@]}" k.qcow2 >o.txt 2>&1 || { bad "compat $compat, backing $backing: write -z"; cat o.txt; }
    qemu-img compare q.qcow2 k.qcow2 >o.txt 2>&1 || { bad "compat $compat, backing $backing: zeros differ from qemu-io's"; cat o.txt; }
    qemu-img check -q k.qcow2 || bad "compat $compat, backing $backing: check after write -z"
    if [ $compat = 0.10 ]; then
      qemu-img map --output=json q.qcow2 >q.map
      qemu-img map --output=json k.qcow2 >k.map
      diff q.map k.map >o.txt || { bad "compat 0.10, backing $backing: map after write -z differs from qemu-io's"; cat o.txt; }
    fi
  done
done

qemu-img create -q -f qcow2 src.qcow2 64M
qemu-io -c 'write -P 1 0 1M' -c 'write -z 8M 8M' src.qcow2 >/dev/null
for t in q k; do
  rm -f $t-dst.qcow2
  qemu-img create -q -f qcow2 -o compat=0.10 $t-dst.qcow2 64M
done
qemu-img convert -n -O qcow2 src.qcow2 q-dst.qcow2
"$QK" convert -n -O qcow2 src.qcow2 k-dst.qcow2 || bad "convert -n into a v2 image"
qemu-img compare src.qcow2 k-dst.qcow2 >o.txt 2>&1 || { bad "convert -n into v2: content"; cat o.txt; }
qemu-img map --output=json q-dst.qcow2 >q.map
qemu-img map --output=json k-dst.qcow2 >k.map
diff q.map k.map >o.txt || { bad "convert -n into v2: map differs from qemu-img's (zeros written?)"; cat o.txt; }
qemu-img check -q k-dst.qcow2 || bad "convert -n into v2: check"
exit $fail
