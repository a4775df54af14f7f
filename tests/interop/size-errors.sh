#!/usr/bin/env bash
# Size arguments that do not parse: every command says it as qemu-img
# does, word for word and on the same two lines ("Invalid WHAT specified.
# You may use k, M, G, T, P or E suffixes for" / "kilobytes, ..."), with
# the same exit status; a hex number with a suffix is taken, with the same
# deprecation warning. The run uses the ASan build when there is one.
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
