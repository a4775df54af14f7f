#!/usr/bin/env bash
# Writes into clusters that a snapshot shares, on images with extended L2
# entries, against qemu-io on twin images: the copy covers the span from
# the cluster's first to its last allocated subcluster and the write's
# own; subclusters outside it keep their zero bits or stay unallocated
# (a backing file keeps showing through them), as QEMU leaves them. Each
# twin then has the same map as qemu-io's (what each layer holds), reads
# the same, passes qemu-img check, and reads the snapshot as before.
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

qemu-img create -q -f qcow2 base.qcow2 8M
qemu-io -c 'write -P 0x55 0 8M' base.qcow2 >/dev/null
# Allocated subclusters in the middle of clusters, zero ones around them.
setup=(-c 'write -P 0x11 8k 2k' -c 'write -z 4k 2k' -c 'write -z 40k 2k'
       -c 'write -P 0x12 1M 4k' -c 'write -P 0x13 1200k 2k' -c 'write -z 2M 64k'
       -c 'write -P 0x14 3000k 100k')
# Before, inside, between and after them; one past the last table entry.
writes=(-c 'write -P 0x21 20k 2k' -c 'write -P 0x22 0 1k' -c 'write -P 0x23 1100k 3k'
        -c 'write -P 0x24 1025k 1k' -c 'write -P 0x25 2100k 1000' -c 'write -P 0x26 3500k 64k'
        -c 'write -z 2950k 10k')
for cs in 65536 2M; do
  for backing in no yes; do
    what="cluster_size=$cs, backing file $backing"
    for t in q k; do
      rm -f $t.qcow2
      if [ $backing = yes ]; then
        qemu-img create -q -f qcow2 -o cluster_size=$cs,extended_l2=on -b base.qcow2 -F qcow2 $t.qcow2
      else
        qemu-img create -q -f qcow2 -o cluster_size=$cs,extended_l2=on $t.qcow2 8M
      fi
      qemu-io "${setup[@]}" $t.qcow2 >/dev/null
      qemu-img snapshot -c s $t.qcow2
    done
    cp q.qcow2 before.qcow2
    twin_io "$what: writes" "${writes[@]}"
    qemu-img compare q.qcow2 k.qcow2 >o.txt 2>&1 || { bad "$what: reads differently"; cat o.txt; }
    qemu-img snapshot -a s k.qcow2
    qemu-img compare before.qcow2 k.qcow2 >o.txt 2>&1 || { bad "$what: the snapshot changed"; cat o.txt; }
  done
done
exit $fail
