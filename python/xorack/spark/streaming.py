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

A native expression that raises on a row (a malformed cast, ``raise_error``) fails that row's
record, as in batch runs (:mod:`xorack.spark.row_errors`): the round is abandoned and run again
at once with the row operations guarded.

In streaming, :func:`xorack.spark.current_round` is the micro-batch id (then the drain rounds)
and :func:`xorack.spark.current_attempt` ``(pdf)`` gives each row's attempt (a micro-batch mixes
fresh records and replays).

>>> # run = p.start_stream(timeout=30.0)          # p.source(spark.readStream..., partitions=4)
>>> # ...; report = run.stop(); assert report.lost == 0
>>> # report = p.start_stream(available_now=True).wait()   # a file source, read to the end
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from .batch import fill_job
from .build import RoundBuilder
from .context import PipelineConfig, RunContext
from .guard import RunawayFailure, StreamTally, tally_param
from .outputs import Aggregate, Sink, StreamDedup, StreamJoin, WindowAggregate
from .publish import note_counts, recount, retract
from .report import RunReport
from .row_errors import NativeRowError, RowError, RowGuard, row_error
from .rows import PythonStage, RowOperation, Source
from .stages import ATTEMPTS_PROPERTY, ROUND_PROPERTY, encode_attempts, u64
from .stream_state import StreamState, check_event_time_path, sinks_after, watermark_of
from .tracked_rounds import persist_fresh, raised_while_guarded, run_summaries
from .windows import after_barrier_refusal

