#!/usr/bin/env bash
# Encrypted images (made by qemu-img: LUKS with several ciphers and modes,
# the legacy AES method on v2): qcowkit holds no keys, so it reads no
# encrypted data, but `info` describes them as qemu-img info does without
# a key:
#  - human and JSON output, and --backing-chain through an encrypted layer,
#    byte for byte as qemu-img's (with a backing file, a data file, a
#    bitmap, a snapshot);
#  - every other command refuses them, exit 1, and the file is unchanged;
#  - a damaged LUKS header or crypto header extension is refused with
#    qemu-img's message (where qemu-img has one: it crashes on a LUKS image
#    without the extension), and no damage crashes the ASan build.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"
sec=(--object secret,id=sec0,data=pw)
luks() { # NAME [SIZE] [MORE OPTIONS]: a LUKS image; key derivation kept short
  qemu-img create -q -f qcow2 "${sec[@]}" \
    -o "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10${3:+,$3}" "$1" "${2:-16M}"
}
keyed() { # IMAGE: the image as qemu-img opens it with its key
  echo "driver=qcow2,file.filename=$1,encrypt.key-secret=sec0"
}
same_info() { # IMAGE WHAT [INFO OPTIONS]: our info equals qemu-img's
  local img=$1 what=$2
  shift 2
  local o
  for o in "" --output=json; do
    if ! diff <("$QK" info $o "$@" "$img" 2>&1; echo "rc=$?") <(qemu-img info $o "$@" "$img" 2>&1; echo "rc=$?") \
        >diff.out; then
      bad "$what: info $o $* differs from qemu-img's"
      head -n 30 diff.out
    fi
  done
}

# Made once (qemu-img spends seconds measuring key derivation for each
# new LUKS image); other ciphers are the same header with other names.
luks x.qcow2
same_info x.qcow2 "LUKS, default cipher"
lukspatch() { # OUT CIPHER MODE HASH KEY_BYTES: x.qcow2 with other LUKS names
  cp x.qcow2 "$1"
  python3 - "$@" <<'PY'
import struct, sys
out, cipher, mode, hsh, kb = sys.argv[1:6]
b = bytearray(open(out, "rb").read())
pos = struct.unpack(">I", b[100:104])[0]
while struct.unpack(">I", b[pos:pos + 4])[0] != 0x0537be77:
    pos += 8 + ((struct.unpack(">I", b[pos + 4:pos + 8])[0] + 7) & ~7)
h = struct.unpack(">Q", b[pos + 8:pos + 16])[0]
for off, s in ((8, cipher), (40, mode), (72, hsh)):
    b[h + off:h + off + 32] = s.encode().ljust(32, b"\0")
b[h + 108:h + 112] = struct.pack(">I", int(kb))
open(out, "wb").write(b)
PY
}
lukspatch cbc.qcow2 aes cbc-essiv:sha256 sha512 16
same_info cbc.qcow2 "LUKS, aes-128 cbc essiv"
lukspatch ser.qcow2 serpent cbc-plain sha1 24
same_info ser.qcow2 "LUKS, serpent-192 cbc plain"
grep -q 'cipher alg: serpent-192' <("$QK" info ser.qcow2) || bad "serpent-192 is not shown"
lukspatch tf.qcow2 twofish ctr-plain64 ripemd160 32
same_info tf.qcow2 "LUKS, twofish-256 ctr plain64"
qemu-img create -q -f qcow2 "${sec[@]}" -o compat=0.10,encrypt.format=aes,encrypt.key-secret=sec0 aes.qcow2 16M
same_info aes.qcow2 "legacy AES on v2"

# Written through qemu's tools with the key: a snapshot, data, a bitmap.
qemu-io "${sec[@]}" --image-opts "$(keyed x.qcow2)" -c 'write -P 5 0 64k' >/dev/null || bad "qemu-io write"
qemu-img snapshot "${sec[@]}" -c s1 --image-opts "$(keyed x.qcow2)" || bad "qemu-img snapshot -c"
qemu-img bitmap "${sec[@]}" --add --image-opts "$(keyed x.qcow2)" b1 || bad "qemu-img bitmap --add"
same_info x.qcow2 "LUKS with a snapshot and a bitmap"
qemu-img create -q -f qcow2 base.qcow2 16M
luks over.qcow2 16M "data_file=over.data"
same_info over.qcow2 "LUKS with a data file"
cp x.qcow2 enc-top.qcow2
qemu-img rebase "${sec[@]}" -u -b base.qcow2 -F qcow2 --image-opts "$(keyed enc-top.qcow2)" || bad "qemu-img rebase -u"
same_info enc-top.qcow2 "encrypted overlay" --backing-chain
qemu-img create -q -f qcow2 -b x.qcow2 -F qcow2 plain-top.qcow2
same_info plain-top.qcow2 "plain overlay over an encrypted base" --backing-chain

