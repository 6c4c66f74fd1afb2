"""``xorack bench`` end to end at tiny sizes, without Spark (fast): the report is complete,
every acker completes every record, and a missing demo degrades to a "not available" line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import xorack
from xorack import bench


def test_stat_rates_swap_bounds() -> None:
    s = bench.Stat.of([1.0, 2.0, 4.0])
    assert (s.median, s.low, s.high, s.runs) == (2.0, 1.0, 4.0, 3)
    r = s.inverse(8.0)
    assert (r.median, r.low, r.high) == (4.0, 2.0, 8.0)


def test_last_json_line_wins() -> None:
    assert bench._last_json('progress...\n{"a": 1}\n{"lost": 0}\n') == {"lost": 0}
    assert bench._last_json("no json here") is None


def test_report_without_spark(tmp_path: Path) -> None:
    cfg = bench.BenchConfig(
        sizes=[3000], repeat=1, out=tmp_path, parts=(1, 2), spark_max=0, memory_size=3000
    )
    report = bench.run(cfg, "--test")
    names = {r.name for r in report.tracking}
    assert {"xorack fallback", "Python dict"} <= names
    assert not [r for r in report.tracking if r.note.startswith("WRONG")]
    measured = [r for r in report.tracking if r.events_per_s]
    assert measured
    assert all(r.events_per_s.median > 0 for r in measured)
    assert any(m.bytes_per_source for m in report.memory)
    churn = {c.backend: c for c in report.churn}
    assert churn["python"].events_per_s.median > 0
    assert churn["python"].bytes_per_pending > 0
    md, png = bench.write_report(report, tmp_path)
    text = md.read_text()
    assert "## 1. Completion tracking" in text
    assert "## 1b. AckTable steady state (churn)" in text
    assert "## 2. Memory per pending source record" in text
    assert "| cores |" in text
    assert (tmp_path / "report.json").exists()
    if png is not None:
        assert png.stat().st_size > 0


def test_missing_demo_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xorack.demo", None)  # import fails
    # ...also when an earlier test imported it (``from xorack import demo`` reads the attribute)
    monkeypatch.delattr(xorack, "demo", raising=False)
    with pytest.raises(bench.DemoUnavailable):
        bench.run_demo(100, ft=True)
    report = bench.Report(machine={}, config={})
    bench.part_demo(bench.BenchConfig(demo_sizes=[100], repeat=1), report)
    assert report.demo[0].note.startswith(bench.NOT_AVAILABLE)


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--sizes", "lots"])


@pytest.mark.spark
@pytest.mark.slow
def test_a_demo_run_in_a_process_of_its_own_reports_its_driver_peak_rss() -> None:
    report = bench.Report(machine={}, config={"argv": "", "quick": False, "repeat": 1})
    cfg = bench.BenchConfig(demo_sizes=[1200], repeat=1, demo_process_from=1000)
    bench.part_demo(cfg, report)
    (row,) = report.demo
    assert row.lost == 0
    assert row.results_match is True
    assert row.note.startswith("a process per run")
    assert row.rss_on_mb > 0
    assert row.rss_off_mb > 0
    assert "driver RSS off / on MiB" in bench.render_markdown(report)


def test_the_shard_benchmark_refuses_to_measure_the_fallback_silently() -> None:
    """Run from a checkout without the extension (or with XORACK_BACKEND=python), the shard
    benchmark would time the pure-Python kernels: it says so and stops, before any process
    starts, unless told --allow-fallback."""
    import os
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_shards.py"
    env = {**os.environ, "XORACK_BACKEND": "python"}
    done = subprocess.run(
        [sys.executable, str(script), "--shards", "1", "--clients", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "'python' backend" in done.stderr
    assert "--allow-fallback" in done.stderr


@pytest.mark.slow
def test_the_shard_benchmark_says_which_kernels_every_process_ran(tmp_path) -> None:
    """The clients and every shard import the benchmark's own xorack (not ``python/`` of the
    checkout) and report their kernels; coalesced sending makes requests of 64 K events."""
    import json
    import os
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_shards.py"
    out = tmp_path / "cells.json"
    args = ["--clients", "1", "--shards", "2", "--records", "65536", "--batches", "2"]
    args += ["--rounds", "1", "--out", str(out), "--allow-fallback"]
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cells = json.loads(out.read_text())["cells"]
    assert [c["send"] for c in cells] == ["direct", "coalesced"]
    for c in cells:
        assert c["client_backends"] == [xorack.backend]
        assert c["shard_backends"] == [xorack.backend]
        assert c["xorack"] == [str(Path(xorack.__file__).resolve().parent)]
    assert cells[1]["events_per_request"] == 65536  # 2 x 64K events over 2 shards
    assert f"kernels: {xorack.backend}" in done.stdout
