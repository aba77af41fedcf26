#!/bin/sh
# tests/tools/gpu_check_test.sh — the GPU check without a GPU: the figures
# of tools/gpucheck.py on canned inputs (selftest); its test runner keeps
# ctest's rules (skip code, pass expression, WILL_FAIL, time limit) on a
# fake manifest; the manifest of a canned ctest list carries the python
# sources into the bundle's src/; tools/gpu_check.sh --dry-run on a fake
# bundle ends at once with a valid OUTDIR/results.json holding every part,
# each GPU part a skip with its reason, and a summary of the targets, and
# with --parts holds those parts alone (a bogus name refused, exit 2); a
# whole check on a fake GPU computes every part's figures (the python part's
# included) and the targets. $1 = the repository root,
# $2 = a scratch folder. Exit 0 pass, 1 fail, 77 skip (no python3).
set -u
root=$1
dir=$2
command -v python3 >/dev/null || { echo "tools.gpu_check: skip: no python3"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir/bundle/bin" || exit 1
fail() {
  echo "tools.gpu_check: FAILED: $*" >&2
  exit 1
}
python3 "$root/tools/gpucheck.py" selftest || fail "gpucheck.py selftest"
cat >"$dir/bundle/tests.json" <<'JSON'
{"tests": [
 {"name": "t.pass", "command": ["sh", "-c", "test -d @BUNDLE@/bin && test -f @ROOT@/tools/gpucheck.py"],
  "cwd": "@BUNDLE@/tests/a", "timeout": 30, "skip_rc": 77, "will_fail": false, "pass_regex": [],
  "fail_regex": [], "env": [], "serial": false},
 {"name": "t.skip", "command": ["sh", "-c", "echo no device; exit 77"], "cwd": "@BUNDLE@", "timeout": 30,
  "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": false},
 {"name": "t.fail", "command": ["sh", "-c", "exit 3"], "cwd": "@BUNDLE@", "timeout": 30, "skip_rc": 77,
  "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": true},
 {"name": "t.willfail", "command": ["sh", "-c", "exit 1"], "cwd": "@BUNDLE@", "timeout": 30,
  "skip_rc": null, "will_fail": true, "pass_regex": [], "fail_regex": [], "env": [], "serial": false},
 {"name": "t.regex", "command": ["sh", "-c", "echo \"value $GPUCHECK_T\"; exit 1"], "cwd": "@BUNDLE@",
  "timeout": 30, "skip_rc": null, "will_fail": false, "pass_regex": ["value 4[0-9]"], "fail_regex": [],
  "env": ["GPUCHECK_T=42"], "serial": false},
 {"name": "t.slow", "command": ["sleep", "30"], "cwd": "@BUNDLE@", "timeout": 1, "skip_rc": 77,
  "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": false}
], "left_out": []}
JSON
python3 "$root/tools/gpucheck.py" run-tests "$dir/bundle/tests.json" --root "$root" \
  --bundle "$dir/bundle" --logs "$dir/logs" --jobs 3 >"$dir/run.json"
[ $? -eq 1 ] || fail "run-tests with a failing test should exit 1"
python3 - "$dir/run.json" <<'PY' || fail "run-tests verdicts (above)"
import json, sys
r = {t["name"]: t["status"] for t in json.load(open(sys.argv[1]))["tests"]}
want = {"t.pass": "pass", "t.skip": "skip", "t.fail": "fail", "t.willfail": "pass",
        "t.regex": "pass", "t.slow": "timeout"}
if r != want:
    print("got", r, "want", want)
    sys.exit(1)
PY
t0=$(date +%s)
GPUCHECK_BUNDLE="$dir/bundle" "$root/tools/gpu_check.sh" --dry-run "$dir/out" >"$dir/check.out" 2>&1 ||
  { cat "$dir/check.out"; fail "gpu_check.sh --dry-run exited non-zero"; }
[ $(($(date +%s) - t0)) -le 20 ] || fail "gpu_check.sh --dry-run took over 20 s"
python3 -m json.tool "$dir/out/results.json" >/dev/null || fail "results.json is not JSON"
python3 - "$dir/out/results.json" <<'PY' || fail "results.json's shape (above)"
import json, sys
d = json.load(open(sys.argv[1]))
parts = d["parts"]
names = ["preflight", "context", "tests", "copy", "bench_step", "gpt", "python", "memcheck",
         "scale", "13b", "adam", "peers", "tests_rest"]
assert list(parts) == names, list(parts)
assert parts["preflight"]["status"] == "pass", parts["preflight"]
for n in names[1:]:
    p = parts[n]
    assert p["status"] == "skip" and "dry-run" in p["reason"], (n, p)
for p in parts.values():
    assert set(p) >= {"status", "command", "wall_s", "figures"}, p
s = d["summary"]
assert s["met"] == 0 and s["not_met"] == 0 and s["not_measured"] == len(s["targets"]) >= 18, s
assert d["status"] == "pass" and d["no_gpu_reason"], d
PY

# --parts: only the parts named (preflight always, context with gpt), each
# with its time limit; an unknown name is refused at once with the list.
GPUCHECK_BUNDLE="$dir/bundle" "$root/tools/gpu_check.sh" --parts tests,gpt --dry-run "$dir/outp" \
  >"$dir/parts.out" 2>&1 || { cat "$dir/parts.out"; fail "gpu_check.sh --parts tests,gpt --dry-run"; }
python3 - "$dir/outp/results.json" <<'PY' || fail "results.json of --parts tests,gpt (above)"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d["parts"]) == ["preflight", "context", "tests", "gpt"], list(d["parts"])
assert d["parts_run"] == list(d["parts"]) and d["parts_asked"] == "tests,gpt", d
assert all(isinstance(p["limit_s"], int) and p["limit_s"] > 0 for p in d["parts"].values()), d
assert d["parts"]["gpt"]["status"] == "skip" and "dry-run" in d["parts"]["gpt"]["reason"], d
PY
GPUCHECK_BUNDLE="$dir/bundle" "$root/tools/gpu_check.sh" --parts scale --dry-run "$dir/outs" \
  >"$dir/scale.out" 2>&1 || { cat "$dir/scale.out"; fail "gpu_check.sh --parts scale --dry-run"; }
