"""Spark integration: tracked sources, stages and sinks, the run loop, FT ON/OFF.

>>> from xorack.spark import Pipeline, SQLiteSink, current_round   # doctest: +SKIP
"""

from __future__ import annotations

from .pipeline import REPORT_KEYS, Pipeline, RoundInfo, RunReport, Tracked
from .sinks import Sink, SQLiteSink
from .stages import LINEAGE_COLUMNS, StageSchemaError, current_round

__all__ = [
    "LINEAGE_COLUMNS",
    "REPORT_KEYS",
    "Pipeline",
    "RoundInfo",
    "RunReport",
    "SQLiteSink",
    "Sink",
    "StageSchemaError",
    "Tracked",
    "current_round",
]
