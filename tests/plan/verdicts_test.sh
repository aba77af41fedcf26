#!/bin/sh
# tests/plan/verdicts_test.sh — issue 21's planner verdicts and `--largest`
# (docs/PLANNING.md, "Four machines' verdicts"): four machines at batch 1, seq
# 2048, each with the fit the issue demands and its exit status, and the
# largest dense model of two machines. usage: verdicts_test.sh FERRY
set -u
ferry=$1
fail=0
# verdict WANT_EXIT ARGS...: the exit status and the summary line
verdict() {
  want=$1
  shift
  out=$("$ferry" plan "$@" --batch 1 --seq 2048 2>&1)
  rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^(recommended:|nothing fits)')
  printf 'ferry plan %s\n  -> exit %d: %s\n' "$*" "$rc" "$line"
  if [ "$rc" -ne "$want" ]; then
    echo "FAILED: exit $rc, want $want"
    fail=1
  fi
}
verdict 0 --model llama-2-13b --gpu-mem 24G --host-mem 32G --nvme 2T
verdict 0 --model llama-2-70b --gpu-mem 24G --host-mem 64G --nvme 4T
verdict 0 --params 175B --gpu-mem 24G --host-mem 64G --nvme 8T
verdict 1 --model llama-2-70b --gpu-mem 24G --host-mem 16G

# largest MIN MAX ARGS...: --largest answers a parameter count in [MIN, MAX]
largest() {
  lo=$1
  hi=$2
  shift 2
  out=$("$ferry" plan --largest "$@" --batch 1 --seq 2048 --json 2>&1)
  rc=$?
  n=$(printf '%s\n' "$out" | sed -n 's/.*"largest":{"params":\([0-9]*\).*/\1/p')
  printf 'ferry plan --largest %s\n  -> exit %d: %s parameters\n' "$*" "$rc" "${n:-?}"
  if [ "$rc" -ne 0 ] || [ -z "$n" ] || [ "$n" -lt "$lo" ] || [ "$n" -gt "$hi" ]; then
    echo "FAILED: want exit 0 and $lo..$hi parameters"
    printf '%s\n' "$out"
    fail=1
  fi
}
largest 13000000000 1000000000000 --gpu-mem 24G --host-mem 32G --nvme 2T
largest 175000000000 1000000000000 --gpu-mem 24G --host-mem 64G --nvme 8T
largest 1000 13000000000 --gpu-mem 24G --host-mem 16G
# the answer fits and 1% more does not: the plan of each says so
n=$("$ferry" plan --largest --gpu-mem 24G --host-mem 32G --nvme 2T --batch 1 --seq 2048 --json |
    sed -n 's/.*"largest":{"params":\([0-9]*\).*/\1/p')
if ! "$ferry" plan --params "$n" --gpu-mem 24G --host-mem 32G --nvme 2T --batch 1 --seq 2048 \
     >/dev/null; then
  echo "FAILED: --params $n (the --largest answer) does not fit"
  fail=1
fi
up=$(awk -v n="$n" 'BEGIN { printf "%.0f", n * 1.0101 }')
if "$ferry" plan --params "$up" --gpu-mem 24G --host-mem 32G --nvme 2T --batch 1 --seq 2048 \
     >/dev/null; then
  echo "FAILED: --params $up (1% above the --largest answer) fits"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "plan.verdicts: all checks passed"
exit "$fail"
