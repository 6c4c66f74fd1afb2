"""A lookup join (with an untracked DataFrame) in an optimistic round is Spark's own join of the
user's type over the input's live rows: its input rows' events and its output rows' births are
observed, and the output rows' ids come from their parent's and their other-side row's content
(:meth:`OptimisticBuilder.lookup_join`). Plain Spark is the oracle; a row lost after the join
must make the round fall back."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from xorack.spark import ParquetSink, Pipeline, Reason

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 400


def _orders(spark):
    """Two partitions, read alike each time: a branch point's readers compute the join again
    (after a round-robin ``repartition`` the rows' order, and so their ids, could differ
    between the computations: the round would fall back)."""
    rows = [(i, i % 7, float(i % 13)) for i in range(N)]
    return spark.createDataFrame(rows, "id long, k int, v double")


def _dim(spark):
    """Keys 0-4 (5 and 6 match nothing); key 1 twice with the same row, key 2 with two rows."""
    rows = [(0, "a"), (1, "b"), (1, "b"), (2, "c"), (2, "cc"), (3, None), (4, "e"), (9, "z")]
    return spark.createDataFrame(rows, "k int, label string")


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _run(spark, tmp_path, how):
    dim = _dim(spark)
    p = Pipeline(spark)
    joined = p.source(_orders(spark), name="orders").join(dim, "k", how)
    rows = ParquetSink(str(tmp_path / f"rows-{how}"))
    joined.sink(rows, name="rows")
    sums = ParquetSink(str(tmp_path / f"sums-{how}"))
    joined.groupBy("label").agg(F.count("*").alias("n"), F.sum("v").alias("s")).sink(sums)
    report = p.run()
    plain = _orders(spark).join(dim, "k", how)
    want_sums = plain.groupBy("label").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    assert _rows(rows.read(spark)) == _rows(plain.select(*joined.columns))
    assert _rows(sums.read(spark)) == _rows(want_sums)
    assert report.lost == 0
    assert report.source_records == report.completed == N
    return report


@pytest.mark.parametrize("native", [False, True], ids=["with_ids", "native_only"])
@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_lookup_join_completes_in_its_optimistic_round_and_equals_plain_spark(
    spark, tmp_path, how, native, monkeypatch
):
    """Duplicate and several matches, unmatched keys (dropped under inner, nulls under left),
    and the join's output read twice (a branch point): one round, exact. With record ids (as
    in a phase that holds a Python stage or sink), and without (the default for a phase of
    Spark's own operations only)."""
    from xorack.spark import optimistic_round

    monkeypatch.setattr(optimistic_round, "NATIVE_PHASES", native)
    report = _run(spark, tmp_path, how)
    assert report.optimistic_fallbacks == []
    assert report.optimistic_rounds == 1


def test_a_row_lost_after_a_lookup_join_makes_the_round_fall_back(spark, tmp_path):
    """An untracked transform loses some join outputs in round 0: their births are not
    cancelled, the round falls back, and the tracked rounds complete every record."""
    dim = _dim(spark)
    p = Pipeline(spark)
    joined = p.source(_orders(spark), name="orders").join(dim, "k", "inner")
    joined = joined.transform(
        lambda df: df.where((F.col("id") % 11 != 3) | F.lit(p.round > 0)), name="lossy"
    )
    sums = ParquetSink(str(tmp_path / "sums"))
    joined.groupBy("label").agg(F.count("*").alias("n"), F.sum("v").alias("s")).sink(sums)
    report = p.run()
    assert report.optimistic_rounds == 0
    assert report.phase_reasons[0] is Reason.UNBALANCED
    assert report.lost == 0
    assert report.source_records == report.completed == N
    plain = _orders(spark).join(dim, "k", "inner")
    want = plain.groupBy("label").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    assert _rows(sums.read(spark)) == _rows(want)
