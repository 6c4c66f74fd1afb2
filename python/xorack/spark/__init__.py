"""Spark integration: tracked sources, stages and sinks, the run loop, FT ON/OFF.

>>> from xorack.spark import Pipeline, SQLiteSink, current_round   # doctest: +SKIP
"""

from __future__ import annotations

from .guard import RunawayFailure
from .ops import TrackedOperationError
from .pipeline import Pipeline
from .report import REPORT_KEYS, PhaseNote, Reason, RoundInfo, RunReport
from .sinks import NativeSink, ParquetSink, Sink, SinkCapabilities, SQLiteSink
from .stages import LINEAGE_COLUMNS, StageSchemaError, current_attempt, current_round
from .tracked import GroupedTracked, Tracked

__all__ = [
    "LINEAGE_COLUMNS",
    "REPORT_KEYS",
    "GroupedTracked",
    "NativeSink",
    "ParquetSink",
    "PhaseNote",
    "Pipeline",
    "Reason",
    "RoundInfo",
    "RunReport",
    "RunawayFailure",
    "SQLiteSink",
    "Sink",
    "SinkCapabilities",
    "StageSchemaError",
    "Tracked",
    "TrackedOperationError",
    "current_attempt",
    "current_round",
]
