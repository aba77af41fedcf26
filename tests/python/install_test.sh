#!/bin/sh
# tests/python/install_test.sh — python.install: `pip install` of python/ into a
# fresh venv (system site packages, so torch is there; --no-index
# --no-build-isolation: no PyPI), then, with FERRY_LIB unset, the installed
# package finds libferry.so in build/lib/ of the source tree recorded at
# install time and ferry.torch imports. Skips (77) without venv, pip or
# setuptools. Args: PYTHON SOURCE_DIR LIBFERRY WORKDIR
PY=$1 SRC=$2 LIB=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK/tree/build/lib" || exit 1
if ! "$PY" -m venv --system-site-packages "$WORK/venv" >"$WORK/venv.log" 2>&1; then
  echo "skip: $PY -m venv failed (apt-get install python3-venv):"; tail -2 "$WORK/venv.log"; exit 77
fi
if ! "$WORK/venv/bin/python" -c "import setuptools" 2>/dev/null \
   || ! "$WORK/venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "skip: the venv has no pip or setuptools (apt-get install python3-pip python3-setuptools)"
  exit 77
fi
cp -r "$SRC/python" "$WORK/src" || exit 1
rm -rf "$WORK/src/build" "$WORK/src"/*.egg-info
ln -s "$LIB" "$WORK/tree/build/lib/libferry.so" || exit 1
FERRY_SOURCE_TREE="$WORK/tree" "$WORK/venv/bin/pip" install -q --no-index --no-build-isolation \
  "$WORK/src" || { echo "FAIL: pip install"; exit 1; }
cd "$WORK" || exit 1
env -u FERRY_LIB -u PYTHONPATH "$WORK/venv/bin/python" -c "
import ferry, ferry.torch, sys
where = ferry.__file__
lib = ferry.library_path()
print('installed at', where, 'library', lib, 'version', ferry.version())
if '/venv/' not in where: sys.exit('FAIL: not the installed package')
if lib != '$WORK/tree/build/lib/libferry.so': sys.exit('FAIL: library from ' + lib)
" || exit 1
echo ok
