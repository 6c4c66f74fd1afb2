"""``--verbose`` on ``xorack demo`` and ``xorack bench``: parsed before Spark starts, and given
to the run (``DemoConfig.verbose`` → ``Pipeline(verbose=)``, ``BenchConfig.verbose``); off by
default. What it changes in a run is tests/spark/test_quiet.py."""

from __future__ import annotations

from xorack import bench, demo


def test_demo_verbose_reaches_its_config():
    parse = demo.build_parser().parse_args
    assert demo._config(parse(["--verbose"])).verbose is True
    assert demo._config(parse([])).verbose is False


def test_bench_verbose_reaches_its_config(tmp_path):
    parse = bench.build_parser().parse_args
    assert bench.config_from_args(parse(["--verbose", "--out", str(tmp_path)])).verbose is True
    assert bench.config_from_args(parse(["--out", str(tmp_path)])).verbose is False
