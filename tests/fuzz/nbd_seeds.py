#!/usr/bin/env python3
"""Writes seed inputs for fuzz_nbd: what an NBD client sends, byte for
byte (fixed newstyle handshake, options, then requests), into DIR.
The harness serves exports "rw" (the default, 1 MiB qcow2) and "ro"."""
import os
import struct
import sys

OPTS = 0x49484156454F5054
REQ = 0x25609513


def opt(o, data=b""):
    return struct.pack(">QII", OPTS, o, len(data)) + data


def req(t, off=0, length=0, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", REQ, flags, t, cookie, off, length) + payload


def name(n):
    return struct.pack(">I", len(n)) + n


def go(n, infos=()):
    return opt(7, name(n) + struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i) for i in infos))


def meta(o, export, queries):
    return opt(o, name(export) + struct.pack(">I", len(queries)) + b"".join(name(q) for q in queries))


FLAGS = struct.pack(">I", 3)  # fixed newstyle, no zeroes
seeds = {
    "go-structured": FLAGS + opt(8) + meta(10, b"rw", [b"base:allocation"]) + go(b"rw", (0, 1, 2, 3))
    + req(0, 0, 4096) + req(0, 65536, 131072, flags=4, cookie=2) + req(7, 0, 1 << 20, cookie=3)
    + req(7, 4096, 8192, flags=8, cookie=4) + req(1, 512, 1024, flags=1, cookie=5, payload=b"\xab" * 1024)
    + req(6, 8192, 65536, flags=2 | 16, cookie=6) + req(4, 131072, 65536, cookie=7) + req(3, cookie=8)
    + req(5, 0, 65536, cookie=9) + req(0, 1 << 20, 1, cookie=10) + req(2),
    "go-simple": FLAGS + go(b"", (3,)) + req(0, 100, 5000) + req(1, 4095, 3, payload=b"xyz")
    + req(6, 0, 1 << 20) + req(3) + req(9, cookie=11) + req(2),
    "export-name-ro": struct.pack(">I", 1) + opt(1, b"ro") + req(0, 0, 512) + req(1, 0, 4, payload=b"abcd")
    + req(4, 0, 512) + req(2),
    "list-info": FLAGS + opt(3) + opt(6, name(b"ro") + struct.pack(">H", 1) + struct.pack(">H", 2))
    + meta(9, b"rw", []) + meta(9, b"ro", [b"base:"]) + opt(6, name(b"none") + b"\0\0") + opt(99, b"junk") + opt(2),
    "oversized": FLAGS + opt(8) + opt(42, b"\0" * 70000) + go(b"rw") + req(0, 0, (32 << 20) + 1)
    + req(1, 0, 1 << 20, payload=b"\1" * 100),
}
os.makedirs(sys.argv[1], exist_ok=True)
for k, v in seeds.items():
    with open(os.path.join(sys.argv[1], k), "wb") as f:
        f.write(v)
