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
# folder under WORKDIR (ccache's hits survive a new clone: CCACHE_BASEDIR),
# scikit-build-core installed beside the venv from the wheels downloaded
# once, and the build without isolation (it looks nothing up on PyPI again).
# Args: PYTHON SOURCE_DIR WORKDIR MODE
PY=$1 SRC=$2 WORK=$3 MODE=$4
case "$MODE" in ci|full) ;; *) echo "usage: install_test.sh PYTHON SOURCE_DIR WORKDIR ci|full"; exit 2;; esac
rm -rf "$WORK" && mkdir -p "$WORK/tree" || exit 1
VPY=$WORK/venv/bin/python PIP=$WORK/pip
# pip for the venv ($PIP): in ci mode PYTHON's own pip driving the venv's
# interpreter (pip 22.3 or later: --python), so that the venv needs no pip
# of its own (ensurepip took 9 to 11 s of the test); else the venv's own pip
if [ "$MODE" = ci ] && "$PY" -m venv --without-pip "$WORK/venv" >"$WORK/venv.log" 2>&1 &&
   "$PY" -m pip --python "$VPY" --version >>"$WORK/venv.log" 2>&1; then
  printf '#!/bin/sh\nexec "%s" -m pip --python "%s" "$@"\n' "$PY" "$VPY" >"$PIP"
else
  rm -rf "$WORK/venv"
  if ! "$PY" -m venv "$WORK/venv" >"$WORK/venv.log" 2>&1; then
    echo "skip: $PY -m venv failed (apt-get install python3-venv):"; tail -2 "$WORK/venv.log"; exit 77
  fi
  printf '#!/bin/sh\nexec "%s" -m pip "$@"\n' "$VPY" >"$PIP"
fi
chmod +x "$PIP" || exit 1
if ! timeout 30 "$PIP" download -q --timeout 10 --retries 1 -d "$WORK/dl" "scikit-build-core>=0.10" \
     >"$WORK/pypi.log" 2>&1; then
  echo "skip: PyPI not reachable (pip needs scikit-build-core to build the package):"
  tail -2 "$WORK/pypi.log"; exit 77
fi
tar -C "$SRC" --exclude=./.git --exclude='./build*' --exclude=./python/build \
  --exclude='*.egg-info' --exclude=__pycache__ --exclude=./gpucheck -cf - . |
  tar -C "$WORK/tree" -xf - || { echo "FAIL: copying the source tree"; exit 1; }
set --
BUILD_PATH=
if [ "$MODE" = ci ]; then
  # the build's own dependency beside the venv, seen by the build alone
  "$PIP" install -q --no-index --find-links "$WORK/dl" --target "$WORK/build-deps" \
    "scikit-build-core>=0.10" >"$WORK/pip.log" 2>&1 ||
    { tail -30 "$WORK/pip.log"; echo "FAIL: pip install scikit-build-core from $WORK/dl"; exit 1; }
  BUILD_PATH=$WORK/build-deps
  set -- --no-build-isolation --no-index \
    --config-settings=cmake.define.FERRY_CUDA=OFF --config-settings=build-dir="$WORK/build"
  if command -v ccache >/dev/null 2>&1; then
    set -- "$@" --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
    # hits from any folder: paths relative to WORK, and -g not hashing the folder
    export CCACHE_BASEDIR="$WORK" CCACHE_NOHASHDIR=1
  fi
fi
start=$(date +%s)
(cd "$WORK" && env -u FERRY_LIB -u PYTHONPATH ${BUILD_PATH:+PYTHONPATH="$BUILD_PATH"} \
  "$PIP" install "$@" ./tree/python) \
  >>"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; echo "FAIL: pip install ./python"; exit 1; }
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
# (torch looked for, not imported, before the one import that counts)
env -u FERRY_LIB PYTHONPATH="$SITE" "$PY" -c "
import importlib.util, sys
if importlib.util.find_spec('torch') is None:
    print('note: $PY has no torch: ferry.torch not imported')
    sys.exit(0)
import ferry, ferry.torch
if not ferry.__file__.startswith('$SITE'): sys.exit('FAIL: ferry.torch from ' + ferry.__file__)
print('ferry.torch imports from', ferry.torch.__file__)
" || exit 1
echo ok