python3 - "$dir/outs/results.json" <<'PY' || fail "results.json of --parts scale --dry-run (above)"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d["parts"]) == ["preflight", "context", "scale"], list(d["parts"])
p = d["parts"]["scale"]
assert p["status"] == "skip" and "dry-run" in p["reason"] and p["limit_s"] == 300, p
T = [t for t in d["summary"]["targets"] if t["target"].startswith(("scale", "attention"))]
assert len(T) == 8 and all(t["met"] is None for t in T), T
assert d["status"] == "pass", d
PY
GPUCHECK_BUNDLE="$dir/bundle" "$root/tools/gpu_check.sh" --parts adam --dry-run "$dir/outa" \
  >"$dir/adam.out" 2>&1 || { cat "$dir/adam.out"; fail "gpu_check.sh --parts adam --dry-run"; }
python3 - "$dir/outa/results.json" <<'PY' || fail "results.json of --parts adam --dry-run (above)"
import json, sys
d = json.load(open(sys.argv[1]))
assert list(d["parts"]) == ["preflight", "adam"], list(d["parts"])
p = d["parts"]["adam"]
assert p["status"] == "skip" and "dry-run" in p["reason"] and p["limit_s"] <= 60, p
T = [t for t in d["summary"]["targets"] if t["target"].startswith("adam")]
assert [t["limit"] for t in T] == [1.5, 2.2] and all(t["met"] is None for t in T), T
PY
# --help states each part's limit as gpucheck.py has it
"$root/tools/gpu_check.sh" --help >"$dir/help.out" || fail "gpu_check.sh --help"
# the header alone, ending with its Environment paragraph (not the script's inner comments)
tail -n 1 "$dir/help.out" | grep -q 'default MemAvailable)\.$' || fail "--help does not end with the header"
python3 "$root/tools/gpucheck.py" parts | tr ',' '\n' | sed 's/^ *//; s/ (\([0-9]*\) s)$/ \1/' |
  while read -r name secs; do
    grep -Eq "^  $name +\[$secs\]" "$dir/help.out" || fail "--help does not give $name [$secs]"
  done || exit 1
