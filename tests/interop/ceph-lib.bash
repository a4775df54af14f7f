# A throwaway single-node Ceph cluster for the RBD tests and benchmark:
# one monitor, one manager and one bluestore OSD on a sparse file, all
# under one directory, on 127.0.0.1 ports picked at run time, auth none,
# pool size 1, no systemd. Source this file, then:
#   ceph_start DIR [POOL]   starts it (pool "rbd" by default, 8 PGs) and
#                           waits until every placement group is
#                           active+clean; on failure prints the logs' tails
#                           and returns 1
#   ceph_stop               stops exactly the processes ceph_start started
#   ceph_kill_osd / ceph_start_osd   the OSD alone (fault tests)
# After ceph_start: CEPH_CONF is the configuration file (librbd, qemu-img,
# rbd and ceph read it from the environment) and CEPH_POOL the pool.

CEPH_PIDS=()
CEPH_OSD_PID=""

_ceph_free_port() { # a TCP port on 127.0.0.1 nobody listens on
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

_ceph_tails() {
  local f
  for f in "$CEPH_DIR"/log/*.log; do
    [ -f "$f" ] || continue
    echo "--- tail of $f"
    tail -n 15 "$f"
  done >&2
}

# The active+clean placement groups and all of them, from `ceph pg stat`
# ("9 pgs: 9 active+clean; ..."). HEALTH_OK alone is not enough: the
# manager adds its own pool a few seconds after it starts.
_ceph_pgs_clean() {
  local s
  s=$(timeout 10 ceph pg stat 2>/dev/null) || return 1
  local total clean
  total=$(echo "$s" | sed -n 's/^\([0-9]*\) pgs:.*/\1/p')
  clean=$(echo "$s" | grep -oE '[0-9]+ active\+clean(;|,|$)' | grep -oE '^[0-9]+' || true)
  [ -n "$total" ] && [ "$total" -gt 0 ] && [ "${clean:-0}" = "$total" ]
}

ceph_start() {
  CEPH_DIR=$1
  CEPH_POOL=${2:-rbd}
  mkdir -p "$CEPH_DIR"/{mon,osd,mgr,run,log}
  local port port1 portmin fsid
  port=$(_ceph_free_port)
  port1=$(_ceph_free_port)
  # The OSD and manager bind in a small range of their own.
  portmin=$(( 20000 + RANDOM % 20000 ))
  fsid=$(cat /proc/sys/kernel/random/uuid)
  export CEPH_CONF="$CEPH_DIR/ceph.conf"
  export CEPH_POOL
  cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port,v1:127.0.0.1:$port1]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
ms bind port min = $portmin
ms bind port max = $(( portmin + 100 ))
auth cluster required = none
auth service required = none
auth client required = none
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon warn on pool no redundancy = false
mon allow pool size one = true
mon allow pool delete = true
mon data avail warn = 1
mon data avail crit = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
run dir = $CEPH_DIR/run
admin socket = $CEPH_DIR/run/\$name.asok
log file = $CEPH_DIR/log/\$name.log
pid file = $CEPH_DIR/run/\$name.pid
keyring = /dev/null
[mon]
mon data = $CEPH_DIR/mon/\$id
[mgr]
mgr data = $CEPH_DIR/mgr/\$id
[osd]
osd data = $CEPH_DIR/osd/\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 21474836480
osd memory target = 939524096
bluestore cache autotune = false
bluestore cache size = 268435456
osd op num shards = 2
osd op num threads per shard = 2
EOF
  monmaptool --create --addv a "[v2:127.0.0.1:$port,v1:127.0.0.1:$port1]" --fsid "$fsid" "$CEPH_DIR/monmap" >/dev/null ||
    { echo "ceph: monmaptool failed" >&2; return 1; }
  ceph-mon --mkfs -i a --monmap "$CEPH_DIR/monmap" 2>"$CEPH_DIR/log/mkfs-mon.err" ||
    { cat "$CEPH_DIR/log/mkfs-mon.err" >&2; return 1; }
  ceph-mon -f -i a >>"$CEPH_DIR/log/mon.out" 2>&1 &
  CEPH_PIDS+=($!)
  mkdir -p "$CEPH_DIR/mgr/x"
  ceph-mgr -f -i x >>"$CEPH_DIR/log/mgr.out" 2>&1 &
  CEPH_PIDS+=($!)
  local i uuid id
  for ((i = 0; i < 60; i++)); do
    timeout 5 ceph mon stat >/dev/null 2>&1 && break
    sleep 0.5
  done
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(timeout 20 ceph osd new "$uuid" 2>>"$CEPH_DIR/log/setup.err") ||
    { echo "ceph: the monitor did not answer"; _ceph_tails; return 1; }
  mkdir -p "$CEPH_DIR/osd/$id"
  ceph-osd -i "$id" --mkfs --osd-uuid "$uuid" >>"$CEPH_DIR/log/mkfs-osd.out" 2>&1 ||
    { echo "ceph: OSD mkfs failed" >&2; tail -n 20 "$CEPH_DIR/log/mkfs-osd.out" >&2; _ceph_tails; return 1; }
  CEPH_OSD_ID=$id
  ceph_start_osd
  timeout 30 ceph osd pool create "$CEPH_POOL" 8 8 >>"$CEPH_DIR/log/setup.err" 2>&1 &&
    timeout 30 rbd pool init "$CEPH_POOL" >>"$CEPH_DIR/log/setup.err" 2>&1 ||
    { echo "ceph: could not create pool $CEPH_POOL" >&2; cat "$CEPH_DIR/log/setup.err" >&2; _ceph_tails; return 1; }
  for ((i = 0; i < 240; i++)); do
    _ceph_pgs_clean && return 0
    sleep 0.5
  done
  echo "ceph: placement groups not active+clean after 120 s: $(timeout 10 ceph pg stat 2>&1)" >&2
  _ceph_tails
  return 1
}

ceph_start_osd() {
  ceph-osd -f -i "$CEPH_OSD_ID" >>"$CEPH_DIR/log/osd.out" 2>&1 &
  CEPH_OSD_PID=$!
}

ceph_kill_osd() {
  [ -n "$CEPH_OSD_PID" ] || return 0
  # A killed process's wait returns 137: under set -e (bench/rbd.sh's
  # exit trap) that would end the caller before it cleans up.
  kill -9 "$CEPH_OSD_PID" 2>/dev/null || true
  wait "$CEPH_OSD_PID" 2>/dev/null || true
  CEPH_OSD_PID=""
}

ceph_stop() {
  local p
  ceph_kill_osd
  for p in "${CEPH_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${CEPH_PIDS[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  CEPH_PIDS=()
}
