"""The backend switch: native after a normal install, python after the pure-Python one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import xorack
from xorack import kernels


def test_backend_is_expected():
    # .ci/run sets XORACK_EXPECT_BACKEND so that a silently broken native build fails CI
    # instead of quietly testing the fallback twice.
    expected = os.environ.get("XORACK_EXPECT_BACKEND")
    if expected is None:
        assert xorack.backend in kernels.BACKENDS
    else:
        assert xorack.backend == expected


def test_env_forces_python_backend():
    out = subprocess.run(
        [sys.executable, "-c", "import xorack; print(xorack.backend)"],
        env={**os.environ, "XORACK_BACKEND": "python"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "python"


def test_unknown_backend_is_a_clear_error():
    out = subprocess.run(
        [sys.executable, "-c", "import xorack"],
        env={**os.environ, "XORACK_BACKEND": "gpu"},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "XORACK_BACKEND='gpu' is not a backend" in out.stderr


def test_get_impl_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown backend"):
        kernels.get_impl("fortran")
