#!/usr/bin/env bash
# Builds qcowkit (normal and ASan/UBSan) and runs every test:
#   unit tests (each on the io_uring and the threads backend, and again
#   under the sanitizers), functional tests (golden output) and interop
#   tests (QEMU's tools as the judge), and a short run of each fuzz target
#   (tests/fuzz/run.sh; needs clang). Last line: "N passed, N failed, N skipped".
# Usage: tests/run.sh [--quick] [PATTERN]   (PATTERN filters test names)
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
pattern=""
for a in "$@"; do
  case "$a" in
    *) pattern="$a" ;;
  esac
done

bash scripts/deps.sh || { echo "deps failed"; echo "0 passed, 1 failed"; exit 1; }
bash scripts/build.sh >/tmp/qcowkit-build.log 2>&1 || { cat /tmp/qcowkit-build.log; echo "0 passed, 1 failed"; exit 1; }
bash scripts/build.sh asan >/tmp/qcowkit-build-asan.log 2>&1 || { cat /tmp/qcowkit-build-asan.log; echo "0 passed, 1 failed"; exit 1; }

pass=0 fail=0 skip=0
failed_names=()
scratch=$(mktemp -d /var/tmp/qcowkit-tests.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

record() { # name status
  case "$2" in
    0) pass=$((pass+1)); printf 'PASS %s\n' "$1" ;;
    77) skip=$((skip+1)); printf 'SKIP %s\n' "$1" ;;
    *) fail=$((fail+1)); failed_names+=("$1"); printf 'FAIL %s (status %s)\n' "$1" "$2" ;;
  esac
}

want() { [ -z "$pattern" ] || [[ "$1" == *"$pattern"* ]]; }

run_unit() { # builddir label backend
  local bin
  for bin in "$top/$1"/tests/test_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    local name="unit/$(basename "$bin")[$2,$3]"
    want "$name" || continue
    local d="$scratch/u.$RANDOM$RANDOM"; mkdir -p "$d"
    (cd "$d" && QCOWKIT_AIO="$3" TEST_DIR="$d" timeout 300 "$bin" >"$d/log" 2>&1)
    local st=$?
    [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n 30 "$d/log"
    record "$name" "$st"
    rm -rf "$d"
  done
}

run_unit build plain io_uring
run_unit build plain threads
run_unit build-asan asan io_uring
run_unit build-asan asan threads

export QCOWKIT="$top/build/tools/qcowkit"
export QCOWKIT_ASAN="$top/build-asan/tools/qcowkit"
export SRC_DIR="$top"

for t in tests/functional/[0-9]*; do
  case "$t" in *.out) continue ;; esac
  [ -x "$t" ] || continue
  name="functional/$(basename "$t")"
  want "$name" || continue
  d="$scratch/f.$(basename "$t")"; mkdir -p "$d"
  (cd "$d" && TEST_DIR="$d" timeout 600 bash "$top/$t" >"$d/actual" 2>&1)
  st=$?
  if [ "$st" -eq 0 ] && [ -f "$t.out" ]; then
    sed -e "s#$d#TEST_DIR#g" "$d/actual" > "$d/actual.f"
    if ! diff -u "$t.out" "$d/actual.f" > "$d/diff"; then
      head -n 40 "$d/diff"
      st=1
    fi
  elif [ "$st" -ne 0 ] && [ "$st" -ne 77 ]; then
    tail -n 30 "$d/actual"
  fi
  record "$name" "$st"
  rm -rf "$d"
done

for t in tests/interop/*.sh; do
  [ -f "$t" ] || continue
  name="interop/$(basename "$t" .sh)"
  want "$name" || continue
  d="$scratch/i.$(basename "$t")"; mkdir -p "$d"
  (cd "$d" && TEST_DIR="$d" timeout 900 bash "$top/$t" >"$d/log" 2>&1)
  st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n 40 "$d/log"
  record "$name" "$st"
  rm -rf "$d"
done

# Fuzz targets (clang, build-fuzz/): each replays its regression inputs,
# then fuzzes 20 s from the seed corpus. tests/fuzz/run.sh --long runs longer.
for t in image check nbd control; do
  name="fuzz/$t"
  want "$name" || continue
  out=$(bash tests/fuzz/run.sh --short 20 "$t" 2>&1)
  st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && printf '%s\n' "$out" | tail -n 60
  record "$name" "$st"
done

if [ ${#failed_names[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed_names[@]}"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
