"""Branch points in optimistic rounds, on real local Spark: a tracked frame read by several
readers (two sinks, a self-join as TPC-H Q21's, a sink and an aggregate) completes in one
optimistic round equal to plain Spark; a row failing once after the branch point, or a row
lost in one branch, makes the round fall back and the tracked rounds stay exact; a branch
point Spark could not compute alike for each reader is refused, and explain() says why."""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, Reason, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 240


def _items(spark, n: int = N):
    rows = [(i, i % 7, (i * 5) % 13, i % 4) for i in range(n)]
    return spark.createDataFrame(rows, "id long, k int, v long, s int").repartition(3)


def _run(spark, tmp_path, build, ft: bool, **kw):
    """``build(p, items, **kw) -> {sink name: Tracked}`` run; (pipeline, report, {name:
    Counter of rows})."""
    p = Pipeline(spark, ft=ft)
    sinks = {}
    for name, t in build(p, p.source(_items(spark), name="items"), **kw).items():
        sinks[name] = ParquetSink(str(tmp_path / f"{name}-{ft}"))
        t.sink(sinks[name], name=name)
    report = p.run()
    rows = {n: Counter(repr(tuple(r)) for r in s.read(spark).collect()) for n, s in sinks.items()}
    return p, report, rows


def _complete(report) -> None:
    assert report.lost == 0
    assert report.source_records == report.completed == N
    assert report.dead_lettered == 0


def _two_sinks(p, items):
    big = items.where(F.col("v") > 4).select("id", "v")
    return {"all": items, "big": big}


def _q21_like(p, items):
    """The frame read twice and joined with itself (Q21's ``not exists`` on ``lineitem``: an
    anti-join on the same key and another supplier)."""
    late = items.where(F.col("v") > 6).alias("l1")
    other = items.select("id", "k", "s", "v").alias("l2")
    cond = (F.col("l1.k") == F.col("l2.k")) & (F.col("l1.s") != F.col("l2.s"))
    cond = cond & (F.col("l2.v") > 11) & (F.col("l2.id") < 60)
    alone = late.join(other, cond, "left_anti")
    return {"q21": alone.groupBy("k").agg(F.count("*").alias("n"), F.sum("id").alias("ids"))}


def _tee_before_aggregate(p, items):
    counts = items.groupBy("k").agg(F.count("*").alias("n"), F.max("v").alias("top"))
    return {"rows": items.select("id", "k"), "counts": counts}


BUILDS = {"two_sinks": _two_sinks, "q21_like": _q21_like, "before_aggregate": _tee_before_aggregate}


@pytest.mark.parametrize("native", [False, True], ids=["with_ids", "native_only"])
@pytest.mark.parametrize("shape", sorted(BUILDS))
def test_a_branch_point_completes_in_one_optimistic_round(
    spark, tmp_path, shape, native, monkeypatch
):
    """With record ids (the tees' copies, their events observed once) and, the default for a
    phase of Spark's own operations, without (each reader reads the frame as plain Spark)."""
    from xorack.spark import optimistic_round

    monkeypatch.setattr(optimistic_round, "NATIVE_PHASES", native)
    p, report, got = _run(spark, tmp_path, BUILDS[shape], ft=True)
    assert report.optimistic_rounds >= 1, report.tracked_phases + report.optimistic_fallbacks
    assert report.tracked_phases == report.optimistic_fallbacks == []
    assert report.phase_reasons == {}
    how = p.explain().splitlines()[1]
    if native:
        assert how.startswith("phase 0: an optimistic round of Spark's own operations only")
    else:
        assert how == "phase 0: an optimistic round (tracked rounds if it falls back)"
    _complete(report)
    _, _, plain = _run(spark, tmp_path, BUILDS[shape], ft=False)
    assert sum(sum(c.values()) for c in plain.values()) > 0
    assert got == plain


