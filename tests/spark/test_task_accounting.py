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
from xorack.spark.tasks import attempt_file_name, judge_stage, live_files

STATUSES = ("SUCCESS", "FAILED", "KILLED", "RUNNING", "UNKNOWN")


def _t(task_id, index, status="SUCCESS", error=None, speculative=False):
    return (task_id, index, status, error, speculative)


def test_a_failed_attempt_then_one_success_is_a_retry():
    got = judge_stage(
        0, completed=2, failed=2, active=0,
        tasks=[_t(0, 0, "FAILED", "boom"), _t(1, 0, "KILLED", "lost"), _t(2, 0), _t(3, 1)],
    )  # fmt: skip
    assert (got.bad, got.retried, got.dead, got.reasons) == (0, 2, {0, 1}, [])


@pytest.mark.parametrize(
    ("attempt", "completed", "failed", "active", "listed", "words"),
    [
        (1, 2, 0, 0, [], "attempted again"),
        (0, 2, 1, 1, [_t(0, 0, "FAILED"), _t(1, 0), _t(2, 1), _t(3, 1, "RUNNING")], "running"),
        (0, 3, 1, 0, [_t(0, 0, "FAILED"), _t(1, 0)], "lists 2 of"),
        (0, 2, 1, 0, [_t(0, 0), _t(1, 0), _t(2, 1, "FAILED")], "succeeded 2 times"),
        (0, 1, 1, 0, [_t(0, 0, "FAILED"), _t(1, 0, error="Resubmitted (lost)")], "resubmitted"),
        (0, 1, 1, 0, [_t(0, 0, "FAILED"), _t(1, 0, speculative=True)], "speculative"),
        (0, 1, 1, 0, [_t(0, 0, "FAILED"), _t(1, 1)], "failed and succeeded 0 times"),
        (0, 1, 1, 0, [_t(0, 0, "FAILED"), _t(1, 0, "UNKNOWN")], "is UNKNOWN"),
    ],
)
def test_what_a_round_cannot_vouch_for(attempt, completed, failed, active, listed, words):
    got = judge_stage(attempt, completed, failed, active, listed)
    assert got.bad >= 1
    assert any(words in r for r in got.reasons), got.reasons


histories = st.lists(
    st.tuples(
        st.integers(0, 4),  # partition index
        st.sampled_from(STATUSES),
        st.sampled_from([None, "Resubmitted (resubmitted due to lost executor)"]),
        st.booleans(),  # speculative
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(0, 2), st.booleans())
def test_the_judge_trusts_exactly_one_clean_success_per_failed_partition(history, cut, stale):
    """Random attempt histories of one stage attempt: the judge trusts them exactly when
    every partition that failed succeeded once, no success was resubmitted, speculative or
    doubled, nothing runs and the listing is whole; its retries and dead ids are the failed
    attempts'."""
    listed = [_t(i, idx, status, err, spec) for i, (idx, status, err, spec) in enumerate(history)]
    completed = sum(1 for t in listed if t[2] == "SUCCESS")
    failed = sum(1 for t in listed if t[2] == "FAILED")
    active = sum(1 for t in listed if t[2] == "RUNNING") + int(stale)
    shown = listed[: max(0, len(listed) - cut)]
    got = judge_stage(0, completed, failed, active, shown)
    if not failed and not active:
        assert (got.bad, got.retried) == (0, 0)  # nothing failed: nothing to look at
        return
    wins = Counter(t[1] for t in shown if t[2] == "SUCCESS")
    lost = {t[1] for t in shown if t[2] in ("FAILED", "KILLED")}
    trusted = (
        not active
        and len(shown) >= completed + failed
        and all(t[2] in ("SUCCESS", "FAILED", "KILLED") for t in shown)
        and all(t[3] is None and not t[4] for t in shown if t[2] == "SUCCESS")
        and all(n == 1 for n in wins.values())
        and all(wins[i] == 1 for i in lost)
    )
    assert (got.bad == 0) == trusted, (shown, got.reasons)
    assert got.retried == sum(1 for t in shown if t[2] in ("FAILED", "KILLED"))
    assert got.dead == {t[0] for t in shown if t[2] in ("FAILED", "KILLED")}


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
