#!/usr/bin/env bash
# rbd: images against a real, throwaway Ceph cluster (ceph-lib.bash), with
# qemu-img's rbd driver and the rbd tool as judges: create, info, map,
# convert both ways, compare, resize, measure, bench, qcow2 on top of an
# RBD image, --image-opts key lists, the mirror command, backups (push,
# incremental, a live job), snapshots (create,
# list, apply, delete, open at a snapshot read-only), an NBD export of an
# RBD image under a qemu-io writer and the NBD checks of a file export
# (nbd-cases.bash), a live mirror from a local qcow2
# export into RBD under a writer (then a switch), errors (bad names, no
# pool, no image, no cluster: a message within seconds), and the OSD
# killed under a writer: requests fail with an error, nothing hangs, and
# work goes on once it is back. Plain build, and the ASan build for the
# I/O paths.
. "$SRC_DIR/tests/interop/nbd-lib.bash"
. "$SRC_DIR/tests/interop/ceph-lib.bash"
. "$SRC_DIR/tests/interop/nbd-cases.bash"

WRITER_PID=""
# The cluster first: nbd_cleanup's wait would wait for its daemons too.
cleanup() {
  [ -z "$WRITER_PID" ] || kill "$WRITER_PID" 2>/dev/null
  ceph_stop
  nbd_cleanup
}
trap cleanup EXIT

QK=$QK_PLAIN
ctl() { "$QK" ctl ctl.sock "$@"; }
job_field() { ctl query-jobs | sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }

t0=$SECONDS
ceph_start "$PWD/ceph" || fail "the cluster did not start"
echo "ok: cluster up in $((SECONDS - t0)) s ($(ceph pg stat 2>/dev/null | cut -d';' -f1))"
P=$CEPH_POOL

# A source image: data, a zero range, holes.
qemu-img create -q -f qcow2 src.qcow2 64M
qemu-io -f qcow2 -c 'write -P 0x11 0 3M' -c 'write -z 8M 4M' -c 'write -P 0x22 20M 5M' \
  -c 'write -P 0x33 63M 1M' src.qcow2 > /dev/null
qemu-img convert -O raw src.qcow2 src.raw

# create and info, as qemu-img sees them.
"$QK" create -q -f raw "rbd:$P/a" 48M || fail "create"
[ "$(rbd info "$P/a" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')" = 50331648 ] ||
  fail "rbd sees another size"
"$QK" info --output=json "rbd:$P/a" | grep -q '"virtual-size": 50331648' || fail "info size"
qemu-img info "rbd:$P/a" | grep -q 'virtual size: 48 MiB' || fail "qemu-img info"
out=$("$QK" create -f raw "rbd:$P/a" 1M 2>&1) && fail "create over an existing image"
echo "$out" | grep -q 'error rbd create: File exists' || fail "create exists: $out"
echo "ok: create, info"

# convert into RBD with qcowkit: qemu-img and rbd export read it back.
"$QK" convert -O raw src.qcow2 "rbd:$P/b" || fail "convert into rbd"
qemu-img compare -q -F raw src.qcow2 "rbd:$P/b" || fail "qemu-img compare after convert"
rbd export "$P/b" b.export > /dev/null 2>&1 || fail "rbd export"
cmp src.raw b.export || fail "rbd export differs"
diff <("$QK" map --output=json "rbd:$P/b") <(qemu-img map --output=json "rbd:$P/b") || fail "map differs"
# convert from RBD (qemu-img wrote it) back to qcow2 with qcowkit.
qemu-img convert -O raw src.qcow2 "rbd:$P/c" || fail "qemu-img convert into rbd"
"$QK" convert -O qcow2 "rbd:$P/c" back.qcow2 || fail "convert from rbd"
qemu-img compare -q src.qcow2 back.qcow2 || fail "round trip differs"
"$QK" compare "rbd:$P/b" "rbd:$P/c" > /dev/null || fail "compare rbd rbd"
"$QK" measure -O qcow2 "rbd:$P/c" > m.ours && qemu-img measure -O qcow2 "rbd:$P/c" > m.theirs &&
  diff m.ours m.theirs || fail "measure differs"
echo "ok: convert both ways, rbd export, map, compare, measure"

# resize, bench (ASan too), zero writes and discard through qemu-io's view.
"$QK" resize "rbd:$P/a" 64M > /dev/null || fail "resize"
qemu-img info "rbd:$P/a" | grep -q 'virtual size: 64 MiB' || fail "resize not seen"
"$QK" bench -q -c 3000 -d 32 -w -s 4k -S 12288 "rbd:$P/a" || fail "bench"
"$QK_ASAN" io -c 'write -P 0x44 1M 2M' -c 'write -z 1536k 64k' -c 'discard 2M 512k' -c 'flush' "rbd:$P/a" \
  > io.out || fail "io (ASan)"
