#!/bin/bash
# tests/tools/gpu_rehearsal_test.sh — the GPU check rehearsed on a machine
# without a GPU, with the real programs: tools/gpu_bundle.sh gathers a
# bundle from this CUDA build (not packed: GPU_BUNDLE_PACK=0) into the
# scratch folder, and its ldd check passes; then tools/gpu_check.sh
# --rehearse runs the parts context, copy, bench_step, gpt, python, scale,
# 13b and adam from that bundle, each as on the GPU machine until the first
# program that finds no GPU: each GPU part a skip naming that program (a
# path, a file missing from the bundle, an argument a program refuses or a
# plan that does not fit 128 GiB is a fail), the part 13b's plans and
# profile made first (its llama-2-13b run is the program that stops it),
# the part adam run whole on a few params, and results.json well formed.
# $1 = the repository root, $2 = the build folder, $3 = a scratch folder.
# Exit 0 pass, 1 fail, 77 skip (not a CUDA build, or no python3 or ldd).
set -u
root=$1
build=$2
dir=$3
skip() {
  echo "tools.gpu_rehearsal: skip: $*"
  exit 77
}
fail() {
  echo "tools.gpu_rehearsal: FAILED: $*" >&2
  exit 1
}
command -v python3 >/dev/null || skip "no python3"
command -v ldd >/dev/null || skip "no ldd"
[ -x "$build/bin/ferry-cuda-peak" ] && [ -f "$build/lib/libferry-gpt-cuda.so" ] ||
  skip "$build is not a CUDA build (no bin/ferry-cuda-peak or lib/libferry-gpt-cuda.so)"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  skip "this machine has a GPU: run tools/gpu_check.sh itself"
fi
rm -rf "$dir" && mkdir -p "$dir" || exit 1
GPU_BUNDLE_NO_BUILD=1 GPU_BUNDLE_PACK=0 GPU_BUNDLE_BUILD=$build GPU_BUNDLE_OUT=$dir/gpucheck \
  "$root/tools/gpu_bundle.sh" >"$dir/bundle.out" 2>&1 || { cat "$dir/bundle.out"; fail "gpu_bundle.sh"; }
grep -q "ldd: all [0-9]* bundled files resolve" "$dir/bundle.out" || { cat "$dir/bundle.out"; fail "no ldd line"; }
parts=context,copy,bench_step,gpt,python,scale,13b,adam
GPUCHECK_BUNDLE=$dir/gpucheck GPUCHECK_SECONDS=100 \
  "$root/tools/gpu_check.sh" --rehearse --parts "$parts" "$dir/out" >"$dir/check.out" 2>&1
rc=$?
cat "$dir/check.out"
[ $rc -eq 0 ] || fail "gpu_check.sh --rehearse exited $rc"
python3 - "$dir/out/results.json" "$parts" <<'PY' || fail "the rehearsal's results.json (above)"
import json, sys
d = json.load(open(sys.argv[1]))
P = d["parts"]
assert d["rehearsal"] is True and d["status"] == "pass", (d["status"], d.get("failed_parts"))
assert list(P) == ["preflight"] + sys.argv[2].split(","), list(P)
assert P["preflight"]["status"] == "pass", P["preflight"]
# each GPU part stopped at the program named, which found no GPU
stops = {"context": "ferry-cuda-peak --context", "copy": "ferry-cuda-peak --size",
         "bench_step": "ferry bench step", "gpt": "ferry-gpt train --model small",
         "scale": "ferry-cuda-peak --gemm", "13b": "ferry-gpt train --model llama-2-13b"}
for name, prog in stops.items():
    p = P[name]
    assert p["status"] == "skip" and p["reason"].startswith("rehearsal: reached the GPU"), (name, p)
    assert prog in p["figures"]["stopped_at"].replace(d["bundle"] + "/bin/", ""), (name, p)
# the python part: no python whose torch sees a GPU here, said so
assert P["python"]["status"] == "skip" and "no python whose torch" in P["python"]["reason"], P["python"]
# 13b: the profile and both plans made before its llama-2-13b run
b = P["13b"]["figures"]
assert b["profile1"]["adam"].get("gb_per_s", 0) > 0, b["profile1"]
plan = b["run1"]["plan"]
assert plan["fits"] and plan["placement_keys"]["optimizer"] == "host", plan
assert "--set tiers.host.budget=%d" % plan["host_budget"] in P["13b"]["command"], P["13b"]["command"]
# adam: every run ran, each with its figures, on a few params
a = P["adam"]
assert a["status"] == "pass" and a["figures"]["params"] == "4M", a
assert all(a["figures"]["ratios"][k] for k in ("int8", "bf16_master_int8")), a["figures"]
assert len(d["summary"]["targets"]) > 20, d["summary"]
PY
rm -rf "$dir"
echo "tools.gpu_rehearsal: ok"