log = logging.getLogger(__name__)


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
        output_mode: str = "append",
    ) -> None:
        plan = ctx.plan
        aggs = check_stream_plan(ctx, output_mode)
        self.output_mode = output_mode
        streaming = [s for s in plan.sources if s.df is not None and s.df.isStreaming]
        inputs = [s for s in plan.sources if s.derived is None]
        if not streaming or len(streaming) != len(inputs):
            raise ValueError(
                "start_stream: every source of the pipeline must be a streaming DataFrame (got "
                f"{len(inputs)} source(s), {len(streaming)} streaming); join a static "
                "DataFrame as a lookup (tracked.join(static_df, on))"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
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
        self._sources: list[Source] = streaming
        self._checkpoint: str | None = None  # until the FT state is marked as the query's
        self._attempts: list[tuple[np.ndarray, np.ndarray]] = []  # the round's replays
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
        self._guard = StreamTally(ctx.config.runaway_share)
        self._idle: threading.Thread | None = None
        self.windows = StreamState(ctx, aggs, self.report, output_mode)
        sinks = plan.python_sinks()
        plan.sinks()  # a plan without a sink is an error
        ctx.on_replays = self._replays_taken
        self._embedded_rotation = False
        self._interval = self.timeout
        if self.ft:
            ctx.start_service()
        try:
            self._checkpoint = checkpoint_location if self.ft else None
            if self._checkpoint is not None:
                check_checkpoint(ctx, self._checkpoint)
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
            note_counts(ctx)
            self.windows.open()
            writer = merged_stream(streaming).writeStream.foreachBatch(self._on_batch)
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
            self.windows.close()
            ctx.stop_service()
            raise

    def _replays_taken(self, tables: list[Any]) -> None:
        """Called by the pipeline with the replay tables it feeds to the round being built
        (one call per source): their attempts, for :func:`~xorack.spark.current_attempt` in
        the round's tasks."""
        if not tables:
            return
        src = np.concatenate([u64(t.column("_ft_src")) for t in tables])
        attempt = np.concatenate(
            [t.column("_ft_attempt").to_numpy(zero_copy_only=False) for t in tables]
        )
        self._attempts.append((src, attempt))
        sc = self.ctx.spark.sparkContext
        every = [np.concatenate(x) for x in zip(*self._attempts, strict=True)]
        sc.setLocalProperty(ATTEMPTS_PROPERTY, encode_attempts(every[0], every[1]))

    def _fresh_attempts(self) -> None:
        """A new round: no replay taken yet (every row on its first attempt)."""
        self._attempts = []
        sc = self.ctx.spark.sparkContext
        sc.setLocalProperty(ATTEMPTS_PROPERTY, encode_attempts([], []))

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
                if self._checkpoint is not None:  # the FT state now belongs to the query
                    mark_checkpoint(ctx, self._checkpoint)
                    self._checkpoint = None
                sc = ctx.spark.sparkContext
                sc.setLocalProperty(ROUND_PROPERTY, str(batch_id))
                self._fresh_attempts()
                ctx.round = int(batch_id)
                fresh = split_batch(self._sources, batch_df)
                if not self.ft:
                    work = RoundBuilder(ctx, fresh, replays_wanted=False).build()
                    run_summaries(work.summaries, self.report)
                    for node, df in work.plain_writes:  # native sinks: appended per batch
                        rows = int(node.sink.append(df) or 0)
                        self.report.sink_rows[node.name] = (
                            self.report.sink_rows.get(node.name, 0) + rows
                        )
                    self.batches += 1
                    self._last_batch = int(batch_id)
                    return
                if batch_id > 0 and ctx.config.deterministic_ids:
                    # Spark committed the micro-batches before this one: it runs none of their
                    # source tasks again, so their ids need not be recognized any more
                    ctx.client.forget_known(int(batch_id) - 1)
                self._rotate()
                self.windows.begin_batch(int(batch_id))
                self.windows.before_round()
                self.windows.before_batch()
                self._round(fresh, f"b{batch_id:07d}")
                self.windows.saw()
                self._retract_ended()
                self.windows.after_round()
                # the runaway guard, once the round's failed attempts left the sinks (Spark
                # then leaves the micro-batch uncommitted: every record of it is persisted)
                runaway = self._guard.add_round(dict(ctx.tally.value), fresh=bool(fresh))
                if runaway is not None:
                    raise RunawayFailure(runaway)
                self.batches += 1
                self._last_batch = int(batch_id)
                self._last_activity = time.monotonic()
        except _StoppedBeforeBatch:
            raise
        except BaseException as exc:
            self._error = unisolated(exc)
            if self._error is not exc:
                raise self._error from exc
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
        self.windows.ended.append(ended)
        for node in self.ctx.plan.python_sinks():
            if node.phase == 0:
                retract(node, ended, self.report)

    def _replay_round(self, round_no: int) -> None:
        """A round of the replays waiting in the FT layer, without fresh input (when the
        stream is idle, and the drain after ``stop()``)."""
        ctx = self.ctx
        sc = ctx.spark.sparkContext
        ctx.round = round_no
        sc.setLocalProperty(ROUND_PROPERTY, str(round_no))
        self._fresh_attempts()  # set per replay
        self.windows.before_round()
        self._round({}, f"r{round_no:07d}")

    def _round(self, fresh: dict[int, Any], tag: str) -> None:
        """A round's work: ``fresh`` input (a micro-batch's) and the replays waiting, through
        every stage, Python sink and staging. Once a native expression raised on a row, the
        stream's row operations are guarded (:mod:`xorack.spark.row_errors`): the rows that
        raise fail their records, after the round's writes. The round that met the error is
        abandoned (:meth:`_abandon`) and run again at once, guarded: Spark commits the
        micro-batch only when this returns, with every one of its records persisted. A guarded
        micro-batch in which no row raised, with no replay waiting, ends the guard: a stream
        pays for it (building and running a guarded round took 1.5x an unguarded one's time
        in ``bench_streaming``'s query) only while bad rows come."""
        ctx = self.ctx
        guard = ctx.guarded.get(0)
        # the round's records seen and failed per stage and error (the runaway guard)
        ctx.tally = ctx.spark.sparkContext.accumulator({}, tally_param())
        try:
            work = RoundBuilder(ctx, fresh, replays_wanted=True, guard=guard).build()
            run_summaries(work.summaries, self.report)
            self.windows.stage(work, tag)
        except Exception as exc:
            error = row_error(exc)
            if error is None:
                raise
            self._abandon(error, exc, fresh)
            self._round({}, f"{tag}g")  # the same records, as collateral replays
            return
        if guard is None:
            return
        raised = guard.settle(ctx.client, ctx.tally)
        if not raised and fresh and not ctx.client.stats().get("replays_waiting"):
            # a micro-batch in which no row raised, and no replay waiting (a record that raised
            # would raise again): the stream goes on unguarded (a row that raises later
            # abandons its round again)
            del ctx.guarded[0]
            log.info("micro-batch %d: no row raised: the row operations go unguarded", ctx.round)

    def _abandon(self, error: RowError, exc: BaseException, fresh: dict[int, Any]) -> None:
        """A round that a native expression failed on a row (Spark stopped its job there):
        the micro-batch's records are persisted, those of the round still pending are replayed
        as collateral (no attempt used up) and their rows leave the sinks; the stream's row
        operations are guarded until a micro-batch passes without a raising row. Records the
        round completed stay completed (their rows are in the sinks, final)."""
        ctx = self.ctx
        if 0 in ctx.guarded:  # it raised with every row operation guarded
            raise raised_while_guarded(0, error) from exc
        log.warning(
            "micro-batch %d: a native expression raised on a row (%s): the round is abandoned "
            "(its records replayed, no attempt used up) and the stream goes on with its row "
            "operations guarded",
            ctx.round,
            error.message,
        )
        ctx.guarded[0] = RowGuard(ctx.spark, error)
        if fresh:  # Spark stopped the job: the tasks it did not run persisted nothing
            persist_fresh(ctx, 0, fresh, np.empty(0, np.uint64), error, exc)
        ctx.client.expire_all(collateral=True)
        self._fresh_attempts()
        self.report.abandoned_rounds += 1

    def _replay_when_idle(self) -> None:
        """Replays do not wait for the next micro-batch: when none came for a timeout bucket's
        time and replays are waiting (failed rows, timed-out records), a replay round runs
        them now, as the drain at ``stop()`` would. Runs in a thread of its own until
        ``stop()``; an error ends it and is raised by ``stop()``."""
        ctx = self.ctx
        # the session is active per JVM thread: code that asks for the active one (the
        # declaration's generator checks, Arrow conversions) must find it in this thread too
        jvm = ctx.spark.sparkContext._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(ctx.spark._jsparkSession)
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
                    # counted when it starts: its writes can make the sinks exact before the
                    # round's bookkeeping below is over
                    self.idle_rounds += 1
                    self._replay_round(self._last_batch + 1)  # the next micro-batch's number
                    self._retract_ended()
                    self.windows.after_round(data=False)
                    self._last_activity = time.monotonic()
                except BaseException as exc:
                    self._error = unisolated(exc)
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
            with self._lock:
                self._settle_windows()
            self.query.stop()
            if self._embedded_rotation:
                ctx.ft_layer.stop()
            with self._lock:
                if self.ft:
                    try:
                        # a runaway error: its failed records are not replayed to their
                        # dead letters (they stay pending in the FT state)
                        self._finish(drain and not isinstance(self._error, RunawayFailure))
                    except Exception as exc:
                        error = unisolated(exc)
                        if error is exc:
                            raise
                        raise error from exc
                else:
                    self.report.untracked()
        finally:
            ctx.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, None)
            ctx.spark.sparkContext.setLocalProperty(ATTEMPTS_PROPERTY, None)
            ctx.on_replays = None
            ctx.resume_skip = {}
            ctx.round = 0
            ctx.event_times = {}
            self.windows.close()
            ctx.stop_service()
            ctx.release()
        self.report.rounds += self.batches + self.idle_rounds
        self.report.wall_seconds = round(time.perf_counter() - self._start, 3)
        if self._error is not None:
            raise self._error
        return self.report

    def _settle_windows(self) -> None:
        """Wait for the window write running beside the last micro-batch (before the query
        stops: stopping it cancels its jobs). Its error is the run's (raised by ``stop()``)
        and the drain writes its windows again (its watermark went back)."""
        try:
            self.windows.beside.settle()
        except Exception as exc:
            log.warning("the last window write failed; the drain writes its windows again")
            if self._error is None:
                self._error = unisolated(exc)

    def _finish(self, drain: bool) -> None:
        """With FT on, after the query stopped: drain, retract, fill the report."""
        ctx = self.ctx
        self._settle_windows()
        self.windows.beside.enabled = False  # the drain's window writes are waited for
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
        self.windows.ended.append(self._ended[-1])
        ended = np.concatenate(self._ended)
        for node in ctx.plan.python_sinks():
            if node.phase == 0:
                retract(node, ended, self.report)
                recount(ctx, node, self.report)
        self.windows.after_round(data=False)  # nothing pending: plain Spark's watermark
        ctx.dead_letters = ctx.fetch_dead_letters()
        self.report.fill(ctx.client.stats())
        if ctx.config.resume:
            fill_job(ctx, self.report)  # the counts of the whole job, over its restarts


