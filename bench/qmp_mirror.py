#!/usr/bin/env python3
"""QEMU side of bench/mirror.sh: drives blockdev-mirror over QMP while the
writer (whose pid is given) runs, then completes. Prints one table tail:
'image copied once (s) | its rate MB/s | MB copied per s while writing |
time to ready | time to complete | note |'."""
import json, os, socket, sys, time

path, mode, writer_pid, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
f = s.makefile("rw")

def cmd(name, **args):
    f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
    f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r

json.loads(f.readline())
cmd("qmp_capabilities")
t0 = time.time()
r = cmd("blockdev-mirror", **{"job-id": "m", "device": "src", "target": "dst", "sync": "full",
                              "copy-mode": mode})
if "error" in r:
    print("error: %s | | | | | |" % r["error"]["desc"])
    sys.exit(0)
ready = None
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
job = {}
once = None  # seconds until the bytes copied first reached the image size
while alive(writer_pid):
    jobs = cmd("query-jobs")["return"]
    job = jobs[0] if jobs else job
    if ready is None and job.get("status") == "ready":
        ready = time.time() - t0
    if once is None and job.get("current-progress", 0) >= size:
        once = time.time() - t0
    time.sleep(0.25)
now = time.time()
jobs = cmd("query-jobs")["return"]
job = jobs[0] if jobs else job
tput = job.get("current-progress", 0) / (now - t0) / 1e6
if ready is None and job.get("status") == "ready":
    ready = "after writer"
total = "-"
if job.get("status") == "ready":
    cmd("job-complete", id="m")
    while True:
        jobs = cmd("query-jobs")["return"]
        if not jobs or jobs[0]["status"] in ("concluded", "null"):
            break
        time.sleep(0.05)
    total = round(time.time() - t0, 1)
else:
    cmd("job-cancel", id="m")
ready_s = "not ready while the writer ran" if ready is None else (ready if isinstance(ready, str) else round(ready, 1))
once_s = "-" if once is None else "%.1f" % once
rate = "-" if once is None else "%d" % (size / once / 1e6)
print("%s | %s | %d | %s | %s | |" % (once_s, rate, tput, ready_s, total))
