# Sourced by the interop/nbd-* tests (not a test itself: no .sh suffix).
# Starts `qcowkit serve` in the background, waits for its pidfile, and
# kills every server it started when the test exits.
set -u
QK_PLAIN=${QCOWKIT:-$SRC_DIR/build/tools/qcowkit}
QK_ASAN=${QCOWKIT_ASAN:-$SRC_DIR/build-asan/tools/qcowkit}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
NBD_PIDS=()

nbd_cleanup() {
  local p
  for p in "${NBD_PIDS[@]}"; do
    kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
}
trap nbd_cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }

# start_serve BINARY PIDFILE SERVE-ARGS...: sets SERVE_PID.
start_serve() {
  local bin=$1 pf=$2
  shift 2
  rm -f "$pf"
  "$bin" serve --pidfile "$pf" "$@" &
  SERVE_PID=$!
  NBD_PIDS+=("$SERVE_PID")
  local i
  for i in $(seq 400); do
    [ -s "$pf" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || fail "serve exited during startup"
    sleep 0.05
  done
  fail "serve did not write its pidfile"
}

# stop_serve PID: SIGTERM, then the exit status must be 0 (a clean
# shutdown, and no leaks under ASan).
stop_serve() {
  kill -TERM "$1"
  local st=0
  wait "$1" || st=$?
  [ "$st" -eq 0 ] || fail "serve exited with status $st after SIGTERM"
}
