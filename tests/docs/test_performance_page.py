"""The figures the performance page quotes from the benchmark report are the report's
(benchmarks/results/report.json, written by ``xorack bench --out benchmarks/results``): a new
report without the page (or a page edited by hand) fails here. Each figure is compared at the
precision the page prints it with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "performance.md").read_text()
REPORT = json.loads((ROOT / "benchmarks" / "results" / "report.json").read_text())
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _row(first_cell: str) -> list[str]:
    """The cells of the page's table row that starts with ``first_cell``."""
    for line in PAGE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"docs/performance.md has no table row {first_cell!r}")


def _numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell)


def _same(shown: str, value: float, scale: float = 1.0) -> bool:
    """``shown`` is ``value / scale`` rounded to the digits the page prints."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown.replace(",", "")) - value / scale) <= 0.5 * 10**-decimals + 1e-9


def _tracking(name: str, sources: int) -> float:
    (entry,) = [t for t in REPORT["tracking"] if t["name"] == name and t["sources"] == sources]
    return entry["events_per_s"]["median"]


@pytest.mark.parametrize(
    ("row", "name"),
    [
        ("xorack native `AckTable`", "xorack native"),
        (
            "C++ rotating buckets of `std::unordered_map` (Storm/Heron design)",
            "C++ rotating buckets (Storm/Heron)",
        ),
        (
            "Spark `groupBy(src).agg(bit_xor)`, cached DataFrame",
            "Spark groupBy + bit_xor (cached DataFrame)",
        ),
        ("xorack pure-Python fallback", "xorack fallback"),
        ("plain Python dict acker", "Python dict"),
    ],
)
def test_completion_tracking_figures(row, name):
    rate, versus = _row(row)
    assert _same(rate, _tracking(name, 1_000_000), 1e6)
    native = _tracking("xorack native", 1_000_000)
    (times, *_) = _numbers(versus)
    assert _same(times, native / _tracking(name, 1_000_000))


def test_completion_tracking_at_10m():
    line = next(line for line in PAGE.splitlines() if line.startswith("At 10 M source records"))
    native, baseline, times = _numbers(line.split("native runs at")[1])
    assert _same(native, _tracking("xorack native", 10_000_000), 1e6)
    assert _same(baseline, _tracking("C++ rotating buckets (Storm/Heron)", 10_000_000), 1e6)
    assert _same(times, float(native) / float(baseline))


@pytest.mark.parametrize(
    ("row", "key_type"), [("int64", "int64"), ("short strings (~10 B)", "string")]
)
def test_partition_id_figures(row, key_type):
    (entry,) = [p for p in REPORT["partitions"] if p["key_type"] == key_type]
    ours, spark = _row(row)
    assert _same(_numbers(ours)[0], entry["xorack_keys_per_s"]["median"], 1e6)
    assert _same(_numbers(spark)[0], entry["spark_keys_per_s"]["median"], 1e6)
    if key_type == "string":
        gb = entry["xorack_keys_per_s"]["median"] * entry["mean_key_bytes"]
        assert _same(_numbers(ours)[1], gb, 1e9)


@pytest.mark.parametrize(
    ("row", "variant"),
    [
        ("plain Spark", "plain"),
        ("FT off", "ft off"),
        ("FT on (nothing fails: one optimistic round)", "ft on"),
        ("FT on, tracked rounds only (`optimistic=False`)", "ft on, tracked"),
        (
            "FT on, one line fails its first attempt (the optimistic round falls back)",
            "ft on, 1 line fails",
        ),
    ],
)
def test_wordcount_job_figures(row, variant):
    runs = REPORT["jobs"]["variants"][variant]
    plain = REPORT["jobs"]["variants"]["plain"]["median"]
    seconds, ratio, *_ = _row(row)
    median, low, high = _numbers(seconds)
    assert _same(median, runs["median"])
    assert _same(low, min(runs["seconds"]))
    assert _same(high, max(runs["seconds"]))
    assert _same(_numbers(ratio)[0], runs["median"] / plain)


@pytest.mark.parametrize(
    ("row", "records"),
    [("100 K (one process, warm)", 100_000), ("1 M", 1_000_000), ("10 M", 10_000_000)],
)
def test_demo_figures(row, records):
    (entry,) = [d for d in REPORT["demo"] if d["records"] == records]
    off, on, ratio, *_ = _row(row)
    for cell, key in [(off, "ft_off_s"), (on, "ft_on_s"), (ratio, "ratio")]:
        median, low, high = _numbers(cell)
        assert _same(median, entry[key]["median"]), (row, key)
        assert _same(low, entry[key]["low"]), (row, key)
        assert _same(high, entry[key]["high"]), (row, key)
