"""What a stream keeps between micro-batches (:class:`StreamState`): the staged rows of its
native sinks and windowed aggregations, the watermark, the marks a resumable stream notes in
its FT state; and the check that every row reaching a windowed aggregation keeps its source
record's event time (:func:`check_event_time_path`). Used by :mod:`xorack.spark.streaming`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from .barrier import ids_frame, remove_local, send_staged_events
from .context import RunContext
from .node import roots
from .outputs import Aggregate, Sink, StreamDedup, StreamJoin, WindowAggregate
from .publish import adopt_staged, close_staging, open_staging
from .report import RunReport
from .rows import RowOperation, Source
from .stream_dedup import DedupStaging, DedupState
from .stream_emission import BesideWrites, Written
from .stream_join import JoinState
from .stream_update import Updates
from .windows import WindowStaging, closes_any, horizon_of, write_emitted

#: A resumable stream's marks in its FT state (job_state): the watermark windows closed by,
#: plain Spark's watermark and the largest event time seen, a window write or a native sink's
#: publication under way (a crash cut it short: taken back and done again).
MARK_WATERMARK = "stream:watermark"
MARK_SPARK = "stream:spark"
MARK_EVICT = "stream:evict"
MARK_MAX = "stream:max_event"
MARK_EMIT = "stream:emitting"
MARK_JOIN = "stream:joining:"
MARK_PUBLISH = "stream:publishing:"
MARK_COMPACTED = "stream:compacted:"
MARK_BEFORE_BATCH = "stream:before_batch"  # plain Spark's watermark state before a micro-batch
#: the watermark late rows were judged by, where it may be ahead of the one noted (that of a
#: window write not settled yet, and of the micro-batches that closed no window beside it)
MARK_LATE = "stream:late"
#: Staged directories that make a stateful operation rewrite them as one: for a windowed
#: aggregation, directories holding rows of closed windows (what a rewrite removes; a
#: directory whose windows have all closed is deleted whole, so an in-order stream's are
#: rewritten only at ``COMPACT_FILES``).
COMPACT_AFTER = 16
#: Staged directories of a windowed aggregation that make it rewrite them as one whatever
#: they hold (what an emission lists and reads). An in-order stream keeps about
#: (window + watermark delay) / trigger of them: 15 for 10 s windows, a 5 s delay and a
#: micro-batch per second, which a threshold of 16 rewrote (~1.5 M rows at 100 K rows/s)
#: shortly before they were deleted whole.
COMPACT_FILES = 64
#: An emission of closed windows into native sinks runs its Spark job in a thread of its own,
#: beside the next micro-batches (the first that closes windows again settles it; see
#: :mod:`xorack.spark.stream_emission`): the A/B switch of ``bench_streaming``. False: each
#: micro-batch waits for its windows' write.
OVERLAP = True
#: A window write still running when a micro-batch ends is left running beside the next ones
#: until one closes windows again, which waits for it first (deleting closed directories and
#: a due compaction wait until it has finished): the A/B switch of
#: ``bench_streaming --settle``. False: each micro-batch waits for it at its end. Such a
#: micro-batch notes the watermark it reached as ``MARK_LATE`` only: a restart resumes the
#: windows from the one noted before the write (it takes the write back), and judges late rows
#: by the one that micro-batch reached.
DEFER = True

log = logging.getLogger(__name__)


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


def sinks_after(plan: Any, barrier: Any) -> list[tuple[Any, tuple[Any, ...]]]:
    """Each node reading a streaming barrier's output, down to the sinks: ``(sink, chain)``,
    ``chain`` the operations between them (declaration order); a node that is neither a sink
    nor a row operation comes with ``chain`` ending in it (``start_stream`` refuses it)."""
    out: list[tuple[Any, tuple[Any, ...]]] = []

    def walk(node: Any, chain: tuple[Any, ...]) -> None:
        for r in plan.readers(node):
            if isinstance(r, Sink):
                out.append((r, chain))
            elif isinstance(r, RowOperation):
                walk(r, (*chain, r))
            else:
                out.append((r, (*chain, r)))

    walk(plan.derived_source(barrier), ())
    return out


def watermark_of(plan: Any, node: Any) -> Any:
    """The watermark of the input source whose rows reach ``node`` (None: none has one)."""
    names = {n.name for n in roots(node) if isinstance(n, Source)}
    return next((wm for wm in plan.watermarks if wm.source in names), None)


def _output_id(df: Any, column: str) -> int | None:
    """The expression id of ``column`` in ``df``'s analyzed plan (None: not there)."""
    out = df._jdf.queryExecution().analyzed().output()
    for i in range(out.size()):
        attr = out.apply(i)
        if attr.name() == column:
            return int(attr.exprId().id())
    return None


