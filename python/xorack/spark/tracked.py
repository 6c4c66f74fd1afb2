"""The user-facing, DataFrame-like surface of a pipeline: :class:`Tracked` (PySpark's
DataFrame names and argument forms) and :class:`GroupedTracked`. Each call adds one node to
the plan (:mod:`xorack.spark.declare`); nothing runs until ``Pipeline.run()``.

>>> # words = p.source(df, name="lines").select(F.explode(F.split("line", " ")).alias("word"))
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from . import join_ops, ops
from .arrow_stage import ArrowFunction
from .declare import PlanBuilder
from .node import Node
from .plan import Plan
from .rows import ArrowStage, PandasStage, Source
from .sinks import NativeSink, Sink
from .stages import StageSchemaError, UserFunction, check_columns
from .unsupported import unsupported


class Tracked:
    """A DataFrame of a :class:`Pipeline`, declared lazily and built afresh for each round.

    >>> # p.source(df).map_in_pandas(fn, "word string").sink(SQLiteSink(path, "w"))
    """

    def __init__(self, builder: PlanBuilder, node: Node, alias: str | None = None) -> None:
        self._builder = builder
        self._node = node
        self._alias = alias

    @property
    def _qualifier(self) -> str:
        """What ``t["k"]`` qualifies its column with: the alias (given by :meth:`alias`, or
        kept from the frame a row operation derived this one from), else the node's own name
        (a source's, a stage's, a barrier output's)."""
        return self._alias if self._alias is not None else self._node.name

    def _on(self, node: Node) -> Tracked:
        return Tracked(self._builder, node)

    def _native(self, kind: str, make: Callable[[str], Any]) -> Tracked:
        """A row operation's frame; it keeps this frame's qualifier (as Spark's attributes pass
        through a row operation), so ``t.k`` reaches ``k`` in the frames derived from ``t``."""
        node = self._builder.native(self._node, kind, make, self._qualifier)
        return Tracked(self._builder, node, self._qualifier)

    @property
    def columns(self) -> list[str]:
        """The payload columns (lineage columns are added when FT is on)."""
        return list(self._node.columns)

    @property
    def schema(self) -> Any:
        """The payload schema (a StructType)."""
        return self._node.schema

    @property
    def dtypes(self) -> list[tuple[str, str]]:
        """``DataFrame.dtypes``: (name, type) of each payload column."""
        return [(f.name, f.dataType.simpleString()) for f in self._node.schema.fields]

    def printSchema(self, level: int | None = None) -> None:
        """``DataFrame.printSchema()``: the payload schema as a tree."""
        tree = self._node.schema.treeString(level) if level else self._node.schema.treeString()
        print(tree)

    def alias(self, alias: str) -> Tracked:
        """``DataFrame.alias(name)``: the same frame, its columns reachable as
        ``F.col("name.k")`` in its own operations and in a join's condition.

        >>> # o.alias("o").join(l.alias("l"), F.col("o.id") == F.col("l.order_id"))
        """
        if not isinstance(alias, str) or not alias:
            raise TypeError(f"alias: expected a non-empty string, got {alias!r}")
        return Tracked(self._builder, self._node, alias)

    def __getitem__(self, item: Any) -> Any:
        """``t["k"]`` (or ``t[i]``): the column, for this frame's operations and join conditions
        (``t1.join(t2, t1["k"] == t2["k2"])``); ``t[cond]`` filters, ``t[["a", "b"]]``
        selects, as PySpark's DataFrame does."""
        from pyspark.sql import functions as F

        from .lineage import q

        if isinstance(item, int) and not isinstance(item, bool):
            if not -len(self.columns) <= item < len(self.columns):
                raise IndexError(f"column index {item} out of range for {self.columns}")
            item = self.columns[item]
        if isinstance(item, str):
            if item not in self.columns:
                raise ops.TrackedOperationError(
                    f"{item!r} is not a column of this tracked DataFrame: {self.columns}"
                )
            return F.col(f"{q(self._qualifier)}.{q(item)}")
        if ops.is_column(item):
            return self.filter(item)
        if isinstance(item, (list, tuple)):
            return self.select(*item)
        raise TypeError(f"unexpected item type: {type(item).__name__}")

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

    def withColumnsRenamed(self, colsMap: dict[str, str]) -> Tracked:
        """``DataFrame.withColumnsRenamed({old: new})``."""
        if not isinstance(colsMap, dict):
            raise TypeError(f"withColumnsRenamed: expected a dict {{old: new}}, got {colsMap!r}")
        mapping = tuple(colsMap.items())
        return self._native("withColumnsRenamed", lambda name: ops.Renames(mapping))

    def fillna(self, value: Any, subset: Any = None) -> Tracked:
        """``DataFrame.fillna(value, subset)`` / ``na.fill``: Spark's own rule (a value fills
        the columns of its type; a dict gives a value per column)."""
        if isinstance(value, dict):
            fill: Any = tuple(value.items())
        elif isinstance(value, (bool, int, float, str)):
            fill = value
        else:
            raise TypeError(f"fillna: value must be a bool, int, float, str or dict, got {value!r}")
        if isinstance(subset, str):
            subset = [subset]
        cols = tuple(subset) if subset is not None else None
        return self._native("fillna", lambda name: ops.FillNull(fill, cols))

    def dropna(self, how: str = "any", thresh: int | None = None, subset: Any = None) -> Tracked:
        """``DataFrame.dropna(how, thresh, subset)`` / ``na.drop``: a filter (a removed row is
        acked as dropped); NaN counts as null, as in Spark.

        >>> # rated = ratings.dropna(subset=["rating"])
        """
        if how not in ("any", "all"):
            raise ValueError(f"dropna: how must be 'any' or 'all', got {how!r}")
        if isinstance(subset, str):
            subset = [subset]
        cols = tuple(subset) if subset is not None else tuple(self.columns)
        check_columns("dropna", self.columns, cols, "dropna")
        if thresh is None:
            thresh = len(cols) if how == "any" else 1
        if isinstance(thresh, bool) or not isinstance(thresh, int):
            raise TypeError(f"dropna: thresh must be an int, got {thresh!r}")
        cond = ops.present_count(self.schema, cols) >= thresh
        return self._native("dropna", lambda name: ops.Filter(cond))

    @property
    def na(self) -> TrackedNa:
        """``DataFrame.na``: ``fill`` and ``drop``."""
        return TrackedNa(self)

    def drop(self, *cols: str) -> Tracked:
        """``DataFrame.drop`` (column names)."""
        return self._native("drop", lambda name: ops.Drop(tuple(cols)))

    def join(self, other: Any, on: Any = None, how: str = "inner") -> Tracked:
        """``DataFrame.join``.

        * ``other`` an untracked DataFrame (a lookup or dimension table, broadcast or not),
          ``on`` column names, ``how`` in inner, left, left_semi, left_anti: runs in the JVM;
          each match is a child record; a row without a match under inner/left_semi (or with
          one under left_anti) is acked as dropped.
        * ``other`` a :class:`Tracked` of the same pipeline, ``on`` column names or a Column
          condition (``t1.k == t2.k2``, several keys with ``&`` or in a list, a residual
          non-equi condition too), ``how`` in inner, left, right, full, left_semi, left_anti:
          a barrier. The rows of both sides are staged until every record upstream is
          completed or dead-lettered, then Spark joins them once, so a record replayed on one
          side meets every row of the other side that went through before it, and a
          dead-lettered record joins nothing. The joined rows are the source records of the
          next phase.
        * ``other`` a :class:`Tracked` of another stream of the same pipeline (both sources
          with a watermark): a stream-stream join, ``on`` a condition over column names (such
          as ``F.expr("clickAdId = adId AND clickTime BETWEEN t AND t + interval 1 hour")``)
          or names, ``how`` inner or left (left outer, with a time-range condition): a joined
          row is written once, as soon as the records of both its rows have settled
          (:mod:`xorack.spark.stream_join`).

        >>> # rated = words.join(F.broadcast(sentiment), "word", "left")
        >>> # lines = orders.join(items, orders.o_orderkey == items.l_orderkey)
        """
        if isinstance(other, Tracked):
            if other._builder is not self._builder:
                raise StageSchemaError(
                    "join: the other side must be a tracked DataFrame of this Pipeline"
                )
            b = self._builder
            if b.streaming(self._node) and b.streaming(other._node):  # a stream-stream join
                kind = join_ops.tracked_join_type(how)
                return self._on(b.stream_join(self._node, other._node, on, kind))
            qualifiers = (self._qualifier, other._qualifier)
            node = b.tracked_join(self._node, other._node, on, how, qualifiers)
            return self._on(node)
        how = join_ops.join_type(how)
        if not hasattr(other, "columns") or not hasattr(other, "join"):
            raise TypeError(f"join: expected a DataFrame or a Tracked, got {type(other)}")
        if getattr(other, "isStreaming", False):
            raise ops.TrackedOperationError(
                "join: the other side is a streaming DataFrame; a lookup join takes a static one "
                "(a stream-stream join needs both sides tracked, which is not supported yet)"
            )
        if join_ops.join_condition(on) is not None:
            raise ops.TrackedOperationError(
                "join: with an untracked DataFrame `on` takes column names (an equi-join on "
                "columns both sides have); rename the lookup's key columns to match "
                "(other.withColumnRenamed('k2', 'k')), or filter after the join"
            )
        keys = tuple(join_ops.join_keys(on, self.columns, list(other.columns)))
        return self._native("join", lambda name: join_ops.LookupJoin(other, keys, how, name))

    def groupBy(self, *cols: Any) -> GroupedTracked:
        """``DataFrame.groupBy(*cols)`` (column names or Columns — an expression is grouped by
        under the name Spark gives it; none: a global aggregate, one row even over no rows, as
        Spark's); then ``.agg(*exprs)``, ``.count()``, ``.sum(...)``,
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
        if len(windows) > 1:
            raise ops.TrackedOperationError(
                "groupBy: one time window per aggregation (Spark allows one too)"
            )
        bad = [c for i, c in enumerate(cols) if not isinstance(c, str) and not ops.is_column(c)]
        if bad:
            raise TypeError(f"groupBy: takes column names and Columns, got {bad!r}")
        t, keys = _grouping_columns(self, cols, windows)
        names = [c for c in keys if isinstance(c, str)]
        check_columns("groupBy", t.columns, tuple(names), "groupBy")
        return GroupedTracked(t, tuple(keys), windows[0] if windows else None)

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
        once, whatever was replayed; its rows are records of the next phase). In a stream,
        ``dropDuplicates()`` (:mod:`xorack.spark.stream_dedup`)."""
        from pyspark.sql import functions as F

        if self._builder.streaming(self._node):
            return self._on(self._builder.stream_dedup(self._node, tuple(self.columns)))
        name = "_xorack_rows"
        while name in self.columns:
            name += "_"
        grouped = self.groupBy(*self.columns).agg(F.count(F.lit(1)).alias(name))
        return grouped.drop(name)

    def dropDuplicates(self, subset: list[str] | tuple[str, ...] | None = None) -> Tracked:
        """``DataFrame.dropDuplicates(subset)``: one row per distinct ``subset`` (all columns
        when None), the other columns from one of its rows — the aggregate Spark itself runs
        for it (``first`` of each other column); exactly once, a barrier like ``distinct``.
        In a stream, Spark's streaming deduplication: each key written once, from the rows of
        records that settled, written straight into sinks (:mod:`xorack.spark.stream_dedup`).

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
        if self._builder.streaming(self._node):
            keys = tuple(dict.fromkeys(keys))
            return self._on(self._builder.stream_dedup(self._node, keys))
        others = [c for c in self.columns if c not in keys]
        if not others:
            return self.distinct()
        picked = self.groupBy(*dict.fromkeys(keys)).agg(*[F.first(c).alias(c) for c in others])
        return picked.select(*self.columns)

    drop_duplicates = dropDuplicates

    def dropDuplicatesWithinWatermark(self, *names: Any, subset: Any = None) -> Tracked:
        """``DataFrame.dropDuplicatesWithinWatermark(subset)`` of a tracked stream with a
        watermark: the first row of each ``subset`` key (all columns when None) is written,
        the key's later rows are dropped until the watermark passes the written row's event
        time + the watermark's delay, and the next row of the key is written again. Exact
        while the stream runs, as ``dropDuplicates`` (:mod:`xorack.spark.stream_dedup`). The
        event-time column must reach it (not necessarily among ``subset``). Like Spark's, it
        is refused on a batch frame (use ``dropDuplicates``) and on a stream without a
        watermark. ``subset``: a list or tuple of column names (or the names as arguments).

        >>> # unique = events.withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["guid"])
        """
        what = "dropDuplicatesWithinWatermark"
        given: Any = subset
        if names and subset is not None:
            given = (names, subset)  # refused below
        elif len(names) == 1 and (names[0] is None or isinstance(names[0], (list, tuple))):
            given = names[0]
        elif names:
            given = list(names)
        cols: list[Any] = self.columns if given is None else []
        if isinstance(given, (list, tuple)):
            cols = list(given)
        bad = [c for c in cols if not isinstance(c, str)]
        if bad or not cols:
            raise TypeError(
                f"{what}: subset must be column names (a list or tuple of str, or str "
                f"arguments, at least one), or None for all columns; got {given!r}"
            )
        check_columns(what, self.columns, tuple(cols), what)
        if not self._builder.streaming(self._node):
            raise ops.TrackedOperationError(
                f"{what}: not supported on a batch frame (nor in Spark); use "
                f"dropDuplicates({cols!r})"
            )
        keys = tuple(dict.fromkeys(cols))
        return self._on(self._builder.stream_dedup(self._node, keys, within=True))

    def orderBy(self, *cols: Any, ascending: Any = None) -> OrderedTracked:
        """``DataFrame.orderBy(*cols)`` / ``sort``, for ``.limit(n)``: the first n rows in that
        order (a top-n, a barrier). A sink does not keep an order (its rows are written by
        rounds, in partitions): sort when you read the sink.

        >>> # top10 = revenue.orderBy(F.desc("revenue")).limit(10)
        """
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        if not cols:
            raise TypeError("orderBy: give at least one column")
        from pyspark.sql import functions as F

        order = [F.col(c) if isinstance(c, str) else c for c in cols]
        bad = [c for c in order if not ops.is_column(c)]
        if bad:
            raise TypeError(f"orderBy: takes column names and Columns, got {bad!r}")
        if ascending is not None:
            many = isinstance(ascending, (list, tuple))
            ups = list(ascending) if many else [ascending] * len(order)
            if len(ups) != len(order):
                raise ValueError(f"orderBy: {len(ups)} ascending values for {len(order)} columns")
            order = [c.asc() if up else c.desc() for c, up in zip(order, ups, strict=True)]
        proto = self._builder.prototype(self._node).alias(self._qualifier)
        self._builder.analyze("orderBy", lambda: proto.orderBy(*order).schema)
        return OrderedTracked(self, tuple(order))

    sort = orderBy

    def limit(self, num: int) -> Tracked:
        """``DataFrame.limit(n)``: n rows of the input minus dead letters (Spark's choice of
        rows, like its own ``limit``), a barrier; after :meth:`orderBy` the first n in that
        order."""
        return self._on(self._builder.limit(self._node, num, (), self._qualifier))

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
        """The plan that ends here, as text: its nodes with their lineage rules, by phase, and
        how each phase runs (an optimistic round, or tracked rounds and why) in the pipeline
        as declared so far; see :meth:`Pipeline.explain` for the whole pipeline.

        >>> # print(words.explain())
        """
        from .context import RunContext
        from .outputs import Aggregate
        from .phases import how_phase_runs

        keep = _ancestors(self._node)
        b = self._builder
        nodes = [n for n in b.nodes if id(n) in keep]
        sources = tuple(s for s in b.sources if id(s) in keep)
        mine = Plan(tuple(nodes), sources)
        if not b.ft:
            return "xorack plan, FT off (plain Spark's plan)\n" + mine.explain()
        ctx = RunContext(b.config, b.plan())
        ctx.partial_phases = {
            a.parents[0].phase
            for a in ctx.plan.barriers()
            if isinstance(a, Aggregate) and a.combining(ctx) is not None
        }
        text = mine.explain(lambda phase: how_phase_runs(ctx, phase))
        return "xorack plan, FT on\n" + text

    # ---- untracked previews ------------------------------------------------------------------

    def _preview(self, what: str) -> Any:
        """This frame as plain Spark computes it from the sources' inputs (FT off: no ids, no
        acker, no replay), after a one-line notice on stderr saying so."""
        import dataclasses

        from .build import RoundBuilder
        from .context import RunContext

        b = self._builder
        if b.streaming(self._node):
            raise ops.TrackedOperationError(
                f"{what}: a tracked stream cannot be previewed; look at its sink's output"
            )
        print(
            f"xorack: {what} is an untracked preview (plain Spark over the inputs: no fault "
            "tolerance, nothing acked); the tracked result is what Pipeline.run() writes",
            file=sys.stderr,
        )
        config = dataclasses.replace(b.config, ft=False, resume=False)
        plan = b.plan()
        ctx = RunContext(config, plan)
        fresh = {s.index: s.df for s in plan.sources if s.derived is None}
        rb = RoundBuilder(ctx, fresh, replays_wanted=False)
        wanted = _ancestors(self._node)
        built: dict[int, Any] = {}
        for node in plan.nodes:
            if id(node) in wanted:
                built[id(node)] = node.tracked(rb, [built.get(id(p)) for p in node.parents])
        return built[id(self._node)]

    def show(self, n: int = 20, truncate: bool | int = True, vertical: bool = False) -> None:
        """``DataFrame.show``, as an untracked preview (plain Spark; a notice says so)."""
        self._preview("show()").show(n, truncate, vertical)

    def count(self) -> int:
        """``DataFrame.count()``, as an untracked preview (plain Spark; a notice says so)."""
        return int(self._preview("count()").count())

    def collect(self) -> list[Any]:
        """``DataFrame.collect()``, as an untracked preview (plain Spark; a notice says so)."""
        return list(self._preview("collect()").collect())

    def take(self, num: int) -> list[Any]:
        """``DataFrame.take(n)``, as an untracked preview (plain Spark; a notice says so)."""
        return list(self._preview("take()").take(num))

    def head(self, n: int | None = None) -> Any:
        """``DataFrame.head(n)``, as an untracked preview (plain Spark; a notice says so)."""
        return self._preview("head()").head(n)

    def first(self) -> Any:
        """``DataFrame.first()``, as an untracked preview (plain Spark; a notice says so)."""
        return self._preview("first()").first()

    def toPandas(self) -> Any:
        """``DataFrame.toPandas()``, as an untracked preview (plain Spark; a notice says so)."""
        return self._preview("toPandas()").toPandas()

    @property
    def isStreaming(self) -> bool:
        """Whether rows of a streaming source reach this frame."""
        return self._builder.streaming(self._node)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._node.columns:  # t.k: the column, as on a DataFrame
            return self[name]
        raise AttributeError(unsupported(name, self.columns))


def _grouping_columns(
    t: Tracked, cols: tuple[Any, ...], windows: list[int]
) -> tuple[Tracked, list]:
    """The frame to group and its grouping keys: a Column that names a column is that name;
    any other expression is added as a column of Spark's name for it (as its output column
    is named by Spark's ``groupBy``), then grouped by name. The time window stays."""
    exprs: dict[str, Any] = {}
    keys: list[Any] = []
    for i, c in enumerate(cols):
        if isinstance(c, str) or i in windows:
            keys.append(c)
            continue
        name = _column_name(t, c)
        if name is not None:
            keys.append(name)
            continue
        got = _expression_name(t, c)
        if got in t.columns or got in exprs:
            raise ops.TrackedOperationError(
                f"groupBy: the expression {c} is named {got!r} like a column it would hide; "
                "alias it to a new name (groupBy(expr.alias('name')))"
            )
        exprs[got] = c
        keys.append(got)
    return (t.withColumns(exprs) if exprs else t), keys


