#!/bin/sh
# tests/python/install_test.sh — python.install and python.install.full:
# `pip install ./python` of a copy of the source tree into a clean venv (no
# system site packages, no torch), which builds libferry.so with
# scikit-build-core and bundles it in the package; the copy is then deleted,
# and with FERRY_LIB and PYTHONPATH unset `import ferry` loads the library
# inside the venv and the plain API trains (test_engine_api.py). Then
# ferry.torch imports from the installed package under PYTHON (its torch).
# Needs PyPI (scikit-build-core): without it, or without venv, it skips (77).
# MODE full: the command as a user types it (CUDA follows the machine, pip's
# own build folder). MODE ci: CUDA off, ccache when found, a fixed build
# folder under WORKDIR (ccache's hits survive a new clone: CCACHE_BASEDIR).
# Args: PYTHON SOURCE_DIR WORKDIR MODE
PY=$1 SRC=$2 WORK=$3 MODE=$4
case "$MODE" in ci|full) ;; *) echo "usage: install_test.sh PYTHON SOURCE_DIR WORKDIR ci|full"; exit 2;; esac
rm -rf "$WORK" && mkdir -p "$WORK/tree" || exit 1
if ! "$PY" -m venv "$WORK/venv" >"$WORK/venv.log" 2>&1; then
  echo "skip: $PY -m venv failed (apt-get install python3-venv):"; tail -2 "$WORK/venv.log"; exit 77
fi
VPY=$WORK/venv/bin/python
if ! timeout 30 "$VPY" -m pip download -q --timeout 10 --retries 1 --no-deps -d "$WORK/dl" "scikit-build-core>=0.10" \
     >"$WORK/pypi.log" 2>&1; then
  echo "skip: PyPI not reachable (pip needs scikit-build-core to build the package):"
  tail -2 "$WORK/pypi.log"; exit 77
fi
tar -C "$SRC" --exclude=./.git --exclude='./build*' --exclude=./python/build \
  --exclude='*.egg-info' --exclude=__pycache__ --exclude=./gpucheck -cf - . |
  tar -C "$WORK/tree" -xf - || { echo "FAIL: copying the source tree"; exit 1; }
set --
if [ "$MODE" = ci ]; then
  set -- --config-settings=cmake.define.FERRY_CUDA=OFF --config-settings=build-dir="$WORK/build"
  if command -v ccache >/dev/null 2>&1; then
    set -- "$@" --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
    # hits from any folder: paths relative to WORK, and -g not hashing the folder
    export CCACHE_BASEDIR="$WORK" CCACHE_NOHASHDIR=1
  fi
fi
start=$(date +%s)
(cd "$WORK" && env -u FERRY_LIB -u PYTHONPATH "$VPY" -m pip install "$@" ./tree/python) \
  >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; echo "FAIL: pip install ./python"; exit 1; }
echo "pip install ./python ($MODE): $(( $(date +%s) - start )) s"
rm -rf "$WORK/tree" "$WORK/build"
cd "$WORK" || exit 1
env -u FERRY_LIB -u PYTHONPATH "$VPY" -c "
import os, sys, ferry
venv = os.path.realpath('$WORK/venv') + os.sep
where, lib = os.path.realpath(ferry.__file__), os.path.realpath(ferry.library_path())
print('installed at', where, 'library', lib, 'version', ferry.version())
if not where.startswith(venv): sys.exit('FAIL: not the installed package: ' + where)
if lib != os.path.join(os.path.dirname(where), 'libferry.so'):
    sys.exit('FAIL: library from ' + lib + ', not the one bundled in the package')
" || exit 1
env -u FERRY_LIB -u PYTHONPATH "$VPY" "$SRC/tests/python/test_engine_api.py" >"$WORK/api.log" 2>&1 ||
  { tail -20 "$WORK/api.log"; echo "FAIL: the plain API in the clean venv"; exit 1; }
tail -1 "$WORK/api.log"
# ferry.torch from the installed package, under the interpreter that has torch
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if "$PY" -c "import torch" 2>/dev/null; then
  env -u FERRY_LIB PYTHONPATH="$SITE" "$PY" -c "
import sys, ferry, ferry.torch
if not ferry.__file__.startswith('$SITE'): sys.exit('FAIL: ferry.torch from ' + ferry.__file__)
print('ferry.torch imports from', ferry.torch.__file__)
" || exit 1
else
  echo "note: $PY has no torch: ferry.torch not imported"
fi
echo ok
