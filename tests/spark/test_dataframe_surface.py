"""PySpark's DataFrame names on a tracked frame, each equal to plain Spark under failures:
global aggregates (``agg``, ``groupBy()``, one row even over no rows), the ``GroupedData``
shortcuts (``sum``/``avg``/``mean``/``min``/``max``/``count``, Spark's column names),
``groupBy`` on Column expressions, ``selectExpr``, ``unionByName``, ``distinct``, null
handling (``fillna``/``na.fill``, ``dropna``/``na.drop``), ``withColumnsRenamed``, column
access (``t["k"]``, ``t.k``, ``alias``), ``limit`` and ``orderBy(...).limit``; the untracked
previews (``show``/``count``/``collect``/``toPandas``) and the errors for the rest."""

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
    with pytest.raises(TypeError, match="column names and Columns"):
        p.source(_sales(spark), name="again").groupBy(1)


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


# ---- null handling, renames, column access ---------------------------------------------------


def _gappy(spark):
    """Sales with gaps: a null price, a NaN price, a null k, rows with every gap."""
    rows = [
        (
            i,
            None if i % 10 == 3 else f"k{i % 7}",
            None if i % 9 == 0 else (float("nan") if i % 17 == 5 else float(i % 13) * 1.5),
            None if i % 8 == 3 else i % 5,
        )
        for i in range(N)
    ]
    return spark.createDataFrame(rows, SCHEMA).repartition(3)


def _run_on(spark, tmp_path, input_df, build):
    p = Pipeline(spark, max_attempts=3)
    src = p.source(input_df, name="sales")
    out = str(tmp_path / "out")
    build(src.map_in_pandas(_flaky_and_poison, src.schema, name="flaky")).sink(ParquetSink(out))
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == len(POISON)
    assert report.replayed > 0
    return spark.read.parquet(out)


def _nan_as_null(df):
    """``df`` with NaN prices as null: what a pandas stage (Arrow's ``from_pandas``) makes of a
    NaN, so the oracle sees the rows the tracked stage passes on."""
    return df.withColumn("price", F.when(~F.isnan("price"), F.col("price")))


@pytest.mark.parametrize(
    "build",
    [
        lambda t: (
            t.fillna(0.0)
            .fillna({"k": "none"})
            .withColumnsRenamed({"k": "key", "qty": "q"})
            .dropna(thresh=4)
        ),
        lambda t: (
            t.na.fill("?", subset=["k"])
            .dropna(how="all", subset=["qty", "price"])
            .na.drop(subset=["price"])
            .na.fill(-1)
        ),
    ],
    ids=["fillna-renamed-thresh", "na.fill-dropna-how"],
)
def test_null_handling_and_renames_equal_plain_spark_under_failures(spark, tmp_path, build):
    got = _run_on(spark, tmp_path, _gappy(spark), build)
    want = build(_nan_as_null(_gappy(spark).where(~F.col("id").isin(sorted(POISON)))))
    assert got.columns == want.columns
    assert _rows(got) == _rows(want)


def test_dropna_counts_nan_as_null_as_spark_does(spark, tmp_path):
    p = Pipeline(spark)
    out = str(tmp_path / "out")
    p.source(_gappy(spark), name="sales").dropna(thresh=4).sink(ParquetSink(out))
    assert p.run().lost == 0
    want = _gappy(spark).dropna(thresh=4)
    assert _rows(spark.read.parquet(out)) == _rows(want)
    assert sum(_rows(want).values()) < sum(_rows(_gappy(spark).dropna(thresh=3)).values())


def test_column_access_alias_and_schema_views_as_on_a_dataframe(spark, tmp_path, capsys):
    def build(t):
        a = t.alias("s")
        cheap = a.where(F.col("s.price") < 9).select(a.id, a["k"], (a.qty * 2).alias("q2"))
        kept = cheap[cheap.q2 > 2][["id", "k", "q2"]]
        return kept.withColumn("i", a.id + cheap[0])

    got = _run_on(spark, tmp_path, _sales(spark), build)
    plain = _plain(spark)
    cheap = plain.where(F.col("price") < 9).select("id", "k", (F.col("qty") * 2).alias("q2"))
    want = cheap.where("q2 > 2").withColumn("i", F.col("id") * 2)
    assert _rows(got) == _rows(want)

    t = Pipeline(spark).source(_sales(spark), name="sales")
    assert t.dtypes == _sales(spark).dtypes
    t.printSchema()
    _sales(spark).printSchema()
    ours, spark_s = capsys.readouterr().out.split("\n\n", 1)
    assert ours.strip() == spark_s.strip()
    with pytest.raises(TrackedOperationError, match="not a column"):
        t["nope"]
    with pytest.raises(IndexError):
        t[9]


