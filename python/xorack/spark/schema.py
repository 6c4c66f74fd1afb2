"""Schemas from DDL strings through PySpark's public API (``DataType.fromDDL``, PySpark >= 4.0),
and the cheap DataFrame facts the planner asks for (an empty frame of a schema, a partition
count).

>>> parse_ddl_schema(spark, "word string, n long").fieldNames()  # doctest: +SKIP
['word', 'n']
"""

from __future__ import annotations

from typing import Any

__all__ = ["empty_frame", "num_partitions", "parse_ddl_schema"]


def parse_ddl_schema(spark: Any, ddl: str) -> Any:
    """The ``StructType`` of a DDL column list such as ``"word string, n long"`` (the form
    ``mapInPandas`` takes). ``spark`` is the active session: parsing runs in its JVM. A DDL that
    does not describe columns (``"int"``) or does not parse is a ``ValueError`` naming it.

    >>> parse_ddl_schema(spark, "sid long, word string")  # doctest: +SKIP
    StructType([StructField('sid', LongType(), True), StructField('word', StringType(), True)])
    """
    from pyspark.sql.types import DataType, StructType

    if not isinstance(ddl, str):
        raise TypeError(f"schema must be a DDL string, got {type(ddl).__name__}")
    if spark is None:
        raise ValueError("parse_ddl_schema needs the active SparkSession (it parses in the JVM)")
    try:
        parsed = DataType.fromDDL(ddl)
    except Exception as exc:  # Spark's ParseException and friends
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot parse the schema {ddl!r}: {first}") from exc
    if not isinstance(parsed, StructType):
        shown = parsed.simpleString()
        raise ValueError(f"schema must describe columns ('name type, ...'), got {ddl!r} ({shown})")
    return parsed


def empty_frame(spark: Any, schema: Any) -> Any:
    """An empty DataFrame of ``schema`` (a ``StructType``, nullability kept), for analyzing a
    declaration without running anything. On a classic session the frame is made in the JVM
    from an empty row list (~6 ms); ``spark.createDataFrame([], schema)``, the fallback (Spark
    Connect), serializes an empty RDD from Python (~27 ms on the 2-core machine).
    """
    jspark = getattr(spark, "_jsparkSession", None)
    if jspark is not None:
        try:
            from pyspark.sql.classic.dataframe import DataFrame

            jschema = jspark.parseDataType(schema.json())
            rows = spark._jvm.java.util.ArrayList()
            return DataFrame(jspark.createDataFrame(rows, jschema), spark)
        except (ImportError, AttributeError):  # pragma: no cover - another PySpark layout
            pass
    return spark.createDataFrame([], schema)


def num_partitions(df: Any) -> int:
    """How many partitions ``df`` has when it runs (its physical plan's RDD), asked of the JVM
    directly where possible (``df.rdd`` also sets up Python-side row conversion: ~30 ms
    against ~9 ms)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        return int(jdf.rdd().getNumPartitions())
    return int(df.rdd.getNumPartitions())  # pragma: no cover - Spark Connect
