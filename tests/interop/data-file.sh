#!/usr/bin/env bash
# External data files (qcow2 incompatible bit 2, raw bit in autoclear bit 1)
# against qemu-img and qemu-io:
#  - create with data_file/data_file_raw (and preallocation, extended L2,
#    small clusters, a backing file, the refusals): same output, exit
#    status, data file size, info, map and check as qemu-img create;
#  - images qemu-io wrote read back the same through qcowkit, and info
#    (human and JSON) is qemu-img's byte for byte;
#  - the same writes, zero writes and discards through qcowkit io and
#    qemu-io on twin images end up identical (qemu-img compare), check
#    clean, and a raw data file stays equal to the disk on its own;
#  - amend -o data_file/data_file_raw leaves the same bytes as qemu-img's;
#  - what a data file cannot hold is refused and leaves the image clean
#    (internal snapshots, compressed writes, a v2 downgrade);
#  - resize grows, preallocates and cuts the data file as qemu-img does;
#  - commit into and out of data-file images and a safe rebase of one keep
#    the data and leave every image clean;
#  - a missing data file, a data file name that is not a plain local path
#    (a protocol or json: name), and an L2 entry not at its guest offset,
#    are errors, not crashes; info without the data file is qemu-img's;
#  - a data file that is convert's raw source, or the image itself, is
#    refused and nothing changes (create, convert, -n, a hostile image);
#  - a relative data file name is relative to the current directory, at
#    create and at open, as qemu-img has it (an image in a subdirectory).
# Exit 0 pass, 1 fail.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

status() { "$@" >out.txt 2>&1; echo "rc=$?" >>out.txt; sed -e 's/^qemu-img:/TOOL:/' -e 's/^qcowkit:/TOOL:/' out.txt; }
ckclean() { qemu-img check "$1" >ck.txt 2>&1 || { bad "$2: qemu-img check"; cat ck.txt; }; }

# --- create ---
qemu-img create -q -f qcow2 b.qcow2 3M
for o in "data_file=X.raw" "data_file=X.raw,data_file_raw=on" \
         "data_file=X.raw,data_file_raw=off,preallocation=metadata" "data_file=X.raw,preallocation=full" \
         "data_file=X.raw,preallocation=falloc" "data_file=X.raw,extended_l2=on,data_file_raw=on" \
         "data_file=X.raw,cluster_size=4k,data_file_raw=on" "data_file_raw=on" "compat=0.10,data_file=X.raw" \
         "data_file=X.raw,data_file_raw=on,backing_file=b.qcow2,backing_fmt=qcow2" \
         "data_file=X.raw,backing_file=b.qcow2,backing_fmt=qcow2" "data_file=X.raw,data_file_raw=maybe"; do
  res=()
  for tool in "$QK" qemu-img; do
    rm -f X.raw q.qcow2
    out=$(status "$tool" create -f qcow2 -o "$o" q.qcow2 3M)
    size=$(stat -c %s X.raw 2>/dev/null)
    if [ -f q.qcow2 ]; then
      meta=$(qemu-img info --output=json q.qcow2 | grep -v '"actual-size"'; qemu-img map --output=json q.qcow2; qemu-img check q.qcow2 2>&1)
    else
      meta=none
    fi
    res+=("$out|$size|$meta")
  done
  if [ "${res[0]}" != "${res[1]}" ]; then
    bad "create -o $o differs from qemu-img"
    diff <(echo "${res[0]}") <(echo "${res[1]}")
  fi
done
"$QK" create -f qcow2 -o help | grep -q '^  data_file=<str>' || bad "create -o help does not list data_file"

# --- images written by qemu-io, read by qcowkit ---
for raw in off on; do
  rm -f q.qcow2 q.raw
  qemu-img create -q -f qcow2 -o data_file=q.raw,data_file_raw=$raw q.qcow2 8M
  qemu-io -c 'write -P 0x33 0 1M' -c 'write -P 0x44 3M 70k' -c 'write -z 3100k 64k' -c 'discard 3M 64k' q.qcow2 >/dev/null
  same_info q.qcow2 "qemu-io's image, data_file_raw=$raw"
  "$QK" convert -O raw q.qcow2 ours.raw && qemu-img convert -O raw q.qcow2 theirs.raw || bad "convert (raw=$raw)"
  cmp -s ours.raw theirs.raw || bad "qcowkit reads qemu-io's data-file image differently (raw=$raw)"
  diff <("$QK" map --output=json q.qcow2) <(qemu-img map --output=json q.qcow2) >diff.out || { bad "map (raw=$raw)"; cat diff.out; }
  out=$("$QK" check q.qcow2 2>&1) || { bad "qcowkit check of qemu-io's image (raw=$raw)"; echo "$out"; }
