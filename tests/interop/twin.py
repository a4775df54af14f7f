"""Helpers of the differential tests that run qcowkit and qemu-img on twin
copies of the same images (resize.py, commit.py, ...): running the tools,
and counting cases and failures the same way in each."""
import subprocess
import sys

tally = {"cases": 0, "failures": 0}


def run(cmd, cwd=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def sh(cmd, cwd=None):
    rc, out, err = run(cmd, cwd)
    if rc != 0:
        raise RuntimeError("%s: %s%s" % (" ".join(cmd), out, err))
    return out


def new_case():
    """Counts a case; returns its number (from 1)."""
    tally["cases"] += 1
    return tally["cases"]


def bad(name, msg):
    tally["failures"] += 1
    print("FAIL %s: %s" % (name, msg))


def finish():
    print("%d cases, %d failures" % (tally["cases"], tally["failures"]))
    sys.exit(1 if tally["failures"] else 0)
