#!/bin/sh
# tests/cli/bench_step_copy_test.sh — `ferry bench step` and `ferry bench
# copy` on the host backend: bench step validates (through host copies of
# the device buffers) on each shipped placement, NVMe included, and says
# "validated":true; --no-validate skips it and says "validated":false in the
# JSON and "skipped" in the text; a cuda device that is absent fails with
# exit 1 and a message; bench copy runs a list of sizes and one direction.
# $1 = the ferry binary, $2 = the repository root, $3 = a scratch folder.
# Exit 0 pass, 1 fail.
set -u
bin=$1
root=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir/build" || exit 1
cd "$dir" || exit 1 # offload-nvme.cfg's swap path is relative: build/nvme-swap
fail() {
  echo "cli.bench_step_copy: FAILED: $*" >&2
  for f in "$dir"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
small="--groups 3 --dim 32 --batch 2 --compute-ms 0 --steps 1"
for cfg in resident offload-host offload-nvme; do
  # shellcheck disable=SC2086
  "$bin" bench step --config "$root/examples/configs/$cfg.cfg" $small --json >"$dir/v.out" 2>&1 ||
    fail "bench step $cfg (validated) exited $?"
  grep -q '"validated":true' "$dir/v.out" || fail "bench step $cfg: no \"validated\":true"
  grep -q '"step_seconds":' "$dir/v.out" || fail "bench step $cfg: no step_seconds"
  # shellcheck disable=SC2086
  "$bin" bench step --config "$root/examples/configs/$cfg.cfg" $small --no-validate --json \
    >"$dir/nv.out" 2>"$dir/nv.err" || fail "bench step $cfg --no-validate exited $?"
  grep -q '"validated":false' "$dir/nv.out" || fail "bench step $cfg --no-validate: no \"validated\":false"
  grep -q 'validation skipped' "$dir/nv.err" || fail "bench step $cfg --no-validate: stderr does not say so"
done
# shellcheck disable=SC2086
"$bin" bench step --config "$root/examples/configs/offload-host.cfg" $small --no-validate \
  >"$dir/text.out" 2>&1 || fail "bench step --no-validate (text) exited $?"
grep -q 'validation: skipped (--no-validate)' "$dir/text.out" || fail "the text does not say it skipped"
# shellcheck disable=SC2086
"$bin" bench step --config "$root/examples/configs/offload-host.cfg" $small --set device=cuda \
  >"$dir/cuda.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  [ $rc -eq 1 ] || fail "bench step on an absent cuda device exited $rc, not 1"
  grep -q 'cuda' "$dir/cuda.out" || fail "bench step on an absent cuda device does not say why"
fi
"$bin" bench copy --device host --size 64k,1M --direction both --iters 2 --json >"$dir/copy.out" 2>&1 ||
  fail "bench copy --size 64k,1M --direction both exited $?"
[ "$(grep -c '"direction":"bidirectional"' "$dir/copy.out")" -eq 2 ] ||
  fail "bench copy --direction both: not one bidirectional line per size"
grep -q '"direction":"h2d"' "$dir/copy.out" && fail "bench copy --direction both printed h2d"
grep -q '"bytes":2097152' "$dir/copy.out" || fail "bench copy both at 1M: bytes is not 2M (both ways)"
"$bin" bench copy --device host --size 1M --direction sideways >"$dir/bad.out" 2>&1
[ $? -eq 2 ] || fail "bench copy --direction sideways should exit 2"
rm -rf "$dir"
echo "cli.bench_step_copy: ok"
