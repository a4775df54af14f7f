#!/usr/bin/env bash
# Builds qcowkit (normal and ASan/UBSan) and runs every test:
#   unit tests (on the io_uring backend, and again under the sanitizers on
#   io_uring and on the threads backend), functional tests (golden output)
#   and interop
#   tests (QEMU's tools as the judge), crash-state tests (tests/crash/) and
#   a short run of each fuzz target (tests/fuzz/run.sh; needs clang).
#   Last line: "N passed, N failed, N skipped".
# Usage: tests/run.sh [PATTERN]   (PATTERN filters test names; a run that
# matches no test fails, so a mistyped pattern cannot pass as a green run)
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
pattern=""
for a in "$@"; do
  case "$a" in
    -*) echo "usage: tests/run.sh [PATTERN]  (unknown option $a)" >&2; echo "0 passed, 1 failed"; exit 2 ;;
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

record() { # name status [seconds [cpu seconds]]
  local t=""
  [ -n "${3:-}" ] && t=" (${3} s${4:+, cpu $4 s})"
  case "$2" in
    0) pass=$((pass+1)); printf 'PASS %s%s\n' "$1" "$t" ;;
    77) skip=$((skip+1)); printf 'SKIP %s%s\n' "$1" "$t" ;;
    *) fail=$((fail+1)); failed_names+=("$1"); printf 'FAIL %s (status %s)%s\n' "$1" "$2" "$t" ;;
  esac
}

want() { [ -z "$pattern" ] || [[ "$1" == *"$pattern"* ]]; }

# CPU seconds (user + system) used so far by the calling shell's finished
# children, from the builtin `times`: it must run in that shell, not in a
# $(...) subshell, so the result goes to $REPLY (milliseconds). Each
# record carries its test's share, so the output shows which tests the
# machine's cores spend the run on (daemons a test leaves to init, such as
# a Ceph cluster's, are not counted).
children_cpu_ms() {
  local f="$scratch/times.$BASHPID" l u s
  times >"$f"
  { read -r l; read -r u s; } <"$f"
  rm -f "$f"
  REPLY=$(printf '%s\n' "$u $s" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%d\n", t * 1000 }')
}
cpu_since() { # ms from children_cpu_ms -> $REPLY: seconds used since, one decimal
  children_cpu_ms
  REPLY=$(awk -v a="$1" -v b="$REPLY" 'BEGIN { printf "%.1f\n", (b - a) / 1000 }')
}

# One lane of unit tests: every test_* binary of a build on each backend
# given (the tests of code that does no I/O, no_io_tests, on the first
# only). Results go to $out as "@@RESULT name status seconds" lines, with
# the tail of a failing test's log before its line; record() reads them
# afterwards, so two lanes (plain and sanitizer builds) can run side by
# side.
no_io_tests="test_hbitmap test_iov test_ratelimit test_size test_foreign_probe"
unit_lane() { # builddir label out backend...
  local bin backend out="$3"
  : >"$out"
  for backend in "${@:4}"; do
    for bin in "$top/$1"/tests/test_*; do
      [ -f "$bin" ] && [ -x "$bin" ] || continue
      # Tests of code that does no I/O run on the first backend only.
      [ "$backend" != "$4" ] && [[ " $no_io_tests " == *" $(basename "$bin") "* ]] && continue
      local name="unit/$(basename "$bin")[$2,$backend]"
      want "$name" || continue
      local d="$scratch/u.$2.$RANDOM$RANDOM"; mkdir -p "$d"
      local t0=$SECONDS c0; children_cpu_ms; c0=$REPLY
      (cd "$d" && QCOWKIT_AIO="$backend" TEST_DIR="$d" bash "$top/tests/timeout-bt.sh" 300 "$bin" >"$d/log" 2>&1)
      local st=$?
      cpu_since "$c0"; local cpu=$REPLY
      # A timed-out test's log ends with its backtraces: show them all.
      [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n "$([ "$st" -eq 124 ] && echo 120 || echo 30)" "$d/log" >>"$out"
      echo "@@RESULT $name $st $((SECONDS - t0)) $cpu" >>"$out"
      rm -rf "$d"
    done
  done
}

collect_lane() { # out
  local line
  [ -f "$1" ] || return 0
  while IFS= read -r line; do
    case "$line" in
      "@@RESULT "*) local n st sec cpu; read -r _ n st sec cpu <<<"$line"; record "$n" "$st" "$sec" "$cpu" ;;
      *) printf '%s\n' "$line" ;;
    esac
  done <"$1"
}