def _expression_name(t: Tracked, c: Any) -> str:
    """The name Spark gives the expression ``c`` on the frame ``t`` (an analysis, no job)."""
    proto = t._builder.prototype(t._node).alias(t._qualifier)
    return str(t._builder.analyze(f"groupBy({c})", lambda: proto.select(c).columns[0]))


def _column_name(t: Tracked, c: Any) -> str | None:
    """The column a Column merely names (``F.col("k")``, ``t.k``, ``t["k"]``), else None."""
    try:
        node = c._jc.node()
        if node.getClass().getSimpleName() != "UnresolvedAttribute":
            return None
        parts = node.nameParts()
        names = [str(parts.apply(i)) for i in range(parts.size())]
    except Exception:  # not a classic Column (Spark Connect): added as an expression
        return None
    if len(names) == 2 and names[0] == t._qualifier and names[1] in t.columns:
        return names[1]
    if len(names) == 1 and names[0] in t.columns:
        return names[0]
    return None


def _ancestors(node: Node) -> set[int]:
    """The nodes ``node`` is computed from (itself included; a barrier's output: the barrier
    and what it reads)."""
    keep: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in keep:
            continue
        keep.add(id(n))
        stack.extend(n.parents)
        if isinstance(n, Source) and n.derived is not None:
            stack.append(n.derived)
    return keep


