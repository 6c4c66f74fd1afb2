"""Column pruning (:mod:`xorack.spark.prune`) against shapes that once broke it: a join whose
output is read by nothing but a count, a later join whose condition reads nothing of the cut
join, a native operation between a cut join and the barrier after it (the barrier staged
the operation's declared, uncut columns), and a plan where the optimizer folds the join's
output away (``limit(0)``, ``isin([])``: nothing read was shown, so all but the keys were
cut). Plain Spark is the oracle, in tracked rounds with records failing once on both sides."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, current_round
from xorack.spark.outputs import TrackedJoin

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

from xorack.spark.prune import prune

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _orders(spark):
    rows = [(i, f"c{i % 5}", float(i % 17), i % 4, f"note {i}") for i in range(60)]
    return spark.createDataFrame(rows, "o_id long, cust string, total double, o_n int, memo string")


def _items(spark):
    rows = [(i, (i * 7) % 70, i % 4, float(i % 23), f"c{i % 3}") for i in range(150)]
    return spark.createDataFrame(rows, "l_id long, l_oid long, l_n int, price double, tag string")


def _extra(spark):
    return _items(spark).selectExpr("l_id AS e_id", "tag AS e_tag")


def _flaky(pdf):
    """Fails the rows whose first column is 3 mod 7 in round 0 (replayed after)."""
    bad = (pdf.iloc[:, 0] % 7 == 3).to_numpy()
    if current_round() == 0 and bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


#: What is declared over the two tracked sides (and a third source ``e``), written alike on
#: tracked frames and on DataFrames: per join, the readers of its output.
SHAPES = {
    # reads no column of the join's output, which has no partitioning key either
    "full-join-counted": (
        lambda o, i: o.join(i, o.o_id == i.l_oid, "full"),
        {"count": lambda j, e: j.groupBy().agg(F.count("*").alias("n"))},
    ),
    # a second join whose condition reads only its other side
    "joined-on-the-other-side": (
        lambda o, i: o.join(i, o.o_id == i.l_oid),
        {
            "other": lambda j, e: (
                j.alias("a").join(e.alias("e"), F.col("e.e_tag") == "c1").groupBy("e_tag").count()
            )
        },
    ),
    # native operations between the join and a barrier that stages rows: an aggregate by a
    # key, a global one, a semi join keeping every column of its left side
    "filtered": (
        lambda o, i: o.join(i, o.o_id == i.l_oid),
        {
            "collect": lambda j, e: (
                j.where(F.col("tag") == "c1")
                .withColumnRenamed("cust", "who")
                .groupBy("who")
                .agg(F.sort_array(F.collect_list("l_n")).alias("ns"), F.countDistinct("o_n"))
            ),
            "sum": lambda j, e: j.where(F.col("tag") == "c2").groupBy().agg(F.sum("price")),
            "semi": lambda j, e: e.join(j.where(F.col("price") > 3), e.e_id == j.l_id, "left_semi"),
        },
    ),
    # the optimizer folds the join's output away: what is read is not shown
    "limited": (lambda o, i: o.join(i, o.o_id == i.l_oid), {"none": lambda j, e: j.limit(0)}),
    "folded": (
        lambda o, i: o.join(i, o.o_id == i.l_oid),
        {"isin": lambda j, e: j.where(F.col("tag").isin([])).groupBy("cust").count()},
    ),
}
#: the outputs with no rows (their columns are compared)
EMPTY = ("limited-none", "folded-isin")


def _rows(df) -> Counter:
    return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r) for r in df.collect())


def test_cut_joins_downstream_shapes_equal_plain_spark(spark, tmp_path):
    """Tracked rounds, where all four broke (the second and the fourth in optimistic rounds
    too): each side stages what the join reads, each barrier what reaches it."""
    p = Pipeline(spark, optimistic=False)
    o = p.source(_orders(spark), name="orders")
    i = p.source(_items(spark), name="items")
    e = p.source(_extra(spark), name="extra")
    o = o.map_in_pandas(_flaky, o.schema, name="flaky_orders")  # records failing once,
    i = i.map_in_pandas(_flaky, i.schema, name="flaky_items")  # replayed on both sides
    for name, (join, readers) in SHAPES.items():
        j = join(o, i)
        for reader, after in readers.items():
            sink = ParquetSink(str(tmp_path / f"{name}-{reader}"))
            after(j, e).sink(sink, name=f"{name}-{reader}")
    plan = prune(p.plan(), spark)  # what the run does, seen: so that nothing cut passes too
    joins = [n for n in plan.nodes if isinstance(n, TrackedJoin)]
    keeps = [set(j.spec.keep) for j in joins]
    sides = [[side.fieldNames() for side in j.side_schemas()] if j.sides else [] for j in joins]
    assert keeps[0] == set()  # full-join-counted: a cut to no column keeps them all
    assert keeps[1:3] == [{"o_id"}, {"e_tag"}]
    assert sides[1:3] == [[["o_id"], ["l_oid"]], [["o_id"], ["e_tag"]]]
    assert keeps[3] == {"o_id", "tag", "cust", "l_n", "o_n", "price", "l_id"}
    assert keeps[4] == set()  # the semi join: its sink reads all of it
    assert sides[4] == []  # what its parents have: its right side's filter over a cut frame
    assert keeps[5:] == [set(), set()]  # folded: every column kept
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.replayed > 0
    po, pi, pe = _orders(spark), _items(spark), _extra(spark)
    for name, (join, readers) in SHAPES.items():
        for reader, after in readers.items():
            out = f"{name}-{reader}"
            want = after(join(po, pi), pe)
            got = spark.read.parquet(str(tmp_path / out))
            assert got.columns == want.columns, out
            assert _rows(got) == _rows(want), out
            assert (sum(_rows(want).values()) > 0) == (out not in EMPTY), out
