#!/bin/sh
# tests/comm/expect_job.sh — runs a job that must fail in a known way:
#   expect_job.sh SECONDS nonzero|zero TEXT COMMAND...
# Passes when COMMAND ends within SECONDS (never hangs), with a non-zero (or
# zero) exit status, TEXT ("" for any) appears in its output and no
# sanitizer reported.
limit=$1 want=$2 text=$3
shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout -k 5 "$limit" "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
echo "expect_job: exit status $rc after ${took} s"
# timeout(1) exits 124, or 137 when it had to kill; mpirun itself may exit
# 137 (128 + SIGKILL) for a rank killed by signal 9, so the clock decides.
if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "$took" -ge "$limit" ]; }; then
  echo "expect_job: FAILED: the job hung past ${limit} s"
  exit 1
fi
if [ "$want" = nonzero ] && [ "$rc" -eq 0 ]; then
  echo "expect_job: FAILED: the job should have failed"
  exit 1
fi
if [ "$want" = zero ] && [ "$rc" -ne 0 ]; then
  echo "expect_job: FAILED: the job should have passed"
  exit 1
fi
if [ -n "$text" ] && ! grep -qF "$text" "$out"; then
  echo "expect_job: FAILED: the output lacks: $text"
  exit 1
fi
if grep -q "Sanitizer" "$out"; then
  echo "expect_job: FAILED: a sanitizer reported"
  exit 1
fi
echo "expect_job: as expected"
