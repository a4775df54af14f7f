#!/usr/bin/env bash
# Regenerates the seed corpus of the fuzz targets in tests/fuzz/corpus:
#   qcow2/    images written by qemu-img/qemu-io with many options (seeds of
#             fuzz_image and fuzz_check); tiny virtual sizes and small
#             clusters keep each a few KB
#   nbd/      client byte streams for fuzz_nbd (made by nbd_seeds.py)
#   control/  request lines for fuzz_control
# Needs qemu-img, qemu-io and python3. Usage: tests/fuzz/make-corpus.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out/qcow2" "$out/nbd" "$out/control"
mkdir -p "$out/qcow2" "$out/nbd" "$out/control"
cd "$tmp"

io() { qemu-io -f qcow2 "$@" >/dev/null; }
mk() { qemu-img create -q -f qcow2 "$@"; }
# A few patterned writes, a zeroed range and a discard.
fill() { # image cluster_size
  local c=$2
  io -c "write -P 0x11 0 $((c * 2))" -c "write -P 0x22 $((c * 5)) $((c / 2))" \
     -c "write -z $((c * 8)) $c" -c "write -P 0x33 $((c * 12)) $c" -c "discard $((c * 12)) $c" "$1"
}
keep() { cp "$1" "$out/qcow2/$2"; }

mk -o cluster_size=512 a 16k;                               fill a 512;  keep a c512
mk -o cluster_size=1024,refcount_bits=1 a 32k;              fill a 1024; keep a c1k-refcount1
mk -o cluster_size=4096,refcount_bits=64 a 64k;             fill a 4096; keep a c4k-refcount64
mk -o cluster_size=512,refcount_bits=8,lazy_refcounts=on a 16k; fill a 512; keep a c512-lazy-refcount8
mk -o cluster_size=512,compat=0.10 a 16k;                   fill a 512;  keep a v2-c512
mk -o cluster_size=2048,preallocation=metadata a 16k;       keep a c2k-prealloc-metadata

# Lazy refcounts left dirty: qemu-io aborts without flushing.
mk -o cluster_size=512,lazy_refcounts=on a 16k
bash -c "qemu-io -f qcow2 -c 'write -P 0x44 0 2k' -c abort a; true" >/dev/null 2>&1 || true
keep a c512-lazy-dirty

# Compressed clusters (zlib and zstd) written by convert -c.
python3 -c "
import sys
d = bytearray()
for i in range(16):
    d += bytes([i * 7 % 256]) * 1024 + bytes(range(256)) * 4 + b'qcowkit' * 300 + bytes(900)
sys.stdout.buffer.write(bytes(d[:65536]))" > raw
for ct in zlib zstd; do
  qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=4096,compression_type=$ct raw a
  keep a c4k-compressed-$ct
done
qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=512,compat=0.10 raw a
keep a v2-c512-compressed

# Extended L2 (subclusters of 512 bytes in 16 KiB clusters).
mk -o cluster_size=16k,extended_l2=on a 64k
io -c 'write -P 0x55 512 1k' -c 'write -z 4k 2k' -c 'write -P 0x66 20k 8k' -c 'discard 22k 512' a
keep a c16k-extl2
mk -o cluster_size=16k,extended_l2=on,compression_type=zstd a 64k
io -c 'write -c -P 0x77 0 16k' -c 'write -P 0x78 32k 512' a
keep a c16k-extl2-compressed-zstd

# Internal snapshots (with VM state), in v3 and v2.
for v in 1.1 0.10; do
  mk -o cluster_size=512,compat=$v a 16k
  io -c 'write -P 0x11 0 2k' a
  qemu-img snapshot -c s1 a
  io -c 'write -P 0x22 1k 2k' a
  qemu-img snapshot -c second-snapshot a
  io -c 'write -P 0x33 4k 512' a
  keep a "snapshots-c512-compat$v"
done

# Backing file name and backing format extension.
mk -o cluster_size=512 base 16k
mk -o cluster_size=512 -b base -F qcow2 a
io -c 'write -P 0x12 1k 1k' a
keep a c512-backing
mk -u -o cluster_size=512,compat=0.10 -b /some/where/base.img -F raw a 16k
keep a v2-c512-backing-raw

# A persistent dirty bitmap (bitmaps extension and directory).
mk -o cluster_size=4096 a 64k
qemu-img bitmap --add -g 4096 a b0
io -c 'write -P 0x21 0 8k' a
keep a c4k-bitmap

