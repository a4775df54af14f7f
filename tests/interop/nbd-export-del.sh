#!/usr/bin/env bash
# export-del while a client of the export has stopped reading its replies
# (8 reads of 32 MiB pipelined, none read): the client gets the server's
# grace period to finish, then is cut off, so the command returns and the
# image is closed instead of waiting on that client forever. Meanwhile the
# other export and the control socket keep working. Plain and ASan builds.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

for BIN in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f a.qcow2 b.qcow2 ctl.sock nbd.sock
  qemu-img create -q -f qcow2 a.qcow2 256M
  qemu-io -c 'write -P 0x5a 0 256M' a.qcow2 > /dev/null
  qemu-img create -q -f qcow2 b.qcow2 16M
  start_serve "$BIN" pid --socket "$PWD/nbd.sock" --control "$PWD/ctl.sock" \
    --export "name=a,file=a.qcow2" --export "name=b,file=b.qcow2"
  pid=$SERVE_PID
  python3 - "$PWD/nbd.sock" "$BIN" "$PWD/ctl.sock" <<'PY' || fail "$BIN: export-del with a stuck client"
import importlib.util, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("badclient", os.path.join(os.environ["SRC_DIR"], "tests/interop/nbd-badclient.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)
sock, qk, ctl = sys.argv[1:4]
c = bc.Conn(sock)
c.greet()
c.go("a")
c.s.setsockopt(bc.socket.SOL_SOCKET, bc.socket.SO_RCVBUF, 4096)
for k in range(8):
    c.request(bc.CMD_READ, k * 32 * bc.MiB, 32 * bc.MiB)
time.sleep(1)
t0 = time.monotonic()
r = subprocess.run(["timeout", "60", qk, "ctl", ctl, "export-del", "name=a"], stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)
took = time.monotonic() - t0
assert r.returncode == 0, "export-del failed (%d): %s" % (r.returncode, r.stdout)
assert took < 30, "export-del took %.1f s" % took
print("export-del returned after %.1f s" % took)
q = subprocess.run([qk, "ctl", ctl, "query-exports"], stdout=subprocess.PIPE, text=True)
assert '"a"' not in q.stdout and '"b"' in q.stdout, q.stdout
d = bc.Conn(sock)
d.greet()
d.go("b")
d.request(bc.CMD_READ, 0, 4096)
assert d.answer()[1] == 0, "the other export stopped serving"
PY
  # The image was closed by export-del: another process may open it now.
  qemu-img check -q a.qcow2 || fail "$BIN: check after export-del"
  qemu-io -c 'read -P 0x5a 0 256M' a.qcow2 | grep -q "verification failed" && fail "$BIN: data after export-del"
  stop_serve "$pid"
done
echo "ok"
exit 0
