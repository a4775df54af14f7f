#!/usr/bin/env bash
# convert with NBD URIs on either side, against qemu-img convert: qemu-nbd
# serves raw files; each tool converts into (or out of) its own export,
# with no temporary file. Same exit status and messages (program name
# aside), and contents that qemu-img compare finds identical to the source.
# One case uses `qcowkit serve` as the target's server.
set -u
. "$(dirname "$0")/nbd-lib.bash"
command -v qemu-nbd >/dev/null || { echo "qemu-nbd missing"; exit 77; }
QK=$QK_PLAIN
d=$(mktemp -d "${TEST_DIR:-/tmp}/qk-convnbd.XXXXXX")
trap 'nbd_cleanup; rm -rf "$d"' EXIT
cd "$d"
fails=0 cases=0
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

# export NAME FILE SIZE: a raw file of SIZE served on unix socket NAME.sock
# (export name "e"); URL in NBD_URL.
export_file() {
  qemu-img create -q -f raw "$2" "$3"
  qemu-nbd -f raw -x e -k "$d/$1.sock" --persistent --cache=writeback "$2" &
  NBD_PIDS+=("$!")
  local i
  for i in $(seq 200); do [ -S "$d/$1.sock" ] && break; sleep 0.05; done
  NBD_URL="nbd+unix:///e?socket=$d/$1.sock"
}

qemu-img create -q -f qcow2 src.qcow2 16M
qemu-io -f qcow2 -c 'write -P 0x5a 0 3M' -c 'write -z 8M 1M' -c 'write -P 0x11 10M 64k' \
  -c 'write -P 0x22 15M 1M' src.qcow2 >/dev/null

# both NAME SIZE CONVERT-ARGS... (the target written as @T@): each tool into
# an export of its own, filled with 0x77 first so stale data would show.
both() {
  local name=$1 size=$2
  shift 2
  cases=$((cases + 1))
  local tool outs=() rcs=() urls=()
  for tool in qemu-img "$QK"; do
    local tag=t$cases$([ "$tool" = qemu-img ] && echo q || echo k)
    export_file "$tag" "$tag.raw" "$size"
    qemu-io -f raw -c "write -P 0x77 0 $size" "$NBD_URL" >/dev/null
    local args=("${@//@T@/$NBD_URL}")
    local out rc=0
    out=$("$tool" convert "${args[@]}" 2>&1) || rc=$?
    outs+=("$(printf '%s' "$out" | sed -e 's/^qemu-img: //' -e 's/^qcowkit: //' -e "s|$d/t${cases}[qk]|SOCK|g")")
    rcs+=("$rc")
    urls+=("$NBD_URL")
  done
  [ "${rcs[0]}" = "${rcs[1]}" ] || bad "$name" "exit qemu-img ${rcs[0]}, qcowkit ${rcs[1]}"
  [ "${outs[0]}" = "${outs[1]}" ] || bad "$name" "output: qemu-img '${outs[0]}', qcowkit '${outs[1]}'"
  if [ "${rcs[0]}" = 0 ]; then
    qemu-img compare -q -f raw -F raw "${urls[0]}" "${urls[1]}" ||
      bad "$name" "the exports read differently"
  fi
}

both "qcow2 -> NBD export" 16M -O raw src.qcow2 @T@
both "qcow2 -> larger NBD export" 20M -O raw src.qcow2 @T@
both "qcow2 -> NBD export, -n" 16M -n -O raw src.qcow2 @T@
both "qcow2 -> NBD export, -n -m 16 -W" 16M -n -m 16 -W -O raw src.qcow2 @T@
both "too small an export" 8M -O raw src.qcow2 @T@
both "too small an export, -n" 8M -n -O raw src.qcow2 @T@
both "-S 0" 16M -S 0 -O raw src.qcow2 @T@

# NBD source -> files.
cases=$((cases + 1))
export_file s src.raw 16M
qemu-img convert -n -f qcow2 -O raw src.qcow2 "$NBD_URL"
for fmt in qcow2 raw; do
  qemu-img convert -f raw -O $fmt "$NBD_URL" q.$fmt || bad "NBD source" "qemu-img failed"
  "$QK" convert -f raw -O $fmt "$NBD_URL" k.$fmt || bad "NBD source" "qcowkit failed"
  qemu-img compare -q -F qcow2 k.$fmt src.qcow2 || bad "NBD source -> $fmt" "differs from the source"
  qemu-img compare -q q.$fmt k.$fmt || bad "NBD source -> $fmt" "differs from qemu-img's output"
  [ $fmt = qcow2 ] && { qemu-img check -q k.qcow2 || bad "NBD source -> qcow2" "check"; }
done

# qcowkit serve as the target's server.
cases=$((cases + 1))
qemu-img create -q -f qcow2 served.qcow2 16M
start_serve "$QK" "$d/serve.pid" --socket "$d/serve.sock" --export "name=e,file=$d/served.qcow2"
if "$QK" convert -O raw src.qcow2 "nbd+unix:///e?socket=$d/serve.sock"; then
  stop_serve "$SERVE_PID"
  qemu-img compare -q served.qcow2 src.qcow2 || bad "into qcowkit serve" "differs from the source"
  qemu-img check -q served.qcow2 || bad "into qcowkit serve" "qemu-img check"
else
  bad "into qcowkit serve" "convert failed"
fi

echo "$cases cases, $fails failures"
[ "$fails" -eq 0 ]
