#!/usr/bin/env bash
# Builds qcowkit into build/ (or build-asan/ with ASan + UBSan: `build.sh asan`,
# or build-fuzz/ with clang, ASan + UBSan and the libFuzzer targets of
# tests/fuzz: `build.sh fuzz`).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
envs=()
case "${1:-}" in
  asan)
    dir=build-asan
    opts=(-Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1)
    ;;
  fuzz)
    dir=build-fuzz
    opts=(-Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1)
    envs=(CC=clang)
    ;;
  *)
    dir=build
    opts=()
    ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  # -Werror here (CI and the tests); the project's default leaves it off.
  env "${envs[@]}" meson setup "$dir" -Dwerror=true "${opts[@]}" >/dev/null
fi
ninja -C "$dir"
