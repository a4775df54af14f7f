#!/usr/bin/env bash
# Usage errors said as qemu-img says them: its first line word for word
# (a missing file name, an unrecognized option, a missing argument, a bad
# -r value, a -m out of range), then a "Try ... for more information" line
# (which names the command's own help), and the same exit status; the -m
# forms qemu-img takes (a sign, 0x) are taken. The run uses the ASan
# build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

qemu-img create -q -f qcow2 x.qcow2 1M
cases=(
  "info" "check" "map" "commit" "snapshot" "bench" "create"
  "compare x.qcow2" "resize x.qcow2" "rebase x.qcow2" "amend x.qcow2"
  "info --bogus x.qcow2" "info -z x.qcow2" "check --bogus x.qcow2" "map -z x.qcow2"
  "create --bogus y.qcow2 1M" "convert --bogus x.qcow2 y.qcow2" "commit -z x.qcow2"
  "rebase -z x.qcow2" "amend -z x.qcow2" "dd -z" "snapshot -z x.qcow2" "bench -z x.qcow2"
  "info -f" "check -f" "map -f" "commit -b" "rebase -b" "amend -o" "dd -f" "create -f"
  "check -r foo x.qcow2" "nosuch" "--bogus"
  "convert -m 17 x.qcow2 y.qcow2" "convert -m -4 x.qcow2 y.qcow2" "convert -m 4x x.qcow2 y.qcow2"
  "convert -m +4 -O raw x.qcow2 y.qcow2" "convert -m 0x4 -O raw x.qcow2 y.qcow2"
)
for c in "${cases[@]}"; do
  rm -f y.qcow2
  # shellcheck disable=SC2086
  qemu-img $c >q.out 2>&1; qs=$?
  rm -f y.qcow2
  # shellcheck disable=SC2086
  "$QK" $c >k.out 2>&1; ks=$?
  [ $qs = $ks ] || bad "$c: exit $ks, qemu-img $qs"
  sed -n 1p q.out | sed 's/^qemu-img:/TOOL:/' >q.1
  sed -n 1p k.out | sed 's/^qcowkit:/TOOL:/' >k.1
  diff q.1 k.1 >d.out || { bad "$c: message differs from qemu-img's"; cat d.out; }
  if sed -n 2p q.out | grep -q "^Try 'qemu-img --help' for more information$"; then
    sed -n 2p k.out | grep -q "^Try 'qcowkit help [a-z]*' for more information$\|^Try 'qcowkit --help' for more information$" ||
      bad "$c: no 'Try ... for more information' line: $(sed -n 2p k.out)"
  fi
  [ "$(wc -l <k.out)" = "$(wc -l <q.out)" ] || { bad "$c: $(wc -l <k.out) lines, qemu-img $(wc -l <q.out)"; cat k.out; }
done
exit $fail
