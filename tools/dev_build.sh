#!/usr/bin/env bash
# Development build of xorack._native, copied into python/xorack/ so that
# `PYTHONPATH=python python -m pytest` uses it. Serialized with flock: several
# people (or agents) may build at once. Extra args go to cmake configure,
# e.g. tools/dev_build.sh -DXORACK_SANITIZE=ON (use a separate BUILD_DIR for that).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build/dev}
PY=${PYTHON:-python3}
mkdir -p "$BUILD_DIR"
exec 9>"$BUILD_DIR.lock"
flock 9
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXORACK_DEV_INPLACE=ON \
    -DPython_EXECUTABLE="$($PY -c 'import sys; print(sys.executable)')" \
    -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" "$@" >/dev/null
fi
cmake --build "$BUILD_DIR"
