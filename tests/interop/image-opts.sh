#!/usr/bin/env bash
# --image-opts and --target-image-opts: images named by QEMU-style key
# lists give what qemu-img gives for the same lists (info and map output,
# check, compare, measure, snapshot list, convert from and into a key
# list, resize), and the mistakes qemu-img refuses are refused with its
# message and exit code; nbd keys reach an export. Plain and ASan builds.
# (rbd.sh checks the rbd keys against a cluster.)
set -u
. "$SRC_DIR/tests/interop/nbd-lib.bash"
mask() { sed -e 's/^disk size: .*/disk size: SIZE/' -e 's/"actual-size": [0-9]*/"actual-size": SIZE/' \
  -e 's/^qcowkit: /PROG: /' -e 's/^qemu-img: /PROG: /'; }

qemu-img create -q -f qcow2 a.qcow2 64M
qemu-io -f qcow2 -c 'write -P 0x11 0 3M' -c 'write -z 8M 1M' -c 'write -P 0x22 40M 64k' a.qcow2 > /dev/null
qemu-img snapshot -c snap1 a.qcow2
qemu-img convert -O raw a.qcow2 './r:aw.img'
cp 'r:aw.img' 'rbd:x.img'
A=driver=qcow2,file.filename=a.qcow2
A2=driver=qcow2,file.driver=file,file.filename=a.qcow2
R='driver=raw,file.filename=r:aw.img'
F='driver=file,filename=r:aw.img'