qemu-io -f raw -c 'read -P 0x44 1M 512k' -c 'read -P 0 1536k 64k' -c 'read -P 0x44 1600k 448k' \
  -c 'read -P 0 2M 512k' -c 'read -P 0x44 2560k 512k' "rbd:$P/a" > v.out || fail "read back"
! grep -q 'verification failed' v.out || { cat v.out; fail "zero/discard/write pattern"; }
echo "ok: resize, bench, write/zero/discard/flush (ASan)"

# qcow2 on top of RBD: the RBD image grows as the qcow2 image allocates,
# as a file would; qemu-img checks and reads it (-f qcow2: an RBD image
# opens as raw unless told).
"$QK" create -q -f qcow2 "rbd:$P/q" 1G || fail "create qcow2 on rbd"
"$QK_ASAN" io -f qcow2 -c 'write -P 0x11 0 3M' -c 'write -P 0x22 500M 1M' "rbd:$P/q" > /dev/null || fail "qcow2 on rbd: io"
qemu-img check -q -f qcow2 "rbd:$P/q" || fail "qcow2 on rbd: qemu-img check"
qemu-io -f qcow2 -c 'read -P 0x11 0 3M' -c 'read -P 0x22 500M 1M' "rbd:$P/q" > q.out || fail "qcow2 on rbd: read"
! grep -q 'verification failed' q.out || fail "qcow2 on rbd: pattern"
"$QK" convert -O qcow2 src.qcow2 "rbd:$P/qc" || fail "convert -O qcow2 into rbd"
qemu-img compare -q -f qcow2 -F qcow2 src.qcow2 "rbd:$P/qc" || fail "qcow2 in rbd differs"
qemu-img check -q -f qcow2 "rbd:$P/qc" || fail "qcow2 in rbd: check"
echo "ok: qcow2 on top of RBD (create, io, convert; qemu-img check and compare)"

# --image-opts with rbd keys, as qemu-img reads the same lists.
for opts in "driver=rbd,pool=$P,image=b" "driver=raw,file.driver=rbd,file.pool=$P,file.image=b,file.conf=$CEPH_CONF"; do
  diff <("$QK" map --output=json --image-opts "$opts") <(qemu-img map --output=json --image-opts "$opts") ||
    fail "map --image-opts $opts"
done
"$QK" check --image-opts "driver=qcow2,file.driver=rbd,file.pool=$P,file.image=qc,file.user=admin" > ck.out ||
  fail "check --image-opts on qcow2 in rbd"
grep -q 'No errors were found' ck.out || fail "check --image-opts output"
"$QK" compare --image-opts "driver=qcow2,file.driver=rbd,file.pool=$P,file.image=qc" \
  "driver=qcow2,file.filename=src.qcow2" > /dev/null || fail "compare --image-opts rbd/file"
out=$("$QK" info --image-opts "driver=rbd,pool=$P" 2>&1) && fail "rbd keys without image accepted"
echo "$out" | grep -q "Parameter 'image' is required" || fail "rbd keys without image: $out"
echo "ok: --image-opts with rbd keys"

# The mirror command into an existing RBD image.
"$QK" create -q -f raw "rbd:$P/mc" 64M
"$QK" mirror src.qcow2 "rbd:$P/mc" || fail "mirror into rbd"
qemu-img compare -q -f qcow2 -F raw src.qcow2 "rbd:$P/mc" || fail "mirror: rbd image differs"
echo "ok: qcowkit mirror into RBD"

# Backups into RBD: a full push backup (raw, and qcow2 clearing a bitmap),
# an incremental one whose backing file is the full one in RBD, and a live
# backup job of an export into an existing RBD image (ASan server).
cp src.qcow2 bsrc.qcow2
"$QK" bitmap --add bsrc.qcow2 b0 || fail "bitmap add"
"$QK" backup -q -O raw bsrc.qcow2 "rbd:$P/bk1" || fail "backup -O raw into rbd"
qemu-img compare -q -F raw bsrc.qcow2 "rbd:$P/bk1" || fail "raw backup differs"
"$QK" backup -q -O qcow2 --bitmap b0 bsrc.qcow2 "rbd:$P/bk2" || fail "backup -O qcow2 into rbd"
qemu-img check -q -f qcow2 "rbd:$P/bk2" || fail "qcow2 backup: check"
qemu-io -f qcow2 -c 'write -P 0x66 30M 1M' bsrc.qcow2 > /dev/null
"$QK" backup -q --sync=incremental --bitmap b0 -B "rbd:$P/bk2" -F qcow2 bsrc.qcow2 "rbd:$P/bk3" ||
  fail "incremental backup into rbd"
