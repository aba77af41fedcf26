#!/bin/sh
# tests/install/consumer_test.sh — the install test: `cmake --install` of a
# ferry build tree into a fresh prefix, then tests/install/consumer built
# against that copy three ways (CMake find_package, shared and static, by a
# consumer without the CUDA toolkit; `pkg-config ferry`; the static library
# with `pkg-config --static`) and run, with examples/minimal_loop.c built the
# same ways; neither asks for MPI; the installed ferry-gpt runs (--help).
# Inputs come from the environment (tests/install/CMakeLists.txt sets them).
# Exit 0 pass, 1 fail, 77 skip.
set -u

for v in FERRY_BUILD_DIR FERRY_CONSUMER_SRC FERRY_MINIMAL_LOOP FERRY_CMAKE FERRY_CC FERRY_LIBDIR FERRY_INCLUDEDIR \
  FERRY_VERSION; do
  eval "val=\${$v:-}"
  if [ -z "$val" ]; then
    echo "install.consumer: $v is not set (run this through ctest)" >&2
    exit 1
  fi
done
san=${FERRY_SAN_FLAGS:-}
config=${FERRY_CONFIG:-}
pkgconfig=${FERRY_PKG_CONFIG:-pkg-config}

work="$FERRY_BUILD_DIR/tests/install/work"
prefix="$work/prefix"
libdir="$prefix/$FERRY_LIBDIR"
rm -rf "$work" && mkdir -p "$work" || exit 1

fail() {
  echo "install.consumer: FAILED: $*" >&2
  echo "install.consumer: logs and files kept in $work" >&2
  exit 1
}
# run LOG CMD...: runs CMD with output to $work/LOG.log, shown on failure.
run() {
  log="$work/$1.log"
  shift
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$*"
  fi
}

cfg_args=""
[ -n "$config" ] && cfg_args="--config $config"

# 1. Install.
# shellcheck disable=SC2086
run install "$FERRY_CMAKE" --install "$FERRY_BUILD_DIR" --prefix "$prefix" $cfg_args
for f in "$FERRY_INCLUDEDIR/ferry.h" "$FERRY_LIBDIR/libferry.so" "$FERRY_LIBDIR/libferry.a" \
  "$FERRY_LIBDIR/pkgconfig/ferry.pc" "$FERRY_LIBDIR/cmake/ferry/ferryConfig.cmake" \
  "$FERRY_LIBDIR/cmake/ferry/ferryConfigVersion.cmake" "$FERRY_LIBDIR/cmake/ferry/ferryTargets.cmake"; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
echo "installed into $prefix"
if [ "${FERRY_GPT_BUILT:-0}" = 1 ]; then
  run gpt-help "$prefix/bin/ferry-gpt" --help
  grep -q "ferry-gpt train" "$work/gpt-help.log" || fail "installed ferry-gpt --help printed no usage"
fi
# the CUDA model's module, where ferry-gpt looks for it ($ORIGIN/../lib)
if [ "${FERRY_GPT_CUDA_BUILT:-0}" = 1 ] && [ ! -e "$libdir/libferry-gpt-cuda.so" ]; then
  fail "cmake --install did not install libferry-gpt-cuda.so into $libdir"
fi

