"""Schemas from DDL strings through PySpark's public API (``DataType.fromDDL``, PySpark >= 4.0).

>>> parse_ddl_schema(spark, "word string, n long").fieldNames()  # doctest: +SKIP
['word', 'n']
"""

from __future__ import annotations

from typing import Any

__all__ = ["parse_ddl_schema"]


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
