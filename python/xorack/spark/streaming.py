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

import dataclasses
import os
import threading
import time
from typing import Any

import numpy as np

from .barrier import ids_frame, send_staged_events
from .batch import fill_job
from .build import RoundBuilder
from .context import PipelineConfig, RunContext
from .outputs import Aggregate, Sink, WindowAggregate
from .publish import adopt_staged, close_staging, open_staging, retract
from .report import RunReport
from .rows import Source
from .stages import ATTEMPTS_PROPERTY, ROUND_PROPERTY, encode_attempts, u64
from .tracked_rounds import run_summaries
from .windows import WindowStaging, horizon_of, write_emitted


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
                self._rotate()
                self.windows.before_round()
                self.windows.before_batch()
                work = RoundBuilder(ctx, fresh, replays_wanted=True).build()
                run_summaries(work.summaries, self.report)
                self.windows.stage(work, f"b{batch_id:07d}")
                self.windows.saw()
                self._retract_ended()
                self.windows.after_round()
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
        work = RoundBuilder(ctx, {}, replays_wanted=True).build()
        run_summaries(work.summaries, self.report)
        self.windows.stage(work, f"r{round_no:07d}")

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
                    self.windows.after_round(data=False)
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
            ctx.event_time = None
            self.windows.close()
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
        self.windows.ended.append(self._ended[-1])
        ended = np.concatenate(self._ended)
        for node in ctx.plan.python_sinks():
            if node.phase == 0:
                retract(node, ended, self.report)
        self.windows.after_round(data=False)  # nothing pending: plain Spark's watermark
        ctx.dead_letters = ctx.fetch_dead_letters()
        self.report.fill(ctx.client.stats())
        if ctx.config.resume:
            fill_job(ctx, self.report)  # the counts of the whole job, over its restarts


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


OUTPUT_MODES = ("append", "complete")