class TrackedNa:
    """``t.na``: ``fill`` and ``drop``, as :meth:`Tracked.fillna` and :meth:`Tracked.dropna`."""

    def __init__(self, parent: Tracked) -> None:
        self._parent = parent

    def fill(self, value: Any, subset: Any = None) -> Tracked:
        """``DataFrameNaFunctions.fill``."""
        return self._parent.fillna(value, subset)

    def drop(self, how: str = "any", thresh: int | None = None, subset: Any = None) -> Tracked:
        """``DataFrameNaFunctions.drop``."""
        return self._parent.dropna(how, thresh, subset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"Tracked.na.{name} is not supported on a tracked DataFrame: na offers fill and "
            "drop (for replace, use withColumn(c, F.when(...)))"
        )


class OrderedTracked:
    """:meth:`Tracked.orderBy`'s result, for ``limit(n)``: a tracked run writes its rows by
    rounds and partitions, so no sink keeps an order; the first n rows in an order are exact."""

    def __init__(self, parent: Tracked, order: tuple[Any, ...]) -> None:
        self._parent = parent
        self._order = order

    def limit(self, num: int) -> Tracked:
        """The first ``num`` rows in this order (ties broken as Spark breaks them), a barrier:
        staged until every record upstream has settled, then Spark's own top-n, once."""
        p = self._parent
        return p._on(p._builder.limit(p._node, num, self._order, p._qualifier))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"orderBy(...).{name}: a sink of a tracked pipeline does not keep an order (rows "
            "are written by rounds, in partitions); write orderBy(...).limit(n) for a top-n, "
            "or sort when you read the sink's output"
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
        try:
            if self._window is not None:
                node = b.windowed_aggregate(parent._node, self._keys, self._window, exprs)
            else:
                node = b.aggregate(parent._node, self._keys, tuple(exprs))
        except ops.TrackedOperationError:
            if not self._through_qualifier(exprs):
                raise  # a mistake of another kind: Spark's message says it
            raise ops.TrackedOperationError(
                f"agg: {', '.join(map(str, exprs))} reaches columns through the frame "
                f"({parent._qualifier}.c, as t.c or t['c'] write them); inside an aggregate "
                "name them: F.sum('price'), F.col('price')"
            ) from None
        return parent._on(node)

    def _through_qualifier(self, exprs: tuple[Any, ...]) -> bool:
        """Whether ``exprs`` resolve only through the frame's qualifier (``t.price``): not
        over the bare columns, and over them under the qualifier (any other error keeps its
        own message)."""
        from .schema import empty_frame

        parent = self._parent
        bare = empty_frame(parent._builder.spark, parent._node.schema)
        keys = [k for k in self._keys if isinstance(k, str)]

        def resolves(df: Any) -> bool:
            try:
                df.groupBy(*keys).agg(*exprs).schema  # noqa: B018 - an analysis, no job
            except Exception:
                return False
            return True

        return not resolves(bare) and resolves(bare.alias(parent._qualifier))

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


__all__ = ["GroupedTracked", "OrderedTracked", "Tracked", "TrackedNa"]
