#!/usr/bin/env bash
# `qcowkit serve` offers an image's persistent dirty bitmaps as NBD meta
# contexts qemu:dirty-bitmap:NAME, as qemu-nbd -B does: listed with the
# others, selectable one or several at a time, the dirty ranges the same as
# qemu-nbd reports for the same image (bitmaps made and written by QEMU,
# granularities 64k and 1M), an unknown name refused; writes through a
# read-write export show up in the live bitmap at once and are in the
# image after the server stops; the control socket adds a persistent
# bitmap while serving, and enabling a stored one marks it in use on disk
# before any write (a SIGKILL leaves it flagged), and removing a stored
# one takes it out of the image at once (every crash state of that
# removal's write log checked); qemu:allocation-depth over
# a backing chain as qemu-nbd -A reports it. Plain and ASan builds.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
work=$(mktemp -d "${TEST_DIR:-/tmp}/qk-nbdbm.XXXXXX")
trap 'nbd_cleanup; rm -rf "$work"' EXIT
cd "$work" || exit 1
status=0
bad() { echo "FAIL: $*"; status=1; }

qemu-img create -q -f qcow2 img.qcow2 64M
qemu-img bitmap --add img.qcow2 b0
qemu-img bitmap --add -g 1M --disable img.qcow2 b1
qemu-io -c 'write -P 1 0 64k' -c 'write 5M 100k' -c 'write -z 9M 3M' img.qcow2 >/dev/null
qemu-img bitmap --merge b0 img.qcow2 b1
qemu_map() { # NAME [IMG]: qemu-nbd's view (nbdinfo starts it: no startup race)
  nbdinfo --map="qemu:dirty-bitmap:$1" -- [ qemu-nbd -r -f qcow2 -B "$1" "${2:-img.qcow2}" ]
}
qemu_map b0 >want.b0
qemu_map b1 >want.b1
grep -q "dirty" want.b0 || bad "qemu-nbd shows no dirty range: the comparison would be empty"

