"""Column pruning across phases (:mod:`xorack.spark.prune`): a tracked join's output keeps the
columns read after it — never fewer. Each pipeline's sinks equal plain Spark's, under records
failing and replayed on both sides and in optimistic rounds; ``explain()`` names the kept
columns; and every downstream shape that reads a column keeps it."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

from xorack.spark.prune import _columns_read, _optimized, _probe, _token, prune

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ORDERS, ITEMS = 60, 150


def _orders(spark):
    rows = [(i, f"c{i % 5}", float(i % 17), i % 4, f"note {i}") for i in range(ORDERS)]
    return spark.createDataFrame(rows, "o_id long, cust string, total double, o_n int, memo string")


def _items(spark):
    rows = [(i, (i * 7) % 70, i % 4, float(i % 23), f"c{i % 3}") for i in range(ITEMS)]
    return spark.createDataFrame(rows, "l_id long, l_oid long, l_n int, price double, tag string")


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _flaky(pdf):
    """Fails the rows whose first column is 3 mod 7 in round 0 (replayed after)."""
    bad = (pdf.iloc[:, 0] % 7 == 3).to_numpy()
    if current_round() == 0 and bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


def _upper(pdf):
    pdf["memo"] = pdf["memo"].str.upper()
    return pdf


#: What comes after the join, written alike on a tracked frame and on a DataFrame; the
#: columns the join must keep (None: all of them).
AFTER = {
    "aggregate": (
        lambda j, spark: j.groupBy("cust").agg(F.sum("price").alias("p")),
        ("o_id", "cust", "price"),  # o_id: the derived source's partitioning key
    ),
    "filter-then-aggregate": (
        lambda j, spark: j.where(F.col("tag") == "c1").groupBy("o_n").agg(F.max("total")),
        ("o_id", "total", "o_n", "tag"),
    ),
    "select-star": (lambda j, spark: j.select("*"), None),
    "sink": (lambda j, spark: j, None),
    "lookup-join": (
        lambda j, spark: (
            j.join(
                spark.createDataFrame([("c1", "one"), ("c2", "two")], "tag string, word string"),
                "tag",
            )
            .groupBy("word")
            .agg(F.count("*").alias("n"))
        ),
        ("o_id", "tag"),
    ),
    "with-column-then-select": (
        lambda j, spark: j.withColumn("v", F.col("price") * F.col("o_n")).select("v", "memo"),
        ("o_id", "o_n", "memo", "price"),
    ),
}


def _join(o, i):
    return o.join(i, o.o_id == i.l_oid, "inner")


def test_pruned_joins_equal_plain_spark_and_keep_what_is_read(spark, tmp_path):
    """In tracked rounds (the staged sides joined once; a pruned join in an optimistic round:
    the next test, and TPC-H in tests/end_to_end/test_tpch.py)."""
    p = Pipeline(spark, optimistic=False)
    o = p.source(_orders(spark), name="orders")
    items = p.source(_items(spark), name="items")
    o = o.map_in_pandas(_flaky, o.schema, name="flaky_orders")
    items = items.map_in_pandas(_flaky, items.schema, name="flaky_items")
    for name, (after, _) in AFTER.items():
        after(_join(o, items), spark).sink(ParquetSink(str(tmp_path / name)), name=f"to-{name}")
    plan = prune(p.plan(), spark)
    joins = [n for n in plan.nodes if hasattr(getattr(n, "spec", None), "keep")]
    for (name, (_, kept)), join in zip(AFTER.items(), joins, strict=True):
        want = kept if kept is not None else ()
        assert set(join.spec.keep) == set(want), name
    assert ".select(o_id, cust, price)" in p.explain()
    sides = [[f.name for f in side.fields] for side in joins[0].side_schemas()]
    assert sides == [["o_id", "cust"], ["l_oid", "price"]]  # what tracked rounds stage
    assert joins[3].sides == ()  # nothing cut: every column staged
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.replayed > 0
    po, pi = _orders(spark), _items(spark)
    for name, (after, _) in AFTER.items():
        want = after(_join(po, pi), spark)
        got = spark.read.parquet(str(tmp_path / name))
        assert got.columns == want.columns, name
        assert _rows(got) == _rows(want), name
        assert sum(_rows(want).values()) > 0, name


def test_a_join_read_by_a_later_join_keeps_that_joins_columns(spark, tmp_path):
    """Two tracked joins in a row: the first keeps the columns the second's condition and
    what follows it read; a Python stage after a join reads all its columns."""
    p = Pipeline(spark)
    o = p.source(_orders(spark), name="orders")
    items = p.source(_items(spark), name="items")
    extra = p.source(_items(spark).selectExpr("l_id AS e_id", "tag AS e_tag"), name="extra")
    first = _join(o, items)
    second = first.join(extra, first.l_id == extra.e_id, "inner")
    second.groupBy("e_tag").agg(F.sum("total").alias("t")).sink(ParquetSink(str(tmp_path / "a")))
    staged = _join(o, items).map_in_pandas(_upper, first.schema, name="upper")
    staged.groupBy("memo").count().sink(ParquetSink(str(tmp_path / "b")))
    plan = prune(p.plan(), spark)
    keeps = {n.name: n.spec.keep for n in plan.nodes if hasattr(getattr(n, "spec", None), "keep")}
    assert set(keeps["join"]) == {"o_id", "l_id", "total"}
    assert set(keeps["join_2"]) == {"l_id", "e_tag", "total"}
    assert keeps["join_3"] == ()  # read by a Python stage: every column
    report = p.run()
    assert report.lost == 0
    assert report.optimistic_rounds >= 1
    po, pi = _orders(spark), _items(spark)
    pe = pi.selectExpr("l_id AS e_id", "tag AS e_tag")
    j = _join(po, pi)
    want = j.join(pe, j.l_id == pe.e_id).groupBy("e_tag").agg(F.sum("total").alias("t"))
    assert _rows(spark.read.parquet(str(tmp_path / "a"))) == _rows(want)
    upper = j.withColumn("memo", F.upper("memo")).groupBy("memo").count()
    assert _rows(spark.read.parquet(str(tmp_path / "b"))) == _rows(upper)


def test_columns_read_climbs_only_through_operators_that_pass_columns_on(spark):
    probe = _probe(spark, _items(spark).schema)

    def read(df):
        return _columns_read(_optimized(df), _token(probe))

    assert read(probe.where("price > 1").select("tag")) == {"price", "tag"}
    assert read(probe.groupBy("tag").agg(F.sum("price"))) == {"tag", "price"}
    assert read(probe.orderBy("l_n").where("l_id > 2")) is None  # every column passed on
    assert read(probe) is None
    twice = probe.join(probe.selectExpr("l_id AS k", "tag AS t2"), F.col("l_oid") == F.col("k"))
    assert read(twice.select("price", "t2")) == {"l_oid", "price", "l_id", "tag"}
    from pyspark.sql.window import Window

    ranked = probe.withColumn("r", F.rank().over(Window.orderBy("price"))).select("r", "tag")
    assert read(ranked) is not None
    assert {"price", "tag"} <= read(ranked)
