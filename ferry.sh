#!/usr/bin/env bash
# ferry.sh — set-up, build, demo and tests in one place.
#
#   ./ferry.sh demo                 install missing packages, build ferry-gpt alone
#                                   (build-demo/, no CUDA), run the demo: about
#                                   2 minutes on 2 cores; --dry-run shows its plan
#   ./ferry.sh test                 install missing packages, build, run every test
#                                   but the long ones (label slow); then name the
#                                   ten slowest tests of the run
#   ./ferry.sh test --slow          the same, running only the long tests (label slow:
#                                   the full-size versions of CI-sized tests)
#   ./ferry.sh test --sanitize address|thread
#                                   the tests but the long ones in build-asan/ or build-tsan/
#   ./ferry.sh build                build only (build/)
#   ./ferry.sh deps                 install (as root) or name the missing packages
#
# Environment: FERRY_JOBS (parallel build/test jobs, default: nproc),
# FERRY_CMAKE_ARGS (extra cmake arguments).
set -euo pipefail
cd "$(dirname "$0")"

# Debian 12 packages ferry needs to build and test.
PACKAGES=(gcc g++ make cmake pkg-config liburing-dev libhwloc-dev libconfig-dev libisal-dev
          libopenblas-dev python3 time openmpi-bin libopenmpi-dev python3-torch python3-venv)
JOBS=${FERRY_JOBS:-$(nproc 2>/dev/null || echo 2)}

say() { printf 'ferry.sh: %s\n' "$*"; }
# shellcheck source=tools/progress.sh
. tools/progress.sh

deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ]; then
    say "installing missing packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "missing packages: ${missing[*]}"
    say "run as root, or install them with:"
    echo "  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
}

# configure DIR [cmake args...]
configure() {
  local dir=$1
  shift
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  cmake -S . -B "$dir" -DFERRY_WERROR=ON "$@" ${FERRY_CMAKE_ARGS:-} >"$dir/configure.log" 2>&1 || {
    cat "$dir/configure.log"
    say "configure failed (log above, also in $dir/configure.log)"
    exit 1
  }
  grep -E '^-- ferry:' "$dir/configure.log" || true
}

# configure_build DIR [cmake args...]: configure, then build everything
configure_build() {
  configure "$@"
  cmake --build "$1" -j "$JOBS"
}

