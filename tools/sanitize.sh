#!/usr/bin/env bash
# Sanitizer check of the C++ kernels: builds xorack._native with ASan + UBSan (build/asan),
# puts it in a copy of the package (build/asan-pkg) and runs the kernel tests against it,
# with the native backend forced: it fails, and runs no test, when the sanitized extension
# was not built or is not the one imported (never a green run on the pure-Python fallback).
# Installs what the build needs into the active Python when it is missing (pybind11, and
# cmake/ninja when they are not on PATH). Extra args go to pytest, e.g. -x or -k table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build/asan}
PKG=${PKG_DIR:-build/asan-pkg}

need=()
"$PY" -m pybind11 --cmakedir >/dev/null 2>&1 || need+=("pybind11>=2.12")
command -v cmake >/dev/null || need+=("cmake>=3.18")
command -v ninja >/dev/null || need+=("ninja")
if [ ${#need[@]} -gt 0 ]; then
  echo "sanitize: installing ${need[*]} (what the build needs) into $("$PY" -c 'import sys; print(sys.prefix)')"
  "$PY" -m pip install -q "${need[@]}"
fi

BUILD_DIR=$BUILD_DIR PYTHON=$PY tools/dev_build.sh -DXORACK_SANITIZE=ON -DXORACK_DEV_INPLACE=OFF \
  -DXORACK_BUILD_BASELINES=OFF
shopt -s nullglob
built=("$BUILD_DIR"/_native*.so)
if [ ${#built[@]} -ne 1 ]; then
  echo "sanitize: error: no sanitized extension in $BUILD_DIR (the build failed?)" >&2
  exit 1
fi
if [[ "$(ldd "${built[0]}")" != *libasan* ]]; then
  echo "sanitize: error: ${built[0]} is not linked with ASan (a stale build? remove $BUILD_DIR)" >&2
  exit 1
fi
rm -rf "$PKG" && mkdir -p "$PKG" && cp -r python/xorack "$PKG"/
rm -f "$PKG"/xorack/_native*.so "$PKG"/xorack/_baselines*.so  # an in-place dev build's copies
cp "${built[0]}" "$PKG"/xorack/
# xorack is imported from $PKG alone, ahead of any installed one (an editable install's import
# hook comes before PYTHONPATH): Python runs sitecustomize at start, subprocesses too
cat >"$PKG"/sitecustomize.py <<'EOF'
"""Import xorack from this directory only (tools/sanitize.sh)."""
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _SanitizedXorack:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "xorack":
            return importlib.machinery.PathFinder.find_spec(name, [_HERE])
        if name.startswith("xorack."):
            return importlib.machinery.PathFinder.find_spec(name, path)
        return None


sys.meta_path.insert(0, _SanitizedXorack)
EOF

# libstdc++ is preloaded too, or the first C++ exception aborts under ASan
export LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH=$PKG XORACK_BACKEND=native XORACK_EXPECT_BACKEND=native
"$PY" - "$PKG" <<'EOF'
import os, sys
import xorack._native as native  # XORACK_BACKEND=native: importing xorack fails without it
want = os.path.realpath(sys.argv[1])
if not os.path.realpath(native.__file__).startswith(want + os.sep):
    sys.exit(f"sanitize: error: xorack._native comes from {native.__file__}, not {want}")
print(f"sanitize: testing {native.__file__}")
EOF
"$PY" -m pytest -p no:cacheprovider tests/kernels/test_backend.py tests/kernels/test_ack_table.py \
  tests/kernels/test_timeout_wheel.py tests/kernels/test_lineage.py \
  tests/kernels/test_acker_properties.py tests/kernels/test_spark_hash.py "$@"