def unisolated(exc: BaseException) -> BaseException:
    """``exc`` as a stream raises it: a native row error that reached here (not met in a
    round's tracked operations, which isolate its row) as a :class:`NativeRowError` saying
    where it came from; any other error as it is."""
    if isinstance(exc, NativeRowError):
        return exc
    error = row_error(exc)
    if error is None:
        return exc
    return NativeRowError(
        f"{error.message} — raised where xorack does not isolate rows: in a stateful operation "
        "or after it (an aggregate's own expression, a join condition, the operations over a "
        "window's, a join's or a deduplication's output, evaluated as the watermark passes "
        "them) or in a sink; xorack isolates the rows of the row operations before a stateful "
        "one. Fix the data or the expression (a try_ function)"
    )


#: Where a stream's FT state lives inside its Spark checkpoint by default.
CHECKPOINT_STATE = "xorack"


def _local_path(location: str) -> str | None:
    """The local directory of a checkpoint location (a path or a ``file:`` URI), else None."""
    from urllib.parse import urlparse

    if location.startswith("file:"):
        return os.path.abspath(urlparse(location).path)
    return None if "://" in location else os.path.abspath(location)


def checkpoint_config(config: PipelineConfig, checkpoint: str | None) -> PipelineConfig:
    """The settings of a stream with a Spark checkpoint: the pipeline's when it is resumable
    already; else (FT on, the default memory storage, the embedded acker) a durable FT state
    inside the checkpoint. Anything else is refused: a restart would lose the records a
    crashed driver left pending, silently."""
    if checkpoint is None or not config.ft or config.resume:
        return config
    if not isinstance(checkpoint, str) or not checkpoint:
        raise TypeError(f"checkpoint_location must be a path, got {checkpoint!r}")
    local = _local_path(checkpoint)
    default = config.storage == "memory" and config.service is None and config.ackers == 1
    if local is None or not default:
        raise ValueError(
            "start_stream: with a Spark checkpoint a restarted query skips the offsets it "
            "committed, so the records a crashed driver left pending must outlive it: give "
            "Pipeline(resume=True, storage='sqlite:///...', workdir=...) (README: Resuming "
            "after a driver crash); the default keeps them inside a local checkpoint"
        )
    state = os.path.join(local, CHECKPOINT_STATE)
    os.makedirs(state, exist_ok=True)
    return dataclasses.replace(
        config,
        storage=f"sqlite:///{os.path.join(state, 'ft.db')}",
        workdir=os.path.join(state, "work"),
        resume=True,
    )


