#!/bin/sh
# tests/cli/step_table.sh BIN_DIR WORK_DIR — the step-time table of
# docs/PLANNING.md ("What is validated"): `ferry plan`'s step_seconds for the
# synthetic model of `ferry bench step` (24 layers of 512x512) against the
# median of three `ferry bench step` runs, per placement and compute time.
# Documented, not a CTest test (timings depend on the machine).
set -eu
BIN=$1/ferry
W=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$W"
cd "$W"
[ -f prof.json ] || "$BIN" bench all --path "$W" --quick --profile-out prof.json >/dev/null
# The bench's model to the planner: 24 blocks of 262,016 params (hidden 128,
# ffn 511: 0.05% under 512^2), a vocabulary of one token; one token, no checkpointing, so
# compute is 6 P FLOPs.
cat > synth.json <<'J'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 511, "num_hidden_layers": 24,
 "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 1}
J
for MS in 4 1; do
  # the bench's GPU: 24 x 3 x MS of compute for 6 P + attention FLOPs
  python3 - "$MS" <<'P'
import json, sys
ms = float(sys.argv[1])
p = json.load(open("prof.json"))
P = 24 * 262016 + 2 * 128 + 128
flops = 6 * P + 12 * 24 * 1 * 128 * 1
t = 24 * 3 * ms / 1000
p["device_tflops"] = flops / t / 1e12
p["device_tflops_fp32"] = p["device_tflops"]
p["device_mem_gbps"] = p["cpu_optimizer_gbps"]  # the host backend's "device memory" is RAM
p["sources"] = {"device_tflops": "ferry bench step --compute-ms %g: 72 x %g ms per step" % (ms, ms)}
json.dump(p, open("prof-%g.json" % ms, "w"), indent=1)
P
  "$BIN" plan --model synth.json --gpu-mem 64G --host-mem 64G --nvme 64G --batch 1 --seq 1 \
      --checkpointing off --profile prof-$MS.json --json > plan-$MS.json || true
  for PL in all-gpu zero-offload zero3-offload nvme-optimizer; do
    case $PL in
      all-gpu) CFG=resident.cfg; SET="";;
      zero-offload) CFG=offload-host.cfg; SET="";;
      # clip 1 (step after backward): with clip 0 the eager step fails, see PLANNING.md
      zero3-offload) CFG=offload-host.cfg; SET="--set placement.params=host --set clip_grad_norm=1";;
      nvme-optimizer) CFG=offload-nvme.cfg
        SET="--set tiers.host.budget=100M --set tiers.nvme.paths=$W/swap";;
    esac
    RUN=0 TRY=0 FAILED=0
    while [ $RUN -lt 3 ] && [ $TRY -lt 9 ]; do
      TRY=$((TRY + 1))
      # shellcheck disable=SC2086
      if "$BIN" bench step --config "$ROOT/examples/configs/$CFG" --steps 4 --json \
          --compute-ms "$MS" --set clip_grad_norm=0 $SET > "step.json" 2> step.err; then
        RUN=$((RUN + 1))
        mv step.json "step-$PL-$MS-$RUN.json"
      else
        FAILED=$((FAILED + 1))
        echo "$PL MS=$MS: run failed: $(cat step.err)" >&2
      fi
    done
    [ $RUN -eq 3 ] || { echo "$PL MS=$MS: fewer than 3 good runs" >&2; continue; }
    [ $FAILED -eq 0 ] || echo "$PL MS=$MS: $FAILED failed runs before 3 good ones" >&2
    python3 - "$PL" "$MS" <<'P'
import json, sys, statistics
pl, ms = sys.argv[1], sys.argv[2]
plan = json.load(open("plan-%s.json" % ms))
c = [x for x in plan["candidates"] if x["placement"] == pl][0]
runs = [json.load(open("step-%s-%s-%d.json" % (pl, ms, r))) for r in (1, 2, 3)]
med = statistics.median(r["step_seconds"] for r in runs)
mid = sorted(runs, key=lambda r: r["step_seconds"])[1]
pred = c["step_seconds"]
comp = c.get("components", {})
print("| %s | %s | %.3f | %s | %.3f | %s | %+.0f%% |" % (
    pl, ms, pred, c.get("bottleneck", "?"), med,
    " ".join("%s %.3f" % (k, mid[k]) for k in ("compute_s", "h2d_s", "d2h_s", "optimizer_s",
                                                 "nvme_read_s", "nvme_write_s")),
    100 * (pred - med) / med))
print("   plan components:", json.dumps(comp), file=sys.stderr)
P
  done
done
