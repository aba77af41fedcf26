#!/bin/sh
# tests/cli/bench_step_ranks_test.sh — `ferry bench step` with 2 ranks on the
# host backend: under `mpirun -np 2` and with --ranks 2 (which runs mpirun
# itself) it validates, only rank 0 prints (one JSON object), and the JSON
# has the communication keys with sane values: ranks 2 over mpi, collectives
# and bytes per step > 0, comm seconds > 0, comm_hidden_fraction in [0, 1],
# the step alone timed; NVMe swap files go to one folder per rank; --ranks
# that disagrees with the launcher is refused naming both counts. With $5 =
# fail-alone instead: rank 1 fails at its second timed step (test hook) and
# lingers 60 s before its abort, as under a slow launcher; rank 0 must stop
# within 5 s of rank 1's error, naming rank 1 and its cause, and end the job.
# $1 = the ferry binary, $2 = the repository root, $3 = a scratch folder,
# $4 = mpirun. Exit 0 pass, 1 fail.
set -u
bin=$1
root=$2
dir=$3
mpirun=$4
case_=${5:-report}
PATH=$(dirname "$mpirun"):$PATH
export PATH
rm -rf "$dir" && mkdir -p "$dir/build" || exit 1
cd "$dir" || exit 1 # offload-nvme.cfg's swap path is relative: build/nvme-swap
fail() {
  echo "cli.bench_step_ranks: FAILED: $*" >&2
  for f in "$dir"/*.out "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
# the number after "key": in file $2
num() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" "$2"; }
# awk condition $2 on the value of key $1 in file $3
check() {
  v=$(num "$1" "$3")
  [ -n "$v" ] || fail "$3: no number \"$1\""
  awk -v x="$v" "BEGIN { exit !($2) }" || fail "$3: \"$1\": $v, wanted $2"
}
small="--groups 4 --dim 64 --batch 2 --compute-ms 1 --steps 2"
now() { date +%s.%N; }
if [ "$case_" = fail-alone ]; then
  err="$dir/fail.err"
  # shellcheck disable=SC2086
  timeout -k 5 90 "$mpirun" --oversubscribe -np 2 -x FERRY_BENCH_TEST_FAIL_RANK=1 \
    -x FERRY_BENCH_TEST_LINGER=60 "$bin" bench step \
    --config "$root/examples/configs/offload-host.cfg" $small >"$dir/fail.out" 2>"$err" &
  pid=$!
  t_fail=
  while kill -0 $pid 2>/dev/null; do
    [ -z "$t_fail" ] && grep -q "rank 1: test hook" "$err" && t_fail=$(now)
    sleep 0.1
  done
  wait $pid
  rc=$?
  t_end=$(now)
  [ -n "$t_fail" ] || fail "rank 1 did not fail through the test hook"
  [ "$rc" != 0 ] || fail "the job exited 0"
  awk -v a="$t_fail" -v b="$t_end" 'BEGIN { exit !(b - a <= 5) }' ||
    fail "the job ended $(awk -v a="$t_fail" -v b="$t_end" 'BEGIN { print b - a }') s after rank 1's error (bound 5 s)"
  grep -q "rank 0: .*rank 1 failed: test hook: this rank fails" "$err" ||
    fail "rank 0 did not stop naming rank 1 and its cause"
  rm -f "$dir"/*.out "$dir"/*.err
  echo "cli.bench_step_ranks.fail_alone: passed"
  exit 0
fi
for how in mpirun ranks; do
  out="$dir/$how.out"
  if [ $how = mpirun ]; then
    # shellcheck disable=SC2086
    "$mpirun" --oversubscribe -np 2 "$bin" bench step --config "$root/examples/configs/offload-host.cfg" \
      $small --json >"$out" 2>"$dir/$how.err" || fail "mpirun -np 2 bench step exited $?"
  else
    # shellcheck disable=SC2086
    "$bin" bench step --config "$root/examples/configs/offload-host.cfg" $small --ranks 2 --json \
      >"$out" 2>"$dir/$how.err" || fail "bench step --ranks 2 exited $?"
  fi
  [ "$(grep -c '"bench":"step"' "$out")" = 1 ] || fail "$how: not exactly one report (rank 0 only)"
  grep -q '"validated":true' "$out" || fail "$how: not validated"
  grep -q '"comm":"mpi"' "$out" || fail "$how: no \"comm\":\"mpi\""
  check ranks 'x == 2' "$out"
  check zero_stage 'x == 2' "$out"
  check step_seconds 'x > 0' "$out"
  check comm_ops_per_step 'x >= 4' "$out" # a reduce-scatter and an all-gather per group
  check comm_bytes_per_step 'x > 0' "$out"
  check comm_seconds_per_step 'x > 0 && x < 10' "$out"
  check comm_busy_seconds_per_step 'x > 0' "$out"
  check comm_wait_seconds_per_step 'x >= 0' "$out"
  check comm_hidden_fraction 'x >= 0 && x <= 1' "$out"
  check alone_step_seconds 'x > 0' "$out"
  grep -q '"dist_overhead_seconds_per_step":' "$out" || fail "$how: no dist_overhead_seconds_per_step"
done
# stage 0 (all-reduce) with the optimizer on NVMe: a swap folder per rank
# shellcheck disable=SC2086
"$mpirun" --oversubscribe -np 2 "$bin" bench step --config "$root/examples/configs/offload-nvme.cfg" \
  $small --set dist.zero_stage=0 --set tiers.host.budget=8M >"$dir/nvme.out" 2>"$dir/nvme.err" ||
  fail "stage 0 on NVMe exited $?"
grep -q 'ranks 2 (mpi), dist.zero_stage 0' "$dir/nvme.out" || fail "stage 0: the text lacks the ranks line"
grep -q 'comm_hidden_fraction' "$dir/nvme.out" || fail "stage 0: the text lacks comm_hidden_fraction"
[ -d build/nvme-swap/rank0 ] && [ -d build/nvme-swap/rank1 ] || fail "no swap folder per rank"
# --ranks that is not what the launcher made
# shellcheck disable=SC2086
"$mpirun" --oversubscribe -np 2 "$bin" bench step --config "$root/examples/configs/offload-host.cfg" \
  $small --ranks 3 >"$dir/bad.out" 2>"$dir/bad.err" && fail "--ranks 3 under -np 2 succeeded"
grep -q -- '--ranks 3, but the launcher started 2 ranks' "$dir/bad.err" || fail "--ranks 3: no clear error"
rm -f "$dir"/*.out "$dir"/*.err
echo "cli.bench_step_ranks: passed"
