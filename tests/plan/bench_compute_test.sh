#!/bin/sh
# tests/plan/bench_compute_test.sh — `ferry bench compute` on small token
# counts: every GEMM of a GPT-2 and a Llama step is timed after the check,
# the step's JSON says validated, --profile-out adds device_tflops and
# device_tflops_fp32 to a profile and keeps its other keys, ferry plan
# names the figure as the profile's, and cuda without a GPU exits 1 saying
# so. $1 = the ferry binary, $2 = a scratch folder, $3 = a Llama config.json.
set -u
bin=$1
dir=$2
llama=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1

fail() {
  echo "plan.bench_compute: FAILED: $*" >&2
  for f in "$dir"/*.out "$dir"/*.err "$dir"/*.json; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}

"$bin" bench compute --help >"$dir/help.out" 2>&1 || fail "--help exited non-zero"
grep -q -- "--profile-out" "$dir/help.out" || fail "--help does not document --profile-out"
"$bin" bench compute --seq 16 >/dev/null 2>&1
[ $? -eq 2 ] || fail "no --model should exit 2"
"$bin" bench compute --model gpt2 --seq 4096 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--seq beyond gpt2's positions should exit 2"

export OPENBLAS_NUM_THREADS=1
"$bin" bench compute --device host --model gpt2 --seq 16 --iters 1 --json >"$dir/gpt2.out" \
  2>"$dir/gpt2.err" || fail "gpt2 exited $?"
[ "$(grep -c '"result":"gemm"' "$dir/gpt2.out")" -eq 21 ] || fail "gpt2: expected 21 GEMMs"
grep -q '"result":"step".*"validated":true' "$dir/gpt2.out" || fail "gpt2: no validated step"
"$bin" bench compute --device host --model "$llama" --seq 8 --iters 1 --json >"$dir/llama.out" \
  2>"$dir/llama.err" || fail "llama exited $?"
[ "$(grep -c '"result":"gemm"' "$dir/llama.out")" -eq 30 ] || fail "llama: expected 30 GEMMs"

prof="$dir/prof.json"
printf '{"format": "ferry-profile", "version": 1, "nvme_read_gbps": 2.5,\n "sources": {"nvme_read_gbps": "by hand"}}\n' >"$prof"
"$bin" bench compute --device host --model gpt2 --seq 16 --iters 1 --profile-out "$prof" \
  >"$dir/prof.out" 2>&1 || fail "--profile-out exited $?"
grep -q '"nvme_read_gbps": 2.5' "$prof" || fail "the profile's other key was lost"
grep -q '"nvme_read_gbps": "by hand"' "$prof" || fail "the profile's other source was lost"
grep -q '"device_tflops":' "$prof" && grep -q '"device_tflops_fp32":' "$prof" ||
  fail "the compute keys are missing"
"$bin" plan --model gpt2 --device host --gpu-budget 1G --host-budget 2G --seq 128 \
  --profile "$prof" >"$dir/plan.out" 2>&1 || fail "ferry plan --profile exited $?"
grep -q "device_tflops_fp32 [0-9.e+-]*, from the profile" "$dir/plan.out" ||
  fail "plan does not name the profile's figure"

"$bin" bench compute --device cuda --model gpt2 --seq 16 --iters 1 >"$dir/cuda.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  [ $rc -eq 1 ] || fail "--device cuda without a GPU should exit 1, not $rc"
  grep -q "no CUDA device\|built without CUDA\|cannot open cuBLAS" "$dir/cuda.out" ||
    fail "--device cuda did not say why"
fi
rm -rf "$dir"
exit 0