# run_tests DIR [ctest args...]: the tests but the long ones (label slow)
# unless the arguments pick others; then the ten slowest tests of the run.
run_tests() {
  local dir=$1 rc=0
  shift
  [ $# -gt 0 ] || set -- -LE slow
  ctest --test-dir "$dir" -j "$JOBS" --output-on-failure --timeout 120 "$@" || rc=$?
  slowest "$dir"
  return $rc
}

# The ten slowest tests of the last ctest run in DIR (its LastTest.log).
slowest() {
  local log=$1/Testing/Temporary/LastTest.log
  [ -r "$log" ] || return 0
  say "the ten slowest tests of this run:"
  awk '/^Test time = /{t=$4} /^"[^"]+" end time:/{split($0, q, "\""); printf "%9.2f s  %s\n", t, q[2]}' \
    "$log" | sort -rn | awk 'NR <= 10' # reads all: no SIGPIPE into pipefail
}

# The demo: fine-tune the `small` GPT (10.8M params, 195 MB of model states)
# on a text every Debian machine has, with the AdamW state on NVMe (a swap
# file under build/), a device budget of 32M and a host budget of 128M, so
# the optimizer state streams from the disk every step; then sample from it.
# It builds ferry-gpt alone, without CUDA (the demo runs on the CPU), in its
# own folder build-demo/, so a fresh clone's demo takes about 2 minutes on a
# quiet 2-core machine; `./ferry.sh test` builds everything in build/.
# Every phase says what it does and shows its progress with the elapsed time
# and an ETA: the build a line per 10%, the training its step lines, the
# sample its text as it comes and then its tokens/s.
DEMO_BUILD=build-demo
DEMO_TOKENS=160

# demo_phase NAME [WHAT]: the time the phase before took, then this one's
# start ("demo: NAME: WHAT"); no NAME: only the time.
demo_phase() {
  [ -z "$phase" ] || say "demo: $phase took $(progress_clock $((SECONDS - phase_t0)))"
  phase=$1 phase_t0=$SECONDS
  [ -z "$phase" ] || say "demo: $phase: $2"
}

# demo_run CMD...: runs it, or only shows it under --dry-run.
demo_run() {
  if [ -n "$dry" ]; then
    printf '  +'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

demo() {
  local dry="" data=/usr/share/common-licenses/GPL-3 steps=${FERRY_DEMO_STEPS:-150}
  local phase="" phase_t0=0 t_train t_build=35 built="" gen
  case "${1:-}" in
    "") ;;
    --dry-run) dry=1 ;;
    *) say "unknown demo option '$1' (--dry-run)"; exit 2 ;;
  esac
  [ -r "$data" ] || data=LICENSE
  [ -x "$DEMO_BUILD/bin/ferry-gpt" ] && built=" (built before: only what changed)" t_build=3
  # quiet 2-core machine: ~0.45 s a step with the NVMe optimizer state
  t_train=$(( (steps * 45 + 99) / 100 ))
  say "demo: what it does, and how long each part takes on a quiet 2-core machine"
  say "      (longer where other work shares the CPUs):"
  say "  1. set-up: check the Debian packages, configure $DEMO_BUILD/ (CUDA off)   ~5 s"
  say "  2. build: libferry and ferry-gpt alone, in $DEMO_BUILD/$built   ~$t_build s"
  say "  3. train: the 'small' GPT (10.8M params) on $data, $steps steps,"
  say "     the AdamW state on NVMe (build/nvme-swap), a timeline   ~$t_train s"
  say "  4. sample: $DEMO_TOKENS tokens from the trained model   ~3 s"
  say "  in all about $(progress_clock $((10 + t_build + t_train))) (m:ss); FERRY_DEMO_STEPS=N changes the steps"
  SECONDS=0
  demo_phase set-up "the packages, then configure $DEMO_BUILD/"
  if [ -n "$dry" ]; then
    printf '  + deps\n'
  else
    deps
  fi
  # ninja where there is one: a quarter less CPU than make for this build; a
  # folder configured before keeps its generator
  gen=()
  [ -e "$DEMO_BUILD/CMakeCache.txt" ] || ! command -v ninja >/dev/null || gen=(-G Ninja)
  # warnings stay warnings here: a newer compiler's new one must not stop a demo
  demo_run configure "$DEMO_BUILD" "${gen[@]}" -DFERRY_CUDA=OFF -DFERRY_TESTS=OFF -DFERRY_WERROR=OFF
  demo_phase build "libferry and ferry-gpt in $DEMO_BUILD/ (a line per 10%)"
  if [ -n "$dry" ]; then
    printf '  + %s\n' "cmake --build $DEMO_BUILD -j $JOBS --target ferry-gpt | build_progress"
  else
    cmake --build "$DEMO_BUILD" -j "$JOBS" --target ferry-gpt 2>&1 | build_progress "ferry.sh: demo: build" || {
      say "demo: the build failed (the compiler's messages are above)"
      exit 1
    }
  fi
  demo_phase training "the 'small' GPT on $data, $steps steps; optimizer state on NVMe"
  say "      (examples/configs/offload-nvme.cfg: gpu budget 32M < 195 MB of model states;"
  say "       --set tiers.host.budget=128M, so the AdamW state cannot stay in host memory)"
  [ -n "$dry" ] || mkdir -p build
  demo_run "./$DEMO_BUILD/bin/ferry-gpt" train --model small --data "$data" \
    --engine examples/configs/offload-nvme.cfg --set tiers.host.budget=128M \
    --steps "$steps" --batch 4 --seq 128 --lr 2e-3 --seed 1 \
    --timeline build/demo-timeline.json --save build/demo-model
  demo_phase sampling "$DEMO_TOKENS tokens from the trained model (build/demo-model)"
  demo_run "./$DEMO_BUILD/bin/ferry-gpt" sample --model build/demo-model/config.json \
    --weights build/demo-model --prompt "This License " --tokens "$DEMO_TOKENS" --seed 1
  demo_phase ""
  say "demo: the timeline is build/demo-timeline.json (open it in chrome://tracing or"
  say "      https://ui.perfetto.dev); the weights are build/demo-model/model.safetensors"
  say "demo done in $(progress_clock $SECONDS)"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  deps) deps ;;
  build)
    deps
    configure_build build
    ;;
  demo) demo "$@" ;;
  test)
    san="" sel=()
    if [ "${1:-}" = "--sanitize" ]; then
      san=${2:?"--sanitize needs address or thread"}
    elif [ "${1:-}" = "--slow" ]; then
      sel=(-L slow)
    elif [ -n "${1:-}" ]; then
      say "unknown test option '$1' (--slow, --sanitize address|thread)"
      exit 2
    fi
    deps
    case "$san" in
      "") configure_build build; run_tests build "${sel[@]}" ;;
      address)
        # CUDA is left out of sanitizer builds: the CUDA runtime is not
        # instrumented and its tests skip without a GPU anyway.
        configure_build build-asan -DFERRY_SANITIZE=address -DFERRY_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 run_tests build-asan
        ;;
      thread)
        configure_build build-tsan -DFERRY_SANITIZE=thread -DFERRY_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
        TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_tests build-tsan
        ;;
      *) say "unknown sanitizer '$san' (address or thread)"; exit 2 ;;
    esac
    ;;
  help|-h|--help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  *)
    say "unknown command '$cmd'"
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
