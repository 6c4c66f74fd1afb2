"""Shared benchmark fixtures: a figures report printed at the end of the run.

A benchmark adds a line with ``bench_report.append("...")``; the lines are printed after
pytest-benchmark's own table, so that derived figures (ratios, bytes per id) sit in one place.
The report starts with the kernels measured; without the native extension the run stops at
once unless ``--allow-fallback`` is given (``native_only.fallback_refusal``).
"""

from __future__ import annotations

import pytest

_LINES: list[str] = []


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--allow-fallback",
        action="store_true",
        help="measure even when xorack's kernels are the pure-Python fallback",
    )


def pytest_configure(config) -> None:
    import xorack
    from native_only import fallback_refusal, package_dir

    refusal = fallback_refusal(xorack.backend, "the benchmarks")
    if refusal and not config.getoption("--allow-fallback"):
        pytest.exit(refusal, returncode=2)
    _LINES.append(f"xorack kernels measured: {xorack.backend} (xorack from {package_dir()})")


@pytest.fixture(scope="session")
def bench_report() -> list[str]:
    """Lines printed in the terminal summary ("xorack figures")."""
    return _LINES


def pytest_terminal_summary(terminalreporter) -> None:
    if len(_LINES) > 1:
        terminalreporter.section("xorack figures")
        for line in _LINES:
            terminalreporter.write_line(line)
