#!/usr/bin/env bash
# Power loss during resize: crash states rebuilt from qcowkit's write log
# (tests/crash/replay.py: the writes made durable by completed flushes,
# plus any subset of the later ones) must each open and pass qemu-img
# check (0, or 3 for leaks), with the old size or the new one and the
# data as it was. Growing from size 0 once wrote the size before the new
# L1 table's place and length were durable: the image then could not be
# opened ("L1 table is too small"). Shrinks and growths that move the L1
# table are run as well. With persistent bitmaps (enabled and disabled)
# every state must also open in qemu-img (a bitmap not in use must have a
# table the size in the header needs, so all are marked in use before the
# size changes) and qcowkit check must agree with qemu-img's; an image
# whose bitmap is already in use is refused, as qemu-img refuses it.
# The new area must read as zeros in every state with the new size (the
# header once named it before it was zeroed).
# snapshot -a of a snapshot taken at another size resizes the disk the
# same way and is held to the same (it once changed the size with the
# bitmaps still claiming to be saved at the old one). Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

# $zeros ("OFFSET LENGTH"), when set: the new area, which must read as
# zeros in every state whose header has the new size. $setup, when set,
# runs on img.qcow2 after the write.
zeros= setup=
run_case() { # NAME CREATE_OPTS OLD_SIZE WRITE BITMAPS(0|1) NEW_SIZE_ARGS... | snapshot-a SIZE_NOW
  local name=$1 opts=$2 old=$3 write=$4 bitmaps=$5
  shift 5
  rm -f img.qcow2 init.qcow2 w.log
  qemu-img create -q -f qcow2 -o "$opts" img.qcow2 "$old"
  [ -n "$write" ] && qemu-io -c "$write" img.qcow2 >/dev/null
  [ -n "$setup" ] && eval "$setup"
  local cmd=(resize img.qcow2 "$@")
  if [ "$1" = snapshot-a ]; then
    # Taken at OLD_SIZE, applied once the disk has another size.
    qemu-img snapshot -c s0 img.qcow2
    qemu-img resize -q --shrink img.qcow2 "$2"
    cmd=(snapshot -a s0 img.qcow2)
  fi
  if [ "$bitmaps" = 1 ]; then
    qemu-img bitmap --add -g 512 img.qcow2 on
    qemu-img bitmap --add --disable -g 4096 img.qcow2 off
  fi
  cp img.qcow2 init.qcow2
  QCOWKIT_LOG_WRITES=$PWD/w.log "$QK" "${cmd[@]}" >/dev/null || { bad "$name: ${cmd[0]} failed"; return; }
  # The resize runs under the sanitizer build; the checks of its many
  # crash states use the plain one (the fuzzers and hostile tests run
  # check on damaged images under the sanitizer).
  python3 - "$SRC_DIR/tests/crash" init.qcow2 img.qcow2 w.log "$write" "$name" "${QCOWKIT:-$QK}" "$zeros" <<'PY' || fail=1
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import replay, wlog
init, img, log, write, name, qk, zeros = sys.argv[2:9]
recs = wlog.records_for(wlog.read_log(log), img)
sizes = []
for path in (init, img):
    out = subprocess.run(["qemu-img", "info", "--output=json", path], stdout=subprocess.PIPE, text=True).stdout
    sizes.append(out.split('"virtual-size": ')[1].split(",")[0])
n = bad = 0
for st, data in replay.states(open(init, "rb").read(), recs, 1, 12):
    n += 1
    with open("state.qcow2", "wb") as f:
        f.write(data)
    chk = subprocess.run(["qemu-img", "check", "state.qcow2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The size field of the header (offset 24): what qemu-img info shows
    # of an image its check could open, without a process per state.
    size = str(int.from_bytes(data[24:32], "big")) if len(data) >= 32 else None
    ours = subprocess.run([qk, "check", "state.qcow2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ok = chk.returncode in (0, 3) and size in sizes and ours.returncode == chk.returncode
    if ok and write:
        pat, off, ln = write.split()[2], write.split()[3], write.split()[4]
        rd = subprocess.run(["qemu-io", "-r", "-c", "read -P %s %s %s" % (pat, off, ln), "state.qcow2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ok = rd.returncode == 0 and "verification failed" not in rd.stdout
    if ok and zeros and size == sizes[1] != sizes[0]:
        # Once the header names the new size, the new area reads as
        # zeros: neither the backing file nor an old tail shows there.
        rd = subprocess.run(["qemu-io", "-r", "-c", "read -P 0 %s" % zeros, "state.qcow2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ok = rd.returncode == 0 and "verification failed" not in rd.stdout
    if not ok:
        bad += 1
        if bad <= 3:
            print("FAIL: %s: crash state at record %d (durable %d, applied %s): check %d (qcowkit %d), size %s\n%s%s" %
                  (name, st.point, st.durable, st.chosen, chk.returncode, ours.returncode, size, chk.stdout[-600:],
                   ours.stdout[-600:]))
if n == 0:
    print("FAIL: %s: no crash states" % name)
    sys.exit(1)
sys.exit(1 if bad else 0)
PY
}

run_case "grow from 0" cluster_size=65536 0 "" 0 16M
run_case "grow from 0, 4k clusters" cluster_size=4096 0 "" 0 1G
run_case "grow, L1 moves" cluster_size=4096 64M "write -P 0x5a 1M 256k" 0 64G
run_case "grow, not a cluster multiple" cluster_size=65536 1000k "write -P 0x5a 0 512k" 0 3M
# The new area is zeroed before the header names it (a crash in between
# once left the new size over backing data, or over the old tail of the
# last cluster left by a shrink).
qemu-img create -q -f qcow2 base.qcow2 8M
qemu-io -c "write -P 0x11 0 8M" base.qcow2 >/dev/null
zeros="2M 6M"
run_case "grow over a longer backing file" cluster_size=65536,backing_file=base.qcow2,backing_fmt=qcow2 2M \
  "write -P 0x5a 0 512k" 0 8M
run_case "grow over a longer backing file, v2" compat=0.10,cluster_size=65536,backing_file=base.qcow2,backing_fmt=qcow2 \
  2M "write -P 0x5a 0 512k" 0 8M
run_case "grow over a longer backing file, extended L2" \
  cluster_size=65536,extended_l2=on,backing_file=base.qcow2,backing_fmt=qcow2 2M "write -P 0x5a 0 512k" 0 8M
zeros="1000k 2072k" setup="qemu-io -c 'write -P 0x66 960k 64k' img.qcow2 >/dev/null; qemu-img resize -q --shrink img.qcow2 1000k"
run_case "grow over an old tail" cluster_size=65536 1M "write -P 0x5a 0 960k" 0 3M
zeros= setup=
run_case "shrink" cluster_size=65536 8M "write -P 0x5a 0 1M" 0 --shrink 2M
run_case "grow with bitmaps" cluster_size=65536 16M "write -P 0x5a 0 1M" 1 1G
run_case "grow with bitmaps, 512-byte clusters" cluster_size=512 16M "write -P 0x5a 0 64k" 1 64M
run_case "shrink with bitmaps" cluster_size=65536 1G "write -P 0x5a 0 1M" 1 --shrink 16M
# (sizes far enough apart that the disabled bitmap's table changes size)
run_case "snapshot -a to a smaller disk, with bitmaps" cluster_size=65536 16M "write -P 0x5a 0 1M" 1 snapshot-a 64G
run_case "snapshot -a to a larger disk, with bitmaps" cluster_size=65536 64G "write -P 0x5a 0 1M" 1 snapshot-a 16M

# A bitmap already in use (out of date): the size stays, as with qemu-img.
rm -f iu.qcow2
qemu-img create -q -f qcow2 iu.qcow2 16M
qemu-img bitmap --add iu.qcow2 stale
python3 - iu.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
d = f.read()
off = struct.unpack_from(">I", d, 100)[0]  # header length: extensions follow
while True:
    t, l = struct.unpack_from(">II", d, off)
    if t == 0x23852875:
        dir_off = struct.unpack_from(">Q", d, off + 8 + 16)[0]
        break
    off += 8 + ((l + 7) & ~7)
f.seek(dir_off + 15)
f.write(bytes([d[dir_off + 15] | 1]))  # the in-use flag
PY
cp iu.qcow2 iu0.qcow2
for op in "resize iu.qcow2 1G" "resize --shrink iu.qcow2 8M" "amend -o size=1G iu.qcow2"; do
  # shellcheck disable=SC2086
  out=$("$QK" $op 2>&1) && bad "in-use bitmap: $op succeeded"
  echo "$out" | grep -q "^qcowkit: Bitmap 'stale' is inconsistent and cannot be used$" ||
    { bad "in-use bitmap: $op: not qemu-img's message"; echo "$out"; }
  cmp -s iu.qcow2 iu0.qcow2 || bad "in-use bitmap: $op changed the image"
done
exit $fail