done

# --- the same writes through qcowkit io and qemu-io ---
ops() { # seed: a list of -c arguments (writes, zero writes, discards; cluster 0 included)
  local seed=$1 i=0 off len
  RANDOM=$seed
  printf "%s\n" -c "write -P 7 0 512"
  while [ $i -lt 60 ]; do
    off=$(( (RANDOM * 32768 + RANDOM) % (16 << 20) / 512 * 512 ))
    len=$(( (RANDOM % 256 + 1) * 512 ))
    [ $((off + len)) -gt $((16 << 20)) ] && len=$(( (16 << 20) - off ))
    case $((RANDOM % 6)) in
      0|1|2) printf "%s\n" -c "write -P $((RANDOM % 250 + 1)) $off $len" ;;
      3) printf "%s\n" -c "write -z $off $len" ;;
      4) # whole 64k units: QEMU 7.2 ignores the partial clusters of a
         # discard, qcowkit zeroes their whole subclusters (extended L2)
         printf "%s\n" -c "discard $((off / 65536 * 65536)) 65536" ;;
      5) printf "%s\n" -c "write -P 9 $((off / 65536 * 65536)) 65536" ;;
    esac
    i=$((i + 1))
  done
}
for cfg in "cluster_size=64k" "cluster_size=64k,data_file_raw=on" "cluster_size=4k" \
           "cluster_size=32k,extended_l2=on" "cluster_size=32k,extended_l2=on,data_file_raw=on"; do
  for seed in 1 2; do
    rm -f a.qcow2 a.raw t.qcow2 t.raw
    qemu-img create -q -f qcow2 -o data_file=a.raw,$cfg a.qcow2 16M
    qemu-img create -q -f qcow2 -o data_file=t.raw,$cfg t.qcow2 16M
    mapfile -t args < <(ops $seed)
    "$QK" io "${args[@]}" a.qcow2 >io.out 2>&1 || { bad "$cfg seed $seed: qcowkit io failed"; tail -3 io.out; }
    qemu-io "${args[@]}" t.qcow2 >/dev/null 2>&1 || bad "$cfg seed $seed: qemu-io failed"
    ckclean a.qcow2 "$cfg seed $seed"
    qemu-img compare -q a.qcow2 t.qcow2 || bad "$cfg seed $seed: contents differ from qemu-io's"
    case $cfg in *data_file_raw=on*)
      qemu-img compare -q -f raw -F qcow2 a.raw a.qcow2 || bad "$cfg seed $seed: the raw data file is not the disk" ;;
    esac
    qemu-img info a.qcow2 | grep -q "data file raw: $(case $cfg in *raw=on*) echo true;; *) echo false;; esac)" ||
      bad "$cfg seed $seed: the raw bit changed"
  done
done

# Guest cluster 0 lives at offset 0 of the data file, where an L2 entry
# tells it from nothing only by its COPIED flag: a discard or an unmapping
# zero write over it must unmap it as it does every other cluster (it once
# kept it, and the discarded data read back).
for cfg in "cluster_size=64k" "cluster_size=64k,data_file_raw=on" "cluster_size=32k,extended_l2=on" \
           "cluster_size=32k,extended_l2=on,data_file_raw=on"; do
  for seq in "write -P 0x8b 1000 100k|discard 0 192k" "write -P 0x8c 0 64k|write -z -u 0 64k" \
             "write -P 0x8d 0 8k|discard 0 64k|write -P 0x8e 4k 4k"; do
    rm -f a.qcow2 a.raw t.qcow2 t.raw
    qemu-img create -q -f qcow2 -o data_file=a.raw,$cfg a.qcow2 1M
    qemu-img create -q -f qcow2 -o data_file=t.raw,$cfg t.qcow2 1M
    args=()
    IFS='|' read -ra cmds <<<"$seq"
    for c in "${cmds[@]}"; do args+=(-c "$c"); done
    "$QK" io "${args[@]}" a.qcow2 >io.out 2>&1 || { bad "$cfg $seq: qcowkit io failed"; tail -3 io.out; }
    qemu-io "${args[@]}" t.qcow2 >/dev/null 2>&1 || bad "$cfg $seq: qemu-io failed"
    ckclean a.qcow2 "$cfg $seq"
    qemu-img compare -q a.qcow2 t.qcow2 || bad "$cfg $seq: contents differ from qemu-io's"
    diff <(qemu-img map --output=json a.qcow2) <(qemu-img map --output=json t.qcow2) >diff.out ||
      { bad "$cfg $seq: map differs from qemu-io's image"; cat diff.out; }
    case $cfg in *data_file_raw=on*)
      qemu-img compare -q -f raw -F qcow2 a.raw a.qcow2 || bad "$cfg $seq: the raw data file is not the disk" ;;
    esac
  done