"$root/tools/gpu_check.sh" --dry-run --parts tests,bogus "$dir/outb" >"$dir/bogus.out" 2>&1
[ $? -eq 2 ] || { cat "$dir/bogus.out"; fail "--parts bogus: exit $?, not 2"; }
grep -q "unknown part 'bogus'.*tests_rest" "$dir/bogus.out" || { cat "$dir/bogus.out"; fail "--parts bogus: no list"; }
[ ! -e "$dir/outb" ] || fail "--parts bogus wrote $dir/outb"

# The manifest of a canned ctest list: the python tests' paths into the
# bundle's src/, which holds copies of python/ferry and tests/python.
mb=$dir/mbuild
mkdir -p "$mb/lib" "$dir/mbundle" && : >"$mb/lib/libferry.so.0" || exit 1
cat >"$dir/ctest.json" <<JSON
{"tests": [{"name": "python.checkpoint", "command": ["/usr/bin/python3", "$root/tests/python/test_checkpoint.py"],
  "properties": [{"name": "ENVIRONMENT", "value": ["FERRY_LIB=$mb/lib/libferry.so.0", "PYTHONPATH=$root/python"]},
                 {"name": "WORKING_DIRECTORY", "value": "$root/tests/python"}, {"name": "SKIP_RETURN_CODE", "value": 77}]}]}
JSON
python3 "$root/tools/gpucheck.py" manifest "$dir/ctest.json" "$root" "$mb" "$dir/mbundle" >/dev/null ||
  fail "gpucheck.py manifest"
for f in src/python/ferry/torch.py src/tests/python/common.py lib/libferry.so.0; do
  [ -f "$dir/mbundle/$f" ] || fail "the bundle lacks $f"
done
python3 - "$dir/mbundle/tests.json" <<'PY' || fail "the python test's manifest entry (above)"
import json, sys
t = json.load(open(sys.argv[1]))["tests"][0]
want = {"command": ["python3", "@BUNDLE@/src/tests/python/test_checkpoint.py"],
        "cwd": "@BUNDLE@/src/tests/python",
        "env": ["FERRY_LIB=@BUNDLE@/lib/libferry.so.0", "PYTHONPATH=@BUNDLE@/src/python"]}
got = {k: t[k] for k in want}
assert got == want, got
PY

# A whole check on a fake GPU: nvidia-smi, compute-sanitizer and the bundle's
# programs are scripts that print what the real ones print, so every part
# runs and its figures and the summary's targets come out as computed; its
# D2H is 0.8 of the peak, so the copy part fails, and a python test fails
# only with FERRY_PY_DEVICE=cuda (under the python FERRY_GPU_PYTHON names,
# whose probe says its torch sees a GPU), so the python part fails, and the
# RAM it is given (GPUCHECK_RAM_AVAILABLE, 16 GiB) holds no llama-1b run of
# the part peers, which fails saying so: the check exits 1.
fake=$dir/fake
mkdir -p "$fake/path" "$fake/bundle/bin" "$fake/bundle/src/tests/python" || exit 1
cat >"$fake/path/torch-python" <<'SH'
#!/bin/sh
[ "$1" = -c ] && { echo '{"torch": "9.9", "cuda": "12.4", "available": true, "device": "Fake"}'; exit 0; }
case "$1" in
*/torch_llama.py) # the peer: SDPA at hd 64 and 128, or 10 steps at 2000 tokens/s
  case "$*" in
  *--sdpa-bench*)
    for hd in 64 128; do echo "{\"head_dim\": $hd, \"fwd_ms\": 1.0, \"fwd_bwd_ms\": 2.0}"; done ;;
  *)
    for k in 1 2 3 4 5 6 7 8 9 10; do echo "{\"step\": $k, \"loss\": 5.$((60 - k)), \"tokens_per_s\": 2000}"; done
    echo '{"final": true, "tokens_per_s": 2000, "peak_bytes": 1000}' ;;
  esac
  exit 0 ;;
