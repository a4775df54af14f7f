#!/usr/bin/env bash
# Size arguments that do not parse: every command says it as qemu-img
# does, word for word and on the same two lines ("Invalid WHAT specified.
# You may use k, M, G, T, P or E suffixes for" / "kilobytes, ..."), with
# the same exit status; a hex number with a suffix is taken, with the same
# deprecation warning. A number too big or out of the option's range
# (18446744073709551616, 8E, 3G for a buffer) gets qemu-img's "Must be
# between MIN and MAX." The run uses the ASan build when there is one.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

qemu-img create -q -f raw x.raw 1M
qemu-img create -q -f qcow2 x.qcow2 1M
cases=(
  "create -f raw y.raw abc"
  "create -f raw y.raw 12Q"
  "map --start-offset=abc x.raw"
  "map --max-length=abc x.raw"
  "bench -s abc x.raw"
  "bench -o abc x.raw"
  "bench -S abc x.raw"
  "bitmap --add -g abc x.qcow2 b"
  "commit -r abc x.qcow2"
  "convert -r abc x.raw y.raw"
  "convert -S abc x.raw y.raw"
  "dd if=x.raw of=y.raw bs=abc"
  "measure --size abc -O qcow2"
  "create -f raw y.raw 0x10k"
  "create -f raw y.raw 0x1.5k"
  "map --start-offset=0x1k x.raw"
)
for v in 18446744073709551616 8E; do
  cases+=("create -f raw y.raw $v" "map --start-offset=$v x.raw" "map --max-length=$v x.raw"
          "bench -c 1 -o $v x.raw" "bench -c 1 -s $v x.raw" "bench -c 1 -S $v x.raw"
          "bitmap --add -g $v x.qcow2 b" "commit -r $v x.qcow2" "convert -r $v x.raw y.raw"
          "convert -S $v x.raw y.raw" "dd if=x.raw of=y.raw bs=$v" "dd if=x.raw of=y.raw count=$v"
          "dd if=x.raw of=y.raw skip=$v" "measure --size $v -O qcow2")
done
cases+=("bench -c 1 -s 3G x.raw" "bench -c 1 -S 3G x.raw" "dd if=x.raw of=y.raw bs=0" "dd if=x.raw of=y.raw bs=3G")
for c in "${cases[@]}"; do
  rm -f y.raw
  # shellcheck disable=SC2086
  qemu-img $c >q.out 2>&1; qs=$?
  rm -f y.raw
  # shellcheck disable=SC2086
  "$QK" $c >k.out 2>&1; ks=$?
  sed -i 's/^qemu-img:/TOOL:/' q.out
  sed -i 's/^qcowkit:/TOOL:/' k.out
  [ $qs = $ks ] || bad "$c: exit $ks, qemu-img $qs"
  diff q.out k.out >d.out || { bad "$c: message differs from qemu-img's"; cat d.out; }
done
exit $fail