# Leaked clusters for repair: a snapshot deleted without its L1/refcount
# bookkeeping is hard to produce with qemu's tools, so drop the refcount of
# one data cluster to 2 by taking and deleting a snapshot, then cut the file.
mk -o cluster_size=512 a 16k
io -c 'write -P 0x31 0 4k' a
qemu-img snapshot -c tmp a
qemu-img snapshot -d tmp a
keep a c512-snapshot-deleted

python3 "$here/nbd_seeds.py" "$out/nbd"

ctl() { printf '%s\n' "$2" > "$out/control/$1"; }
ctl query-exports '{"execute":"query-exports","id":1}'
ctl export-add '{"execute":"export-add","arguments":{"name":"e1","file":"img","readonly":true,"cache":"writeback","description":"d","cache-size":"1M"}}
{"execute":"query-exports"}
{"execute":"export-del","arguments":{"name":"e1"}}'
ctl export-del '{"execute":"export-del","arguments":{"name":"e0"}}'
ctl mirror '{"execute":"mirror-start","arguments":{"export":"e0","target":"t1","format":"qcow2","id":"m","mode":"write-blocking","speed":"64M","granularity":65536,"buf-size":"1M","max-in-flight":4,"ready-threshold":0,"rescan-per-chunk":false,"chase-writes":"on","copy-priority":"low"}}
{"execute":"query-jobs"}
{"execute":"job-set-speed","arguments":{"id":"m","speed":0}}
{"execute":"job-pause","arguments":{"id":"m"}}
{"execute":"job-resume","arguments":{"id":"m"}}
{"execute":"job-complete","arguments":{"id":"m","switch":true,"wait":true}}
{"execute":"job-dismiss","arguments":{"id":"m"}}
{"execute":"query-exports"}'
ctl mirror-cancel '{"execute":"mirror-start","arguments":{"export":"e0","target":"t2","format":"raw"}}
{"execute":"job-cancel","arguments":{"id":"mirror0","wait":true}}
{"execute":"query-jobs"}'
ctl backup '{"execute":"block-dirty-bitmap-add","arguments":{"export":"e0","name":"b","persistent":true}}
{"execute":"backup-start","arguments":{"export":"e0","target":"t1","sync":"full","bitmap":"b","id":"f","speed":"1M","granularity":"64k","target-cache":"writeback"}}
{"execute":"query-jobs"}
{"execute":"job-cancel","arguments":{"id":"f","wait":true}}
{"execute":"job-dismiss","arguments":{"id":"f"}}
{"execute":"backup-start","arguments":{"export":"e0","target":"t2","sync":"incremental","bitmap":"b","backing":"t1","backing-format":"qcow2","id":"i"}}
{"execute":"block-dirty-bitmap-query"}'
ctl backup-export '{"execute":"block-dirty-bitmap-add","arguments":{"export":"e0","name":"b"}}
{"execute":"backup-export-start","arguments":{"export":"e0","name":"v","bitmap":"b","id":"p","granularity":"64k"}}
{"execute":"query-exports"}
{"execute":"block-dirty-bitmap-query"}
{"execute":"export-del","arguments":{"name":"v"}}
{"execute":"job-complete","arguments":{"id":"p","wait":true}}
{"execute":"backup-export-start","arguments":{"export":"e0","name":"v2","file":"tv"}}
{"execute":"job-cancel","arguments":{"id":"backup1","wait":true}}'
ctl bitmaps '{"execute":"block-dirty-bitmap-add","arguments":{"export":"e0","name":"b","granularity":"64k","disabled":false}}
{"execute":"block-dirty-bitmap-add","arguments":{"export":"e0","name":"c"}}
{"execute":"block-dirty-bitmap-disable","arguments":{"export":"e0","name":"b"}}
{"execute":"block-dirty-bitmap-enable","arguments":{"export":"e0","name":"b"}}
{"execute":"block-dirty-bitmap-merge","arguments":{"export":"e0","target":"b","bitmaps":["c"]}}
{"execute":"block-dirty-bitmap-clear","arguments":{"export":"e0","name":"b"}}
{"execute":"block-dirty-bitmap-query","arguments":{"export":"e0"}}
{"execute":"block-dirty-bitmap-remove","arguments":{"export":"e0","name":"c"}}'
ctl errors '{"execute":"nope"}
{"execute":"query-exports","arguments":{"x":1}}
{"execute":"export-add","arguments":[]}
[1,2]
{"execute":"quit"}
not json'
echo "corpus: $(ls "$out/qcow2" | wc -l) images ($(du -sh "$out/qcow2" | cut -f1)), $(ls "$out/nbd" | wc -l) nbd streams, $(ls "$out/control" | wc -l) control scripts"