qemu-img check -q -f qcow2 "rbd:$P/bk3" || fail "incremental: check"
qemu-img info -f qcow2 "rbd:$P/bk3" | grep -q "^backing file: rbd:$P/bk2$" || fail "incremental: backing file"
qemu-img compare -q -f qcow2 -F qcow2 bsrc.qcow2 "rbd:$P/bk3" || fail "incremental chain differs"
[ "$(qemu-img map --output=json -f qcow2 "rbd:$P/bk3" | grep -c '"depth": 0, "present": true, "zero": false, "data": true')" = 1 ] ||
  fail "incremental holds more than the changed range"
"$QK" create -q -f raw "rbd:$P/bk4" 64M
start_serve "$QK_ASAN" pid --socket "$PWD/nbd.sock" --control "$PWD/ctl.sock" \
  --export "name=disk,file=bsrc.qcow2,format=qcow2"
ctl backup-start export=disk target="rbd:$P/bk4" format=raw sync=full id=bj > /dev/null || fail "backup-start"
for i in $(seq 300); do
  st=$(job_field status)
  [ "$st" = completed ] && break
  [ "$st" = failed ] && { ctl query-jobs; fail "backup job failed"; }
  sleep 0.1
done
[ "$st" = completed ] || { ctl query-jobs; fail "backup job never completed"; }
out=$(ctl backup-start export=disk target="rbd:$P/nosuch" format=raw sync=full id=bk 2>&1) &&
  fail "backup-start into a missing rbd image"
echo "$out" | grep -q "Could not open target 'rbd:$P/nosuch'" || fail "missing target: $out"
stop_serve "$SERVE_PID"
qemu-img compare -q -F raw bsrc.qcow2 "rbd:$P/bk4" || fail "live backup differs"
echo "ok: backups into RBD (push full and incremental, a live backup job)"

# Snapshots through the snapshot command: RBD's own.
"$QK" snapshot -c s1 "rbd:$P/b" || fail "snapshot create"
qemu-io -f raw -c 'write -P 0x55 0 1M' "rbd:$P/b" > /dev/null
diff <("$QK" snapshot -l "rbd:$P/b") <(qemu-img snapshot -l "rbd:$P/b") || fail "snapshot list differs"
rbd snap ls "$P/b" | grep -q ' s1 ' || fail "rbd does not list s1"
"$QK" compare "rbd:$P/b@s1" src.qcow2 > /dev/null || fail "the snapshot differs from the source"
out=$("$QK" io -c 'write 0 4k' "rbd:$P/b@s1" 2>&1) && fail "write to a snapshot accepted"
echo "$out" | grep -q 'read-only' || fail "snapshot write: $out"
"$QK" snapshot -a s1 "rbd:$P/b" || fail "snapshot apply"
qemu-img compare -q -F raw src.qcow2 "rbd:$P/b" || fail "apply did not roll back"
"$QK" snapshot -d s1 "rbd:$P/b" || fail "snapshot delete"
[ -z "$(rbd snap ls "$P/b")" ] || fail "s1 still there"
out=$("$QK" snapshot -d s1 "rbd:$P/b" 2>&1) && fail "deleting a missing snapshot"
echo "$out" | grep -q "Can't find snapshot 's1'" || fail "missing snapshot: $out"
"$QK" snapshot -c s2 "rbd:$P/b" || fail "snapshot s2"
"$QK" compare --image-opts "driver=rbd,pool=$P,image=b,snapshot=s2" "driver=raw,file.filename=src.raw" \
  > /dev/null || fail "--image-opts at a snapshot"
"$QK" snapshot -d s2 "rbd:$P/b" || fail "snapshot delete s2"
echo "ok: snapshots"

# Errors: clear and quick.
expect_err() { # MESSAGE-PART ARGS...
  local want=$1 s=$SECONDS out
  shift
  out=$("$QK" "$@" 2>&1) && fail "accepted: $*"
  echo "$out" | grep -qF -- "$want" || fail "$*: '$out' lacks '$want'"
  [ $((SECONDS - s)) -le 30 ] || fail "$*: took $((SECONDS - s)) s"
}
expect_err "lacks an image name" info "rbd:$P"
expect_err "lacks a pool" info "rbd:/x"
expect_err "error opening pool nopool: No such file or directory" info "rbd:nopool/x"
expect_err "error reading header from nope: No such file or directory" info "rbd:$P/nope"
expect_err "has no value" info "rbd:$P/a:conf"
cat > dead.conf <<EOF
[global]
mon host = 127.0.0.1:1
auth client required = none
EOF
expect_err "error connecting" info "rbd:$P/a:conf=$PWD/dead.conf:client_mount_timeout=3"
echo "ok: errors"