def check_event_time_path(agg: Any, wm: Any, spark: Any, via: Any = None) -> None:
    """The watermark holds the windows (or a stream-stream join) back by the source records'
    own event times, so every row reaching ``agg`` (through its parent ``via``, if given) must
    come from the watermark's source, its time column unchanged: native operations and
    transforms pass it through (the same attribute in Spark's analyzed plan; a transform is
    tried on an empty frame), a pandas stage is checked per row as it runs; anything else is
    refused here."""
    from .rows import ArrowStage, RowOperation, Transform

    column = wm.column
    nodes = _upstream(agg) if via is None else [via, *_upstream(via)]
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


def _take_back(ctx: RunContext, windowed: list[Any], name: str) -> None:
    """Delete the files a window write named ``name`` moved into the native sinks."""
    for agg in windowed:
        for node, _ in sinks_after(ctx.plan, agg):
            if node.caps.native:
                node.sink.remove_named(ctx.spark, name)


def _recover_publications(
    ctx: RunContext, native: list[Any], marks: dict[str, Any]
) -> dict[str, str | None]:
    """A restart: each native sink's publication a crash left marked is finished (published:
    its staged rows go) or taken back (cut short: its files go, the staged rows are published
    again); returns the marks to clear."""
    undone: dict[str, str | None] = {}
    for node in native:
        pub = marks.get(MARK_PUBLISH + node.name)
        if not pub:
            continue
        name, state = pub.rsplit(":", 1)
        if state == "done":
            ctx.of(node).staging[0].remove()
        else:
            node.sink.remove_named(ctx.spark, name)
        undone[MARK_PUBLISH + node.name] = None
    return undone