def check_stream_plan(ctx: RunContext, output_mode: str = "append") -> list[Aggregate]:
    """What a stream can carry, checked at ``start_stream``: row operations, stages and sinks
    on the fresh rows; aggregations written straight into sinks — by a time window over the
    watermark's column in ``append`` mode (each window once, final), any in ``complete`` mode
    (the whole result replaced whenever every record has settled). Returns the
    aggregations."""
    if output_mode == "update":
        raise ValueError(
            "start_stream: output_mode='update' is not supported; 'complete' keeps the whole "
            "current result in the sink (replaced at once), 'append' writes each closed window"
        )
    if output_mode not in OUTPUT_MODES:
        raise ValueError(
            f"start_stream: output_mode must be one of {OUTPUT_MODES}, got {output_mode!r}"
        )
    plan = ctx.plan
    aggs = [b for b in plan.barriers() if isinstance(b, Aggregate)]
    joins = [b.name for b in plan.barriers() if not isinstance(b, Aggregate)]
    if joins:
        raise ValueError(
            f"start_stream: joins of two tracked DataFrames ({joins}) are not supported in a "
            "stream yet; join a static DataFrame as a lookup, or run the pipeline in batch"
        )
    plain = [b.name for b in aggs if not isinstance(b, WindowAggregate)]
    if plain and output_mode == "append":
        raise ValueError(
            f"start_stream: aggregations without a time window ({plain}) write no final row "
            "in append mode; group by a time window (groupBy(F.window('ts', '1 minute'), ...) "
            "after withWatermark('ts', delay): each window is written once, final), or give "
            "output_mode='complete' (the whole result, replaced whenever every record settled)"
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
        if isinstance(agg, WindowAggregate) and output_mode == "append":
            check_event_time_path(agg, plan.watermark, ctx.spark)
        out = plan.derived_source(agg)
        readers = plan.readers(out)
        if not readers or not all(isinstance(r, Sink) for r in readers):
            raise ValueError(
                f"start_stream: write the rows of {agg.name!r} straight into sinks "
                "(.sink(...) on the aggregation's output); operations after an aggregation "
                "are not supported in a stream yet"
            )
        if output_mode == "complete":
            bad = [
                r.name
                for r in readers
                if not isinstance(r, Sink) or not hasattr(r.sink, "replace") or r.caps.native
            ]
            if bad:
                raise ValueError(
                    f"start_stream: in complete mode the sinks of {agg.name!r} ({bad}) must "
                    "replace their whole content at once (SQLiteSink, or your own with "
                    "replace(pdf)); file sinks do not (nor in Spark)"
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


#: A resumable stream's marks in its FT state (job_state): the watermark windows closed by,
#: plain Spark's watermark and the largest event time seen, a window write or a native sink's
#: publication under way (a crash cut it short: taken back and done again).
MARK_WATERMARK = "stream:watermark"
MARK_SPARK = "stream:spark"
MARK_EVICT = "stream:evict"
MARK_MAX = "stream:max_event"
MARK_EMIT = "stream:emitting"
MARK_PUBLISH = "stream:publishing:"
MARK_COMPACTED = "stream:compacted:"
#: Staged directories of a windowed aggregation that make it rewrite them as one.
COMPACT_AFTER = 16


def _upstream(node: Any) -> list[Any]:
    """The nodes whose rows reach ``node`` (parents first, each once)."""
    seen: dict[int, Any] = {}
    stack = list(node.parents)
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen[id(n)] = n
            stack.extend(n.parents)
    return list(seen.values())


def _output_id(df: Any, column: str) -> int | None:
    """The expression id of ``column`` in ``df``'s analyzed plan (None: not there)."""
    out = df._jdf.queryExecution().analyzed().output()
    for i in range(out.size()):
        attr = out.apply(i)
        if attr.name() == column:
            return int(attr.exprId().id())
    return None


def check_event_time_path(agg: WindowAggregate, wm: Any, spark: Any) -> None:
    """The watermark holds the windows back by the source records' own event times, so every
    row reaching ``agg`` must come from the watermark's source, its time column unchanged:
    native operations and transforms pass it through (the same attribute in Spark's analyzed
    plan; a transform is tried on an empty frame), a pandas stage is checked per row as it
    runs; anything else is refused here."""
    from .rows import ArrowStage, RowOperation, Transform

    column = agg.spec.time
    nodes = _upstream(agg)
    nodes.sort(key=lambda n: not isinstance(n, Source))  # the sources first
    for node in nodes:
        if isinstance(node, Source):
            if node.name != wm.source:
                raise ValueError(
                    f"start_stream: rows of source {node.name!r} reach {agg.name!r}, but the "
                    f"watermark is on {wm.source!r}: a record without the event time would not "
                    "hold the windows back; give the windowed aggregation the watermark's source"
                )
        elif isinstance(node, RowOperation) and node.proto is not None and node.analyzed_from:
            try:
                same = _output_id(node.proto, column) == _output_id(node.analyzed_from[0], column)
            except Exception:  # not a classic DataFrame: cannot tell
                same = False
            if not same and column in node.columns:
                raise ValueError(
                    f"start_stream: {node.describe()} changes the event-time column "
                    f"{column!r} before {agg.name!r}; the windows need every row's own event "
                    "time (its source record's): compute a new time under another name"
                )
        elif isinstance(node, Transform) and column in node.columns:
            from .schema import empty_frame

            given = empty_frame(spark, node.parents[0].schema)
            try:  # the transform over an empty frame of its input: does the column pass?
                same = _output_id(node.fn(given), column) == _output_id(given, column)
            except Exception:
                same = False
            if not same:
                raise ValueError(
                    f"start_stream: transform {node.name!r} changes (or hides) the event-time "
                    f"column {column!r} before {agg.name!r}; the windows need every row's own "
                    "event time (its source record's): compute a new time under another name"
                )
        elif isinstance(node, ArrowStage) and column in node.columns:
            raise ValueError(
                f"start_stream: {node.label} {node.name!r} hands on the event-time column "
                f"{column!r} before {agg.name!r} unchecked; use map_in_pandas (each row's time "
                "is checked as it runs) or a native operation"
            )


class StreamState:
    """What a stream keeps between micro-batches: the staged rows of its native sinks (such as
    ``ParquetSink``) and windowed aggregations, and the watermark
    (:mod:`xorack.spark.windows`).

    The rows reaching each of them are staged per round, their events sent from what was
    written. After each micro-batch or replay round, a native sink gets the staged rows of the
    completed attempts appended once no record is pending (an instant where every staged row's
    record has settled; at the latest at ``stop()``); the watermark moves to
    ``min(max event time - delay, min event time pending)`` (never back) and the windows it
    passed are written into the aggregation's sinks, once."""

    def __init__(
        self, ctx: RunContext, aggs: list[Aggregate], report: RunReport, output_mode: str
    ) -> None:
        self.ctx = ctx
        complete = output_mode == "complete"
        self.windowed = [a for a in aggs if isinstance(a, WindowAggregate) and not complete]
        self.complete = aggs if complete else []
        self.report = report
        self.replaces = 0  # results replaced in complete mode
        self.compactions = 0  # rewrites of a windowed aggregation's staged rows
        self._dirty = False  # rows staged since the last replace
        self.ended: list[np.ndarray] = []  # attempts that ended without completing
        self.max_event_us: int | None = None  # the largest event time seen (fresh rows)
        self.spark_us = 0  # plain Spark's watermark (max event time - delay, in ms steps)
        # what plain Spark closes windows by now: the watermark of the micro-batch before
        # (Spark computes a watermark at the end of a micro-batch and uses it in the next)
        self.evict_us = 0
        self.watermark_us = 0  # the watermark the windows close by (held back)
        self.emits = 0  # writes of closed windows
        self._workdir: str | None = None
        self._tags = 0
        self.native = [n for n in ctx.plan.native_sinks() if n.phase == 0] if ctx.ft else []
        self.resume = False
        self.publishes = 0  # appends of settled rows to the native sinks

    @property
    def watermark(self) -> Any:
        """The watermark windows close by, a UTC datetime (the epoch before any input)."""
        import datetime as dt

        return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=self.watermark_us)

    def open(self) -> None:
        ctx = self.ctx
        self.resume = ctx.ft and ctx.config.resume
        if not self.resume:
            for node in ctx.plan.native_sinks():
                if hasattr(node.sink, "clear"):  # a stream appends: start from nothing
                    node.sink.clear(ctx.spark)
        if not self.windowed and not self.native and not self.complete:
            return
        if self.windowed:
            ctx.event_time = ctx.plan.watermark.column if ctx.plan.watermark else None
        self._workdir = open_staging(ctx)
        ctx.workdir = self._workdir
        if self.resume:
            self._restore()

    def _restore(self) -> None:
        """A restarted query: the watermark as its last run left it, the rows its runs staged
        (open windows, unpublished rows), and a write that a crash cut short taken back (it
        is done again)."""
        ctx = self.ctx
        marks = ctx.client.job_state()["marks"]
        self.watermark_us = int(marks.get(MARK_WATERMARK) or 0)
        self.spark_us = int(marks.get(MARK_SPARK) or 0)
        self.evict_us = int(marks.get(MARK_EVICT) or 0)
        top = marks.get(MARK_MAX)
        self.max_event_us = int(top) if top else None
        adopt_staged(ctx, np.empty(0, np.uint64))
        for agg in self.windowed:  # a compaction's directory holds the rows of those before
            last = marks.get(MARK_COMPACTED + agg.name)
            (staging,) = ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            if last and os.path.isdir(os.path.join(staging.root, "_" + last)):
                path = staging.commit(os.path.join(staging.root, "_" + last))  # cut short
                staging.paths = sorted([*staging.paths, path], key=os.path.basename)
            kept = [p for p in staging.paths if os.path.basename(p) == last]
            if last and kept:
                staging.drop_before(kept[0])
        undone: dict[str, str | None] = {}
        cut = marks.get(MARK_EMIT)
        if cut:  # an emission cut short: its files go, the windows are written again
            for node in self._window_sinks():
                if node.caps.native:
                    node.sink.remove_named(ctx.spark, f"w{cut}")
            undone[MARK_EMIT] = None
        for node in self.native:
            pub = marks.get(MARK_PUBLISH + node.name)
            if not pub:
                continue
            name, state = pub.rsplit(":", 1)
            if state == "done":  # published: its staged rows go
                ctx.of(node).staging[0].remove()
            else:  # cut short: its files go, the staged rows are published again
                node.sink.remove_named(ctx.spark, name)
            undone[MARK_PUBLISH + node.name] = None
        if undone:
            ctx.client.job_state(marks=undone)

    def _window_sinks(self) -> list[Any]:
        plan = self.ctx.plan
        return [n for agg in self.windowed for n in plan.readers(plan.derived_source(agg))]

    def _note(self, marks: dict[str, str | None]) -> None:
        """A resumable query's stream state, durable with its FT state."""
        if self.resume:
            self.ctx.client.job_state(marks=marks)

    def close(self) -> None:
        if self._workdir is not None:
            if not self.resume:  # a resumable query keeps its open windows for a restart
                close_staging(self.ctx, self._workdir)
            self._workdir = None
            self.ctx.workdir = None

    def _stagings(self) -> list[WindowStaging]:
        return [
            st
            for agg in self.windowed
            for st in self.ctx.of(agg).staging
            if isinstance(st, WindowStaging)
        ]

    def before_round(self) -> None:
        """The rows staged by the next round are late against the watermark now."""
        for st in self._stagings():
            st.watermark_us = self.watermark_us

    def stage(self, work: Any, tag: str) -> None:
        """Write the round's rows reaching the windowed aggregations, then send their events
        (read back from what was written: an ack never precedes its write)."""
        ctx = self.ctx
        if not work.staged:
            return
        self._tags += 1
        name = f"{ctx.run_tag}{self._tags:07d}-{tag}"  # name order = write order
        paths = [st.write(df, name) for st, df in work.staged]
        self._dirty = True
        assert ctx.location is not None
        send_staged_events(
            ctx.spark, paths, ctx.location, ctx.token, ctx.tls_root_certs, ctx.job, hold=False
        )

    def before_batch(self) -> None:
        """A micro-batch's sources count the largest event time they read (an accumulator:
        no second pass over the micro-batch)."""
        if self.windowed:
            from .tagging import NO_EVENT_TIME, max_param

            sc = self.ctx.spark.sparkContext
            self.ctx.event_max = sc.accumulator(NO_EVENT_TIME, max_param())

    def saw(self) -> None:
        """Plain Spark's watermark after a micro-batch: its largest event time (in Spark's
        milliseconds) minus the delay, never moving back (over every source row of the
        micro-batch, as Spark's watermark node sees them)."""
        from .tagging import NO_EVENT_TIME

        wm = self.ctx.plan.watermark
        acc, self.ctx.event_max = self.ctx.event_max, None
        if not self.windowed or wm is None or acc is None:
            return
        self.evict_us = self.spark_us
        got = int(acc.value)
        if got == NO_EVENT_TIME:
            return
        self.max_event_us = got if self.max_event_us is None else max(self.max_event_us, got)
        spark_us = (self.max_event_us // 1000 - wm.delay_us // 1000) * 1000
        self.spark_us = max(self.spark_us, spark_us)
        self._note(
            {
                MARK_SPARK: str(self.spark_us),
                MARK_EVICT: str(self.evict_us),
                MARK_MAX: str(self.max_event_us),
            }
        )

    def _ended_frame(self) -> Any:
        ended = np.concatenate(self.ended) if self.ended else np.empty(0, np.uint64)
        return ids_frame(self.ctx.spark, ended)

    def publish(self, stats: dict[str, Any]) -> None:
        """Append the staged rows of the native sinks once no record is pending."""
        ctx = self.ctx
        if not self.native or stats.get("pending", 0):
            return
        ended_df = None
        for node in self.native:
            (staging,) = ctx.of(node).staging
            if not staging.paths:
                continue
            if ended_df is None:
                ended_df = self._ended_frame()
            key = MARK_PUBLISH + node.name
            name = "p" + os.path.basename(staging.paths[0].rstrip("/"))
            self._note({key: f"{name}:started"})
            written = node.sink.append(staging.rows(ctx.spark, ended_df), name=name)
            self._note({key: f"{name}:done"})
            self.report.sink_rows[node.name] = self.report.sink_rows.get(node.name, 0) + int(
                written or 0
            )
            staging.remove()
            self._note({key: None})
            self.publishes += 1

    def after_round(self, data: bool = True) -> None:
        """After a micro-batch (``data``) or a replay round (its ended attempts taken):
        publish what settled, close the windows the watermark passed. A replay round is, to
        the watermark, a micro-batch without data: Spark's own, run when the watermark moved,
        closes the windows by the latest watermark."""
        if not self.windowed and not self.native and not self.complete:
            return
        if not data and self.evict_us != self.spark_us:
            self.evict_us = self.spark_us
            self._note({MARK_EVICT: str(self.evict_us)})
        stats = self.ctx.client.stats()
        self.publish(stats)
        self.emit(stats)
        self.replace(stats)

    def replace(self, stats: dict[str, Any]) -> None:
        """Complete mode: once no record is pending, each aggregation's whole result over the
        staged rows of completed attempts replaces its sinks' content (at once)."""
        ctx = self.ctx
        if not self.complete or not self._dirty or stats.get("pending", 0):
            return
        ended_df = self._ended_frame()
        for agg in self.complete:
            out = agg.output(ctx, ended_df).toPandas()
            for node in ctx.plan.readers(ctx.plan.derived_source(agg)):
                assert isinstance(node, Sink)  # checked at start_stream
                rows = out[list(node.columns)]
                self.report.sink_rows[node.name] = int(node.sink.replace(rows))
        self._dirty = False
        self.replaces += 1

    def emit(self, stats: dict[str, Any]) -> None:
        """Move the watermark as far as the records still pending allow, and write the windows
        it passed."""
        ctx = self.ctx
        if not self.windowed:
            return
        hold = self.evict_us
        if stats.get("pending", 0):
            if "min_event_time" not in stats:  # an acker that cannot tell: wait
                return
            pending = stats["min_event_time"]
            if pending is not None:
                hold = min(hold, int(pending))
        new = max(self.watermark_us, hold)
        if new <= self.watermark_us:
            return
        ended_df = self._ended_frame()
        evicted: dict[str, Any] = {}  # the sessions written, whose rows leave the staging
        self._note({MARK_EMIT: str(new)})
        for agg in self.windowed:
            (staging,) = ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            rows = staging.staged(ctx.spark, ended_df)
            out = agg.spec.emit(rows, self.watermark_us, new)
            readers = ctx.plan.readers(ctx.plan.derived_source(agg))
            if len(readers) > 1 or agg.spec.kind == "session_window":  # read more than once
                out = out.localCheckpoint(eager=True)
            for node in readers:
                written = write_emitted(node, out, name=f"w{new}")
                self.report.sink_rows[node.name] = self.report.sink_rows.get(node.name, 0) + written
            if agg.spec.kind == "session_window":
                evicted[agg.name] = out
        self.watermark_us = new
        self._note({MARK_WATERMARK: str(new), MARK_EMIT: None})
        self.emits += 1
        self._compact(ended_df, evicted)

    def _compact(self, ended_df: Any, evicted: dict[str, Any]) -> None:
        """Keep the state of a long stream bounded: once an aggregation by a time window has
        staged ``COMPACT_AFTER`` directories, they are rewritten as one without the rows whose
        windows have all closed (a session window keeps its rows: a session can grow as long
        as rows come)."""
        ctx = self.ctx
        for agg in self.windowed:
            horizon = horizon_of(agg.spec)
            (staging,) = ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            written = evicted.get(agg.name)
            if written is None and (horizon is None or len(staging.paths) < COMPACT_AFTER):
                continue
            self._tags += 1
            name = f"{ctx.run_tag}{self._tags:07d}-compacted"
            if written is not None:  # the rows of the sessions written leave at once
                sessions = agg.spec.session_rows(written)
                hidden = staging.evict(ctx.spark, ended_df, sessions, agg.spec.keys, name)
            else:
                assert horizon is not None
                hidden = staging.compact(ctx.spark, ended_df, self.watermark_us, horizon, name)
            self._note({MARK_COMPACTED + agg.name: name})  # then a restart commits it
            staging.drop_before(staging.commit(hidden))
            self.compactions += 1


__all__ = [
    "OUTPUT_MODES",
    "StreamState",
    "StreamingRun",
    "check_checkpoint",
    "check_stream_plan",
    "checkpoint_config",
    "merged_stream",
    "split_batch",
]