for build in "$QK_PLAIN" "$QK_ASAN"; do
  [ -x "$build" ] || continue
  start_serve "$build" pid --export name=vm0,file=img.qcow2,readonly=on --socket "$work/s.sock"
  u="nbd+unix:///vm0?socket=$work/s.sock"
  nbdinfo --list "nbd+unix:///?socket=$work/s.sock" >list.txt 2>&1
  for c in base:allocation qemu:dirty-bitmap:b0 qemu:dirty-bitmap:b1; do
    grep -q "$c" list.txt || { bad "$build: $c not listed"; cat list.txt; }
  done
  for b in b0 b1; do
    nbdinfo --map="qemu:dirty-bitmap:$b" "$u" >got.$b 2>&1
    diff want.$b got.$b >diff.out || { bad "$build: bitmap $b differs from qemu-nbd's"; cat diff.out; }
  done
  nbdinfo --map=qemu:dirty-bitmap:nope "$u" >/dev/null 2>&1 && bad "$build: an unknown bitmap was accepted"
  # base:allocation still answers with the bitmaps negotiated beside it.
  nbdinfo --map "$u" | grep -q "data" || bad "$build: base:allocation lost"
  stop_serve "$SERVE_PID"

  # Read-write: writes over NBD mark the enabled bitmap while serving, and
  # it is stored when the server stops.
  cp img.qcow2 rw.qcow2
  start_serve "$build" pid --export name=vm0,file=rw.qcow2 --socket "$work/s.sock"
  qemu-io -f raw -c 'write -P 7 40M 64k' "$u" >/dev/null || bad "$build: write over NBD"
  nbdinfo --map=qemu:dirty-bitmap:b0 "$u" | grep -q "^  *41943040 .*dirty" || bad "$build: the write is not in the live bitmap"
  nbdinfo --map=qemu:dirty-bitmap:b1 "$u" | grep -q "^  *41943040 .*dirty" && bad "$build: a disabled bitmap recorded a write"
  stop_serve "$SERVE_PID"
  qemu-img check -q rw.qcow2 || bad "$build: check after serving"
  qemu_map b0 rw.qcow2 | grep -q "^  *41943040 .*dirty" || bad "$build: the write is not in the stored bitmap"

  # The control socket: a persistent bitmap added while serving records
  # the writes after it and is in the image after the server stops; a
  # stored disabled bitmap enabled while serving is marked in use on disk
  # at once, so a SIGKILL leaves it flagged, never silently stale.
  cp img.qcow2 ctl.qcow2
  start_serve "$build" pid --export name=vm0,file=ctl.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
  ctl() { "$build" ctl "$work/c.sock" "$@" >ctl.out 2>&1 || { bad "$build: ctl $*"; cat ctl.out; }; }
  ctl block-dirty-bitmap-add export=vm0 name=live persistent=true granularity=65536
  qemu-io -f raw -c 'write -P 8 48M 64k' "$u" >/dev/null || bad "$build: write over NBD"
  ctl block-dirty-bitmap-query export=vm0
  grep -q '"persistent": true' ctl.out || { bad "$build: query does not say persistent"; cat ctl.out; }
  stop_serve "$SERVE_PID"
  qemu-img info ctl.qcow2 | grep -q "name: live" || bad "$build: the persistent bitmap added over the control socket was not stored"
  qemu_map live ctl.qcow2 >live.map
  grep -q "^  *50331648 .*dirty" live.map || { bad "$build: the write after the add is not in it"; cat live.map; }
  grep -q "^  *0 .*dirty" live.map && { bad "$build: writes before the add are in it"; cat live.map; }
  start_serve "$build" pid --export name=vm0,file=ctl.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
  ctl block-dirty-bitmap-enable export=vm0 name=b1
  qemu-io -f raw -c 'write -P 9 52M 64k' "$u" >/dev/null
  kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null
  qemu-img info ctl.qcow2 >info.txt
  grep -B1 -A3 "in-use" info.txt | grep -q "name: b1" || { bad "$build: b1 not in use after SIGKILL"; cat info.txt; }
  qemu-img check -q ctl.qcow2 >/dev/null 2>&1; rc=$?
  [ $rc = 0 ] || [ $rc = 3 ] || bad "$build: check after SIGKILL exited $rc"
  # Removing a stored bitmap while serving takes it out of the image at
  # once, as qemu-storage-daemon does. It used to stay as saved until the
  # store at close: with a bitmap of the same name added and written after
  # it, a SIGKILL brought the old one back flagged as saved, reporting the
  # write as clean.
  qemu-img create -q -f qcow2 rmk.qcow2 64M
  qemu-img bitmap --add --disable rmk.qcow2 d
  start_serve "$build" pid --export name=vm0,file=rmk.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
  ctl block-dirty-bitmap-remove export=vm0 name=d
  ctl block-dirty-bitmap-add export=vm0 name=d persistent=true
  qemu-io -f raw -c 'write -P 2 8M 1M' -c flush "$u" >/dev/null || bad "$build: write over NBD"
  kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null
  qemu-img info rmk.qcow2 >info.txt
  grep -q "name: d" info.txt && { bad "$build: the removed bitmap is still in the image"; cat info.txt; }
  qemu-img check -q rmk.qcow2 >/dev/null 2>&1; rc=$?
  [ $rc = 0 ] || [ $rc = 3 ] || bad "$build: check after SIGKILL exited $rc"
  # The middle one of three, with the first enabled and written: the
  # others keep their order, contents and flags on disk (the written one
  # in use), through a SIGKILL and through a clean stop.
  for stop in kill clean; do
    qemu-img create -q -f qcow2 rm3.qcow2 64M
    qemu-io -c 'write -P 1 0 1M' rm3.qcow2 >/dev/null
    qemu-img bitmap --add rm3.qcow2 a
    qemu-img bitmap --add --disable rm3.qcow2 m
    qemu-img bitmap --add --disable rm3.qcow2 z
    qemu-io -c 'write -P 3 4M 64k' rm3.qcow2 >/dev/null
    start_serve "$build" pid --export name=vm0,file=rm3.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
    qemu-io -f raw -c 'write -P 4 16M 64k' -c flush "$u" >/dev/null || bad "$build: write over NBD"
    ctl block-dirty-bitmap-remove export=vm0 name=m
    if [ $stop = kill ]; then
      kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null
    else
      stop_serve "$SERVE_PID"
    fi
    qemu-img info --output=json rm3.qcow2 >info.json
    python3 - "$stop" <<'PY' || bad "$build: $stop: the bitmaps left after removing the middle one"
import json, sys
bms = json.load(open("info.json"))["format-specific"]["data"].get("bitmaps", [])
got = [(b["name"], sorted(b["flags"])) for b in bms]
a = ["auto", "in-use"] if sys.argv[1] == "kill" else ["auto"]
want = [("a", a), ("z", [])]
if got != want:
    sys.exit("%s: %r, expected %r" % (sys.argv[1], got, want))
