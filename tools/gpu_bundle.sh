#!/usr/bin/env bash
# tools/gpu_bundle.sh — builds ferry Release with CUDA (build-gpu/) and
# gathers into gpucheck/ what tools/gpu_check.sh runs on a machine with a GPU
# but none of ferry's build dependencies: the programs (ferry, ferry-gpt,
# ferry-cuda-peak, minimal_loop, and ferry-gpt-attn where it is built; the
# part 13b needs no more: ferry plan, bench adam and bench compute, ferry-gpt,
# ferry-cuda-peak, and the repository's docs/ and examples/configs/) and
# ferry-gpt's CUDA model module
# (lib/libferry-gpt-cuda.so), every test program with a manifest of the
# test commands (gpucheck/tests.json, made from ctest by tools/gpucheck.py;
# the fixtures and configs come from the repository, copied there beside
# it), the Python binding and its tests (src/python/ferry, src/tests/python:
# the python tests run that copy, which matches the bundle's libferry.so;
# gpu_check.sh's python part runs them on cuda), the PyTorch peer of the
# scale part (src/bench/peers/torch_llama.py), and the shared libraries they
# load except the C library's family,
# libstdc++/libgcc_s and CUDA's own (the driver, cudart, cuBLAS...): the GPU
# machine has its CUDA toolkit, and gpu_check.sh finds those there
# (gpucheck/cuda_needs.txt names them). Then it checks, with ldd and
# LD_LIBRARY_PATH=gpucheck/lib:<this CUDA's lib folder>, that every library
# of every bundled file resolves (libcuda aside) to the bundle, CUDA or that
# base family. Last it packs gpucheck/ into gpucheck.tar.xz, what travels
# to the GPU machine (gpu_check.sh unpacks it there when gpucheck/ is
# missing), and checks that the archive is at most 60 MiB, and that it, the
# DeepSpeed peer's wheels (bench/peers/deepspeed/wheels, made by its
# prepare.sh; a note when missing: the part peers then has no DeepSpeed) and
# the tracked tree fit the device tool's 64 MiB carry. Exit 0, or 1 with
# the reason. Run from anywhere; it works in the repository root. ccache,
# where installed, compiles (C and CUDA).
#
# Environment: FERRY_JOBS (build jobs, default 2), GPU_BUNDLE_BUILD (build
# folder, default build-gpu), GPU_BUNDLE_CMAKE_ARGS (extra cmake arguments,
# e.g. -DCMAKE_CUDA_ARCHITECTURES=90), GPU_BUNDLE_NO_BUILD=1 (bundle what
# the build folder holds), GPU_BUNDLE_OUT (the bundle's folder, default
# gpucheck; the archive is it with .tar.xz), GPU_BUNDLE_PACK=0 (no archive,
# no carry check: the ctest tools.gpu_rehearsal bundles so).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${GPU_BUNDLE_BUILD:-build-gpu}
OUT=${GPU_BUNDLE_OUT:-gpucheck}
case $BUILD in /*) BUILD_ABS=$BUILD ;; *) BUILD_ABS=$ROOT/$BUILD ;; esac
case $OUT in /*) OUT_ABS=$OUT ;; *) OUT_ABS=$ROOT/$OUT ;; esac
LIMIT_MIB=60
JOBS=${FERRY_JOBS:-2}
CARRY_MIB=64 # the device tool's limit on what travels: tree, bundle and wheels
WHEELS=bench/peers/deepspeed/wheels
say() { printf 'gpu_bundle: %s\n' "$*"; }
die() {
  say "FAILED: $*" >&2
  exit 1
}

# The libraries a bundle leaves to the machine: the C library's family and
# the compiler's runtimes (every Linux has them, newer there is fine), and
# CUDA's (the GPU machine's toolkit and driver).
SYSTEM_RE='^(linux-vdso|linux-gate|ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libgcc_s|libstdc\+\+)\.so'
CUDA_RE='^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvrtc-builtins|nvJitLink|cufft|curand|cusparse|cusolver|cudnn|nvidia-ml|cupti)\.so'

build() {
  [ "${GPU_BUNDLE_NO_BUILD:-0}" = 1 ] && return 0
  command -v nvcc >/dev/null || die "nvcc not found: the bundle is a CUDA build"
  # Release at -O2: the optimisation level the -Werror build is kept clean at
  # (gcc's -O3 adds maybe-uninitialized warnings of its own).
  mkdir -p "$BUILD"
  local cc=()
  if command -v ccache >/dev/null; then
    cc=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG" \
    -DFERRY_CUDA=ON -DFERRY_WERROR=ON -DFERRY_TESTS=ON "${cc[@]}" ${GPU_BUNDLE_CMAKE_ARGS:-} \
    >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; die "configure failed"; }
  cmake --build "$BUILD" -j "$JOBS" || die "build failed"
}

# The CUDA lib folder of this toolkit (the one the bundle was linked with).
cuda_lib_dir() {
  local top
  top=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  for d in "$top/lib64" "$top/targets/x86_64-linux/lib" /usr/local/cuda/lib64; do
    [ -e "$d/libcudart.so" ] && { echo "$d"; return 0; }
  done
  echo "$top/lib64"
}

elves() { # every ELF file under the bundle's bin/, tests/ and lib/
  find "$OUT/bin" "$OUT/tests" "$OUT/lib" -type f 2>/dev/null | while read -r f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"
  done
}

gather_programs() {
  rm -rf "$OUT"
  mkdir -p "$OUT/bin" "$OUT/lib"
  for p in ferry ferry-gpt ferry-cuda-peak minimal_loop ferry-gpt-attn; do
    if [ -x "$BUILD/bin/$p" ]; then
      cp "$BUILD/bin/$p" "$OUT/bin/"
    elif [ "$p" = ferry-gpt-attn ]; then
      say "note: $BUILD/bin/ferry-gpt-attn was not built: the scale part skips ferry's attention" >&2
    elif [ "$p" != minimal_loop ]; then
      die "$BUILD/bin/$p was not built"
    fi
  done
  # ferry-gpt's CUDA model: a module it dlopen()s from $ORIGIN/../lib (here
  # gpucheck/lib) for --device cuda; ldd of the program does not name it
  [ -f "$BUILD/lib/libferry-gpt-cuda.so" ] || die "$BUILD/lib/libferry-gpt-cuda.so was not built"
  cp "$BUILD/lib/libferry-gpt-cuda.so" "$OUT/lib/"
  # libmpi: libferry dlopen()s it at the first MPI or NCCL communicator
  # (comm/mpi_abi.c), so ldd names it nowhere; it travels with its libraries
  local mpi
  mpi=$({ /sbin/ldconfig -p 2>/dev/null || true; } |
    awk '$1 == "libmpi.so.40" && /x86-64/ && m == "" { m = $NF } END { print m }')
  if [ -n "$mpi" ]; then
    cp -L "$mpi" "$OUT/lib/libmpi.so.40"
  else
    say "note: no libmpi.so.40 here: the bundle's MPI and NCCL communicators will not load" >&2
  fi
  ctest --test-dir "$BUILD" --show-only=json-v1 >"$BUILD/ctest.json" || die "ctest --show-only failed"
  python3 tools/gpucheck.py manifest "$BUILD/ctest.json" "$ROOT" "$BUILD_ABS" "$OUT" ||
    die "the test manifest could not be made"
  [ -f "$OUT/src/bench/peers/torch_llama.py" ] || die "the bundle lacks src/bench/peers/torch_llama.py"
  grep -q '@BUNDLE@/src/tests/python/' "$OUT/tests.json" ||
    say "warning: no python test in the manifest (the build found no python3 with torch): gpu_check.sh's python part will skip" >&2
  if command -v strip >/dev/null; then
    elves | while read -r f; do strip --strip-unneeded "$f" 2>/dev/null || true; done
  fi
}

# Copies every library ldd resolves for the bundled files, except the
# system's and CUDA's, into lib/; CUDA's sonames go to cuda_needs.txt.
gather_libraries() {
  local name path
  : >"$OUT/cuda_needs.txt.tmp"
  elves | while read -r f; do ldd "$f" 2>/dev/null || true; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
    while read -r name path; do
      if [[ $name =~ $SYSTEM_RE ]]; then
        continue
      elif [[ $name =~ $CUDA_RE ]]; then
        echo "$name" >>"$OUT/cuda_needs.txt.tmp"
      elif [ ! -e "$OUT/lib/$name" ]; then
        cp -L "$path" "$OUT/lib/$name"
      fi
    done
  sort -u "$OUT/cuda_needs.txt.tmp" >"$OUT/cuda_needs.txt"
  rm -f "$OUT/cuda_needs.txt.tmp"
}

# ldd with the bundle's path: nothing unresolved but libcuda, and nothing
# resolved outside the bundle, this CUDA or the system's base family.
check_ldd() {
  local cuda=$1 bad=0 n=0 f name path
  while read -r f; do
    n=$((n + 1))
    while read -r name path; do
      case $path in
      "not found") [[ $name == libcuda.so* ]] && continue ;;
      "$OUT_ABS/lib/"* | "$cuda/"*) continue ;;
      *) [[ $name =~ $SYSTEM_RE ]] && continue ;;
      esac
      say "ldd: $f: $name => $path" >&2
      bad=$((bad + 1))
    done < <(LD_LIBRARY_PATH="$OUT_ABS/lib:$cuda" ldd "$f" 2>&1 |
      awk '$2 == "=>" { p = $3; if ($3 == "not") p = "not found"; print $1, p }')
  done < <(elves)
  [ "$bad" -eq 0 ] || die "ldd: $bad libraries unresolved or outside the bundle (above)"
  say "ldd: all $n bundled files resolve every library (libcuda aside) to gpucheck/lib, $cuda or the C library's family"
}

describe() {
  local cuda=$1 mib=$2
  {
    echo "ferry GPU check bundle (tools/gpu_bundle.sh; run tools/gpu_check.sh from the repository root)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), Release (-O2), FERRY_CUDA=ON, FERRY_WERROR=ON"
    echo "nvcc: $(nvcc --version | tail -2 | head -1)"
    echo "CUDA libraries expected there (cuda_needs.txt): $(tr '\n' ' ' <"$OUT/cuda_needs.txt")"
    echo "linked here against: $cuda"
    echo "size: $mib MiB"
  } >"$OUT/BUNDLE.txt"
}

build
gather_programs
gather_libraries
CUDA_LIB=$(cuda_lib_dir)
check_ldd "$CUDA_LIB"
bytes=$(du -sb "$OUT" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
describe "$CUDA_LIB" "$mib"
say "gpucheck/: $mib MiB ($bytes bytes) in $(find "$OUT" -type f | wc -l) files; lib/:"
(cd "$OUT/lib" && du -b -- * | sort -rn | awk '{ printf "  %-28s %6.1f MiB\n", $2, $1 / 1048576 }')
# What travels is the archive (the test programs each hold the CUDA
# kernels' fat binaries, OpenBLAS holds every CPU's kernels: both pack well).
if [ "${GPU_BUNDLE_PACK:-1}" = 0 ]; then
  say "ok: $OUT (GPU_BUNDLE_PACK=0: not packed)"
  exit 0
fi
rm -f "$OUT.tar.xz"
XZ_OPT="-6 -T$JOBS" tar -C "$(dirname "$OUT_ABS")" -cJf "$OUT.tar.xz" "$(basename "$OUT_ABS")" ||
  die "cannot write $OUT.tar.xz"
packed=$(stat -c %s "$OUT.tar.xz")
pmib=$(awk -v b="$packed" 'BEGIN { printf "%.1f", b / 1048576 }')
say "$OUT.tar.xz: $pmib MiB ($packed bytes)"
awk -v b="$packed" -v l="$LIMIT_MIB" 'BEGIN { exit !(b <= l * 1048576) }' ||
  die "$OUT.tar.xz is $pmib MiB, over the $LIMIT_MIB MiB limit"
# what one device call carries: the tracked tree, the archive and the wheels
tree=$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c)
wheels=0
if [ -d "$WHEELS" ]; then
  wheels=$(find "$WHEELS" -type f -exec cat {} + | wc -c)
else
  say "note: no $WHEELS (bench/peers/deepspeed/prepare.sh makes it): the part peers will run no DeepSpeed" >&2
fi
total=$((tree + packed + wheels))
say "carry: tree $(awk -v b="$tree" 'BEGIN { printf "%.1f", b / 1048576 }') MiB + $OUT.tar.xz $pmib MiB + $WHEELS $(awk -v b="$wheels" 'BEGIN { printf "%.1f", b / 1048576 }') MiB = $(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of $CARRY_MIB"
[ "$total" -le $((CARRY_MIB * 1048576)) ] || die "tree, $OUT.tar.xz and $WHEELS are over the $CARRY_MIB MiB carry"
say "ok: carry $OUT.tar.xz (or $OUT/) to the GPU machine and run tools/gpu_check.sh from the repository root"
