#!/bin/sh
# bench/adam_roofline.sh — ferry's CPU AdamW against (1) a kernel with the
# same memory traffic and no arithmetic (read p, g, m, v; write p, m, v),
# timed interleaved with ours in one run, and (2) torch.optim.AdamW(foreach)
# on the CPU when torch is importable; plus the fused fp16-copy pass against
# Adam-then-downcast. Prints medians and ratios.
# usage: bench/adam_roofline.sh [ferry-binary] ; env PARAMS (64M), STEPS (7),
#        THREADS ("1 2"), PYTHON (/usr/bin/python3)
set -eu
FERRY=${1:-build/bin/ferry}
PARAMS=${PARAMS:-64M}
STEPS=${STEPS:-7}
THREADS=${THREADS:-"1 2"}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$FERRY" ] || { echo "adam_roofline.sh: no ferry binary at $FERRY" >&2; exit 2; }

jget() { # key, json line
  printf '%s\n' "$2" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tr -d '"'
}

torch_time() { # threads -> median seconds per step, or "n/a"
  "$PYTHON" - "$PARAMS" "$1" "$STEPS" <<'PY' 2>/dev/null || echo n/a
import sys, time
import torch
s, t, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mult = {"k": 1 << 10, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
n = int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)
torch.set_num_threads(t)
p = torch.nn.Parameter(torch.rand(n) - 0.5)
p.grad = (torch.rand(n) - 0.5) * 0.25
opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=1e-2, foreach=True)
opt.step()
ts = []
for _ in range(max(3, k // 2)):
    t0 = time.perf_counter(); opt.step(); ts.append(time.perf_counter() - t0)
ts.sort()
print("%.5f" % ts[len(ts) // 2])
PY
}

echo "# ferry AdamW vs no-arithmetic roofline vs torch.optim.AdamW(foreach), $PARAMS params, median of $STEPS"
printf '%-8s %-22s %10s %10s %8s %10s %8s\n' threads case "ferry_s" "roof_s" "of_roof" "torch_s" "x_torch"
for t in $THREADS; do
  for g in fp32 fp16 bf16; do
    j=$("$FERRY" bench adam --params "$PARAMS" --optimizer adamw --grad $g --threads "$t" \
        --steps "$STEPS" --roofline --json)
    s=$(jget seconds_per_step "$j"); r=$(jget roofline_seconds_per_step "$j")
    frac=$(jget fraction_of_roofline "$j")
    if [ $g = fp32 ]; then
      tt=$(torch_time "$t")
      if [ "$tt" = n/a ]; then x=n/a; else x=$(awk "BEGIN{printf \"%.1f\", $tt/$s}"); fi
    else tt=-; x=-; fi
    printf '%-8s %-22s %10.4f %10.4f %8.2f %10s %8s\n' "$t" "adamw grad=$g" "$s" "$r" "$frac" "$tt" "$x"
  done
  for c in fp16 bf16; do
    j=$("$FERRY" bench adam --params "$PARAMS" --optimizer adamw --grad $c --param-copy $c \
        --threads "$t" --steps "$STEPS" --two-pass --json)
    s=$(jget seconds_per_step "$j"); tp=$(jget two_pass_seconds_per_step "$j")
    sp=$(jget fused_speedup "$j")
    printf '%-8s %-22s %10.4f %10s %8s   two-pass %.4f s: fused %.2fx (bytes 32/28 = 1.14x)\n' \
      "$t" "grad=$c copy=$c fused" "$s" - - "$tp" "$sp"
  done
done
