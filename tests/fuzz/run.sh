#!/usr/bin/env bash
# Runs the libFuzzer targets (built by `scripts/build.sh fuzz` into
# build-fuzz/), one process at a time:
#   tests/fuzz/run.sh [--short [SECONDS]] [TARGET...]
#       replays every input in tests/fuzz/regress/TARGET (the inputs of
#       fixed bugs), then fuzzes SECONDS (default 20) from the seed corpus;
#       one line per target: "PASS fuzz/TARGET" or "FAIL fuzz/TARGET";
#       exit 0 when all passed, 77 when clang is missing (nothing ran)
#   tests/fuzz/run.sh --long [SECONDS] [TARGET...]
#       fuzzes each target SECONDS (default 900) in turn, growing a corpus
#       kept in build-fuzz/corpus/TARGET; crashes, hangs and leaks land in
#       build-fuzz/crashes/TARGET, logs in build-fuzz/logs
#   tests/fuzz/run.sh --cpu SECONDS [TARGET...]
#       as --long, but each target runs until its process has used SECONDS
#       of CPU (user + sys), however long that takes on a shared machine;
#       the run is then interrupted (SIGINT, final stats in the log)
# TARGET is image, check, nbd or control (default: all four).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/tests/fuzz
cd "$top"
mode=short seconds="" cpu_budget=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) mode=short ;;
    --long) mode=long ;;
    --cpu) mode=long; cpu_budget=${2:?--cpu needs SECONDS}; shift ;;
    [0-9]*) seconds=$1 ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ -n "$seconds" ] || { [ $mode = long ] && seconds=900 || seconds=20; }
[ ${#args[@]} -gt 0 ] || args=(image check nbd control)

if ! command -v clang >/dev/null; then
  echo "SKIP fuzz (clang is not installed)"
  exit 77
fi
if ! bash scripts/build.sh fuzz >/tmp/qcowkit-build-fuzz.log 2>&1; then
  tail -n 30 /tmp/qcowkit-build-fuzz.log
  echo "FAIL fuzz/build"
  exit 1
fi

# Per target: seed corpus, largest input, dictionary.
seeds_of() { case "$1" in image|check) echo qcow2 ;; *) echo "$1" ;; esac; }
max_len_of() { case "$1" in image|check|nbd) echo 131072 ;; control) echo 4096 ;; esac; }

