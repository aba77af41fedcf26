#!/bin/bash
# tests/tools/demo_test.sh — the demo's structure, cheaply: `./ferry.sh demo
# --dry-run` says up front what each phase does and how long it takes, then
# shows each phase's commands (ferry-gpt alone built, CUDA off, in its own
# folder; the training and the sample) and runs nothing; tools/progress.sh's
# build filter turns make's and ninja's lines into a line per 10% with the
# elapsed time and an ETA, says it is still compiling when a file takes
# long, and lets compiler messages through; ferry-gpt's step lines end with
# the elapsed time and an ETA, and its sample with a tokens/s line of its
# own (after the text, in one log too). $1 = the repository root,
# $2 = ferry-gpt, $3 = a scratch folder. Exit 0 pass, 1 fail.
set -u
root=$1
gpt=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "tools.demo: FAILED: $*" >&2
  exit 1
}
has() { # has REGEX TEXT WHAT
  printf '%s\n' "$2" | grep -Eq -- "$1" || { printf '%s\n' "$2"; fail "$3: no line matching '$1'"; }
}

# 1. the plan, and the commands, without running them
out=$(bash "$root/ferry.sh" demo --dry-run 2>&1) || { echo "$out"; fail "demo --dry-run failed"; }
has '1\. set-up: .* ~[0-9]+ s$' "$out" "the plan's set-up"
has '2\. build: .* ~[0-9]+ s$' "$out" "the plan's build"
has '3\. train: .*150 steps' "$out" "the plan's training"
has ' ~[0-9]+ s$' "$out" "the plan's training time"
has '4\. sample: .* ~[0-9]+ s$' "$out" "the plan's sample"
has 'in all about [0-9]+:[0-9]{2}' "$out" "the plan's total"
has '^  \+ configure build-demo( -G Ninja)? -DFERRY_CUDA=OFF -DFERRY_TESTS=OFF -DFERRY_WERROR=OFF$' "$out" "the demo's own configure"
has '^  \+ cmake --build build-demo .*--target ferry-gpt \| build_progress$' "$out" "the build of ferry-gpt alone"
has '^  \+ \./build-demo/bin/ferry-gpt train --model small .*--steps 150 .*--seed 1 ' "$out" "the training"
has '^  \+ \./build-demo/bin/ferry-gpt sample .*--tokens 160 ' "$out" "the sample"
for p in set-up build training sampling; do
  has "demo: $p: " "$out" "phase $p's start"
  has "demo: $p took [0-9]+:[0-9]{2}$" "$out" "phase $p's time"
done
out=$(FERRY_DEMO_STEPS=20 bash "$root/ferry.sh" demo --dry-run 2>&1) || fail "FERRY_DEMO_STEPS=20 demo --dry-run"
has '3\. train: .*20 steps' "$out" "FERRY_DEMO_STEPS in the plan"
has 'train .*--steps 20 ' "$out" "FERRY_DEMO_STEPS in the command"
bash "$root/ferry.sh" demo --bogus >/dev/null 2>&1 && fail "demo --bogus was accepted"

# 2. the build filter on canned make and ninja output
# shellcheck source=../../tools/progress.sh
. "$root/tools/progress.sh"
make_lines() {
  echo "Scanning dependencies of target ferry_core"
  for i in $(seq 0 4 100); do echo "[$(printf '%3d' "$i")%] Building C object core/f$i.c.o"; done
  echo "core/f7.c:3:1: warning: something odd"
  echo "[100%] Built target ferry-gpt"
}
out=$(make_lines | build_progress "demo: build")
has '^core/f7\.c:3:1: warning: something odd$' "$out" "a compiler message passed through"
printf '%s\n' "$out" | grep -q 'Building\|Scanning' && { echo "$out"; fail "per-file lines passed through"; }
n=$(printf '%s\n' "$out" | grep -Ec '^demo: build +[0-9]+% done, [0-9]+:[0-9]{2} elapsed, eta [0-9]+:[0-9]{2}$')
[ "$n" -eq 10 ] || { echo "$out"; fail "make: $n progress lines, not one per 10% (10)"; }
has '^demo: build 100% done, ' "$out" "make: the last line"
out=$(for i in $(seq 1 50); do echo "[$i/50] Building C object x$i.c.o"; done | build_progress b 25)
n=$(printf '%s\n' "$out" | grep -Ec '^b +[0-9]+% done, ')
[ "$n" -eq 4 ] || { echo "$out"; fail "ninja: $n progress lines, not one per 25% (4)"; }
(set -o pipefail; false | build_progress b) && fail "a failed build's status was lost"
# a long file: a line every QUIET seconds, and a line cut by the wait kept whole
out=$({ echo "[ 30%] Building a"; sleep 2.5; printf 'cc: warn'; sleep 1.5; echo "ing"; } | build_progress c 10 1)
has '^c  30% done, [0-9]+:[0-9]{2} elapsed, still compiling$' "$out" "the line while a file compiles"
has '^cc: warning$' "$out" "a line cut by the wait"

# 3. ferry-gpt's progress: the step lines' elapsed time and ETA, the sample's tokens/s
out=$("$gpt" train --model tiny --data "$root/README.md" --steps 3 --batch 2 --seq 32 \
  --save "$dir/tiny" 2>&1) || { echo "$out"; fail "ferry-gpt train"; }
n=$(printf '%s\n' "$out" | grep -Ec '^step +[1-3]/3 .*  elapsed [0-9]+:[0-9]{2}  eta [0-9]+:[0-9]{2}$')
[ "$n" -eq 3 ] || { echo "$out"; fail "$n step lines with the elapsed time and an ETA, not 3"; }
has '^step +3/3 .*  eta 0:00$' "$out" "the last step's ETA"
out=$("$gpt" sample --model tiny --weights "$dir/tiny" --prompt "ferry " --tokens 20 --seed 1 2>&1) ||
  { echo "$out"; fail "ferry-gpt sample"; }
has '^sampled 20/20 tokens, [0-9.]+ s, [0-9.]+ tokens/s$' "$out" "the sample's tokens/s line"
echo "tools.demo: ok"
