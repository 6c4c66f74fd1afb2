"""Spark's logs of the task failures a run expects are off during ``Pipeline.run()`` and as they
were after (:mod:`xorack.spark.quiet`); ``verbose=True`` leaves them alone. Seen from inside
the run (``on_round``) on the shared session's log4j; that the console stays free of them
when tasks fail is tests/end_to_end/test_spark_submit.py (a process of its own)."""

from __future__ import annotations

import pytest

from xorack.spark import Pipeline, SQLiteSink
from xorack.spark.quiet import PYSPARK_LOGGERS, SPARK_LOGGERS

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark.logger import PySparkLogger
from pyspark.sql import functions as F

OWN = "org.apache.spark.scheduler.TaskSetManager"  # given a level of its own before the run


def _levels(spark) -> dict[str, str | None]:
    """Each quieted logger's own level (None: none of its own) and PySpark's loggers' state."""
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    own = log4j.LogManager.getContext(False).getConfiguration().getLoggers()
    out: dict[str, str | None] = {}
    for name in SPARK_LOGGERS:
        config = own.get(name)
        out[name] = config.getLevel().toString() if config is not None else None
    for name in PYSPARK_LOGGERS:
        out[name] = "disabled" if PySparkLogger.getLogger(name).disabled else "enabled"
    return out


def _run(spark, tmp_path, verbose: bool) -> tuple[list[dict], object]:
    rows = spark.range(30, numPartitions=2).select("id", (F.col("id") % 7 + 1).alias("b"))
    p = Pipeline(spark, optimistic=False, verbose=verbose)
    sink = SQLiteSink(str(tmp_path / f"out-{verbose}.db"), "t")
    p.source(rows, name="ids").select("id", (F.col("id") / F.col("b")).alias("x")).sink(sink)
    seen: list[dict] = []
    report = p.run(on_round=lambda info: seen.append(_levels(spark)))
    return seen, report


def test_spark_logs_of_expected_failures_are_off_during_a_run_and_restored(spark, tmp_path):
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(OWN, log4j.Level.ERROR)
    try:
        before = _levels(spark)
        assert before[OWN] == "ERROR"
        seen, report = _run(spark, tmp_path, verbose=False)
        assert seen, "no round was reported"
        for levels in seen:
            assert all(levels[name] == "OFF" for name in SPARK_LOGGERS), levels
            assert all(levels[name] == "disabled" for name in PYSPARK_LOGGERS), levels
        assert _levels(spark) == before  # the own level back, the others without one again
    finally:
        context = log4j.LogManager.getContext(False)
        context.getConfiguration().removeLogger(OWN)
        context.updateLoggers()
    assert report.lost == 0


def test_verbose_leaves_spark_logs_as_they_are(spark, tmp_path):
    before = _levels(spark)
    seen, report = _run(spark, tmp_path, verbose=True)
    assert seen
    assert all(levels == before for levels in seen)
    assert report.lost == 0
