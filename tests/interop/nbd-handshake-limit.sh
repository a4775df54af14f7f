#!/usr/bin/env bash
# serve --handshake-limit N (qemu-nbd's option; default 10 s): a client
# that connects and stalls (before its flags, or in the middle of its
# options), one that trickles options, and one that sends options but
# never reads the replies (so the server waits to write) are all cut off
# once N seconds have passed since they connected; other clients are
# served meanwhile. A client in transmission is never timed out, and
# --handshake-limit 0 sets no limit. Plain and ASan builds.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

cat > clients.py <<'PY'
import importlib.util, os, socket, struct, sys, time
spec = importlib.util.spec_from_file_location("badclient", os.path.join(os.environ["SRC_DIR"], "tests/interop/nbd-badclient.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)
path, mode = sys.argv[1:3]

def limited():
    def closed_within(c, t0, lo, hi, what):
        c.s.settimeout(hi + 5)
        closed = c.closed_by_server()
        took = time.monotonic() - t0
        assert closed and lo <= took <= hi, "%s: closed=%s after %.1f s" % (what, closed, took)
        print("ok: %s (closed after %.1f s)" % (what, took))

    # Stalled before sending its flags, and stalled after a first option.
    t0 = time.monotonic()
    stalled = bc.Conn(path)
    stalled.recvn(18)
    mid = bc.Conn(path)
    mid.greet()
    mid.structured_replies()
    # Trickles one option a second: the limit counts from the connection.
    trickle = bc.Conn(path)
    trickle.greet()
    # A normal client meanwhile, then idle in transmission past the limit.
    ok = bc.Conn(path)
    ok.greet()
    ok.go("a")
    for i in range(4):
        try:
            trickle.opt(99, b"x")
            assert trickle.reply()[1] == bc.ERR_UNSUP
        except (EOFError, BrokenPipeError, ConnectionResetError):
            break
        time.sleep(1)
    closed_within(stalled, t0, 1.5, 8, "a client stalled before its flags")
    closed_within(mid, t0, 1.5, 8, "a client stalled between options")
    closed_within(trickle, t0, 1.5, 8, "a client trickling options")
    time.sleep(max(0, 3 - (time.monotonic() - t0)))
    ok.request(bc.CMD_READ, 0, 4096)
    assert ok.answer()[1] == 0, "a client in transmission was cut off"
    print("ok: a client in transmission stays past the limit")

    # Options whose replies are never read: the server waits to write.
    t0 = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(path)
    s.sendall(struct.pack(">I", 3))
    s.setblocking(False)
    msg = struct.pack(">QII", bc.IHAVEOPT, bc.OPT_LIST, 0) * 256
    sent = 0
    while time.monotonic() - t0 < 1.5:
        try:
            sent += s.send(msg)
        except BlockingIOError:
            time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            break
    s.setblocking(True)
    s.settimeout(13)
    closed = False
    try:
        while True:
            if not s.recv(1 << 20):
                closed = True
                break
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    except socket.timeout:
        pass
    took = time.monotonic() - t0
    assert closed and took <= 12, "a client not reading replies: closed=%s after %.1f s (%d bytes sent)" % (closed, took, sent)
    print("ok: a client not reading its replies (closed after %.1f s, %d bytes of options sent)" % (took, sent))

def unlimited():
    c = bc.Conn(path)
    c.greet()
    c.s.settimeout(3)
    try:
        c.s.recv(1)
        raise AssertionError("closed without a limit")
    except socket.timeout:
        pass
    c.s.settimeout(10)
    c.go("a")
    print("ok: no limit with --handshake-limit 0")

limited() if mode == 'limit' else unlimited()
PY

for BIN in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f a.qcow2 nbd.sock
  qemu-img create -q -f qcow2 a.qcow2 16M
  qemu-io -c 'write -P 0x5a 0 1M' a.qcow2 > /dev/null
  start_serve "$BIN" pid --socket "$PWD/nbd.sock" --handshake-limit 2 --export "name=a,file=a.qcow2"
  pid=$SERVE_PID
  python3 clients.py "$PWD/nbd.sock" limit || fail "$BIN: --handshake-limit 2"
  stop_serve "$pid"

  # --handshake-limit 0: no limit.
  rm -f nbd.sock
  start_serve "$BIN" pid --socket "$PWD/nbd.sock" --handshake-limit 0 --export "name=a,file=a.qcow2"
  pid=$SERVE_PID
  python3 clients.py "$PWD/nbd.sock" nolimit || fail "$BIN: --handshake-limit 0"
  stop_serve "$pid"
  out=$("$BIN" serve --socket "$PWD/x.sock" --handshake-limit -1 --export a.qcow2 2>&1) && fail "$BIN: --handshake-limit -1 accepted"
  case $out in *"Invalid --handshake-limit"*) ;; *) fail "$BIN: --handshake-limit -1: $out" ;; esac
done
echo "ok"
exit 0
