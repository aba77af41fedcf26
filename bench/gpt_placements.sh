#!/bin/sh
# bench/gpt_placements.sh [BIN_DIR] [STEPS_SMALL] [STEPS_GPT2] — ferry-gpt's
# tokens/s and stall share for the `small` and `gpt2` presets on the host
# backend, resident, offload-host and offload-nvme (examples/configs/), the
# same seed and batch for every row. Prints one row per run: the median of
# the per-step tokens/s (step 1 left out: it records the trace) and the
# run's stall share and per-tier peaks from the final JSON object. A
# benchmark, not a test: run it on a quiet machine.
set -eu
BIN=${1:-build/bin}
NS=${2:-20}
NG=${3:-6}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=/usr/share/common-licenses/GPL-3
[ -r "$DATA" ] || DATA=$ROOT/LICENSE
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
printf '%-6s %-13s %6s %10s %8s %9s %9s %9s %8s\n' model placement steps "tok/s" "stall%" "gpu MB" "host MB" "nvme MB" loss
for model in small gpt2; do
  steps=$NS
  extra=""
  if [ $model = gpt2 ]; then
    steps=$NG
    extra="--set tiers.gpu.budget=512M" # offload configs: the 77 MB embedding group + grads
  fi
  for cfg in resident offload-host offload-nvme; do
    set --
    [ $cfg = resident ] || set -- $extra
    # small: a host budget below its optimizer state (130 MB), so it streams
    # from NVMe every step; gpt2: the config's 2G (less than params, grads
    # and its 1.49 GB of optimizer state together)
    if [ $cfg = offload-nvme ] && [ $model = small ]; then set -- "$@" --set tiers.host.budget=128M; fi
    "$BIN/ferry-gpt" train --model $model --data "$DATA" --engine "$ROOT/examples/configs/$cfg.cfg" \
      --steps "$steps" --batch 4 --seq 128 --lr 1e-3 --seed 1 --json \
      --set tiers.nvme.paths="[\"$OUT/swap\"]" "$@" >"$OUT/run.json" 2>"$OUT/err" ||
      { echo "$model $cfg: failed: $(tail -3 "$OUT/err")"; continue; }
    python3 - "$OUT/run.json" "$model" "$cfg" <<'P'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
steps = [r for r in rows if not r.get("final")]
fin = [r for r in rows if r.get("final")][0]
tps = statistics.median(r["tokens_per_s"] for r in steps[1:]) if len(steps) > 1 else steps[0]["tokens_per_s"]
pk = fin["peak_bytes"]
print("%-6s %-13s %6d %10.0f %8.1f %9.1f %9.1f %9.1f %8.4f" % (sys.argv[2], sys.argv[3], len(steps), tps,
      fin["stall_pct"], pk["gpu"] / 1e6, pk["host"] / 1e6, pk["nvme"] / 1e6, fin["last_loss"]))
P
  done
done
