#!/usr/bin/env python3
"""QEMU side of bench/mirror.sh: drives blockdev-mirror over QMP while the
writer (whose pid is given; 0: no writer, then until ready) runs, then
completes. Prints 'ONCE READY TOTAL CPU' (seconds; '-' where none): the
time until the image was copied once, to ready and to completion, and the
daemon's CPU seconds per GiB copied until ready (or the writer's end)."""
import json, os, socket, sys, time

path, mode, writer_pid, size, qsd_pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
HZ = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as st:
        v = st.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / HZ
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
c0 = cpu_s(qsd_pid)
t0 = time.time()
r = cmd("blockdev-mirror", **{"job-id": "m", "device": "src", "target": "dst", "sync": "full",
                              "copy-mode": mode})
if "error" in r:
    print("- - - -")
    print(r["error"]["desc"], file=sys.stderr)
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
cpu = None
while alive(writer_pid) if writer_pid else ready is None and time.time() - t0 < 120:
    jobs = cmd("query-jobs")["return"]
    job = jobs[0] if jobs else job
    if ready is None and job.get("status") == "ready":
        ready = time.time() - t0
        if not writer_pid:
            cpu = (cpu_s(qsd_pid) - c0) * (1 << 30) / max(job.get("current-progress", 1), 1)
    if once is None and job.get("current-progress", 0) >= size:
        once = time.time() - t0
    time.sleep(0.25 if writer_pid else 0.05)
jobs = cmd("query-jobs")["return"]
job = jobs[0] if jobs else job
if cpu is None and job.get("current-progress"):
    cpu = (cpu_s(qsd_pid) - c0) * (1 << 30) / job["current-progress"]
# A background mirror the writes outpaced converges once they stop.
for _ in range(240):
    if job.get("status") == "ready":
        break
    time.sleep(0.25)
    jobs = cmd("query-jobs")["return"]
    job = jobs[0] if jobs else job
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
f2 = lambda v: "-" if v is None else "%.2f" % v  # noqa: E731
print("%s %s %s %s" % (f2(once), f2(ready), total, f2(cpu)))
