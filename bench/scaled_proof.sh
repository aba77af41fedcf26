#!/usr/bin/env bash
# bench/scaled_proof.sh — issue 21's scaled proof as a benchmark: llama-100m
# through examples/configs/zero-infinity.cfg (32M device, 64M host budgets,
# everything else on NVMe) for STEPS steps, checked against the resident run
# (bit-identical losses, tier peaks, peak RSS), and its measured NVMe bytes
# per step per family and direction held against `ferry plan`'s prediction
# for the same model and budgets. Writes build/scaled_proof.json.
#
# usage: bench/scaled_proof.sh [BUILD_DIR] [STEPS]   (default: build 3)
# Run it alone: timings and the disk are shared with anything else running.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-3}
for exe in "$build/bin/ferry-gpt" "$build/bin/ferry"; do
  [ -x "$exe" ] || { echo "bench/scaled_proof.sh: $exe not built (./ferry.sh build)" >&2; exit 2; }
done
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} /usr/bin/python3 tests/gpt/scaled_proof.py \
  --gpt "$build/bin/ferry-gpt" --ferry "$build/bin/ferry" --root "$PWD" \
  --work "$build/scaled_proof" --steps "$steps" --bench --json-out "$build/scaled_proof.json"
echo "bench/scaled_proof.sh: wrote $build/scaled_proof.json"
