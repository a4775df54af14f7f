# Sourced by the differential tests (resize.sh, commit.sh, ...): needs
# QEMU's tools, makes a work directory (on tmpfs when there is one: flushes
# to a shared disk would dominate the run time), and runs NAME.py with the
# qcowkit binary and that directory.
twin_run() {
  local name=$1 top base
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  QCOWKIT=${QCOWKIT:-$top/build/tools/qcowkit}
  command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || { echo "qemu-img/qemu-io missing"; exit 77; }
  base=${TEST_DIR:-/tmp}
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
  twin_work=$(mktemp -d "$base/qk-$name.XXXXXX")
  trap 'rm -rf "$twin_work"' EXIT
  python3 "$top/tests/interop/$name.py" "$QCOWKIT" "$twin_work"
}
