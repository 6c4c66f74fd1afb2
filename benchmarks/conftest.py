"""Shared benchmark fixtures: a figures report printed at the end of the run.

A benchmark adds a line with ``bench_report.append("...")``; the lines are printed after
pytest-benchmark's own table, so that derived figures (ratios, bytes per id) sit in one place.
"""

from __future__ import annotations

import pytest

_LINES: list[str] = []


@pytest.fixture(scope="session")
def bench_report() -> list[str]:
    """Lines printed in the terminal summary ("xorack figures")."""
    return _LINES


def pytest_terminal_summary(terminalreporter) -> None:
    if _LINES:
        terminalreporter.section("xorack figures")
        for line in _LINES:
            terminalreporter.write_line(line)
