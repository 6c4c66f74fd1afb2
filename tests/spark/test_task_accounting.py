"""Spark's task accounting of an optimistic round (:mod:`xorack.spark.tasks`): a task attempt
that failed and was retried counts once and the round stands; what the round cannot tell from
a task counted twice (a stage run again, a task resubmitted or run twice, a task still
running, a listing cut short) makes it fall back. The judge is checked on random task
histories; the rule on real local Spark, with a worker killed inside a keeping round."""

from __future__ import annotations

import glob
import os
import sys
import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xorack
from xorack.spark import tasks
from xorack.spark.tasks import StageCounts, attempt_file_name, judge_stage, live_files

STATUSES = ("SUCCESS", "FAILED", "KILLED", "RUNNING")
LOST = "ExecutorLostFailure (executor 1 exited caused by one of the running tasks)"


def _c(**kw):
    return StageCounts(**{"attempt": 0, "tasks": 2, "complete": 2, "indices": 2, **kw})


def test_failed_attempts_then_one_success_each_are_retries():
    got = judge_stage(
        _c(failed=1, killed=1),
        [(0, 0, "FAILED", "boom"), (1, 0, "KILLED", "another attempt succeeded")],
    )
    assert (got.bad, got.retried, got.dead, got.reasons) == (0, 2, {0, 1}, [])


@pytest.mark.parametrize(
    ("counts", "listed", "words"),
    [
        (_c(attempt=1), [], "attempted again"),
        (_c(failed=1, active=1), [(0, 0, "FAILED", "x")], "still running"),
        (_c(failed=2), [(0, 0, "FAILED", "x")], "lists 1 of"),
        (_c(complete=3, failed=1), [(0, 0, "FAILED", "x")], "succeeded twice"),
        (_c(indices=1, complete=1, failed=1), [(0, 0, "FAILED", "x")], "never succeeded"),
        (_c(failed=1), [(0, 0, "FAILED", LOST)], "ExecutorLostFailure"),
        (_c(failed=1), [(0, 0, "FAILED", "Resubmitted (lost executor)")], "Resubmitted"),
        (_c(failed=1), [(0, 0, "RUNNING", None)], "is RUNNING"),
    ],
)
def test_what_a_round_cannot_vouch_for(counts, listed, words):
    got = judge_stage(counts, listed)
    assert got.bad >= 1
    assert any(words in r for r in got.reasons), got.reasons


histories = st.lists(
    st.tuples(
        st.integers(0, 3),  # partition index
        st.sampled_from(STATUSES),
        st.sampled_from([None, "worker died", LOST]),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 4), st.integers(0, 2), st.integers(0, 1))
def test_the_judge_trusts_exactly_one_success_per_partition_after_clean_failures(
    history, partitions, cut, attempt
):
    """Random attempt histories of one stage, counted as Spark's status store counts them:
    the judge trusts a stage with failed or killed attempts exactly when it is its first
    attempt, nothing runs, every partition succeeded exactly once, the failed attempts are
    listed in full and none lost its executor; its retries and dead ids are those attempts'."""
    tasks = [(i, idx % partitions, status, err) for i, (idx, status, err) in enumerate(history)]
    wins = [t for t in tasks if t[2] == "SUCCESS"]
    lost = [t for t in tasks if t[2] in ("FAILED", "KILLED")]
    counts = StageCounts(
        attempt,
        tasks=partitions,
        complete=len(wins),
        indices=len({t[1] for t in wins}),
        failed=sum(1 for t in tasks if t[2] == "FAILED"),
        killed=sum(1 for t in tasks if t[2] == "KILLED"),
        active=sum(1 for t in tasks if t[2] == "RUNNING"),
    )
    shown = lost[: max(0, len(lost) - cut)]
    got = judge_stage(counts, shown)
    if attempt:
        assert got.bad == 1
        return
    if not lost and not counts.active:
        assert (got.bad, got.retried) == (0, 0)  # nothing failed: nothing to look at
        return
    trusted = (
        not counts.active
        and counts.complete == counts.indices == partitions
        and len(shown) == len(lost)
        and not any(t[3] == LOST for t in shown)
    )
    assert (got.bad == 0) == trusted, (tasks, shown, got.reasons)
    assert got.retried == len(shown)
    assert got.dead == {t[0] for t in shown}


