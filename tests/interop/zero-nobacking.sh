#!/usr/bin/env bash
# Zero writes on a version 3 image that has no backing file, against
# qemu-io on twin images: the zeros are recorded (zero flags or zero
# subcluster bits, with an L2 table allocated for them where there was
# none), even where the cluster was unallocated and so read as zeros
# already. Otherwise a backing file attached later (`rebase -u`, as a
# backup chain is put back together) would show through what the guest
# zeroed. Each twin then has the same map as qemu-io's, and after
# `rebase -u` onto a base full of data both still read the same (the
# zeroed ranges as zeros). Zero writes come from `qcowkit io` and from an
# NBD client through `qcowkit serve`. The run uses the ASan build when
# there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

# whole clusters, unaligned, one sector, with unmap, and past the first
# L2 table of a 512-byte-cluster image
zeros=(-c 'write -z 64k 192k' -c 'write -z 300000 5000' -c 'write -z 1M 512'
       -c 'write -z -u 2M 100k' -c 'write -z 3000000 70000')
for opts in cluster_size=512 cluster_size=65536 cluster_size=65536,extended_l2=on \
            cluster_size=2M cluster_size=2M,extended_l2=on; do
  for pre in none some; do
    what="$opts, $pre data first"
    for t in q k; do
      rm -f $t-base.qcow2 $t.qcow2
      qemu-img create -q -f qcow2 $t-base.qcow2 4M
      qemu-io -c 'write -P 0x55 0 4M' $t-base.qcow2 >/dev/null
      qemu-img create -q -f qcow2 -o "$opts" $t.qcow2 4M
      [ $pre = some ] && qemu-io -c 'write -P 0x22 0 4096' $t.qcow2 >/dev/null
    done
    twin_io "$what: write -z" "${zeros[@]}"
    qemu-img rebase -u -b q-base.qcow2 -F qcow2 q.qcow2
    "$QK" rebase -u -b k-base.qcow2 -F qcow2 k.qcow2 || bad "$what: rebase -u"
    qemu-img compare q.qcow2 k.qcow2 >o.txt 2>&1 || { bad "$what: reads differently after rebase -u"; cat o.txt; }
    qemu-io -c 'read -P 0 64k 192k' -c 'read -P 0 300000 5000' -c 'read -P 0 1M 512' \
      -c 'read -P 0 2M 100k' -c 'read -P 0 3000000 70000' k.qcow2 >o.txt 2>&1
    grep -q 'Pattern verification failed' o.txt && { bad "$what: zeroed ranges show the new backing file"; head -3 o.txt; }
  done
done

# The same through an NBD export (WRITE_ZEROES, with and without
# NBD_CMD_FLAG_NO_HOLE).
qemu-img create -q -f qcow2 base.qcow2 4M
qemu-io -c 'write -P 0x55 0 4M' base.qcow2 >/dev/null
qemu-img create -q -f qcow2 n.qcow2 4M
"$QK" serve --socket nbd.sock --export name=e,file=n.qcow2,format=qcow2 2>serve.err &
srv=$!
for _ in $(seq 200); do [ -S nbd.sock ] && break; sleep 0.025; done
qemu-io -f raw -c 'write -z 64k 64k' -c 'write -z -u 1M 100k' 'nbd+unix:///e?socket=nbd.sock' >o.txt 2>&1 ||
  { bad "NBD write zeroes"; cat o.txt; }
kill -TERM $srv; wait $srv || { bad "serve exited $?"; cat serve.err; }
"$QK" rebase -u -b base.qcow2 -F qcow2 n.qcow2 || bad "NBD: rebase -u"
qemu-io -c 'read -P 0 64k 64k' -c 'read -P 0 1M 100k' -c 'read -P 0x55 0 64k' n.qcow2 >o.txt 2>&1
grep -q 'Pattern verification failed' o.txt && { bad "NBD: zeroed ranges show the new backing file"; cat o.txt; }
qemu-img check -q n.qcow2 || bad "NBD: check"
exit $fail