esac
exec python3 "$@"
SH
cat >"$fake/bundle/src/tests/python/t_ok.py" <<'PY'
print("ok")
PY
cat >"$fake/bundle/src/tests/python/t_host.py" <<'PY'
import os, sys
print("device", os.environ.get("FERRY_PY_DEVICE"))
sys.exit(1 if os.environ.get("FERRY_PY_DEVICE") == "cuda" else 0)
PY
cat >"$fake/path/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
*name,driver_version*) echo "Fake H200, 580.00, 143771" ;;
*-lms*) while :; do echo 1500; sleep 0.1; done ;;
*memory.used*) echo 1000 ;;
*) exit 1 ;;
esac
SH
cat >"$fake/path/compute-sanitizer" <<'SH'
#!/bin/sh
while [ $# -gt 0 ]; do case $1 in --*) shift 2 ;; *) break ;; esac; done
exec "$@"
SH
cat >"$fake/bundle/bin/ferry-cuda-peak" <<'SH'
#!/bin/sh
if [ "$1" = --context ]; then
  echo '{"bench":"cuda_context","device":"Fake","used_bytes":524288000}'
  sleep 0.5
  exit 0
fi
[ "$1" = --gemm ] && { echo '{"bench":"cuda_gemm","device":"Fake","m":8192,"seconds":0.0014,"tflops":800}'; exit 0; }
for b in 4194304 67108864 1073741824; do
  for d in h2d d2h; do echo "{\"bench\":\"cuda_peak\",\"direction\":\"$d\",\"bytes\":$b,\"gb_per_s\":50}"; done
  echo "{\"bench\":\"cuda_peak\",\"direction\":\"bidirectional\",\"bytes\":$((2 * b)),\"gb_per_s\":90}"
done
SH
cat >"$fake/bundle/bin/ferry" <<'SH'
#!/bin/sh
if [ "$1" = plan ]; then # the 13b part's plans: zero3-offload fits, 15 s a step
  while [ $# -gt 0 ]; do [ "$1" = --write-config ] && echo 'device = "cuda";' >"$2"; shift; done
  echo '{"params": 13015864320, "placement": "zero3-offload", "candidates": [{"placement": "zero3-offload",
 "fits": true, "why": "fits", "placement_keys": {"params": "host", "grads": "none", "optimizer": "host"},
 "tiers": {"gpu": {"bytes": 1000}, "host": {"bytes": 1073741824}}, "step_seconds": 15.0,
 "components": {"compute": 15.0}, "rss_bytes": {"total": 1100000000}}]}'
  exit 0
fi
case "$2" in
copy)
  for b in 4194304 67108864 1073741824; do
    echo "{\"bench\":\"copy\",\"direction\":\"h2d\",\"bytes\":$b,\"gb_per_s\":48}"
    echo "{\"bench\":\"copy\",\"direction\":\"d2h\",\"bytes\":$b,\"gb_per_s\":40}"
    echo "{\"bench\":\"copy\",\"direction\":\"bidirectional\",\"bytes\":$((2 * b)),\"gb_per_s\":85}"
  done ;;
