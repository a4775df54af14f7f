#!/usr/bin/env bash
# Runs a test program with a time limit, like timeout(1), but before
# killing one that ran out of time writes every thread's backtrace (gdb)
# to stderr, so a hang seen once in CI says where it waited.
#   timeout-bt.sh SECONDS PROGRAM [ARGS...]
# Exit: the program's status, or 124 when it was killed.
secs=$1
shift
"$@" &
pid=$!
# A watcher: the program's own status must reach us through wait below.
(
  trap 'kill "$sp" 2>/dev/null; exit 0' TERM
  sleep "$secs" &
  sp=$!
  wait "$sp"
  kill -0 "$pid" 2>/dev/null || exit 0
  echo "timeout-bt: $* still running after ${secs} s; its children, then its threads' backtraces:" >&2
  ps -o pid,stat,etime,args --ppid "$pid" >&2
  if command -v gdb >/dev/null; then
    gdb -p "$pid" -batch -nx -ex 'set print frame-arguments none' -ex 'thread apply all bt 30' 2>&1 |
      grep -E '^(Thread|#)' >&2
  fi
  kill -9 "$pid" 2>/dev/null
) &
watcher=$!
wait "$pid"
st=$?
if kill -0 "$watcher" 2>/dev/null; then
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
else
  wait "$watcher" 2>/dev/null
  [ "$st" -eq 137 ] && st=124
fi
exit "$st"