def _checkpoint_id(ctx: RunContext, checkpoint: str) -> tuple[str | None, bool]:
    """The query id of a Spark checkpoint (its ``metadata``) and whether it planned a batch
    (its ``offsets`` log is not empty), through Hadoop's file system API."""
    import json

    jvm = ctx.spark._jvm
    conf = ctx.spark._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(checkpoint)
    fs = root.getFileSystem(conf)
    meta = jvm.org.apache.hadoop.fs.Path(checkpoint + "/metadata")
    query = None
    if fs.exists(meta):
        stream = fs.open(meta)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        query = json.loads(text.splitlines()[0]).get("id")
    offsets = jvm.org.apache.hadoop.fs.Path(checkpoint + "/offsets")
    planned = bool(fs.exists(offsets) and len(fs.listStatus(offsets)) > 0)
    return query, planned


def check_checkpoint(ctx: RunContext, checkpoint: str) -> None:
    """Refuse a start whose FT state does not belong to the Spark checkpoint: a checkpoint
    that planned micro-batches needs the FT state its query marked (a memory storage, a deleted
    or another query's FT state would lose the records its crash left pending); a new
    checkpoint needs an FT state no query has used."""
    query, planned = _checkpoint_id(ctx, checkpoint)
    state = ctx.client.job_state()
    marked = state["marks"].get("checkpoint")
    storage = ctx.config.storage
    if planned and marked is None:
        raise ValueError(
            f"start_stream: the checkpoint {checkpoint} has run micro-batches, but the FT state "
            f"({storage}) has none of its query: the records its last run left pending would "
            "be lost; give the storage and workdir that query used, or delete the checkpoint "
            "to start over"
        )
    if marked is not None and marked != query:
        raise ValueError(
            f"start_stream: the FT state ({storage}) belongs to query {marked}, the checkpoint "
            f"{checkpoint} to {query or 'no query yet'}; give each query its own storage (the "
            "default keeps it inside the checkpoint), or delete both to start over"
        )
    if not planned and marked is None and state["progress"]:
        raise ValueError(
            f"start_stream: the FT state ({storage}) holds records of another query; give this "
            "query a storage of its own (the default keeps it inside the checkpoint)"
        )


