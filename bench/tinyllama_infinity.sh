#!/usr/bin/env bash
# bench/tinyllama_infinity.sh — TinyLlama-1.1B (its config.json,
# tests/plan/configs/llama-1b.json) through examples/configs/zero-infinity.cfg
# on the host backend at the planner's minimum budgets (the zero-infinity
# candidate's device and host tiers), 64 MiB chunks, a few steps, through
# tests/cli/family_bytes.py: the swap files against their data (target
# <= 1.05), each family's NVMe bytes per step, measured against `ferry plan`
# (target within 5%), ferry-gpt's model states line against the engine's
# homes, and the step time planned and measured. Writes
# BUILD_DIR/tinyllama_infinity.json (the per-family rows).
#
# usage: bench/tinyllama_infinity.sh [BUILD_DIR] [STEPS] [LAYOUTS] [MODEL]
#   defaults: build, 4 (the last two measured), fp32 (also int8, bf16m,
#   int8m: comma-separated), TinyLlama's config.json. PROFILE=FILE passes
#   `ferry bench all`'s profile to the plan (its step time).
# Needs about 15 GiB of disk under BUILD_DIR for fp32 states (4.5 GiB with
# int8m) and many minutes on 2 cores; run it alone. A CI-sized run of the
# same script: MODEL=any small Llama config.json (cli.plan.family_bytes runs
# the thin one the script writes when MODEL is "thin").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-4}
layouts=${3:-fp32}
model=${4:-tests/plan/configs/llama-1b.json}
for exe in "$build/bin/ferry-gpt" "$build/bin/ferry"; do
  [ -x "$exe" ] || { echo "bench/tinyllama_infinity.sh: $exe not built (./ferry.sh build)" >&2; exit 2; }
done
work="$build/tinyllama_infinity"
margs=(--model "$model")
[ "$model" = thin ] && margs=()
extra=()
[ -n "${PROFILE:-}" ] && extra=(--profile "$PROFILE")
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)} /usr/bin/python3 tests/cli/family_bytes.py \
  --gpt "$build/bin/ferry-gpt" --ferry "$build/bin/ferry" --root "$PWD" --work "$work" \
  "${margs[@]}" --steps "$steps" --seq 128 --chunk 64M --layouts "$layouts" --factors 1 \
  --tol-reads 0.05 --check-extra --json-out "$build/tinyllama_infinity.json" "${extra[@]}"
rm -rf "$work/swap"
echo "bench/tinyllama_infinity.sh: wrote $build/tinyllama_infinity.json"
