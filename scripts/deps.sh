#!/usr/bin/env bash
# Installs the Debian packages that building, testing and benchmarking qcowkit
# need (qemu-system-common: qemu-storage-daemon, which the mirror benchmark
# compares with; gdb: backtraces of a test that timed out; python3-libnbd:
# the backup tool of tests/interop/nbd-backup; ceph-mon, ceph-mgr, ceph-osd
# and ceph-common: the throwaway cluster of the RBD tests and benchmark;
# qemu-block-extra: qemu-img's rbd driver, their judge; nbdkit: the NBD
# benchmark's client ceiling, a server that answers at once; qemu-system-x86:
# QEMU's own savevm/loadvm, which tests/interop/snapshot-list compares with). Safe to run again:
# it installs only what is missing.
set -euo pipefail

pkgs=(
  build-essential pkg-config meson ninja-build
  liburing-dev zlib1g-dev libzstd-dev libjansson-dev
  libnbd-dev libnbd-bin python3-libnbd nbdkit
  qemu-utils fio time iproute2 gnuplot-nox python3 strace gdb
  qemu-system-common qemu-system-x86
  librbd-dev ceph-mon ceph-mgr ceph-osd ceph-common qemu-block-extra
  clang libclang-rt-14-dev
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
