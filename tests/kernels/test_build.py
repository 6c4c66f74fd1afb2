"""The build: without a C++ compiler, configuring the native build fails with a message that
says how to get the pure-Python install instead (not CMake's bare "No CMAKE_CXX_COMPILER")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on PATH")
def test_no_compiler_names_the_pure_python_install(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++")}
    proc = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert "xorack: no C++ compiler found" in err, proc.stderr
    assert "C++17" in err
    assert "pip install . -Ccmake.define.XORACK_BUILD_NATIVE=OFF" in err


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on PATH")
def test_the_pure_python_configuration_needs_no_compiler(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++")}
    proc = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-DXORACK_BUILD_NATIVE=OFF"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "installing the pure-Python package only" in proc.stdout


@pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("ninja") is None,
    reason="cmake and ninja are not on PATH (tools/sanitize.sh would install them with pip)",
)
def test_the_sanitizer_run_fails_and_tests_nothing_when_the_extension_is_not_built(tmp_path):
    """tools/sanitize.sh (the README's sanitizer check) with no compiler: it fails, and never
    goes on to run the kernel tests on whatever xorack it finds (the pure-Python fallback)."""
    stub = tmp_path / "stub" / "pybind11"  # a stand-in: this test installs nothing
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "__main__.py").write_text(f"print({str(tmp_path)!r})\n")
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-c++"),
        "PYTHONPATH": str(stub.parent),
        "PYTHON": sys.executable,
        "BUILD_DIR": str(tmp_path / "build"),
        "PKG_DIR": str(tmp_path / "pkg"),
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "sanitize.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "xorack: no C++ compiler found" in " ".join(out.split())
    assert "sanitize: testing" not in out
    assert " passed" not in out
    assert not (tmp_path / "pkg").exists()
