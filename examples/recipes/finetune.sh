#!/bin/sh
# examples/recipes/finetune.sh — the C recipe: fine-tunes a Hugging Face
# model folder (GPT-2 or Llama: config.json, model.safetensors or its index,
# tokenizer.json) on a text file with ferry-gpt, saves a folder transformers
# loads as is, and samples from it. Each command is printed before it runs.
#
#   examples/recipes/finetune.sh MODEL_DIR TEXT_FILE OUT_DIR [train options]
#
# The train options (ferry-gpt train --help) come after the defaults below
# and win over them: --steps 30 --batch 4 --seq 128 --lr 1e-4 --seed 1.
# Environment: FERRY_GPT, the ferry-gpt to run (default: build/bin/ferry-gpt
# of this checkout when built, else ferry-gpt on PATH); PROMPT (default
# "The") and TOKENS (default 64) for the sample.
set -eu
if [ $# -lt 3 ]; then
  echo "usage: $0 MODEL_DIR TEXT_FILE OUT_DIR [ferry-gpt train options]" >&2
  exit 2
fi
model=$1 data=$2 out=$3
shift 3
root=$(cd "$(dirname "$0")/../.." && pwd)
gpt=${FERRY_GPT:-}
if [ -z "$gpt" ]; then
  if [ -x "$root/build/bin/ferry-gpt" ]; then
    gpt=$root/build/bin/ferry-gpt
  else
    gpt=ferry-gpt
  fi
fi
for f in config.json tokenizer.json; do
  if [ ! -f "$model/$f" ]; then
    echo "$0: $model has no $f (a Hugging Face model folder is needed; see examples/recipes/README.md)" >&2
    exit 1
  fi
done
if [ ! -f "$model/model.safetensors" ] && [ ! -f "$model/model.safetensors.index.json" ]; then
  echo "$0: $model has no model.safetensors (or model.safetensors.index.json): ferry-gpt reads safetensors, not pytorch_model.bin" >&2
  exit 1
fi
if [ ! -f "$data" ]; then
  echo "$0: $data: no such file (any text file will do, e.g. docs/FERRY-GPT.md)" >&2
  exit 1
fi

run() {
  echo "+ $*"
  "$@"
}
run "$gpt" train --model "$model" --data "$data" --save "$out" \
  --steps 30 --batch 4 --seq 128 --lr 1e-4 --seed 1 "$@"
run "$gpt" sample --model "$out" --prompt "${PROMPT:-The}" --tokens "${TOKENS:-64}" \
  --temperature 0.8 --top-k 40