def _frontier(stats: dict[str, Any]) -> tuple[bool, int | None]:
    """Whether the acker can tell which records have settled, and the event time at or above
    which records are pending (None: nothing is pending)."""
    if stats.get("pending", 0):
        frontier = stats.get("min_event_time")
        return frontier is not None, frontier
    return True, None


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
        append = output_mode == "append"
        self.windowed = [a for a in aggs if isinstance(a, WindowAggregate) and append]
        self.updated = aggs if output_mode == "update" else []
        self.updates = Updates(ctx, self.updated, self._count, self._note)
        self.joins = [b for b in ctx.plan.barriers() if isinstance(b, StreamJoin)]
        self.join_states: list[JoinState] = []
        self.dedups = [b for b in ctx.plan.barriers() if isinstance(b, StreamDedup)]
        self.dedup_states: list[DedupState] = []
        # what moves the watermark: event-time state (windows, joins, deduplication)
        windows = [a for a in self.updated if isinstance(a, WindowAggregate)]
        self.timed = bool(self.windowed or self.joins or self.dedups or windows)
        self.complete = aggs if complete else []
        self.report = report
        self.replaces = 0  # results replaced in complete mode
        self.compactions = 0  # rewrites of a windowed aggregation's staged rows
        self._dirty = False  # rows staged since the last replace
        self.ended: list[np.ndarray] = []  # attempts that ended without completing
        self.max_event: dict[str, int] = {}  # the largest event time seen, per source
        self.spark_us = 0  # plain Spark's watermark (max event time - delay, in ms steps)
        # what plain Spark closes windows by now: the watermark of the micro-batch before
        # (Spark computes a watermark at the end of a micro-batch and uses it in the next)
        self.evict_us = 0
        self._event_accs: dict[str, Any] = {}  # the sources' largest event times (before_batch)
        self.watermark_us = 0  # the watermark the windows close by (held back)
        self.emits = 0  # writes of closed windows
        self.skipped_emits = 0  # watermark moves that passed no window's end (no write)
        self.joined = 0  # writes of a stream-stream join's new rows
        self.deduped = 0  # writes of a dropDuplicates' new keys
        self._workdir: str | None = None
        self._tags = 0
        self.native = [n for n in ctx.plan.native_sinks() if n.phase == 0] if ctx.ft else []
        self.resume = False
        self._before_batch: dict[str, Any] | None = None  # see begin_batch
        self.publishes = 0  # appends of settled rows to the native sinks
        # the window write running beside the next micro-batch (OVERLAP; not where joins or
        # deduplications keep event-time state too)
        self.beside = BesideWrites(ctx.spark, OVERLAP and not self.joins and not self.dedups)
        self._stamp: int | None = None  # a re-run micro-batch's late-row watermark
        self._late_floor = 0  # MARK_LATE as a restart found it

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
        if not self.timed and not self.native and not self.complete and not self.updated:
            return
        if self.timed:
            ctx.event_times = {wm.source: wm.column for wm in ctx.plan.watermarks}
        self._workdir = open_staging(ctx)
        ctx.workdir = self._workdir
        self.join_states = [JoinState(j, list(ctx.of(j).staging)) for j in self.joins]
        self.dedup_states = []
        for d in self.dedups:
            (staging,) = ctx.of(d).staging
            assert isinstance(staging, WindowStaging)
            self.dedup_states.append(DedupState(d, staging))
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
        self._late_floor = int(marks.get(MARK_LATE) or 0)
        self.max_event = {
            k[len(MARK_MAX) + 1 :]: int(v) for k, v in marks.items() if k.startswith(MARK_MAX + ":")
        }
        before = marks.get(MARK_BEFORE_BATCH)
        self._before_batch = json.loads(before) if before else None
        self.updates.restore(marks)
        adopt_staged(ctx, np.empty(0, np.uint64))
        for key, staging in self._compacted():
            staging.recover(marks.get(MARK_COMPACTED + key))
        undone: dict[str, str | None] = {}
        cut = marks.get(MARK_EMIT)
        if cut:  # an emission cut short: its files go, the windows are written again
            _take_back(self.ctx, self.windowed, f"w{cut}")
            undone[MARK_EMIT] = None
        states: list[JoinState | DedupState] = [*self.join_states, *self.dedup_states]
        for js in states:
            cut = marks.get(MARK_JOIN + js.node.name)
            js.restore(cut)
            if cut:  # a join's emission cut short: its files go, its rows are written again
                for node, _ in sinks_after(ctx.plan, js.node):
                    if isinstance(node, Sink) and node.caps.native:
                        node.sink.remove_named(ctx.spark, cut)
                undone[MARK_JOIN + js.node.name] = None
        undone.update(_recover_publications(ctx, self.native, marks))
        if undone:
            ctx.client.job_state(marks=undone)

    def _compacted(self) -> list[tuple[str, WindowStaging]]:
        """Every staging that compactions rewrite, under its mark's key."""
        out = []
        for agg in self.windowed:
            (staging,) = self.ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            out.append((agg.name, staging))
        for js in self.join_states:
            out += [(f"{js.node.name}:0", js.left), (f"{js.node.name}:1", js.right)]
        out += [(ds.node.name, ds.staging) for ds in self.dedup_states]
        return out

    def _note(self, marks: dict[str, str | None]) -> None:
        """A resumable query's stream state, durable with its FT state."""
        if self.resume:
            self.ctx.client.job_state(marks=marks)

    def close(self) -> None:
        try:
            self.beside.settle()
        except Exception:  # the run raises its own error: this one is only logged
            log.exception("the last emission of closed windows failed")
        if self._workdir is not None:
            if not self.resume:  # a resumable query keeps its open windows for a restart
                close_staging(self.ctx, self._workdir)
            self._workdir = None
            self.ctx.workdir = None

    def _stagings(self) -> list[WindowStaging]:
        """Every staging whose rows keep the watermark in force (late rows are dropped)."""
        out = [st for _, st in self._compacted()]
        for agg in self.updated:
            out += [st for st in self.ctx.of(agg).staging if isinstance(st, WindowStaging)]
        return out

    def begin_batch(self, batch_id: int) -> None:
        """A resumable query notes plain Spark's watermark state before each micro-batch. A
        micro-batch Spark runs again after a crash (its offsets were logged, not committed)
        starts from that state, as Spark's own does (its watermark is in the offset log): a
        crash after the batch moved the watermark would otherwise judge the rows of this
        micro-batch and the next by a watermark one micro-batch ahead of Spark's."""
        if not self.resume or not self.timed:
            return
        before = self._before_batch
        if before is not None and int(before["batch"]) == batch_id:  # run again
            self.spark_us, self.evict_us = int(before["spark"]), int(before["evict"])
            self.max_event = {k: int(v) for k, v in before["max"].items()}
            # the watermark its first run judged late rows by: one whose window write was
            # running beside it (not noted yet) may be ahead of the restored one
            stamp = before.get("stamp")
            self._stamp = None if stamp is None else int(stamp)
        state = {
            "batch": batch_id,
            "spark": self.spark_us,
            "evict": self.evict_us,
            "max": dict(self.max_event),
            "stamp": self._late_stamp(),
        }
        self._before_batch = state
        self._note({MARK_BEFORE_BATCH: json.dumps(state)})

    def _late_stamp(self) -> int:
        """The watermark the next round's staged rows are late against (after a restart, never
        behind the one the micro-batches before the crash judged by: ``MARK_LATE``)."""
        if self._stamp is not None:
            return self._stamp
        return min(max(self.watermark_us, self._late_floor), self.evict_us)

    def before_round(self) -> None:
        """The rows staged by the next round are late against the watermark now: the held-back
        watermark, never ahead of the one plain Spark judges late rows by (the two differ only
        after a restart that runs a micro-batch again, see :meth:`begin_batch`)."""
        stamp = self._late_stamp()
        self._stamp = None
        for st in self._stagings():
            st.watermark_us = stamp
        for ds in self.dedup_states:  # a key's expiry: by plain Spark's watermark, not held
            if isinstance(ds.staging, DedupStaging):
                ds.staging.spark_wm_us = self.evict_us

    def stage(self, work: Any, tag: str) -> None:
        """Write the round's rows reaching the windowed aggregations, then send their events
        (read back from what was written: an ack never precedes its write)."""
        ctx = self.ctx
        if not work.staged:
            return
        name = self._name("", f"-{tag}")  # name order = write order
        paths = [st.write(df, name) for st, df in work.staged]
        self._dirty = True
        assert ctx.location is not None
        send_staged_events(
            ctx.spark, paths, ctx.location, ctx.token, ctx.tls_root_certs, ctx.job, hold=False
        )

    def before_batch(self) -> None:
        """The sources' largest event times, in accumulators (no second pass) that are the
        query's, set back to "none" before each micro-batch: the taggers holding them stay
        equal and their ``mapInArrow`` is built once (a late update from an earlier
        micro-batch cannot harm: the watermark follows the largest event time ever read)."""
        if self.timed:
            from .tagging import NO_EVENT_TIME, max_param

            if not self._event_accs:
                sc = self.ctx.spark.sparkContext
                self._event_accs = {
                    wm.source: sc.accumulator(NO_EVENT_TIME, max_param())
                    for wm in self.ctx.plan.watermarks
                }
            for acc in self._event_accs.values():
                acc.value = NO_EVENT_TIME
            self.ctx.event_max = dict(self._event_accs)

    def saw(self) -> None:
        """Plain Spark's watermark after a micro-batch: per watermark, its source's largest
        event time (in Spark's milliseconds) minus the delay; the smallest of those of the
        sources that have had rows (Spark's default policy for several watermarks), never
        moving back (over every source row of the micro-batch, as Spark's watermark nodes see
        them)."""
        from .tagging import NO_EVENT_TIME

        wms = self.ctx.plan.watermarks
        accs, self.ctx.event_max = self.ctx.event_max, {}
        if not self.timed or not wms or not accs:
            return
        self.evict_us = self.spark_us
        marks: dict[str, str | None] = {MARK_EVICT: str(self.evict_us)}
        for wm in wms:
            acc = accs.get(wm.source)
            got = int(acc.value) if acc is not None else NO_EVENT_TIME
            if got != NO_EVENT_TIME:
                top = max(self.max_event.get(wm.source, got), got)
                self.max_event[wm.source] = top
                marks[f"{MARK_MAX}:{wm.source}"] = str(top)
        seen = [
            (self.max_event[wm.source] // 1000 - wm.delay_us // 1000) * 1000
            for wm in wms
            if wm.source in self.max_event
        ]
        if seen:
            self.spark_us = max(self.spark_us, min(seen))
        marks[MARK_SPARK] = str(self.spark_us)
        self._note(marks)

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
            self._count([(node, int(written or 0))])
            staging.remove()
            self._note({key: None})
            self.publishes += 1

    def after_round(self, data: bool = True) -> None:
        """After a micro-batch (``data``) or a replay round (its ended attempts taken):
        publish what settled, close the windows the watermark passed. A replay round is, to
        the watermark, a micro-batch without data: Spark's own, run when the watermark moved,
        closes the windows by the latest watermark."""
        if not self.timed and not self.native and not self.complete and not self.updated:
            return
        # a window write beside the stream that is still running is waited for only by the
        # next emission (see emit; closed directories and compactions wait): waiting here held
        # a micro-batch of the rate source 3.9 s, and the rows that came meanwhile made the
        # next three micro-batches 2-6x larger
        self.beside.settle(wait=not DEFER)
        if not data and self.evict_us != self.spark_us:
            self.evict_us = self.spark_us
            self._note({MARK_EVICT: str(self.evict_us)})
        stats = self.ctx.client.stats()
        self.publish(stats)
        self.emit(stats)
        self.join(stats)
        self.dedup(stats)
        self.replace(stats)
        self.update(stats)

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

    def update(self, stats: dict[str, Any]) -> None:
        """Update mode: the groups whose row changed since the last write replace their rows
        in the sinks, by key (:class:`xorack.spark.stream_update.Updates`)."""
        pending = bool(stats.get("pending", 0))
        looked = self.updates.write(pending, self._dirty, self.watermark_us, self._ended_frame)
        if looked and not pending:
            self._dirty = False

    def emit(self, stats: dict[str, Any]) -> None:
        """Move the watermark as far as the records still pending allow, and write the windows
        it passed."""
        ctx = self.ctx
        if not self.timed:
            return
        hold = self.evict_us
        if stats.get("pending", 0):
            if "min_event_time" not in stats:  # an acker that cannot tell: wait
                return
            pending = stats["min_event_time"]
            if pending is not None:  # strictly below it: a row at or below is late
                hold = min(hold, int(pending) - 1)
        new = max(self.watermark_us, hold)
        if new <= self.watermark_us:
            return
        if not self.windowed:  # a join's or deduplication's: late rows, outer rows, state
            self.watermark_us = new
            self._note({MARK_WATERMARK: str(new)})
            return
        # a window is written once the watermark passes its end: when no window of the grid
        # ends in (watermark, new] there is nothing to write (the sinks were written once
        # already, so each exists), and no job runs
        closing = [
            agg
            for agg in self.windowed
            if not self.emits or closes_any(agg.spec, self.watermark_us, new)
        ]
        ended_df = self._ended_frame()
        evicted: dict[str, Any] = {}  # the sessions written, whose rows leave the staging
        if not closing:
            self.watermark_us = new
            self.skipped_emits += 1
            if self.beside.unsettled():  # its settling notes this watermark, drops what closed
                self._note({MARK_LATE: str(new)})  # what the next rows are late against
                return
            self._note({MARK_WATERMARK: str(new)})
            self._compact(ended_df, evicted)
            return
        self.beside.settle()  # one emission at a time (its settling notes the watermark)
        # the next rows are late against it, noted apart: a restart that takes this write back
        # resumes the windows from the watermark noted before it
        self._note({MARK_EMIT: str(new), MARK_LATE: str(new)})
        # what each closing aggregation reads: the staged directories that can hold rows of
        # its windows, as they are now (a round adds directories of its own; a compaction
        # waits for the writes)
        reads = []
        for agg in closing:
            (staging,) = ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            horizon = horizon_of(agg.spec)  # (a session can grow: all its rows are read)
            within = None if horizon is None else (self.watermark_us, new, horizon)
            reads.append((agg, staging, staging.readable(within)))
        lo = self.watermark_us
        readers = {agg.name: sinks_after(ctx.plan, agg) for agg in closing}
        # the writes can run beside the next micro-batch into native sinks (a Python sink's
        # writes would meet the next round's), unless the sessions' rows to evict must be
        # known first (and not in a query whose joins or deduplications judge rows by the
        # watermark too: see beside)
        overlap = self.beside.enabled and all(
            agg.spec.kind != "session_window" and node.caps.native
            for agg in closing
            for node, _ in readers[agg.name]
        )

        def frames() -> list[tuple[Any, Any, tuple[Any, ...]]]:
            writes = []
            for agg, staging, paths in reads:
                rows = staging.staged(ctx.spark, ended_df, paths=paths)
                out = agg.spec.emit(rows, lo, new)
                if len(readers[agg.name]) > 1 or agg.spec.kind == "session_window":
                    out = out.localCheckpoint(eager=True)  # read more than once
                writes += [(node, out, chain) for node, chain in readers[agg.name]]
                if agg.spec.kind == "session_window":
                    evicted[agg.name] = out
            return writes

        # a compaction after a write beside the next micro-batch is written there too (of the
        # directories staged so far), and committed when it is settled
        compactions = self._compactions(evicted, new) if overlap else []
        hidden: list[str] = []

        def work() -> Written:
            written = [
                (node, write_emitted(node, out, name=f"w{new}", chain=chain))
                for node, out, chain in frames()
            ]
            hidden.extend(self._rewrite(c, ended_df, evicted, new) for c in compactions)
            return written

        def done(written: Written) -> None:
            self._count(written)
            # the watermark now: later micro-batches may have moved it past windows' ends
            # while this write ran (no window ends between: the next closing one waited)
            self._note({MARK_WATERMARK: str(max(new, self.watermark_us)), MARK_EMIT: None})
            if not overlap:
                self._compact(ended_df, evicted)
                return
            self._drop_closed(new)
            for item, path in zip(compactions, hidden, strict=True):
                self._commit(item, path)

        def undo() -> None:  # the windows are written again by the next emission
            self.watermark_us, self.emits = lo, self.emits - 1
            for path in hidden:
                remove_local(path)
            try:
                _take_back(self.ctx, self.windowed, f"w{new}")
            except Exception:  # a restart takes them back (its mark stays)
                log.exception("could not take back a failed emission's files")

        self.watermark_us = new  # the next round's late rows are judged by it
        self.emits += 1
        if overlap:
            self.beside.start(work, done, undo)
            return
        try:
            written = work()
        except BaseException:
            undo()
            raise
        done(written)

    def _count(self, written: Written) -> None:
        for node, rows in written:
            self.report.sink_rows[node.name] = self.report.sink_rows.get(node.name, 0) + rows

    def _name(self, prefix: str, suffix: str = "") -> str:
        """A new name for a write of this run, after every earlier one in name order."""
        self._tags += 1
        return f"{prefix}{self.ctx.run_tag}{self._tags:07d}{suffix}"

    def _write_new(self, barrier: Any, new: Any, name: str) -> None:
        """Write a join's or deduplication's new rows into the sinks after it."""
        chains = sinks_after(self.ctx.plan, barrier)
        self._count([(n, write_emitted(n, new, name=name, chain=c)) for n, c in chains])

    def join(self, stats: dict[str, Any]) -> None:
        """Write the rows of each stream-stream join that its settled rows now give and no
        emission wrote (:mod:`xorack.spark.stream_join`); compact its state now and then."""
        from pyspark.sql import functions as F

        from .stream_join import PAIR
        from .windows import ROW_ID

        ctx = self.ctx
        if not self.join_states:
            return
        told, frontier = _frontier(stats)
        if not told:  # an acker that cannot tell: wait
            return
        w = self.watermark_us
        if frontier is not None and frontier <= w:
            w -= 1  # a pending row at the watermark may still match: Spark's rows at it are late
        ended_df = self._ended_frame()
        for js in self.join_states:
            new = js.new_rows(ctx.spark, ended_df, frontier, w).localCheckpoint(eager=True)
            if new.isEmpty():
                continue
            name = self._name("j")
            self._note({MARK_JOIN + js.node.name: name})
            new = new.withColumn(ROW_ID, F.xxhash64(*[F.col(c) for c in PAIR]))
            self._write_new(js.node, new, name)
            js.record(new, name)
            self._note({MARK_JOIN + js.node.name: None})
            self.joined += 1
            if len(js.left.paths) + len(js.right.paths) >= COMPACT_AFTER:
                name = self._name("", "-compacted")
                hidden = js.compact_sides(ctx.spark, ended_df, frontier, w, name)
                for st, path in hidden:
                    key = f"{js.node.name}:{0 if st is js.left else 1}"
                    self._note({MARK_COMPACTED + key: name})  # then a restart commits it
                    st.drop_before(st.commit(path))
                if hidden:
                    js.compact_ids(ctx.spark, name)
                    self.compactions += 1

    def dedup(self, stats: dict[str, Any]) -> None:
        """Write the rows of each ``dropDuplicates`` (or ``dropDuplicatesWithinWatermark``) that
        its settled rows now give and no emission wrote (:mod:`xorack.spark.stream_dedup`);
        compact its state now and then."""
        ctx = self.ctx
        if not self.dedup_states:
            return
        told, frontier = _frontier(stats)
        if not told:
            return
        ended_df = self._ended_frame()
        for ds in self.dedup_states:
            if ds.spec.time is None and frontier is not None:
                continue  # rows without an event time settle when nothing is pending
            new = ds.new_rows(ctx.spark, ended_df, frontier).localCheckpoint(eager=True)
            if not new.isEmpty():
                name = self._name("d")
                self._note({MARK_JOIN + ds.node.name: name})
                new = ds.with_row_id(new)  # a write done again is absorbed by an idempotent sink
                self._write_new(ds.node, new, name)
                ds.record(new, name)
                self._note({MARK_JOIN + ds.node.name: None})
                self.deduped += 1
            if len(ds.staging.paths) >= COMPACT_AFTER:
                name = self._name("", "-compacted")
                hidden = ds.compact_rows(ctx.spark, ended_df, name)
                self._note({MARK_COMPACTED + ds.node.name: name})  # then a restart commits it
                ds.staging.drop_before(ds.staging.commit(hidden))
                ds.compact_keys(ctx.spark, min(self.watermark_us, self.evict_us), name)
                self.compactions += 1

    def _compact(self, ended_df: Any, evicted: dict[str, Any]) -> None:
        """Keep the state of a long stream bounded: the directories of an aggregation by a
        time window whose windows have all closed are deleted; once ``COMPACT_AFTER`` of the
        others hold rows of closed windows, or ``COMPACT_FILES`` are staged, they are
        rewritten as one without those rows (a session window keeps its rows: a session can
        grow as long as rows come)."""
        self._drop_closed(self.watermark_us)
        for item in self._compactions(evicted, self.watermark_us):
            self._commit(item, self._rewrite(item, ended_df, evicted, self.watermark_us))

    def _drop_closed(self, wm_us: int) -> None:
        """Delete the staged directories of time windows that have all closed."""
        for agg in self.windowed:
            horizon = horizon_of(agg.spec)
            (staging,) = self.ctx.of(agg).staging
            if horizon is not None and isinstance(staging, WindowStaging):
                staging.drop_closed(wm_us, horizon)

    def _compactions(
        self, evicted: dict[str, Any], wm_us: int
    ) -> list[tuple[Any, WindowStaging, str, list]]:
        """The aggregations whose staging is rewritten now: each with its rewrite's name and the
        directories it reads (those staged so far whose windows are not all closed at
        ``wm_us``: later ones are named after it, closed ones are dropped)."""
        out = []
        for agg in self.windowed:
            horizon = horizon_of(agg.spec)
            (staging,) = self.ctx.of(agg).staging
            assert isinstance(staging, WindowStaging)
            paths = staging.open_paths(wm_us, horizon)
            if agg.name in evicted or staging.due(
                paths, wm_us, horizon, COMPACT_AFTER, COMPACT_FILES
            ):
                out.append((agg, staging, self._name("", "-compacted"), paths))
        return out

    def _rewrite(self, item: tuple, ended_df: Any, evicted: dict[str, Any], wm_us: int) -> str:
        """Write a compaction (hidden until :meth:`_commit`); the rows of the sessions
        ``evicted`` (written) leave at once."""
        agg, staging, name, paths = item
        written = evicted.get(agg.name)
        if written is not None:
            sessions = agg.spec.session_rows(written)
            return staging.evict(self.ctx.spark, ended_df, sessions, agg.spec.keys, name)
        horizon = horizon_of(agg.spec)
        assert horizon is not None
        return staging.compact(self.ctx.spark, ended_df, wm_us, horizon, name, paths=paths)

    def _commit(self, item: tuple, hidden: str) -> None:
        agg, staging, name, read = item
        self._note({MARK_COMPACTED + agg.name: name})  # then a restart commits it
        staging.drop_before(staging.commit(hidden, read))
        self.compactions += 1


__all__ = [
    "COMPACT_AFTER",
    "COMPACT_FILES",
    "StreamState",
    "check_event_time_path",
    "watermark_of",
]
