"""A stream's window writes that run beside its next micro-batch (:class:`BesideWrites`): each
in a thread of its own that carries none of the query's job group, tags or SQL execution, and
waited for before the next windows close, its error raised then, after it was undone. Used by
:mod:`xorack.spark.stream_state` (whose ``OVERLAP`` switch turns it on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: What an emission writes: each sink node with the rows it took.
Written = list[tuple[Any, int]]


class _Emission:
    """An emission's writes running in a thread: the rows each sink took, or the error that
    stopped them. Its jobs belong to no micro-batch: the thread carries none of the query's job
    group, tags or SQL execution (stopping the query cancels those)."""

    #: Spark's local properties that tie a job to the thread that started it
    UNTIED = (
        "spark.jobGroup.id",
        "spark.job.description",
        "spark.job.interruptOnCancel",
        "spark.job.tags",
        "spark.sql.execution.id",
        "spark.sql.execution.root.id",
    )

    def __init__(self, spark: Any, work: Callable[[], Written]) -> None:
        self.written: Written = []
        self.error: BaseException | None = None
        jsession = spark._jsparkSession
        sc = spark.sparkContext

        def run() -> None:
            try:  # the session is active per JVM thread (functions and readers ask for it)
                for key in self.UNTIED:  # (a JVM thread may inherit them from its creator)
                    sc.setLocalProperty(key, None)
                spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
                self.written = work()
            except BaseException as exc:  # raised by BesideWrites.settle
                self.error = exc

        self._thread = threading.Thread(target=run, name="xorack-emission", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def running(self) -> bool:
        return self._thread.is_alive()


class BesideWrites:
    """At most one emission's writes running beside the next micro-batches, from :meth:`start`
    to :meth:`settle` (which the stream calls when it needs the state they commit: before the
    next emission, or once they have finished). ``enabled`` says whether a stream may start
    one (off for the drain at ``stop()``: its writes are waited for)."""

    def __init__(self, spark: Any, enabled: bool) -> None:
        self.spark = spark
        self.enabled = enabled
        self.started = 0  # emissions whose writes ran beside a micro-batch
        self._running: _Emission | None = None
        self._done: Callable[[Written], None] | None = None
        self._undo: Callable[[], None] | None = None

    def start(
        self, work: Callable[[], Written], done: Callable[[Written], None], undo: Callable[[], None]
    ) -> None:
        """Run ``work`` in a thread; :meth:`settle` then calls ``done`` with what it wrote, or
        ``undo`` before raising its error."""
        assert self._running is None, "an emission is still running"
        self._done, self._undo = done, undo
        self._running = _Emission(self.spark, work)
        self.started += 1

    def unsettled(self) -> bool:
        """Whether an emission was started and not settled yet (running, or finished: its
        ``done`` not called, so what it commits is not yet the stream's)."""
        return self._running is not None

    def settle(self, wait: bool = True) -> None:
        """Wait for the running emission, if any; its error raises here, once undone. Without
        ``wait``, only an emission that has finished is settled (a running one is left to run
        beside the next micro-batch too)."""
        running, done, undo = self._running, self._done, self._undo
        if running is None or done is None or undo is None:
            return
        if not wait and running.running():
            return
        running.join()
        self._running = self._done = self._undo = None
        if running.error is not None:
            undo()
            raise running.error
        done(running.written)


__all__ = ["BesideWrites", "Written"]