export QCOWKIT="$top/build/tools/qcowkit"
export QCOWKIT_ASAN="$top/build-asan/tools/qcowkit"
export SRC_DIR="$top"

# The other kinds of tests, each as a lane writing "@@RESULT name status
# seconds" lines as unit_lane does; no test shares files with another.
functional_lane() { # out
  local t name d t0 c0 st out="$1"
  : >"$out"
  for t in tests/functional/[0-9]*; do
    case "$t" in *.out) continue ;; esac
    [ -x "$t" ] || continue
    name="functional/$(basename "$t")"
    want "$name" || continue
    d="$scratch/f.$(basename "$t")"; mkdir -p "$d"
    t0=$SECONDS; children_cpu_ms; c0=$REPLY
    (cd "$d" && TEST_DIR="$d" timeout 600 bash "$top/$t" >"$d/actual" 2>&1)
    st=$?
    cpu_since "$c0"; local cpu=$REPLY
    if [ "$st" -eq 0 ] && [ -f "$t.out" ]; then
      sed -e "s#$d#TEST_DIR#g" "$d/actual" > "$d/actual.f"
      if ! diff -u "$t.out" "$d/actual.f" > "$d/diff"; then
        head -n 40 "$d/diff" >>"$out"
        st=1
      fi
    elif [ "$st" -ne 0 ] && [ "$st" -ne 77 ]; then
      tail -n 30 "$d/actual" >>"$out"
    fi
    echo "@@RESULT $name $st $((SECONDS - t0)) $cpu" >>"$out"
    rm -rf "$d"
  done
}

