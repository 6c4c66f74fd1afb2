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