def test_a_failed_attempts_own_files_are_ignored():
    names = [attempt_file_name(7, "a"), attempt_file_name(8, "b"), "c.parquet", "t9x-d.parquet"]
    assert live_files(names, {7}) == names[1:]
    assert live_files(names, set()) == names
    assert tasks.attempt_of("t9x-d.parquet") is None


# ---- on real local Spark ---------------------------------------------------------------------

N = 1200
BAD = 97  # rows whose id % BAD == 5 fail their first round (13 of N)


def _lines(spark):
    rows = [(i, f"w{i % 7} w{i % 11} x{i % 5}") for i in range(N)]
    # one partition: the task that keeps the failed rows is the task whose worker dies
    return spark.createDataFrame(rows, "id long, text string").repartition(1)


def _flaky(batch):
    from xorack.spark import current_round

    if current_round() == 0:
        mask = pa.array(batch.column("id").to_numpy(zero_copy_only=False) % BAD == 5)
        if pc.any(mask).as_py():
            raise xorack.FailRecord("injected", rows=mask)
    return batch


class DiesAfterTheKeptFile:
    """A ``map_in_arrow`` stage after the keeping stage, in the same task: in the task's first
    attempt it waits until the keeping stage of its own task attempt has written its kept
    rows (at the end of its input), notes it, and kills its Python worker. Spark retries the
    task; the retry keeps the same rows again."""

    def __init__(self, work: str, marker: str) -> None:
        self.work, self.marker = work, marker

    def __call__(self, batch):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.attemptNumber() != 0 or os.path.exists(self.marker):
            return batch
        mine = os.path.join(self.work, "**", "*.kept", f"t{ctx.taskAttemptId()}-*.parquet")
        deadline = time.monotonic() + 20
        while not glob.glob(mine, recursive=True) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(self.marker, "w") as f:
            f.write("saw" if glob.glob(mine, recursive=True) else "none")
        os._exit(13)  # the worker dies after its task attempt kept rows


@pytest.mark.spark
def test_a_task_retried_after_it_kept_rows_keeps_them_once(spark, tmp_path):
    """The keeping stage of a task's first attempt writes its kept rows; a later stage of the
    same task then kills its worker. Spark counts only the retry's kept rows, and the driver
    ignores the dead attempt's file (else it would read each kept row twice and fall back):
    the round stands, the failed records are replayed once, and the counts equal plain
    Spark's."""
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    work, marker = str(tmp_path / "work"), str(tmp_path / "died")
    p = Pipeline(spark, workdir=work)
    lines = p.source(_lines(spark), name="lines")
    lines = lines.map_in_arrow(_flaky, lines.schema, name="flaky")
    lines = lines.map_in_arrow(DiesAfterTheKeptFile(work, marker), lines.schema, name="dies")
    words = lines.select(F.explode(F.split("text", " ")).alias("word"))
    sink = ParquetSink(str(tmp_path / "out"))
    words.groupBy("word").agg(F.count("*").alias("n")).sink(sink, name="counts")
    report = p.run()
    with open(marker) as f:
        assert f.read() == "saw", "the dead attempt wrote no kept file: the test proved nothing"
    failed = sum(1 for i in range(N) if i % BAD == 5)
    assert report.optimistic_fallbacks == []
    assert report.retried_tasks == 1
    assert report.kept_rounds == 1
    assert report.kept_records == report.failed == report.replayed == failed
    assert report.source_records == report.completed == N
    assert report.lost == 0
    plain = _lines(spark).select(F.explode(F.split("text", " ")).alias("word"))
    want = plain.groupBy("word").agg(F.count("*").alias("n"))
    got = Counter(tuple(r) for r in sink.read(spark).collect())
    assert got == Counter(tuple(r) for r in want.collect())
