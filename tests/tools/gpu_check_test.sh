#!/bin/sh
# tests/tools/gpu_check_test.sh — the GPU check without a GPU: the figures
# of tools/gpucheck.py on canned inputs (selftest); its test runner keeps
# ctest's rules (skip code, pass expression, WILL_FAIL, time limit) on a
# fake manifest; tools/gpu_check.sh --dry-run on a fake bundle ends at once
# with a valid OUTDIR/results.json holding every part, each GPU part a skip
# with its reason, and a summary of the targets. $1 = the repository root,
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
names = ["preflight", "context", "tests", "copy", "bench_step", "gpt", "memcheck", "tests_rest"]
assert list(parts) == names, list(parts)
assert parts["preflight"]["status"] == "pass", parts["preflight"]
for n in names[1:]:
    p = parts[n]
    assert p["status"] == "skip" and "dry-run" in p["reason"], (n, p)
for p in parts.values():
    assert set(p) >= {"status", "command", "wall_s", "figures"}, p
s = d["summary"]
assert s["met"] == 0 and s["not_met"] == 0 and s["not_measured"] == len(s["targets"]) >= 17, s
assert d["status"] == "pass" and d["no_gpu_reason"], d
PY
rm -rf "$dir"
echo "tools.gpu_check: ok"
