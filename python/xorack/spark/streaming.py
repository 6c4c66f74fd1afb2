"""Structured Streaming: the pipeline's stages inside ``foreachBatch``.

Each micro-batch tags its fresh source rows, adds the replays waiting in the FT layer (failed
or timed out in earlier micro-batches, each placed on the partition its replay partitioner
chose), and runs every stage and sink once (one Spark action). Timeouts rotate on wall-clock
time: a record not completed ``timeout`` seconds after it was persisted or replayed is replayed
in a later micro-batch. :meth:`StreamingRun.stop` stops the query and drains: what is still
pending is run in batch rounds until it is completed or dead-lettered.

In streaming, :func:`xorack.spark.current_round` is the micro-batch id (then the drain rounds).

>>> # run = p.start_stream(timeout=30.0)          # p.source(spark.readStream..., partitions=4)
>>> # ...; report = run.stop(); assert report.lost == 0
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from .pipeline import RunReport
from .stages import ROUND_PROPERTY

if TYPE_CHECKING:
    from .pipeline import Pipeline


class _StoppedBeforeBatch(Exception):
    """A micro-batch that arrived after ``stop()``: failed on purpose so it is not committed."""


class StreamingRun:
    """A running streaming query over a :class:`~xorack.spark.Pipeline` with one streaming
    source. Built by :meth:`Pipeline.start_stream`."""

    def __init__(
        self,
        pipeline: Pipeline,
        timeout: float = 30.0,
        trigger_seconds: float | None = None,
        checkpoint_location: str | None = None,
    ) -> None:
        streaming = [n for n in pipeline._sources if n.df.isStreaming]
        if len(streaming) != 1 or len(pipeline._sources) != 1:
            raise ValueError(
                "start_stream: the pipeline needs exactly one source, a streaming DataFrame "
                f"(got {len(pipeline._sources)} source(s), {len(streaming)} streaming)"
            )
        if not pipeline.ft:
            raise ValueError("start_stream: use ft=True (with FT off run the stages yourself)")
        barriers = [n.name for n in pipeline._nodes if n.kind == "barrier"]
        native = [n.name for n in pipeline._nodes if getattr(n.sink, "native", False)]
        if barriers or native:
            raise ValueError(
                "start_stream: aggregations and tracked joins "
                f"({barriers}) and native sinks such as ParquetSink ({native}) need the whole "
                "input to settle before they produce rows; in streaming, aggregate in the sink "
                "(or run the pipeline in batch with p.run()). Native row operations (filter, "
                "select, explode, lookup joins) work in streaming."
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.pipeline = pipeline
        self.timeout = float(timeout)
        self.report = RunReport()
        self.batches = 0
        self._source = streaming[0]
        self._lock = threading.Lock()
        self._last_batch = -1
        self._start = time.perf_counter()
        self._next_rotation = time.monotonic()
        self._error: BaseException | None = None
        self._stopping = False
        sinks = pipeline._sink_nodes()
        pipeline._location = pipeline._start_service()
        try:
            ft = pipeline._ft_layer
            num_buckets = getattr(ft, "num_buckets", 3)
            self._interval = self.timeout / num_buckets
            self._embedded_rotation = ft is not None and hasattr(ft, "start")
            if self._embedded_rotation:
                ft.start(self._interval)  # background rotations on wall-clock time
            for node in sinks:
                node.sink.create(list(node.columns))
            writer = self._source.df.writeStream.foreachBatch(self._on_batch)
            if trigger_seconds is not None:
                writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
            if checkpoint_location is not None:
                writer = writer.option("checkpointLocation", checkpoint_location)
            self.query = writer.start()
        except BaseException:
            pipeline._stop_service()
            pipeline._location = None
            raise

    def _on_batch(self, batch_df: Any, batch_id: int) -> None:
        p = self.pipeline
        try:
            with self._lock:
                if self._stopping:
                    # stop() was called: raising keeps Spark from committing the batch's offsets
                    # (returning would commit rows that were never tagged nor persisted)
                    raise _StoppedBeforeBatch(
                        f"micro-batch {batch_id} started after stop(): left uncommitted"
                    )
                sc = p.spark.sparkContext
                sc.setLocalProperty(ROUND_PROPERTY, str(batch_id))
                p.round = int(batch_id)
                if not self._embedded_rotation:
                    now = time.monotonic()
                    while now >= self._next_rotation:  # an external acker: rotate from here
                        p.client.rotate()
                        self._next_rotation += self._interval
                work = p._build({self._source.source_index: batch_df}, replays_wanted=True)
                p._run_frames(work.summaries, self.report)
                self.batches += 1
                self._last_batch = int(batch_id)
        except _StoppedBeforeBatch:
            raise
        except BaseException as exc:
            self._error = exc
            raise

    def stop(self, drain: bool = True) -> RunReport:
        """Stop the query; with ``drain``, run what is still pending in batch rounds (timed
        out now: no micro-batch is running any more) until it completes or is dead-lettered.
        Returns the report of the whole run."""
        p = self.pipeline
        try:
            with self._lock:  # let the running micro-batch finish; no new one starts its work
                self._stopping = True
            self.query.stop()
            if self._embedded_rotation:
                p._ft_layer.stop()
            with self._lock:
                if drain:
                    sc = p.spark.sparkContext
                    for r in range(p.max_attempts + 1):
                        p.round = self._last_batch + 1 + r
                        sc.setLocalProperty(ROUND_PROPERTY, str(p.round))
                        p.client.expire_all()
                        stats = p.client.stats()
                        if not stats.get("pending", 0):
                            break
                        work = p._build({}, replays_wanted=True)
                        p._run_frames(work.summaries, self.report)
                        self.report.rounds += 1
                # all or nothing: the rows of attempts that ended without completing go
                ended = p.client.take_ended()
                for node in p._sink_nodes():
                    if hasattr(node.sink, "retract"):
                        self.report.retracted_rows += int(node.sink.retract(ended))
                p._fill(self.report, p.client.stats())
                p._dead_letters = p._safe_dead_letters()
        finally:
            p.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, None)
            p.round = 0
            p._stop_service()
            p._location = None
        self.report.rounds += self.batches
        self.report.wall_seconds = round(time.perf_counter() - self._start, 3)
        if self._error is not None:
            raise self._error
        return self.report


__all__ = ["StreamingRun"]
