#!/usr/bin/env bash
# Control-socket races in `qcowkit serve` (tests/interop/serve_races.py
# has the cases): bitmap changes against a remove, backup-start against a
# bitmap remove, block status across a mirror switch, job-complete
# wait=true against job-dismiss, and SIGTERM with a control client that
# does not read. Each left freed memory in use (or never stopped); the
# ASan build must report nothing, and block status also runs on the plain
# build, where it crashed. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

for c in bitmap backup switch dismiss quit; do
  python3 "$SRC_DIR/tests/interop/serve_races.py" "$QK_ASAN" $c "$PWD" || fail "$c (ASan build)"
done
python3 "$SRC_DIR/tests/interop/serve_races.py" "$QK_PLAIN" switch "$PWD" || fail "switch (plain build)"
echo "ok"
exit 0
