#!/bin/sh
# tests/install/consumer_test.sh — the install test: `cmake --install` of a
# ferry build tree into a fresh prefix, then tests/install/consumer built
# against that copy three ways (CMake find_package, shared and static;
# `pkg-config ferry`; the static library with `pkg-config --static`) and run.
# Inputs come from the environment (tests/install/CMakeLists.txt sets them).
# Exit 0 pass, 1 fail, 77 skip.
set -u

for v in FERRY_BUILD_DIR FERRY_CONSUMER_SRC FERRY_CMAKE FERRY_CC FERRY_LIBDIR FERRY_INCLUDEDIR \
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

# 2. find_package(ferry): a separate CMake project, same compiler and
# generator, that may only see the fresh prefix (no package registry).
set -- -S "$FERRY_CONSUMER_SRC" -B "$work/cmake-build" -DCMAKE_C_COMPILER="$FERRY_CC" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DCMAKE_C_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san"
[ -n "${FERRY_GENERATOR:-}" ] && set -- "$@" -G "$FERRY_GENERATOR"
[ -n "$config" ] && set -- "$@" -DCMAKE_BUILD_TYPE="$config"
[ -n "${FERRY_CUDA_ROOT:-}" ] && set -- "$@" -DCUDAToolkit_ROOT="$FERRY_CUDA_ROOT"
run cmake-configure "$FERRY_CMAKE" "$@"
grep -q "ferry $FERRY_VERSION from $libdir/cmake/ferry" "$work/cmake-configure.log" ||
  fail "find_package(ferry) did not find version $FERRY_VERSION in $libdir/cmake/ferry: \
$(grep 'ferry ' "$work/cmake-configure.log")"
# shellcheck disable=SC2086
run cmake-build "$FERRY_CMAKE" --build "$work/cmake-build" $cfg_args
for exe in consumer consumer_static; do
  bin=$(find "$work/cmake-build" -type f -name "$exe" | head -n 1)
  [ -n "$bin" ] || fail "the find_package build made no $exe"
  LD_LIBRARY_PATH="$libdir" "$bin" || fail "$exe (find_package ferry::${exe#consumer}) exited $?"
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

# 4. pkg-config --static: libferry.a with the Libs.private it declares. The
# static closure of the dependencies (hwloc wants libudev.a's -ludev, ...)
# is often not installed; then this variant is noted and left out.
static=$("$pkgconfig" --static --libs ferry | sed 's/\(^\| \)-lferry\( \|$\)/ /') ||
  fail "pkg-config --static --libs ferry"
cflags=$("$pkgconfig" --cflags ferry)
variants="find_package shared + static, pkg-config shared"
# shellcheck disable=SC2086
if "$FERRY_CC" $san $cflags -o "$work/consumer-pc-static" "$FERRY_CONSUMER_SRC/main.c" \
  "$libdir/libferry.a" $static >"$work/pc-static.log" 2>&1; then
  "$work/consumer-pc-static" || fail "consumer (pkg-config --static) exited $?"
  variants="$variants + static"
elif missing=$(grep -o "cannot find -l[^ :]*" "$work/pc-static.log" | grep -v -e "-lferry$"); then
  echo "note: pkg-config --static left out, dependency libraries missing here: $missing"
else
  cat "$work/pc-static.log" >&2
  fail "static link with pkg-config --static --libs ferry"
fi

rm -rf "$work"
echo "install.consumer: passed ($variants)"
exit 0