done

# --- convert into a data-file image ---
qemu-img create -q -f qcow2 src.qcow2 8M
qemu-io -c 'write -P 3 0 3M' -c 'write -P 4 5M 1M' src.qcow2 >/dev/null
for raw in off on; do
  rm -f c.qcow2 c.raw
  "$QK" convert -O qcow2 -o data_file=c.raw,data_file_raw=$raw src.qcow2 c.qcow2 || bad "convert -o data_file (raw=$raw)"
  qemu-img compare -q src.qcow2 c.qcow2 || bad "convert into a data file (raw=$raw): contents differ"
  ckclean c.qcow2 "convert into a data file (raw=$raw)"
  [ $raw = on ] && { qemu-img compare -q -f raw -F qcow2 c.raw src.qcow2 || bad "convert: the raw data file is not the disk"; }
done

# --- amend data_file / data_file_raw: same messages, status and bytes ---
qemu-img create -q -f qcow2 -o data_file=m.raw m.qcow2 4M
qemu-img create -q -f qcow2 -o data_file=mr.raw,data_file_raw=on mr.qcow2 4M
qemu-img create -q -f qcow2 plain.qcow2 4M
for img in m mr plain; do
  for o in data_file=m2.raw data_file_raw=on data_file_raw=off "data_file=m.raw,data_file_raw=on" "data_file=" \
           "data_file=new.raw,data_file_raw=off"; do
    res=()
    for tool in "$QK" qemu-img; do
      cp $img.qcow2 am.qcow2
      res+=("$(status "$tool" amend -o "$o" am.qcow2)|$(md5sum <am.qcow2)")
    done
    [ "${res[0]}" = "${res[1]}" ] || { bad "amend -o $o on $img differs from qemu-img"; printf '%s\n' "${res[@]}"; }
  done
done