for QK in "$QK_PLAIN" "$QK_ASAN"; do
  b=$(basename "$(dirname "$(dirname "$QK")")")
  # Output: the same as qemu-img's for the same key list.
  for o in human json; do
    for opts in "$A" "$A2" "$R"; do
      diff <("$QK" info --output=$o --image-opts "$opts" | mask) \
           <(qemu-img info --output=$o --image-opts "$opts" | mask) || fail "$b: info $o $opts"
      diff <("$QK" map --output=$o --image-opts "$opts") \
           <(qemu-img map --output=$o --image-opts "$opts") || fail "$b: map $o $opts"
    done
  done
  # A protocol driver alone: the same data as the file read raw.
  diff <("$QK" map --output=json --image-opts "$F") <(qemu-img map --output=json -f raw ./r:aw.img) ||
    fail "$b: map driver=file"
  # A file whose name reads as an rbd: name stays a file.
  diff <("$QK" map --output=json --image-opts driver=raw,file.filename=rbd:x.img) \
       <(qemu-img map --output=json --image-opts driver=raw,file.filename=rbd:x.img) || fail "$b: map rbd:x.img file"
  "$QK" check --image-opts "$A" > check.out || fail "$b: check"
  grep -q 'No errors were found' check.out || fail "$b: check output"
  out=$("$QK" compare --image-opts "$A" "$R") || fail "$b: compare: $out"
  [ "$out" = "Images are identical." ] || fail "$b: compare says '$out'"
  diff <("$QK" measure -O qcow2 --image-opts "$A") <(qemu-img measure -O qcow2 --image-opts "$A") ||
    fail "$b: measure"
  diff <("$QK" snapshot -l --image-opts "$A" | sed 's/ [0-9:-]* [0-9:]* *[0-9:.]* *[0-9]*$//') \
       <(qemu-img snapshot -l --image-opts "$A" | sed 's/ [0-9:-]* [0-9:]* *[0-9:.]* *[0-9]*$//') ||
    fail "$b: snapshot -l"
  # convert from a key list, and into one (-n: the target exists).
  rm -f c.qcow2 d.qcow2
  "$QK" convert -O qcow2 --image-opts "$A" c.qcow2 || fail "$b: convert from a key list"
  qemu-img compare -q a.qcow2 c.qcow2 || fail "$b: converted image differs"
  qemu-img create -q -f qcow2 d.qcow2 64M
  "$QK" convert -n --target-image-opts ./r:aw.img driver=qcow2,file.filename=d.qcow2 -f raw ||
    fail "$b: convert into a key list"
  qemu-img compare -q a.qcow2 d.qcow2 || fail "$b: convert target differs"
  qemu-img check -q d.qcow2 || fail "$b: convert target check"
  cp a.qcow2 g.qcow2
  "$QK" resize --image-opts driver=qcow2,file.filename=g.qcow2 +1M > /dev/null || fail "$b: resize"
  qemu-img info --output=json g.qcow2 | grep -q '"virtual-size": 68157440' || fail "$b: resize size"
  qemu-img check -q g.qcow2 || fail "$b: resize check"

  # nbd keys, at the top level and under file., against an export.
  start_serve "$QK_PLAIN" pid --socket "$PWD/nbd.sock" --export "name=disk,file=a.qcow2,format=qcow2,readonly=on"
  for opts in "driver=nbd,server.type=unix,server.path=$PWD/nbd.sock,export=disk" \
              "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$PWD/nbd.sock,file.export=disk"; do
    diff <("$QK" map --output=json --image-opts "$opts") <(qemu-img map --output=json --image-opts "$opts") ||
      fail "$b: map $opts"
    out=$("$QK" compare --image-opts "$opts" "$R") || fail "$b: compare over nbd: $out"
  done
  stop_serve "$SERVE_PID"

  # Mistakes: qemu-img's message (after the program name) and exit code.
  same_err() { # description, then the arguments shared by both tools
    local what=$1; shift
    local o1 o2 s1 s2
    o1=$("$QK" "$@" 2>&1 | mask | head -n 1); s1=${PIPESTATUS[0]}
    o2=$(qemu-img "$@" 2>&1 | mask | head -n 1); s2=${PIPESTATUS[0]}
    [ "$s1" = "$s2" ] || fail "$b: $what: exit $s1, qemu-img $s2 ($o1 / $o2)"
    [ "$o1" = "$o2" ] || fail "$b: $what: '$o1', qemu-img '$o2'"
  }
  same_err "-f with a key list" info -f qcow2 --image-opts "$A"
  same_err "an unknown format option" info --image-opts "$A,bogus=1"
  same_err "target key list without -n" convert --target-image-opts a.qcow2 driver=qcow2,file.filename=e.qcow2
  # Ours only (qemu-img has more drivers and options): refused by name.
  out=$("$QK" info --image-opts driver=vmdk,file.filename=a.qcow2 2>&1) && fail "$b: vmdk accepted"
  echo "$out" | grep -q "Unknown driver 'vmdk'" || fail "$b: vmdk: $out"
  out=$("$QK" info --image-opts "$A,cache.direct=on" 2>&1) && fail "$b: cache.direct accepted"
  echo "$out" | grep -q "does not support the option 'cache.direct'" || fail "$b: cache.direct: $out"
  out=$("$QK" info --image-opts driver=qcow2 2>&1) && fail "$b: no file accepted"
  echo "$out" | grep -q "Parameter 'file.filename' is required" || fail "$b: no file: $out"
  out=$("$QK" info --image-opts 'driver=qcow2,file.filename' 2>&1) && fail "$b: key without value accepted"
  echo "$out" | grep -q "has no value" || fail "$b: key without value: $out"
  out=$("$QK" compare --image-opts "$A" a.qcow2 2>&1); st=$?
  [ "$st" = 2 ] || fail "$b: compare with one key list: exit $st ($out)"
  out=$("$QK" create --image-opts "$A" 1M 2>&1) && fail "$b: create --image-opts accepted"
  echo "$out" | grep -q "not supported by 'create'" || fail "$b: create: $out"
  # A value with ",," keeps its comma.
  cp a.qcow2 'x,y.qcow2'
  "$QK" info --image-opts 'driver=qcow2,file.filename=x,,y.qcow2' | grep -q '^image: x,y.qcow2$' || fail "$b: ,, escape"
  echo "ok $b"
done
