"""The plan's row nodes: sources, native row operations, untracked transforms, unions and
Python stages. Each carries rows on within a phase; barriers and sinks
(:mod:`xorack.spark.outputs`) are where rows leave one.

>>> Filter_rule = RowOperation.lineage   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from . import ops, optimistic
from .arrow_stage import ArrowStageRunner, declared_arrow_schema
from .join_ops import LookupJoin
from .lineage import EV, KEEP, LINEAGE, map_in_arrow_kept, q, select_expr, select_kept
from .node import Node, Scope, event_time_of
from .report import Reason
from .reproducible import context_expression
from .schema import num_partitions
from .stages import (
    PART,
    REC,
    ROUND,
    SRC,
    GroupStageRunner,
    StageRunner,
    as_function,
    check_columns,
)
from .tagging import SourceTagger

if TYPE_CHECKING:
    from .build import RoundBuilder
    from .context import RunContext
    from .optimistic_round import OptimisticBuilder


def sole_readers(plan: Any, node: Node) -> Iterator[RowOperation]:
    """The row operations that read ``node``'s rows one after the other, each the only reader
    of the one before (the chain plain Spark's optimizer may push a filter down)."""
    while True:
        readers = plan.readers(node)
        if len(readers) != 1 or not isinstance(readers[0], RowOperation):
            return
        node = readers[0]
        yield node


def _plain_name(c: Any, names: set[str]) -> bool:
    """Whether a select's column ``c`` passes the source's column of that name as it is (a
    name with a dot or a backtick may name a struct's field instead)."""
    return isinstance(c, str) and c in names and "." not in c and "`" not in c


_PENDING: dict[Any, Any] = {}  # with_pending's columns, built once (select_kept)


def with_pending(df: Any) -> Any:
    """A frame that came out of Python (settled: its payload and ``SRC``, ``REC``, never the
    pending-event columns) with the pending-event columns added after its own."""

    def columns() -> list[Any]:
        from pyspark.sql import functions as F

        return [F.col("*"), F.lit(0).cast("long").alias(EV), F.lit(True).alias(KEEP)]

    return select_kept(df, _PENDING, "pending", columns)


def union_of(inputs: list[Any]) -> Any:
    """The union (by name) of the frames that have rows this round."""
    live = [x for x in inputs if x is not None]
    return live[0] if len(live) == 1 else live[0].unionByName(live[1])


def tagged_schema(node: Node, ft: bool, without_src: bool = False) -> Any:
    """``node``'s payload schema with the lineage ids a Python boundary hands on."""
    from pyspark.sql.types import LongType, StructField, StructType

    fields = list(node.schema.fields)
    if ft and not without_src:
        fields.append(StructField(SRC, LongType(), False))
    if ft:
        fields.append(StructField(REC, LongType(), False))
    return StructType(fields)


def with_partition_ids(df: Any, round_no: int | None = None) -> Any:
    """``df`` with ``spark_partition_id()`` as the column the tagger reads its partition from,
    and with ``round_no`` (if given) as the column it reads its round from.

    Spark's optimizer folds a projection over a local relation (``createDataFrame`` of an Arrow
    table or a pandas frame, ``VALUES``) into the relation on the driver, where every row gets
    partition 0; the scan then splits the rows over several tasks, whose position-derived ids
    would collide. Such a frame is coalesced to its own partition count first (no shuffle, the
    same partitions), which keeps the projection in the tasks."""
    added = [f"spark_partition_id() AS {PART}"]
    if round_no is not None:
        added.append(f"CAST({int(round_no)} AS BIGINT) AS {ROUND}")
    tagged = select_expr(df, ["*", *added])
    if not folded_on_driver(tagged, PART):
        return tagged
    return select_expr(df.coalesce(num_partitions(df)), ["*", *added])


_LOCAL_LEAVES = ("LocalRelation", "OneRowRelation")  # plans Spark may fold on the driver


def folded_on_driver(df: Any, column: str) -> bool:
    """Whether Spark's optimized plan of ``df`` computes ``column`` in a local relation (on the
    driver, once for all partitions) instead of in its tasks."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # pragma: no cover - Spark Connect (no JVM plan to look at)
        return False
    execution = jdf.queryExecution()
    # the plan's text first: a plan read from no local data (most) needs no optimizing here
    analyzed = execution.analyzed().toString()
    if not any(leaf in analyzed for leaf in _LOCAL_LEAVES):
        return False
    stack = [execution.optimizedPlan()]
    while stack:
        plan = stack.pop()
        if plan.getClass().getSimpleName() == "LocalRelation":
            output = plan.output()
            if any(output.apply(i).name() == column for i in range(output.size())):
                return True
        children = plan.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return False


def recomputed_input(df: Any) -> str | None:
    """Why reading ``df`` twice could give other rows (an expression of its plan that reads
    a row's position or file, draws at random, or the time of the query), else None."""
    found = context_expression(df)
    if found is None:
        return None
    return f"{found[0]} may give other values each time Spark computes the rows"


def lineage_of(cols: tuple[str, ...], ft: bool) -> list[str]:
    """A frame's columns: the payload, then the lineage columns when FT is on."""
    return [*cols, *LINEAGE] if ft else list(cols)


@dataclass(eq=False)
class Source(Node):
    """A tracked source: rows get their record ids here and are persisted by the acker
    (a barrier's output is the source of the next phase: ``derived`` is that barrier).
    ``keys``: hash-partitioned by them (replays go where Spark puts their key), else a replay
    goes back to the partition its record was read on; ``fixed_partitions`` 0: the input's own
    partitioning, counted when first needed."""

    df: Any = None
    keys: tuple[str, ...] = ()
    fixed_partitions: int = 0
    index: int = -1
    repartition: bool = False
    #: a stream's default (no keys, no partition count given): its micro-batches keep the
    #: partitions they are read in, coalesced to at most ``fixed_partitions`` (no shuffle, as
    #: plain Spark reads them), so a replay's partition is always one a round has
    narrow: bool = False
    derived: Any = None  # the barrier whose output this is (a Barrier), or None
    # the taggers' mapInArrow, built by a run's first round and reused by the others
    # (map_in_arrow_kept)
    _taggers: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    lineage: ClassVar[str] = "a new record per row: ids drawn, persisted, born in the acker"
    label: ClassVar[str] = "source"
    settled: ClassVar[bool] = True

    @property
    def partitions(self) -> int:
        """The source's declared partition count: its own, or its input's (asked of Spark
        once, when first needed: with FT off nothing needs it)."""
        if not self.fixed_partitions:
            self.fixed_partitions = num_partitions(self.df)  # a cache of a fact of the input
        return self.fixed_partitions

    def prepare(self, df: Any, ctx: RunContext) -> Any:
        """The source's own partitioning applied to an input DataFrame (or micro-batch); its
        partition count is asked for only when it repartitions."""
        if self.keys:
            from pyspark.sql import functions as F

            return df.repartition(ctx.partitions(self), *[F.col(q(k)) for k in self.keys])
        if self.narrow:
            return df.coalesce(ctx.partitions(self))
        if self.repartition:
            return df.repartition(ctx.partitions(self))
        return df

    def event_time(self, ctx: RunContext) -> str | None:
        """The column whose value the FT layer keeps as each record's event time (a stream
        with a watermark on this source's column), else None."""
        column = ctx.event_times.get(self.name)
        if column is None or self.derived is not None or column not in self.columns:
            return None
        return column

    def tagged(self, ctx: RunContext, df: Any) -> Any:
        """The rows of ``df`` with their lineage: ids drawn and the rows persisted by the
        executors' :class:`~xorack.spark.tagging.SourceTagger` (FT on)."""
        if not ctx.ft:
            return df

        cfg = ctx.config
        # the round goes in the rows (ROUND), so that the tagger is the same every round of a
        # run and its mapInArrow is built once (map_in_arrow_kept)
        tagger = SourceTagger(
            name=self.name,
            source=self.index,
            keys=self.keys,
            deterministic=cfg.deterministic_ids,
            id_salt=cfg.id_salt,
            chunk_bits=ctx.chunk_bits,
            progress=cfg.resume,
            skip=tuple(sorted(ctx.resume_skip.get(self.index, {}).items())),
            event_time=self.event_time(ctx),
            event_max=ctx.event_max.get(self.name) if self.event_time(ctx) else None,
            **ctx.runner_args(),
        )
        df = with_partition_ids(df, ctx.round)
        schema = tagged_schema(self, True)
        # PySpark's mapInArrow reads its input by column name, a name with a dot as a struct
        # field: such columns cross the tagger under names of their own
        odd = {c: f"_ft_c{i}" for i, c in enumerate(self.columns) if "." in c or "`" in c}
        if odd:
            names = tuple(c for c in df.columns if c not in (PART, ROUND))
            tagger = dataclasses.replace(tagger, names=names)
            df = df.withColumnsRenamed(odd)
        return map_in_arrow_kept(df, self._taggers, tagger, schema)

    def first_filter(self, plan: Any) -> tuple[RowOperation, Any, str | None] | None:
        """The filter that alone reads this source's rows, directly or through selects of its
        columns by name (``t.select("a", "b").where(...)``): its node, its operation and the
        qualifier its condition may name the frame by; else None."""
        names = set(self.columns)
        for node in sole_readers(plan, self):
            op, qualifier = ops.unqualified(node.op)  # the condition may name the frame
            if type(op) is ops.Filter:
                return node, op, qualifier
            if type(op) is not ops.Select or not all(_plain_name(c, names) for c in op.cols):
                return None
        return None

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        return b.source(self)

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return b.source(self)

    def recomputed(self) -> str | None:
        # a barrier's output is read from its files; an input is read again as plain Spark
        # reads it, unless its own plan computes what another read gives otherwise
        return None if self.df is None else recomputed_input(self.df)

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        why = super().blocker(scope)
        if why is None and self.df is not None and self.df.isStreaming:
            return Reason.STREAMING, "streaming runs tracked rounds"
        return why

    def describe(self) -> str:
        how = f"hash({', '.join(self.keys)})" if self.keys else "its input's partitioning"
        if self.derived is not None:
            return f"source {self.name!r} (the output of {self.derived.name!r}), by {how}"
        return f"source {self.name!r}, by {how}"


@dataclass(eq=False)
class RowOperation(Node):
    """A native operation (``ops.Filter``, ``ops.Select`` …) run in the JVM with its lineage
    kept in columns; ``proto`` is the frame its declaration analyzed, from ``analyzed_from``."""

    op: Any = None

    label: ClassVar[str] = "native"

    @property
    def lineage(self) -> str:  # type: ignore[override]
        return str(getattr(self.op, "lineage", "1 → 1"))

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        df = self.reused(inputs)
        if df is not None:
            return df
        guarded = getattr(self.op, "guarded", None)  # an operation with expressions
        if b.guard is not None and guarded is not None:  # a row that raises fails its record
            guard = b.guard.at(self.name, self.op)
            guard.spare = b.guard.spare(self, inputs[0], lambda: self.read_after(b.ctx.plan))
            return guarded(inputs[0], guard)
        return self.op.apply(inputs[0], b.ctx.ft)

    def read_after(self, plan: Any) -> list[Any]:
        """The operations of :func:`sole_readers` after this one."""
        return [node.op for node in sole_readers(plan, self)]

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        if b.plain:  # a phase of Spark's own operations only: as plain Spark runs it
            return self.op.apply(inputs[0], False)
        if id(self) in b.prefiltered:  # a filter its source's tagging applied already
            return inputs[0]
        if isinstance(self.op, LookupJoin) and self.op.how in ("inner", "left"):
            return b.lookup_join(self, self.op, inputs[0])
        return self.op.apply(inputs[0], True)

    def recomputed(self) -> str | None:
        # refused at declaration but for a lookup join's other side, read as Spark reads it
        return None if self.proto is None else recomputed_input(self.proto)

    def describe(self) -> str:
        return f"native {self.name!r}: {self.op.describe()}"


@dataclass(eq=False)
class Transform(Node):
    """An untracked Spark operation that keeps the columns: rows it removes are lost to the
    acker (they time out and are replayed); the report names it."""

    fn: Any = None

    lineage: ClassVar[str] = "untracked: a removed row times out"
    label: ClassVar[str] = "transform"

    def is_settled(self) -> bool:
        return False

    def apply(self, df: Any, ft: bool) -> Any:
        out = self.fn(df)
        check_columns(self.name, out.columns, lineage_of(self.columns, ft), "transform")
        return out

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        return b.observed_transform(self, inputs[0])

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return self.apply(inputs[0], True)

    def recomputed(self) -> str | None:
        return (
            f"the untracked transform {self.name!r} would run once per reader, and nothing "
            "checks that it gives the same rows each time"
        )


@dataclass(eq=False)
class Union(Node):
    """Two tracked frames with the same payload columns, merged by name."""

    lineage: ClassVar[str] = "1 → 1 (each row keeps its id)"
    label: ClassVar[str] = "union"

    def is_settled(self) -> bool:
        return all(p.is_settled() for p in self.parents)

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        return union_of(inputs)

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return union_of(inputs)


@dataclass(eq=False)
class PythonStage(Node):
    """A user function over batches in a Python worker: its outputs get new ids, anchored to
    the input row each came from; one combined XOR event per input row."""

    fn: Any = None

    lineage: ClassVar[str] = "1 → 0..n (anchored: one event per input row)"
    settled: ClassVar[bool] = True

    def input_frame(self, ctx: RunContext, df: Any) -> Any:
        """The frame the stage reads: without the pending-event columns when its input has
        none to send (two columns fewer to convert, and Spark prunes their constants)."""
        if ctx.ft and self.parents[0].is_settled():
            return df.drop(EV, KEEP)
        return df

    def frame(self, ctx: RunContext, df: Any, round_xor: Any = None, born: Any = None) -> Any:
        """The stage's output over ``df``; ``round_xor``: an optimistic round's accumulator;
        ``born``: the round's count of the rows of the source the stage reads untagged, and
        the attempt id they get (the stage draws their ids)."""
        raise NotImplementedError

    def output(self, ctx: RunContext, out: Any, optimistic_round: bool) -> Any:
        """The stage's output with the lineage columns: an optimistic round's runner leaves
        the attempt id out (nothing in the round reads it: a constant here, which Spark folds
        away)."""
        if optimistic_round:  # one projection: the attempt id and the pending columns
            src = optimistic.round_salt(self.name)
            pending = (f"{src}L AS {SRC}", REC, f"0L AS {EV}", f"true AS {KEEP}")
            return select_expr(out, [*map(q, self.columns), *pending])
        return with_pending(out) if ctx.ft else out

    def runner_settings(self, ctx: RunContext, round_xor: Any, born: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "fn": self.fn,
            "ft": ctx.ft,
            "deterministic": ctx.deterministic_ids,
            "tally": ctx.tally,
            "round_xor": round_xor,
            "born": born,
            **ctx.runner_args(),
        }

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        return self.frame(b.ctx, inputs[0])

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        return b.stage(self, inputs[0])

    def recomputed(self) -> str | None:
        return (
            f"the Python stage {self.name!r} would run once per reader, its events counted "
            "each time"
        )


@dataclass(eq=False)
class PandasStage(PythonStage):
    """``map_in_pandas``: ``fn(pdf) -> pdf`` per batch; a failing batch is bisected."""

    label: ClassVar[str] = "map_in_pandas"

    def frame(self, ctx: RunContext, df: Any, round_xor: Any = None, born: Any = None) -> Any:
        runner = StageRunner(
            columns=self.columns,
            bisect=True,
            single_record_groups=False,
            event_time=event_time_of(ctx.event_times, self),
            **self.runner_settings(ctx, round_xor, born),
        )
        schema = tagged_schema(self, ctx.ft, round_xor is not None)
        out = self.input_frame(ctx, df).mapInPandas(runner, schema)
        return self.output(ctx, out, round_xor is not None)


@dataclass(eq=False)
class ArrowStage(PythonStage):
    """``map_in_arrow``: ``fn(batch) -> batch`` per Arrow record batch."""

    label: ClassVar[str] = "map_in_arrow"

    def frame(self, ctx: RunContext, df: Any, round_xor: Any = None, born: Any = None) -> Any:
        runner = ArrowStageRunner(
            schema=declared_arrow_schema(self.schema, ctx.arrow_large_types()),
            **self.runner_settings(ctx, round_xor, born),
        )
        schema = tagged_schema(self, ctx.ft, round_xor is not None)
        out = self.input_frame(ctx, df).mapInArrow(runner, schema)
        return self.output(ctx, out, round_xor is not None)


@dataclass(eq=False)
class GroupStage(PythonStage):
    """``apply_in_pandas``: ``fn(pdf) -> pdf`` per group of ``keys``; a group holds the rows of
    one source record (an exception fails the whole group)."""

    keys: tuple[str, ...] = field(default=())

    label: ClassVar[str] = "apply_in_pandas"

    def frame(self, ctx: RunContext, df: Any, round_xor: Any = None, born: Any = None) -> Any:
        runner = StageRunner(
            columns=self.columns,
            bisect=False,
            single_record_groups=True,
            event_time=event_time_of(ctx.event_times, self),
            **self.runner_settings(ctx, round_xor, born),
        )
        grouped = self.input_frame(ctx, df).groupBy(*self.keys)
        out = grouped.applyInPandas(
            as_function(GroupStageRunner(runner)), tagged_schema(self, ctx.ft)
        )
        return self.output(ctx, out, False)

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        return Reason.GROUPED_STAGE, f"apply_in_pandas stage {self.name!r}"


__all__ = [
    "ArrowStage",
    "GroupStage",
    "PandasStage",
    "PythonStage",
    "RowOperation",
    "Source",
    "Transform",
    "Union",
    "lineage_of",
    "tagged_schema",
    "union_of",
    "with_pending",
]
