#!/usr/bin/env bash
# Power loss during resize: crash states rebuilt from qcowkit's write log
# (tests/crash/replay.py: the writes made durable by completed flushes,
# plus any subset of the later ones) must each open and pass qemu-img
# check (0, or 3 for leaks), with the old size or the new one and the
# data as it was. Growing from size 0 once wrote the size before the new
# L1 table's place and length were durable: the image then could not be
# opened ("L1 table is too small"). Shrinks and growths that move the L1
# table are run as well. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

run_case() { # NAME CREATE_OPTS OLD_SIZE WRITE NEW_SIZE_ARGS...
  local name=$1 opts=$2 old=$3 write=$4
  shift 4
  rm -f img.qcow2 init.qcow2 w.log
  qemu-img create -q -f qcow2 -o "$opts" img.qcow2 "$old"
  [ -n "$write" ] && qemu-io -c "$write" img.qcow2 >/dev/null
  cp img.qcow2 init.qcow2
  QCOWKIT_LOG_WRITES=$PWD/w.log "$QK" resize img.qcow2 "$@" >/dev/null || { bad "$name: resize failed"; return; }
  python3 - "$SRC_DIR/tests/crash" init.qcow2 img.qcow2 w.log "$write" "$name" <<'PY' || fail=1
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import replay, wlog
init, img, log, write, name = sys.argv[2:7]
recs = wlog.records_for(wlog.read_log(log), img)
sizes = set()
for path in (init, img):
    out = subprocess.run(["qemu-img", "info", "--output=json", path], stdout=subprocess.PIPE, text=True).stdout
    sizes.add(out.split('"virtual-size": ')[1].split(",")[0])
n = bad = 0
for st, data in replay.states(open(init, "rb").read(), recs, 1, 12):
    n += 1
    with open("state.qcow2", "wb") as f:
        f.write(data)
    chk = subprocess.run(["qemu-img", "check", "state.qcow2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    info = subprocess.run(["qemu-img", "info", "--output=json", "state.qcow2"], stdout=subprocess.PIPE, text=True).stdout
    size = info.split('"virtual-size": ')[1].split(",")[0] if '"virtual-size": ' in info else None
    ok = chk.returncode in (0, 3) and size in sizes
    if ok and write:
        pat, off, ln = write.split()[2], write.split()[3], write.split()[4]
        rd = subprocess.run(["qemu-io", "-r", "-c", "read -P %s %s %s" % (pat, off, ln), "state.qcow2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ok = rd.returncode == 0 and "verification failed" not in rd.stdout
    if not ok:
        bad += 1
        if bad <= 3:
            print("FAIL: %s: crash state at record %d (durable %d, applied %s): check %d, size %s\n%s" %
                  (name, st.point, st.durable, st.chosen, chk.returncode, size, chk.stdout[-600:]))
if n == 0:
    print("FAIL: %s: no crash states" % name)
    sys.exit(1)
sys.exit(1 if bad else 0)
PY
}

run_case "grow from 0" cluster_size=65536 0 "" 16M
run_case "grow from 0, 4k clusters" cluster_size=4096 0 "" 1G
run_case "grow, L1 moves" cluster_size=4096 64M "write -P 0x5a 1M 256k" 64G
run_case "grow, not a cluster multiple" cluster_size=65536 1000k "write -P 0x5a 0 512k" 3M
run_case "shrink" cluster_size=65536 8M "write -P 0x5a 0 1M" --shrink 2M
exit $fail
