"""Shared fixtures: kernel backends and one real local Spark session per test run."""

from __future__ import annotations

import os
import sys

import pytest

from xorack import kernels

NATIVE_MISSING = "native extension not built (pure-Python install): only the fallback is testable"


def _backend_params() -> list:
    return [
        pytest.param(
            "native",
            marks=pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING),
        ),
        pytest.param("python"),
    ]


@pytest.fixture(params=_backend_params())
def backend(request) -> str:
    """Each kernel test runs once per available backend ("native", "python")."""
    return request.param


@pytest.fixture(scope="session")
def spark():
    """One real local Spark session for the whole run: local[2], UI off, few shuffle partitions."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
    from xorack.spark.session import get_or_create_session

    session = get_or_create_session(app_name="xorack-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _python_for_spark_workers():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