def test_group_by_column_expressions_and_shortcuts_equal_plain_spark(spark, tmp_path):
    def build(t):
        return t.groupBy(F.upper("k"), t.qty, (F.col("id") % 2).alias("odd")).count()

    got = _run_on(spark, tmp_path, _sales(spark), build)
    plain = _plain(spark)
    want = plain.groupBy(F.upper("k"), plain.qty, (F.col("id") % 2).alias("odd")).count()
    assert got.columns == want.columns == ["upper(k)", "qty", "odd", "count"]
    assert _rows(got) == _rows(want)
    t = Pipeline(spark).source(_sales(spark), name="sales")
    with pytest.raises(TrackedOperationError, match="hide"):
        t.groupBy((F.col("qty") + 1).alias("qty"))
    with pytest.raises(TrackedOperationError, match=r"inside an aggregate.*F.sum\('price'\)"):
        t.groupBy("k").agg(F.sum(t.price))


# ---- limit, orderBy(...).limit --------------------------------------------------------------


def test_limits_equal_plain_spark_under_failures(spark, tmp_path):
    """orderBy(...).limit(n) is the top n of plain Spark; limit(n) is n rows of completed
    records (any n, as Spark's own)."""
    p = Pipeline(spark, max_attempts=3)
    t = _tracked(p, spark)
    paths = {name: str(tmp_path / name) for name in ("top", "few", "any", "all")}
    t.orderBy(F.desc("price"), t.id).limit(7).sink(ParquetSink(paths["top"]))
    t.sort("qty", "id", ascending=[False, True]).limit(5).select("id").sink(
        ParquetSink(paths["few"])
    )
    t.limit(50).sink(ParquetSink(paths["any"]))
    t.limit(10 * N).sink(ParquetSink(paths["all"]))
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == len(POISON)
    plain = _plain(spark)
    got = {name: _rows(spark.read.parquet(path)) for name, path in paths.items()}
    assert got["top"] == _rows(plain.orderBy(F.desc("price"), "id").limit(7))
    want = plain.sort("qty", "id", ascending=[False, True]).limit(5).select("id")
    assert got["few"] == _rows(want)
    assert sum(got["any"].values()) == 50
    assert not set(got["any"]) - set(_rows(plain))  # each a row of a completed record
    assert got["all"] == _rows(plain)


def test_a_top_n_in_an_optimistic_round_equals_plain_spark(spark, tmp_path):
    p = Pipeline(spark)
    out = str(tmp_path / "top")
    t = p.source(_sales(spark), name="sales")
    t.orderBy(t.price.desc(), "id").limit(9).sink(ParquetSink(out))
    report = p.run()
    assert report.lost == 0
    assert report.optimistic_rounds == 1
    want = _sales(spark).orderBy(F.col("price").desc(), "id").limit(9)
    assert _rows(spark.read.parquet(out)) == _rows(want)


def test_an_order_without_a_limit_says_where_to_sort(spark):
    t = Pipeline(spark).source(_sales(spark), name="sales")
    with pytest.raises(AttributeError, match="does not keep an order"):
        t.orderBy("id").sink  # noqa: B018
    with pytest.raises(TrackedOperationError, match="orderBy"):
        t.orderBy("nope")
    with pytest.raises(TypeError, match="n must be an int"):
        t.limit(-1)


# ---- previews and the rest of the DataFrame surface ------------------------------------------


def test_previews_are_plain_spark_and_say_they_are_untracked(spark, capsys):
    p = Pipeline(spark)
    t = p.source(_sales(spark), name="sales")
    per_k = t.where(F.col("qty") > 1).groupBy("k").agg(F.sum("price").alias("s"))
    declared = len(p.plan().nodes)
    want = _sales(spark).where(F.col("qty") > 1).groupBy("k").agg(F.sum("price").alias("s"))
    assert per_k.count() == want.count()
    assert Counter(map(tuple, per_k.collect())) == _rows(want)
    assert sorted(per_k.toPandas()["k"]) == sorted(r.k for r in want.collect())
    per_k.show(3)
    err = capsys.readouterr().err
    assert err.count("untracked preview") == 4
    assert "show()" in err
    assert len(p.plan().nodes) == declared  # a preview adds nothing to the plan


def test_every_other_dataframe_name_says_what_to_do(spark):
    from pyspark.sql import DataFrame

    t = Pipeline(spark).source(_sales(spark), name="sales")
    names = [n for n in dir(DataFrame) if not n.startswith("_") and not hasattr(t, n)]
    assert {"cache", "write"} <= set(names)
    for name in names:
        with pytest.raises(AttributeError, match=f"Tracked.{name}") as info:
            getattr(t, name)
        assert "tracked DataFrame" in str(info.value)
    with pytest.raises(AttributeError, match="nor a column"):
        t.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="sink"):
        t.write  # noqa: B018


def test_limit_in_a_stream_is_refused_in_one_line(spark, tmp_path):
    """(dropDuplicates and distinct run in streams: tests/spark/test_stream_dedup.py)"""
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    t = Pipeline(spark).source(stream, name="events")
    with pytest.raises(TrackedOperationError, match="stream") as info:
        t.limit(3)
    assert "\n" not in str(info.value)