# Two lanes may run it: each test goes to the lane that claims it first
# (mkdir is atomic), so the lane that finishes its own work early takes
# over the rest of the interop tests. The longest (a minute or more on the
# latest run) go first, so neither lane is left alone with one at the end.
slow_interop="rbd fault differential bitmap convert mirror-fault hostile data-file commit rebase amend"
interop_lane() { # out
  local t name d t0 c0 st out="$1"
  : >"$out"
  for t in $(for n in $slow_interop; do echo "tests/interop/$n.sh"; done) tests/interop/*.sh; do
    [ -f "$t" ] || continue
    name="interop/$(basename "$t" .sh)"
    want "$name" || continue
    mkdir "$scratch/claim.$(basename "$t")" 2>/dev/null || continue
    d="$scratch/i.$(basename "$t")"; mkdir -p "$d"
    t0=$SECONDS; children_cpu_ms; c0=$REPLY
    (cd "$d" && TEST_DIR="$d" timeout 900 bash "$top/$t" >"$d/log" 2>&1)
    st=$?
    cpu_since "$c0"; local cpu=$REPLY
    [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n 40 "$d/log" >>"$out"
    echo "@@RESULT $name $st $((SECONDS - t0)) $cpu" >>"$out"
    rm -rf "$d"
  done
}

# Crash-state tests (tests/crash/): power-loss states replayed from the
# write log and SIGKILL rounds, one test per configuration, smaller than
# tests/crash/run.sh's short form so the lot takes a few minutes; the
# test's own PASS/FAIL line (states checked, failures) is shown above its
# record. crash/powerloss-c4k-asan runs everything with the ASan/UBSan build.
run_crash() { # out name kind config qcowkit [options for the test]
  want "$2" || return 0
  local d="$scratch/c.$RANDOM$RANDOM"; mkdir -p "$d"
  local t0=$SECONDS c0; children_cpu_ms; c0=$REPLY
  (cd "$d" && QCOWKIT="$5" TEST_DIR="$d" timeout 900 bash "$top/tests/crash/run.sh" --only "$3" "$4" "${@:6}" >"$d/log" 2>&1)
  local st=$?
  cpu_since "$c0"; local cpu=$REPLY
  grep -E '^(PASS|FAIL) ' "$d/log" >>"$1"
  [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && tail -n 40 "$d/log" >>"$1"
  echo "@@RESULT $2 $st $((SECONDS - t0)) $cpu" >>"$1"
  rm -rf "$d"
}
crash_lane() { # out
  local cfg out="$1"
  : >"$out"
  for cfg in $(python3 tests/crash/powerloss.py --list); do
    run_crash "$out" "crash/powerloss-$cfg" powerloss "$cfg" "$QCOWKIT" --epochs 8
    run_crash "$out" "crash/sigkill-$cfg" sigkill "$cfg" "$QCOWKIT" --rounds 8
  done
  for cfg in $(python3 tests/crash/sigkill.py --list-data-file); do
    run_crash "$out" "crash/sigkill-$cfg" sigkill "$cfg" "$QCOWKIT" --rounds 8
  done
  run_crash "$out" "crash/powerloss-c4k-asan" powerloss c4k "$QCOWKIT_ASAN" --epochs 4
}

# Fuzz targets (clang, build-fuzz/): each replays its regression inputs,
# then fuzzes 10 s from the seed corpus. tests/fuzz/run.sh --long runs longer.
fuzz_lane() { # out
  local t name t0 c0 st o out="$1"
  : >"$out"
  for t in image check nbd control; do
    name="fuzz/$t"
    want "$name" || continue
    t0=$SECONDS; children_cpu_ms; c0=$REPLY
    o=$(bash tests/fuzz/run.sh --short 10 "$t" 2>&1)
    st=$?
    cpu_since "$c0"; local cpu=$REPLY
    [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && printf '%s\n' "$o" | tail -n 60 >>"$out"
    echo "@@RESULT $name $st $((SECONDS - t0)) $cpu" >>"$out"
  done
}

# Lanes share the machine's cores (QCOWKIT_TEST_JOBS=1 runs everything in
# turn): the plain build's unit tests then the interop tests; the
# sanitizer build's unit tests then the functional, crash and fuzz tests,
# then whatever interop tests the others have not started yet; and with
# three jobs or more (the default is one more than the cores, at most 4:
# much of the tests' time is spent waiting on the disk, other processes
# and timers, and a core-bound default left the cores idle 40% of the
# time) one or two lanes of interop tests alone.
# Results are shown once all are done, in this order.
jobs=${QCOWKIT_TEST_JOBS:-$(( $(nproc) + 1 > 4 ? 4 : $(nproc) + 1 ))}
if [ "$jobs" -ge 2 ]; then
  (unit_lane build plain "$scratch/lane.plain" io_uring; interop_lane "$scratch/lane.interop") &
  lane_pids=($!)
  for extra in 3 4; do
    [ "$jobs" -ge "$extra" ] || continue
    interop_lane "$scratch/lane.interop$extra" &
    lane_pids+=($!)
  done
  # A subshell too: a shell that reaps another lane when it ends would
  # count that lane's CPU time in its test's record.
  (unit_lane build-asan asan "$scratch/lane.asan" io_uring threads
   functional_lane "$scratch/lane.functional"
   crash_lane "$scratch/lane.crash"
   fuzz_lane "$scratch/lane.fuzz"
   interop_lane "$scratch/lane.interop2") &
  lane_pids+=($!)
  wait "${lane_pids[@]}"
else
  unit_lane build plain "$scratch/lane.plain" io_uring
  unit_lane build-asan asan "$scratch/lane.asan" io_uring threads
  functional_lane "$scratch/lane.functional"
  interop_lane "$scratch/lane.interop"
  crash_lane "$scratch/lane.crash"
  fuzz_lane "$scratch/lane.fuzz"
fi
for l in plain asan functional interop interop2 interop3 interop4 crash fuzz; do
  collect_lane "$scratch/lane.$l"
done

if [ ${#failed_names[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed_names[@]}"
fi
if [ $((pass + fail + skip)) -eq 0 ]; then
  echo "no test matched '$pattern'"
  fail=1
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
