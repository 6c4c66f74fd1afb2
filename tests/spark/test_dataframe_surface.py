"""PySpark's DataFrame names on a tracked frame, each equal to plain Spark under failures:
global aggregates (``agg``, ``groupBy()``, one row even over no rows), the ``GroupedData``
shortcuts (``sum``/``avg``/``mean``/``min``/``max``/``count``, Spark's column names),
``selectExpr``, ``unionByName`` and ``distinct``."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, SQLiteSink, TrackedOperationError, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 240
SCHEMA = "id long, k string, price double, qty int"


def _sales(spark):
    rows = [(i, f"k{i % 7}", float(i % 13) * 1.5, i % 5) for i in range(N)]
    return spark.createDataFrame(rows, SCHEMA).repartition(3)


def _flaky_and_poison(pdf):
    """id % 11 == 4 fails on its first attempt (replayed); id % 60 == 7 on every attempt."""
    bad = (pdf["id"] % 60 == 7).to_numpy()
    if current_round() == 0:
        bad |= (pdf["id"] % 11 == 4).to_numpy()
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


POISON = {i for i in range(N) if i % 60 == 7}


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _tracked(p, spark):
    src = p.source(_sales(spark), name="sales")
    return src.map_in_pandas(_flaky_and_poison, src.schema, name="flaky")


def _plain(spark):
    return _sales(spark).where(~F.col("id").isin(sorted(POISON)))


def _run(spark, tmp_path, build, optimistic=True):
    p = Pipeline(spark, max_attempts=3, optimistic=optimistic)
    out = str(tmp_path / "out")
    build(_tracked(p, spark)).sink(ParquetSink(out), name="out")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == len(POISON)
    return report, spark.read.parquet(out)


def test_a_global_aggregate_equals_plain_spark_under_failures(spark, tmp_path):
    exprs = (F.sum("price").alias("revenue"), F.count("*").alias("n"), F.avg("qty"))
    report, got = _run(spark, tmp_path, lambda t: t.agg(*exprs))
    assert report.replayed > 0
    assert _rows(got) == _rows(_plain(spark).agg(*exprs))
    assert got.columns == ["revenue", "n", "avg(qty)"]


@pytest.mark.parametrize("optimistic", [True, False])
def test_a_global_aggregate_over_no_rows_gives_one_row_as_spark_does(spark, tmp_path, optimistic):
    exprs = (F.count("*").alias("n"), F.sum("price").alias("s"))
    p = Pipeline(spark, optimistic=optimistic)
    out = str(tmp_path / "out")
    p.source(_sales(spark), name="sales").where(F.col("id") < 0).groupBy().agg(*exprs).sink(
        ParquetSink(out)
    )
    report = p.run()
    assert report.lost == 0
    assert report.optimistic_rounds == (1 if optimistic else 0)
    want = _sales(spark).where(F.col("id") < 0).agg(*exprs)
    assert _rows(spark.read.parquet(out)) == _rows(want) == Counter({(0, None): 1})


def test_a_global_aggregate_into_a_sqlite_sink_is_exact(spark, tmp_path):
    p = Pipeline(spark, max_attempts=3)
    sink = SQLiteSink(str(tmp_path / "t.db"), "t")
    _tracked(p, spark).agg(F.sum("qty").alias("q")).sink(sink, name="t")
    report = p.run()
    assert report.lost == 0
    assert sink.read()["q"].tolist() == [_plain(spark).agg(F.sum("qty")).first()[0]]


@pytest.mark.parametrize(
    ("function", "cols"),
    [("sum", ("price",)), ("avg", ("price", "qty")), ("mean", ()), ("min", ()), ("max", ("qty",))],
)
def test_grouped_shortcuts_have_sparks_names_and_values(spark, tmp_path, function, cols):
    _, got = _run(spark, tmp_path, lambda t: getattr(t.groupBy("k"), function)(*cols))
    want = getattr(_plain(spark).groupBy("k"), function)(*cols)
    assert got.columns == want.columns
    assert _rows(got) == _rows(want)


def test_grouped_shortcuts_refuse_what_spark_would_not_sum(spark):
    p = Pipeline(spark)
    grouped = p.source(_sales(spark), name="sales").groupBy("k")
    with pytest.raises(TrackedOperationError, match="not numeric"):
        grouped.sum("k")
    with pytest.raises(TypeError, match="column names"):
        p.source(_sales(spark), name="again").groupBy(F.col("k"))


def test_select_expr_union_by_name_and_distinct_equal_plain_spark(spark, tmp_path):
    def build(t):
        cheap = t.selectExpr("k", "CAST(price AS long) AS p")
        dear = t.where(F.col("price") > 10).selectExpr("k", "CAST(price * 2 AS long) AS p")
        return cheap.unionByName(dear).distinct()

    _, got = _run(spark, tmp_path, build)
    plain = _plain(spark)
    cheap = plain.selectExpr("k", "CAST(price AS long) AS p")
    dear = plain.where(F.col("price") > 10).selectExpr("k", "CAST(price * 2 AS long) AS p")
    want = cheap.unionByName(dear).distinct()
    assert got.columns == ["k", "p"]
    assert _rows(got) == _rows(want)


def test_union_by_name_with_missing_columns_says_what_to_write(spark):
    p = Pipeline(spark)
    t = p.source(_sales(spark), name="sales")
    u = t.select("k")
    with pytest.raises(TrackedOperationError, match="allowMissingColumns"):
        u.unionByName(u.select("k"), allowMissingColumns=True)


@pytest.mark.parametrize("subset", [["k"], ["k", "qty"], None])
def test_drop_duplicates_keeps_one_input_row_per_key(spark, tmp_path, subset):
    _, got = _run(spark, tmp_path, lambda t: t.dropDuplicates(subset))
    plain = _plain(spark)
    want = plain.dropDuplicates(subset)
    assert got.columns == want.columns
    keys = subset or plain.columns
    assert _rows(got.select(*keys)) == _rows(want.select(*keys))  # one row per key
    assert not set(_rows(got)) - set(_rows(plain))  # each one a row of the input
