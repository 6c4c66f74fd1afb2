"""The build: without a C++ compiler, configuring the native build fails with a message that
says how to get the pure-Python install instead (not CMake's bare "No CMAKE_CXX_COMPILER")."""

from __future__ import annotations

import os
import shutil
import subprocess
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
