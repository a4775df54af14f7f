# Sourced by the interop/snapshot-* tests (not a test itself: no .sh
# suffix): a scratch folder as the cwd (removed at exit), QK (the ASan
# build when there is one), and the failure and comparison helpers. The
# test ends with `exit $fail`.
set -u
QK=${QCOWKIT_ASAN:-$QCOWKIT}
work=$(mktemp -d "${TEST_DIR:-/tmp}/qk-snap.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# same_list IMAGE WHAT: our listing equals qemu-img's, byte for byte.
same_list() {
  if ! diff <($QK snapshot -l "$1") <(qemu-img snapshot -l "$1") >diff.out; then
    bad "$2: listings differ"
    cat diff.out
  fi
}
