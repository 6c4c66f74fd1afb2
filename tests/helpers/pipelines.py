"""One generator of random pipelines for the property tests on real Spark (random operations on
random data, tracked against plain Spark): ``test_native_ops.py`` (with failures injected) and
``test_optimistic.py`` (failing nothing, so each must complete in optimistic rounds). Each test
draws its operations from its own subset of ``OPS`` and says what the few test-specific ones
do; the functions its stages run stay in the test module (pickled by value from there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Every operation the generator knows, in the order the tests' subsets list them.
OPS = ("filter", "explode", "inner", "left", "semi", "anti", "with", "pandas", "arrow", "union")


def random_pipeline(
    t,
    ops: list[str],
    agg: int,
    lookup,
    *,
    shift: Callable[[int], tuple[str, Any]],
    total: str,
    pandas: Callable | None = None,
    arrow: Callable | None = None,
    other: Callable[[], Any] | None = None,
):
    """``ops`` (then an aggregation when ``agg``) on ``t``, a tracked or a plain-pipeline
    DataFrame with columns ``id``, ``line`` and ``k`` (and ``word`` once exploded); the same
    call on an FT-on and an FT-off pipeline builds the same query. Operation ``i`` of ``ops``:

    - ``filter``: drops the rows with ``(id + i) % 4 == 0``;
    - ``explode``: one row per word of ``line``, as ``word`` (the first ``explode`` only);
    - ``inner``, ``left``, ``semi``, ``anti``: that join with ``lookup`` (``k``, ``label``
      renamed ``l{i}``) on ``k``;
    - ``with``: ``withColumn(*shift(i))``;
    - ``pandas`` / ``arrow``: the same-schema stage ``pandas`` / ``arrow`` (``map_in_pandas`` /
      ``map_in_arrow``), named ``pandas{i}`` / ``arrow{i}``;
    - ``union``: with ``other()``, a second source of the same columns (first, before any
      ``explode``, only).

    ``agg`` 1: per ``k``, the row count ``n`` and the sum of ``total`` as ``s``; 2 (once
    exploded): per ``word``, the row count ``n`` and the largest ``id`` as ``m``."""
    from pyspark.sql import functions as F

    exploded = False
    for i, op in enumerate(ops):
        assert op in OPS, op
        if op == "filter":
            t = t.filter((F.col("id") + i) % 4 != 0)
        elif op == "explode" and not exploded:
            t = t.withColumn("word", F.explode(F.split("line", " ")))
            exploded = True
        elif op in ("inner", "left", "semi", "anti"):
            how = {"semi": "left_semi", "anti": "left_anti"}.get(op, op)
            t = t.join(lookup.withColumnRenamed("label", f"l{i}"), "k", how)
        elif op == "with":
            t = t.withColumn(*shift(i))
        elif op == "pandas":
            assert pandas is not None, "op 'pandas' needs pandas="
            t = t.map_in_pandas(pandas, t.schema, name=f"pandas{i}")
        elif op == "arrow":
            assert arrow is not None, "op 'arrow' needs arrow="
            t = t.map_in_arrow(arrow, t.schema, name=f"arrow{i}")
        elif op == "union" and not exploded and i == 0:
            assert other is not None, "op 'union' needs other="
            t = t.union(other())
    if agg == 1:
        t = t.groupBy("k").agg(F.count("*").alias("n"), F.sum(total).alias("s"))
    elif agg == 2 and exploded:
        t = t.groupBy("word").agg(F.count("*").alias("n"), F.max("id").alias("m"))
    return t
