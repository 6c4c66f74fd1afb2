"""The user-facing, DataFrame-like surface of a pipeline: :class:`Tracked` (PySpark's
DataFrame names and argument forms) and :class:`GroupedTracked`. Each call adds one node to
the plan (:mod:`xorack.spark.declare`); nothing runs until ``Pipeline.run()``.

>>> # words = p.source(df, name="lines").select(F.explode(F.split("line", " ")).alias("word"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import ops
from .arrow_stage import ArrowFunction
from .declare import PlanBuilder
from .node import Node
from .plan import Plan
from .rows import ArrowStage, PandasStage, Source
from .sinks import NativeSink, Sink
from .stages import StageSchemaError, UserFunction, check_columns


class Tracked:
    """A DataFrame of a :class:`Pipeline`, declared lazily and built afresh for each round.

    >>> # p.source(df).map_in_pandas(fn, "word string").sink(SQLiteSink(path, "w"))
    """

    def __init__(self, builder: PlanBuilder, node: Node) -> None:
        self._builder = builder
        self._node = node

    def _on(self, node: Node) -> Tracked:
        return Tracked(self._builder, node)

    def _native(self, kind: str, make: Callable[[str], Any]) -> Tracked:
        return self._on(self._builder.native(self._node, kind, make))

    @property
    def columns(self) -> list[str]:
        """The payload columns (lineage columns are added when FT is on)."""
        return list(self._node.columns)

    @property
    def schema(self) -> Any:
        """The payload schema (a StructType)."""
        return self._node.schema

    # ---- native operations: PySpark's DataFrame API, run in the JVM, lineage kept ----------

    def filter(self, condition: Any) -> Tracked:
        """``DataFrame.filter`` (a Column or a SQL string). A removed row is acked as dropped:
        its source record completes without it, never by a timeout.

        >>> # long_lines = lines.filter(F.length("line") > 20)
        """
        return self._native("filter", lambda name: ops.Filter(condition))

    where = filter

    def select(self, *cols: Any) -> Tracked:
        """``DataFrame.select``; at most one generator (``F.explode``, ``F.explode_outer``,
        ``F.posexplode``, ``F.posexplode_outer``, ``F.inline``, ``F.inline_outer``): each
        generated row is a child record with its own id, a row generating nothing is acked.

        >>> # words = lines.select(F.explode(F.split("line", " ")).alias("word"))
        """
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        return self._native("select", lambda name: ops.Select(tuple(cols), name))

    def withColumn(self, colName: str, col: Any) -> Tracked:
        """``DataFrame.withColumn``; ``col`` may be a generator (as in :meth:`select`)."""
        return self.withColumns({colName: col})

    def withColumns(self, *colsMap: dict[str, Any]) -> Tracked:
        """``DataFrame.withColumns({name: Column})``."""
        if len(colsMap) != 1:
            raise TypeError("withColumns: expected one dict {name: Column}")
        mapping = ops.mapping_arg(colsMap[0])
        return self._native("withColumns", lambda name: ops.WithColumns(mapping, name))

    def withColumnRenamed(self, existing: str, new: str) -> Tracked:
        """``DataFrame.withColumnRenamed``."""
        return self._native("withColumnRenamed", lambda name: ops.Renamed(existing, new))

    def drop(self, *cols: str) -> Tracked:
        """``DataFrame.drop`` (column names)."""
        return self._native("drop", lambda name: ops.Drop(tuple(cols)))

    def join(self, other: Any, on: Any = None, how: str = "inner") -> Tracked:
        """``DataFrame.join`` on column names (an equi-join).

        * ``other`` an untracked DataFrame (a lookup or dimension table, broadcast or not),
          ``how`` in inner, left, left_semi, left_anti: runs in the JVM; each match is a child
          record; a row without a match under inner/left_semi (or with one under left_anti) is
          acked as dropped.
        * ``other`` a :class:`Tracked` of another stream of the same pipeline (both sources
          with a watermark): a stream-stream join, ``on`` a condition (a Column, such as
          ``F.expr("clickAdId = adId AND clickTime BETWEEN t AND t + interval 1 hour")``) or
          names, ``how`` inner or left (left outer, with a time-range condition): a joined
          row is written once, as soon as the records of both its rows have settled
          (:mod:`xorack.spark.stream_join`).
        * ``other`` a :class:`Tracked` of the same pipeline, ``how`` in inner, left: a barrier.
          The rows of both sides are staged until every record upstream is completed or
          dead-lettered, then joined once, so a record replayed on one side meets every row of
          the other side that went through before it, and a dead-lettered record joins
          nothing. The joined rows are the source records of the next phase.

        >>> # rated = words.join(F.broadcast(sentiment), "word", "left")
        """
        how = ops.join_type(how)
        if isinstance(other, Tracked):
            if other._builder is not self._builder:
                raise StageSchemaError(
                    "join: the other side must be a tracked DataFrame of this Pipeline"
                )
            b = self._builder
            if b.streaming(self._node) and b.streaming(other._node):
                return self._on(b.stream_join(self._node, other._node, on, how))
            return self._on(b.tracked_join(self._node, other._node, on, how))
        if not hasattr(other, "columns") or not hasattr(other, "join"):
            raise TypeError(f"join: expected a DataFrame or a Tracked, got {type(other)}")
        if getattr(other, "isStreaming", False):
            raise ops.TrackedOperationError(
                "join: the other side is a streaming DataFrame; a lookup join takes a static one "
                "(a stream-stream join needs both sides tracked, which is not supported yet)"
            )
        keys = tuple(ops.join_keys(on, self.columns, list(other.columns)))
        return self._native("join", lambda name: ops.LookupJoin(other, keys, how, name))

    def groupBy(self, *cols: Any) -> GroupedTracked:
        """``DataFrame.groupBy(*cols)`` (column names; none: a global aggregate, one row even
        over no rows, as Spark's); then ``.agg(*exprs)``, ``.count()``, ``.sum(...)``,
        ``.avg(...)``/``.mean(...)``, ``.min(...)``, ``.max(...)``. One of the columns may be
        a time window, ``F.window(ts, duration[, slide])`` (tumbling or sliding), or a session
        window, ``F.session_window(ts, gap)``, over the column of :meth:`withWatermark`: in a
        stream each window is written once, final, when the watermark passes its end (see
        :mod:`xorack.spark.windows`).

        >>> # counts = words.groupBy("word").agg(F.count("*").alias("n"))
        >>> # total = sales.groupBy().agg(F.sum("price").alias("revenue"))
        >>> # per10s = words.withWatermark("ts", "10 seconds").groupBy(
        >>> #     F.window("ts", "10 seconds"), "word").count()
        """
        from .windows import window_of

        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        windows = [i for i, c in enumerate(cols) if window_of(c) is not None]
        bad = [c for i, c in enumerate(cols) if not isinstance(c, str) and i not in windows]
        if bad:
            raise TypeError(
                f"groupBy: takes column names (and one F.window/F.session_window) on a tracked "
                f"DataFrame, got {bad!r}; add the expression as a column first (withColumn) and "
                "group by its name"
            )
        if len(windows) > 1:
            raise ops.TrackedOperationError(
                "groupBy: one time window per aggregation (Spark allows one too)"
            )
        names = [c for c in cols if isinstance(c, str)]
        check_columns("groupBy", self.columns, tuple(names), "groupBy")
        return GroupedTracked(self, tuple(cols), windows[0] if windows else None)

    def withWatermark(self, eventTime: str, delayThreshold: str) -> Tracked:
        """``DataFrame.withWatermark(eventTime, delayThreshold)``: the event-time column of a
        tracked stream (a timestamp column of its source, reaching the aggregation unchanged)
        and how late its rows may come. A window closes when the watermark passes its end —
        held back by the event time of every record still pending, so a replayed record is
        never late (:mod:`xorack.spark.windows`). One watermark per source (a pipeline with
        windows: one in all; a stream-stream join: one on each side).

        >>> # words = p.source(stream).withWatermark("ts", "10 seconds")
        """
        self._builder.watermark(self._node, eventTime, delayThreshold)
        return self

    groupby = groupBy

    def agg(self, *exprs: Any) -> Tracked:
        """``DataFrame.agg(*exprs)``: a global aggregate, ``groupBy().agg(*exprs)``.

        >>> # revenue = lineitem.agg(F.sum(F.col("price") * F.col("discount")).alias("revenue"))
        """
        return self.groupBy().agg(*exprs)

    def selectExpr(self, *exprs: str) -> Tracked:
        """``DataFrame.selectExpr(*exprs)``: :meth:`select` of SQL expressions."""
        from pyspark.sql import functions as F

        if len(exprs) == 1 and isinstance(exprs[0], (list, tuple)):
            exprs = tuple(exprs[0])
        bad = [e for e in exprs if not isinstance(e, str)]
        if bad:
            raise TypeError(f"selectExpr: takes SQL strings, got {bad!r}")
        return self.select(*[e if e == "*" else F.expr(e) for e in exprs])

    def unionByName(self, other: Tracked, allowMissingColumns: bool = False) -> Tracked:
        """``DataFrame.unionByName`` (the payload columns must be the same: a tracked union
        matches by name already)."""
        if allowMissingColumns:
            raise ops.TrackedOperationError(
                "unionByName: allowMissingColumns=True is not supported on a tracked DataFrame; "
                "add the missing columns with withColumn(name, F.lit(None).cast(type)) first"
            )
        return self.union(other)

    def distinct(self) -> Tracked:
        """``DataFrame.distinct()``: one row per distinct payload row (an aggregate: exactly
        once, whatever was replayed; its rows are records of the next phase)."""
        from pyspark.sql import functions as F

        name = "_xorack_rows"
        while name in self.columns:
            name += "_"
        grouped = self.groupBy(*self.columns).agg(F.count(F.lit(1)).alias(name))
        return grouped.drop(name)

    def dropDuplicates(self, subset: list[str] | tuple[str, ...] | None = None) -> Tracked:
        """``DataFrame.dropDuplicates(subset)``: one row per distinct ``subset`` (all columns
        when None), the other columns from one of its rows — the aggregate Spark itself runs
        for it (``first`` of each other column); exactly once, a barrier like ``distinct``.

        >>> # latest = events.dropDuplicates(["user"])
        """
        from pyspark.sql import functions as F

        if subset is None:
            return self.distinct()
        if isinstance(subset, str):
            subset = [subset]
        keys = tuple(subset)
        if not keys:
            return self.distinct()
        check_columns("dropDuplicates", self.columns, keys, "dropDuplicates")
        others = [c for c in self.columns if c not in keys]
        if not others:
            return self.distinct()
        picked = self.groupBy(*dict.fromkeys(keys)).agg(*[F.first(c).alias(c) for c in others])
        return picked.select(*self.columns)

    drop_duplicates = dropDuplicates

    def map_in_pandas(self, fn: UserFunction, schema: Any, name: str | None = None) -> Tracked:
        """A tracked stage: ``fn(pdf) -> pdf`` (or an iterable of frames) per pandas batch.

        With FT on, ``pdf`` carries ``_ft_src`` and ``_ft_rec`` and every output row must keep
        the ``_ft_rec`` of the input row it comes from (filter, explode, merge on the input frame
        do). ``fn`` may be called on parts of a batch (a failing batch is bisected), so it must
        not depend on the batch boundaries. To fail some rows without bisection, raise
        ``xorack.FailRecord(reason, rows=mask_or_positions)``: exactly those rows' source records
        fail and ``fn`` is called once more on the other rows. ``schema`` is the payload schema
        (DDL or StructType).

        >>> # words = lines.map_in_pandas(lambda df: df.assign(word=df.line.str.split())
        >>> #                             .explode("word"), "word string", name="split")
        """
        return self._on(self._builder.stage(self._node, PandasStage, fn, schema, name))

    def map_in_arrow(self, fn: ArrowFunction, schema: Any, name: str | None = None) -> Tracked:
        """A tracked stage on ``mapInArrow``: ``fn(batch) -> batch`` (or an iterable of
        batches) per ``pyarrow.RecordBatch``, with no pandas conversion.

        The same contract as :meth:`map_in_pandas`: with FT on, ``batch`` carries ``_ft_src``
        and ``_ft_rec`` (int64), and every output row must keep the ``_ft_rec`` of the input row
        it comes from (``batch.take(indices)``, ``batch.filter(mask)`` keep it); ``fn`` may be
        called on parts of a batch; ``xorack.FailRecord(reason, rows=mask_or_positions)`` (a
        pyarrow boolean array works as the mask) fails exactly those rows. Output columns of
        another type than declared are cast when the cast is safe.

        >>> # import pyarrow.compute as pc
        >>> # def split(b):
        >>> #     words = pc.split_pattern(b.column("line"), " ")
        >>> #     rows = b.take(pc.list_parent_indices(words))
        >>> #     return rows.append_column("word", pc.list_flatten(words))
        >>> # words = lines.map_in_arrow(split, "word string", name="split")
        """
        return self._on(self._builder.stage(self._node, ArrowStage, fn, schema, name))

    def apply_in_pandas(
        self,
        keys: list[str] | tuple[str, ...],
        fn: UserFunction,
        schema: Any,
        name: str | None = None,
    ) -> Tracked:
        """A tracked grouped stage: ``groupBy(*keys).applyInPandas``; ``fn(pdf) -> pdf`` per
        group. Every output row keeps the ``_ft_rec`` of the one input row it derives from
        (per-key dedupe, top-n, ranking, annotating rows with group statistics); inputs
        without outputs are acked. An exception fails the whole group's records (no
        bisection: the group is one unit). A group must hold the rows of one source record
        (group by the source key): a group spanning several records is refused with a clear
        error at run time, since a replayed record would be grouped without the others (a
        partial aggregate). Aggregate with :meth:`groupBy` ``.agg(...)``, which is exact.

        >>> # latest = events.apply_in_pandas(["user"], keep_latest, "user string, ts long")
        """
        node = self._builder.grouped_stage(self._node, tuple(keys), fn, schema, name)
        return self._on(node)

    def transform(self, fn: Callable[[Any], Any], name: str | None = None) -> Tracked:
        """An untracked Spark operation that keeps the columns (``repartition``, ``where``,
        ``sortWithinPartitions`` …): ``fn(DataFrame) -> DataFrame``. It is applied when each
        round is built; :attr:`Pipeline.round` says which. Rows it removes are *lost* to the
        acker: they time out and their source records are replayed.
        """
        return self._on(self._builder.transform(self._node, fn, name))

    def repartition(self, n: int, *cols: str) -> Tracked:
        """``DataFrame.repartition(n, *cols)`` (hash partitioning by ``cols``)."""
        check_columns("repartition", self._node.columns, cols, "repartition")
        return self.transform(lambda df: df.repartition(n, *cols), name="repartition")

    def union(self, other: Tracked) -> Tracked:
        """Merge two tracked DataFrames with the same payload columns (by name)."""
        if not isinstance(other, Tracked) or other._builder is not self._builder:
            raise StageSchemaError(
                "union: the other side must be a tracked DataFrame of the same Pipeline"
            )
        return self._on(self._builder.union(self._node, other._node))

    def sink(self, sink: Sink | NativeSink, name: str | None = None) -> None:
        """End the branch in ``sink``: rows are written inside the executor tasks and acked once
        the write is durable."""
        self._builder.sink(self._node, sink, name)

    # ---- the plan ------------------------------------------------------------------------------

    def explain(self) -> str:
        """The plan that ends here, as text (its nodes, lineage rules and phases); see
        :meth:`Pipeline.explain` for the whole pipeline with each phase's kind of round.

        >>> # print(words.explain())
        """
        keep: set[int] = set()
        stack = [self._node]
        while stack:
            node = stack.pop()
            if id(node) in keep:
                continue
            keep.add(id(node))
            stack.extend(node.parents)
            if isinstance(node, Source) and node.derived is not None:
                stack.append(node.derived)
        nodes = [n for n in self._builder.nodes if id(n) in keep]
        sources = tuple(s for s in self._builder.sources if id(s) in keep)
        return Plan(tuple(nodes), sources).explain()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"'Tracked' has no attribute {name!r}: a tracked DataFrame is declared lazily and "
            "built afresh for each round; it offers filter/where, select, selectExpr, "
            "withColumn(s), withColumnRenamed, drop, join, groupBy, agg, distinct, withWatermark, "
            "dropDuplicates, map_in_pandas, map_in_arrow, apply_in_pandas, transform, "
            "repartition, union, unionByName, sink and explain (columns and schema tell its "
            "payload). Look at results in the sink after Pipeline.run()."
        )


class GroupedTracked:
    """The result of :meth:`Tracked.groupBy`: ``agg(*exprs)`` or ``count()``.

    An aggregation is a barrier: the rows reaching it are staged, round after round, until
    every source record upstream is completed or dead-lettered; then Spark aggregates the
    staged rows of the completed attempts, once. So the result equals plain Spark on the input
    minus the dead-lettered records — any aggregate function (``count``, ``sum``, ``min``,
    ``max``, ``avg``, and holistic ones such as ``percentile``: each runs once on complete
    groups) — and the aggregated rows become the source records of the next phase, tracked and
    replayed if something after the aggregation fails.
    """

    def __init__(self, parent: Tracked, keys: tuple[Any, ...], window: int | None = None) -> None:
        self._parent = parent
        self._keys = keys
        self._window = window  # the index of the time window in keys, if any

    def agg(self, *exprs: Any) -> Tracked:
        """``GroupedData.agg(*exprs)`` with aggregate Columns (``F.sum("x").alias("total")``)."""
        if len(exprs) == 1 and isinstance(exprs[0], dict):
            raise TypeError(
                "agg: give Columns (F.sum('x').alias('total')); the dict form is not supported "
                "on a tracked DataFrame"
            )
        if not exprs:
            raise TypeError("agg: give at least one aggregate Column")
        parent = self._parent
        b = parent._builder
        if self._window is not None:
            return parent._on(b.windowed_aggregate(parent._node, self._keys, self._window, exprs))
        return parent._on(b.aggregate(parent._node, self._keys, tuple(exprs)))

    def count(self) -> Tracked:
        """``GroupedData.count()``: a ``count`` column per group."""
        from pyspark.sql import functions as F

        return self.agg(F.count("*").alias("count"))

    def _numeric(self, what: str, cols: tuple[str, ...]) -> list[str]:
        """``cols``, or every numeric payload column but the keys (Spark's rule for
        ``GroupedData.sum()`` without columns)."""
        from pyspark.sql.types import NumericType

        schema = self._parent.schema
        if not cols:
            return [
                f.name
                for f in schema.fields
                if isinstance(f.dataType, NumericType)
                and f.name not in [k for k in self._keys if isinstance(k, str)]
            ]
        check_columns(what, self._parent.columns, cols, what)
        bad = [c for c in cols if not isinstance(schema[c].dataType, NumericType)]
        if bad:
            raise ops.TrackedOperationError(f"{what}: {bad} are not numeric columns")
        return list(cols)

    def _each(self, function: str, cols: tuple[str, ...]) -> Tracked:
        from pyspark.sql import functions as F

        names = self._numeric(function, cols)
        if not names:
            raise ops.TrackedOperationError(f"{function}: no numeric column to aggregate")
        return self.agg(*[getattr(F, function)(F.col(c)) for c in names])

    def sum(self, *cols: str) -> Tracked:
        """``GroupedData.sum(*cols)``: ``sum(c)`` columns (every numeric one without cols)."""
        return self._each("sum", cols)

    def avg(self, *cols: str) -> Tracked:
        """``GroupedData.avg(*cols)``: ``avg(c)`` columns."""
        return self._each("avg", cols)

    mean = avg

    def min(self, *cols: str) -> Tracked:
        """``GroupedData.min(*cols)``: ``min(c)`` columns."""
        return self._each("min", cols)

    def max(self, *cols: str) -> Tracked:
        """``GroupedData.max(*cols)``: ``max(c)`` columns."""
        return self._each("max", cols)


__all__ = ["GroupedTracked", "Tracked"]
