#!/bin/sh
# bench/compact_ratios.sh — issue 22's optimizer-step targets in one run:
# `ferry bench adam` at THREADS (1) threads, PARAMS (64M) params, bf16 grads
# and a bf16 param copy, for fp32 states, int8 states, and bf16 master + int8
# states (no copy: the params are the master), each with its same-traffic
# read-modify-write roofline; then the step-time ratios fp32 / int8 and
# fp32 / (bf16 master + int8). Usage: bench/compact_ratios.sh [path/to/ferry]
set -eu
FERRY=${1:-build/bin/ferry}
PARAMS=${PARAMS:-64M}
STEPS=${STEPS:-5}
THREADS=${THREADS:-1}
run() {
  "$FERRY" bench adam --params "$PARAMS" --steps "$STEPS" --threads "$THREADS" --grad bf16 \
    --param-copy bf16 --roofline --json "$@"
}
key() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
uptime
F=$(run --state-dtype fp32 --master fp32)
I=$(run --state-dtype int8 --master fp32)
B=$(run --state-dtype int8 --master bf16)
for j in "$F" "$I" "$B"; do echo "$j"; done
f=$(echo "$F" | key seconds_per_step)
i=$(echo "$I" | key seconds_per_step)
b=$(echo "$B" | key seconds_per_step)
awk -v f="$f" -v i="$i" -v b="$b" -v rf="$(echo "$F" | key fraction_of_roofline)" \
  -v ri="$(echo "$I" | key fraction_of_roofline)" -v rb="$(echo "$B" | key fraction_of_roofline)" \
  'BEGIN { printf "fp32 %.4f s, int8 %.4f s, bf16 master + int8 %.4f s\n", f, i, b;
           printf "fp32/int8 %.2fx (target 1.5), fp32/(bf16 master + int8) %.2fx (target 2.2)\n", f / i, f / b;
           printf "vs same-traffic RMW: fp32 %.2f, int8 %.2f, bf16 master + int8 %.2f (target 0.90)\n", rf, ri, rb }'
uptime
