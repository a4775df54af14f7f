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

# job_field NAME: the first job's field NAME from query-jobs (through the
# caller's ctl). job_wait_status STATUS TRIES WHAT: polls it every 50 ms
# until the status is STATUS; otherwise prints the jobs and fails with WHAT.
job_field() { ctl query-jobs | sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }
job_wait_status() {
  local i
  for i in $(seq "$2"); do
    [ "$(job_field status)" = "$1" ] && return 0
    sleep 0.05
  done
  ctl query-jobs
  fail "$3"
}

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

# Two test hosts: network namespaces $ns1 and $ns2 joined by a veth pair,
# addressed SUBNET.1 and SUBNET.2 (/24). Removed again on exit. Exits 77
# only where namespaces cannot be created (no root or no netns support).
# Usage: netns_pair TAG SUBNET   e.g. netns_pair qk 10.200.7
netns_pair() {
  local tag=$1$$ subnet=$2
  ns1=${tag}a ns2=${tag}b
  cleanup_ns() {
    nbd_cleanup
    ip netns del "$ns1" 2>/dev/null
    ip netns del "$ns2" 2>/dev/null
  }
  trap cleanup_ns EXIT
  if ! ip netns add "$ns1" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (needs root and netns support)"
    exit 77
  fi
  ip netns add "$ns2" || fail "second namespace"
  ip link add "${tag}v1" type veth peer name "${tag}v2" || fail "veth pair"
  ip link set "${tag}v1" netns "$ns1" || fail "move veth 1"
  ip link set "${tag}v2" netns "$ns2" || fail "move veth 2"
  ip -n "$ns1" addr add "$subnet.1/24" dev "${tag}v1"
  ip -n "$ns2" addr add "$subnet.2/24" dev "${tag}v2"
  local ns
  for ns in "$ns1" "$ns2"; do
    ip -n "$ns" link set lo up
  done
  ip -n "$ns1" link set "${tag}v1" up
  ip -n "$ns2" link set "${tag}v2" up
}

# nbd_writer URI SEED ROUNDS LOG: rounds of 16 64 KiB writes (qemu-io) at
# random 64 KiB-aligned offsets of the first 64 MiB, each round logged
# ("OFFSET PATTERN" lines) only once it succeeded; stops early when the
# file stop.writer appears.
nbd_writer() {
  local uri=$1 rounds=$3 log=$4 r i off pat args lines
  RANDOM=$2
  : > "$log"
  for r in $(seq "$rounds"); do
    args=() lines=""
    for i in $(seq 16); do
      off=$(( (RANDOM % 1024) * 65536 ))
      pat=$(( RANDOM % 255 + 1 ))
      args+=(-c "write -P $pat $off 64k")
      lines+="$off $pat"$'\n'
    done
    qemu-io -f raw "${args[@]}" "$uri" > wout.txt 2>&1 || { cat wout.txt; echo "writer failed"; return 1; }
    ! grep -qi 'error' wout.txt || { cat wout.txt; echo "a guest write failed"; return 1; }
    printf '%s' "$lines" >> "$log"
    [ -e stop.writer ] && break
  done
  return 0
}

# nbd_verify URI LOG: the last write nbd_writer logged at each offset reads back.
nbd_verify() {
  tac "$2" | awk '!seen[$1]++' | sort -n > final.txt
  local args=() off pat
  while read -r off pat; do args+=(-c "read -P $pat $off 64k"); done < final.txt
  qemu-io -f raw "${args[@]}" "$1" > verify.txt || fail "verify read"
  ! grep -q 'Pattern verification failed' verify.txt || fail "a guest write is missing on the source"
}
