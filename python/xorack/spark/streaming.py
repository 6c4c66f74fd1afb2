"""Structured Streaming: the pipeline's stages inside ``foreachBatch``.

Each micro-batch tags its fresh source rows, adds the replays waiting in the FT layer (failed
or timed out in earlier micro-batches, each placed on the partition its replay partitioner
chose), and runs every stage and sink once (one Spark action). Timeouts rotate on wall-clock
time: a record not completed ``timeout`` seconds after it was persisted or replayed is replayed
in a later micro-batch. :meth:`StreamingRun.stop` stops the query and drains: what is still
pending is run in batch rounds until it is completed or dead-lettered.

With ``available_now=True`` the query reads what the source holds when it starts (Spark's
``trigger(availableNow=True)``) and ends by itself; :meth:`StreamingRun.wait` waits for that,
then drains and returns the report. With ``Pipeline(spark, ft=False)`` the same stages run in
``foreachBatch`` without tagging, service or extra columns (for comparison; the report's
tracking counts are ``None``, as in batch runs with FT off).

In streaming, :func:`xorack.spark.current_round` is the micro-batch id (then the drain rounds)
and :func:`xorack.spark.current_attempt` ``(pdf)`` gives each row's attempt (a micro-batch mixes
fresh records and replays).

>>> # run = p.start_stream(timeout=30.0)          # p.source(spark.readStream..., partitions=4)
>>> # ...; report = run.stop(); assert report.lost == 0
>>> # report = p.start_stream(available_now=True).wait()   # a file source, read to the end
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from .batch import fill_job
from .build import RoundBuilder
from .context import RunContext
from .publish import retract
from .report import RunReport
from .rows import Source
from .stages import ATTEMPTS_PROPERTY, ROUND_PROPERTY, encode_attempts, u64
from .tracked_rounds import run_summaries


class _StoppedBeforeBatch(Exception):
    """A micro-batch that arrived after ``stop()``: failed on purpose so it is not committed."""


class StreamingRun:
    """A running streaming query over a :class:`~xorack.spark.Pipeline` with one streaming
    source, on the run context ``ctx`` (public: nothing of the pipeline's own). Built by
    :meth:`Pipeline.start_stream`."""

    def __init__(
        self,
        ctx: RunContext,
        timeout: float = 30.0,
        trigger_seconds: float | None = None,
        checkpoint_location: str | None = None,
        available_now: bool = False,
    ) -> None:
        plan = ctx.plan
        barriers = [n.name for n in plan.barriers()]
        native = [n.name for n in plan.native_sinks()]
        if barriers or native:
            raise ValueError(
                "start_stream: aggregations and tracked joins "
                f"({barriers}) and native sinks such as ParquetSink ({native}) need the whole "
                "input to settle before they produce rows; in streaming, aggregate in the sink "
                "(or run the pipeline in batch with p.run()). Native row operations (filter, "
                "select, explode, lookup joins) work in streaming."
            )
        streaming = [s for s in plan.sources if s.df is not None and s.df.isStreaming]
        if len(streaming) != 1 or len(plan.sources) != 1:
            raise ValueError(
                "start_stream: the pipeline needs exactly one source, a streaming DataFrame "
                f"(got {len(plan.sources)} source(s), {len(streaming)} streaming)"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if checkpoint_location is not None and ctx.ft and not ctx.config.resume:
            raise ValueError(
                "start_stream: with a Spark checkpoint a restarted query skips the offsets it "
                "committed, so the records a crashed driver left pending would be lost "
                "silently; give Pipeline(resume=True, storage='sqlite:///...', workdir=...) "
                "with checkpoint_location (README: Resuming after a driver crash)"
            )
        if available_now and trigger_seconds is not None:
            raise ValueError(
                "start_stream: available_now=True reads the input to its end as fast as it can; "
                f"it takes no trigger_seconds (got {trigger_seconds}): give one or the other"
            )
        self.ctx = ctx
        self.timeout = float(timeout)
        self.ft = ctx.ft
        self.available_now = bool(available_now)
        self.report = RunReport(ft=self.ft)
        self.batches = 0
        self._source: Source = streaming[0]
        self._lock = threading.Lock()
        self._last_batch = -1
        self._start = time.perf_counter()
        self._next_rotation = time.monotonic()
        self._error: BaseException | None = None
        self._stopping = False
        self._stopped = False
        self._ended: list[np.ndarray] = []  # attempts that ended without completing
        self._last_activity = time.monotonic()  # when a micro-batch or idle round last ended
        self.idle_rounds = 0  # replay rounds run while no micro-batch came
        self._wake = threading.Event()  # set by stop(): the idle replayer ends
        self._idle: threading.Thread | None = None
        sinks = plan.python_sinks()
        plan.sinks()  # a plan without a sink is an error
        ctx.on_replays = self._replays_taken
        self._embedded_rotation = False
        self._interval = self.timeout
        if self.ft:
            ctx.start_service()
        try:
            if ctx.config.resume:  # restarted from its checkpoint: Spark re-runs the
                # micro-batch the crash cut short; the rows its earlier run persisted are
                # skipped (their records are replayed by the FT layer, or completed)
                ctx.resume_skip = ctx.client.job_state()["progress"]
                self.report.resumed = bool(ctx.resume_skip)
            if self.ft:
                ft = ctx.ft_layer
                num_buckets = getattr(ft, "num_buckets", 3)
                self._interval = self.timeout / num_buckets
                self._embedded_rotation = ft is not None and hasattr(ft, "start")
                if self._embedded_rotation:
                    ft.start(self._interval)  # background rotations on wall-clock time
            for node in sinks:
                node.create()
            writer = self._source.df.writeStream.foreachBatch(self._on_batch)
            if trigger_seconds is not None:
                writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
            elif self.available_now:
                writer = writer.trigger(availableNow=True)
            if checkpoint_location is not None:
                writer = writer.option("checkpointLocation", checkpoint_location)
            self.query = writer.start()
            if self.ft and not self.available_now:
                self._idle = threading.Thread(
                    target=self._replay_when_idle, name="xorack-idle-replays", daemon=True
                )
                self._idle.start()
        except BaseException:
            ctx.on_replays = None
            ctx.resume_skip = {}
            ctx.stop_service()
            raise

    def _replays_taken(self, tables: list[Any]) -> None:
        """Called by the pipeline with the replay tables it feeds to the round being built:
        their attempts, for :func:`~xorack.spark.current_attempt` in the round's tasks."""
        if not tables:
            return
        src = np.concatenate([u64(t.column("_ft_src")) for t in tables])
        attempt = np.concatenate(
            [t.column("_ft_attempt").to_numpy(zero_copy_only=False) for t in tables]
        )
        sc = self.ctx.spark.sparkContext
        sc.setLocalProperty(ATTEMPTS_PROPERTY, encode_attempts(src, attempt))

    def _on_batch(self, batch_df: Any, batch_id: int) -> None:
        ctx = self.ctx
        try:
            with self._lock:
                if self._stopping:
                    # stop() was called: raising keeps Spark from committing the batch's offsets
                    # (returning would commit rows that were never tagged nor persisted)
                    raise _StoppedBeforeBatch(
                        f"micro-batch {batch_id} started after stop(): left uncommitted"
                    )
                sc = ctx.spark.sparkContext
                sc.setLocalProperty(ROUND_PROPERTY, str(batch_id))
                sc.setLocalProperty(ATTEMPTS_PROPERTY, encode_attempts([], []))  # all fresh
                ctx.round = int(batch_id)
                fresh = {self._source.index: batch_df}
                if not self.ft:
                    work = RoundBuilder(ctx, fresh, replays_wanted=False).build()
                    run_summaries(work.summaries, self.report)
                    self.batches += 1
                    self._last_batch = int(batch_id)
                    return
                self._rotate()
                work = RoundBuilder(ctx, fresh, replays_wanted=True).build()
                run_summaries(work.summaries, self.report)
                self._retract_ended()
                self.batches += 1
                self._last_batch = int(batch_id)
                self._last_activity = time.monotonic()
        except _StoppedBeforeBatch:
            raise
        except BaseException as exc:
            self._error = exc
            raise

    def _rotate(self) -> None:
        """An external acker's timeouts rotate from here, on wall-clock time (the embedded
        one rotates in a thread of its own)."""
        if self._embedded_rotation:
            return
        now = time.monotonic()
        while now >= self._next_rotation:
            self.ctx.client.rotate()
            self._next_rotation += self._interval

    def _retract_ended(self) -> None:
        """All or nothing at every moment, not only after ``stop()``: the rows of attempts
        that ended without completing (failed, timed out, dead-lettered) leave the sinks as
        soon as the micro-batch or replay round that saw them end is over (no task of this
        query writes then: micro-batches and replay rounds run one at a time)."""
        ended = self.ctx.client.take_ended()
        if not len(ended):
            return
        self._ended.append(ended)
        for node in self.ctx.plan.python_sinks():
            retract(node, ended, self.report)

    def _replay_round(self, round_no: int) -> None:
        """A round of the replays waiting in the FT layer, without fresh input (when the
        stream is idle, and the drain after ``stop()``)."""
        ctx = self.ctx
        sc = ctx.spark.sparkContext
        ctx.round = round_no
        sc.setLocalProperty(ROUND_PROPERTY, str(round_no))
        sc.setLocalProperty(ATTEMPTS_PROPERTY, encode_attempts([], []))  # set per replay
        work = RoundBuilder(ctx, {}, replays_wanted=True).build()
        run_summaries(work.summaries, self.report)

    def _replay_when_idle(self) -> None:
        """Replays do not wait for the next micro-batch: when none came for a timeout bucket's
        time and replays are waiting (failed rows, timed-out records), a replay round runs
        them now, as the drain at ``stop()`` would. Runs in a thread of its own until
        ``stop()``; an error ends it and is raised by ``stop()``."""
        ctx = self.ctx
        while not self._wake.wait(self._interval / 2):
            if time.monotonic() - self._last_activity < self._interval:
                continue  # micro-batches are coming: they take the replays
            with self._lock:
                if self._stopping or self._error is not None:
                    return
                try:
                    self._rotate()
                    stats = ctx.client.stats()
                    if not stats.get("replays_waiting") and not stats.get("pending"):
                        self._last_activity = time.monotonic()
                        continue
                    if not stats.get("replays_waiting"):
                        continue  # pending records not timed out yet
                    self._replay_round(self._last_batch + 1)  # the next micro-batch's number
                    self._retract_ended()
                    self.idle_rounds += 1
                    self._last_activity = time.monotonic()
                except BaseException as exc:
                    self._error = exc
                    return

    def wait(self, timeout: float | None = None) -> RunReport:
        """Wait until the query terminates, then :meth:`stop` (drain) and return the report.

        With ``available_now=True`` the query ends by itself once it has read everything the
        source held when it started; then the replays still waiting and the records still
        pending are run in batch rounds, so the report accounts for the whole input. (Any
        other query runs until stopped: ``wait`` then blocks until one of its micro-batches
        fails, or raises ``TimeoutError`` after ``timeout`` seconds.) A failed micro-batch's
        error is raised after the drain.

        >>> # report = p.start_stream(available_now=True).wait(timeout=600)
        >>> # assert report.lost == 0
        """
        if timeout is not None and timeout <= 0:
            raise ValueError(f"wait: timeout must be > 0 seconds or None, got {timeout}")
        try:
            if timeout is None:
                self.query.awaitTermination()
                ended = True
            else:
                ended = bool(self.query.awaitTermination(timeout))
        except Exception as exc:  # StreamingQueryException: a micro-batch failed
            if self._error is None:
                self._error = exc
            ended = True
        if not ended:
            raise TimeoutError(
                f"wait: the streaming query is still running after {timeout} s (only "
                "available_now=True queries end by themselves); call wait() again, or stop() "
                "to end it and drain"
            )
        return self.stop()

    def stop(self, drain: bool = True) -> RunReport:
        """Stop the query; with ``drain``, run what is still pending in batch rounds (timed
        out now: no micro-batch is running any more) until it completes or is dead-lettered.
        Returns the report of the whole run (a second call returns it again)."""
        ctx = self.ctx
        if self._stopped:
            return self.report
        self._stopped = True
        try:
            with self._lock:  # let the running micro-batch finish; no new one starts its work
                self._stopping = True
            self._wake.set()
            if self._idle is not None:
                self._idle.join()
            self.query.stop()
            if self._embedded_rotation:
                ctx.ft_layer.stop()
            with self._lock:
                if self.ft:
                    self._finish(drain)
                else:
                    self.report.untracked()
        finally:
            ctx.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, None)
            ctx.spark.sparkContext.setLocalProperty(ATTEMPTS_PROPERTY, None)
            ctx.on_replays = None
            ctx.resume_skip = {}
            ctx.round = 0
            ctx.stop_service()
            ctx.release()
        self.report.rounds += self.batches + self.idle_rounds
        self.report.wall_seconds = round(time.perf_counter() - self._start, 3)
        if self._error is not None:
            raise self._error
        return self.report

    def _finish(self, drain: bool) -> None:
        """With FT on, after the query stopped: drain, retract, fill the report."""
        ctx = self.ctx
        if drain:
            for r in range(ctx.config.max_attempts + 1):
                ctx.client.expire_all()
                if not ctx.client.stats().get("pending", 0):
                    break
                self._replay_round(self._last_batch + 1 + r)
                self.report.rounds += 1
        # all or nothing: the rows of attempts that ended without completing go (those of
        # earlier micro-batches again: a row written late by an attempt retracted before)
        self._ended.append(ctx.client.take_ended())
        ended = np.concatenate(self._ended)
        for node in ctx.plan.python_sinks():
            retract(node, ended, self.report)
        ctx.dead_letters = ctx.fetch_dead_letters()
        self.report.fill(ctx.client.stats())
        if ctx.config.resume:
            fill_job(ctx, self.report)  # the counts of the whole job, over its restarts


__all__ = ["StreamingRun"]
