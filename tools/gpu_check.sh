#!/usr/bin/env bash
# tools/gpu_check.sh [--dry-run|--rehearse] [--parts LIST] [OUTDIR] — the GPU check in
# one command, on a machine with an NVIDIA GPU, run from the repository
# root with gpucheck/ (tools/gpu_bundle.sh) carried along. It builds
# nothing. It runs these parts in this order, each under its own time limit
# (seconds, in brackets), all of them or the comma-separated LIST (preflight
# always; context too with gpt, scale or 13b, which need its figure; an unknown
# name is refused with the list, exit 2):
#   preflight   [30] the bundle is there and ldd resolves every library
#   context     [15] an idle CUDA context's memory (ferry-cuda-peak --context)
#   tests      [100] every CUDA test and the engine tests (the bundle's manifest)
#   copy        [45] ferry bench copy against ferry-cuda-peak: pinned H2D, D2H,
#               both at once, at 4M, 64M and 1G (ratio; target >= 0.90)
#   bench_step  [70] ferry bench step on cuda, params on the host, the
#               optimizer on the host and then on NVMe, the timeline's figures
#   gpt        [170] ferry-gpt small and gpt2, --device cuda --engine CFG in
#               each placement of examples/configs/, 10 steps: losses against
#               --device cpu (run beside, on 8 threads), tokens/s, peak
#               device memory (nvidia-smi) against tiers.gpu.budget + context
#   python      [90] the Python binding on cuda: the bundle's python tests with
#               FERRY_PY_DEVICE=cuda under a python whose torch sees the GPU
#               (FERRY_GPU_PYTHON, else /opt/torch/.venv/bin/python, else
#               python3); a skip with the reason when there is none
#   memcheck    [60] compute-sanitizer memcheck on the CUDA tests, where it works
#   scale      [300] resident llama-1b, batch 8 x seq 2048 (else 4, 2), 10
#               steps: ferry-gpt against bench/peers/torch_llama.py from the
#               same saved weights (tokens/s, MFU over ferry-cuda-peak
#               --gemm 8192, losses, device peak), ferry-gpt-attn against
#               torch's SDPA at T 2048, head dim 64 and 128
#   13b        [300] ferry-gpt llama-2-13b on cuda, tiers.gpu.budget 22G, params
#               and optimizer in host RAM (int8 states, bf16 master), batch 8 x
#               seq 2048, 4 steps; llama-1b streamed vs resident (losses bit
#               for bit); llama-2-7b fp32 states (fewer layers when RAM is
#               short): model TFLOPS, step vs its longest component (timeline,
#               nvidia-smi), device peak, RSS and step time vs ferry plan,
#               launch to first step
#   adam        [60] the CPU AdamW on this host (no GPU used): ferry bench adam,
#               16 threads, 2^28 params, bf16 grads, fp32 vs int8 states vs a
#               bf16 master + int8 states (step-time ratios; targets >= 1.5
#               and >= 2.2), each against its same-traffic roofline
#   peers      [540] ferry against DeepSpeed (bench/peers/run_peers.py): llama-1b,
#               batch 4 x seq 2048, 20 steps, in ZeRO-Offload, ZeRO-3 CPU offload
#               and ZeRO-Infinity placements, by ferry-gpt, ferry.torch and
#               DeepSpeed 0.19.8 (its wheels and libaio carried); llama-2-7b
#               where time and RAM are left; resumable (OUTDIR/peers.jsonl);
#               alone: GPUCHECK_SECONDS=590 --parts peers
#   tests_rest [400] the rest of the test list, as time allows
# The whole check ends within 8 minutes (GPUCHECK_SECONDS), the last parts
# cut short as time runs out; one issue's parts (e.g. --parts tests,scale)
# fit in it whole. It writes OUTDIR/results.json (default build/gpucheck/)
# after every part: each part's status (pass, fail, skip), command, wall
# seconds, time limit, figures and log (OUTDIR/logs/), then a summary of the
# targets, met, not met or not measured. Without a GPU (or with --dry-run)
# every GPU part is a skip with the reason, at once. --rehearse, without a
# GPU: each part runs the bundle's programs as it would there until the
# first that finds no GPU, then is a skip naming it (tools/README.md). A
# test that starts MPI is a skip saying so where there is no mpirun (the
# bundle carries libmpi.so.40, not OpenMPI's plugins). The logic is
# tools/gpucheck.py (`python3 tools/gpucheck.py parts` lists the parts); this
# sets the time limit around it. Exit 0 when no part failed, 1 otherwise, 2
# bad usage.
#
# Environment: GPUCHECK_BUNDLE (default gpucheck), GPUCHECK_SECONDS (the
# whole check's limit, default 470), FERRY_GPU_PYTHON (the python part's
# interpreter, and the scale part's: it must import transformers and
# safetensors too), GPUCHECK_RAM_AVAILABLE (bytes: the RAM the part peers
# chooses its runs by, default MemAvailable).
set -u
cd "$(dirname "$0")/.." || exit 1
dry=() parts=() out=
while [ $# -gt 0 ]; do
  case $1 in
  --dry-run) dry=(--dry-run) ;;
  --rehearse) dry=(--rehearse) ;;
  --parts)
    [ $# -ge 2 ] || { echo "gpu_check: --parts wants a list (gpucheck.py parts lists them)" >&2; exit 2; }
    parts=(--parts "$2")
    shift
    ;;
  --parts=*) parts=(--parts "${1#--parts=}") ;;
  -h | --help)
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
  -*) echo "gpu_check: unknown option $1 (try --help)" >&2; exit 2 ;;
  *) out=$1 ;;
  esac
  shift
done
if [ ${#parts[@]} -gt 0 ] && command -v python3 >/dev/null; then
  # refused at once, with the list, before anything is written or unpacked
  python3 tools/gpucheck.py parts "${parts[1]}" >/dev/null || exit 2
fi
OUTDIR=${out:-build/gpucheck}
BUNDLE=${GPUCHECK_BUNDLE:-gpucheck}
TOTAL=${GPUCHECK_SECONDS:-470}
mkdir -p "$OUTDIR" || exit 1
if ! command -v python3 >/dev/null; then
  # the check's logic needs python3: say so in the one file it promises
  printf '{"schema": 1, "status": "fail", "parts": {"preflight": {"status": "fail", "command": "", "wall_s": 0, "figures": {}, "reason": "python3 not found"}}}\n' \
    >"$OUTDIR/results.json"
  echo "gpu_check: python3 not found" >&2
  exit 1
fi
# The bundle travels packed (gpucheck.tar.xz: the carry limit is 64 MiB);
# python3's tarfile unpacks it, since the GPU machine may have no xz.
if [ ! -d "$BUNDLE" ] && [ -f "$BUNDLE.tar.xz" ]; then
  echo "gpu_check: unpacking $BUNDLE.tar.xz" >&2
  python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
if hasattr(tarfile, "fully_trusted_filter"):  # our own archive: as packed
    t.extractall(sys.argv[2], filter="fully_trusted")
else:
    t.extractall(sys.argv[2])' \
    "$BUNDLE.tar.xz" "$(dirname "$BUNDLE")" || exit 1
fi
# The parts' own limits end inside TOTAL - 15 s; timeout is the backstop.
timeout -k 10 "$TOTAL" python3 tools/gpucheck.py check --root . --bundle "$BUNDLE" \
  --out "$OUTDIR" --budget "$((TOTAL - 15))" "${dry[@]}" "${parts[@]}"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "gpu_check: stopped at the ${TOTAL} s limit; $OUTDIR/results.json holds the parts that ended" >&2
fi
exit $rc