# Long runs keep their scratch images in memory when they can: a check
# unit repairs and flushes an image copy, hundreds a second for hours,
# which loads the disk for everything else on the machine (benchmarks run
# beside one measured it). Short runs keep the default.
if [ $mode = long ] && [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:abort_on_error=0
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}:halt_on_error=1
# libFuzzer reports a crash with exit 77 by default, which our runners read
# as "skipped": make every finding exit 1. A hang is an input running over
# -timeout seconds.
common=(-error_exitcode=1 -timeout_exitcode=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
# Long runs share a busy machine for hours: a unit stalled 10 s there once
# while its replay took 0.15 s, and a timeout ends the run. 30 s still
# catches a hang.
long_timeout=(-timeout=30)

# cpu_watch BIN SECONDS FLAG: once the fuzzer process running BIN (a child
# of this shell's time keyword) has used SECONDS of CPU, interrupt it.
cpu_watch() {
  local bin=$1 budget=$2 flag=$3 pid="" tick used
  tick=$(getconf CLK_TCK)
  while :; do
    sleep 5
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || pid=$(pgrep -n -P $$ -f "^$bin " || true)
    [ -n "$pid" ] || continue
    # Fields 14 and 15 of /proc/PID/stat: user and system ticks of all threads.
    used=$(awk -v t="$tick" '{ sub(/^.*\) /, ""); print int(($12 + $13) / t) }' "/proc/$pid/stat" 2>/dev/null) || continue
    if [ "${used:-0}" -ge "$budget" ]; then
      : >"$flag"
      kill -INT "$pid"
      return
    fi
  done
}

failed=0
for t in "${args[@]}"; do
  bin=$top/build-fuzz/tests/fuzz/fuzz_$t
  if [ ! -x "$bin" ]; then
    echo "FAIL fuzz/$t (no such target)"
    failed=1
    continue
  fi
  seeds=$here/corpus/$(seeds_of "$t")
  dict=()
  d=$here/$(seeds_of "$t").dict
  [ -f "$d" ] && dict=(-dict="$d")
  opts=("${common[@]}" "${dict[@]}" -max_len="$(max_len_of "$t")")
  if [ $mode = long ]; then
    work=$top/build-fuzz/corpus/$t crashes=$top/build-fuzz/crashes/$t
    mkdir -p "$work" "$crashes" "$top/build-fuzz/logs"
    log=$top/build-fuzz/logs/$t.$(date +%Y%m%d-%H%M%S).log
    limit=$seconds
    if [ -n "$cpu_budget" ]; then
      limit=$((cpu_budget * 20))
      echo "fuzz/$t: until ${cpu_budget} CPU-s, log $log"
    else
      echo "fuzz/$t: ${seconds}s, log $log"
    fi
    # The CPU the fuzzer got (the machine may be shared): bash's time
    # keyword, written into the log.
    TIMEFORMAT="cpu: %U s user, %S s sys, %R s wall"
    rm -f "$log.stopped"
    if [ -n "$cpu_budget" ]; then
      cpu_watch "$bin" "$cpu_budget" "$log.stopped" &
      watcher=$!
    fi
    { time "$bin" "${opts[@]}" "${long_timeout[@]}" -max_total_time="$limit" -artifact_prefix="$crashes/" \
        "$work" "$seeds" >"$log" 2>&1; } 2>>"$log.time"
    st=$?
    if [ -n "$cpu_budget" ]; then
      kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
      # 72 is libFuzzer's exit after an interrupt: a pass only when the
      # watcher sent it at the budget.
      [ $st -eq 72 ] && [ -f "$log.stopped" ] && st=0
      rm -f "$log.stopped"
    fi
    cat "$log.time" >>"$log" && rm -f "$log.time"
    grep -E '^(stat::|Done |cpu: )|^SUMMARY|ERROR:' "$log" | head -n 12
    [ $st -eq 0 ] && echo "PASS fuzz/$t" || { echo "FAIL fuzz/$t (status $st; see $log)"; failed=1; }
    continue
  fi
  scratch=$(mktemp -d /var/tmp/qcowkit-fuzz.XXXXXX)
  st=0
  regress=$here/regress/$t
  if compgen -G "$regress/*" >/dev/null; then
    "$bin" "${opts[@]}" "$regress"/* >"$scratch/regress.log" 2>&1 || st=$?
    if [ $st -ne 0 ]; then
      tail -n 40 "$scratch/regress.log"
    fi
  fi
  if [ $st -eq 0 ]; then
    mkdir -p "$scratch/corpus"
    "$bin" "${opts[@]}" -max_total_time="$seconds" -artifact_prefix="$scratch/" \
      "$scratch/corpus" "$seeds" >"$scratch/fuzz.log" 2>&1 || st=$?
    if [ $st -ne 0 ]; then
      grep -A 40 -E '^==[0-9]+==|runtime error|ERROR: libFuzzer' "$scratch/fuzz.log" | head -n 60
      for a in "$scratch"/crash-* "$scratch"/timeout-* "$scratch"/leak-* "$scratch"/oom-*; do
        [ -f "$a" ] && cp "$a" "/var/tmp/qcowkit-fuzz-$t-$(basename "$a")" &&
          echo "input kept as /var/tmp/qcowkit-fuzz-$t-$(basename "$a")"
      done
    fi
  fi
  rm -rf "$scratch"
  [ $st -eq 0 ] && echo "PASS fuzz/$t" || { echo "FAIL fuzz/$t (status $st)"; failed=1; }
done
exit $failed