PY
    qemu-img check -q rm3.qcow2 >/dev/null 2>&1; rc=$?
    [ $rc = 0 ] || [ $rc = 3 ] || bad "$build: $stop: check after removing the middle bitmap exited $rc"
    if [ $stop = clean ]; then
      [ $rc = 0 ] || bad "$build: clean stop after removing a bitmap left check exit $rc"
      qemu_map a rm3.qcow2 >a.map
      grep -q "^  *16777216 .*dirty" a.map || { bad "$build: a lost the write made while serving"; cat a.map; }
      grep -q "^  *4194304 .*dirty" a.map || { bad "$build: a lost the write made before"; cat a.map; }
      qemu_map z rm3.qcow2 >z.map
      grep -q "dirty" z.map && { bad "$build: z (disabled, empty) has dirty ranges"; cat z.map; }
    fi
  done
done

# Every crash state of a removal while serving (the write log replayed as
# tests/crash does): qemu-img check accepts it, the image holds either the
# three bitmaps or the two kept, the disabled one is never in use, and the
# enabled one, when not in use, has the write made while serving.
qemu-img create -q -f qcow2 wl.qcow2 64M
qemu-img bitmap --add wl.qcow2 a
qemu-img bitmap --add --disable wl.qcow2 m
qemu-img bitmap --add --disable wl.qcow2 z
cp wl.qcow2 wl-init.qcow2
QCOWKIT_LOG_WRITES=$work/w.log start_serve "$QK_PLAIN" pid --export name=vm0,file=wl.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
qemu-io -f raw -c 'write -P 4 16M 64k' -c flush "$u" >/dev/null || bad "write over NBD (write log)"
"$QK_PLAIN" ctl "$work/c.sock" block-dirty-bitmap-remove export=vm0 name=m >ctl.out 2>&1 || { bad "remove (write log)"; cat ctl.out; }
stop_serve "$SERVE_PID"
python3 - "$SRC_DIR/tests/crash" <<'PY' || bad "crash states of a bitmap removal"
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import replay, wlog
def run(*c):
    p = subprocess.run(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout
recs = wlog.records_for(wlog.read_log("w.log"), os.path.abspath("wl.qcow2"))
init = open("wl-init.qcow2", "rb").read()
states = failed = removed = 0
for st, data in replay.states(init, recs, 1, 8):
    states += 1
    open("s.qcow2", "wb").write(data)
    why = None
    rc, out = run("qemu-img", "check", "s.qcow2")
    if rc not in (0, 3):
        why = "check exit %d: %s" % (rc, out.strip()[-400:])
    else:
        rc, out = run("qemu-img", "info", "--output=json", "s.qcow2")
        bms = json.loads(out)["format-specific"]["data"].get("bitmaps", []) if rc == 0 else None
        names = [b["name"] for b in bms or []]
        flags = {b["name"]: b["flags"] for b in bms or []}
        removed += names == ["a", "z"]
        if names not in (["a", "m", "z"], ["a", "z"]):
            why = "bitmaps %r" % names
        elif "in-use" in flags["z"]:
            why = "z in use"
        elif "in-use" not in flags["a"]:
            rc, out = run("qemu-io", "-r", "-f", "qcow2", "-c", "read -P 4 16M 64k", "s.qcow2")
            if rc == 0 and "verification failed" not in out:
                rc, out = run("nbdinfo", "--map=qemu:dirty-bitmap:a", "--", "[", "qemu-nbd", "-r", "-f",
                              "qcow2", "-B", "a", "s.qcow2", "]")
                if not any(l.split()[0] == "16777216" and "dirty" in l for l in out.splitlines()):
                    why = "a saved without the write at 16M:\n" + out
    if why:
        failed += 1
        if failed <= 3:
            print("crash state at record %d (durable %d): %s" % (st.point, st.durable, why))
if states < 5 or not removed:
    sys.exit("only %d crash states, %d with m removed" % (states, removed))
sys.exit(1 if failed else 0)
PY

# A bitmap a client has selected is busy while the client is connected,
# as an exported bitmap is in QEMU: remove, clear and disable are refused
# (a client told "all clean" would skip changed data in a backup), block
# status goes on answering, and once the client leaves removal works. A
# bitmap removed after SET_META_CONTEXT but before the client began
# transmission fails its block status: it never reads as clean.
for build in "$QK_PLAIN" "$QK_ASAN"; do
  [ -x "$build" ] || continue
  qemu-img create -q -f qcow2 rm.qcow2 16M
  qemu-img bitmap --add rm.qcow2 held
  qemu-img bitmap --add rm.qcow2 gone
  start_serve "$build" pid --export name=vm0,file=rm.qcow2 --socket "$work/s.sock" --control "$work/c.sock"
  python3 - "$work/s.sock" "$build" "$work/c.sock" <<'PY' || bad "$build: bitmaps selected by a client"
import importlib.util, os, struct, subprocess, sys
spec = importlib.util.spec_from_file_location("badclient", os.path.join(os.environ["SRC_DIR"], "tests/interop/nbd-badclient.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)
qk, ctl_sock = sys.argv[2], sys.argv[3]


def ctl(*args):
    return subprocess.run([qk, "ctl", ctl_sock] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def connect(name):
    c = bc.Conn(sys.argv[1])
    c.greet()
    c.structured_replies()
    assert c.meta(b"vm0", b"qemu:dirty-bitmap:" + name)[-1][0] == bc.REP_ACK
    return c


def go(c):
    n = b"vm0"
    c.opt(bc.OPT_GO, struct.pack(">I", len(n)) + n + struct.pack(">H", 0))
    assert c.replies_until_final()[-1][0] == bc.REP_ACK


def dirty_at_0(c):
    c.request(bc.CMD_BS, 0, 1 << 20)
    cookie, err, data = c.answer()
    assert err == 0, "block status failed: %d" % err
    return struct.unpack(">I", data[8:12])[0] & 1  # context id, then (length, flags) pairs


c = connect(b"held")
go(c)
c.request(bc.CMD_WRITE, 0, 4096, payload=b"\x33" * 4096)
assert c.answer()[1] == 0
assert dirty_at_0(c) == 1, "the write is not in the bitmap"
for cmd in ("block-dirty-bitmap-clear", "block-dirty-bitmap-remove", "block-dirty-bitmap-disable"):
    r = ctl(cmd, "export=vm0", "name=held")
    assert r.returncode != 0, "%s of a bitmap a client reads was accepted" % cmd
    assert "in use" in r.stdout, r.stdout
r = ctl("block-dirty-bitmap-query", "export=vm0")
assert '"busy": true' in r.stdout, r.stdout
assert dirty_at_0(c) == 1, "the bitmap changed under the client"
c.request(bc.CMD_DISC, 0, 0)
assert c.closed_by_server()
r = ctl("block-dirty-bitmap-remove", "export=vm0", "name=held")
assert r.returncode == 0, "remove after the client left: " + r.stdout

c = connect(b"gone")
assert ctl("block-dirty-bitmap-remove", "export=vm0", "name=gone").returncode == 0
assert ctl("block-dirty-bitmap-add", "export=vm0", "name=other").returncode == 0
go(c)
c.request(bc.CMD_BS, 0, 1 << 20)
assert c.answer()[1] != 0, "block status of a bitmap removed before GO answered (as clean)"
PY
  stop_serve "$SERVE_PID"
done

# qemu:allocation-depth over a backing chain, against qemu-nbd -A.
qemu-img create -q -f qcow2 db.qcow2 16M
qemu-io -c 'write 4M 2M' db.qcow2 >/dev/null
qemu-img create -q -f qcow2 -b db.qcow2 -F qcow2 dt.qcow2
qemu-io -c 'write 5M 2M' -c 'write -z 10M 1M' dt.qcow2 >/dev/null
nbdinfo --map=qemu:allocation-depth -- [ qemu-nbd -r -f qcow2 -A dt.qcow2 ] >want.depth
grep -q "backing depth 2" want.depth || bad "qemu-nbd shows no backing depth: the comparison would be empty"
for build in "$QK_PLAIN" "$QK_ASAN"; do
  [ -x "$build" ] || continue
  start_serve "$build" pid --export name=vm0,file=dt.qcow2,readonly=on --socket "$work/s.sock"
  nbdinfo --map=qemu:allocation-depth "nbd+unix:///vm0?socket=$work/s.sock" >got.depth 2>&1
  diff want.depth got.depth >diff.out || { bad "$build: allocation depth differs from qemu-nbd's"; cat diff.out; }
  nbdinfo --list "nbd+unix:///?socket=$work/s.sock" | grep -q "qemu:allocation-depth" || bad "$build: allocation depth not listed"
  stop_serve "$SERVE_PID"
done
exit $status
