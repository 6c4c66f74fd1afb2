"""Optimistic rounds (xorack.spark.optimistic), on real local Spark: a phase that fails nothing
completes in one round acked as one XOR tree and equals plain Spark; anything that goes wrong
in it (a failed row, a row lost by an untracked transform, a task retried while writing a Python
sink) makes it fall back to tracked rounds, and nothing the lost round wrote reaches a sink; a
Spark task retried elsewhere counts once, and the round stands."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, Reason, SQLiteSink, current_round
from xorack.spark.optimistic import RoundAccount

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 300


def _lines(spark, n: int = N):
    rows = [(i, " ".join(f"w{(i * 7 + j) % 13}" for j in range(i % 6)), i % 5) for i in range(n)]
    return spark.createDataFrame(rows, "id long, line string, k int").repartition(3)


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _wordcount(p: Pipeline, lines, stage=None):
    src = p.source(lines, name="lines")
    if stage is not None:
        src = stage(src)
    words = src.select("id", F.explode(F.split("line", " ")).alias("word"))
    words = words.where(F.col("word") != "")
    return words.groupBy("word").agg(F.count("*").alias("n"), F.sum("id").alias("ids"))


def _plain_wordcount(lines):
    words = lines.select("id", F.explode(F.split("line", " ")).alias("word"))
    words = words.where(F.col("word") != "")
    return words.groupBy("word").agg(F.count("*").alias("n"), F.sum("id").alias("ids"))


def _assert_complete(report, n: int = N) -> None:
    assert report.lost == 0
    assert report.source_records == n
    assert report.completed == n
    assert report.dead_lettered == 0
    assert report.replayed == 0


def _assert_fell_back_unbalanced(report, n: int = N) -> None:
    """The round lost rows (its sums do not cancel), fell back, and the tracked rounds
    completed every record."""
    assert report.optimistic_rounds == 0
    assert "do not cancel" in report.optimistic_fallbacks[0]
    assert report.phase_reasons[0] is Reason.UNBALANCED
    assert report.lost == 0
    assert report.source_records == report.completed == n


def _stored(sink: SQLiteSink) -> Counter:
    return Counter(tuple(r) for r in sink.read()[["word", "n", "ids"]].itertuples(index=False))


def _lossy_transform(p, src):
    def lossy(df):  # loses some live rows in round 0 (the optimistic round is round 0 too)
        return df.where((F.col("id") % 11 != 3) | F.lit(p.round > 0))

    return src.transform(lossy, name="lossy")


# ---- a round that fails nothing completes optimistically and equals plain Spark -------------


def test_a_native_wordcount_completes_in_one_optimistic_round(spark, tmp_path):
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(p, _lines(spark)).sink(sink, name="counts")
    report = p.run()
    _assert_complete(report)
    assert report.optimistic_rounds == 1, report.optimistic_fallbacks
    assert report.optimistic_fallbacks == []
    assert report.rounds == 1
    got = _rows(sink.read(spark))
    assert got == _rows(_plain_wordcount(_lines(spark)))
    assert report.sink_rows["counts"] == sum(got.values())
    assert not os.path.exists(sink.staging_dir), "the staging is removed after the publish"


def _upper(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(line=pdf["line"].str.upper())


def _upper_arrow(batch: pa.RecordBatch) -> pa.RecordBatch:
    i = batch.schema.get_field_index("line")
    return batch.set_column(i, "line", pc.utf8_upper(batch.column("line")))


@pytest.mark.parametrize("kind", ["pandas", "arrow"])
def test_python_stages_complete_optimistically(spark, tmp_path, kind):
    def stage(src):
        if kind == "pandas":
            return src.map_in_pandas(_upper, src.schema, name="upper")
        return src.map_in_arrow(_upper_arrow, src.schema, name="upper")

    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(p, _lines(spark), stage).sink(sink, name="counts")
    report = p.run()
    _assert_complete(report)
    assert report.optimistic_rounds == 1, report.optimistic_fallbacks
    plain = _lines(spark).withColumn("line", F.upper("line"))
    assert _rows(sink.read(spark)) == _rows(_plain_wordcount(plain))


@pytest.mark.parametrize("kind", ["pandas", "arrow"])
def test_rows_lost_after_a_stage_that_draws_the_source_ids_make_the_round_fall_back(
    spark, tmp_path, kind
):
    """The source comes into its Python stage untagged (the stage draws the ids and counts the
    births); rows a transform then loses still make the round fall back, and the SQLite sink
    the count's round wrote keeps nothing of it."""
    p = Pipeline(spark)
    sink = SQLiteSink(str(tmp_path / "counts.db"), "counts")

    def stage(src):
        if kind == "pandas":
            upper = src.map_in_pandas(_upper, src.schema, name="upper")
        else:
            upper = src.map_in_arrow(_upper_arrow, src.schema, name="upper")
        return _lossy_transform(p, upper)

    _wordcount(p, _lines(spark), stage).sink(sink, name="counts")
    report = p.run()
    _assert_fell_back_unbalanced(report)
    plain = _rows(_plain_wordcount(_lines(spark).withColumn("line", F.upper("line"))))
    assert _stored(sink) == plain