step) echo '{"bench":"step","validated":false,"step_seconds":1.1,"overlap_ratio":1.1}' ;;
adam) # fp32 states 0.3 s, int8 0.2 s (1.5x, met), bf16 master + int8 0.15 s (2.0x, not met)
  case "$*" in *"--master bf16"*) s=0.15 ;; *"--state-dtype int8"*) s=0.2 ;; *) s=0.3 ;; esac
  echo "{\"bench\":\"adam\",\"seconds_per_step\":$s,\"gb_per_s\":40.0,\"fraction_of_roofline\":0.9}" ;;
*) exit 2 ;;
esac
SH
cat >"$fake/bundle/bin/ferry-gpt" <<'SH'
#!/bin/sh
dev=cpu tl= save= batch= steps=10 model=
while [ $# -gt 0 ]; do
  case $1 in --device) dev=$2; shift ;; --timeline) tl=$2; shift ;; --save) save=$2; shift ;;
  --set) case $2 in timeline=*) tl=${2#timeline=} ;; esac; shift ;;
  --batch) batch=$2; shift ;; --steps) steps=$2; shift ;; --model) model=$2; shift ;; esac
  shift
done
if [ "$steps" = 0 ] && [ -n "$save" ]; then # the scale part's initial weights
  mkdir -p "$save" && : >"$save/model.safetensors"
  echo '{"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4}' >"$save/config.json"
  exit 0
fi
case "$model:$batch" in
*config.json:8) echo "ferry-gpt: the CUDA model's activations do not fit: out of memory"; exit 1 ;;
esac
k=1
while [ $k -le "$steps" ]; do
  loss=5.$((60 - k))
  [ "$dev" = cuda ] && loss=${loss}1
  echo "{\"step\": $k, \"loss\": $loss, \"tokens_per_s\": 1000}"
  k=$((k + 1))
done
echo '{"final": true, "rss_bytes": 1150000000}'
case "$tl" in
*13b-*) # the engine's timeline (the 13b part): each 2 s step H2D-busy for 1.6 s
  ev='{"ph":"M","tid":1,"name":"thread_name","args":{"name":"H2D"}},{"ph":"M","tid":5,"name":"thread_name","args":{"name":"step"}}'
  k=1
  while [ $k -le "$steps" ]; do
    ev="$ev,{\"ph\":\"X\",\"tid\":1,\"ts\":$((k * 2000000 - 1800000)),\"dur\":1600000,\"name\":\"H2D\"}"
    ev="$ev,{\"ph\":\"X\",\"tid\":5,\"ts\":$((k * 2000000 - 100000)),\"dur\":100000,\"name\":\"ferry_step\"}"
    k=$((k + 1))
  done
  echo "{\"traceEvents\":[$ev]}" >"$tl" ;;
