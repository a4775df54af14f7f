#!/usr/bin/env bash
# Image locking against QEMU's tools, both ways:
#  - while qemu-io holds an image (read-write, read-only, -U), each
#    qcowkit command gets qemu-img's (qemu-io's) answer: the same exit
#    status and message ("Failed to get ... lock"), or the same success;
#  - while qcowkit holds an image (io read-write or read-only, an NBD
#    export), QEMU's tools get the answers they get from one another;
#  - create refuses to empty a file in use, -U is refused on a read-write
#    open, and a raw image is shared as QEMU shares it;
#  - within one process (serve): no second writer of a file, no reader
#    after a writer, no writer under another export's backing chain;
#  - the image is unharmed: qemu-img check clean, data as written.
# The run uses the ASan build when there is one. Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"
. "$SRC_DIR/tests/interop/nbd-lib.bash"
trap 'unhold; nbd_cleanup; rm -rf "$work"' EXIT

norm() { sed -e 's/^qemu-img:/TOOL:/' -e 's/^qemu-io:/TOOL:/' -e 's/^qcowkit:/TOOL:/' \
             -e 's/[0-9.]* sec (.*ops\/sec)$/TIME/' -e '/^Formatting/d'; }

# hold CMD...: runs CMD with a standard input that stays open, so an
# interactive qemu-io or qcowkit io keeps its image open, and waits until
# the image shows locks in /proc/locks. unhold ends it.
HOLDER=""
hold() {
  mkfifo hold.fifo
  "$@" <hold.fifo >/dev/null 2>&1 &
  HOLDER=$!
  exec 7>hold.fifo
  rm -f hold.fifo
  local ino i
  ino=$(stat -c %i "${@: -1}")
  for i in $(seq 200); do
    grep -q ":$ino " /proc/locks && return 0
    sleep 0.05
  done
  bad "holder $* took no lock"
}
unhold() {
  [ -n "$HOLDER" ] || return 0
  exec 7>&-
  wait "$HOLDER" 2>/dev/null
  HOLDER=""
}

# answer PROG ARGS...: the first lines of what PROG says, and its status.
answer() {
  local p=$1
  shift
  "$p" "$@" >ans.txt 2>&1
  local st=$?
  head -2 ans.txt | norm
  echo "rc=$st"
}

# Each case: the subcommand and arguments, '|'-separated; "io" is qemu-io
# for QEMU's side.
cases=("info|a.qcow2" "info|-U|a.qcow2" "check|a.qcow2" "map|a.qcow2" "snapshot|-l|a.qcow2"
       "snapshot|-c|s|a.qcow2" "resize|a.qcow2|8M" "bitmap|--add|a.qcow2|b" "amend|-o|lazy_refcounts=on|a.qcow2"
       "io|-c|read -P 7 0 4k|a.qcow2" "io|-c|write -P 7 0 4k|a.qcow2" "io|-r|-c|read -P 7 0 4k|a.qcow2"
       "io|-r|-U|-c|read -P 7 0 4k|a.qcow2" "create|-q|-f|qcow2|a.qcow2|4M")
qemu_answer() {
  if [ "$1" = io ]; then answer qemu-io "${@:2}"; else answer qemu-img "$@"; fi
}

qemu-img create -q -f qcow2 a.qcow2 4M
qemu-io -c 'write -P 7 0 64k' a.qcow2 >/dev/null
cp a.qcow2 orig.qcow2

# under HOLDER MODE ASKER ARGS...: what ASKER (qemu: QEMU's tools, qk:
# ours) answers to ARGS while HOLDER (qemu: qemu-io, qk: our io) holds a
# fresh copy of the image in MODE. A fresh copy each time, as commands
# that succeed change the image.
under() {
  local holder=$1 mode=$2 asker=$3
  shift 3
  cp orig.qcow2 a.qcow2
  # shellcheck disable=SC2086
  if [ "$holder" = qemu ]; then hold qemu-io $mode a.qcow2; else hold "$QK" io $mode a.qcow2; fi
  if [ "$asker" = qemu ]; then qemu_answer "$@"; else answer "$QK" "$@"; fi
  unhold
}