def test_joins_complete_optimistically(spark, tmp_path):
    """A lookup join (native) and a join of two tracked sources (a barrier), then a stage
    after the join: every phase completes optimistically and equals plain Spark."""
    labels = spark.createDataFrame([(k, f"k{k}") for k in range(4)], "k int, label string")
    extra = spark.createDataFrame([(i, i * 10) for i in range(0, N, 2)], "id long, score long")
    p = Pipeline(spark)
    a = p.source(_lines(spark), name="lines").join(labels, "k", "left")
    b = p.source(extra, name="scores")
    joined = a.join(b, "id", "inner").map_in_pandas(_upper, a.schema.add("score", "long"))
    sink = ParquetSink(str(tmp_path / "out"))
    joined.sink(sink, name="joined")
    report = p.run()
    assert report.lost == 0
    assert report.source_records == N + len(range(0, N, 2))
    assert report.optimistic_rounds == 2, report.optimistic_fallbacks
    want = _lines(spark).join(labels, "k", "left").join(extra, "id", "inner")
    want = want.withColumn("line", F.upper("line"))
    assert _rows(sink.read(spark)) == _rows(want.select(*joined.columns))


# ---- anything wrong falls back to tracked rounds, and leaves nothing behind ------------------


def _fails_some(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = (pdf["id"] % 37 == 0) & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("first attempt", rows=bad.to_numpy())
    return pdf


def _poison(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = pdf["id"] % 101 == 5
    if bad.any():
        raise xorack.FailRecord("poison", rows=bad.to_numpy())
    return pdf


def test_a_failed_row_makes_the_round_fall_back(spark, tmp_path, monkeypatch):
    from xorack.spark import kept

    # 'flaky' reads the source: its rows alone would be kept for a replay round
    # (xorack.spark.kept); the first failure here must cancel the round
    monkeypatch.setattr(kept, "KEEP", False)
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))

    def stage(src):
        flaky = src.map_in_pandas(_fails_some, src.schema, name="flaky")
        return flaky.map_in_pandas(_poison, src.schema, name="poison")

    _wordcount(p, _lines(spark), stage).sink(sink, name="counts")
    report = p.run()
    poisoned = [i for i in range(N) if i % 101 == 5]
    assert report.optimistic_rounds == 0
    assert len(report.optimistic_fallbacks) == 1
    # the first failure cancels the round's jobs (the driver sees the executors' files here)
    assert "failed" in report.optimistic_fallbacks[0]
    assert "flaky" in report.optimistic_fallbacks[0]
    assert report.lost == 0
    assert report.source_records == N
    assert report.dead_lettered == len(poisoned)
    assert report.replayed > 0
    kept = _lines(spark).where(~F.col("id").isin(poisoned))
    assert _rows(sink.read(spark)) == _rows(_plain_wordcount(kept))


def test_rows_lost_by_a_transform_make_the_round_fall_back(spark, tmp_path):
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    words = p.source(_lines(spark), name="lines").select(
        "id", F.explode(F.split("line", " ")).alias("word")
    )

    counted = _lossy_transform(p, words).groupBy("word").agg(F.count("*").alias("n"))
    counted.sink(sink, name="counts")
    report = p.run()
    _assert_fell_back_unbalanced(report)
    assert report.replayed > 0  # the tracked round 0 lost them too (their chunks failed)
    assert report.vanished_rows.get("lossy", 0) > 0
    want = _lines(spark).select("id", F.explode(F.split("line", " ")).alias("word"))
    assert _rows(sink.read(spark)) == _rows(want.groupBy("word").agg(F.count("*").alias("n")))


def test_a_filter_after_a_source_removes_its_rows_as_they_are_tagged(spark, tmp_path):
    """A filter that alone reads a source removes its rows where the source's ids are drawn
    (they are born and acked at once: left out of the births, no ghosts carried on); the
    report still counts every source record, and the round completes."""
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    kept = p.source(_lines(spark), name="lines").where((F.col("id") % 3 == 0) | F.col("k").isNull())
    kept.groupBy("k").agg(F.count("*").alias("n"), F.sum("id").alias("ids")).sink(sink)
    report = p.run()
    _assert_complete(report)
    assert report.optimistic_rounds == 1, report.optimistic_fallbacks
    want = _lines(spark).where((F.col("id") % 3 == 0) | F.col("k").isNull())
    want = want.groupBy("k").agg(F.count("*").alias("n"), F.sum("id").alias("ids"))
    assert _rows(sink.read(spark)) == _rows(want)


def test_rows_lost_after_a_filter_that_reads_a_source_make_the_round_fall_back(spark, tmp_path):
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    kept = p.source(_lines(spark), name="lines").where(F.col("id") % 2 == 1)
    counted = _lossy_transform(p, kept).groupBy("k").agg(F.count("*").alias("n"))
    counted.sink(sink, name="counts")
    report = p.run()
    _assert_fell_back_unbalanced(report)
    want = _lines(spark).where(F.col("id") % 2 == 1).groupBy("k").agg(F.count("*").alias("n"))
    assert _rows(sink.read(spark)) == _rows(want)


def _dies_once(marker: str):
    def stage(pdf: pd.DataFrame) -> pd.DataFrame:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(13)  # the Python worker dies mid-task; Spark retries the task
        return pdf

    return stage


