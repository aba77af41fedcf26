#!/bin/sh
# bench/peers/deepspeed/prepare.sh — assembles, here (with PyPI), the wheels
# the DeepSpeed peer needs on the GPU machine (no network there): DeepSpeed
# built with its ops off (CPU Adam and AIO are built just in time there),
# the Python 3.12 x86-64 wheels of the requirements that machine lacks, and
# libaio (Debian's libaio1 and libaio-dev, fetched with apt-get download:
# the library and its header, which DeepSpeed's AIO op, ZeRO-Infinity's
# NVMe path, compiles and links against) in wheels/libaio/{lib,include}.
# Writes bench/peers/deepspeed/wheels/ (git-ignored; the device tool's carry
# takes it) and checks the set fits the carry limit beside the GPU bundle.
#   prepare.sh [--force]      (DS_VERSION=0.19.8, PYTHON=python3 to change)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=$here/wheels
ver=${DS_VERSION:-0.19.8}
py=${PYTHON:-python3}
limit=$((64 * 1024 * 1024))
bundle_est=$((11 * 1024 * 1024)) # gpucheck.tar.xz when not built yet

if [ "${1:-}" = "--force" ]; then rm -rf "$out"; fi
if ls "$out"/deepspeed-"$ver"-*.whl >/dev/null 2>&1; then
  echo "prepare: $out already holds deepspeed $ver (--force rebuilds)"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$out"
  # a throwaway venv: nothing is installed system-wide
  "$py" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  # DeepSpeed: a source distribution; its ops off, it is pure Python
  DS_BUILD_OPS=0 "$tmp/venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation \
    -w "$tmp/ds" "deepspeed==$ver"
  cp "$tmp"/ds/deepspeed-*.whl "$out"/
  # its requirements the GPU image lacks (hjson, pydantic and pydantic's),
  # resolved for CPython 3.12 on x86-64, binary wheels only
  "$tmp/venv/bin/python" -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$tmp/deps" hjson 'pydantic>=2.0.0'
  cp "$tmp"/deps/*.whl "$out"/
fi

# libaio: the .debs' shared library (real files, no links: a carry may drop
# links) and header; run_ds.py points the AIO op's build and load at them
aio=$out/libaio
if [ -f "$aio/include/libaio.h" ] && [ -f "$aio/lib/libaio.so.1" ]; then
  echo "prepare: $aio already holds libaio"
else
  tmpa=$(mktemp -d)
  (cd "$tmpa" && apt-get download libaio1 libaio-dev >/dev/null 2>&1) ||
    { echo "prepare: apt-get download libaio1 libaio-dev failed (apt-get update first?)" >&2
      rm -rf "$tmpa"; exit 1; }
  for d in "$tmpa"/*.deb; do dpkg-deb -x "$d" "$tmpa/root"; done
  so=$(ls "$tmpa"/root/usr/lib/x86_64-linux-gnu/libaio.so.1.* | head -n1)
  mkdir -p "$aio/lib" "$aio/include"
  cp "$so" "$aio/lib/libaio.so.1"
  cp "$so" "$aio/lib/libaio.so"
  cp "$tmpa/root/usr/include/libaio.h" "$aio/include/"
  ls "$tmpa"/*.deb | sed 's|.*/||' >"$aio/SOURCE.txt"
  rm -rf "$tmpa"
fi

echo "prepare: wheels in $out:"
ls -l "$out" "$aio/lib" "$aio/include"
# one version of each package, or pip refuses the install there
dups=$(ls "$out" | grep '\.whl$' | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then echo "prepare: more than one version of: $dups" >&2; exit 1; fi
wheels=$(find "$out" -type f -exec cat {} + | wc -c)
if [ -f "$root/gpucheck.tar.xz" ]; then
  bundle=$(wc -c <"$root/gpucheck.tar.xz"); what="gpucheck.tar.xz"
else
  bundle=$bundle_est; what="gpucheck.tar.xz (not built; about 11 MiB assumed)"
fi
total=$((wheels + bundle))
printf 'prepare: wheels and libaio %.2f MiB + %s %.2f MiB = %.2f MiB of the 64 MiB carry limit\n' \
  "$(echo "$wheels / 1048576" | bc -l)" "$what" "$(echo "$bundle / 1048576" | bc -l)" \
  "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -gt "$limit" ]; then echo "prepare: over the carry limit" >&2; exit 1; fi
