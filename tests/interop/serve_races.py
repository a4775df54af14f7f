#!/usr/bin/env python3
"""Control-socket races in `qcowkit serve` (for serve-races.sh). Each case
starts a server, races two commands (or a command and an NBD client), and
checks that the server is still alive, reports no sanitizer error, stops
on SIGTERM with status 0 and leaves a check-clean image:

- bitmap: clear, enable or merge into a stored bitmap while another
  connection removes it (or a merge source): the change marks the stored
  copy in use first, which waits on the disk, and the remove freed the
  bitmap under it;
- backup: backup-start with a bitmap while another connection removes the
  bitmap, at delays from 0 to 10 ms (the start waits twice before the job
  owns the bitmap);
- switch: 64 block-status requests for two contexts whose replies the
  client reads only after a mirror switched the export and closed the old
  node, which each request was still using;
- dismiss: job-complete wait=true while another connection dismisses the
  job the moment it finishes;
- quit: SIGTERM while a control client sends requests without reading the
  replies: the server must still stop within its grace period.

Usage: serve_races.py QCOWKIT CASE WORKDIR
"""
import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

QK, CASE, WORK = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("badclient", os.path.join(os.path.dirname(__file__), "nbd-badclient.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, cwd=WORK)


class Ctl:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.buf = b""

    def send(self, cmd, **args):
        self.s.sendall((json.dumps({"execute": cmd, "arguments": args}) + "\n").encode())

    def recv(self, timeout=30):
        self.s.settimeout(timeout)
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("control socket closed")
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def cmd(self, cmd, **args):
        self.send(cmd, **args)
        return self.recv()


class Serve:
    def __init__(self, export):
        self.nbd, self.ctl = os.path.join(WORK, "nbd.sock"), os.path.join(WORK, "ctl.sock")
        pf = os.path.join(WORK, "pid")
        for f in (self.nbd, self.ctl, pf):
            if os.path.exists(f):
                os.unlink(f)
        self.log = os.path.join(WORK, "serve.log")
        self.p = subprocess.Popen([QK, "serve", "--pidfile", pf, "--socket", self.nbd, "--control", self.ctl,
                                   "--export", export], stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                  cwd=WORK)
        for _ in range(400):
            if os.path.exists(pf) and os.path.getsize(pf):
                return
            assert self.p.poll() is None, "serve died at start: " + open(self.log).read()
            time.sleep(0.05)
        raise AssertionError("serve did not start")

    def cmd(self, cmd, **args):
        c = Ctl(self.ctl)
        r = c.cmd(cmd, **args)
        c.s.close()
        return r

    def wait_job(self, status):
        for _ in range(600):
            for j in self.cmd("query-jobs")["return"]:
                if j["status"] == status:
                    return j
            time.sleep(0.05)
        raise AssertionError("no job reached %s" % status)

    def stop(self, what, limit=30):
        out = open(self.log).read()
        assert self.p.poll() is None, "%s: serve died (%s)\n%s" % (what, self.p.poll(), out[-3000:])
        t0 = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(limit)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise AssertionError("%s: SIGTERM did not stop serve in %d s" % (what, limit))
        out = open(self.log).read()
        assert rc == 0 and "Sanitizer" not in out and "runtime error" not in out, \
            "%s: exit %d\n%s" % (what, rc, out[-3000:])
        return time.monotonic() - t0


def check(img, what):
    r = subprocess.run(["qemu-img", "check", "-q", img], cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    assert r.returncode == 0, "%s: qemu-img check: %s" % (what, r.stdout)


def bitmap_races():
    for op in ("clear", "enable", "merge", "merge-src"):
        sh("rm -f a.qcow2 && qemu-img create -q -f qcow2 a.qcow2 64M && "
           "qemu-img bitmap --add --disable a.qcow2 b && qemu-img bitmap --add --disable a.qcow2 c && "
           "qemu-io -c 'write -P 0x11 0 8M' a.qcow2")
        s = Serve("name=a,file=a.qcow2")
        a, b = Ctl(s.ctl), Ctl(s.ctl)
        if op == "clear":
            a.send("block-dirty-bitmap-clear", export="a", name="b")
        elif op == "enable":
            a.send("block-dirty-bitmap-enable", export="a", name="b")
        elif op == "merge":
            a.send("block-dirty-bitmap-merge", export="a", target="b", bitmaps=["c"])
        else:
            a.send("block-dirty-bitmap-merge", export="a", target="c", bitmaps=["b"])
        b.send("block-dirty-bitmap-remove", export="a", name="b")
        ra, rb = a.recv(), b.recv()
        # One goes first; the other is refused (in use, or not found).
        assert "return" in ra or "return" in rb, "%s: both failed: %s %s" % (op, ra, rb)
        s.stop("bitmap " + op)
        check("a.qcow2", "bitmap " + op)
        print("ok: bitmap %s raced with remove: %s / %s" % (op, "ok" if "return" in ra else ra["error"]["desc"],
                                                           "ok" if "return" in rb else rb["error"]["desc"]))


def backup_race():
    for delay_ms in range(0, 11):
        sh("rm -f a.qcow2 t.qcow2 && qemu-img create -q -f qcow2 a.qcow2 64M && "
           "qemu-img bitmap --add --disable a.qcow2 b && qemu-io -c 'write -P 0x11 0 8M' a.qcow2 && "
           "qemu-img create -q -f qcow2 t.qcow2 64M")
        s = Serve("name=a,file=a.qcow2")
        a, b = Ctl(s.ctl), Ctl(s.ctl)
        a.send("backup-start", export="a", target=os.path.join(WORK, "t.qcow2"), sync="bitmap", bitmap="b",
               id="j", speed=1 << 20)
        time.sleep(delay_ms / 1000)
        b.send("block-dirty-bitmap-remove", export="a", name="b")
        a.recv(), b.recv()
        s.stop("backup-start, remove after %d ms" % delay_ms)
        check("a.qcow2", "backup-start, remove after %d ms" % delay_ms)
    print("ok: backup-start raced with a bitmap remove at 0-10 ms")


def switch_race():
    sh("rm -f src.qcow2 dst.qcow2 && qemu-img create -q -f qcow2 src.qcow2 256M && qemu-io " +
       " ".join("-c 'write -P 0x%02x %dK 64K'" % (i % 250 + 1, i * 128) for i in range(512)) + " src.qcow2")
    s = Serve("name=disk,file=src.qcow2")
    c = bc.Conn.__new__(bc.Conn)
    c.s = socket.socket(socket.AF_UNIX)
    c.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.s.settimeout(60)
    c.s.connect(s.nbd)
    c.cookie = 0
    c.greet()
    c.structured_replies()
    qs = [b"base:allocation", b"qemu:allocation-depth"]
    c.opt(bc.OPT_SET_META, struct.pack(">I", 4) + b"disk" + struct.pack(">I", len(qs)) +
          b"".join(struct.pack(">I", len(q)) + q for q in qs))
    c.replies_until_final()
    c.go("disk", structured=False, meta=False)
    c.structured = True
    for _ in range(64):
        c.request(bc.CMD_BS, 0, 256 << 20)
    time.sleep(1)
    assert "return" in s.cmd("mirror-start", export="disk", target=os.path.join(WORK, "dst.qcow2"), id="m")
    s.wait_job("ready")
    r = s.cmd("job-complete", id="m", switch=True, wait=True)
    assert r.get("return", {}).get("status") == "completed", r
    n = 0
    for _ in range(64):
        _, err, _ = c.answer()
        assert err == 0, "block status failed: %d" % err
        n += 1
    c.s.close()
    s.stop("block status across a switch")
    check("dst.qcow2", "block status across a switch")
    print("ok: %d block-status replies read after the switch" % n)


def dismiss_race():
    sh("rm -f src.qcow2 && qemu-img create -q -f qcow2 src.qcow2 16M && qemu-io -c 'write -P 0x5a 0 4M' src.qcow2")
    s = Serve("name=disk,file=src.qcow2")
    for it in range(10):
        if os.path.exists(os.path.join(WORK, "dst.qcow2")):
            os.unlink(os.path.join(WORK, "dst.qcow2"))
        assert "return" in s.cmd("mirror-start", export="disk", target=os.path.join(WORK, "dst.qcow2"), id="m")
        s.wait_job("ready")
        a, b = Ctl(s.ctl), Ctl(s.ctl)
        done = []

        def dismiss():
            while not done:
                if "return" in b.cmd("job-dismiss", id="m"):
                    return

        t = threading.Thread(target=dismiss)
        t.start()
        a.send("job-complete", id="m", wait=True)
        ra = a.recv()
        done.append(1)
        t.join()
        assert ra.get("return", {}).get("status") == "completed", "round %d: %s" % (it, ra)
        for j in s.cmd("query-jobs")["return"]:
            s.cmd("job-dismiss", id=j["id"])
    s.stop("job-complete wait=true against job-dismiss")
    print("ok: job-complete wait=true raced with job-dismiss (10 rounds)")


def quit_race():
    sh("rm -f a.qcow2 && qemu-img create -q -f qcow2 a.qcow2 64M")
    s = Serve("name=a,file=a.qcow2")
    a = Ctl(s.ctl)
    a.s.setblocking(False)
    line = (json.dumps({"execute": "query-exports"}) + "\n").encode() * 100
    try:
        for _ in range(10000):
            a.s.send(line)
    except BlockingIOError:
        pass
    time.sleep(1)
    took = s.stop("SIGTERM with a control client not reading", limit=20)
    print("ok: stopped in %.1f s with a control client not reading its replies" % took)


{"bitmap": bitmap_races, "backup": backup_race, "switch": switch_race, "dismiss": dismiss_race,
 "quit": quit_race}[CASE]()
