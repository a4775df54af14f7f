#!/usr/bin/env bash
# Jobs of `qcowkit serve` where a user's script could be misled or stuck:
#  - a mirror that says "ready" has its copy on the target's disk: the
#    daemon SIGKILLed right then leaves a target equal to the source;
#  - job-complete on a paused job is refused (QEMU's rule), and "quit"
#    while a client waits in job-complete wait=true ends the daemon;
#  - a switch onto a target deleted under the job is refused;
#  - job ids must be QEMU-style identifiers;
#  - a switch while a client reads a dirty bitmap of the source moves the
#    client's pin to the target (by name) before the source is closed:
#    block status then fails or answers, never reads freed memory (ASan),
#    and the bitmap is no longer busy on a node that is gone.
# Plain and ASan builds. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/nbd-lib.bash"

ctl() { "$BIN" ctl ctl.sock "$@"; }
wait_ready() { job_wait_status ready 600 "job never became ready"; }

# serve_src: a fresh daemon exporting src.qcow2 as "disk"; sets pid.
serve_src() {
  rm -f ctl.sock nbd.sock
  start_serve "$BIN" pid --socket "$PWD/nbd.sock" --control "$PWD/ctl.sock" \
    --export "name=disk,file=src.qcow2,format=qcow2"
  pid=$SERVE_PID
}

for BIN in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f src.qcow2 dst.qcow2 dst2.qcow2
  qemu-img create -q -f qcow2 src.qcow2 128M
  qemu-io -c 'write -P 0x5a 0 24M' -c 'write -P 0x6b 100M 4M' src.qcow2 > /dev/null
  serve_src

  # Ids: a letter, then letters, digits, '-', '.', '_'.
  for id in "" "1job" "a b" "é"; do
    out=$(ctl mirror-start export=disk target="$PWD/bad.qcow2" id="$id" 2>&1) &&
      fail "job id '$id' accepted"
    echo "$out" | grep -q "Invalid job ID" || fail "job id '$id': $out"
  done
  [ -e bad.qcow2 ] && fail "a refused job made its target"

  ctl mirror-start export=disk target="$PWD/dst.qcow2" id=m.1_a-b > /dev/null || fail "mirror-start"
  wait_ready
  # Paused: complete is refused, and a waiter cannot be left hanging.
  ctl job-pause id=m.1_a-b > /dev/null || fail "job-pause"
  out=$(timeout 20 "$BIN" ctl ctl.sock job-complete id=m.1_a-b wait=true 2>&1) && fail "job-complete on a paused job accepted"
  echo "$out" | grep -q "cannot accept command verb 'complete'" || fail "complete while paused: $out"
  ctl job-resume id=m.1_a-b > /dev/null || fail "job-resume"
  wait_ready
  # "ready": killed right now, the target is the source.
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  qemu-img check -q dst.qcow2 || fail "target after SIGKILL at ready: check"
  qemu-img compare -q src.qcow2 dst.qcow2 || fail "target after SIGKILL at ready: not the source's copy"

  # A target deleted under the job: no switch onto a file with no name.
  serve_src
  ctl mirror-start export=disk target="$PWD/dst2.qcow2" id=gone > /dev/null || fail "mirror-start gone"
  wait_ready
  rm dst2.qcow2
  out=$(timeout 20 "$BIN" ctl ctl.sock job-complete id=gone switch=true wait=true 2>&1) &&
    fail "switch onto a deleted target accepted"
  echo "$out" | grep -q "was deleted" || fail "switch onto a deleted target: $out"
  ctl job-cancel id=gone wait=true > /dev/null || fail "job-cancel gone"
  stop_serve "$pid"
  qemu-img check -q src.qcow2 || fail "source after a deleted target: check"

  # quit while a client waits for a job to complete: the daemon ends.
  rm -f dst.qcow2
  serve_src
  ctl mirror-start export=disk target="$PWD/dst.qcow2" id=m > /dev/null || fail "mirror-start 2"
  wait_ready
  ctl job-complete id=m wait=true > waiter.out 2>&1 &
  waiter=$!
  ctl quit > /dev/null
  for i in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "quit with a job-complete waiter: the daemon did not end"
  wait "$pid" || fail "serve exit status after quit"
  wait "$waiter" 2>/dev/null
  qemu-img check -q src.qcow2 || fail "source after quit: check"
  qemu-img check -q dst.qcow2 || fail "target after quit: check"
done
# The switch with a client pinning a bitmap of the source.
for BIN in "$QK_PLAIN" "$QK_ASAN"; do
  rm -f src.qcow2 dst.qcow2 ctl.sock nbd.sock
  qemu-img create -q -f qcow2 src.qcow2 64M
  qemu-img bitmap --add src.qcow2 b0
  qemu-io -c 'write -P 0x5a 0 4M' src.qcow2 > /dev/null
  serve_src
  python3 - "$PWD/nbd.sock" "$BIN" "$PWD/ctl.sock" "$PWD/dst.qcow2" <<'PY' || fail "$BIN: switch with a pinned bitmap"
import importlib.util, json, os, struct, subprocess, sys, time
spec = importlib.util.spec_from_file_location("badclient", os.path.join(os.environ["SRC_DIR"], "tests/interop/nbd-badclient.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)
sock, qk, ctl, dst = sys.argv[1:5]
run = lambda *a: subprocess.run([qk, "ctl", ctl] + list(a), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
c = bc.Conn(sock)
c.greet()
c.structured_replies()
assert c.meta(b"disk", b"qemu:dirty-bitmap:b0")[-1][0] == bc.REP_ACK
c.go("disk", structured=False, meta=False)
c.structured = True
c.request(bc.CMD_BS, 0, 1 << 20)
assert c.answer()[1] == 0, "block status before the switch"
assert run("mirror-start", "export=disk", "target=" + dst, "id=m").returncode == 0
for _ in range(600):
    if '"ready"' in run("query-jobs").stdout:
        break
    time.sleep(0.05)
r = run("job-complete", "id=m", "switch=true", "wait=true")
assert r.returncode == 0, r.stdout
c.request(bc.CMD_BS, 0, 1 << 20)
c.answer()  # an error (the target has no b0) or extents: either, as long as nothing crashes
c.request(bc.CMD_READ, 0, 4096)
assert c.answer()[1] == 0, "read after the switch"
c.request(bc.CMD_DISC, 0, 0)
assert c.closed_by_server()
PY
  kill -0 "$pid" || fail "$BIN: serve died after the switch"
  stop_serve "$pid"
done
echo "ok"
exit 0
