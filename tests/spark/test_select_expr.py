"""``lineage.select_expr``: ``selectExpr`` with the expressions sent to the JVM as one string
(a few py4j round trips instead of one per expression). Plain ``selectExpr`` is the oracle:
the same columns, types, rows and errors."""

from __future__ import annotations

import pytest

from xorack.spark.lineage import select_expr

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

pytestmark = pytest.mark.spark


def _frame(spark):
    return spark.createDataFrame(
        [(1, "a", 2.5, None), (2, "b`c", -1.0, "x")], "id long, `s.t` string, v double, w string"
    )


@pytest.mark.parametrize(
    "exprs",
    [
        ["id", "`s.t`", "v", "w"],  # by name, a dotted name quoted
        ["id * 2 AS d", "upper(`s.t`) AS `u p`", "v", "coalesce(w, 'none') AS w", "1L AS one"],
        ["id", "v"],  # short: PySpark's own call
        ["id", "'a\u0001b' AS sep", "v", "w"],  # the separator in an expression: PySpark's own
        ["*", "id + 1 AS n", "v", "w AS w2"],
    ],
)
def test_select_expr_equals_select_expr(spark, exprs):
    df = _frame(spark)
    got, want = select_expr(df, exprs), df.selectExpr(*exprs)
    assert got.schema == want.schema
    assert got.collect() == want.collect()


def test_select_expr_raises_spark_s_own_error(spark):
    from pyspark.errors import AnalysisException

    df = _frame(spark)
    with pytest.raises(AnalysisException, match="UNRESOLVED_COLUMN"):
        select_expr(df, ["id", "v", "w", "nope"])


def test_select_kept_equals_select_on_every_frame_it_is_reused_for(spark):
    """The column list built for the first frame selects the same as ``df.select`` from later
    frames of the same columns and other rows (each select resolves the Columns anew)."""
    from pyspark.sql import functions as F

    from xorack.spark.lineage import select_kept

    built = []

    def columns():
        built.append(1)
        return ["id", F.upper(F.col("`s.t`")).alias("u"), (F.col("v") * 2).alias("v2"), "w"]

    cache: dict = {}
    first = _frame(spark)
    later = spark.createDataFrame(
        [(7, "z", 0.5, "y"), (8, None, None, None)], "id long, `s.t` string, v double, w string"
    )
    for df in (first, later, later.where("id = 8")):
        got, want = select_kept(df, cache, "k", columns), df.select(*columns())
        assert got.schema == want.schema
        assert got.collect() == want.collect()
    assert len(built) == 4  # once for the cache, and once per frame for the oracle above


def test_with_pending_adds_the_pending_columns_as_with_columns_did(spark):
    """``with_pending`` (one kept select) against ``withColumns``, the call it replaces: the
    same names, order, types, nullability and values, on two frames in turn."""
    from pyspark.sql import functions as F

    from xorack.spark.lineage import EV, KEEP, REC, SRC
    from xorack.spark.rows import with_pending

    for rows in ([(1, "a", 5, 6)], [(2, None, 7, 8), (3, "c", 9, 10)]):
        df = spark.createDataFrame(rows, f"id long, `s.t` string, {SRC} long, {REC} long")
        got = with_pending(df)
        want = df.withColumns({EV: F.lit(0).cast("long"), KEEP: F.lit(True)})
        assert got.schema == want.schema
        assert got.collect() == want.collect()