# 2. find_package(ferry): a separate CMake project, same compiler and
# generator, that may only see the fresh prefix (no package registry). It
# runs once as a consumer without the CUDA toolkit (find_package(CUDAToolkit)
# disabled) and, for a CUDA build, once more with the toolkit.
cuda_ways="nocuda"
[ -n "${FERRY_CUDA_ROOT:-}" ] && cuda_ways="nocuda cuda"
for way in $cuda_ways; do
  set -- -S "$FERRY_CONSUMER_SRC" -B "$work/cmake-build-$way" -DCMAKE_C_COMPILER="$FERRY_CC" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DCMAKE_C_FLAGS="$san" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" -DFERRY_MINIMAL_LOOP="$FERRY_MINIMAL_LOOP"
  [ -n "${FERRY_GENERATOR:-}" ] && set -- "$@" -G "$FERRY_GENERATOR"
  [ -n "$config" ] && set -- "$@" -DCMAKE_BUILD_TYPE="$config"
  if [ "$way" = cuda ]; then
    set -- "$@" -DCUDAToolkit_ROOT="$FERRY_CUDA_ROOT"
  else
    set -- "$@" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
  fi
  run "cmake-configure-$way" "$FERRY_CMAKE" "$@"
  grep -q "ferry $FERRY_VERSION from $libdir/cmake/ferry" "$work/cmake-configure-$way.log" ||
    fail "find_package(ferry) did not find version $FERRY_VERSION in $libdir/cmake/ferry: \
$(grep 'ferry ' "$work/cmake-configure-$way.log")"
  # shellcheck disable=SC2086
  run "cmake-build-$way" "$FERRY_CMAKE" --build "$work/cmake-build-$way" $cfg_args
  for exe in consumer consumer_static minimal_loop minimal_loop_static; do
    bin=$(find "$work/cmake-build-$way" -type f -name "$exe" | head -n 1)
    [ -n "$bin" ] || fail "the find_package build ($way) made no $exe"
    LD_LIBRARY_PATH="$libdir" "$bin" >"$work/run.log" 2>&1 ||
      fail "$exe (find_package, $way) exited $?: $(cat "$work/run.log")"
  done
done

# 3. pkg-config ferry, shared: `cc main.c $(pkg-config --cflags --libs ferry)`.
command -v "$pkgconfig" >/dev/null 2>&1 || fail "no pkg-config ('$pkgconfig')"
PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
got=$("$pkgconfig" --modversion ferry) || fail "pkg-config does not find ferry in $libdir/pkgconfig"
[ "$got" = "$FERRY_VERSION" ] || fail "pkg-config says ferry $got, expected $FERRY_VERSION"
flags=$("$pkgconfig" --cflags --libs ferry) || fail "pkg-config --cflags --libs ferry"
# shellcheck disable=SC2086
run pc-shared "$FERRY_CC" $san -o "$work/consumer-pc" "$FERRY_CONSUMER_SRC/main.c" $flags
LD_LIBRARY_PATH="$libdir" "$work/consumer-pc" || fail "consumer (pkg-config, shared) exited $?"
# minimal_loop.c calls sinf: the .pc's Libs carry -lm, nothing is added by hand
# shellcheck disable=SC2086
run pc-loop "$FERRY_CC" $san -o "$work/loop-pc" "$FERRY_MINIMAL_LOOP" $flags
LD_LIBRARY_PATH="$libdir" "$work/loop-pc" >"$work/run.log" 2>&1 ||
  fail "minimal_loop (pkg-config, shared) exited $?: $(cat "$work/run.log")"

# 4. pkg-config --static: libferry.a with the Libs.private it declares; every
# library named there is one ferry itself was linked with (no -ludev from
# hwloc's static closure), so the link must succeed.
static=$("$pkgconfig" --static --libs ferry | sed 's/\(^\| \)-lferry\( \|$\)/ /') ||
  fail "pkg-config --static --libs ferry"
cflags=$("$pkgconfig" --cflags ferry)
# libmpi is opened at run time (comm/mpi_abi.c): the package asks a consumer for no MPI
case " $static $("$pkgconfig" --print-requires-private ferry | tr '\n' ' ')" in
*-lmpi* | *ompi*) fail "pkg-config --static asks for MPI: $static" ;;
esac
if grep -qs "ompi-c\|PkgConfig::MPI" "$libdir/cmake/ferry/"*.cmake; then
  fail "the CMake package asks for MPI: $(grep -l "ompi-c\|PkgConfig::MPI" "$libdir/cmake/ferry/"*.cmake)"
fi
for src in "$FERRY_CONSUMER_SRC/main.c" "$FERRY_MINIMAL_LOOP"; do
  # shellcheck disable=SC2086
  run pc-static "$FERRY_CC" $san $cflags -o "$work/pc-static" "$src" "$libdir/libferry.a" $static
  "$work/pc-static" >"$work/run.log" 2>&1 ||
    fail "$src (pkg-config --static) exited $?: $(cat "$work/run.log")"
done

rm -rf "$work"
echo "install.consumer: passed (find_package shared + static, pkg-config shared + static;" \
  "consumer and minimal_loop)"
exit 0
