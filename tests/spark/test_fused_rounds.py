"""Fused optimistic rounds (``OptimisticRound._fuse``), on real local Spark: a phase that reads
only barrier outputs of the phase before runs in that phase's optimistic round, the same Spark
job, as plain Spark runs the query; the result equals plain Spark's. A fused round that falls
back runs its phases again a round each, and loses nothing."""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, Reason, current_round, kept
from xorack.spark import optimistic_round as rounds

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 400


def _orders(spark):
    rows = [(i, i % 7, float(i % 13) + 0.5) for i in range(N)]
    return spark.createDataFrame(rows, "id long, k int, price double").repartition(3)


def _scores(spark):
    rows = [(i, i * 3) for i in range(0, N, 2)]
    return spark.createDataFrame(rows, "id long, score long").repartition(2)


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _query(orders, scores):
    """A join of two frames, a row operation after it, an aggregate: three phases with FT on
    (the join's, the aggregate's, the sink's straight write), one Spark job in plain Spark."""
    joined = orders.join(scores, "id", "inner").withColumn("value", F.col("price") * F.col("score"))
    return joined.groupBy("k").agg(F.count("*").alias("n"), F.sum("value").alias("total"))


def _bump(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(score=pdf["score"] + 1)


def _bump_flaky(pdf: pd.DataFrame) -> pd.DataFrame:
    """Fails the joined rows of every 9th id on their first attempt (an optimistic round is
    attempt 0)."""
    bad = (pdf["id"] % 9 == 0) & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("first attempt", rows=bad.to_numpy())
    return _bump(pdf)


def _run(spark, tmp_path, stage=None):
    p = Pipeline(spark)
    joined = p.source(_orders(spark), name="orders").join(
        p.source(_scores(spark), name="scores"), "id", "inner"
    )
    if stage is not None:  # a pandas stage after the join: the second phase's
        joined = joined.map_in_pandas(stage, joined.schema, name="bump")
    out = joined.withColumn("value", F.col("price") * F.col("score"))
    out = out.groupBy("k").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
    sink = ParquetSink(str(tmp_path / "out"))
    out.sink(sink, name="totals")
    return p, sink


def _plain(spark, bumped: bool):
    scores = _scores(spark)
    if bumped:
        scores = scores.withColumn("score", F.col("score") + 1)
    return _query(_orders(spark), scores)


def _complete(report) -> None:
    assert report.lost == 0
    assert report.source_records == N + N // 2
    assert report.completed == N + N // 2
    assert report.dead_lettered == 0


def test_a_join_then_an_aggregate_run_as_one_round_equal_to_plain_spark(spark, tmp_path):
    p, sink = _run(spark, tmp_path, _bump)
    heads = [line for line in p.explain().splitlines() if line.startswith("phase ")]
    assert heads[1].startswith("phase 1: in phase 0's optimistic round, the same Spark job")
    report = p.run()
    _complete(report)
    assert report.optimistic_rounds == 2, report.optimistic_fallbacks
    assert report.fused_phases == 1
    assert report.fused_fallbacks == 0
    assert report.phase_reasons == {}
    assert _rows(sink.read(spark)) == _rows(_plain(spark, bumped=True))


def test_the_same_query_unfused_gives_the_same_rows_and_counts(spark, tmp_path, monkeypatch):
    fused_p, fused_sink = _run(spark, tmp_path / "a", _bump)
    fused = fused_p.run()
    monkeypatch.setattr(rounds, "FUSE", False)
    p, sink = _run(spark, tmp_path / "b", _bump)
    assert "in phase 0's optimistic round" not in p.explain()
    report = p.run()
    assert report.fused_phases == 0
    assert report.optimistic_rounds == fused.optimistic_rounds == 2
    for key in ("source_records", "completed", "derived_records", "lost", "dead_lettered"):
        assert getattr(report, key) == getattr(fused, key), key
    assert _rows(sink.read(spark)) == _rows(fused_sink.read(spark))


def test_a_row_failing_in_the_fused_phase_reruns_the_phases_a_round_each(spark, tmp_path):
    """The stage after the join fails rows on their first attempt: the fused round falls back
    (which phase failed is not known), phase 0 completes in a round of its own, phase 1's
    round falls back as it would unfused, and its tracked rounds replay the failed rows."""
    p, sink = _run(spark, tmp_path, _bump_flaky)
    report = p.run()
    _complete(report)
    assert report.fused_fallbacks == 1
    assert report.fused_phases == 0
    assert report.optimistic_rounds == 1
    assert report.phase_reasons == {1: Reason.ROW_FAILED}
    assert report.replayed > 0
    assert _rows(sink.read(spark)) == _rows(_plain(spark, bumped=True))


def test_a_barrier_output_read_twice_is_not_fused(spark, tmp_path):
    """An aggregate's output read by two branches (a branch point of the next phase) is
    written and read back, as before: its rows would be computed once per reader."""
    p = Pipeline(spark)
    totals = p.source(_orders(spark), name="orders").groupBy("k").agg(F.count("*").alias("n"))
    a = ParquetSink(str(tmp_path / "a"))
    b = ParquetSink(str(tmp_path / "b"))
    totals.withColumn("twice", F.col("n") * 2).sink(a, name="a")
    totals.where(F.col("k") > 2).sink(b, name="b")
    report = p.run()
    assert report.lost == 0
    assert report.fused_phases == 0
    plain = _orders(spark).groupBy("k").agg(F.count("*").alias("n"))
    assert _rows(a.read(spark)) == _rows(plain.withColumn("twice", F.col("n") * 2))
    assert _rows(b.read(spark)) == _rows(plain.where(F.col("k") > 2))


def _flaky_orders(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = (pdf["id"] % 11 == 0) & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("first attempt", rows=bad.to_numpy())
    return pdf


def test_a_row_failing_in_the_first_phase_sends_it_to_tracked_rounds_at_once(
    spark, tmp_path, monkeypatch
):
    """The first row that failed is a stage's of the round's own phase: that phase's round
    would fail it again, so it goes to tracked rounds without one (two rounds executed in
    all: the fused one, then phase 1's own after phase 0's tracked rounds)."""
    executed = []
    real = rounds.OptimisticRound._execute

    def counted(self):
        executed.append(tuple(self.phases))
        return real(self)

    monkeypatch.setattr(rounds.OptimisticRound, "_execute", counted)
    # the stage reads a source and the aggregate merges: the round would keep its work
    # (xorack.spark.kept, tested there); this is the path of a shape that cannot
    monkeypatch.setattr(kept, "KEEP", False)
    p = Pipeline(spark)
    orders = p.source(_orders(spark), name="orders")
    orders = orders.map_in_pandas(_flaky_orders, orders.schema, name="flaky")
    joined = orders.join(p.source(_scores(spark), name="scores"), "id", "inner")
    out = joined.withColumn("value", F.col("price") * F.col("score"))
    out = out.groupBy("k").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
    sink = ParquetSink(str(tmp_path / "out"))
    out.sink(sink, name="totals")
    report = p.run()
    _complete(report)
    assert executed == [(0, 1), (1,)]
    assert report.fused_fallbacks == 1
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert "of its records fail" in report.optimistic_fallbacks[0]
    assert report.optimistic_rounds == 1
    assert _rows(sink.read(spark)) == _rows(_plain(spark, bumped=False))


def _same(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf


def test_a_phase_writing_two_sinks_is_not_fused(spark, tmp_path):
    """A pandas stage before an aggregate whose output, after a row operation, reaches two
    sinks: fused, each sink's job would compute the aggregate and the stage again (its events
    counted twice: the round could never balance). The phase is not fused, and no round falls
    back."""
    p = Pipeline(spark)
    orders = p.source(_orders(spark), name="orders")
    orders = orders.map_in_pandas(_same, orders.schema, name="same")
    totals = orders.groupBy("k").agg(F.count("*").alias("n")).withColumn("x", F.col("n") * 2)
    a, b = ParquetSink(str(tmp_path / "a")), ParquetSink(str(tmp_path / "b"))
    totals.sink(a, name="a")
    totals.where(F.col("k") > 2).sink(b, name="b")
    assert "in phase 0's optimistic round" not in p.explain()
    report = p.run()
    assert report.lost == 0
    assert (report.fused_phases, report.fused_fallbacks, report.optimistic_rounds) == (0, 0, 2)
    plain = _orders(spark).groupBy("k").agg(F.count("*").alias("n")).withColumn("x", F.col("n") * 2)
    assert _rows(a.read(spark)) == _rows(plain)
    assert _rows(b.read(spark)) == _rows(plain.where(F.col("k") > 2))


def test_column_names_with_dots_and_spaces_through_two_aggregates(spark, tmp_path):
    """Aggregate outputs named ``s.x`` and ``we ird`` read by a second aggregate (the lineage
    columns are put after the payload by quoted name)."""

    def query(orders):
        first = orders.groupBy("k").agg(F.sum("price").alias("s.x"), F.count("*").alias("we ird"))
        return (
            first.where(F.col("`s.x`") > 0)
            .groupBy((F.col("k") % 2).alias("p q"))
            .agg(F.sum("`s.x`").alias("t.t"), F.sum("`we ird`").alias("n"))
        )

    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    query(p.source(_orders(spark), name="orders")).sink(sink, name="out")
    report = p.run()
    assert report.lost == 0
    assert report.fused_phases == 1
    assert _rows(sink.read(spark)) == _rows(query(_orders(spark)))