def test_a_retried_spark_task_counts_once_and_the_round_is_kept(spark, tmp_path):
    """A task whose Python worker dies is retried by Spark, and the job succeeds. Spark
    merges no accumulator update or observed metric of the failed attempt, and never commits
    its output: the retry counted once, and the round stands (xorack.spark.tasks)."""
    marker = str(tmp_path / "died")
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(
        p, _lines(spark), lambda s: s.map_in_pandas(_dies_once(marker), s.schema, name="dies")
    ).sink(sink, name="counts")
    report = p.run()
    assert os.path.exists(marker), "the worker did not die: nothing was retried"
    assert report.optimistic_fallbacks == []
    assert report.optimistic_rounds >= 1
    assert report.retried_tasks == 1
    assert report.tracked_phases == []
    _assert_complete(report)
    assert _rows(sink.read(spark)) == _rows(_plain_wordcount(_lines(spark)))


def test_a_retried_task_in_a_round_of_native_operations_only(spark, tmp_path):
    """A phase of Spark's own operations only draws no ids: what its round checks is Spark's
    task accounting. A Python UDF inside a native ``withColumn`` kills its worker once: Spark
    retries the task, the job succeeds, and the round stands (the failed attempt wrote and
    counted nothing)."""
    marker = str(tmp_path / "died")

    def dies_once(i):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(13)  # the Python worker dies mid-task; Spark retries the task
        return i * 2

    twice = F.udf(dies_once, "long")
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    src = p.source(_lines(spark), name="lines").withColumn("twice", twice("id"))
    src.groupBy("k").agg(F.sum("twice").alias("s"), F.count("*").alias("n")).sink(sink)
    assert (
        p.explain()
        .splitlines()[1]
        .startswith("phase 0: an optimistic round of Spark's own operations only")
    )
    report = p.run()
    assert os.path.exists(marker), "the worker did not die: nothing was retried"
    assert report.optimistic_rounds == 1
    assert report.retried_tasks == 1
    assert report.phase_reasons == {}
    _assert_complete(report)
    want = _lines(spark).groupBy("k").agg((F.sum("id") * 2).alias("s"), F.count("*").alias("n"))
    assert _rows(sink.read(spark)) == _rows(want)


