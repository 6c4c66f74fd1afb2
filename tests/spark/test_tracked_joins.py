"""Joins between two tracked frames on Column conditions (``o.o_id == l.l_oid``, several
keys, a residual non-equi condition, ``alias``) and of every type (inner, left, right, full,
left_semi, left_anti): each equal to plain Spark on the inputs minus the dead-lettered
records, with records failing and replayed on both sides."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, TrackedOperationError, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ORDERS, ITEMS = 120, 200


def _orders(spark):
    rows = [(i, f"c{i % 5}", float(i % 17), i % 4) for i in range(ORDERS)]
    return spark.createDataFrame(rows, "o_id long, cust string, total double, o_n int")


def _items(spark):
    rows = [(i, (i * 7) % 150, i % 4, float(i % 23)) for i in range(ITEMS)]
    return spark.createDataFrame(rows, "l_id long, l_oid long, l_n int, price double")


def _poisoned(i):
    return i % 60 == 7


class Flaky:
    """A pandas stage over ``column``: ``column % 11 == 4`` fails on its first attempt
    (replayed), ``column % 60 == 7`` on every attempt (dead-lettered)."""

    def __init__(self, column: str) -> None:
        self.column = column
        self.__name__ = f"flaky_{column}"

    def __call__(self, pdf):
        values = pdf[self.column]
        bad = (values % 60 == 7).to_numpy()
        if current_round() == 0:
            bad |= (values % 11 == 4).to_numpy()
        if bad.any():
            raise xorack.FailRecord("injected", rows=bad)
        return pdf


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _sides(p, spark):
    o = p.source(_orders(spark), name="orders")
    items = p.source(_items(spark), name="items")
    o = o.map_in_pandas(Flaky("o_id"), o.schema, name="flaky_orders")
    items = items.map_in_pandas(Flaky("l_id"), items.schema, name="flaky_items")
    return o, items


def _plain_sides(spark):
    o = _orders(spark).where(~F.col("o_id").isin([i for i in range(ORDERS) if _poisoned(i)]))
    items = _items(spark).where(~F.col("l_id").isin([i for i in range(ITEMS) if _poisoned(i)]))
    return o, items


def _on_condition(how):
    def join(o, i):
        return o.join(i, (o.o_id == i.l_oid) & (o["o_n"] == i.l_n) & (i.price > o.total / 3), how)

    return join


JOINS = {
    # name: the join, written the same way on tracked frames and on DataFrames
    **{
        f"condition-{how}": _on_condition(how)
        for how in ("full", "left_semi", "left_anti")  # inner, left, right: below
    },
    "keys-list": lambda o, i: o.join(i, [o.o_id == i.l_oid, o.o_n == i.l_n], "inner"),
    "alias": lambda o, i: o.alias("a").join(
        i.alias("b"), F.col("a.o_id") == F.col("b.l_oid"), "leftouter"
    ),
    "names-right": lambda o, i: o.withColumnRenamed("o_id", "k").join(
        i.withColumnRenamed("l_oid", "k"), ["k"], "right"
    ),
}


def test_tracked_joins_of_every_type_equal_plain_spark_under_failures(spark, tmp_path):
    p = Pipeline(spark, max_attempts=3)
    o, items = _sides(p, spark)
    for name, join in JOINS.items():
        join(o, items).sink(ParquetSink(str(tmp_path / name)), name=name)
    report = p.run()
    assert report.lost == 0
    assert report.replayed > 0
    dead = sum(map(_poisoned, range(ORDERS))) + sum(map(_poisoned, range(ITEMS)))
    assert report.dead_lettered == dead
    po, pi = _plain_sides(spark)
    for name, join in JOINS.items():
        want = join(po, pi)
        got = spark.read.parquet(str(tmp_path / name))
        assert got.columns == want.columns, name
        assert _rows(got) == _rows(want), name
        assert sum(_rows(want).values()) > 0, name  # each join has rows to compare


def test_a_condition_join_in_an_optimistic_round_equals_plain_spark(spark, tmp_path):
    p = Pipeline(spark)
    o = p.source(_orders(spark), name="orders")
    items = p.source(_items(spark), name="items")
    out = str(tmp_path / "out")
    joined = o.join(items, (o.o_id == items.l_oid) & (items.price < o.total), "full")
    joined.groupBy().agg(F.count("*").alias("n"), F.sum("price").alias("p")).sink(ParquetSink(out))
    report = p.run()
    assert report.lost == 0
    assert report.optimistic_rounds >= 1
    po, pi = _orders(spark), _items(spark)
    want = po.join(pi, (po.o_id == pi.l_oid) & (pi.price < po.total), "full")
    want = want.groupBy().agg(F.count("*").alias("n"), F.sum("price").alias("p"))
    assert _rows(spark.read.parquet(out)) == _rows(want)


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_join_spark_plans_as_a_cartesian_product_counts_each_record_once(
    spark, tmp_path, broadcast
):
    """A non-equi join: without a broadcast Spark plans a cartesian product, which computes
    each partition of either side once per partition of the other, so a round's observed
    source counts (and its XOR sums) would count the records again (it reported 840 of
    320). Such a join is planned before the round, and its phase runs tracked
    rounds (Reason.CARTESIAN); with a broadcast (a nested loop join reading each side once)
    the round runs. Either way the counts are the records' and the sink plain Spark's."""
    from xorack.spark import Reason

    p = Pipeline(spark)
    o = p.source(_orders(spark).repartition(3), name="orders")
    items = p.source(_items(spark).repartition(2), name="items")
    items = items.map_in_pandas(lambda pdf: pdf, items.schema, name="stage")
    out = str(tmp_path / "out")
    joined = o.join(items, (items.l_n < o.o_n) & (items.price > o.total), "inner")
    joined.groupBy("cust").agg(F.count("*").alias("n")).sink(ParquetSink(out))
    po, pi = _orders(spark).repartition(3), _items(spark).repartition(2)
    want = po.join(pi, (pi.l_n < po.o_n) & (pi.price > po.total), "inner")
    # an RDD's size is not known: Spark takes it for defaultSizeInBytes (too large to
    # broadcast); without broadcasts, adaptive execution cannot make it a nested loop join
    # once it sees the sides' real sizes either
    if broadcast:
        setting = ("spark.sql.defaultSizeInBytes", "1024")
    else:
        setting = ("spark.sql.autoBroadcastJoinThreshold", "-1")
    spark.conf.set(*setting)
    try:  # plain Spark's plan of the same join: a cartesian product without the broadcast
        plan = str(want._jdf.queryExecution().sparkPlan().toString())
        assert ("CartesianProduct" in plan) != broadcast, plan
        report = p.run()
    finally:
        spark.conf.unset(setting[0])
    assert report.source_records == report.completed == ORDERS + ITEMS
    assert report.lost == 0
    if broadcast:
        assert report.phase_reasons == {}, report.tracked_phases
    else:
        assert report.phase_reasons == {0: Reason.CARTESIAN}
        assert "cartesian product" in report.tracked_phases[0]
    want = want.groupBy("cust").agg(F.count("*").alias("n"))
    assert _rows(spark.read.parquet(out)) == _rows(want)


def test_joins_that_cannot_be_kept_exact_say_what_to_write(spark):
    p = Pipeline(spark)
    o, items = _sides(p, spark)
    twin = items.withColumnRenamed("l_oid", "o_id")
    with pytest.raises(TrackedOperationError, match=r"\['o_id'\] are on both sides.*rename"):
        o.join(twin, o.o_id == twin.o_id)
    with pytest.raises(TrackedOperationError, match="cross join"):
        o.join(items)
    with pytest.raises(TrackedOperationError, match="how='cross'"):
        o.join(items, o.o_id == items.l_oid, "cross")
    with pytest.raises(TrackedOperationError, match="column names"):
        o.join(_items(spark), o.o_id == F.col("l_oid"))  # an untracked lookup
    with pytest.raises(TrackedOperationError, match="alias them apart"):
        o.alias("x").join(items.alias("x"), F.col("x.o_id") == F.col("x.l_oid"))
    # an unqualified name both sides have is ambiguous, as in Spark
    same_n = items.withColumnRenamed("l_n", "o_n")
    with pytest.raises(TrackedOperationError, match="AMBIGUOUS"):
        o.join(same_n, F.col("o_n") == F.col("o_n"), "left_semi")