# An NBD export of an RBD image under a writer (ASan server).
sock=$PWD/nbd.sock
uri="nbd+unix:///disk?socket=$sock"
"$QK" create -q -f raw "rbd:$P/e" 64M
start_serve "$QK_ASAN" pid --socket "$sock" --export "name=disk,file=rbd:$P/e"
nbd_writer "$uri" 77 20 w.log || fail "writer on the rbd export"
nbd_verify "$uri" w.log
nbdinfo --map "$uri" > /dev/null || fail "block status over NBD"
stop_serve "$SERVE_PID"
nbd_verify "rbd:$P/e" w.log
echo "ok: NBD export of an RBD image (ASan)"

# The NBD checks a file export passes (nbd-cases.bash), on RBD: raw on the
# ASan build, qcow2 on top of RBD on the plain one; then hostile clients
# against a qcow2-on-RBD export.
"$QK" create -q -f raw "rbd:$P/np" 64M || fail "create np"
nbd_peers_case "$QK_ASAN" raw "rbd:$P/np" "raw on rbd"
"$QK" create -q -f qcow2 "rbd:$P/nq" 64M || fail "create nq"
nbd_peers_case "$QK" qcow2 "rbd:$P/nq" "qcow2 on rbd"
"$QK" create -q -f qcow2 "rbd:$P/nbw" 64M || fail "create nbw"
"$QK" create -q -f raw "rbd:$P/nbr" 64M || fail "create nbr"
nbd_badinput_case "$QK" "rbd:$P/nbw" "rbd:$P/nbr"
echo "ok: the file export's NBD checks on RBD exports"

# A live mirror into RBD: a local qcow2 export under a writer, target an
# RBD image; write-blocking, complete with a switch, every write found in
# RBD, then the images are equal.
rm -f stop.writer
cp src.qcow2 live.qcow2
"$QK" create -q -f raw "rbd:$P/m" 64M
start_serve "$QK" pid --socket "$sock" --control "$PWD/ctl.sock" --export "name=disk,file=live.qcow2,format=qcow2"
spid=$SERVE_PID
nbd_writer "$uri" 91 400 m.log &
wpid=$!
WRITER_PID=$wpid
sleep 0.5
ctl mirror-start export=disk target="rbd:$P/m" format=raw mode=write-blocking id=m > /dev/null || fail "mirror-start"
for i in $(seq 600); do
  st=$(job_field status)
  [ "$st" = ready ] && break
  [ "$st" = failed ] && { ctl query-jobs; fail "mirror failed"; }
  sleep 0.1
done
[ "$st" = ready ] || { ctl query-jobs; fail "mirror never ready"; }
ctl job-complete id=m switch=true wait=true > done.json || fail "job-complete"
grep -q '"switched": true' done.json || { cat done.json; fail "not switched"; }
touch stop.writer
wait "$wpid" || fail "writer during the mirror"
WRITER_PID=""
stop_serve "$spid"
nbd_verify "rbd:$P/m" m.log
# After the switch the writes went to RBD alone: the image must be the
# source's first contents with every logged write applied, in order.
cp src.qcow2 expect.qcow2
awk '{print "write -P " $2 " " $1 " 64k"}' m.log | split -l 500 - wchunk.
for f in wchunk.*; do
  args=()
  while read -r line; do args+=(-c "$line"); done < "$f"
  qemu-io -f qcow2 "${args[@]}" expect.qcow2 > /dev/null || fail "replaying the writes"
done
qemu-img compare -q -f qcow2 -F raw expect.qcow2 "rbd:$P/m" || fail "mirror: RBD image differs from the source plus the writes"
echo "ok: live mirror into RBD under a writer ($(wc -l < m.log) writes), switched"

# The OSD dies under a writer: an error (bounded by the OSD timeout set in
# the name), no hang; back up, work goes on.
"$QK" create -q -f raw "rbd:$P/k" 16M
timeout 120 "$QK" bench -c 100000000 -d 8 -w -s 4k -S 12288 "rbd:$P/k:rados_osd_op_timeout=5" > bench.out 2>&1 &
bpid=$!
WRITER_PID=$bpid
sleep 2
kill -0 "$bpid" 2>/dev/null || { cat bench.out; fail "bench ended before the OSD was killed"; }
ceph_kill_osd
s=$SECONDS
st=0
wait "$bpid" || st=$?
WRITER_PID=""
[ "$st" -ne 124 ] || fail "writes hung with the OSD down"
[ "$st" -ne 0 ] && grep -qi 'error\|timed out' bench.out || { cat bench.out; fail "no error with the OSD down (status $st)"; }
echo "ok: OSD killed under a writer: failed after $((SECONDS - s)) s: $(tail -n 1 bench.out)"
ceph_start_osd
for i in $(seq 240); do _ceph_pgs_clean && break; sleep 0.5; done
"$QK" io -c 'write -P 0x67 0 1M' -c 'read -P 0x67 0 1M' "rbd:$P/k" > k.out || fail "write after the OSD came back"
! grep -q 'verification failed' k.out || fail "read after restart"
echo "ok: OSD back, writes go on"
echo "all ok"