def _fails_after_the_count(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = (pdf["word"] == "w3") & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("after the count", rows=bad.to_numpy())
    return pdf


def test_a_later_phase_falls_back_alone(spark, tmp_path):
    """The count completes optimistically; the stage after it fails a row, so its phase runs
    tracked rounds over the count's rows (read from the optimistic round's output)."""
    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    counts = _wordcount(p, _lines(spark))
    after = counts.map_in_pandas(_fails_after_the_count, counts.schema, name="after")
    after.sink(sink, name="counts")
    report = p.run()
    assert report.optimistic_rounds == 1
    assert len(report.optimistic_fallbacks) == 1
    assert report.optimistic_fallbacks[0].startswith("phase 1:")
    assert report.lost == 0
    assert report.source_records == report.completed == N
    assert report.replayed == 1  # the count of w3, replayed in phase 1
    assert report.derived_records == report.sink_rows["counts"] > 0
    assert _rows(sink.read(spark)) == _rows(_plain_wordcount(_lines(spark)))


def test_an_aggregate_read_by_a_python_sink_is_written_by_its_optimistic_round(spark, tmp_path):
    """The count's round writes the counts into the SQLite sink itself (as plain Spark would):
    no second phase, no Parquet in between."""
    p = Pipeline(spark)
    sink = SQLiteSink(str(tmp_path / "counts.db"), "counts")
    _wordcount(p, _lines(spark)).sink(sink, name="counts")
    report = p.run()
    assert report.optimistic_rounds == report.rounds == 1
    assert report.optimistic_fallbacks == report.tracked_phases == []
    _assert_complete(report)
    want = _rows(_plain_wordcount(_lines(spark)))
    assert report.derived_records == report.sink_rows["counts"] == sum(want.values())
    assert report.sink_duplicates["counts"] == report.retracted_rows == 0
    assert _stored(sink) == want


def test_a_python_sink_that_does_not_read_an_aggregate_runs_tracked_rounds(spark, tmp_path):
    p = Pipeline(spark)
    sink = SQLiteSink(str(tmp_path / "words.db"), "words")
    src = p.source(_lines(spark), name="lines")
    src.select("id", F.explode(F.split("line", " ")).alias("word")).sink(sink, name="words")
    report = p.run()
    assert report.optimistic_rounds == 0
    assert report.tracked_phases == ["phase 0: sink 'words' is written from Python"]
    assert report.phase_reasons == {0: Reason.PYTHON_SINK}
    _assert_complete(report)
    want = _lines(spark).select("id", F.explode(F.split("line", " ")).alias("word"))
    assert Counter(map(tuple, sink.read()[["id", "word"]].itertuples(index=False))) == _rows(want)


@pytest.mark.parametrize("failure", ["lost rows", "retried task"])
def test_a_python_sink_keeps_nothing_of_an_optimistic_round_that_falls_back(
    spark, tmp_path, failure
):
    """The round writes its counts into the SQLite sink, then falls back (wrong counts from
    rows a transform lost, or a Spark task retried): its rows are retracted before the tracked
    rounds write theirs, so the table holds the right counts, each once."""
    marker = str(tmp_path / "died")
    p = Pipeline(spark)
    sink = SQLiteSink(str(tmp_path / "counts.db"), "counts")
    if failure == "lost rows":
        stage = lambda s: _lossy_transform(p, s)  # noqa: E731
    else:
        stage = lambda s: s.map_in_pandas(_dies_once(marker), s.schema, name="dies")  # noqa: E731
    _wordcount(p, _lines(spark), stage).sink(sink, name="counts")
    report = p.run()
    assert report.optimistic_rounds == 0
    assert len(report.optimistic_fallbacks) == 1
    assert ("do not cancel" if failure == "lost rows" else "Python sink") in (
        report.optimistic_fallbacks[0]
    )
    assert report.tracked_phases == ["phase 1: sink 'counts' is written from Python"]
    if failure == "retried task":
        _assert_complete(report)
    assert report.lost == 0
    assert report.completed == N
    want = _rows(_plain_wordcount(_lines(spark)))
    assert report.retracted_rows >= len(want)  # the round's rows (one per word), taken back
    assert report.sink_duplicates["counts"] == 0
    assert _stored(sink) == want


class _FailsFirstWrite(SQLiteSink):
    """A SQLite sink whose writes of round 0 raise (a database that refuses them once)."""

    def open_writer(self, partition: int):
        writer = super().open_writer(partition)
        write = writer.write

        def failing(rows, rec, src=None, reown=True):
            if current_round() == 0:
                raise OSError("the database is unavailable")
            return write(rows, rec, src=src, reown=reown)

        writer.write = failing
        return writer


def test_a_python_sink_in_a_phase_that_stages_partials_keeps_its_tracked_ids(spark, tmp_path):
    """The counts' phase also feeds a combining aggregate, so its tracked rounds draw the counts'
    ids by position: the count's round then leaves the SQLite sink to them (the ids would
    differ), and runs of either kind into one table still absorb each other's rows."""
    path = str(tmp_path / "counts.db")
    reports = []
    for optimistic in (True, False, True):
        p = Pipeline(spark, optimistic=optimistic)
        _wordcount(p, _lines(spark)).sink(SQLiteSink(path, "counts"), name="counts")
        per_k = p.source(_keyed(spark), name="keyed").groupBy("k").agg(F.count("*").alias("n"))
        per_k.groupBy("n").count().sink(
            ParquetSink(str(tmp_path / f"sizes-{len(reports)}")), name="sizes"
        )
        reports.append(p.run())
    assert reports[0].tracked_phases == ["phase 1: sink 'counts' is written from Python"]
    want = _rows(_plain_wordcount(_lines(spark)))
    assert _stored(SQLiteSink(path, "counts")) == want
    assert [r.sink_duplicates["counts"] for r in reports] == [0, len(want), len(want)]


class _OldWriterSink(SQLiteSink):
    """A sink of an earlier release: its writer's write takes no ``reown=``."""

    def open_writer(self, partition: int):
        writer = super().open_writer(partition)
        write = writer.write

        def old_write(rows, rec, src=None):
            return write(rows, rec, src=src)

        writer.write = old_write
        return writer


@pytest.mark.parametrize(
    ("sink_class", "reason", "replays"),
    [
        (_OldWriterSink, "takes no reown=", False),  # the tracked rounds write it as before
        (_FailsFirstWrite, "the database is unavailable", True),  # fails round 0 there too
    ],
)
def test_a_python_sink_that_fails_the_rounds_write_makes_it_fall_back(
    spark, tmp_path, sink_class, reason, replays
):
    p = Pipeline(spark)
    sink = sink_class(str(tmp_path / "counts.db"), "counts")
    _wordcount(p, _lines(spark)).sink(sink, name="counts")
    report = p.run()
    assert report.optimistic_rounds == 0
    assert reason in report.optimistic_fallbacks[0]
    assert report.lost == 0
    assert report.completed == N
    assert report.derived_records > 0
    assert (report.replayed > 0) == replays  # the counts, replayed once
    assert _stored(sink) == _rows(_plain_wordcount(_lines(spark)))


def test_optimistic_false_runs_tracked_rounds_only(spark, tmp_path):
    p = Pipeline(spark, optimistic=False)
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(p, _lines(spark)).sink(sink, name="counts")
    report = p.run()
    assert report.optimistic_rounds == 0
    assert report.optimistic_fallbacks == []
    _assert_complete(report)
    assert _rows(sink.read(spark)) == _rows(_plain_wordcount(_lines(spark)))


# ---- shapes a round must leave to the tracked rounds, or run with care -----------------------


def _both(spark, tmp_path, build, optimistic: bool):
    """``build(p) -> {sink name: Tracked}`` run with FT on (``optimistic``) and with FT off
    (plain Spark); returns (report, {name: rows with FT on}, {name: rows with FT off})."""
    got = {}
    report = None
    for ft in (True, False):
        p = Pipeline(spark, ft=ft, optimistic=optimistic)
        sinks = {}
        for name, t in build(p).items():
            sinks[name] = ParquetSink(str(tmp_path / f"{name}-{ft}-{optimistic}"))
            t.sink(sinks[name], name=name)
        r = p.run()
        report = r if ft else report
        got[ft] = {
            name: Counter(repr(tuple(r)) for r in s.read(spark).collect())
            for name, s in sinks.items()
        }
    return report, got[True], got[False]


def _keyed(spark, n: int = 200):
    rows = [(i, i % 7, f"s{i % 11}") for i in range(n)]
    return spark.createDataFrame(rows, "id long, k int, s string").repartition(3)


@pytest.mark.parametrize("optimistic", [True, False])
def test_a_join_with_an_aggregate_of_another_source_meets_every_row(spark, tmp_path, optimistic):
    """One side of the join comes straight from a source (phase 0), the other out of an
    aggregation (phase 1): its rows must wait for the other side across phases. An optimistic
    round left the first side's rows unread (it hung waiting for their metrics, or joined them
    with nothing); those phases run tracked rounds."""

    def build(p):
        a = p.source(_keyed(spark).select("k", "id"), name="a")
        b = p.source(_keyed(spark).select("k", "s"), name="b")
        return {"j": a.join(b.groupBy("k").agg(F.count("*").alias("n")), "k")}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["j"].values()) == 200
    assert on == off
    assert report.lost == 0
    assert report.source_records == 400
    if optimistic:
        assert report.tracked_phases, "the phases say why they ran tracked rounds"
        assert all("meets rows of two phases" in why for why in report.tracked_phases)


