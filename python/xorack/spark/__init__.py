"""Spark integration: tracked sources, stages and sinks, the run loop, FT ON/OFF.

>>> from xorack.spark import Pipeline, SQLiteSink, current_round   # doctest: +SKIP
"""

from __future__ import annotations

from .guard import RunawayFailure
from .ops import TrackedOperationError
from .pipeline import REPORT_KEYS, GroupedTracked, Pipeline, RoundInfo, RunReport, Tracked
from .sinks import NativeSink, ParquetSink, Sink, SQLiteSink
from .stages import LINEAGE_COLUMNS, StageSchemaError, current_attempt, current_round

__all__ = [
    "LINEAGE_COLUMNS",
    "REPORT_KEYS",
    "GroupedTracked",
    "NativeSink",
    "ParquetSink",
    "Pipeline",
    "RoundInfo",
    "RunReport",
    "RunawayFailure",
    "SQLiteSink",
    "Sink",
    "StageSchemaError",
    "Tracked",
    "TrackedOperationError",
    "current_attempt",
    "current_round",
]