def mark_checkpoint(ctx: RunContext, checkpoint: str) -> None:
    """Note in the FT state which query it belongs to (the checkpoint's id), before the first
    micro-batch of this run persists anything."""
    query, _ = _checkpoint_id(ctx, checkpoint)
    if query is not None:
        ctx.client.job_state(marks={"checkpoint": query})


#: The column telling, in a micro-batch of several streaming sources, which source a row is of.
SOURCE_COLUMN = "_ft_input"


def _source_column(source: Source, column: str) -> str:
    return f"_ft_s{source.index}_{column}"


def merged_stream(sources: list[Source]) -> Any:
    """The one streaming DataFrame a query over ``sources`` reads: the source itself, or the
    union of several (each row with its source's index and its columns under names of their
    own, so that sources of different columns and types meet)."""
    from functools import reduce

    from pyspark.sql import functions as F

    if len(sources) == 1:
        return sources[0].df
    frames = [
        s.df.select(
            F.lit(s.index).alias(SOURCE_COLUMN),
            *[F.col(f"`{c}`").alias(_source_column(s, c)) for c in s.columns],
        )
        for s in sources
    ]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def split_batch(sources: list[Source], batch_df: Any) -> dict[int, Any]:
    """A micro-batch of :func:`merged_stream` split back into each source's fresh rows."""
    from pyspark.sql import functions as F

    if len(sources) == 1:
        return {sources[0].index: batch_df}
    return {
        s.index: batch_df.where(F.col(SOURCE_COLUMN) == s.index).select(
            *[F.col(_source_column(s, c)).alias(c) for c in s.columns]
        )
        for s in sources
    }