@pytest.mark.parametrize("optimistic", [True, False])
def test_a_union_of_a_source_and_an_aggregate_reaches_its_sink_whole(spark, tmp_path, optimistic):
    """The sink gets rows in phase 0 (the source's) and in phase 1 (the aggregate's): each
    phase's rows must be published, none overwritten by the other's."""

    def build(p):
        a = p.source(_keyed(spark).select("k", F.col("id").alias("n")), name="a")
        b = p.source(_keyed(spark).select("k", "id"), name="b")
        return {"u": a.union(b.groupBy("k").agg(F.sum("id").alias("n")))}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["u"].values()) == 207
    assert on == off
    assert report.lost == 0
    assert report.source_records == 400


def _ghosts_then_cast(p):
    """Every fifth row has an empty array (it generates nothing: a ghost) and a value an ANSI
    cast refuses; plain Spark drops that row before the aggregate casts."""
    spark = p.spark
    rows = [
        (i, "x" if i % 5 == 0 else str(i), [] if i % 5 == 0 else [i, i + 1]) for i in range(100)
    ]
    df = spark.createDataFrame(rows, "id long, v string, a array<int>").repartition(2)
    ex = p.source(df, name="src").select("id", "v", F.explode("a").alias("e"))
    return {
        "g": ex.groupBy("id").agg(F.sum(F.col("v").cast("int")).alias("t")),  # combined
        "c": ex.groupBy("id").agg(
            F.sort_array(F.collect_set(F.col("v").cast("int"))).alias("t")
        ),  # staged
        "w": ex.withColumn("t", F.col("v").cast("int")),  # a later native operator
    }


@pytest.mark.parametrize("optimistic", [True, False])
def test_a_generators_ghost_rows_are_never_evaluated(spark, tmp_path, optimistic):
    report, on, off = _both(spark, tmp_path, _ghosts_then_cast, optimistic)
    assert sum(off["g"].values()) == 80
    assert on == off
    assert report.lost == 0
    assert report.source_records == 100
    assert report.dead_lettered == 0


@pytest.mark.parametrize("native", [True, False], ids=["native_only", "with_ids"])
@pytest.mark.parametrize("optimistic", [True, False])
def test_an_aggregate_over_star_sees_the_payload_only(
    spark, tmp_path, optimistic, native, monkeypatch
):
    """``struct("*")`` inside an aggregate expands to the payload columns, as in plain Spark,
    never to the lineage columns beside them (an optimistic round with record ids aggregates
    the tracked rows themselves: that phase runs tracked rounds; a phase of Spark's own
    operations only carries no lineage columns: its round aggregates the payload)."""
    from xorack.spark import optimistic_round

    monkeypatch.setattr(optimistic_round, "NATIVE_PHASES", native)

    def build(p):
        src = p.source(_keyed(spark).select("k", "id"), name="src")
        rows = F.sort_array(F.collect_list(F.struct("*")))
        return {"g": src.groupBy("k").agg(rows.alias("rows"))}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["g"].values()) == 7
    assert on == off
    if optimistic and native:
        assert report.optimistic_rounds == 1
        assert report.tracked_phases == []
    elif optimistic:
        assert report.tracked_phases == ["phase 0: the aggregate 'aggregate' reads `*`"]
        assert report.phase_reasons == {0: Reason.AGGREGATE_READS_STAR}


@pytest.mark.parametrize("optimistic", [True, False])
def test_aggregate_outputs_named_with_a_dot(spark, tmp_path, optimistic):
    def build(p):
        src = p.source(_keyed(spark).select("k", "id"), name="src")
        return {"g": src.groupBy("k").agg(F.sum("id").alias("a.b"), F.avg("id"))}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["g"].values()) == 7
    assert on == off
    assert report.optimistic_rounds == int(optimistic)


def _removed_then_checked(p):
    """Rows a filter (or an empty explode) removes are still in a tracked frame as ghosts; an
    expression that refuses them (raise_error, an ANSI cast) must never see them, as in Spark."""
    spark = p.spark
    rows = [(i, i % 7, None if i % 5 == 0 else f"s{i % 11}") for i in range(200)]
    df = spark.createDataFrame(rows, "id long, k int, s string").repartition(2)
    src = p.source(df, name="src").filter(F.col("s").isNotNull())
    refuse = F.when(F.col("s").isNull(), F.raise_error(F.lit("a removed row was evaluated")))
    checked = refuse.otherwise(F.col("s"))
    ex = src.select("id", checked.alias("c"), F.explode(F.array("k", "k")).alias("e"))
    return {
        "w": src.withColumn("c", checked),
        "f": src.filter(checked.startswith("s1")),
        "fs": src.filter("CASE WHEN s IS NULL THEN raise_error('removed') ELSE true END"),
        "x": ex.groupBy("c").agg(F.count("*").alias("n")),
        "sel": src.select(F.col("*"), F.length(checked).alias("n")),
    }


