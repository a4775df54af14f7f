#!/usr/bin/env bash
# libqcowkit as a user gets it: `meson install` into a DESTDIR, then the
# examples compiled with `pkg-config --cflags --libs qcowkit` and run
# against images qemu-img and qemu-io made; qemu-img judges the results.
# The shared library must export exactly the functions the public header
# declares (and the linker map lists).
set -eu
top=${SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
d=${TEST_DIR:-$(mktemp -d)}
root="$d/root"
command -v pkg-config >/dev/null || { echo "pkg-config missing"; exit 1; }

meson install -C "$top/build" --destdir "$root" --quiet >/dev/null
pc=$(find "$root" -name qcowkit.pc | head -n 1)
[ -n "$pc" ] || { echo "qcowkit.pc not installed"; exit 1; }
[ -f "$(find "$root" -path '*/include/qcowkit/qcowkit.h' | head -n 1)" ] || { echo "header not installed"; exit 1; }
so=$(find "$root" -name 'libqcowkit.so.0' | head -n 1)
[ -n "$so" ] || { echo "libqcowkit.so.0 not installed"; exit 1; }
export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs qcowkit)
echo "pkg-config: ok"

# Exports: exactly the header's functions.
grep -oE '\bqk_[a-z_]+\(' "$top/include/qcowkit/qcowkit.h" | tr -d '(' | sort -u >"$d/header.syms"
nm -D --defined-only "$so" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | sort -u >"$d/exported.syms"
if ! diff -u "$d/header.syms" "$d/exported.syms"; then
  echo "exported symbols differ from the public header"; exit 1
fi
echo "exports: $(wc -l <"$d/exported.syms") functions, all public"

for ex in copy async_reader; do
  cc -Wall -Wextra -Werror -o "$d/$ex" "$top/examples/$ex.c" $flags
done
export LD_LIBRARY_PATH=$(dirname "$so")
ldd "$d/copy" | grep -q "$root" || { echo "copy does not use the installed library"; exit 1; }
echo "examples: built"

qemu-img create -q -f qcow2 -o cluster_size=4096 "$d/src.qcow2" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 100k' -c 'write -P 0x22 1M 3k' -c 'write -z 64k 8k' \
  -c 'write -P 0x33 4190208 4096' "$d/src.qcow2" >/dev/null
qemu-img create -q -f qcow2 "$d/dst.qcow2" 4M
"$d/copy" "$d/src.qcow2" "$d/dst.qcow2" | sed "s#$d#TEST_DIR#"
qemu-img check -q "$d/dst.qcow2"
qemu-img compare -q "$d/src.qcow2" "$d/dst.qcow2"
echo "copy: qemu-img compare identical, check clean"

got=$("$d/async_reader" "$d/src.qcow2")
qemu-img convert -O raw "$d/src.qcow2" "$d/src.raw"
want=$(python3 - "$d/src.raw" <<'PY'
import sys
h = 0xcbf29ce484222325
data = open(sys.argv[1], 'rb').read()
for b in data:
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print('%016x %d' % (h, len(data)))
PY
)
[ "$got" = "$want" ] || { echo "async_reader: got '$got', want '$want'"; exit 1; }
echo "async_reader: checksum matches qemu-img's raw export"

# A missing image: a clear message, exit 1.
if "$d/async_reader" "$d/missing.qcow2" 2>"$d/err"; then echo "missing image accepted"; exit 1; fi
grep -q "missing.qcow2" "$d/err"
echo "errors: ok"

# The manual pages are installed and render; qcowkit(1) has every command's
# usage (the same text as `qcowkit help NAME`), libqcowkit(3) every function.
m1=$(find "$root" -name qcowkit.1 | head -n 1); m3=$(find "$root" -name libqcowkit.3 | head -n 1)
[ -n "$m1" ] && [ -n "$m3" ] || { echo "manual pages not installed"; exit 1; }
MANWIDTH=200 man -l "$m1" 2>"$d/man.err" >"$d/man1.txt"; [ ! -s "$d/man.err" ] || { cat "$d/man.err"; exit 1; }
MANWIDTH=200 man -l "$m3" 2>"$d/man.err" >"$d/man3.txt"; [ ! -s "$d/man.err" ] || { cat "$d/man.err"; exit 1; }
qk=$(find "$root" -path '*/bin/qcowkit' | head -n 1)
cmds=$("$qk" --help | awk '/^Commands:/ {on=1; next} on && /^  [a-z]/ {print $1}')
[ "$(echo "$cmds" | wc -w)" -ge 10 ] || { echo "command list not found in --help"; exit 1; }
for c in $cmds; do
  first=$("$qk" help "$c" | head -n 1)
  [ -n "$first" ] || { echo "no usage for $c"; exit 1; }
  grep -qF -- "$first" "$d/man1.txt" || { echo "qcowkit(1) lacks '$first'"; exit 1; }
done
while read -r f; do
  grep -q "$f" "$d/man3.txt" || { echo "libqcowkit(3) lacks $f"; exit 1; }
done <"$d/header.syms"
echo "manual pages: render, every command and function present"
