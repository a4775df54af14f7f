#!/usr/bin/env bash
# libqcowkit as a user gets it: `meson install` into a DESTDIR, then the
# examples compiled with `pkg-config --cflags --libs qcowkit` and run
# against images qemu-img and qemu-io made; qemu-img judges the results.
# The shared library must export exactly the functions the installed
# headers declare (and the linker map lists), and the qcowkit tools must be
# a program of it: linked to the shared library, built from the installed
# headers only.
set -eu
top=${SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
d=${TEST_DIR:-$(mktemp -d)}
root="$d/root"
command -v pkg-config >/dev/null || { echo "pkg-config missing"; exit 1; }

# --no-rebuild: the tests use the build tests/run.sh made; rebuilding it
# here (after the tree changed) would replace binaries other tests run.
meson install -C "$top/build" --no-rebuild --destdir "$root" --quiet >/dev/null
pc=$(find "$root" -name qcowkit.pc | head -n 1)
[ -n "$pc" ] || { echo "qcowkit.pc not installed"; exit 1; }
for h in qcowkit.h engine.h; do
  [ -f "$(find "$root" -path "*/include/qcowkit/$h" | head -n 1)" ] || { echo "$h not installed"; exit 1; }
done
so=$(find "$root" -name 'libqcowkit.so.0' | head -n 1)
[ -n "$so" ] || { echo "libqcowkit.so.0 not installed"; exit 1; }
export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs qcowkit)
echo "pkg-config: ok"

# Exports: exactly the headers' functions, each under its header's version
# node (QCOWKIT_0 for qcowkit.h, QCOWKIT_ENGINE_0 for engine.h).
syms() { grep -oE '\bqk_[a-z0-9_]+\(' "$1" | tr -d '(' | sort -u; }
syms "$top/include/qcowkit/qcowkit.h" >"$d/header.syms"
syms "$top/include/qcowkit/engine.h" >"$d/engine.syms"
if comm -12 "$d/header.syms" "$d/engine.syms" | grep .; then echo "declared in both headers"; exit 1; fi
nm -D --defined-only "$so" | awk '$2 != "A" {print $3}' | sort -u >"$d/exported.raw"
sed -n 's/@@QCOWKIT_0$//p' "$d/exported.raw" >"$d/exported.syms"
sed -n 's/@@QCOWKIT_ENGINE_0$//p' "$d/exported.raw" >"$d/exported-engine.syms"
if ! diff -u "$d/header.syms" "$d/exported.syms"; then
  echo "QCOWKIT_0 exports differ from qcowkit.h"; exit 1
fi
if ! diff -u "$d/engine.syms" "$d/exported-engine.syms"; then
  echo "QCOWKIT_ENGINE_0 exports differ from engine.h"; exit 1
fi
n=$(wc -l <"$d/exported.raw"); want=$(( $(wc -l <"$d/header.syms") + $(wc -l <"$d/engine.syms") ))
[ "$n" -eq "$want" ] || { echo "exports: $n symbols, the headers declare $want"; exit 1; }
echo "exports: $(wc -l <"$d/exported.syms") public and $(wc -l <"$d/engine.syms") engine functions, nothing else"

# The tools: linked to the installed shared library, and no tool source
# includes a header from src/ (they are compiled without it on the path).
qk=$(find "$root" -path '*/bin/qcowkit' | head -n 1)
LD_LIBRARY_PATH=$(dirname "$so") ldd "$qk" | grep -q "$(dirname "$so")/libqcowkit.so.0" ||
  { echo "qcowkit does not link the installed libqcowkit.so.0"; exit 1; }
internal=$(cd "$top/src" && ls -d */ | tr -d / | paste -sd'|')
if grep -nE "#include [\"<](src/|($internal)/)" "$top"/tools/*.[ch] "$top"/tools/*/*.[ch]; then
  echo "a tool includes an internal header"; exit 1
fi
echo "tools: link libqcowkit.so.0, include only installed headers"

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
got_inline=$("$d/async_reader" -i "$d/src.qcow2")
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
[ "$got_inline" = "$want" ] || { echo "async_reader -i: got '$got_inline', want '$want'"; exit 1; }
echo "async_reader: checksum matches qemu-img's raw export (engine thread and inline)"

# A missing image: a clear message, exit 1.
if "$d/async_reader" "$d/missing.qcow2" 2>"$d/err"; then echo "missing image accepted"; exit 1; fi
grep -q "missing.qcow2" "$d/err"
if "$d/async_reader" -i "$d/missing.qcow2" 2>"$d/err"; then echo "missing image accepted (inline)"; exit 1; fi
grep -q "missing.qcow2" "$d/err"
echo "errors: ok"

# The manual pages are installed and render; qcowkit(1) has every command's
# usage (the same text as `qcowkit help NAME`), libqcowkit(3) every function.
m1=$(find "$root" -name qcowkit.1 | head -n 1); m3=$(find "$root" -name libqcowkit.3 | head -n 1)
m3e=$(find "$root" -name libqcowkit-engine.3 | head -n 1)
[ -n "$m1" ] && [ -n "$m3" ] && [ -n "$m3e" ] || { echo "manual pages not installed"; exit 1; }
MANWIDTH=200 man -l "$m1" 2>"$d/man.err" >"$d/man1.txt"; [ ! -s "$d/man.err" ] || { cat "$d/man.err"; exit 1; }
MANWIDTH=200 man -l "$m3" 2>"$d/man.err" >"$d/man3.txt"; [ ! -s "$d/man.err" ] || { cat "$d/man.err"; exit 1; }
MANWIDTH=200 man -l "$m3e" 2>"$d/man.err" >"$d/man3e.txt"; [ ! -s "$d/man.err" ] || { cat "$d/man.err"; exit 1; }
cmds=$("$qk" --help | awk '/^Commands:/ {on=1; next} on && /^$/ {exit} on && /^  [a-z]/ {print $1}')
[ "$(echo "$cmds" | wc -w)" -ge 10 ] || { echo "command list not found in --help"; exit 1; }
for c in $cmds; do
  first=$("$qk" help "$c" | head -n 1)
  [ -n "$first" ] || { echo "no usage for $c"; exit 1; }
  grep -qF -- "$first" "$d/man1.txt" || { echo "qcowkit(1) lacks '$first'"; exit 1; }
done
while read -r f; do
  grep -q "$f" "$d/man3.txt" || { echo "libqcowkit(3) lacks $f"; exit 1; }
done <"$d/header.syms"
while read -r f; do
  grep -q "$f" "$d/man3e.txt" || { echo "libqcowkit-engine(3) lacks $f"; exit 1; }
done <"$d/engine.syms"
echo "manual pages: render, every command and function present"
