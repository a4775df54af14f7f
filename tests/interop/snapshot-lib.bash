# Sourced by the interop/snapshot-* tests (not a test itself: no .sh
# suffix): a scratch folder as the cwd (removed at exit), QK (the ASan
# build when there is one), and the failure and comparison helpers. The
# test ends with `exit $fail`.
set -u
QK=${QCOWKIT_ASAN:-$QCOWKIT}
work=$(mktemp -d "${TEST_DIR:-/tmp}/qk-snap.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# map_layers IMAGE: qemu-img map's ranges with their layer and whether
# each is present and zero (host offsets left out: they differ between
# twins).
map_layers() {
  qemu-img map --output=json "$1" |
    grep -o '"start": [0-9]*, "length": [0-9]*, "depth": [0-9]*, "present": [a-z]*, "zero": [a-z]*'
}
# twin_io WHAT QEMU-IO-ARGS...: the same commands on q.qcow2 by qemu-io
# and on k.qcow2 by qcowkit; k must pass qemu-img check and show the
# same map_layers as q.
twin_io() {
  local what=$1
  shift
  qemu-io "$@" q.qcow2 >/dev/null || bad "$what: qemu-io"
  "$QK" io "$@" k.qcow2 >o.txt 2>&1 || { bad "$what: qcowkit io"; cat o.txt; }
  qemu-img check -q k.qcow2 || bad "$what: check"
  map_layers q.qcow2 >q.map
  map_layers k.qcow2 >k.map
  diff q.map k.map >o.txt || { bad "$what: map differs from qemu-io's twin"; cat o.txt; }
}
# same_list IMAGE WHAT: our listing equals qemu-img's, byte for byte.
same_list() {
  if ! diff <($QK snapshot -l "$1") <(qemu-img snapshot -l "$1") >diff.out; then
    bad "$2: listings differ"
    cat diff.out
  fi
}
# patch_kvm IMAGE: gives the snapshot named kvm (one with VM state) wide
# values: 5 GiB + 1 of VM state, VM clock 100:02:03.456 and icount
# 123456789012 (snapshot table layout from the qcow2 specification).
patch_kvm() {
  python3 - "$1" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
hdr = f.read(72)
n, off = struct.unpack(">IQ", hdr[60:72])
for i in range(n):
    f.seek(off)
    e = f.read(40)
    idlen, namelen = struct.unpack(">HH", e[12:16])
    extra = struct.unpack(">I", e[36:40])[0]
    name = (f.seek(off + 40 + extra), f.read(idlen + namelen))[1][idlen:]
    if name == b"kvm" and extra >= 24:
        clock = ((100 * 60 + 2) * 60 + 3) * 10**9 + 456 * 10**6
        f.seek(off + 24); f.write(struct.pack(">Q", clock))
        f.seek(off + 40); f.write(struct.pack(">Q", (5 << 30) + 1))
        f.seek(off + 40 + 16); f.write(struct.pack(">q", 123456789012))
    off += 40 + extra + idlen + namelen
    off = (off + 7) & ~7
PY
}
# same_info IMAGE WHAT [OPTIONS...]: `info` (human and JSON) equals
# qemu-img's byte for byte, apart from the host-dependent disk size.
mask() { sed -e 's/^disk size: .*/disk size: SIZE/' -e 's/"actual-size": [0-9]*/"actual-size": SIZE/'; }
same_info() {
  local img=$1 what=$2 o
  shift 2
  for o in human json; do
    if ! diff <($QK info --output=$o "$@" "$img" | mask) \
              <(qemu-img info --output=$o "$@" "$img" | mask) >diff.out; then
      bad "$what ($o): info differs"
      cat diff.out
    fi
  done
}
# bitmap_flag IMAGE BITS: ORs BITS into the first persistent bitmap's
# flags (1: in use, as after a crash; 16: a reserved bit). Bitmaps
# extension and directory entry layout from the qcow2 specification.
bitmap_flag() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
b = f.read(65536)
off = struct.unpack(">I", b[100:104])[0]
while True:
    t, l = struct.unpack(">II", b[off:off + 8])
    if t == 0:
        sys.exit("no bitmaps extension")
    if t == 0x23852875:
        d = struct.unpack(">Q", b[off + 24:off + 32])[0]
        break
    off += 8 + ((l + 7) & ~7)
f.seek(d + 12)
flags = struct.unpack(">I", f.read(4))[0]
f.seek(d + 12)
f.write(struct.pack(">I", flags | int(sys.argv[2])))
PY
}