@pytest.mark.parametrize("optimistic", [True, False])
def test_removed_rows_are_never_evaluated_by_later_expressions(spark, tmp_path, optimistic):
    report, on, off = _both(spark, tmp_path, _removed_then_checked, optimistic)
    assert sum(off["w"].values()) == 160
    assert on == off
    assert report.lost == 0
    assert report.dead_lettered == 0


def test_a_star_inside_an_expression_is_refused_with_a_clear_error(spark):
    from xorack.spark import TrackedOperationError

    p = Pipeline(spark)
    src = p.source(_keyed(spark), name="src")
    with pytest.raises(TrackedOperationError, match=r"has a `\*` inside it.*lineage columns"):
        src.withColumn("j", F.to_json(F.struct("*")))
    with pytest.raises(TrackedOperationError, match=r"filter: .*hash"):
        src.filter(F.hash("*") % 2 == 0)
    with pytest.raises(TrackedOperationError, match=r"filter: "):
        src.filter("xxhash64(*) % 2 = 0")
    with pytest.raises(TrackedOperationError, match=r"select: "):
        src.select("id", F.concat_ws("|", F.col("*")).alias("all"))
    # what reads no lineage stays allowed: a top-level star, count(*), a product
    src.select(F.col("*")).filter("id * 2 > 10").groupBy("k").agg(F.count("*").alias("n"))


def test_a_window_function_is_refused_with_a_clear_error(spark, tmp_path):
    """A window reads other rows (of other records; removed rows would count): refused, as is
    an aggregate in a select (a global aggregate). The same job with FT off runs as plain
    Spark."""
    from pyspark.sql import Window

    from xorack.spark import TrackedOperationError

    rank = F.row_number().over(Window.partitionBy("k").orderBy("id"))
    p = Pipeline(spark)
    src = p.source(_keyed(spark), name="src")
    with pytest.raises(TrackedOperationError, match=r"withColumn: .*window function.*groupBy"):
        src.withColumn("r", rank)
    with pytest.raises(TrackedOperationError, match=r"select: .*window function"):
        src.select("id", F.expr("count(1) OVER (PARTITION BY k)").alias("n"))
    with pytest.raises(TrackedOperationError, match=r"without groupBy.*t\.agg\(\.\.\.\)"):
        src.select(F.sum("id").alias("total"))  # a global aggregate
    off = Pipeline(spark, ft=False)
    sink = ParquetSink(str(tmp_path / "off"))
    off.source(_keyed(spark), name="src").withColumn("r", rank).sink(sink, name="o")
    off.run()
    assert sink.read(spark).count() == 200


@pytest.mark.parametrize("native", [True, False], ids=["native_only", "with_ids"])
@pytest.mark.parametrize("optimistic", [True, False])
def test_an_aggregate_of_expressions_over_star_runs_tracked_rounds(
    spark, tmp_path, optimistic, native, monkeypatch
):
    """With record ids its round would read the lineage columns: tracked rounds; a phase of
    Spark's own operations only reads the payload alone in its round."""
    from xorack.spark import optimistic_round

    monkeypatch.setattr(optimistic_round, "NATIVE_PHASES", native)

    def build(p):
        src = p.source(_keyed(spark).select("k", "id"), name="src")
        rows = F.sort_array(F.collect_list(F.to_json(F.struct("*"))))
        return {"g": src.groupBy("k").agg(rows.alias("rows"), F.sum(F.hash("*")).alias("h"))}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["g"].values()) == 7
    assert on == off
    assert report.optimistic_rounds == int(optimistic and native)


@pytest.mark.parametrize("optimistic", [True, False])
@pytest.mark.parametrize("how", ["filter", "left", "inner", "left_semi"])
def test_columns_named_with_a_dot_through_sources_and_lookup_joins(
    spark, tmp_path, optimistic, how
):
    """Names with a dot or a backtick are column names, never paths into a struct: through a
    keyed source (its tagger), a filter and lookup joins on such a key. (Python stages and
    branch points read their input by name as PySpark's mapInPandas does, which fails on such
    names in plain Spark too.)"""

    def build(p):
        rows = [(i, i % 3, f"v{i}") for i in range(60)]
        df = spark.createDataFrame(rows, "id long, `x.y` int, `q``r` string").repartition(2)
        src = p.source(df, name="src", keys=["x.y"])
        if how == "filter":
            return {"o": src.filter(F.col("id") > 3)}
        lookup = spark.createDataFrame([(0, "z"), (1, "o")], "`x.y` int, l string")
        return {"o": src.join(lookup, "x.y", how)}

    report, on, off = _both(spark, tmp_path, build, optimistic)
    assert sum(off["o"].values()) == {"filter": 56, "left": 60}.get(how, 40)
    assert on == off
    assert report.lost == 0


