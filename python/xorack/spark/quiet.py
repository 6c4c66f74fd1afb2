"""Spark's logs of the task failures a xorack run expects, turned off while the run lasts.

A run fails Spark tasks on purpose: a native expression raising on a row fails its task and
xorack narrows it down to the row, a cancelled optimistic round kills its tasks, a Python
worker that dies is retried. Spark logs each one as an ERROR or WARN with a Java stack trace
(``Executor``, ``TaskSetManager``, the Python runners) and PySpark logs the error of the
failed job once more (``DataFrameQueryContextLogger``): about a hundred lines for a handful of
bad records, where xorack's own report says what happened. :func:`quiet_spark_logs` sets
exactly those loggers to OFF for the duration of a run and puts each back as it was (its own
level, or no setting of its own), so a user's logging is unchanged outside runs.

On a cluster the executors' loggers are in their own JVMs (their logs are files, not the
driver's console): the driver's ``TaskSetManager`` is the one that reaches the console.

>>> with quiet_spark_logs(None):  # no session: nothing to quiet
...     pass
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

#: The log4j loggers (classes or packages) of Spark that log expected task failures.
SPARK_LOGGERS = (
    "org.apache.spark.executor.Executor",  # "Exception in task ..." + the stack trace
    "org.apache.spark.scheduler.TaskSetManager",  # "Lost task ...", "... aborting job"
    "org.apache.spark.api.python",  # Python runners: "Python worker exited unexpectedly"
    "org.apache.spark.sql.execution.python",  # the pandas/Arrow UDF runners
)
#: PySpark's Python loggers that log a failed job's error with its query context.
PYSPARK_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")

_lock = threading.Lock()
_depth = 0  # runs in progress (quieted once, restored when the last one ends)
_saved: list[Any] = []  # what to restore


@contextlib.contextmanager
def quiet_spark_logs(spark: Any, verbose: bool = False) -> Iterator[None]:
    """Spark's loggers of expected task failures (:data:`SPARK_LOGGERS`,
    :data:`PYSPARK_LOGGERS`) off while the block runs, restored after; with ``verbose`` or no
    JVM to reach (Spark Connect), nothing changes. Runs that overlap (threads) quiet once."""
    global _depth
    if verbose:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved[:] = _lower(spark)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore(_saved)
                _saved.clear()


def _lower(spark: Any) -> list[Any]:
    saved: list[Any] = []
    for name in PYSPARK_LOGGERS:
        logger = _pyspark_logger(name)
        if logger is not None:
            saved.append(("python", logger, logger.disabled))
            logger.disabled = True
    jvm = _jvm(spark)
    if jvm is None:
        return saved
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    own = context.getConfiguration().getLoggers()  # the loggers with a setting of their own
    for name in SPARK_LOGGERS:
        before = own.get(name)
        saved.append(("jvm", (log4j, context, name), before.getLevel() if before else None))
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    return saved


def _restore(saved: list[Any]) -> None:
    for kind, target, before in reversed(saved):
        if kind == "python":
            target.disabled = before
            continue
        log4j, context, name = target
        with contextlib.suppress(Exception):  # the JVM went away (the session was stopped)
            if before is not None:
                log4j.core.config.Configurator.setLevel(name, before)
            else:  # it had no setting of its own: it follows its parents again
                context.getConfiguration().removeLogger(name)
                context.updateLoggers()


def _pyspark_logger(name: str) -> logging.Logger | None:
    """PySpark's logger ``name``, created as PySpark creates it (a ``PySparkLogger``: a plain
    ``logging.Logger`` of that name, made first, would break PySpark's calls to it)."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # a PySpark without its own loggers
        return None
    return PySparkLogger.getLogger(name)


def _jvm(spark: Any) -> Any:
    """The session's JVM gateway, None when there is none to reach."""
    try:
        return spark.sparkContext._jvm
    except Exception:  # no session, or a Spark Connect session (no JVM in this process)
        return None


__all__ = ["PYSPARK_LOGGERS", "SPARK_LOGGERS", "quiet_spark_logs"]
