#!/usr/bin/env bash
# Runs one test in a fresh scratch directory, as tests/run.sh does; meson
# test runs every registered test through it (tests/meson.build).
#   run-one.sh unit BINARY
#   run-one.sh functional SCRIPT     (output compared with SCRIPT.out)
#   run-one.sh interop SCRIPT
#   run-one.sh crash KIND CONFIG [OPTIONS]
# Needs QCOWKIT (and QCOWKIT_ASAN for tests that also run the sanitizer
# build; meson sets both to this build's binary) and SRC_DIR.
# Exit: 0 pass, 77 skip, anything else a failure (its log tail printed).
set -u
kind=$1 what=$2
shift 2
# meson passes the built test relative to the build directory.
[ "$kind" != crash ] && [ "${what#/}" = "$what" ] && what=$PWD/$what
export SRC_DIR=${SRC_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
export QCOWKIT_ASAN=${QCOWKIT_ASAN:-$QCOWKIT}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
d=$(mktemp -d /var/tmp/qcowkit-test.XXXXXX)
trap 'rm -rf "$d"' EXIT
cd "$d"
export TEST_DIR=$d
case "$kind" in
  unit) bash "$SRC_DIR/tests/timeout-bt.sh" 300 "$what" >"$d/log" 2>&1 ;;
  functional) timeout 600 bash "$what" >"$d/actual" 2>&1 ;;
  interop) timeout 900 bash "$what" >"$d/log" 2>&1 ;;
  crash) timeout 900 bash "$SRC_DIR/tests/crash/run.sh" --only "$what" "$@" >"$d/log" 2>&1 ;;
  *) echo "run-one.sh: unknown kind '$kind'"; exit 2 ;;
esac
st=$?
if [ "$kind" = functional ]; then
  if [ "$st" -eq 0 ] && [ -f "$what.out" ]; then
    sed -e "s#$d#TEST_DIR#g" "$d/actual" > "$d/actual.f"
    diff -u "$what.out" "$d/actual.f" > "$d/diff" || { head -n 40 "$d/diff"; st=1; }
  elif [ "$st" -ne 0 ] && [ "$st" -ne 77 ]; then
    tail -n 30 "$d/actual"
  fi
elif [ "$kind" = crash ]; then
  grep -E '^(PASS|FAIL) ' "$d/log"
  [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n 40 "$d/log"
elif [ "$st" -ne 0 ] && [ "$st" -ne 77 ]; then
  tail -n "$([ "$st" -eq 124 ] && echo 120 || echo 40)" "$d/log"
fi
exit "$st"
