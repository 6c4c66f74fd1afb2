"""The plan's terminal nodes, where rows leave a phase: barriers (an aggregate, a join of two
tracked frames), whose output opens the next phase, and sinks (written by Spark, or from
Python inside the executor tasks).

A barrier stages the rows that reach it, round after round, until every record upstream is
completed or dead-lettered; then Spark's own operator runs once over the staged rows of the
completed attempts (:mod:`xorack.spark.barrier`). A native sink is staged the same way and
published once; a sink written from Python writes inside the tasks and drops the rows of the
attempts that did not complete at the end (``retract``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .barrier import PartialStaging, Staging, combining_plan
from .node import Node, Scope
from .report import Reason
from .sink_runner import SUMMARY_SCHEMA, SinkRunner
from .sinks import SinkCapabilities, create_sink
from .stream_dedup import DedupStaging
from .windows import WindowStaging

if TYPE_CHECKING:
    from .build import RoundBuilder
    from .context import RunContext
    from .optimistic_round import OptimisticBuilder
    from .publish import Publisher


@dataclass(eq=False)
class Barrier(Node):
    """Where a phase ends: the rows of every parent are staged until the phase settles, then
    ``spec`` (an :class:`~xorack.spark.barrier.AggregateSpec` or ``JoinSpec``) computes the
    output once. With FT off it runs as plain Spark's operator (``proto``: the frame the
    declaration analyzed from ``analyzed_from``, reused when the run feeds the same frames)."""

    spec: Any = None
    #: the payload staged per parent (empty: each parent's whole payload); a tracked join cut
    #: by :mod:`xorack.spark.prune` stages what its condition and its kept columns read, given
    #: as a function of no argument: Spark is asked only when a tracked round stages the join
    #: (:meth:`side_schemas`)
    sides: Any = ()

    terminal: ClassVar[bool] = True

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        ctx = b.ctx
        if ctx.ft:  # stage what arrives; the output comes in the barrier's phase
            staging = ctx.of(self).staging
            b.work.staged += [
                (st, x) for st, x in zip(staging, inputs, strict=True) if x is not None
            ]
        else:
            out = self.reused(inputs)
            b.work.plain_barriers[id(self)] = self.spec.compute(inputs) if out is None else out
        return None

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        b.add_output(self.optimistic_output(b, inputs))
        return None

    def optimistic_output(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        raise NotImplementedError

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        if not all(id(par) in scope.here for par in self.parents):
            # its other side's rows arrive in another phase: they would have to be kept for
            # it across phases, which the tracked rounds' staging does
            return Reason.BARRIER_OF_TWO_PHASES, f"{self.name!r} meets rows of two phases"
        return None

    def side_schemas(self) -> tuple[Any, ...]:
        """The payload staged per parent (:attr:`sides`, computed once when it is a
        function)."""
        if callable(self.sides):
            self.sides = self.sides()
        return self.sides or tuple(p.schema for p in self.parents)

    def open_staging(self, ctx: RunContext, workdir: str) -> list[Staging]:
        """Where this run stages the rows reaching the barrier, one place per parent (a
        pruned join's payloads are found when first staged or read)."""
        root = os.path.join(workdir, self.name)
        if callable(self.sides):
            return [
                Staging(os.path.join(root, str(i)), lambda i=i: self.side_schemas()[i])
                for i in range(len(self.parents))
            ]
        return [
            Staging(os.path.join(root, str(i)), schema)
            for i, schema in enumerate(self.side_schemas())
        ]

    def output(self, ctx: RunContext, ended_df: Any) -> Any:
        """The barrier's output: Spark's own operator over the rows staged by completed
        attempts (``ended_df``: the attempts that ended without completing, or None)."""
        staging = ctx.of(self).staging
        return self.spec.compute([st.rows(ctx.spark, ended_df) for st in staging])

    def describe(self) -> str:
        return f"{self.label} {self.name!r}: {self.spec.describe()}"


@dataclass(eq=False)
class Aggregate(Barrier):
    """``groupBy(*keys).agg(*exprs)``: one output row per group, anchored to the source
    records of all its input rows; exactly once, whatever was replayed."""

    lineage: ClassVar[str] = "n → 1: staged until the phase settles, aggregated once"
    label: ClassVar[str] = "aggregate"

    def combining(self, ctx: RunContext) -> Any:
        """The partial aggregates staged per chunk (Spark's map-side combine) when every
        function combines and ``combine=True``, else None."""
        if not ctx.config.combine:
            return None
        return combining_plan(self.spec, self.parents[0].schema, self.schema)

    def open_staging(self, ctx: RunContext, workdir: str) -> list[Staging]:
        plan = self.combining(ctx)
        if plan is None:
            return super().open_staging(ctx, workdir)
        ctx.partial_phases.add(self.parents[0].phase)
        staging = PartialStaging(
            os.path.join(workdir, self.name, "0"),
            self.parents[0].schema,
            keys=self.spec.keys,
            plan=plan,
            output=self.schema,
        )
        return [staging]

    def output(self, ctx: RunContext, ended_df: Any) -> Any:
        (staging,) = ctx.of(self).staging
        if isinstance(staging, PartialStaging):  # the chunks' partials, merged
            return staging.merged(ctx.spark)
        return super().output(ctx, ended_df)

    def optimistic_output(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return b.aggregate_output(self, inputs[0])


@dataclass(eq=False)
class WindowAggregate(Aggregate):
    """``groupBy(F.window(ts, ...) or F.session_window(ts, gap), *keys).agg(*exprs)``. In a
    batch run an aggregate like any other (in tracked rounds: Spark's time windowing runs on
    the staged rows, once); in a stream each window is written once, final, when the watermark
    — held back by the event time of the records still pending — passes its end
    (:mod:`xorack.spark.windows`)."""

    lineage: ClassVar[str] = "n → 1 per window: staged, written once when the watermark passes"
    label: ClassVar[str] = "window_aggregate"

    def combining(self, ctx: RunContext) -> Any:
        return None  # the staged rows keep their time: a window is not a chunk's

    def open_staging(self, ctx: RunContext, workdir: str) -> list[Staging]:
        root = os.path.join(workdir, self.name, "0")
        return [WindowStaging(root, self.parents[0].schema, time=self.spec.time)]

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        return Reason.TIME_WINDOW, f"{self.name!r} groups by a time window"


@dataclass(eq=False)
class StreamJoin(Barrier):
    """``left.join(right, condition, how)`` of two tracked streams (inner, left outer), each
    side from a source with a watermark: the rows of both sides are staged, and a joined row
    is written once, as soon as the records of both its rows have settled
    (:mod:`xorack.spark.stream_join`)."""

    lineage: ClassVar[str] = "2 → 1 per pair: staged, written once both rows' records settled"
    label: ClassVar[str] = "stream_join"

    def open_staging(self, ctx: RunContext, workdir: str) -> list[Staging]:
        return [
            WindowStaging(os.path.join(workdir, self.name, str(i)), p.schema, time=t, ids=True)
            for i, (p, t) in enumerate(zip(self.parents, self.spec.times, strict=True))
        ]

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        return Reason.STREAMING, f"{self.name!r} joins two streams"


@dataclass(eq=False)
class StreamDedup(Barrier):
    """``dropDuplicates(keys)`` (or ``distinct()``, or ``dropDuplicatesWithinWatermark(keys)``)
    of a tracked stream: its rows are staged, and each key is written once (within a watermark:
    once per expiry), from the rows of records that have settled
    (:mod:`xorack.spark.stream_dedup`)."""

    lineage: ClassVar[str] = "n → 1 per key: staged, written once its rows' records settled"
    label: ClassVar[str] = "drop_duplicates"

    def open_staging(self, ctx: RunContext, workdir: str) -> list[Staging]:
        (parent,) = self.parents
        root = os.path.join(workdir, self.name, "0")
        kind = WindowStaging if self.spec.within_us is None else DedupStaging
        return [kind(root, parent.schema, time=self.spec.time or "", ids=True)]

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        return Reason.STREAMING, f"{self.name!r} drops duplicates of a stream"


@dataclass(eq=False)
class TrackedJoin(Barrier):
    """``left.join(right, on, how)`` of two tracked frames (any join type, on names or a Column
    condition): a replayed record on one side meets every row of the other side that went
    through before it."""

    lineage: ClassVar[str] = "2 → 1: both sides staged until the phase settles, joined once"
    label: ClassVar[str] = "join"

    def optimistic_output(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return b.join_output(self, inputs)


@dataclass(eq=False)
class Limit(Barrier):
    """``limit(n)`` / ``orderBy(...).limit(n)``: n rows of the complete input (the first n in
    that order), which no round can know before every record upstream has settled."""

    lineage: ClassVar[str] = "n → at most n: staged until the phase settles, ordered and cut once"
    label: ClassVar[str] = "limit"

    def optimistic_output(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return b.join_output(self, inputs)  # Spark's operator over the live rows, as a join's


@dataclass(eq=False)
class Sink(Node):
    """Where a branch ends. ``caps``: what the sink declares it can do."""

    sink: Any = None
    caps: SinkCapabilities = field(default_factory=SinkCapabilities)

    lineage: ClassVar[str] = "n → 0: each row acked once its write is durable"
    terminal: ClassVar[bool] = True

    def publish(self, pub: Publisher) -> None:
        """Make the sink hold exactly what the completed attempts wrote."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.label} {self.name!r}: {type(self.sink).__name__}"


@dataclass(eq=False)
class NativeSinkNode(Sink):
    """A sink Spark writes (``ParquetSink``): staged per round, published once."""

    label: ClassVar[str] = "native sink"

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        ctx = b.ctx
        if ctx.ft:
            b.work.staged.append((ctx.of(self).staging[0], inputs[0]))
            return None
        df = inputs[0]
        if df.columns != list(self.columns):  # FT off: rarely more columns
            from .lineage import q, select_expr

            df = select_expr(df, map(q, self.columns))
        b.work.plain_writes.append((self, df))
        return None

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        b.add_output(b.sink_output(self, inputs[0]))
        return None

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        if id(self) in scope.elsewhere:  # its rows of each phase would be published apart
            return Reason.SINK_OF_TWO_PHASES, f"sink {self.name!r} gets rows of two phases"
        return None

    def open_staging(self, ctx: RunContext) -> list[Staging]:
        staging = Staging(self.sink.staging_dir, self.schema)
        if not ctx.config.resume:
            staging.remove()  # what an interrupted earlier run left
        return [staging]

    def publish(self, pub: Publisher) -> None:
        pub.native(self)


@dataclass(eq=False)
class PythonSinkNode(Sink):
    """A sink written from Python inside the executor tasks (``SQLiteSink``, your own)."""

    label: ClassVar[str] = "sink"

    def create(self) -> None:
        """Create the sink's table (or whatever it writes into), on the driver."""
        create_sink(self.sink, list(self.columns), self.schema)

    def frame(self, ctx: RunContext, df: Any, round_xor: Any = None) -> Any:
        """The sink's writers over ``df`` (their summaries); ``round_xor``: an optimistic
        round's accumulator."""
        from .lineage import EV, KEEP

        if ctx.ft and self.parents[0].is_settled():  # nothing pending to send
            df = df.drop(EV, KEEP)
        runner = SinkRunner(
            name=self.name,
            sink=self.sink,
            columns=self.columns,
            ft=ctx.ft,
            tally=ctx.tally,
            round_xor=round_xor,
            written=ctx.written,
            **ctx.runner_args(),
        )
        return df.mapInPandas(runner, SUMMARY_SCHEMA)

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        b.work.summaries.append(self.frame(b.ctx, inputs[0]))
        return None

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        raise AssertionError("a phase with a sink written from Python runs tracked rounds")

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        return Reason.PYTHON_SINK, f"sink {self.name!r} is written from Python"

    def publish(self, pub: Publisher) -> None:
        pub.python(self)


__all__ = [
    "Aggregate",
    "Barrier",
    "Limit",
    "NativeSinkNode",
    "PythonSinkNode",
    "Sink",
    "StreamDedup",
    "StreamJoin",
    "TrackedJoin",
    "WindowAggregate",
]