def _fail_once(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = (pdf["id"] % 17 == 3) & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("first attempt", rows=bad.to_numpy())
    return pdf


def _same(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf


def test_a_row_failing_once_after_the_branch_point_falls_back_exactly(spark, tmp_path):
    def build(p, items, faulty=True):
        fn = _fail_once if faulty else _same
        staged = items.map_in_pandas(fn, items.schema, name="flaky")
        counts = items.groupBy("s").agg(F.count("*").alias("n"))
        return {"staged": staged, "counts": counts}

    _, report, got = _run(spark, tmp_path, build, ft=True)
    assert report.optimistic_rounds == 0
    assert report.phase_reasons[0] is Reason.ROW_FAILED
    assert report.lost == 0
    assert report.completed == N
    assert report.replayed > 0
    _, _, plain = _run(spark, tmp_path, build, ft=False, faulty=False)
    assert got == plain


def test_a_row_lost_in_one_branch_is_detected(spark, tmp_path):
    """A branch loses rows behind the acker's back (an untracked transform, in the optimistic
    round only): the events no longer cancel the births, the round falls back, and the tracked
    rounds give plain Spark's result."""

    def build(p, items, faulty=True):
        def lossy(df):
            return df.where((F.col("id") % 11 != 3) | F.lit(p.round > 0 or not faulty))

        kept = items.where(F.col("v") > 2).transform(lossy, name="lossy")
        return {"kept": kept, "all": items.select("id")}

    _, report, got = _run(spark, tmp_path, build, ft=True)
    assert report.optimistic_rounds == 0
    assert report.phase_reasons[0] is Reason.UNBALANCED, report.optimistic_fallbacks
    _complete(report)
    _, _, plain = _run(spark, tmp_path, build, ft=False, faulty=False)
    assert got == plain


def test_a_row_doubled_in_one_branch_is_detected(spark, tmp_path):
    def build(p, items, faulty=True):
        def doubling(df):
            extra = df.where((F.col("id") == 5) & F.lit(p.round == 0 and faulty))
            return df.unionByName(extra)

        return {"doubled": items.transform(doubling, name="doubling"), "all": items}

    _, report, got = _run(spark, tmp_path, build, ft=True)
    assert report.optimistic_rounds == 0
    assert report.phase_reasons[0] is Reason.UNBALANCED, report.optimistic_fallbacks
    _complete(report)
    _, _, plain = _run(spark, tmp_path, build, ft=False, faulty=False)
    assert got == plain


def _upper(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(v=pdf["v"] + 1)


def test_a_branch_point_spark_cannot_compute_alike_twice_runs_tracked_rounds(spark, tmp_path):
    """After a Python stage (it would run, and send its events, once per reader) or over an
    input that draws at random, the phase runs tracked rounds (the branch point materialized
    once), and explain() and the report say why."""
    p = Pipeline(spark)
    items = p.source(_items(spark), name="items")
    staged = items.map_in_pandas(_upper, items.schema, name="bump")
    staged.sink(ParquetSink(str(tmp_path / "a")), name="a")
    staged.where(F.col("v") > 3).sink(ParquetSink(str(tmp_path / "b")), name="b")
    why = "'bump' is a branch point: the Python stage 'bump' would run once per reader"
    assert p.explain().splitlines()[1].startswith(f"phase 0: tracked rounds [branch_point] {why}")
    report = p.run()
    assert report.phase_reasons == {0: Reason.BRANCH_POINT}
    assert report.tracked_phases[0].startswith(f"phase 0: {why}")
    _complete(report)

    q = Pipeline(spark)
    drawn = q.source(_items(spark).withColumn("r", F.rand(7)), name="drawn")
    drawn.select("id").sink(ParquetSink(str(tmp_path / "c")), name="c")
    drawn.select("r").sink(ParquetSink(str(tmp_path / "d")), name="d")
    head = q.explain().splitlines()[1]
    assert head.startswith("phase 0: tracked rounds [branch_point] 'drawn' is a branch point")
    assert "rand(7" in head
    assert "each time Spark computes the rows" in head
