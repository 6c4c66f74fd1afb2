"""Durability: an FT layer process killed with SIGKILL mid-run loses nothing. Reopening the
SQLite file replays every persisted record that had not completed, and none that had."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import xorack
from xorack import FTLayer

WORKER = Path(__file__).parents[1] / "helpers" / "ft_crash_worker.py"


def run_and_kill(path: Path, backend: str, after_lines: int) -> list[str]:
    """Start the worker, SIGKILL it once it has printed ``after_lines`` lines; its output."""
    env = dict(os.environ, PYTHONPATH=str(Path(xorack.__file__).parent.parent))
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(path), backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if len(lines) > after_lines:
                break
        proc.send_signal(signal.SIGKILL)  # mid-run: no close(), no atexit
        lines += proc.stdout.readlines()
    finally:
        proc.kill()
        proc.wait()
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err
    assert len(lines) > after_lines, err
    return [line[:-1] for line in lines if line.endswith("\n")]  # a cut last line is ignored


def ids(line: str) -> list[int]:
    body = line[2:]
    return [int(x) for x in body.split(",")] if body else []


@pytest.mark.parametrize("after_lines", [9, 61, 202])
def test_killed_process_loses_nothing_and_replays_no_completed_record(
    tmp_path, backend, after_lines
):
    path = tmp_path / "ft.db"
    lines = run_and_kill(path, backend, after_lines)
    persisted: dict[int, int] = {}  # src -> payload row number
    completed: set[int] = set()
    failed: set[int] = set()
    in_flight: set[int] = set()  # an xor sent, its answer not seen
    failing: set[int] = set()  # a fail sent, its answer not seen
    for line in lines[1:]:
        kind = line[0]
        if kind == "P":
            persisted.update(map(int, pair.split(":")) for pair in line[2:].split(","))
        elif kind == "X":
            in_flight = set(ids(line))
        elif kind == "C":
            completed.update(ids(line))
            in_flight = set()
        elif kind == "Y":
            failing = set(ids(line))
        elif kind == "F":
            failed.update(ids(line))
            failing = set()
    assert persisted
    assert completed

    with FTLayer(f"sqlite:///{path}", backend=backend, default_partitions=4) as ft:
        tables = list(ft.take_replays(0).values())
        rep = pa.concat_tables(tables).to_pylist() if tables else []
        stats = ft.stats()
    origins = {r["_ft_origin"]: r for r in rep}
    assert len(origins) == len(rep) == stats.recovered  # one replay per record

    assert not origins.keys() & completed, "a completed record was replayed"
    lost = persisted.keys() - completed - in_flight - origins.keys()
    assert not lost, f"{len(lost)} persisted, unfinished records were lost"
    assert len(origins.keys() - persisted.keys()) <= 64  # at most the batch being persisted
    for origin, row in origins.items():
        if origin in persisted:
            assert (row["n"], row["text"]) == (persisted[origin], f"row {persisted[origin]}")
            assert row["_ft_key_hash"] == row["n"]
            if origin not in failing:
                assert row["_ft_attempt"] == (2 if origin in failed else 1)  # a restart: none