def _check_after(plan: Any, barrier: Any, what: str, output_mode: str) -> list[Any]:
    """What ``start_stream`` accepts after a streaming barrier: sinks, reached through native
    row operations that keep each emitted row's id (:func:`after_barrier_refusal`), in append
    mode only. Returns its :func:`sinks_after`."""
    after = sinks_after(plan, barrier)
    if not after:
        raise ValueError(
            f"start_stream: {barrier.name!r} {what} but nothing reads its rows; end its branch "
            "in .sink(...)"
        )
    for _, chain in after:
        if not chain:
            continue
        last = chain[-1]
        if not isinstance(last, RowOperation):
            kind = "a pandas/Arrow stage" if isinstance(last, PythonStage) else last.label
            raise ValueError(
                f"start_stream: {last.name!r} ({kind}) after {barrier.name!r} ({what}) is not "
                "supported in a stream (only native select, withColumn(s), filter/where, "
                "withColumnRenamed, drop, fillna are); run it before the barrier, or in a "
                "second query reading the sink"
            )
        for op_node in chain:
            why = after_barrier_refusal(op_node.op)
            if why is not None:
                raise ValueError(
                    f"start_stream: {op_node.name!r} {why}on the rows of {barrier.name!r} "
                    f"({what}) in a stream: each emitted row must stay one row with its id)"
                )
        if output_mode != "append":
            raise ValueError(
                f"start_stream: operations after {barrier.name!r} ({chain[0].name!r} ...) "
                f"in {output_mode} mode are not supported (xorack writes a group's row at "
                "other moments than Spark, so a filter would keep other stale rows): use "
                "append mode, or do them when reading the sink"
            )
    return after


OUTPUT_MODES = ("append", "update", "complete")
#: The stateful operations of a stream that write rows straight into sinks once settled.
STREAMED = (StreamJoin, StreamDedup)


