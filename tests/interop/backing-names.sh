#!/usr/bin/env bash
# Backing file names that QEMU records besides plain paths: "file:PATH"
# and json: descriptions of a local file (nested or with dotted keys, with
# options that change nothing), whose relative paths QEMU reads from the
# current directory. For each, an overlay qemu-img made reads through
# qcowkit with the backing data showing; info --backing-chain (text and
# JSON) equals qemu-img's; convert equals qemu-img's; a write leaves the
# image check-clean; commit lands in the base as qemu-img's does. json:
# names of other drivers or with unknown options are refused with the
# reason (they used to be read as relative file names that did not
# exist). The run uses the ASan build when there is one. Exit 0 pass.
. "$SRC_DIR/tests/interop/snapshot-lib.bash"

mkdir sub
here=$PWD
# name TWIN FORM: the backing name of form FORM for twin TWIN's base.
name() {
  local b=$1-base.qcow2
  case $2 in
    file-abs) echo "file:$here/sub/$b" ;;
    file-rel) echo "file:sub/$b" ;;
    json-nested) echo "json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"sub/$b\"}}" ;;
    json-dotted) echo "json:{\"driver\":\"qcow2\",\"file.filename\":\"$here/sub/$b\"}" ;;
    json-options) echo "json:{\"driver\":\"qcow2\",\"read-only\":true,\"file\":{\"driver\":\"file\",\"filename\":\"$here/sub/$b\",\"locking\":\"off\",\"aio\":\"threads\"}}" ;;
  esac
}

for form in file-abs file-rel json-nested json-dotted json-options; do
  for t in q k; do
    rm -f sub/$t-base.qcow2 sub/$t.qcow2
    qemu-img create -q -f qcow2 sub/$t-base.qcow2 4M
    qemu-io -c 'write -P 0x33 0 1M' sub/$t-base.qcow2 >/dev/null
    qemu-img create -q -f qcow2 -u -b "$(name $t $form)" -F qcow2 sub/$t.qcow2 4M ||
      bad "$form: qemu-img create"
    qemu-io -c 'write -P 0x44 512k 64k' sub/$t.qcow2 >/dev/null || bad "$form: qemu-io write"
  done
  out=$("$QK" io -r -c 'read -P 0x33 0 64k' -c 'read -P 0x44 512k 64k' sub/k.qcow2 2>&1)
  [ "$(grep -c 'read 65536/65536' <<<"$out")" = 2 ] || { bad "$form: reads"; echo "$out"; }
  for fmt in human json; do
    diff <(qemu-img info --output=$fmt --backing-chain sub/k.qcow2 | grep -v -e actual-size -e 'disk size') \
         <("$QK" info --output=$fmt --backing-chain sub/k.qcow2 | grep -v -e actual-size -e 'disk size') \
         >diff.out || { bad "$form: info --output=$fmt --backing-chain differs from qemu-img's"; cat diff.out; }
  done
  qemu-img convert -O raw sub/q.qcow2 q.raw
  "$QK" convert -O raw sub/k.qcow2 k.raw >o.txt 2>&1 || { bad "$form: convert"; cat o.txt; }
  cmp -s q.raw k.raw || bad "$form: convert output differs from qemu-img's"
  "$QK" io -c 'write -P 0x55 1536k 64k' sub/k.qcow2 >o.txt 2>&1 || { bad "$form: write"; cat o.txt; }
  qemu-io -c 'write -P 0x55 1536k 64k' sub/q.qcow2 >/dev/null
  qemu-img check -q sub/k.qcow2 || bad "$form: check after a write"
  qemu-img commit -q sub/q.qcow2
  "$QK" commit -q sub/k.qcow2 >o.txt 2>&1 || { bad "$form: commit"; cat o.txt; }
  qemu-img compare -q sub/q-base.qcow2 sub/k-base.qcow2 || bad "$form: committed base differs from qemu-img's"
  qemu-img check -q sub/k-base.qcow2 || bad "$form: check of the committed base"
done

# A new overlay over a json: name (create opens it for its size).
rm -f sub/n.qcow2
"$QK" create -q -f qcow2 -b "$(name k json-nested)" -F qcow2 sub/n.qcow2 >o.txt 2>&1 || { bad "create -b json:"; cat o.txt; }
[ "$(qemu-img info --output=json sub/n.qcow2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')" = 4194304 ] ||
  bad "create -b json:: size"
qemu-io -r -c 'read -P 0x33 0 64k' sub/n.qcow2 >o.txt 2>&1 && ! grep -q failed o.txt || bad "create -b json:: reads"

# Refused with the reason, the overlay unchanged.
for b in 'json:{"driver":"nbd","server":{"type":"unix","path":"/nonexistent"}}' \
         "json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"sub/k-base.qcow2\",\"x-unknown\":1}}" \
         'json:{"driver":"qcow2","file":{"driver":"nbd","host":"localhost"}}' \
         'json:{"driver":"qcow2"' 'json:[1]' 'json:{"driver":"qcow2"}'; do
  rm -f sub/r.qcow2
  qemu-img create -q -f qcow2 -u -b "$b" -F qcow2 sub/r.qcow2 4M
  sum=$(md5sum <sub/r.qcow2)
  out=$("$QK" io -c 'write 0 4k' sub/r.qcow2 2>&1); st=$?
  [ $st = 1 ] || bad "$b: exit $st"
  case $out in
    *"Unsupported backing file name"*|*"Could not parse the backing file name"*) ;;
    *) bad "$b: no reason given"; echo "$out" ;;
  esac
  case $out in *AddressSanitizer*|*"runtime error"*) bad "$b: sanitizer report"; echo "$out" ;; esac
  [ "$(md5sum <sub/r.qcow2)" = "$sum" ] || bad "$b: the overlay changed"
done
exit $fail
