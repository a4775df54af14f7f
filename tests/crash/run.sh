#!/usr/bin/env bash
# Crash-state tests (see README, "Crash tests"): power-loss states rebuilt
# from the write log (powerloss.py) and SIGKILL rounds (sigkill.py), on
# every configuration in workload.py's SHORT list.
#   bash tests/crash/run.sh            short form (about 10 minutes on a busy 2-core machine)
#   bash tests/crash/run.sh --long     long form (hours: many seeds, thousands of kills)
#   bash tests/crash/run.sh --only powerloss|sigkill CONFIG [OPTIONS]   one short test (tests/run.sh uses this)
# Options after the form go to both scripts (e.g. --seed N, --keep DIR).
# Last line: "crash: states checked N, failures N"; exit 1 on any failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
export QCOWKIT="${QCOWKIT:-$top/build/tools/qcowkit}"
if [ -n "${TEST_DIR:-}" ]; then
  work=$TEST_DIR
else
  work=$(mktemp -d /var/tmp/qcowkit-crash.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mode=short
only_kind="" only_cfg=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --long) mode=long ;;
    --only) only_kind=$2; only_cfg=$3; shift 2 ;;
    *) extra+=("$1") ;;
  esac
  shift
done

# Short: a small workload per configuration, up to 8 states per crash point
# (about half a minute each on a busy 2-core machine).
pl_short=(--epochs 12 --cap-per-point 8)
sk_short=(--rounds 16 --epochs 200)
# Long: several seeds of full workloads, every state enumerated up to 40 per
# crash point; a thousand kills per configuration.
pl_long=(--rounds 6 --cap-per-point 40)
sk_long=(--rounds 1000 --epochs 400)

run_one() { # kind config args...
  local kind=$1 cfg=$2; shift 2
  python3 "$here/$kind.py" --qcowkit "$QCOWKIT" --workdir "$work" --config "$cfg" "$@" ${extra[@]+"${extra[@]}"}
}
log=""
run_logged() { # kind config args...
  run_one "$@" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || st=1
}

if [ -n "$only_kind" ]; then
  case "$only_kind" in
    powerloss) run_one powerloss "$only_cfg" "${pl_short[@]}" ;;
    sigkill) run_one sigkill "$only_cfg" "${sk_short[@]}" ;;
    *) echo "unknown kind $only_kind"; exit 2 ;;
  esac
  exit $?
fi

log=$(mktemp /var/tmp/qcowkit-crash-log.XXXXXX)
st=0
for cfg in $(python3 "$here/powerloss.py" --list); do
  if [ "$mode" = long ]; then
    run_logged powerloss "$cfg" "${pl_long[@]}"
    run_logged sigkill "$cfg" "${sk_long[@]}"
  else
    run_logged powerloss "$cfg" "${pl_short[@]}"
    run_logged sigkill "$cfg" "${sk_short[@]}"
  fi
done
# Images with an external data file: SIGKILL rounds only (workload.py).
for cfg in $(python3 "$here/sigkill.py" --list-data-file); do
  if [ "$mode" = long ]; then
    run_logged sigkill "$cfg" "${sk_long[@]}"
  else
    run_logged sigkill "$cfg" "${sk_short[@]}"
  fi
done
# Both scripts end with "<kind>: states checked N..., failures N".
states=$(awk '/^(powerloss|sigkill): states checked/ {s += $4} END {print s+0}' "$log")
fails=$(awk '/^(powerloss|sigkill): states checked/ {f += $NF} END {print f+0}' "$log")
rm -f "$log"
echo "crash: states checked $states, failures $fails"
exit $st