# Everything else refuses, and leaves the file as it was.
md5sum x.qcow2 plain-top.qcow2 >sums
for c in "check x.qcow2" "check -r all x.qcow2" "map x.qcow2" "compare x.qcow2 base.qcow2" \
         "convert -O raw x.qcow2 o.raw" "io -c 'read 0 4k' x.qcow2" "io -r -c 'read 0 4k' x.qcow2" \
         "snapshot -l x.qcow2" "snapshot -c s2 x.qcow2" "snapshot -a s1 x.qcow2" "snapshot -d s1 x.qcow2" \
         "measure x.qcow2" "resize x.qcow2 32M" "amend -o lazy_refcounts=on x.qcow2" "bitmap --add x.qcow2 b2" \
         "commit plain-top.qcow2" "rebase -b '' plain-top.qcow2" "dd if=x.qcow2 of=o.raw bs=64k count=1" \
         "bench -c 10 x.qcow2" "map plain-top.qcow2"; do
  eval "\"\$QK\" $c" >out 2>&1
  rc=$?
  [ $rc = 1 ] || [ $rc = 2 -a "${c%% *}" = compare ] || { bad "$c: exit $rc, 1 expected"; cat out; }
  grep -q 'encrypted images are not supported' out || { bad "$c: the refusal does not say why"; cat out; }
  grep -q 'Sanitizer\|runtime error' out && { bad "$c: sanitizer report"; cat out; }
done
md5sum -c --quiet sums || bad "a refused command changed an encrypted image"
[ -e o.raw ] && bad "a refused copy left an output"

# Damaged headers: qemu-img's message (after its own program name), or
# ours where qemu-img has none.
python3 - <<'EOF'
import struct
src = open("x.qcow2", "rb").read()
def ext_pos(b):
    pos = struct.unpack(">I", b[100:104])[0]
    while True:
        t, l = struct.unpack(">II", b[pos:pos + 8])
        if t == 0x0537be77:
            return pos
        pos += 8 + ((l + 7) & ~7)
def luks(b):
    return struct.unpack(">Q", b[ext_pos(b) + 8:ext_pos(b) + 16])[0]
def put(b, off, data):
    b[off:off + len(data)] = data
def slot(b, i, field):
    return luks(b) + 208 + 48 * i + field
cases = {
    "magic": lambda b: put(b, luks(b), b"X"),
    "version": lambda b: put(b, luks(b) + 6, b"\0\2"),
    "cipher": lambda b: put(b, luks(b) + 8, b"foo".ljust(32, b"\0")),
    "cipher-noterm": lambda b: put(b, luks(b) + 8, b"a" * 32),
    "mode": lambda b: put(b, luks(b) + 40, b"gcm-plain64".ljust(32, b"\0")),
    "mode-nodash": lambda b: put(b, luks(b) + 40, b"xts".ljust(32, b"\0")),
    "mode-noterm": lambda b: put(b, luks(b) + 40, b"x" * 32),
    "ivgen": lambda b: put(b, luks(b) + 40, b"xts-benbi".ljust(32, b"\0")),
    "hash": lambda b: put(b, luks(b) + 72, b"sha3".ljust(32, b"\0")),
    "hash-noterm": lambda b: put(b, luks(b) + 72, b"x" * 32),
    "keybytes": lambda b: put(b, luks(b) + 108, struct.pack(">I", 0)),
    "payload": lambda b: put(b, luks(b) + 104, struct.pack(">I", 7)),
    "slot-state": lambda b: put(b, slot(b, 0, 0), struct.pack(">I", 0x12345678)),
    "slot-iters": lambda b: put(b, slot(b, 1, 0), struct.pack(">I", 0x00AC71F3)),
    "slot-stripes": lambda b: put(b, slot(b, 1, 44), struct.pack(">I", 10)),
    "slot-header": lambda b: put(b, slot(b, 0, 40), struct.pack(">I", 7)),
    "slot-payload": lambda b: put(b, slot(b, 7, 40), struct.pack(">I", 3537)),
    "slot-overlap": lambda b: put(b, slot(b, 1, 40), struct.pack(">I", 9)),
    "ext-unaligned": lambda b: put(b, ext_pos(b) + 8, struct.pack(">Q", luks(b) + 512)),
    "ext-past-eof": lambda b: put(b, ext_pos(b) + 8, struct.pack(">Q", 1 << 40)),
    "ext-zero": lambda b: put(b, ext_pos(b) + 8, struct.pack(">Q", 0)),
    "ext-short": lambda b: put(b, ext_pos(b) + 16, struct.pack(">Q", 16)),
    "ext-gone": lambda b: put(b, ext_pos(b), struct.pack(">I", 0x12345678)),
    "aes-with-ext": lambda b: put(b, 32, struct.pack(">I", 1)),
    "method-3": lambda b: put(b, 32, struct.pack(">I", 3)),
}
for name, fn in cases.items():
    b = bytearray(src)
    fn(b)
    open("bad-%s.qcow2" % name, "wb").write(b)
EOF
# qemu-img's words differ (or it crashes) on these; ours name the problem.
declare -A ours=(
  [ext-past-eof]="the LUKS header (offset 0x10000000000, 2068480 bytes) does not fit in the file"
  [ext-zero]="the LUKS header (offset 0) overlaps the image header"
  [ext-short]="the LUKS header (offset 0x40000, 16 bytes) does not fit in the file"
  [ext-gone]="the image is LUKS-encrypted but has no crypto header extension"
)
for f in bad-*.qcow2; do
  n=${f#bad-}; n=${n%.qcow2}
  k=$("$QK" info "$f" 2>&1; echo "rc=$?")
  echo "$k" | grep -q 'Sanitizer\|runtime error' && { bad "$n: sanitizer report"; echo "$k"; }
  if [ -n "${ours[$n]:-}" ]; then
    want="qcowkit: Could not open '$f': ${ours[$n]}"$'\n'"rc=1"
  else
    want=$(qemu-img info "$f" 2>&1 | sed 's/^qemu-img:/qcowkit:/'; echo "rc=${PIPESTATUS[0]}")
  fi
  [ "$k" = "$want" ] || { bad "$n: info says"; echo "$k"; echo "expected:"; echo "$want"; }
done
exit $fail
