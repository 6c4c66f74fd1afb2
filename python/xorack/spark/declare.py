"""Declaring a plan: the checks and the Spark analysis each declaration runs, and the node it
adds. :class:`~xorack.spark.tracked.Tracked` calls these; a run takes :meth:`PlanBuilder.plan`.

Each declaration is analyzed at once, so a wrong column or a type error is raised where the
user wrote it: with FT on, a native operation checks its tracked translation and analyzes the
plain one on an empty frame of its input's payload (nothing runs; see :mod:`xorack.spark.ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import join_ops, ops
from .barrier import AggregateSpec, JoinSpec, LimitSpec
from .context import PipelineConfig
from .lineage import LINEAGE
from .node import Node, roots
from .outputs import (
    Aggregate,
    Barrier,
    Limit,
    NativeSinkNode,
    PythonSinkNode,
    Sink,
    StreamDedup,
    StreamJoin,
    TrackedJoin,
    WindowAggregate,
)
from .plan import Plan
from .reproducible import check_reproducible
from .rows import (
    GroupStage,
    PythonStage,
    RowOperation,
    Source,
    Transform,
    Union,
)
from .schema import empty_frame
from .sinks import capabilities_of
from .stages import StageSchemaError, check_columns
from .stream_dedup import StreamDedupSpec
from .stream_join import StreamJoinSpec, state_lags
from .windows import Watermark, WindowSpec, delay_micros, window_of


class PlanBuilder:
    """The nodes of a pipeline as they are declared (parents before children)."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.spark = config.spark
        self.ft = config.ft
        self.nodes: list[Node] = []
        self.sources: list[Source] = []
        self._names: set[str] = set()
        self._watermarks: dict[str, Watermark] = {}  # per source
        self._windows = False  # a windowed aggregation was declared

    def plan(self) -> Plan:
        """The plan as declared so far (immutable)."""
        wms = tuple(self._watermarks.values())
        one = wms[0] if len(wms) == 1 else None
        return Plan(tuple(self.nodes), tuple(self.sources), one, wms)

    # ---- checks ------------------------------------------------------------------------------

    def struct(self, schema: Any) -> Any:
        """A payload schema from a DDL string or a StructType (no lineage column in it)."""
        from pyspark.sql.types import StructType

        from .schema import parse_ddl_schema

        if isinstance(schema, StructType):
            st = schema
        elif isinstance(schema, str):
            try:
                st = parse_ddl_schema(self.spark, schema)
            except ValueError as exc:
                raise StageSchemaError(f"schema must describe columns: {exc}") from None
        else:
            raise TypeError(f"schema must be a DDL string or a StructType, got {type(schema)}")
        bad = [f.name for f in st.fields if f.name.startswith("_ft_")]
        if bad:
            raise StageSchemaError(
                f"schema: {bad} are lineage columns added by xorack; declare the payload only"
            )
        return st

    def unique(self, name: str | None, default: str) -> str:
        """``name`` when given (a name already used by a source, stage or sink of this
        pipeline is an error: reports and dead letters are keyed by name), else ``default``
        made unique with a suffix."""
        if name is not None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"name must be a non-empty string, got {name!r}")
            if name in self._names:
                raise StageSchemaError(
                    f"name {name!r} is already used by another source, stage or sink of this "
                    "pipeline; give each a name of its own"
                )
            self._names.add(name)
            return name
        base, i, name = default, 1, default
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def prototype(self, node: Node) -> Any:
        """The frame a declaration on ``node``'s output is analyzed against: the one its own
        declaration fixed (a source's; a native node's output), else an empty DataFrame of its
        payload (nothing runs)."""
        return node.proto if node.proto is not None else empty_frame(self.spark, node.schema)

    def analyze(self, what: str, build: Callable[[], Any]) -> Any:
        """Run ``build`` (a lazy DataFrame construction) and turn Spark's analysis errors into
        an error naming the tracked operation."""
        try:
            return build()
        except (ops.TrackedOperationError, TypeError):
            raise
        except Exception as exc:
            if type(exc).__name__ in (
                "AnalysisException",
                "ParseException",
                "IllegalArgumentException",
            ):
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise ops.TrackedOperationError(f"{what}: {first}") from None
            raise

    @staticmethod
    def payload_schema(df: Any) -> Any:
        from pyspark.sql.types import StructType

        return StructType([f for f in df.schema.fields if f.name not in LINEAGE])

    # ---- nodes -------------------------------------------------------------------------------

    def source(
        self, df: Any, name: str | None, keys: tuple[str, ...], partitions: int | None
    ) -> Source:
        cols = tuple(df.columns)
        bad = [c for c in cols if c.startswith("_ft_")]
        if bad:
            raise StageSchemaError(f"source {name!r}: column names {bad} are reserved by xorack")
        check_columns(name or "source", cols, keys, "source")
        if keys or partitions or df.isStreaming:
            n = int(partitions or self.spark.conf.get("spark.sql.shuffle.partitions"))
        else:
            n = 0  # the input's own partitioning, counted when a replay needs it
        repartition = bool(keys or partitions or df.isStreaming)
        if not self.ft and not repartition and not df.isStreaming:
            # with FT off its native operations analyze the input itself: the frames they
            # analyze are the ones the run executes (see Node.reused)
            proto = df
        else:
            proto = empty_frame(self.spark, df.schema)
        node = Source(
            self.unique(name, "source"),
            (),
            cols,
            df.schema,
            df=df,
            keys=keys,
            fixed_partitions=n,
            index=len(self.sources),
            repartition=repartition,
            narrow=bool(df.isStreaming and not keys and not partitions),
            proto=proto,
        )
        self.sources.append(node)
        self._add(node)
        return node

    def streaming(self, node: Node) -> bool:
        """Whether rows of a streaming source reach ``node``."""
        stack, seen = [node], set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if isinstance(n, Source) and n.df is not None and n.df.isStreaming:
                return True
            stack.extend(n.parents)
            if isinstance(n, Source) and n.derived is not None:
                stack.append(n.derived)
        return False

    def native(
        self, parent: Node, kind: str, make: Callable[[str], Any], qualifier: str | None = None
    ) -> Node:
        """A native operation node: ``make(name)`` builds the operator; its output schema comes
        from applying it to the parent's prototype. An operation with expressions reads its
        input aliased ``qualifier`` (``t["k"]``, ``t.alias("a")``)."""
        name = self.unique(None, kind)
        op = make(name)
        if qualifier is not None and hasattr(op, "guarded"):
            op = ops.Qualified(op, qualifier)
        given = self.prototype(parent)
        out = self.analyze(
            op.describe(), lambda: op.declare(given) if self.ft else op.apply(given, False)
        )
        if self.ft and kind != "join":  # a lookup side is read afresh each round, as Spark reads it
            check_reproducible(op.describe(), out)
        schema = self.payload_schema(out)
        node = RowOperation(
            name,
            (parent,),
            tuple(schema.fieldNames()),
            schema,
            phase=parent.phase,
            op=op,
            proto=out,
            analyzed_from=(given,),
        )
        return self._add(node)

    def stage(
        self, parent: Node, cls: type[PythonStage], fn: Any, schema: Any, name: str | None
    ) -> Node:
        """A Python stage of kind ``cls`` (:class:`PandasStage`, :class:`ArrowStage`)."""
        if not callable(fn):
            raise TypeError(f"{cls.label}: fn must be callable, got {type(fn).__name__}")
        st = self.struct(schema)
        name = self.unique(name, getattr(fn, "__name__", "stage"))
        node = cls(name, (parent,), tuple(st.fieldNames()), st, phase=parent.phase, fn=fn)
        return self._add(node)

    def grouped_stage(
        self, parent: Node, keys: tuple[str, ...], fn: Any, schema: Any, name: str | None
    ) -> Node:
        if not callable(fn):
            raise TypeError(f"apply_in_pandas: fn must be callable, got {type(fn).__name__}")
        check_columns("apply_in_pandas", parent.columns, keys, "apply_in_pandas")
        st = self.struct(schema)
        name = self.unique(name, getattr(fn, "__name__", "grouped"))
        node = GroupStage(
            name, (parent,), tuple(st.fieldNames()), st, phase=parent.phase, fn=fn, keys=keys
        )
        return self._add(node)

    def transform(self, parent: Node, fn: Callable[[Any], Any], name: str | None) -> Node:
        name = self.unique(name, "transform")
        if self.ft:
            try:  # fn is applied to each round's frames: what it would add, on an empty one
                out = fn(self.prototype(parent))
            except Exception:  # it needs the lineage columns, or fails: the run will say so
                out = None
            if out is not None:
                check_reproducible(f"transform {name!r}", out)
        node = Transform(
            name,
            (parent,),
            parent.columns,
            parent.schema,
            phase=parent.phase,
            fn=fn,
        )
        return self._add(node)

    def union(self, left: Node, right: Node) -> Node:
        if right is left:
            raise StageSchemaError(
                "union: a tracked DataFrame cannot be unioned with itself (each row would be "
                "emitted twice under one lineage); map it twice into two stages instead"
            )
        if list(right.columns) != list(left.columns):
            raise StageSchemaError(
                f"union: payload columns differ: {list(left.columns)} vs {list(right.columns)}"
            )
        node = Union(
            self.unique(None, "union"),
            (left, right),
            left.columns,
            left.schema,
            phase=max(left.phase, right.phase),
        )
        return self._add(node)

    def sink(self, parent: Node, sink: Any, name: str | None) -> Sink:
        caps = capabilities_of(sink)  # a TypeError for what is not a sink
        check = getattr(sink, "check_schema", None) if caps.typed and not caps.native else None
        if check is not None:
            check(parent.schema)  # an unsupported type fails here, not per row
        cls = NativeSinkNode if caps.native else PythonSinkNode
        node = cls(
            self.unique(name, "sink"),
            (parent,),
            parent.columns,
            parent.schema,
            phase=parent.phase,
            sink=sink,
            caps=caps,
        )
        self._add(node)
        return node

    def _barrier(
        self, parents: list[Node], spec: Any, cls: type[Barrier], keys: tuple[str, ...]
    ) -> Source:
        """A barrier node over ``parents`` and the source node of its output (the next phase)."""
        if self.ft:  # the barrier reads the staged payload rows
            protos = [empty_frame(self.spark, p.schema) for p in parents]
        else:  # it reads its parents' frames as they are
            protos = [self.prototype(p) for p in parents]
        out = self.analyze(spec.describe(), lambda: spec.compute(protos))
        if self.ft:
            check_reproducible(spec.describe(), out)
        schema = out.schema
        name = self.unique(None, cls.label)
        cols = tuple(schema.fieldNames())
        ops.check_output_names(spec.describe(), list(cols))
        phase = max(p.phase for p in parents) + 1
        plain = not self.ft  # its output goes on unchanged: one frame for both
        barrier = cls(
            name,
            tuple(parents),
            cols,
            schema,
            phase=phase,
            spec=spec,
            proto=out if plain else None,
            analyzed_from=tuple(protos) if plain else (),
        )
        self._add(barrier)
        n = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        source = Source(
            name,
            (),
            cols,
            schema,
            phase=phase,
            keys=tuple(keys),
            fixed_partitions=n,
            index=len(self.sources),
            repartition=True,
            derived=barrier,
            proto=out if plain else empty_frame(self.spark, schema),
        )
        self.sources.append(source)
        self._add(source)
        return source

    def aggregate(self, parent: Node, keys: tuple[str, ...], exprs: tuple[Any, ...]) -> Source:
        return self._barrier([parent], AggregateSpec(keys, exprs), Aggregate, keys=keys)

    def watermark(self, node: Node, column: Any, delay: Any) -> None:
        """``withWatermark(column, delay)``: a timestamp column of the source ``node`` reads,
        one watermark per source (several only for a stream-stream join)."""
        from pyspark.sql.types import TimestampNTZType, TimestampType

        if not isinstance(column, str):
            raise TypeError(f"withWatermark: eventTime must be a column name, got {column!r}")
        check_columns("withWatermark", node.columns, (column,), "withWatermark")
        delay_us = delay_micros(delay)
        self.analyze("withWatermark", lambda: self.prototype(node).withWatermark(column, delay))
        kind = node.schema[column].dataType
        if isinstance(kind, TimestampNTZType):
            raise ops.TrackedOperationError(
                f"withWatermark: {column!r} is timestamp_ntz; give a timestamp (with the session "
                "time zone): F.col(c).cast('timestamp'), on the input DataFrame"
            )
        if not isinstance(kind, TimestampType):
            raise ops.TrackedOperationError(
                f"withWatermark: {column!r} is {kind.simpleString()}, not a timestamp; cast it "
                "first (F.col(c).cast('timestamp')), on the input DataFrame"
            )
        if not isinstance(node, Source) or node.derived is not None:
            raise ops.TrackedOperationError(
                "withWatermark: declare it on the source itself (p.source(df, ...)"
                ".withWatermark(column, delay)): the event time must be the source records' own "
                "(the FT layer keeps it with each record), as every row of the source sees it"
            )
        wm = Watermark(column, str(delay), delay_us, node.name)
        had = self._watermarks.get(node.name)
        if had is not None and had != wm:
            raise ops.TrackedOperationError(
                f"withWatermark: source {node.name!r} already has one ({had.column!r} "
                f"{had.delay!r}); one watermark per source"
            )
        if self._watermarks and had is None and self._windows:
            raise ops.TrackedOperationError(
                "withWatermark: this pipeline aggregates by a time window over the watermark of "
                f"{next(iter(self._watermarks))!r}; a second watermark (Spark takes the minimum "
                "of several) is supported for stream-stream joins only"
            )
        self._watermarks[node.name] = wm

    def windowed_aggregate(
        self, parent: Node, groups: tuple[Any, ...], at: int, exprs: tuple[Any, ...]
    ) -> Source:
        """``groupBy(..., F.window(ts, ...) or F.session_window(ts, gap), ...).agg(*exprs)``."""
        found = window_of(groups[at])
        assert found is not None  # checked by Tracked.groupBy
        kind, time = found
        if time not in parent.columns:
            raise ops.TrackedOperationError(
                f"groupBy: the window's time column {time!r} is not among the columns "
                f"{list(parent.columns)}"
            )
        if len(self._watermarks) > 1:
            raise ops.TrackedOperationError(
                f"groupBy: this pipeline has watermarks on {sorted(self._watermarks)}; a "
                "windowed aggregation takes a pipeline with one watermark (Spark takes the "
                "minimum of several: not supported with windows)"
            )
        self._windows = True
        wm = next(iter(self._watermarks.values()), None)
        if wm is not None and time != wm.column:
            raise ops.TrackedOperationError(
                f"groupBy: the window is over {time!r} but the watermark is on {wm.column!r}; "
                "window over the watermark's column"
            )
        spec = WindowSpec(tuple(groups), at, kind, time, tuple(exprs))
        proto = empty_frame(self.spark, parent.schema)
        out = self.analyze(spec.describe(), lambda: spec.compute([proto]))
        spec = WindowSpec(tuple(groups), at, kind, time, tuple(exprs), tuple(out.columns))
        keys = (spec.window_name, *spec.keys)
        return self._barrier([parent], spec, WindowAggregate, keys=keys)

    def stream_join(self, left: Node, right: Node, on: Any, how: str) -> Source:
        """``left.join(right, on, how)`` of two tracked streams (:mod:`.stream_join`)."""
        from pyspark.sql import Column

        if how not in ("inner", "left"):
            raise ops.TrackedOperationError(
                f"join: how={how!r} between two streams is not supported; use inner or left "
                "(left outer)"
            )
        wms: list[Watermark] = []
        for side, node in (("left", left), ("right", right)):
            sources = _sources_of(node)
            if len(sources) != 1:
                raise ops.TrackedOperationError(
                    f"join: the {side} side of a stream-stream join reads "
                    f"{len(sources)} sources; give each side one streaming source"
                )
            wm = self._watermarks.get(sources[0].name)
            if wm is None:
                raise ops.TrackedOperationError(
                    f"join: the {side} side's source {sources[0].name!r} has no watermark; a "
                    "stream-stream join needs withWatermark(column, delay) on both sources (a "
                    "joined row waits until the records of both its rows have settled)"
                )
            if wm.column not in node.columns:
                raise ops.TrackedOperationError(
                    f"join: the {side} side no longer has its event-time column {wm.column!r}; "
                    "keep it up to the join"
                )
            wms.append(wm)
        if wms[0].source == wms[1].source:
            raise ops.TrackedOperationError(
                "join: both sides read the same stream; a stream joined with itself is not "
                "supported"
            )
        if isinstance(on, Column):
            cond: Any = on
            clash = sorted(set(left.columns) & set(right.columns))
        else:
            cond = tuple(join_ops.join_keys(on, list(left.columns), list(right.columns)))
            clash = sorted((set(left.columns) & set(right.columns)) - set(cond))
        if clash:
            raise ops.TrackedOperationError(
                f"join: columns {clash} are on both sides (the output would have two columns of "
                "each name); rename them on one side first"
            )
        spec = StreamJoinSpec(cond, how, (wms[0].column, wms[1].column))
        delays = (wms[0].delay_us // 1000, wms[1].delay_us // 1000)
        schemas = (left.schema, right.schema)
        lags = self.analyze(spec.describe(), lambda: state_lags(self.spark, schemas, spec, delays))
        if how == "left" and lags[0] is None:
            raise ops.TrackedOperationError(
                "join: a left outer join of two streams needs a time-range condition between "
                f"the event times {wms[0].column!r} and {wms[1].column!r} (e.g. "
                f'F.expr("{wms[1].column} BETWEEN {wms[0].column} AND {wms[0].column} + '
                'interval 1 hour")): without it no left row could ever be written unmatched '
                "(Spark refuses it too)"
            )
        spec = StreamJoinSpec(cond, how, spec.times, lags)
        return self._barrier([left, right], spec, StreamJoin, keys=())

    def stream_dedup(self, parent: Node, keys: tuple[str, ...], within: bool = False) -> Source:
        """``dropDuplicates(keys)`` of a tracked stream (:mod:`.stream_dedup`): the rows keep
        their source's event-time column when it is still there (late rows are dropped, and
        the keys' state is bounded when it is among ``keys``). ``within``:
        ``dropDuplicatesWithinWatermark(keys)``, which needs the watermark's column (Spark
        refuses it without one)."""
        what = "dropDuplicatesWithinWatermark" if within else "dropDuplicates"
        sources = _sources_of(parent)
        wms = [self._watermarks.get(s.name) for s in sources]
        if len(sources) > 1 and (within or any(wm is not None for wm in wms)):
            marked = sum(wm is not None for wm in wms)
            raise ops.TrackedOperationError(
                f"{what}: the stream reads {len(sources)} sources, {marked} with a "
                "watermark; drop the duplicates of each source before the union"
            )
        wm = wms[0] if len(sources) == 1 else None
        time = wm.column if wm is not None and wm.column in parent.columns else None
        within_us = None
        if within:
            if wm is None:
                raise ops.TrackedOperationError(
                    f"{what}: the stream has no watermark; declare withWatermark(column, delay) "
                    "on its source first (a key is kept until the watermark passes its event "
                    "time + the delay; Spark refuses it without a watermark too)"
                )
            if time is None:
                raise ops.TrackedOperationError(
                    f"{what}: the event-time column {wm.column!r} of the watermark no longer "
                    "reaches it; keep the column up to the deduplication (it need not be "
                    "among the keys; Spark refuses it too)"
                )
            within_us = wm.delay_us // 1000 * 1000  # Spark keeps the delay in milliseconds
        spec = StreamDedupSpec(keys, time, within_us)
        return self._barrier([parent], spec, StreamDedup, keys=())

    def tracked_join(
        self,
        left: Node,
        right: Node,
        on: Any,
        how: str,
        qualifiers: tuple[str, str] = ("", ""),
    ) -> Source:
        """A join of two tracked frames (a barrier): on shared column names, or on a Column
        condition over the sides aliased ``qualifiers``; any join type."""
        if right is left:
            raise StageSchemaError(
                "join: a tracked DataFrame cannot be joined with itself; map it into two stages "
                "first"
            )
        if on is None:
            raise ops.TrackedOperationError(
                "join: without `on` Spark makes a cross join, which is not supported between "
                "tracked DataFrames; give column names or a Column condition"
            )
        how = join_ops.tracked_join_type(how)
        lcols, rcols = list(left.columns), list(right.columns)
        semi = how in ("left_semi", "left_anti")
        cond = join_ops.join_condition(on)
        if cond is None:
            keys = tuple(join_ops.join_keys(on, lcols, rcols))
            clash = sorted((set(lcols) & set(rcols)) - set(keys))
            spec = JoinSpec(keys, how)
            out_keys = keys
        else:
            if qualifiers[0] == qualifiers[1]:
                raise ops.TrackedOperationError(
                    f"join: both sides are aliased {qualifiers[0]!r}; alias them apart "
                    "(t1.alias('a').join(t2.alias('b'), F.col('a.k') == F.col('b.k')))"
                )
            clash = sorted(set(lcols) & set(rcols))
            spec = JoinSpec((), how, cond, qualifiers)
            pairs = join_ops.equi_keys(cond, (qualifiers[0], lcols), (qualifiers[1], rcols))
            # the next phase is partitioned by the equi-keys it can name unambiguously
            side = [lk for lk, _ in pairs] if how != "right" else [rk for _, rk in pairs]
            out_keys = tuple(dict.fromkeys(k for k in side if semi or k not in clash))
            if how == "full":
                out_keys = ()
        if clash and not semi:
            what = "" if cond is None else " (a Column condition keeps both sides' columns)"
            raise ops.TrackedOperationError(
                f"join: columns {clash} are on both sides{what}, so the output would have two "
                "columns of each name; rename them on one side first (withColumnRenamed)"
                + (", or join on the shared names: join(other, 'k')" if cond is not None else "")
            )
        return self._barrier([left, right], spec, TrackedJoin, keys=out_keys)

    def limit(self, parent: Node, n: Any, order: tuple[Any, ...], qualifier: str = "") -> Source:
        """``limit(n)`` or ``orderBy(*order).limit(n)``, a barrier."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"limit: n must be an int >= 0, got {n!r}")
        if self.streaming(parent):
            raise ops.TrackedOperationError(
                "limit: not supported on a tracked stream (a stream has no end to count from)"
            )
        return self._barrier([parent], LimitSpec(n, tuple(order), qualifier), Limit, keys=())


def _sources_of(node: Node) -> list[Source]:
    """The sources whose rows reach ``node`` (each once)."""
    return [n for n in roots(node) if isinstance(n, Source)]


__all__ = ["PlanBuilder"]
