#!/usr/bin/env bash
# Builds qcowkit into build/ (or build-asan/ with ASan + UBSan: `build.sh asan`).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
if [ "${1:-}" = asan ]; then
  dir=build-asan
  opts=(-Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1)
else
  dir=build
  opts=()
fi
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${opts[@]}" >/dev/null
fi
ninja -C "$dir"
