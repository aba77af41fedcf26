#!/bin/sh
# tests/cli/bench_step_nvme_test.sh — `ferry bench step` with the optimizer
# on NVMe (examples/configs/offload-nvme.cfg, a 48M host budget that cannot
# keep the optimizer state between steps) for each optimizer layout named:
# validated against the resident run, then the measured NVMe bytes per step
# of the optimizer family (read and written) within 5% of the planner's
# prediction for the same groups and layout (ferry_plan_optim_nvme_bytes),
# and the layout reported as asked; a small model's text says n/a and why.
# Layouts: fp32, bf16, int8 (states), int8-m16 (int8 states, bf16 master).
# $1 = the ferry binary, $2 = the repository root, $3 = a scratch folder,
# then the layouts. Exit 0 pass, 1 fail.
set -u
bin=$1
root=$2
dir=$3
shift 3
rm -rf "$dir" && mkdir -p "$dir/build" || exit 1
cd "$dir" || exit 1 # offload-nvme.cfg's swap path is relative: build/nvme-swap
fail() {
  echo "cli.bench_step_nvme: FAILED: $*" >&2
  for f in "$dir"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
for layout in "$@"; do
  case $layout in
  fp32) opts="" state=fp32 master=fp32 ;; # the defaults
  bf16) opts="--state-dtype bf16" state=bf16 master=fp32 ;;
  int8) opts="--state-dtype int8" state=int8 master=fp32 ;;
  int8-m16) opts="--state-dtype int8 --master bf16" state=int8 master=bf16 ;;
  *) fail "unknown layout '$layout'" ;;
  esac
  # shellcheck disable=SC2086
  "$bin" bench step --config "$root/examples/configs/offload-nvme.cfg" --set tiers.host.budget=48M \
    --groups 24 --dim 512 --batch 2 --compute-ms 0 --steps 2 $opts --json >"$dir/$layout.out" 2>&1 ||
    fail "bench step $layout exited $?"
  grep -q '"validated":true' "$dir/$layout.out" || fail "$layout: not validated"
  grep -q "\"state_dtype\":\"$state\",\"master\":\"$master\"" "$dir/$layout.out" ||
    fail "$layout: the layout reported is not $state states, $master master"
  err=$(sed -n 's/.*"optimizer_nvme_error":\([0-9.e+-]*\).*/\1/p' "$dir/$layout.out")
  [ -n "$err" ] || fail "$layout: no optimizer_nvme_error (optimizer not on NVMe?)"
  awk -v e="$err" 'BEGIN { exit !(e <= 0.05) }' ||
    fail "$layout: measured optimizer NVMe bytes off the plan by $err (> 0.05)"
  echo "cli.bench_step_nvme: $layout: measured vs planned optimizer NVMe bytes per step: error $err"
done
# A small model under the config's own 2G host budget: the host tier keeps
# the optimizer state, nothing is read back, and the text says n/a and why
# (not "-100.00%" against the planner).
"$bin" bench step --config "$root/examples/configs/offload-nvme.cfg" --groups 4 --dim 64 \
  --batch 2 --compute-ms 0 --steps 2 >"$dir/small.out" 2>&1 || fail "bench step small exited $?"
grep -q "measured read n/a, written +0.00%" "$dir/small.out" &&
  grep -q "(n/a: nothing was read back: the host tier's budget kept the optimizer states" \
    "$dir/small.out" && ! grep -q -- "-100.00%" "$dir/small.out" ||
  fail "small: the planner comparison gives no n/a with its reason"
echo "cli.bench_step_nvme: passed"