# --- resize: the data file follows (grown, preallocated, cut), as qemu-img does ---
for raw in off on; do
  for args in ":8M" "--shrink:2M" "--preallocation=full:8M" "--preallocation=metadata:8M" \
              "--preallocation=falloc:6M" ":+1M"; do
    opt=${args%%:*} sz=${args#*:} res=()
    for tool in "$QK" qemu-img; do
      rm -f rs.qcow2 rs.raw
      qemu-img create -q -f qcow2 -o data_file=rs.raw,data_file_raw=$raw rs.qcow2 4M
      qemu-io -c 'write -P 1 0 4M' rs.qcow2 >/dev/null
      res+=("$(status "$tool" resize $opt rs.qcow2 "$sz") $(stat -c %s rs.raw) $(md5sum <rs.raw)
$(qemu-img map --output=json rs.qcow2; qemu-img check rs.qcow2 2>&1)")
    done
    [ "${res[0]}" = "${res[1]}" ] || { bad "resize $opt $sz (raw=$raw) differs from qemu-img"; printf '%s\n' "${res[@]}"; }
  done
done

# A shrink across L2 tables drops whole tables (4k clusters: 2 MiB each).
res=()
for tool in "$QK" qemu-img; do
  rm -f sh.qcow2 sh.raw
  qemu-img create -q -f qcow2 -o data_file=sh.raw,cluster_size=4k sh.qcow2 8M
  qemu-io -c 'write -P 1 0 8M' sh.qcow2 >/dev/null
  res+=("$(status "$tool" resize --shrink sh.qcow2 1M) $(md5sum <sh.qcow2) $(stat -c %s sh.raw) $(qemu-img check sh.qcow2 2>&1)")
done
[ "${res[0]}" = "${res[1]}" ] || { bad "shrink across L2 tables differs from qemu-img"; printf '%s\n' "${res[@]}"; }

# --- commit and rebase through data files ---
chain() { # base_opts overlay_opts
  rm -f cb.qcow2 cb.raw co.qcow2 co.raw nb.qcow2
  qemu-img create -q -f qcow2 ${1:+-o "$1"} cb.qcow2 8M
  qemu-io -c 'write -P 1 0 8M' cb.qcow2 >/dev/null
  qemu-img create -q -f qcow2 ${2:+-o "$2"} -b cb.qcow2 -F qcow2 co.qcow2
  qemu-io -c 'write -P 2 1M 2M' -c 'write -z 5M 1M' -c 'write -P 3 7M 4k' co.qcow2 >/dev/null
}
for pair in "data_file=cb.raw:data_file=co.raw" "data_file=cb.raw:" ":data_file=co.raw"; do
  bo=${pair%%:*} oo=${pair#*:}
  chain "$bo" "$oo"
  qemu-img convert -O raw co.qcow2 want.raw
  "$QK" commit -q co.qcow2 || bad "commit ($pair) failed"
  ckclean cb.qcow2 "commit ($pair): base"
  ckclean co.qcow2 "commit ($pair): overlay"
  qemu-img convert -O raw cb.qcow2 got.raw
  cmp -s want.raw got.raw || bad "commit ($pair): the base does not hold the overlay's data"
  qemu-img convert -O raw co.qcow2 got.raw
  cmp -s want.raw got.raw || bad "commit ($pair): the emptied overlay reads differently"
  chain "$bo" "$oo"
  qemu-img convert -O raw co.qcow2 want.raw
  qemu-img create -q -f qcow2 nb.qcow2 8M
  "$QK" rebase -b nb.qcow2 -F qcow2 co.qcow2 || bad "rebase ($pair) failed"
  ckclean co.qcow2 "rebase ($pair)"
  qemu-img convert -O raw co.qcow2 got.raw
  cmp -s want.raw got.raw || bad "rebase ($pair): the overlay reads differently"
done

# --- refusals ---
rm -f q.qcow2 q.raw
qemu-img create -q -f qcow2 -o data_file=q.raw q.qcow2 4M
qemu-io -c 'write -P 5 0 256k' q.qcow2 >/dev/null
cp q.raw q.raw.before
"$QK" snapshot -c s1 q.qcow2 2>err.txt && bad "snapshot -c was accepted"
grep -q "Could not create snapshot 's1'" err.txt || { bad "snapshot -c message"; cat err.txt; }
# -a: qemu-img's words, whatever the name (no snapshot can exist here).
a=$("$QK" snapshot -a s1 q.qcow2 2>&1; echo "rc=$?")
b=$(qemu-img snapshot -a s1 q.qcow2 2>&1; echo "rc=$?")
[ "${a#qcowkit:}" = "${b#qemu-img:}" ] || { bad "snapshot -a differs from qemu-img"; echo "$a"; echo "$b"; }
"$QK" io -c 'write -c 0 64k' q.qcow2 >out.txt 2>&1 && bad "a compressed write was accepted"
grep -q "Operation not supported" out.txt || { bad "write -c message"; cat out.txt; }
[ "$(status "$QK" amend -o compat=0.10 q.qcow2)" = "$(status qemu-img amend -o compat=0.10 q.qcow2)" ] ||
  bad "amend -o compat=0.10 differs from qemu-img"
ckclean q.qcow2 "after the refusals"
cmp -s q.raw q.raw.before || bad "a refused operation changed the data file"
qemu-io -c 'read -P 5 0 256k' q.qcow2 >/dev/null || bad "data lost after the refusals"

# --- a missing data file, a hostile mapping ---
mv q.raw q.raw.away
out=$("$QK" io -c 'read 0 4k' q.qcow2 2>&1) && bad "opened without its data file"
echo "$out" | grep -q "Could not open 'q.raw'" || { bad "missing data file message"; echo "$out"; }
# info describes the image without its data file, as qemu-img info does;
# check and map need the data and fail.
for o in human json; do
  [ "$(status "$QK" info --output=$o q.qcow2)" = "$(status qemu-img info --output=$o q.qcow2)" ] ||
    { bad "info --output=$o without the data file differs from qemu-img"; status "$QK" info --output=$o q.qcow2; }
done
"$QK" map q.qcow2 >/dev/null 2>&1 && bad "map without the data file succeeded"
"$QK" check q.qcow2 >/dev/null 2>&1 && bad "check without the data file succeeded"
[ -e q.raw ] && bad "a metadata-only open made the data file"
mv q.raw.away q.raw
# Point guest cluster 1's L2 entry at host offset 0x50000 (L2 entry layout
# from the qcow2 specification): not where a data file keeps it.
python3 - q.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(48)
l1 = struct.unpack(">Q", h[40:48])[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 8); f.write(struct.pack(">Q", (1 << 63) | 0x50000))
PY
out=$("$QK" io -c 'read 64k 4k' q.qcow2 2>&1) && bad "read a cluster mapped away from its guest offset"
# Named in qemu-img's words (it was a bare "Structure needs cleaning").
echo "$out" | grep -q "External data file host cluster offset 0x50000 does not match guest cluster offset: 0x10000, L2 index: 0x1)" ||
  { bad "a cluster mapped away from its guest offset: not named"; echo "$out"; }
# A discard (and an unmapping zero write) over such an entry drops it but
# must not punch the bytes it names: another cluster's data (guest cluster
# 0's at offset 0, told from nothing by OFLAG_COPIED alone, or cluster 1's).
for cmd in 'discard 128k 64k' 'write -z -u 128k 64k'; do
  for named in 0 1; do
    rm -f p.qcow2 p.raw
    qemu-img create -q -f qcow2 -o data_file=p.raw p.qcow2 1M
    qemu-io -c 'write -P 0x11 0 64k' -c 'write -P 0x22 64k 64k' -c 'write -P 0x33 128k 64k' p.qcow2 >/dev/null
    python3 - p.qcow2 $named <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(48)
l1 = struct.unpack(">Q", h[40:48])[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2 + 16); f.write(struct.pack(">Q", (1 << 63) | int(sys.argv[2]) * 65536))
PY
    "$QK" io -c "$cmd" p.qcow2 >/dev/null 2>&1
    qemu-io -c "read -P 0x$((named + 1))$((named + 1)) $((named * 64))k 64k" p.qcow2 >read.out 2>&1
    grep -q "read 65536/65536" read.out && ! grep -q "Pattern verification failed" read.out ||
      { bad "$cmd over an entry naming cluster $named's bytes: cluster $named lost its data"; cat read.out; }
  done
done
# A data file name that is not a plain local path (a protocol or json:
# name in the header extension) is refused, whatever it names.
for evil in 'nbd:x' 'rbd:x' 'json:' 'a://b'; do
  rm -f e.qcow2 e.raw
  qemu-img create -q -f qcow2 -o data_file=e.raw e.qcow2 1M
  python3 - e.qcow2 "$evil" <<'PY'
import sys
f = open(sys.argv[1], "r+b")
b = f.read(4096)
i = b.index(b"e.raw")
new = sys.argv[2].encode()
f.seek(i - 4)
f.write(len(new).to_bytes(4, "big") + new)
PY
  o=$("$QK" info e.qcow2 2>&1) && bad "opened an image whose data file is '$evil'"
  echo "$o" | grep -q "not a plain local file name" || { bad "data file '$evil': message"; echo "$o"; }
done
case "$out" in *AddressSanitizer*|*"runtime error"*) bad "hostile mapping: sanitizer report"; echo "$out" ;; esac

# --- a data file that is a file being read, or the image itself ---
# convert's sources share no writes (qemu-img's rule), so a target whose
# data file is a raw source is refused before anything is written; a data
# file naming the image itself is refused at create and at open.
head -c 2M /dev/urandom > src.raw
sum=$(md5sum < src.raw)
for tool in "$QK" qemu-img; do
  rm -f conv.qcow2
  "$tool" convert -O qcow2 -o data_file=src.raw src.raw conv.qcow2 > out.txt 2>&1 && bad "$tool: convert into its raw source as data file succeeded"
  grep -q 'lock' out.txt || { bad "$tool: data file = source: no lock message"; cat out.txt; }
  [ "$(md5sum < src.raw)" = "$sum" ] || bad "$tool: convert changed its raw source"
  [ -e conv.qcow2 ] && bad "$tool: a refused convert left conv.qcow2"
done
qemu-img create -q -f qcow2 -o data_file=src.raw n.qcow2 2M
head -c 2M /dev/urandom > src.raw
sum=$(md5sum < src.raw)
"$QK" convert -n -O qcow2 src.raw n.qcow2 > out.txt 2>&1 && bad "convert -n into an image whose data file is the source succeeded"
[ "$(md5sum < src.raw)" = "$sum" ] || bad "convert -n changed its raw source"
qemu-img create -q -f qcow2 s.qcow2 4M
qemu-io -c 'write -P 0x5a 0 4M' s.qcow2 > /dev/null
for args in "create -f qcow2 -o data_file=./self.qcow2 self.qcow2 1M" "convert -O qcow2 -o data_file=$PWD/self.qcow2 s.qcow2 self.qcow2"; do
  rm -f self.qcow2
  "$QK" $args > out.txt 2>&1 && bad "$args: a data file that is the image itself accepted"
  grep -q "is the image file itself" out.txt || { bad "$args: message"; cat out.txt; }
  [ -e self.qcow2 ] && bad "$args: left self.qcow2 behind"
done
# An image naming itself as its data file (hostile): never opened for I/O.
qemu-img create -q -f qcow2 -o data_file=other-data.raw self.qcow2 1M
python3 - self.qcow2 <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b"); h = f.read(4096)
pos = struct.unpack(">I", h[100:104])[0]
while True:
    t, n = struct.unpack(">II", h[pos:pos + 8])
    if t == 0: sys.exit("no data file extension")
    if t == 0x44415441:
        name = b"self.qcow2"
        assert len(name) <= n
        f.seek(pos + 4); f.write(struct.pack(">I", len(name)) + name + b"\0" * (n - len(name)))
        break
    pos += 8 + (n + 7) // 8 * 8
PY
before=$(md5sum < self.qcow2)
"$QK" io -c 'write -P 1 0 64k' self.qcow2 > out.txt 2>&1
grep -q "is the image file itself" out.txt || { bad "self-naming data file: message"; cat out.txt; }
[ "$(md5sum < self.qcow2)" = "$before" ] || bad "self-naming data file: the image changed"

# --- a relative data file name, the image in another directory ---
# As qemu-img: the name is relative to the current directory, at create
# and at every open (not to the image's directory, as a backing file is).
mkdir -p rel/sub
for tool in "$QK" qemu-img; do
  rm -f rel/r.data rel/sub/r.qcow2
  (cd rel && "$tool" create -q -f qcow2 -o data_file=r.data sub/r.qcow2 1M) || bad "$tool: create sub/r.qcow2 with data_file=r.data"
  [ -f rel/r.data ] && [ ! -e rel/sub/r.data ] || bad "$tool: the data file is not ./r.data"
  (cd rel && "$QK" io -c 'write -P 9 4k 4k' sub/r.qcow2 >/dev/null) || bad "$tool-made: write from the parent directory"
  (cd rel && qemu-io -c 'read -P 9 4k 4k' sub/r.qcow2 >/dev/null) || bad "$tool-made: qemu-io does not read what was written"
  (cd rel && qemu-io -c 'write -P 8 8k 4k' sub/r.qcow2 >/dev/null) || bad "$tool-made: qemu-io write"
  (cd rel && "$QK" io -c 'read -P 8 8k 4k' sub/r.qcow2 >/dev/null) || bad "$tool-made: qcowkit does not read what qemu-io wrote"
  (cd rel && qemu-img check -q sub/r.qcow2) || bad "$tool-made: check"
  o=$(cd rel/sub && "$QK" io -c 'read 0 4k' r.qcow2 2>&1) && bad "$tool-made: opened from the image's directory, where there is no r.data"
  echo "$o" | grep -q "Could not open 'r.data'" || { bad "$tool-made: missing data file message"; echo "$o"; }
done
"$QK" io -c 'read -P 5 0 4k' q.qcow2 >/dev/null 2>&1 || bad "cluster 0 unreadable next to a bad entry"
exit $fail
