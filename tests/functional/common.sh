# Sourced by every functional test. The runner sets QCOWKIT (the binary),
# TEST_DIR (a fresh scratch directory, also the cwd) and SRC_DIR. Output is
# compared with the test's .out file after TEST_DIR is replaced by the word
# TEST_DIR, so print paths freely.
set -u
QEMU_IMG=${QEMU_IMG:-qemu-img}
QEMU_IO=${QEMU_IO:-qemu-io}

qk() { "$QCOWKIT" "$@"; }

# Runs a command and prints its exit status on a line of its own, so golden
# files pin failures as well as output.
qk_status() { "$@"; echo "exit $?"; }

# qemu-io prints timing lines that differ per run; drop them.
filter_qemu_io() { sed -e '/^\(read\|wrote\) [0-9]*\/[0-9]* bytes at offset [0-9]*$/!{/ops\/sec/d}'; }
filter_stats() { grep -v 'ops/sec'; }
