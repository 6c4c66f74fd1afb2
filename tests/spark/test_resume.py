"""Resuming a job after its driver died: the durable job state (progress notes, ended attempts,
marks) in the storage and through the service, the pipeline's checks, and — in the
``driver_crash`` group — a real driver process killed with SIGKILL at several points and run
again, the second run finishing the job exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import xorack
from xorack import FTLayer
from xorack.service import AckerClient, AckerService
from xorack.storage import MemoryStorage, SQLiteStorage

U64 = np.uint64
DRIVER = Path(__file__).parents[1] / "helpers" / "resume_driver.py"


def _batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({"v": list(range(n))})


# ---- the job state in the storage and the FT layer ----------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_progress_notes_keep_the_furthest_end_per_partition(tmp_path, kind):
    storage = MemoryStorage() if kind == "memory" else SQLiteStorage(tmp_path / "ft.db")
    with FTLayer(storage=storage) as ft:
        ft.persist(_batch(3), partition=1, progress=(1, 3))
        ft.persist(_batch(2), partition=1, progress=(1, 5))
        ft.persist(_batch(4), source=2, partition=0, progress=(0, 4))
        ft.persist(_batch(1), partition=7)  # no note: not counted
        assert ft.job_state()["progress"] == {0: {1: 5}, 2: {0: 4}}
    storage.close()


def test_a_sqlite_job_state_outlives_the_process_that_wrote_it(tmp_path):
    path = f"sqlite:///{tmp_path / 'ft.db'}"
    ft = FTLayer(storage=path, max_attempts=1)
    src = ft.persist(_batch(4), births=np.arange(1, 5, dtype=U64), partition=0, progress=(0, 4))
    ft.fail(src[:1])  # dead-lettered (max_attempts=1): an ended attempt
    ft.job_state(marks={"phase0": "done", "gone": "x"})
    ft.job_state(marks={"gone": None})
    ft.close()
    # a new FT layer on the file: the notes and marks are there, and take_ended hands out the
    # dead-lettered attempt and the three pending ones it replays under new ids
    again = FTLayer(storage=path, max_attempts=1)
    assert again.job_state() == {"progress": {0: {0: 4}}, "marks": {"phase0": "done"}}
    assert set(again.take_ended().tolist()) == set(src.tolist())
    assert again.pending == 3
    again.job_state(clear=["ended", "progress", "marks"])
    again.close()
    third = FTLayer(storage=path)
    assert third.job_state() == {"progress": {}, "marks": {}}
    ended = third.take_ended()  # only the three the reopening replayed again
    assert len(ended) == 3
    assert not set(ended.tolist()) & set(src.tolist())
    third.close()


def test_a_progress_note_is_stored_with_its_batch_or_not_at_all(tmp_path):
    storage = SQLiteStorage(tmp_path / "ft.db")
    # the batch's blob cannot be written: the note, written first in the same transaction, goes
    storage._con.execute(
        "CREATE TEMP TRIGGER no_room BEFORE INSERT ON batches BEGIN "
        "SELECT RAISE(ABORT, 'no room'); END"
    )
    with FTLayer(storage=storage) as ft:
        with pytest.raises(xorack.StorageError, match="no room"):
            ft.persist(_batch(2), partition=0, progress=(0, 2))
        assert ft.job_state()["progress"] == {}
        assert ft.pending == 0
    storage.close()


@pytest.mark.parametrize(
    ("progress", "error", "match"),
    [
        ((0,), TypeError, r"\(partition, end\)"),
        ("ab", ValueError, "non-negative int"),
        ((-1, 5), ValueError, "partition must be a non-negative int"),
        ((0, 1), ValueError, "before the batch's 3 rows end"),
        ((0, 2.5), ValueError, "end must be a non-negative int"),
    ],
)
def test_a_bad_progress_note_is_refused_and_nothing_is_kept(progress, error, match):
    with FTLayer() as ft:
        with pytest.raises(error, match=match):
            ft.persist(_batch(3), partition=0, progress=progress)
        assert ft.pending == 0
        assert ft.job_state()["progress"] == {}


def test_job_state_refuses_unknown_parts_and_bad_marks():
    with FTLayer() as ft:
        with pytest.raises(ValueError, match="clear"):
            ft.job_state(clear=["everything"])
        with pytest.raises(TypeError, match="marks"):
            ft.job_state(marks={"phase0": 1})


def test_the_job_state_travels_through_the_service(tmp_path):
    ft = FTLayer(storage=f"sqlite:///{tmp_path / 'ft.db'}")
    with AckerService.embedded(ft) as svc:
        client = AckerClient(svc.location)
        client.persist(_batch(3), partition=2, births=np.arange(1, 4, dtype=U64), progress=(2, 9))
        state = client.job_state(marks={"phase0": "done"})
        assert state == {"progress": {0: {2: 9}}, "marks": {"phase0": "done"}}
        assert client.job_state(clear=["marks"])["marks"] == {}
        with pytest.raises(xorack.ServiceError, match="clear"):
            client.job_state(clear=["all"])
        with pytest.raises(ValueError, match="before the batch"):
            client.persist(_batch(3), partition=2, progress=(2, 1))  # refused before the wire
    ft.close()


def test_a_sharded_acker_refuses_to_note_progress():
    # refused before any call: the shards' addresses are never dialled
    client = AckerClient.get("grpc://127.0.0.1:1,grpc://127.0.0.1:2")
    with pytest.raises(ValueError, match="sharded acker cannot resume"):
        client.persist(_batch(2), partition=0, progress=(0, 2))
    with pytest.raises(ValueError, match="ackers=1"):
        client.job_state()


# ---- the pipeline's checks ------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ft": False}, "ft=False"),
        ({"storage": "memory"}, "does not outlive the driver"),
        ({"ackers": 2, "storage": "sqlite:///x.db"}, "ackers=1"),
        ({"service": "grpc://127.0.0.1:1"}, "embedded acker"),
        ({"workdir": None}, "give workdir="),
    ],
)
def test_resume_needs_what_outlives_the_driver(spark, tmp_path, kwargs, match):
    from xorack.spark import Pipeline

    args = {"storage": f"sqlite:///{tmp_path / 'ft.db'}", "workdir": str(tmp_path / "w")}
    with pytest.raises(ValueError, match=match):
        Pipeline(spark, resume=True, **{**args, **kwargs})


# ---- a real driver killed and resumed --------------------------------------------------------

RECORDS = 600


def _run_driver(
    workdir: Path, crash: str | None, stream: bool = False, combine: bool = False
) -> tuple[int, str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["RESUME_COMBINE"] = "1" if combine else "0"
    env["PYTHONPATH"] = os.pathsep.join([str(DRIVER.parent), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(DRIVER), *(["stream"] if stream else [])]
    cmd += [str(workdir), str(RECORDS), *([crash] if crash else [])]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its JVM and Python workers: killed with it below
    )
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what a dead driver left running
    return proc.returncode, out, err


def _expected() -> tuple[set[int], Counter, list[list]]:
    from helpers import resume_driver as job

    dead = {s for s in range(RECORDS) if job.poisoned(s)}
    counts: Counter = Counter()
    words = []
    for s in range(RECORDS):
        if s in dead:
            continue
        for w in job.sentence_words(s):
            if w not in job.STOP:
                counts[w] += 1
                words.append([s, w])
    return dead, counts, sorted(words)


@pytest.mark.driver_crash
@pytest.mark.parametrize(
    ("crash", "combine"),
    [("persist", False), ("stage", True), ("round", False), ("replay", True), ("phase1", False)],
)
def test_a_driver_killed_midway_is_resumed_exactly_once(tmp_path, crash, combine):
    """``combine``: the count stages partial aggregates per chunk (the chunks of the attempts
    the crash left pending must stay out of the merge) instead of rows."""
    code, _, err = _run_driver(tmp_path, crash, combine=combine)
    assert code == -signal.SIGKILL, f"the driver was to be killed ({crash}):\n{err[-3000:]}"
    code, out, err = _run_driver(tmp_path, None, combine=combine)
    assert code == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    report = result["report"]
    dead, counts, words = _expected()
    assert report["resumed"] is True
    assert report["lost"] == 0
    assert report["source_records"] == RECORDS
    assert report["completed"] + report["dead_lettered"] == RECORDS
    assert set(result["dead"]) == dead  # the poisoned sentences, and only they
    assert report["dead_lettered"] == len(dead)
    # the sinks: exactly plain counting over the sentences that were not dead-lettered, no
    # row twice (the word rows are (sentence, word) pairs: a duplicate would show)
    assert result["counts"] == dict(counts)
    assert result["count_rows"] == len(counts)
    assert result["labels_ok"]
    assert result["words"] == words
    if crash != "round":  # once is enough (each run starts a Spark of its own)
        return
    # a third run: the job is finished, nothing runs again
    code, out, err = _run_driver(tmp_path, None)
    assert code == 0, err[-3000:]
    again = json.loads(out.strip().splitlines()[-1])
    assert again["report"]["completed"] == report["completed"]
    assert again["counts"] == result["counts"]
    assert again["words"] == result["words"]


@pytest.mark.driver_crash
def test_a_streaming_driver_killed_midway_restarts_from_its_checkpoint_exactly_once(tmp_path):
    """Spark re-runs the micro-batch the crash cut short (same batch id, same rows); the rows
    its first run persisted are skipped there, the FT storage replays the records the crash
    left pending, and the sink ends with every row once."""
    code, _, err = _run_driver(tmp_path, "batch", stream=True)
    assert code == -signal.SIGKILL, f"the driver was to be killed:\n{err[-3000:]}"
    code, out, err = _run_driver(tmp_path, None, stream=True)
    assert code == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    dead, _, words = _expected()
    report = result["report"]
    assert report["resumed"] is True
    assert report["lost"] == 0
    assert report["source_records"] == RECORDS
    assert report["completed"] + report["dead_lettered"] == RECORDS
    assert sorted(result["dead"]) == sorted(dead)  # each poisoned sentence once
    assert result["words"] == words  # every word of every live sentence once, nothing else
    assert result["ft_state"]  # the default settings: the FT state inside the checkpoint
    assert result["windows"] == _expected_windows(dead)  # each closed window once


def _expected_windows(dead: set[int]) -> list[list]:
    """The count per 10-second window and word that plain Spark closes: every window whose end
    is at or below the largest event time minus the 5-second delay."""
    import datetime as dt

    from helpers import resume_driver as job

    times = {s: dt.datetime.fromisoformat(job.event_time(s, RECORDS)) for s in range(RECORDS)}
    t0 = dt.datetime.fromisoformat(job.T0)
    watermark = max(times.values()) - dt.timedelta(seconds=job.DELAY)
    counts: Counter = Counter()
    for s in range(RECORDS):
        if s in dead:
            continue
        start = t0 + dt.timedelta(
            seconds=job.WINDOW * int((times[s] - t0).total_seconds() // job.WINDOW)
        )
        if start + dt.timedelta(seconds=job.WINDOW) > watermark:
            continue
        for w in job.sentence_words(s):
            if w not in job.STOP:
                counts[(start.isoformat(), w)] += 1
    return sorted([start, w, n] for (start, w), n in counts.items())
