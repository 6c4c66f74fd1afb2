"""Plain Structured Streaming as the oracle of the stream tests."""

from __future__ import annotations

from typing import Any

WAIT = 600.0  # seconds a plain query may take to read its input


def plain_rows(spark: Any, frame: Any, name: str, mode: str = "append") -> list[Any]:
    """The rows plain Structured Streaming writes for the streaming DataFrame ``frame`` in
    output ``mode``, reading what its sources hold now (``availableNow``), through a memory
    table ``name`` that is dropped afterwards."""
    query = (
        frame.writeStream.outputMode(mode)
        .format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(WAIT)
        rows: list[Any] = spark.table(name).collect()
    finally:
        query.stop()
        spark.sql(f"DROP VIEW IF EXISTS {name}")
    return rows
