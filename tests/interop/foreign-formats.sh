#!/usr/bin/env bash
# Images in formats qcowkit does not read (made by qemu-img: VMDK sparse,
# stream-optimised and a flat one's descriptor, VDI, VHDX, VHD, QED,
# Parallels, LUKS; Bochs and cloop by their first sector):
#  - a command that guesses the format refuses them by name, exit 1 (2 for
#    compare), and a copy leaves no output: guessed raw, they would be
#    copied as the container's bytes, not the disk they hold;
#  - so does a qcow2 image whose backing file is one (no backing format);
#  - -f raw still opens them as the file's bytes, and a flat VMDK's data
#    file is raw, as qemu-img has them;
#  - a guessed raw image's first sector cannot be made to look like one:
#    qcowkit io's writes there succeed or fail as qemu-io's do, and leave
#    the same bytes.
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

declare -A name=([vmdk]=VMDK [vmdk-flat]=VMDK [vmdk-stream]=VMDK [vdi]=VDI [vhdx]=VHDX [vpc]=VHD [qed]=QED
                 [parallels]=Parallels [luks]=LUKS)
for k in "${!name[@]}"; do
  case $k in
    vmdk-flat) qemu-img create -q -f vmdk -o subformat=monolithicFlat "$k.img" 16M ;;
    vmdk-stream) qemu-img create -q -f vmdk -o subformat=streamOptimized "$k.img" 16M ;;
    luks) qemu-img create -q -f luks --object secret,id=s,data=pw -o key-secret=s,iter-time=10 "$k.img" 16M ;;
    *) qemu-img create -q -f "$k" "$k.img" 16M ;;
  esac || { bad "qemu-img create -f $k"; continue; }
  qemu-img create -q -f qcow2 -b "$k.img" "over-$k.qcow2" 16M 2>/dev/null ||
    python3 - "over-$k.qcow2" "$k.img" <<'EOF'
# qemu-img wants a backing format now; write the name alone into a new image.
import struct, subprocess, sys
out, back = sys.argv[1:]
subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", out, "16M"], check=True)
b = bytearray(open(out, "rb").read())
off = 65536 - 512
b[off:off + len(back)] = back.encode()
b[8:20] = struct.pack(">QI", off, len(back))
open(out, "wb").write(b)
EOF
  md5sum "$k.img" >>sums
  msg="${name[$k]} images are not supported"
  # One open path serves every command: a few of them, the plain build
  # but for info (ASan starts slowly).
  for c in "info $k.img" "convert -O qcow2 $k.img out.qcow2" "compare $k.img $k.img" \
           "io -c 'read 0 4k' $k.img" "convert -O raw over-$k.qcow2 out.raw"; do
    q=$QCOWKIT; [ "${c%% *}" = info ] && q=$QK
    eval "\"\$q\" $c" >out 2>&1
    rc=$?
    want=1; [ "${c%% *}" = compare ] && want=2
    [ $rc = $want ] || { bad "$k: $c: exit $rc, $want expected"; cat out; }
    grep -q "$msg" out || { bad "$k: $c: the refusal does not name the format"; cat out; }
    grep -q 'Sanitizer\|runtime error' out && { bad "$k: $c: sanitizer report"; cat out; }
    [ -e out.qcow2 ] || [ -e out.raw ] && { bad "$k: $c: a refused copy left an output"; rm -f out.qcow2 out.raw; }
  done
  "$QCOWKIT" info "over-$k.qcow2" >out 2>&1 || { bad "$k: info of the overlay (no backing opened) failed"; cat out; }
  "$QCOWKIT" info -f raw "$k.img" | grep -q '^file format: raw$' || bad "$k: -f raw does not open it"
  "$QCOWKIT" compare -f raw -F raw "$k.img" "$k.img" >/dev/null || bad "$k: compare -f raw failed"
done
md5sum -c --quiet sums || bad "a refused command changed an image"
"$QK" info vmdk-flat-flat.img | grep -q '^file format: raw$' || bad "a flat VMDK's data file is not raw"

# First sectors that announce a format: taken from the images, and made
# for Bochs and cloop (qemu-img cannot create them).
python3 - <<'EOF'
import struct
for k in ("vmdk", "vmdk-flat", "vmdk-stream", "vdi", "vhdx", "vpc", "qed", "parallels", "luks"):
    open("s-%s.bin" % k, "wb").write(open(k + ".img", "rb").read(512))
b = bytearray(512)
b[0:23] = b"Bochs Virtual HD Image\0"
b[32:40] = b"Redolog\0"
b[48:56] = b"Growing\0"
b[64:68] = struct.pack("<I", 0x00020000)
open("s-bochs.bin", "wb").write(b)
b = bytearray(512)
head = b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n"
b[0:len(head)] = head
open("s-cloop.bin", "wb").write(b)
# Near misses, which both tools take for raw: a LUKS magic of version 2,
# Parallels of version 3, a VMDK descriptor whose first line is not its
# version, Bochs of another type.
for n, src, off, data in (("luks-v2", "s-luks.bin", 6, b"\0\2"), ("parallels-v3", "s-parallels.bin", 16, b"\3"),
                          ("vmdk-text", "s-vmdk-flat.bin", 0, b"x"), ("bochs-type", "s-bochs.bin", 32, b"Other")):
    b = bytearray(open(src, "rb").read())
    b[off:off + len(data)] = data
    open("s-%s.bin" % n, "wb").write(b)
EOF
norm() { sed -e 's/[qk]\.raw/IMG/g' -e 's/^qemu-io:/TOOL:/' -e 's/^qcowkit:/TOOL:/' -e 's/[0-9.]* sec (.*ops\/sec)$/TIME/'; }
for s in s-*.bin; do
  for how in "write -s $s 0 512" "write -s $s 0 8" ; do
    rm -f q.raw k.raw; qemu-img create -q -f raw q.raw 1M; cp q.raw k.raw
    qo=$(qemu-io -c "$how" q.raw 2>&1; echo "rc=$?")
    ko=$("$QK" io -c "$how" k.raw 2>&1; echo "rc=$?")
    [ "$(echo "$qo" | norm)" = "$(echo "$ko" | norm)" ] ||
      { bad "io -c '$how': differs from qemu-io"; diff <(echo "$qo" | norm) <(echo "$ko" | norm); }
    cmp -s q.raw k.raw || bad "io -c '$how': the image differs from qemu-io's"
  done
done
exit $fail
