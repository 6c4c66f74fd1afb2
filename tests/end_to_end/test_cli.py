"""Every option of every ``xorack`` command is checked before Spark or the service starts: a bad
value is one line on stderr naming the option, and exit status 2.

"Spark was not started" is checked directly: the commands run in a subprocess whose import path
puts a stand-in ``pyspark`` package first, which prints a marker and exits with status 99 as soon
as anything imports it. A command that got as far as building a Spark session (or importing
PySpark at all) would fail the test with that marker instead of exiting 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PACKAGE = str(Path(__file__).resolve().parents[2] / "python")
SPARK_MARKER = "TEST-MARKER: pyspark was imported"


@pytest.fixture(scope="module")
def no_spark_path(tmp_path_factory) -> str:
    """A directory holding a ``pyspark`` that refuses to be imported."""
    root = tmp_path_factory.mktemp("no-spark")
    (root / "pyspark").mkdir()
    (root / "pyspark" / "__init__.py").write_text(
        f"import os, sys\nsys.stderr.write({SPARK_MARKER!r} + '\\n')\nos._exit(99)\n"
    )
    return str(root)


def run_xorack(no_spark_path: str, *argv: str, cwd: Path | None = None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([no_spark_path, PACKAGE])}
    env.pop("XORACK_TOKEN", None)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "xorack", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )
    return proc, time.monotonic() - start


BAD_OPTIONS = [
    (["demo", "--records", "0"], "argument --records: must be >= 1, got 0"),
    (
        ["demo", "--workdir", "w", "--ft", "off"],
        "--workdir makes a resumable job: it needs --ft on",
    ),
    (["demo", "--workdir", "w", "--ackers", "2"], "--workdir (a resumable job) needs --ackers 1"),
    (["demo", "--workdir", "setup.cfg"], "--workdir 'setup.cfg' is a file, not a directory"),
    (["demo", "--partitions", "-2"], "argument --partitions: must be >= 1"),
    (["demo", "--max-attempts", "0"], "argument --max-attempts: must be >= 1"),
    (["demo", "--records", "many"], "argument --records: not an integer"),
    (["demo", "--fail-rate", "1.5"], "argument --fail-rate: must be in [0, 1]"),
    (["demo", "--poison-rate", "-0.1"], "argument --poison-rate: must be in [0, 1]"),
    (["demo", "--drop-rate", "nan"], "argument --drop-rate: must be in [0, 1]"),
    (["demo", "--seed", "-1"], "argument --seed: must be >= 0"),
    (["demo", "--seed", str(1 << 60)], "argument --seed: must be <="),
    (["demo", "--ft", "maybe"], "argument --ft: invalid choice"),
    (["demo", "--storage", "memroy"], "argument --storage: unknown storage spec 'memroy'"),
    (["demo", "--storage", "redis://x"], "argument --storage: unknown storage spec"),
    (
        ["demo", "--storage", "sqlite:///no/such/dir/ft.db"],
        "argument --storage: cannot open SQLite storage 'no/such/dir/ft.db'",
    ),
    (["demo", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["demo", "--master", "bogus://x"], "argument --master: not a Spark master URL: 'bogus://x'"),
    (["demo", "--master", "local[0]"], "argument --master: local[N] or local[*]: threads must"),
    (["demo", "--master", "spark://host"], "argument --master: expected spark://HOST:PORT"),
    (["demo", "--master", "local-cluster[2,1,256]"], "M (MiB per worker) must be >= 512"),
    (["demo", "--stream", "--master", "yarn-client"], "argument --master: not a Spark master"),
    (
        ["demo", "--workdir", "setup.cfg/w"],
        "argument --workdir: cannot create or write 'setup.cfg/w': Not a directory",
    ),
    (["demo", "--workdir", ""], "argument --workdir: the directory is empty"),
    (["demo", "--ft", "off", "--fail-rate", "0.1"], "--fail-rate 0.1: not with --ft off"),
    (
        ["demo", "--ft", "off", "--poison-rate", "0.5", "--drop-rate", "0.2"],
        "--poison-rate 0.5, --drop-rate 0.2: not with --ft off",
    ),
    (["demo", "--ft", "off", "--storage", "ft.db"], "--storage ft.db: not with --ft off"),
    (["demo", "--ft", "off", "--ackers", "2"], "--ackers 2: not with --ft off"),
    (["demo", "--ft", "off", "--max-attempts", "2"], "--max-attempts 2: not with --ft off"),
    (["demo", "--ft", "off", "--plain-failures"], "--plain-failures: not with --ft off"),
    (["serve", "--port", "70000"], "argument --port: port must be in [0, 65535]"),
    (["serve", "--num-buckets", "0"], "argument --num-buckets: must be >= 1"),
    (["serve", "--max-attempts", "x"], "argument --max-attempts: not an integer"),
    (["serve", "--default-partitions", "0"], "argument --default-partitions: must be >= 1"),
    (["serve", "--rotate-interval", "-1"], "argument --rotate-interval: must be a number >= 0"),
    (["serve", "--rotate-interval", "inf"], "argument --rotate-interval: must be a number >= 0"),
    (["serve", "--replay-partitioner", "0=zigzag:3"], "argument --replay-partitioner"),
    (["serve", "--storage", "memroy"], "argument --storage: unknown storage spec"),
    (["serve", "--storage", "sqlite:///no/such/dir/a.db"], "argument --storage: cannot open"),
    (
        ["serve", "--shards", "2", "--storage", "sqlite:///no/such/dir/a.db"],
        "argument --storage: cannot open SQLite storage 'no/such/dir/a.shard0of2.db'",
    ),
    (["serve", "--shards", "0"], "argument --shards: must be >= 1"),
    (["serve", "--shard", "2/2"], "argument --shard: the shard index must be in [0, 2)"),
    (["serve", "--shards", "2", "--shard", "0/2"], "--shard K/N is what each of them is given"),
    (
        ["demo", "--ackers", "2", "--storage", "sqlite:///no/such/dir/ft.db"],
        "argument --storage: cannot open SQLite storage 'no/such/dir/ft.shard0of2.db'",
    ),
    (["serve", "--host", "0.0.0.0"], "not a loopback address: pass --token"),
    (["serve", "--host", ""], "argument --host: the host is empty"),
    (["serve", "--host", "no-such-host.invalid"], "argument --host: cannot resolve host"),
    (["bench", "--parts", "9"], "argument --parts: the parts are 1, 2, 3, 4, 5, 6, 7; got '9'"),
    (["bench", "--parts", "1,8"], "(no part 8)"),
    (["bench", "--tpch", "--scale", "0"], "argument --scale: must be a number > 0"),
    (["bench", "--tpch", "--scale", "tiny"], "argument --scale"),
    (["bench", "--parts", "one"], "argument --parts: expected part numbers"),
    (["bench", "--repeat", "0"], "argument --repeat: must be >= 1"),
    (["bench", "--sizes", "lots"], "argument --sizes: sizes must look like 1e6,1e7"),
    (["bench", "--demo-sizes", "0"], "argument --demo-sizes: sizes must be positive"),
    (["bench", "--recovery-records", "0"], "argument --recovery-records: must be >= 1"),
    (["bench", "--spark-max", "-1"], "argument --spark-max: must be >= 0"),
    (["bench", "--seed", "-1"], "argument --seed: must be >= 0"),
    (["bench", "--out", "setup.cfg/report"], "argument --out: cannot write the report"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS]
)
def test_a_bad_option_is_one_line_and_exit_2_before_spark_starts(
    no_spark_path, tmp_path, argv, message
):
    (tmp_path / "setup.cfg").write_text("a file, not a directory\n")
    proc, _seconds = run_xorack(no_spark_path, *argv, cwd=tmp_path)
    assert SPARK_MARKER not in proc.stderr, "the command imported pyspark before checking"
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    command = argv[0]
    assert lines[0].startswith(f"xorack {command}: error: "), lines[0]
    assert message in lines[0]
    assert not list(tmp_path.glob("**/*.lock")), "a failed storage check left a lock file"


def test_the_stand_in_pyspark_would_catch_a_spark_start(no_spark_path):
    """The guard of the test above works: a command that does import PySpark is caught."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([no_spark_path, PACKAGE])}
    proc = subprocess.run(
        [sys.executable, "-c", "from xorack.spark.session import get_or_create_session as g; g()"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 99
    assert SPARK_MARKER in proc.stderr


@pytest.mark.parametrize("command", ["demo", "serve", "bench"])
def test_help_documents_every_option(no_spark_path, command):
    proc, _ = run_xorack(no_spark_path, command, "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    from xorack import bench, cli, demo

    if command == "demo":
        parser = demo.build_parser()
    elif command == "bench":
        parser = bench.build_parser()
    else:
        sub = next(
            a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
        )
        parser = sub.choices["serve"]
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"xorack {command} {action.option_strings[0]} has no help"
            assert action.option_strings[-1] in text
    if command == "demo":  # the defaults are shown
        for shown in ("(default: 20000)", "(default: memory)", "(default: 4)", "(default: 7)"):
            assert shown in text, shown


def test_bench_parts_default_to_all_and_are_sorted():
    from xorack import bench

    args = bench.build_parser().parse_args(["--parts", "5,1,1"])
    assert bench.config_from_args(args).parts == (1, 5)
    assert bench.config_from_args(bench.build_parser().parse_args([])).parts == (1, 2, 3, 4, 5, 6)