def check_stream_plan(ctx: RunContext, output_mode: str = "append") -> list[Aggregate]:
    """What a stream can carry, checked at ``start_stream``: row operations, stages and sinks
    on the fresh rows; aggregations written straight into sinks — by a time window over the
    watermark's column in ``append`` mode (each window once, final), any in ``complete`` mode
    (the whole result replaced whenever every record has settled). Returns the
    aggregations."""
    if output_mode not in OUTPUT_MODES:
        raise ValueError(
            f"start_stream: output_mode must be one of {OUTPUT_MODES}, got {output_mode!r}"
        )
    plan = ctx.plan
    aggs = [b for b in plan.barriers() if isinstance(b, Aggregate)]
    streams = [b for b in plan.barriers() if isinstance(b, STREAMED)]
    joins = [b.name for b in plan.barriers() if not isinstance(b, (Aggregate, *STREAMED))]
    if joins:
        raise ValueError(
            f"start_stream: joins of two tracked DataFrames ({joins}) need both sides to be "
            "streams with a watermark (a stream-stream join); join a static DataFrame as a "
            "lookup, or run the pipeline in batch"
        )
    for j in streams:
        what = "joins two streams" if isinstance(j, StreamJoin) else "drops duplicates"
        if not ctx.ft:
            raise ValueError(
                f"start_stream: Pipeline(ft=False) runs no stateful operation ({j.name!r} "
                f"{what}); run the query in plain Structured Streaming to compare"
            )
        if output_mode != "append" and (isinstance(j, StreamJoin) or output_mode == "complete"):
            modes = "append mode only" if isinstance(j, StreamJoin) else "append or update mode"
            raise ValueError(f"start_stream: {j.name!r} {what}: {modes} (as in Spark)")
        if aggs:
            raise ValueError(
                f"start_stream: {j.name!r} {what}; with an aggregation in the same query this "
                "is not supported yet: run them as two queries"
            )
        if isinstance(j, StreamJoin):
            for par in j.parents:
                wm = watermark_of(plan, par)
                assert wm is not None  # checked at declaration
                check_event_time_path(j, wm, ctx.spark, via=par)
        else:
            (par,) = j.parents
            wm = watermark_of(plan, par)
            time = wm.column if wm is not None and wm.column in par.columns else None
            if time != j.spec.time:
                raise ValueError(
                    f"start_stream: {j.name!r} was declared before the source's withWatermark; "
                    "declare the watermark first (p.source(df).withWatermark(...)), then "
                    "dropDuplicates"
                )
            if wm is not None and time is not None:
                check_event_time_path(j, wm, ctx.spark, via=par)
        _check_after(plan, j, what, output_mode)
    plain = [b.name for b in aggs if not isinstance(b, WindowAggregate)]
    if plain and output_mode == "append":
        raise ValueError(
            f"start_stream: aggregations without a time window ({plain}) write no final row "
            "in append mode; group by a time window (groupBy(F.window('ts', '1 minute'), ...) "
            "after withWatermark('ts', delay): each window is written once, final), or give "
            "output_mode='complete' (the whole result, replaced whenever every record settled) "
            "or 'update' (each changed group's row, replaced by its key)"
        )
    for agg in aggs:
        if not ctx.ft:
            raise ValueError(
                "start_stream: Pipeline(ft=False) runs no aggregation in a stream; run the "
                "query in plain Structured Streaming to compare"
            )
        if isinstance(agg, WindowAggregate) and output_mode == "append" and not plan.watermark:
            raise ValueError(
                f"start_stream: {agg.name!r} groups by a time window but the stream has no "
                "watermark: declare withWatermark(column, delay) on the source (a window is "
                "written once the watermark passes its end)"
            )
        if any(p.phase != 0 for p in agg.parents):
            raise ValueError(
                f"start_stream: {agg.name!r} aggregates the output of another aggregation; "
                "one aggregation per branch of a stream"
            )
        if isinstance(agg, WindowAggregate) and output_mode != "complete" and plan.watermark:
            check_event_time_path(agg, plan.watermark, ctx.spark)
        after = _check_after(plan, agg, "aggregates", output_mode)
        readers = [node for node, _ in after]
        how = {
            "complete": ("replace", "replace their whole content at once", "replace(pdf)"),
            "update": ("upsert", "replace a group's row by its key", "upsert(pdf, keys)"),
        }
        if output_mode in how:
            method, what, call = how[output_mode]
            bad = [
                r.name
                for r in readers
                if not isinstance(r, Sink) or not hasattr(r.sink, method) or r.caps.native
            ]
            if bad:
                raise ValueError(
                    f"start_stream: in {output_mode} mode the sinks of {agg.name!r} ({bad}) must "
                    f"{what} (SQLiteSink, or your own with {call}); file sinks do not (nor in "
                    "Spark)"
                )
        session = isinstance(agg, WindowAggregate) and agg.spec.kind == "session_window"
        if output_mode == "update" and session:
            raise ValueError(
                f"start_stream: {agg.name!r} groups by a session window: append or "
                "complete mode (a session's row changes its key as the session grows)"
            )
    no_append = [n.name for n in plan.native_sinks() if not hasattr(n.sink, "append")]
    if no_append:
        raise ValueError(
            f"start_stream: native sinks {no_append} have no append(df): a stream adds rows "
            "to a native sink micro-batch after micro-batch (ParquetSink has it)"
        )
    if ctx.ft and ctx.config.resume:  # a write a crash cut short is done again
        once = [
            n.name
            for n in plan.sinks()
            if (n.caps.native and not hasattr(n.sink, "remove_named"))
            or (not n.caps.native and n.phase > 0 and not n.caps.idempotent)
        ]
        if once:
            raise ValueError(
                f"start_stream: a checkpoint (resume=True) needs sinks that a write done again "
                f"leaves as they were; {once} cannot: use ParquetSink or an idempotent sink "
                "(SQLiteSink, or your own declaring SinkCapabilities(idempotent=True))"
            )
    return aggs


__all__ = [
    "OUTPUT_MODES",
    "StreamingRun",
    "check_checkpoint",
    "check_stream_plan",
    "checkpoint_config",
    "merged_stream",
    "split_batch",
]