def test_an_empty_source_completes_with_empty_sinks(spark, tmp_path):
    def build(p):
        src = p.source(spark.createDataFrame([], "k int, v long"), name="src")
        return {"g": src.groupBy("k").agg(F.sum("v").alias("t")), "f": src.filter("v > 0")}

    report, on, off = _both(spark, tmp_path, build, True)
    assert on == off == {"g": Counter(), "f": Counter()}
    assert report.source_records == 0
    assert report.lost == 0


def test_a_sink_in_error_mode_refuses_an_existing_path(spark, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    p = Pipeline(spark)
    _wordcount(p, _lines(spark)).sink(ParquetSink(str(out), mode="error"), name="counts")
    with pytest.raises(FileExistsError, match="already exists"):
        p.run()


# ---- the verdict -----------------------------------------------------------------------------


def test_the_verdict_of_a_round():
    ok = RoundAccount(records=3, births=0b1011, staged=0b0011, python=0b1000)
    assert ok.verdict() is None
    cases = [
        (RoundAccount(records=3, births=1, staged=0), Reason.UNBALANCED, "do not cancel"),
        (RoundAccount(task_failures=1), Reason.TASK_FAILED, "task accounting"),
        (
            RoundAccount(failed_rows=2, reasons=["stage 's': boom (2)"]),
            Reason.ROW_FAILED,
            "row(s) failed",
        ),
        (RoundAccount(missing=["source 'lines'"]), Reason.METRICS_MISSING, "no metrics"),
    ]
    for account, reason, words in cases:
        got, detail = account.verdict()
        assert got is reason
        assert got.fell_back
        assert words in detail
    # XOR in 64 bits: Spark's signed longs and Python's unsigned ints of the same bits cancel
    assert RoundAccount(births=-1, staged=(1 << 64) - 1).verdict() is None


def test_a_second_run_into_the_same_sqlite_sink_is_absorbed_whichever_path_it_takes(
    spark, tmp_path
):
    """The counts of a run with tracked rounds only, then of an optimistic run, into one
    SQLite table: the second run re-creates the record ids of the first (a barrier output's
    ids do not depend on how many partitions it goes on in), so the table holds each count
    once."""
    path = str(tmp_path / "counts.db")
    reports = []
    for optimistic in (False, True, False):
        p = Pipeline(spark, optimistic=optimistic)
        _wordcount(p, _lines(spark)).sink(SQLiteSink(path, "counts"), name="counts")
        reports.append(p.run())
    assert [r.optimistic_rounds for r in reports] == [0, 1, 0]
    stored = SQLiteSink(path, "counts").read()
    want = _rows(_plain_wordcount(_lines(spark)))
    assert len(stored) == sum(want.values())
    assert _stored(SQLiteSink(path, "counts")) == want
    # the optimistic run wrote the counts itself, with the tracked rounds' record ids
    assert reports[1].sink_duplicates["counts"] == len(stored)
    assert reports[2].sink_duplicates["counts"] == len(stored)


# ---- property-style: random pipelines that fail nothing complete optimistically ---------------

from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.pipelines import random_pipeline  # noqa: E402

#: OPS of the shared generator: all of them (failing nothing).
_OPS = ("filter", "explode", "inner", "left", "semi", "anti", "with", "pandas", "arrow", "union")


def _same(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf[pdf["id"] % 7 != 3]  # a pandas stage that drops some rows (acked as dropped)


def _same_arrow(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.filter(pc.not_equal(pc.bit_wise_and(batch.column("id"), 3), 1))


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # a Spark run per example: no shrinking
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(st.sampled_from(_OPS), min_size=1, max_size=5),
    agg=st.integers(0, 2),
    native=st.booleans(),
)
@example(ops=["explode", "filter", "pandas"], agg=2, native=True)
@example(ops=["union", "explode", "inner", "arrow"], agg=2, native=True)
@example(ops=["pandas", "explode", "left", "with"], agg=1, native=True)
@example(ops=["explode", "semi", "filter", "anti"], agg=0, native=True)
@example(ops=["explode", "semi", "filter", "anti"], agg=0, native=False)
@example(ops=["union", "explode", "inner", "with"], agg=2, native=False)
def test_random_pipelines_complete_optimistically_and_equal_plain_spark(
    spark, tmp_path_factory, ops, agg, native
):
    """``native``: a phase of Spark's own operations only runs without record ids (the
    default), else with them, as a phase holding a Python stage or sink does."""
    from xorack.spark import optimistic_round

    saved = optimistic_round.NATIVE_PHASES
    optimistic_round.NATIVE_PHASES = native
    try:
        _random_pipeline_run(spark, tmp_path_factory, ops, agg)
    finally:
        optimistic_round.NATIVE_PHASES = saved


def _random_pipeline_run(spark, tmp_path_factory, ops, agg) -> None:
    tmp = tmp_path_factory.mktemp("random")
    lookup = spark.createDataFrame(
        [(1, "one"), (1, "uno"), (2, "two"), (4, "four")], "k int, label string"
    )
    extra = spark.createDataFrame(
        [(1000 + i, "x y", i % 5) for i in range(20)], "id long, line string, k int"
    )
    outputs = []
    for ft in (True, False):
        p = Pipeline(spark, ft=ft)
        src = p.source(_lines(spark), name="lines")
        other = lambda p=p: p.source(extra, name="extra")  # noqa: E731
        out = random_pipeline(
            src,
            ops,
            agg,
            lookup,
            shift=lambda i: ("k", (F.col("k") + i) % 5),
            total="id",
            pandas=_same,
            arrow=_same_arrow,
            other=other,
        )
        sink = ParquetSink(str(tmp / f"out-{ft}"))
        out.sink(sink, name="out")
        report = p.run()
        outputs.append(_rows(sink.read(spark)))
        if ft:
            assert report.lost == 0
            assert report.optimistic_fallbacks == [], report.optimistic_fallbacks
            assert report.optimistic_rounds >= 1
            records = N + (len(extra.collect()) if "union" in ops[:1] else 0)
            assert report.source_records == report.completed == records
    assert outputs[0] == outputs[1]


# ---- explain(): how each phase will run, before it runs ---------------------------------------


def _heads(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("phase ")]


@pytest.mark.parametrize(
    ("sink_kind", "phase1"),
    [
        (
            "parquet",
            "phase 1: no rounds of its own: the barrier's output goes straight to its native sinks",
        ),
        (
            "sqlite",
            "phase 1: written into its sink by phase 0's optimistic round (tracked "
            "rounds [python_sink] if that round falls back)",
        ),
    ],
)
def test_explain_says_how_each_phase_runs_and_the_run_does_so(spark, tmp_path, sink_kind, phase1):
    p = Pipeline(spark)
    if sink_kind == "parquet":
        sink = ParquetSink(str(tmp_path / "out"))
    else:
        sink = SQLiteSink(str(tmp_path / "counts.db"), "counts")
    _wordcount(p, _lines(spark)).sink(sink, name="counts")
    text = p.explain()
    phase0 = (  # a count written into a Python sink by the round needs record ids
        "phase 0: an optimistic round of Spark's own operations only (no record ids: its "
        "sources' rows counted, Spark's task accounting checked; tracked rounds if it falls back)"
        if sink_kind == "parquet"
        else "phase 0: an optimistic round (tracked rounds if it falls back)"
    )
    assert _heads(text) == [phase0, phase1]
    assert "lineage: 1 → 0..1 (a removed row is acked as dropped)" in text
    report = p.run()
    assert report.optimistic_rounds == 1
    assert report.tracked_phases == report.optimistic_fallbacks == []
    assert report.phase_reasons == {}


def test_explain_gives_the_typed_reason_the_run_reports(spark, tmp_path):
    p = Pipeline(spark)
    words = p.source(_lines(spark), name="lines").select("id", "line")
    words.sink(SQLiteSink(str(tmp_path / "a.db"), "a"), name="a")
    words.sink(SQLiteSink(str(tmp_path / "b.db"), "b"), name="b")
    assert _heads(p.explain()) == [
        "phase 0: tracked rounds [python_sink] sink 'a' is written from Python"
    ]
    report = p.run()
    assert report.phase_reasons == {0: Reason.PYTHON_SINK}
    assert report.tracked_phases == ["phase 0: sink 'a' is written from Python"]
    _assert_complete(report)


def test_explain_of_a_plan_with_ft_off_is_plain_sparks(spark, tmp_path):
    p = Pipeline(spark, ft=False)
    _wordcount(p, _lines(spark)).sink(ParquetSink(str(tmp_path / "out")))
    text = p.explain()
    assert text.splitlines()[0] == "xorack plan, FT off (plain Spark's plan)"
    assert _heads(text) == ["phase 0", "phase 1"]


def test_a_tracked_frame_says_what_it_offers_instead_of_a_bare_attribute_error(spark):
    p = Pipeline(spark)
    words = p.source(_lines(spark), name="lines")
    with pytest.raises(AttributeError, match=r"Tracked.writeTo is not supported.*sink"):
        words.writeTo("t")
    assert "phase 0" in words.explain()


def _tag(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(word=pdf["word"].str.upper())


@pytest.mark.parametrize("in_jvm", [True, False])
def test_ghosts_before_a_python_stage_are_dropped_in_the_jvm(spark, tmp_path, in_jvm, monkeypatch):
    """A generator (lines with no word give no row) and a filter remove rows before a pandas
    stage: the round drops those ghosts in the JVM, what they owe XORed by an observation, so
    the stage's worker never receives them (``in_jvm=False``: the worker drops them, as
    before). The round completes alone and equals plain Spark either way; leaving the
    observation out of the sum would unbalance it (checked by mutation)."""
    from xorack.spark import optimistic_round

    monkeypatch.setattr(optimistic_round, "GHOSTS_BEFORE_STAGES", in_jvm)

    def words(t):
        t = t.select("id", F.explode(F.split("line", " ")).alias("word"))
        return t.where((F.col("word") != "") & (F.col("id") % 4 != 1))

    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    staged = words(p.source(_lines(spark), name="lines"))
    staged = staged.map_in_pandas(_tag, staged.schema, name="tag")
    staged.groupBy("word").agg(F.count("*").alias("n")).sink(sink, name="counts")
    report = p.run()
    _assert_complete(report)
    assert (report.optimistic_rounds, report.rounds) == (1, 1), report.optimistic_fallbacks
    plain = words(_lines(spark)).withColumn("word", F.upper("word"))
    assert _rows(sink.read(spark)) == _rows(plain.groupBy("word").agg(F.count("*").alias("n")))
