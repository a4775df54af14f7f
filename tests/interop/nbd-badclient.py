#!/usr/bin/env python3
"""A deliberately rude NBD client for the nbd-badinput test. Speaks the
wire protocol by hand so it can send what real clients never do, and
checks that each mistake gets the right NBD error (or, where the protocol
says so, only this connection is closed). Usage: nbd-badclient.py SOCKET"""
import socket
import struct
import time
import sys

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPMAGIC = 0x3E889045565A9
REQ = 0x25609513
SIMPLE = 0x67446698
STRUCT = 0x668E33EF
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_INFO, OPT_GO, OPT_SR = 1, 2, 3, 6, 7, 8
OPT_LIST_META, OPT_SET_META = 9, 10
DF_FLAG = 1 << 7
REP_ACK, REP_INFO, REP_META = 1, 3, 4
ERR_UNSUP, ERR_INVALID, ERR_UNKNOWN, ERR_TOO_BIG = 2**31 + 1, 2**31 + 3, 2**31 + 6, 2**31 + 9
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_ZERO, CMD_BS = range(8)
EPERM, EINVAL, ENOSPC, ENOTSUP = 1, 22, 28, 95
FAST_ZERO = 1 << 4
MiB = 1 << 20
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)
    else:
        print("ok:", what)


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.cookie = 0

    def recvn(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise EOFError("server closed the connection")
            buf += chunk
        return buf

    def closed_by_server(self):
        try:
            return self.s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def greet(self, cflags=3):
        magic, opt, hflags = struct.unpack(">QQH", self.recvn(18))
        assert magic == NBDMAGIC and opt == IHAVEOPT
        self.s.sendall(struct.pack(">I", cflags))

    def opt(self, o, data=b"", length=None):
        self.s.sendall(struct.pack(">QII", IHAVEOPT, o, len(data) if length is None else length) + data)

    def reply(self):
        magic, o, typ, ln = struct.unpack(">QIII", self.recvn(20))
        assert magic == REPMAGIC, hex(magic)
        return o, typ, self.recvn(ln)

    def replies_until_final(self):
        out = []
        while True:
            o, typ, data = self.reply()
            out.append((typ, data))
            if typ != REP_INFO and typ != REP_META and typ != 2:
                return out

    def meta(self, export, query, opt=OPT_SET_META):
        """SET (or LIST) one meta context query for export (bytes); the replies."""
        self.opt(opt, struct.pack(">I", len(export)) + export + struct.pack(">II", 1, len(query)) + query)
        return self.replies_until_final()

    def structured_replies(self):
        self.opt(OPT_SR)
        assert self.reply()[1] == REP_ACK

    def send_go(self, name):
        """NBD_OPT_GO to NAME, acknowledged: its replies."""
        n = name.encode()
        self.opt(OPT_GO, struct.pack(">I", len(n)) + n + struct.pack(">H", 0))
        r = self.replies_until_final()
        assert r[-1][0] == REP_ACK, r
        return r

    def go(self, name, structured=True, meta=True):
        if structured:
            self.structured_replies()
        if meta:
            r = self.meta(name.encode(), b"base:allocation")
            assert r[-1][0] == REP_ACK, r
        r = self.send_go(name)
        self.structured = structured
        # NBD_INFO_EXPORT: size, then the transmission flags.
        info = [d for t, d in r if t == REP_INFO and d[:2] == b"\0\0"]
        self.tflags = struct.unpack(">H", info[0][10:12])[0] if info else None

    def request(self, typ, off, length, flags=0, payload=None, send_len=None):
        self.cookie += 1
        self.s.sendall(struct.pack(">IHHQQI", REQ, flags, typ, self.cookie, off, length))
        if payload is not None:
            self.s.sendall(payload)
        return self.cookie

    def answer(self):
        """Returns (cookie, error, data) for one whole reply."""
        magic = struct.unpack(">I", self.recvn(4))[0]
        if magic == SIMPLE:
            err, cookie = struct.unpack(">IQ", self.recvn(12))
            return cookie, err, None
        assert magic == STRUCT, hex(magic)
        data = b""
        err = 0
        while True:
            flags, typ, cookie, ln = struct.unpack(">HHQI", self.recvn(16))
            body = self.recvn(ln)
            if typ & 0x8000:
                err = struct.unpack(">I", body[:4])[0]
            elif typ == 1:
                data += body[8:]
            elif typ == 2:
                data += b"\0" * struct.unpack(">I", body[8:12])[0]
            elif typ == 5:
                data += body
            if flags & 1:
                return cookie, err, data
            magic = struct.unpack(">I", self.recvn(4))[0]
            assert magic == STRUCT

    def read_simple(self, length):
        cookie, err, _ = self.answer()
        data = self.recvn(length) if err == 0 else None
        return cookie, err, data


def main():
    path = sys.argv[1]

    # Unknown client flags: the protocol says close.
    c = Conn(path)
    c.greet(cflags=0x80)
    check(c.closed_by_server(), "unknown client flags close the connection")

    # Garbage instead of an option.
    c = Conn(path)
    c.greet()
    c.s.sendall(b"GARBAGE!" * 4)
    check(c.closed_by_server(), "bad option magic closes the connection")

    # Unknown option, malformed options, unknown export: errors, then GO works.
    c = Conn(path)
    c.greet()
    c.opt(99, b"xyz")
    check(c.reply()[1] == ERR_UNSUP, "unknown option -> NBD_REP_ERR_UNSUP")
    c.opt(OPT_SR, b"x")
    check(c.reply()[1] == ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY with data -> ERR_INVALID")
    c.opt(OPT_LIST, b"x")
    check(c.reply()[1] == ERR_INVALID, "NBD_OPT_LIST with data -> ERR_INVALID")
    c.opt(OPT_INFO, struct.pack(">I", 1000) + b"ab")
    check(c.reply()[1] == ERR_INVALID, "NBD_OPT_INFO with a lying name length -> ERR_INVALID")
    c.opt(OPT_SET_META, struct.pack(">I", 0) + struct.pack(">I", 0))
    check(c.reply()[1] == ERR_INVALID, "SET_META_CONTEXT before structured replies -> ERR_INVALID")
    c.opt(OPT_SR)
    check(c.reply()[1] == REP_ACK, "NBD_OPT_STRUCTURED_REPLY -> ACK")
    c.opt(OPT_SR)
    check(c.reply()[1] == ERR_INVALID, "a second NBD_OPT_STRUCTURED_REPLY -> ERR_INVALID")
    c.opt(OPT_GO, struct.pack(">I", 4) + b"nope" + struct.pack(">H", 0))
    check(c.reply()[1] == ERR_UNKNOWN, "NBD_OPT_GO for a missing export -> ERR_UNKNOWN")
    c.opt(OPT_INFO, b"\0" * 100, length=100000)
    c.s.sendall(b"\0" * (100000 - 100))
    check(c.reply()[1] == ERR_TOO_BIG, "a 100 kB option -> ERR_TOO_BIG")
    c.go("rw", structured=False)
    c.structured = True
    check(c.tflags is not None and c.tflags & DF_FLAG, "NBD_FLAG_SEND_DF offered with structured replies")
    cookie = c.request(CMD_READ, 0, 4096)
    ck, err, data = c.answer()
    check(ck == cookie and err == 0 and len(data) == 4096, "read after option errors works")

    # Transmission errors on a structured connection.
    cookie = c.request(CMD_READ, 0, 32 * MiB + 1)
    check(c.answer()[1] == EINVAL, "read over 32 MiB -> EINVAL")
    big = 33 * MiB
    cookie = c.request(CMD_WRITE, 0, big, payload=b"\x5a" * big)
    check(c.answer()[1] == EINVAL, "write over 32 MiB -> EINVAL (payload consumed)")
    c.request(CMD_READ, 0, 512)
    ck, err, data = c.answer()
    check(err == 0 and data == b"\0" * 512, "stream still in step after an oversized write")
    c.request(CMD_READ, 64 * MiB - 100, 4096)
    check(c.answer()[1] == EINVAL, "read past the end -> EINVAL")
    c.request(CMD_READ, 2**64 - 512, 4096)
    check(c.answer()[1] == EINVAL, "read with a wrapping offset -> EINVAL")
    c.request(CMD_WRITE, 64 * MiB - 100, 4096, payload=b"\1" * 4096)
    check(c.answer()[1] == ENOSPC, "write past the end -> ENOSPC")
    c.request(CMD_ZERO, 64 * MiB, 4096)
    check(c.answer()[1] == ENOSPC, "write zeroes past the end -> ENOSPC")
    c.request(CMD_TRIM, 64 * MiB - 512, 4096)
    check(c.answer()[1] == EINVAL, "trim past the end -> EINVAL (not a write)")
    c.request(77, 0, 4096)
    check(c.answer()[1] == EINVAL, "unknown command -> EINVAL")
    # proto.md: with NBD_FLAG_SEND_FUA offered, FUA is accepted on every
    # command (clients set it on reads and flushes too).
    c.request(CMD_READ, 0, 4096, flags=1)
    check(c.answer()[1] == 0, "read with the FUA flag is accepted")
    c.request(CMD_FLUSH, 0, 0, flags=1)
    check(c.answer()[1] == 0, "flush with the FUA flag is accepted")
    c.request(CMD_CACHE, 0, 4096, flags=1)
    check(c.answer()[1] == 0, "cache with the FUA flag is accepted")
    c.request(CMD_BS, 0, 4096, flags=1)
    check(c.answer()[1] == 0, "block status with the FUA flag is accepted")
    c.request(CMD_READ, 0, 4096, flags=1 << 2)
    check(c.answer()[1] == 0, "read with DF on a structured connection")
    c.request(CMD_FLUSH, 0, 0, flags=1 << 2)
    check(c.answer()[1] == EINVAL, "flush with DF -> EINVAL")
    c.request(CMD_WRITE, MiB, 4096, flags=1, payload=b"\x42" * 4096)
    check(c.answer()[1] == 0, "write with FUA")
    c.request(CMD_ZERO, 2 * MiB, MiB, flags=1 << 4)
    ck, err, _ = c.answer()
    check(err in (0, 95), "fast zero: done or ENOTSUP")
    c.request(CMD_BS, 0, 64 * MiB)
    ck, err, data = c.answer()
    check(err == 0 and len(data) >= 12 and struct.unpack(">I", data[:4])[0] == 1,
          "block status answers in the negotiated context")
    c.request(CMD_BS, 0, 0)
    check(c.answer()[1] == EINVAL, "block status of length 0 -> EINVAL")
    c.request(CMD_CACHE, 0, MiB)
    check(c.answer()[1] == 0, "cache")
    c.request(CMD_FLUSH, 0, 0)
    check(c.answer()[1] == 0, "flush")
    # Pipelined requests all come back.
    cookies = set(c.request(CMD_READ, i * 4096, 4096) for i in range(100))
    got = set()
    for _ in range(100):
        ck, err, data = c.answer()
        got.add(ck)
    check(got == cookies, "100 pipelined reads all answered")
    c.request(CMD_DISC, 0, 0)
    check(c.closed_by_server(), "NBD_CMD_DISC ends the connection")

    # Block status without a negotiated context.
    c = Conn(path)
    c.greet()
    c.go("rw", structured=True, meta=False)
    c.request(CMD_BS, 0, 4096)
    check(c.answer()[1] == EINVAL, "block status without base:allocation -> EINVAL")

    # Contexts set for one export are dropped by GO to another (proto.md).
    c = Conn(path)
    c.greet()
    c.structured_replies()
    assert c.meta(b"rw", b"base:allocation")[-1][0] == REP_ACK
    c.send_go("ro")
    c.request(CMD_BS, 0, 4096)
    check(c.answer()[1] == EINVAL, "contexts set for another export are dropped at GO")

    # ... and by NBD_OPT_EXPORT_NAME to another.
    c = Conn(path)
    c.greet()
    c.structured_replies()
    assert c.meta(b"rw", b"base:allocation")[-1][0] == REP_ACK
    c.opt(OPT_EXPORT_NAME, b"ro")
    c.recvn(10)  # size and flags (NO_ZEROES negotiated)
    c.request(CMD_BS, 0, 4096)
    check(c.answer()[1] == EINVAL, "contexts set for another export are dropped at EXPORT_NAME")

    # SET_META_CONTEXT ignores the bare namespace "base:" (LIST lists it).
    c = Conn(path)
    c.greet()
    c.structured_replies()
    r = c.meta(b"rw", b"base:")
    check([t for t, _ in r] == [REP_ACK], "SET_META_CONTEXT 'base:' selects nothing")
    r = c.meta(b"rw", b"base:", OPT_LIST_META)
    check([t for t, _ in r] == [REP_META, REP_ACK] and r[0][1][4:] == b"base:allocation",
          "LIST_META_CONTEXT 'base:' lists base:allocation")

    # A SET_META_CONTEXT that fails still drops what an earlier one set.
    c = Conn(path)
    c.greet()
    c.structured_replies()
    assert c.meta(b"rw", b"base:allocation")[-1][0] == REP_ACK
    c.opt(OPT_SET_META, struct.pack(">I", 2) + b"rw" + struct.pack(">I", 1))  # a query count, no query
    check(c.reply()[1] == ERR_INVALID, "malformed SET_META_CONTEXT -> ERR_INVALID")
    c.send_go("rw")
    c.request(CMD_BS, 0, 4096)
    check(c.answer()[1] == EINVAL, "a failed SET_META_CONTEXT drops the contexts set before it")

    # NBD_INFO_NAME names the export itself, also when asked for the default.
    c = Conn(path)
    c.greet()
    names = []
    for n in (b"", b"rw"):
        c.opt(OPT_INFO, struct.pack(">I", len(n)) + n + struct.pack(">HH", 1, 1))
        names.append([d[2:] for t, d in c.replies_until_final() if t == REP_INFO and d[:2] == b"\0\1"])
    check(names[1] == [b"rw"] and len(names[0]) == 1 and names[0][0] in (b"rw", b"ro"),
          "NBD_INFO_NAME is the export's name (%r)" % names)

    # FAST_ZERO that would have to write zeros fails with ENOTSUP at once
    # and changes nothing; one the metadata can do succeeds.
    c = Conn(path)
    c.greet()
    c.go("rw")
    c.request(CMD_WRITE, 2 * MiB, 4096, payload=b"\x5a" * 4096)
    check(c.answer()[1] == 0, "write before the fast zeroes")
    c.request(CMD_ZERO, 2 * MiB + 100, 100, flags=FAST_ZERO)
    check(c.answer()[1] == ENOTSUP, "FAST_ZERO inside written data -> ENOTSUP")
    c.request(CMD_READ, 2 * MiB, 4096)
    _, err, data = c.answer()
    check(err == 0 and data == b"\x5a" * 4096, "a refused FAST_ZERO changes nothing")
    c.request(CMD_ZERO, 3 * MiB, 64 * 1024, flags=FAST_ZERO)
    check(c.answer()[1] == 0, "FAST_ZERO of whole clusters succeeds")

    # A client that pipelines 64 reads of 32 MiB and reads no reply: the
    # server buffers at most about two of them (byte budget per client).
    if len(sys.argv) > 2:
        pid = sys.argv[2]
        c = Conn(path)
        c.greet()
        c.go("ro")
        for k in range(64):
            c.request(CMD_READ, (k % 2) * 32 * MiB, 32 * MiB)
        time.sleep(2)
        with open("/proc/%s/status" % pid) as f:
            rss = [int(l.split()[1]) for l in f if l.startswith("VmRSS")][0]
        check(rss < 512 * 1024, "64 pipelined 32 MiB reads hold %d MiB (under 512)" % (rss // 1024))
        c.s.close()

    # Simple replies (no structured reply negotiated).
    c = Conn(path)
    c.greet()
    c.go("rw", structured=False, meta=False)
    check(c.tflags is not None and not c.tflags & DF_FLAG, "no NBD_FLAG_SEND_DF without structured replies")
    c.request(CMD_READ, MiB, 4096, flags=1 << 2)
    check(c.read_simple(4096)[1] == EINVAL, "read with DF on a simple-reply connection -> EINVAL")
    cookie = c.request(CMD_READ, MiB, 4096)
    ck, err, data = c.read_simple(4096)
    check(ck == cookie and err == 0 and data == b"\x42" * 4096, "simple reply carries read data")
    c.request(CMD_READ, 64 * MiB, 1)
    ck, err, data = c.read_simple(1)
    check(err == EINVAL and data is None, "simple error reply has no data")
    # A bad request magic: nothing after it can be framed, so hang up.
    c.s.sendall(b"\xde\xad\xbe\xef" + b"\0" * 24)
    check(c.closed_by_server(), "bad request magic closes the connection")

    # Read-only export.
    c = Conn(path)
    c.greet()
    c.go("ro")
    c.request(CMD_WRITE, 0, 512, payload=b"\1" * 512)
    check(c.answer()[1] == EPERM, "write to read-only export -> EPERM")
    c.request(CMD_TRIM, 0, 512)
    check(c.answer()[1] == EPERM, "trim on read-only export -> EPERM")
    c.request(CMD_ZERO, 0, 512)
    check(c.answer()[1] == EPERM, "write zeroes on read-only export -> EPERM")
    c.request(CMD_READ, 0, 512)
    check(c.answer()[1] == 0, "read on read-only export works")

    # NBD_OPT_EXPORT_NAME for a missing export: the only answer is hanging up.
    c = Conn(path)
    c.greet()
    c.opt(OPT_EXPORT_NAME, b"missing")
    check(c.closed_by_server(), "NBD_OPT_EXPORT_NAME for a missing export closes")

    # NBD_OPT_ABORT is acknowledged.
    c = Conn(path)
    c.greet()
    c.opt(OPT_ABORT)
    check(c.reply()[1] == REP_ACK, "NBD_OPT_ABORT -> ACK")

    # A client that dies in the middle of a write payload.
    c = Conn(path)
    c.greet()
    c.go("rw")
    c.request(CMD_WRITE, 8 * MiB, 4 * MiB)
    c.s.sendall(b"\x77" * (2 * MiB))
    c.s.close()

    # Connections that vanish at every stage of the handshake.
    for cut in range(0, 40, 3):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall((struct.pack(">I", 3) + struct.pack(">QII", IHAVEOPT, OPT_GO, 10) + b"\0" * 10)[:cut])
        s.close()

    print("failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
