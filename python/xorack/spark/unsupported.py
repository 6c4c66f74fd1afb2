"""What a tracked frame says about a PySpark ``DataFrame`` name it does not have: what to
write instead, or which names it offers.

>>> unsupported("cache", ["k"]).startswith("Tracked.cache is not supported")
True
"""

from __future__ import annotations

#: What to write instead of a PySpark DataFrame name a tracked frame does not have.
_INSTEAD = {
    **dict.fromkeys(
        ("cache", "persist", "unpersist", "checkpoint", "localCheckpoint", "storageLevel"),
        "a tracked DataFrame is built afresh for each round; there is nothing to cache "
        "(cache the input before p.source())",
    ),
    **dict.fromkeys(
        ("write", "writeStream", "writeTo", "mergeInto", "saveAsTable", "insertInto"),
        "end the branch in a sink: t.sink(ParquetSink(path)) or t.sink(SQLiteSink(...)), then "
        "p.run()",
    ),
    **dict.fromkeys(
        ("mapInPandas", "mapInArrow", "foreach", "foreachPartition", "rdd", "toDF", "to"),
        "use map_in_pandas(fn, schema) / map_in_arrow(fn, schema) (tracked stages), or select",
    ),
    **dict.fromkeys(
        ("sample", "sampleBy", "randomSplit"),
        "a random choice would differ for a replayed record: sample the input before p.source()",
    ),
    **dict.fromkeys(
        ("intersect", "intersectAll", "subtract", "exceptAll"),
        "use join(other, on=..., how='left_semi' / 'left_anti') between the tracked frames",
    ),
    **dict.fromkeys(
        ("coalesce", "repartitionByRange", "sortWithinPartitions", "hint"),
        "wrap it in transform(lambda df: df.<operation>(...)) (untracked: it must keep every "
        "row), or use repartition(n, *cols)",
    ),
    **dict.fromkeys(
        ("createTempView", "createOrReplaceTempView", "createGlobalTempView", "registerTempTable"),
        "register the input DataFrame before p.source(), or the sink's output after p.run()",
    ),
    **dict.fromkeys(
        ("describe", "summary", "tail", "toLocalIterator", "toArrow", "toJSON"),
        "preview with show() / collect() / toPandas() (untracked), or aggregate with agg(...)",
    ),
    "crossJoin": "a cross join of tracked frames is not supported; join on a condition",
    "unionAll": "use union(other) (by name) or unionByName(other)",
    "replace": "use withColumn(c, F.when(...)) (a tracked row operation)",
    "groupingSets": "group by each set with groupBy(...).agg(...) and union the results",
    "rollup": "group by each level with groupBy(...).agg(...) and union the results",
    "cube": "group by each level with groupBy(...).agg(...) and union the results",
    "observe": "the run report counts rows per stage; aggregate with agg(...) for more",
    "withMetadata": "set the metadata on the input before p.source() or on the sink's output",
    "isEmpty": "preview with count() (untracked)",
}


def unsupported(name: str, columns: list[str]) -> str:
    """The message for a DataFrame name a tracked frame does not have (or any other name)."""
    try:
        from pyspark.sql import DataFrame

        known = hasattr(DataFrame, name)
    except ImportError:  # pragma: no cover - pyspark is a requirement of xorack.spark
        known = False
    if _INSTEAD.get(name):
        return f"Tracked.{name} is not supported on a tracked DataFrame: {_INSTEAD[name]}"
    if known:
        return (
            f"Tracked.{name}: DataFrame.{name} is not supported on a tracked DataFrame; see the "
            "README's table of what a Tracked supports (run the job, then use {name} on the "
            "sink's output)".replace("{name}", name)
        )
    return (
        f"'Tracked' has no attribute {name!r} (nor a column of that name: {columns}): a "
        "tracked DataFrame is declared lazily and built afresh for each round; it offers "
        "PySpark's row operations, joins, groupBy/agg, distinct, limit, stages (map_in_pandas, "
        "map_in_arrow, apply_in_pandas), sink and explain; show/count/collect/toPandas preview "
        "it untracked"
    )


__all__ = ["unsupported"]
