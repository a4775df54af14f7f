"""Reads the write log that QCOWKIT_LOG_WRITES makes qcowkit write
(format: src/block/writelog.h) and appends markers of our own to it.

Owns: the record layout on the Python side.
"""
import os
import struct

MAGIC = 0x4C574B51
HDR = struct.Struct("<IHHIIQQQ")  # magic type flags file pid seq off len
assert HDR.size == 40

OPEN, WRITE, ZERO, DISCARD, TRUNCATE, FLUSH_BEGIN, FLUSH_END, MARK = range(1, 9)
NAMES = {OPEN: "open", WRITE: "write", ZERO: "zero", DISCARD: "discard",
         TRUNCATE: "truncate", FLUSH_BEGIN: "flush_begin", FLUSH_END: "flush_end",
         MARK: "mark"}
F_UNMAP = 1
F_FUA = 2
PAYLOAD = (OPEN, WRITE, MARK)


class Rec:
    __slots__ = ("type", "flags", "file", "pid", "seq", "off", "len", "data")

    def __init__(self, type_, flags, file_, pid, seq, off, len_, data):
        self.type, self.flags, self.file, self.pid = type_, flags, file_, pid
        self.seq, self.off, self.len, self.data = seq, off, len_, data

    def result(self):
        """FLUSH_END: the flush's result as a signed number."""
        return self.len - (1 << 64) if self.len >= 1 << 63 else self.len

    def __repr__(self):
        extra = ""
        if self.type == MARK:
            extra = " %r" % self.data.decode(errors="replace")
        elif self.type in (FLUSH_BEGIN, FLUSH_END):
            extra = " id=%d" % self.off
        else:
            extra = " off=%d len=%d" % (self.off, self.len)
        return "%s%s" % (NAMES.get(self.type, "?"), extra)


def read_log(path):
    """All records, in file order. A torn last record (the writer died in
    the middle of an append) ends the list; anything else malformed raises."""
    with open(path, "rb") as f:
        buf = f.read()
    out = []
    pos = 0
    while pos + HDR.size <= len(buf):
        magic, type_, flags, file_, pid, seq, off, len_ = HDR.unpack_from(buf, pos)
        if magic != MAGIC:
            raise ValueError("bad record magic at %d in %s" % (pos, path))
        pos += HDR.size
        data = b""
        if type_ in PAYLOAD:
            if pos + len_ > len(buf):
                break
            data = buf[pos:pos + len_]
            pos += len_
        out.append(Rec(type_, flags, file_, pid, seq, off, len_, data))
    return out


def records_for(records, image):
    """The records that touch the host file `image` (by real path), plus
    every MARK, in order. Files are told apart by (pid, file id)."""
    want = os.path.realpath(image).encode()
    ours = set()
    out = []
    for r in records:
        if r.type == OPEN:
            if r.data == want:
                ours.add((r.pid, r.file))
            continue
        if r.type == MARK or (r.pid, r.file) in ours:
            out.append(r)
    return out


def append_mark(path, text):
    """Appends a MARK record, as `mark` in `qcowkit io` does, for steps run
    by other commands (snapshot) once they have exited."""
    data = text.encode()
    rec = HDR.pack(MAGIC, MARK, 0, 0, os.getpid(), 0, 0, len(data)) + data
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, rec)
    finally:
        os.close(fd)