?*) echo '{"traceEvents":[{"ph":"M","tid":0,"name":"thread_name","args":{"name":"compute"}},{"ph":"X","tid":0,"ts":0,"dur":9000000}]}' >"$tl" ;;
esac
exit 0
SH
cat >"$fake/bundle/bin/ferry-gpt-attn" <<'SH'
#!/bin/sh
seq=2048
while [ $# -gt 0 ]; do [ "$1" = --seq ] && seq=$2; shift; done
echo "{\"fwd_ms\": 1.5, \"bwd_ms\": 1.5, \"fwd_bwd_ms\": 3.0, \"peak_bytes\": $((seq * 1000))}"
SH
chmod +x "$fake/path/"* "$fake/bundle/bin/"*
cat >"$fake/bundle/tests.json" <<'JSON'
{"tests": [
 {"name": "x.cuda", "command": ["sh", "-c", "exit 0"], "cwd": "@BUNDLE@", "timeout": 30,
  "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": false},
 {"name": "x.other", "command": ["sh", "-c", "exit 77"], "cwd": "@BUNDLE@", "timeout": 30,
  "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": false},
 {"name": "python.ok", "command": ["python3", "@BUNDLE@/src/tests/python/t_ok.py"], "cwd": "@BUNDLE@",
  "timeout": 30, "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [],
  "serial": false},
 {"name": "python.host", "command": ["python3", "@BUNDLE@/src/tests/python/t_host.py"], "cwd": "@BUNDLE@",
  "timeout": 30, "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [],
  "serial": false},
 {"name": "python.install", "command": ["sh", "-c", "exit 0"], "cwd": "@BUNDLE@", "timeout": 30,
  "skip_rc": 77, "will_fail": false, "pass_regex": [], "fail_regex": [], "env": [], "serial": false}
], "left_out": []}
JSON
PATH="$fake/path:$PATH" GPUCHECK_BUNDLE="$fake/bundle" GPUCHECK_SECONDS=120 GPUCHECK_RAM_AVAILABLE=$((16 << 30)) \
  FERRY_GPU_PYTHON="$fake/path/torch-python" \
  "$root/tools/gpu_check.sh" "$fake/out" >"$dir/fake.out" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$dir/fake.out"; fail "gpu_check.sh on the fake GPU exited $rc, not 1"; }
python3 - "$fake/out/results.json" <<'PY' || { cat "$dir/fake.out"; fail "the fake GPU's results (above)"; }
import json, sys
d = json.load(open(sys.argv[1]))
P = d["parts"]
bad = {k: v.get("reason") for k, v in P.items() if v["status"] != "pass"}
assert list(bad) == ["copy", "python", "peers"] and "0.90" in bad["copy"], bad
# 16 GiB of RAM (GPUCHECK_RAM_AVAILABLE) holds no llama-1b run: a fail, never a silent pass
assert bad["peers"] == "llama-1b not run: 16 GiB of RAM available, 24 needed", bad
assert d["status"] == "fail" and d["failed_parts"] == ["copy", "python", "peers"], d["status"]
py = P["python"]["figures"]
assert py["python"].endswith("/torch-python") and py["probes"][0]["device"] == "Fake", py
assert py["counts"] == {"pass": 1, "fail": 1} and list(py["left_out"]) == ["python.install"], py
r = {t["name"]: t for t in py["tests"]}
assert r["python.ok"]["status"] == "pass" and "wall_s" in r["python.ok"], r
assert r["python.host"]["status"] == "fail" and "device cuda" in r["python.host"]["tail"], r
assert P["tests_rest"]["figures"]["counts"] == {"pass": 3, "skip": 1}, P["tests_rest"]
assert d["gpu"]["name"] == "Fake H200", d["gpu"]
c = P["copy"]["figures"]
assert abs(c["min_ratio_h2d"] - 0.96) < 1e-9 and abs(c["min_ratio_d2h"] - 0.8) < 1e-9, c
assert abs(P["context"]["figures"]["context_mib"] - 500) < 1e-9, P["context"]
runs = P["gpt"]["figures"]["runs"]
assert len(runs) == 6 and all(r["status"] == "pass" for r in runs), runs
r = runs[0]
assert abs(r["max_rel_diff_vs_cpu"] - 0.1 / 59.0 * 1.0) < 0.01, r
assert r["device_mib"] == 500 and r["within_budget"], r
nvme = [r for r in runs if r["model"] == "gpt2" and r["placement"] == "offload-nvme"][0]
assert abs(nvme["timeline"]["ratio"] - 1.0) < 1e-9, nvme
T = {t["target"].split(":")[0]: t for t in d["summary"]["targets"]}
assert T["ferry H2D / raw cudaMemcpyAsync (min over 4M, 64M, 1G)"]["met"] is True, T
assert T["ferry D2H / raw cudaMemcpyAsync (min over 4M, 64M, 1G)"]["met"] is False, T
assert T["python on cuda"]["value"] == 1 and T["python on cuda"]["met"] is False, T
s = P["scale"]["figures"]
assert [t["batch"] for t in s["ferry_tries"]] == [8, 4] and s["ferry"]["batch"] == 4, s
assert s["gemm"]["tflops"] == 800 and s["torch"]["batch"] == 4, s
assert abs(s["tokens_per_s_ratio"] - 0.5) < 1e-12, s
fpt = 6 * (1100048384 - 65536000) + 6 * 22 * 2048 * 2048
assert s["flops_per_token"] == fpt and abs(s["ferry"]["mfu"] - 1000 * fpt / 800e12) < 1e-12, s
assert abs(s["loss_max_rel_diff"] - 0.001 / 5.5) < 1e-4, s
assert s["ferry"]["device_mib"] == 500 and s["ferry"]["allowed_mib"] == 60 * 1024 + 500, s
rows = {r["head_dim"]: r for r in s["attention"]["rows"]}
assert rows[64]["ratio_fwd_bwd"] == 1.5 and rows[128]["ratio_fwd_bwd"] == 1.5, rows
assert s["attention"]["mem_growth"] == 2.0, s["attention"]
S = {t["target"].split(": ", 1)[1]: t["met"] for t in d["summary"]["targets"]
     if t["target"].startswith(("scale", "attention"))}
assert S == {"tokens per step": False, "tokens/s ferry / torch_llama.py": False,
             "MFU (6 N tokens + attention) / measured GEMM peak": False,
             "losses vs torch, max relative difference": True,
             "peak device memory (MiB, nvidia-smi) vs budget + context": True,
             "ferry / torch SDPA": True, "ferry's peak at T=4096 / T=2048 (linear 2, T^2 4)": True}, S
b = P["13b"]["figures"]
r1, r2, pr = b["run1"], b["run2"], b["pair"]
assert P["13b"]["status"] == "pass" and r1["ok"] and r2["ok"], P["13b"]
assert r1["losses"] == [5.591, 5.581, 5.571, 5.561] and r1["step_seconds"] == 16.384, r1
assert abs(r1["model_tflops"] - 6 * 13015864320 * 1000 / 1e12) < 1e-9, r1
assert r1["device_peak_mib"] == 500 and r1["allowed_mib"] == 22 * 1024 + 500, r1
assert abs(r1["step_over_longest_max"] - 2.0 / 1.6) < 1e-9 and abs(r1["h2d_busy_s"] - 1.6) < 1e-9, r1
hb = 2 * 1073741824 + (4 * 1073741824 + 99) // 100  # the plan's host bytes, 4% and 1 GiB more
assert r1["plan"]["host_budget"] == (hb + 1048575) // 1048576 * 1048576 and \
    "--set tiers.host.budget=%d" % r1["plan"]["host_budget"] in r1["command"], r1
assert r1["startup_s"] == 0 and r1["startup_source"].startswith("first step line"), r1
assert b["profile1"]["profile"]["device_tflops"] == 800 and r2["model"] == "llama-2-7b", b
assert b["profile1"]["compute"]["source"].startswith("ferry-cuda-peak --gemm 8192"), b
assert pr["steps_differing"] == 0 and len(pr["streamed"]["losses"]) == 3, pr
S = {t["target"].split(": ", 1)[1]: t["met"] for t in d["summary"]["targets"]
     if t["target"].startswith("13b llama-2-13b")}
assert S == {"model TFLOPS (6 N tokens / step time)": False,
             "step time / longest component (worst step after the first)": False,
             "peak device memory (MiB, nvidia-smi) vs budget + context": True,
             "peak RSS vs plan, |measured / planned - 1|": True,
             "step time vs plan, |measured / planned - 1|": True,
             "launch to first step (s)": True}, S
A = P["adam"]["figures"]
assert A["ratios"] == {"int8": 1.5, "bf16_master_int8": 2.0}, A
assert [t["met"] for t in d["summary"]["targets"] if t["target"].startswith("adam")] == \
    [True, False], d["summary"]
# every target measured but the part peers' (its driver: tools.gpucheck_peers)
U = [t for t in d["summary"]["targets"] if t["met"] is None]
assert all(t["target"].startswith("peers ") for t in U) and len(U) == 15, U
PY
rm -rf "$dir"
echo "tools.gpu_check: ok"