# Whoever holds the image, each command answers as QEMU's tools answer
# one another: ours under qemu-io, QEMU's under our io.
for mode in "" "-r" "-r -U"; do
  for c in "${cases[@]}"; do
    IFS='|' read -r -a args <<<"$c"
    q=$(under qemu "$mode" qemu "${args[@]}")
    for who in "qemu qk" "qk qemu"; do
      # shellcheck disable=SC2086
      k=$(under ${who% *} "$mode" ${who#* } "${args[@]}")
      if [ "$q" != "$k" ]; then
        bad "holder ${who% *} ($mode), asking ${who#* }: ${args[*]}: differs from QEMU's tools among themselves"
        diff <(echo "$q") <(echo "$k")
      fi
    done
  done
done

# An NBD export holds its image read-write.
cp orig.qcow2 a.qcow2
start_serve "$QK" serve.pid --socket nbd.sock --export name=d,file=a.qcow2
o=$(qemu-img info a.qcow2 2>&1) && bad "qemu-img info opened an exported image without -U"
echo "$o" | grep -q 'Failed to get shared "write" lock' || { bad "export: qemu-img info's message"; echo "$o"; }
o=$("$QK" snapshot -c s a.qcow2 2>&1) && bad "snapshot -c on an exported image"
echo "$o" | grep -q 'Failed to get "write" lock' || { bad "export: snapshot's message"; echo "$o"; }
qemu-io -f raw -c 'write -P 9 64k 64k' "nbd+unix:///d?socket=nbd.sock" >/dev/null || bad "export: write over NBD"
qemu-img info -U a.qcow2 >/dev/null || bad "export: qemu-img info -U"
stop_serve "$SERVE_PID"
qemu-img check -q a.qcow2 || bad "export: check after the export"
qemu-io -c 'read -P 7 0 64k' -c 'read -P 9 64k 64k' a.qcow2 >/dev/null || bad "export: data"

# Within one process: a second export of an exported image (read-write
# or not), or a read-write export of another export's backing file, is
# refused; two read-only exports share a file.
qemu-img create -q -f qcow2 -b orig.qcow2 -F qcow2 top.qcow2
for second in "name=b,file=a.qcow2" "name=b,file=a.qcow2,readonly=on" "name=b,file=orig.qcow2"; do
  first=name=a,file=a.qcow2
  [ "$second" = name=b,file=orig.qcow2 ] && first=name=a,file=top.qcow2
  cp orig.qcow2 a.qcow2
  o=$(timeout 20 "$QK" serve --socket nbd2.sock --export "$first" --export "$second" 2>&1) &&
    bad "serve $first and $second: both exported"
  echo "$o" | grep -q 'Failed to get .*"write" lock' || { bad "serve $first and $second: message"; echo "$o"; }
done
cp orig.qcow2 a.qcow2
start_serve "$QK" serve2.pid --socket nbd2.sock --export name=a,file=a.qcow2,readonly=on \
  --export name=b,file=a.qcow2,readonly=on
stop_serve "$SERVE_PID"

# -U is for read-only opens only, as in QEMU.
for args in "snapshot -U -c x a.qcow2" "io -U -c flush a.qcow2" "bench -U -w -c 1 a.qcow2"; do
  # shellcheck disable=SC2086
  o=$("$QK" $args 2>&1) && bad "$args: accepted -U on a read-write open"
  echo "$o" | grep -q "force-share=on can only be used with read-only images" || { bad "$args: message"; echo "$o"; }
done

# A raw image: QEMU shares it with other writers, and so do we...
qemu-img create -q -f raw r.raw 1M
hold qemu-io -f raw r.raw
"$QK" io -f raw -c 'write -P 3 4k 4k' r.raw >/dev/null 2>&1 || bad "raw held by qemu-io: our write refused"
# ... but not with a copy: convert's sources share no writes, whatever
# the format, so a raw image being written is not copied half-changed.
for p in qemu-img "$QK"; do
  rm -f conv.qcow2
  "$p" convert -f raw -O qcow2 r.raw conv.qcow2 > out.txt 2>&1 && bad "$p: convert of a raw image being written succeeded"
  grep -q 'Failed to get shared "write" lock' out.txt || { bad "$p: convert of a raw image being written: message"; cat out.txt; }
done
"$QK" convert -U -f raw -O qcow2 r.raw conv.qcow2 || bad "convert -U of a raw image being written refused"
unhold
hold "$QK" io -f raw r.raw
qemu-io -f raw -c 'write -P 4 8k 4k' r.raw >/dev/null 2>&1 || bad "raw held by us: qemu-io's write refused"
unhold

# rebase -U: a new backing file another process writes is refused without
# -U and taken with it, by both tools, with the same message; the result
# is the same image either way.
qemu-img create -q -f qcow2 rb-old.qcow2 1M
qemu-io -c 'write -P 5 0 64k' rb-old.qcow2 >/dev/null
qemu-img create -q -f qcow2 rb-new.qcow2 1M
for p in qemu-img "$QK"; do
  rm -f "rb-top-$(basename "$p").qcow2"
  qemu-img create -q -f qcow2 -b rb-old.qcow2 -F qcow2 "rb-top-$(basename "$p").qcow2"
done
hold qemu-io rb-new.qcow2
for p in qemu-img "$QK"; do
  t="rb-top-$(basename "$p").qcow2"
  "$p" rebase -b rb-new.qcow2 -F qcow2 "$t" > out.txt 2>&1 && bad "$p: rebase onto a backing file being written succeeded"
  grep -q 'Failed to get shared "write" lock' out.txt || { bad "$p: rebase onto a backing file being written: message"; cat out.txt; }
  "$p" rebase -U -b rb-new.qcow2 -F qcow2 "$t" > out.txt 2>&1 || { bad "$p: rebase -U refused"; cat out.txt; }
done
unhold
qemu-img compare -q rb-top-qemu-img.qcow2 rb-top-qcowkit.qcow2 || bad "rebase -U: the images differ"
qemu-io -c 'read -P 5 0 64k' rb-top-qcowkit.qcow2 | grep -q '^read' || bad "rebase -U: data lost"
qemu-img check -q rb-top-qcowkit.qcow2 || bad "rebase -U: check"
[ "$(qemu-img info --output=json rb-top-qcowkit.qcow2 | grep -c '"backing-filename": "rb-new.qcow2"')" = 1 ] ||
  bad "rebase -U: backing file not changed"

# Nothing was harmed.
qemu-img check -q orig.qcow2 || bad "check"
exit $fail
