"""A PySpark pipeline whose every source record is tracked by the XOR acker.

Declare sources, stages and sinks on a :class:`Pipeline`; :meth:`Pipeline.run` builds the Spark
plan and runs it in *rounds*:

1. run the whole pipeline once (one Spark action; every tracked DataFrame evaluated once);
2. ``expire_all()``: after the job, nothing still pending can complete: it timed out;
3. take the replays (explicit failures + timeouts) of every source, place each on the partition
   its replay partitioner chose, and run them again from the source's successor stage;
4. repeat until every source record is completed or dead-lettered (bounded by ``max_attempts``).

With ``ft=False`` the same Spark plan is built without tagging, service or extra columns.

>>> from xorack.spark import Pipeline, SQLiteSink               # doctest: +SKIP
>>> p = Pipeline(spark)                                          # doctest: +SKIP
>>> words = (p.source(df, name="lines")                          # doctest: +SKIP
...           .map_in_pandas(split, "word string", name="split"))
>>> words.sink(SQLiteSink("/tmp/words.db", "words"))            # doctest: +SKIP
>>> report = p.run(); report.lost                                # doctest: +SKIP
0
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .._checks import sorted_distinct
from ..errors import ServiceError
from ..protocol import CHUNK_BITS, ORIGIN_PARTITION
from . import ops, optimistic
from .arrow_stage import ArrowFunction, ArrowStageRunner, declared_arrow_schema
from .barrier import (
    CHUNK,
    AggregateSpec,
    JoinSpec,
    PartialStaging,
    Staging,
    combining_plan,
    ids_frame,
    send_staged_events,
)
from .guard import FailureTally, RunawayFailure, tally_param
from .lineage import EV, EVENT, KEEP, LINEAGE, q
from .schema import empty_frame, num_partitions
from .sinks import NativeSink, Sink
from .stages import (
    BRANCH,
    GROUP_XOR,
    PART,
    REC,
    ROUND_PROPERTY,
    SRC,
    SUMMARY_SCHEMA,
    DerivedTagger,
    GroupStageRunner,
    SinkRunner,
    SourceTagger,
    StageRunner,
    StageSchemaError,
    Tee,
    UserFunction,
    as_function,
    check_columns,
    i64,
    u64,
)

REPORT_KEYS = (
    "source_records",
    "completed",
    "failed",
    "timed_out",
    "replayed",
    "dead_lettered",
    "lost",
    "duplicates_absorbed",
    "results_match",
    "wall_seconds",
)


#: Rows per partition of a barrier output that an optimistic round counted (a small output goes
#: on in fewer partitions than ``spark.sql.shuffle.partitions``: one task per partition costs a
#: Python worker's round trip per stage and sink).
ROWS_PER_PARTITION = 1 << 16

# the acker's counts: None in the report of a run with FT off
TRACKING_COUNTS = (
    *REPORT_KEYS[: REPORT_KEYS.index("lost") + 1],
    "orphans",
    "collateral_replays",
    "repeats",
)


@dataclass
class RunReport:
    """The account of a run: every source record ends completed or dead-lettered (``lost == 0``).

    ``results_match`` is filled by callers that compare the output with a reference (the demo);
    with FT off the tracking counts are ``None``.

    >>> RunReport(source_records=3, completed=3).as_dict()["lost"]
    0
    """

    source_records: int | None = 0
    completed: int | None = 0
    failed: int | None = 0
    timed_out: int | None = 0
    replayed: int | None = 0
    dead_lettered: int | None = 0
    lost: int | None = 0
    duplicates_absorbed: int = 0
    results_match: bool | None = None
    wall_seconds: float = 0.0
    rounds: int = 0
    ft: bool = True
    sink_rows: dict[str, int] = field(default_factory=dict)  # rows each sink holds at the end
    sink_duplicates: dict[str, int] = field(default_factory=dict)  # rows absorbed as duplicates
    orphans: int | None = 0
    # replays of records whose chunk-mate failed in a combined aggregation's first round (no
    # attempt used up; counted in ``replayed`` too)
    collateral_replays: int | None = 0
    # rows a retried source task persisted again under the ids its failed attempt used: the
    # acker kept one record each (counted once in source_records)
    repeats: int | None = 0
    derived_records: int = 0  # rows of barriers (aggregates, tracked joins) tracked as records
    derived_dead_lettered: int = 0  # of those, dead-lettered (a failure after the barrier)
    retracted_rows: int = 0  # rows of attempts that did not complete, removed from sinks
    # live rows an untracked transform removed, by transform: their records timed out (use
    # filter/where to drop rows on purpose: those are acked)
    vanished_rows: dict[str, int] = field(default_factory=dict)
    # the run continued a job an earlier driver left unfinished (Pipeline(resume=True)): the
    # record counts are the whole job's; failed/timed_out/replayed/orphans this run's
    resumed: bool = False
    # phases completed by an optimistic round (acked as one tree: nothing persisted), why
    # the optimistic rounds that fell back to tracked rounds did, and why a phase did not try
    # one (Pipeline(optimistic=); with optimistic=False, this stays empty)
    optimistic_rounds: int = 0
    optimistic_fallbacks: list[str] = field(default_factory=list)
    tracked_phases: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report as a dict whose first keys are :data:`REPORT_KEYS`, in that order."""
        d = dataclasses.asdict(self)
        rest = {k: v for k, v in d.items() if k not in REPORT_KEYS}
        return {**{k: d[k] for k in REPORT_KEYS}, **rest}


class _NotOptimistic(Exception):
    """A phase's optimistic round cannot be built (the message says why): it runs tracked."""


@dataclass(frozen=True)
class RoundInfo:
    """What the run loop tells ``on_round`` after each round."""

    round: int
    replays: int
    stats: dict[str, Any]


# --------------------------------------------------------------------------------------------
# the declared graph


@dataclass(eq=False)
class _Node:
    # "source" | "native" | "stage" | "arrow" | "group" | "transform" | "union" | "barrier"
    # | "sink"
    kind: str
    name: str
    parents: list[_Node]
    columns: tuple[str, ...]  # payload columns (without lineage)
    schema: Any = None  # payload StructType (stages, sources)
    fn: Any = None
    sink: Any = None
    source_index: int = -1
    df: Any = None  # source input DataFrame
    keys: tuple[str, ...] = ()
    fixed_partitions: int = 0  # 0: a source without keys keeps its input's partitioning
    # a barrier output's partitions in this run, chosen from its size when an optimistic round
    # counted it (0: fixed_partitions)
    run_partitions: int = 0
    repartition: bool = False  # the source repartitions its input (by keys, or round-robin)
    phase: int = 0  # barriers split a run into phases; a barrier's output opens a later one
    spec: Any = None  # a barrier's operator (AggregateSpec, JoinSpec)
    derived: _Node | None = None  # a source that is a barrier's output: the barrier
    staging: list[Staging] = field(default_factory=list)  # a barrier's / native sink's inputs
    proto: Any = None  # a frame of the node's output (declaration-time analysis)
    analyzed_from: tuple[Any, ...] = ()  # the input frames ``proto`` was built on
    # an optimistic round's output: a barrier's rows, or a native sink's, ready to publish
    fast_out: str | None = None
    fast_rows: int | None = None  # the rows of a native sink's fast_out
    # a barrier whose output an optimistic round wrote into the Python sink that reads it
    # (its phase has nothing left to run)
    written: bool = False

    @property
    def partitions(self) -> int:
        """The source's partition count: its own, or its input's (asked of Spark once, when
        first needed: with FT off nothing needs it)."""
        if self.run_partitions:
            return self.run_partitions
        if not self.fixed_partitions:
            self.fixed_partitions = num_partitions(self.df)
        return self.fixed_partitions

    def prepare(self, df: Any) -> Any:
        """The source's own partitioning applied to an input DataFrame (or micro-batch)."""
        if self.keys:
            from pyspark.sql import functions as F

            return df.repartition(self.partitions, *[F.col(q(k)) for k in self.keys])
        if self.repartition:
            return df.repartition(self.partitions)
        return df


@dataclass
class _FastOutput:
    """One write of an optimistic round: a native sink's rows, a barrier's output, or both (a
    barrier read only by one native sink, or an aggregate read only by one Python sink: then
    ``src`` is the round's attempt id in that sink and ``frame`` its writers' summaries);
    ``rows`` counts a sink's rows as they are written."""

    name: str  # where the rows leave the phase (a sink's or a barrier's name)
    sink: _Node | None
    barrier: _Node | None
    path: str
    frame: Any
    events: Any  # the observation of the XOR of the events the rows owe
    rows: Any = None
    src: int = 0
    summary: list[Any] = field(default_factory=list)  # a Python sink's, once written


@dataclass
class _OptimisticRound:
    """An optimistic round of a phase: its accumulator (XOR of the Python stages' events,
    failed rows), job group and abort file; its writes; its sources' births observations and
    the records they counted."""

    accumulator: Any
    group: str
    abort: str | None
    jobs: list[_FastOutput] = field(default_factory=list)
    births: list[tuple[_Node, Any]] = field(default_factory=list)
    # sources whose rows a Python stage tags, and the accumulator counting them
    stage_births: list[tuple[_Node, Any]] = field(default_factory=list)
    records: list[tuple[_Node, int]] = field(default_factory=list)


class _Observations:
    """Several observations read as one: the XOR of their ``x`` (None if one is missing)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    @property
    def get(self) -> dict[str, int]:
        x = 0
        for part in self.parts:
            got = optimistic.observed(part)
            if got is None:
                raise LookupError("an observation is missing")
            x ^= got.get("x", 0)
        return {"x": x}


@dataclass
class _Round:
    """The Spark work of one round: the summary frames of the Python sinks (one action), the
    frames to stage (barrier inputs, native sinks), and with FT off the barriers' outputs and
    the native sinks' writes."""

    summaries: list[Any] = field(default_factory=list)
    staged: list[tuple[Staging, Any]] = field(default_factory=list)
    plain_barriers: dict[int, Any] = field(default_factory=dict)
    plain_writes: list[tuple[_Node, Any]] = field(default_factory=list)
    replays: int = 0
    observed: list[tuple[str, Any, Any]] = field(default_factory=list)  # transform, in, out

    def empty(self) -> bool:
        return not (self.summaries or self.staged or self.plain_writes)


def _create_sink(node: _Node) -> None:
    """Create a Python-written sink, with the payload schema when it takes one (the SQLite
    sink stores Spark's types by it)."""
    import inspect

    try:
        takes_schema = "schema" in inspect.signature(node.sink.create).parameters
    except (TypeError, ValueError):
        takes_schema = False
    if takes_schema:
        node.sink.create(list(node.columns), schema=node.schema)
    else:
        node.sink.create(list(node.columns))


def _with_pending(df: Any) -> Any:
    """A frame that came out of Python (settled) with the pending-event columns added."""
    from pyspark.sql import functions as F

    return df.withColumns({EV: F.lit(0).cast("long"), KEEP: F.lit(True)})


class Tracked:
    """A DataFrame of a :class:`Pipeline`, declared lazily and built afresh for each round.

    >>> # p.source(df).map_in_pandas(fn, "word string").sink(SQLiteSink(path, "w"))
    """

    def __init__(self, pipeline: Pipeline, node: _Node) -> None:
        self._p = pipeline
        self._node = node

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
        return self._p._native(self._node, "filter", lambda name: ops.Filter(condition))

    where = filter

    def select(self, *cols: Any) -> Tracked:
        """``DataFrame.select``; at most one generator (``F.explode``, ``F.explode_outer``,
        ``F.posexplode``, ``F.posexplode_outer``, ``F.inline``, ``F.inline_outer``): each
        generated row is a child record with its own id, a row generating nothing is acked.

        >>> # words = lines.select(F.explode(F.split("line", " ")).alias("word"))
        """
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        return self._p._native(self._node, "select", lambda name: ops.Select(tuple(cols), name))

    def withColumn(self, colName: str, col: Any) -> Tracked:
        """``DataFrame.withColumn``; ``col`` may be a generator (as in :meth:`select`)."""
        return self.withColumns({colName: col})

    def withColumns(self, *colsMap: dict[str, Any]) -> Tracked:
        """``DataFrame.withColumns({name: Column})``."""
        if len(colsMap) != 1:
            raise TypeError("withColumns: expected one dict {name: Column}")
        mapping = ops.mapping_arg(colsMap[0])
        return self._p._native(
            self._node, "withColumns", lambda name: ops.WithColumns(mapping, name)
        )

    def withColumnRenamed(self, existing: str, new: str) -> Tracked:
        """``DataFrame.withColumnRenamed``."""
        return self._p._native(
            self._node, "withColumnRenamed", lambda name: ops.Renamed(existing, new)
        )

    def drop(self, *cols: str) -> Tracked:
        """``DataFrame.drop`` (column names)."""
        return self._p._native(self._node, "drop", lambda name: ops.Drop(tuple(cols)))

    def join(self, other: Any, on: Any = None, how: str = "inner") -> Tracked:
        """``DataFrame.join`` on column names (an equi-join).

        * ``other`` an untracked DataFrame (a lookup or dimension table, broadcast or not),
          ``how`` in inner, left, left_semi, left_anti: runs in the JVM; each match is a child
          record; a row without a match under inner/left_semi (or with one under left_anti) is
          acked as dropped.
        * ``other`` a :class:`Tracked` of the same pipeline, ``how`` in inner, left: a barrier.
          The rows of both sides are staged until every record upstream is completed or
          dead-lettered, then joined once, so a record replayed on one side meets every row of
          the other side that went through before it, and a dead-lettered record joins
          nothing. The joined rows are the source records of the next phase.

        >>> # rated = words.join(F.broadcast(sentiment), "word", "left")
        """
        how = ops.join_type(how)
        if isinstance(other, Tracked):
            return self._p._tracked_join(self, other, on, how)
        if not hasattr(other, "columns") or not hasattr(other, "join"):
            raise TypeError(f"join: expected a DataFrame or a Tracked, got {type(other)}")
        keys = tuple(ops.join_keys(on, self.columns, list(other.columns)))
        return self._p._native(
            self._node, "join", lambda name: ops.LookupJoin(other, keys, how, name)
        )

    def groupBy(self, *cols: str) -> GroupedTracked:
        """``DataFrame.groupBy(*cols)`` (column names); then ``.agg(*exprs)`` or ``.count()``.

        >>> # counts = words.groupBy("word").agg(F.count("*").alias("n"))
        """
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        bad = [c for c in cols if not isinstance(c, str)]
        if bad or not cols:
            raise TypeError(f"groupBy: takes column names on a tracked DataFrame, got {cols!r}")
        check_columns("groupBy", self.columns, cols, "groupBy")
        return GroupedTracked(self, tuple(cols))

    groupby = groupBy

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
        if not callable(fn):
            raise TypeError(f"map_in_pandas: fn must be callable, got {type(fn).__name__}")
        st = self._p._struct(schema)
        name = self._p._unique(name, getattr(fn, "__name__", "stage"))
        node = _Node("stage", name, [self._node], tuple(st.fieldNames()), schema=st, fn=fn)
        return self._p._add(node)

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
        if not callable(fn):
            raise TypeError(f"map_in_arrow: fn must be callable, got {type(fn).__name__}")
        st = self._p._struct(schema)
        name = self._p._unique(name, getattr(fn, "__name__", "stage"))
        node = _Node("arrow", name, [self._node], tuple(st.fieldNames()), schema=st, fn=fn)
        return self._p._add(node)

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
        if not callable(fn):
            raise TypeError(f"apply_in_pandas: fn must be callable, got {type(fn).__name__}")
        keys = tuple(keys)
        check_columns("apply_in_pandas", self._node.columns, keys, "apply_in_pandas")
        st = self._p._struct(schema)
        name = self._p._unique(name, getattr(fn, "__name__", "grouped"))
        node = _Node("group", name, [self._node], tuple(st.fieldNames()), schema=st, fn=fn)
        node.keys = keys
        return self._p._add(node)

    def transform(self, fn: Callable[[Any], Any], name: str | None = None) -> Tracked:
        """An untracked Spark operation that keeps the columns (``repartition``, ``where``,
        ``sortWithinPartitions`` …): ``fn(DataFrame) -> DataFrame``. It is applied when each
        round is built; :attr:`Pipeline.round` says which. Rows it removes are *lost* to the
        acker: they time out and their source records are replayed.
        """
        name = self._p._unique(name, "transform")
        node = _Node(
            "transform", name, [self._node], self._node.columns, schema=self._node.schema, fn=fn
        )
        return self._p._add(node)

    def repartition(self, n: int, *cols: str) -> Tracked:
        """``DataFrame.repartition(n, *cols)`` (hash partitioning by ``cols``)."""
        check_columns("repartition", self._node.columns, cols, "repartition")
        return self.transform(lambda df: df.repartition(n, *cols), name="repartition")

    def union(self, other: Tracked) -> Tracked:
        """Merge two tracked DataFrames with the same payload columns (by name)."""
        if not isinstance(other, Tracked) or other._p is not self._p:
            raise StageSchemaError(
                "union: the other side must be a tracked DataFrame of the same Pipeline"
            )
        if other._node is self._node:
            raise StageSchemaError(
                "union: a tracked DataFrame cannot be unioned with itself (each row would be "
                "emitted twice under one lineage); map it twice into two stages instead"
            )
        if list(other._node.columns) != list(self._node.columns):
            raise StageSchemaError(
                f"union: payload columns differ: {list(self._node.columns)} vs "
                f"{list(other._node.columns)}"
            )
        parents = [self._node, other._node]
        node = _Node(
            "union",
            self._p._unique(None, "union"),
            parents,
            self._node.columns,
            schema=self._node.schema,
        )
        return self._p._add(node)

    def sink(self, sink: Sink | NativeSink, name: str | None = None) -> None:
        """End the branch in ``sink``: rows are written inside the executor tasks and acked once
        the write is durable."""
        native = getattr(sink, "native", False)
        if not (
            hasattr(sink, "create")
            and (hasattr(sink, "write") if native else hasattr(sink, "open_writer"))
        ):
            raise TypeError(
                f"sink: expected a xorack.spark.Sink (create, open_writer) or a native sink "
                f"such as ParquetSink, got {type(sink)}"
            )
        if hasattr(sink, "open_writer") and type(sink).__name__ == "SQLiteSink":
            from .sink_types import check_sink_schema

            check_sink_schema(self._node.schema)  # an unsupported type fails here, not per row
        name = self._p._unique(name, "sink")
        node = _Node(
            "sink", name, [self._node], self._node.columns, schema=self._node.schema, sink=sink
        )
        self._p._add(node)


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

    def __init__(self, parent: Tracked, keys: tuple[str, ...]) -> None:
        self._parent = parent
        self._keys = keys

    def agg(self, *exprs: Any) -> Tracked:
        """``GroupedData.agg(*exprs)`` with aggregate Columns (``F.sum("x").alias("total")``)."""
        if len(exprs) == 1 and isinstance(exprs[0], dict):
            raise TypeError(
                "agg: give Columns (F.sum('x').alias('total')); the dict form is not supported "
                "on a tracked DataFrame"
            )
        if not exprs:
            raise TypeError("agg: give at least one aggregate Column")
        spec = AggregateSpec(self._keys, tuple(exprs))
        p = self._parent._p
        return p._barrier([self._parent._node], spec, "aggregate", keys=self._keys)

    def count(self) -> Tracked:
        """``GroupedData.count()``: a ``count`` column per group."""
        from pyspark.sql import functions as F

        return self.agg(F.count("*").alias("count"))


def _check_resumable(ft: bool, storage: Any, service: Any, ackers: int, workdir: Any) -> None:
    """``resume=True`` needs what outlives the driver: a SQLite storage and a work directory,
    in an acker the driver embeds (one: a batch persisted across shards is not atomic)."""
    from ..storage import SQLiteStorage, storage_path

    why = None
    if not ft:
        why = "with ft=False nothing is tracked"
    elif service is not None:
        why = "it needs the embedded acker (service=None): a standalone one keeps its own storage"
    elif ackers != 1:
        why = "a sharded acker does not persist a batch atomically: use ackers=1"
    elif not (
        isinstance(storage, SQLiteStorage)
        or (isinstance(storage, (str, os.PathLike)) and storage_path(storage) is not None)
    ):
        why = f"storage {storage!r} does not outlive the driver: give storage='sqlite:///path'"
    elif workdir is None:
        why = "give workdir= (staged rows of barriers and native sinks must outlive the driver)"
    if why is not None:
        raise ValueError(f"resume=True: {why}")


class Pipeline:
    """Sources, tracked stages and sinks, run with record-level guaranteed processing.

    ``ft=False`` builds the same Spark plan without tagging, service or extra columns.
    ``storage`` ("memory" or "sqlite:///path") and ``max_attempts`` configure the embedded FT
    layer; ``service`` is the location of a running ``xorack serve`` instead (then its own
    storage and attempts apply). ``deterministic_ids`` derives every id from its parent, so
    a replayed source record re-creates the same output ids (exactly-once results with an
    idempotent sink); ``id_salt`` makes the ids of two runs over the same input differ (by
    default a re-run into the same idempotent sink is absorbed as duplicates). ``token``:
    the service's shared token. On a cluster the executors must reach the embedded acker:
    ``acker_host`` is the address it binds (default 127.0.0.1; a non-loopback one needs
    ``token`` and TLS), ``acker_advertise`` the host name executors connect to (default
    ``acker_host``), ``tls_cert``/``tls_key`` its PEM certificate and key (the executors trust
    that certificate; with ``service=...`` ``tls_cert`` alone is the certificate to trust).
    ``job``: the run's namespace on the acker (default: a fresh one per run, so runs sharing a
    standalone acker never see each other's records). ``workdir``: where barriers stage their
    rows (a temporary directory by default; on a cluster a path every executor can write).
    ``runaway_share``: the share of a stage's records one error must fail on two attempts in a
    row to stop the run (None: never). ``combine``: an aggregation whose functions combine
    (count, sum, min, max, avg) stages per-chunk partial aggregates instead of rows, as Spark's
    map-side combine does (see :mod:`xorack.spark.barrier`); ``False`` stages every row (no
    collateral replays of the chunk-mates of a record that fails in the first round).
    ``chunk_records`` (a power of two up to 1024): the source records per chunk — fewer
    replay fewer chunk-mates when first-round failures are frequent, but combine less.
    ``ackers``: acker processes of the embedded acker (default 1: a thread of the driver);
    N > 1 starts N shard processes (:mod:`xorack.shards`), each owning the chunks of source
    ids that hash to it, with its own storage (a SQLite file per shard, ``NAME.shard0ofN.db``),
    stopped with the run.

    ``optimistic`` (default True): each phase first runs as plain Spark would, acked as one
    XOR tree (:mod:`xorack.spark.optimistic`): when nothing failed, the phase is done at about
    plain Spark's cost, with nothing persisted; when something failed (a row, a lost row, a
    Spark task), its outputs are discarded and the phase runs in tracked rounds from its
    sources. A phase with a sink written from Python, an ``apply_in_pandas`` stage or a branch
    point, and streaming and resumable jobs, always run tracked rounds. Turn it off for a job
    whose first rounds are known to fail some records (the optimistic round would only cost).

    ``resume=True`` makes the job resumable after a driver crash (README: "Resuming after a
    driver crash"): its state lives in ``storage`` (a SQLite file) and ``workdir`` (staged barrier
    rows), and a later ``run()`` of the same pipeline with the same two continues where the
    crashed one stopped — rows persisted before are not read again, records the crash left
    pending are replayed, sinks end exactly-once. A job that finished answers its report
    again; start a new job with a new storage and workdir. Needs the embedded acker with
    ``ackers=1``.

    >>> # p = Pipeline(spark, ft=True, storage="memory", max_attempts=5)
    """

    def __init__(
        self,
        spark: Any,
        ft: bool = True,
        storage: str = "memory",
        max_attempts: int = 5,
        deterministic_ids: bool = True,
        service: str | None = None,
        token: str | None = None,
        id_salt: int = 0,
        workdir: str | None = None,
        runaway_share: float | None = 0.5,
        job: str | None = None,
        acker_host: str = "127.0.0.1",
        acker_advertise: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        combine: bool = True,
        chunk_records: int = 1 << CHUNK_BITS,
        ackers: int = 1,
        resume: bool = False,
        optimistic: bool = True,
    ) -> None:
        from pyspark.sql.types import StructType  # noqa: F401 - fail early without pyspark

        from ..sharding import MAX_SHARDS

        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if isinstance(ackers, bool) or not isinstance(ackers, int) or not 1 <= ackers <= MAX_SHARDS:
            raise ValueError(f"ackers must be an int in [1, {MAX_SHARDS}], got {ackers!r}")
        if ackers > 1 and service is not None:
            raise ValueError(
                "ackers=N starts an embedded sharded acker; with service=... the standalone "
                "acker's own shards apply (xorack serve --shards N): give one or the other"
            )
        if ackers > 1 and not isinstance(storage, (str, os.PathLike)):
            raise ValueError(
                "ackers=N runs N acker processes, each opening its own storage: give a storage "
                f"spec ('memory' or a SQLite path), not a {type(storage).__name__} object"
            )
        if resume:
            _check_resumable(ft, storage, service, ackers, workdir)
        self.resume = bool(resume)
        self._resume_skip: dict[int, dict[int, int]] = {}  # source -> partition -> rows
        self._run_tag = ""  # staging tags of a resumable run: unique per run
        self.ackers = ackers
        self.spark = spark
        self.ft = bool(ft)
        self.storage = storage
        self.max_attempts = int(max_attempts)
        self.deterministic_ids = bool(deterministic_ids)
        self.service_location = service
        self.token = token
        self.id_salt = int(id_salt)
        self.workdir = workdir  # where barriers stage their rows (a temporary directory if None)
        if job is not None:
            from ..service import check_job

            job = check_job(job)
        self.job = job  # the run's namespace on the acker (a fresh one per run when None)
        self._job: str | None = None
        FailureTally(runaway_share)  # checks the value now
        self.runaway_share = runaway_share
        self._tally: Any = None  # the running round's failure accumulator
        self.acker_host = acker_host
        self.acker_advertise = acker_advertise
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self._tls_root_certs: bytes | None = None
        self.combine = bool(combine)
        if (
            isinstance(chunk_records, bool)
            or not isinstance(chunk_records, int)
            or not 1 <= chunk_records <= 1 << CHUNK_BITS
            or chunk_records & (chunk_records - 1)
        ):
            raise ValueError(
                f"chunk_records must be a power of two from 1 to {1 << CHUNK_BITS}, got "
                f"{chunk_records!r}"
            )
        self.chunk_records = chunk_records
        self.optimistic = bool(optimistic)
        self._workdir: str | None = None  # the running run's staging directory (FT on)
        self._fast_records = 0  # records of input sources completed by optimistic rounds
        self._fast_derived = 0  # records of barrier outputs completed by optimistic rounds
        # attempt ids of optimistic rounds that fell back after writing Python sinks (their
        # rows are retracted with the ended attempts')
        self._lost_round_srcs: list[int] = []
        self._fast_group: str | None = None  # the Spark job group of a running optimistic round
        self._chunk_bits = 0  # the running round's source ids are drawn in chunks of 2**bits
        self._partial_phases: set[int] = set()  # phases that stage partial aggregates
        self.round = 0
        self.phase = 0
        self._nodes: list[_Node] = []
        self._names: set[str] = set()
        self._sources: list[_Node] = []
        self._service: Any = None
        self._shards: Any = None  # the ShardedAcker when ackers > 1
        self._ft_layer: Any = None
        self._location: str | None = None
        # streaming: told the replay tables each round takes (for current_attempt(pdf))
        self._on_replays: Callable[[list[pa.Table]], None] | None = None

    # ---- declaration --------------------------------------------------------------------------

    def _struct(self, schema: Any) -> Any:
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

    def _unique(self, name: str | None, default: str) -> str:
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

    def _add(self, node: _Node) -> Tracked:
        if node.kind not in ("source", "barrier") and node.parents:
            node.phase = max(p.phase for p in node.parents)
        self._nodes.append(node)
        return Tracked(self, node)

    def _prototype(self, node: _Node) -> Any:
        """The frame a declaration on ``node``'s output is analyzed against: an empty DataFrame
        of ``node``'s payload (nothing runs; with FT on the operations check their tracked
        translation and analyze the plain one, see :mod:`xorack.spark.ops`). With FT off, a
        source that keeps its input's partitioning offers the input itself, so that the frames
        its native operations analyze are the ones the run executes (see :meth:`_reuse`)."""
        if node.proto is None:  # a native node keeps the frame its declaration analyzed
            real = node.df if not self.ft and node.kind == "source" else None
            if real is not None and not node.repartition and not real.isStreaming:
                node.proto = real
                return node.proto
            node.proto = empty_frame(self.spark, node.schema)
        return node.proto

    @staticmethod
    def _reuse(node: _Node, inputs: list[Any]) -> Any:
        """The frame ``node``'s declaration analyzed, if the run feeds it the very frames that
        analysis was given (FT off: DataFrames are immutable, so applying the operation again
        would build the same plan; the declaration's analysis is not paid twice); else None."""
        given = node.analyzed_from
        if not given or len(given) != len(inputs):
            return None
        same = all(a is b for a, b in zip(given, inputs, strict=True))
        return node.proto if same else None

    def _analyze(self, what: str, build: Callable[[], Any]) -> Any:
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

    def _payload_schema(self, df: Any) -> Any:
        from pyspark.sql.types import StructType

        return StructType([f for f in df.schema.fields if f.name not in LINEAGE])

    def _native(self, parent: _Node, kind: str, make: Callable[[str], Any]) -> Tracked:
        """A native operation node: ``make(name)`` builds the operator; its output schema comes
        from applying it to the parent's empty prototype."""
        name = self._unique(None, kind)
        op = make(name)
        given = self._prototype(parent)
        out = self._analyze(
            op.describe(), lambda: op.declare(given) if self.ft else op.apply(given, False)
        )
        schema = self._payload_schema(out)
        node = _Node("native", name, [parent], tuple(schema.fieldNames()), schema=schema, fn=op)
        node.proto, node.analyzed_from = out, (given,)
        return self._add(node)

    def _barrier(
        self, parents: list[_Node], spec: Any, kind: str, keys: tuple[str, ...]
    ) -> Tracked:
        """A barrier node over ``parents`` and the source node of its output (the next phase)."""
        if self.ft:  # the barrier reads the staged payload rows
            protos = [empty_frame(self.spark, p.schema) for p in parents]
        else:  # it reads its parents' frames as they are
            protos = [self._prototype(p) for p in parents]
        out = self._analyze(spec.describe(), lambda: spec.compute(protos))
        schema = out.schema
        name = self._unique(None, kind)
        cols = tuple(schema.fieldNames())
        ops.check_output_names(spec.describe(), list(cols))
        phase = max(p.phase for p in parents) + 1
        barrier = _Node("barrier", name, list(parents), cols, schema=schema, spec=spec, phase=phase)
        if not self.ft:  # its output goes on unchanged (see _source_input): one frame for both
            barrier.proto, barrier.analyzed_from = out, tuple(protos)
        self._nodes.append(barrier)
        n = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        source = _Node(
            "source",
            name,
            [],
            cols,
            schema=schema,
            keys=tuple(keys),
            fixed_partitions=n,
            source_index=len(self._sources),
            repartition=True,
            phase=phase,
            derived=barrier,
        )
        if not self.ft:
            source.proto = out
        self._sources.append(source)
        return self._add(source)

    def _tracked_join(self, left: Tracked, right: Tracked, on: Any, how: str) -> Tracked:
        if right._p is not self:
            raise StageSchemaError(
                "join: the other side must be a tracked DataFrame of this Pipeline"
            )
        if right._node is left._node:
            raise StageSchemaError(
                "join: a tracked DataFrame cannot be joined with itself; map it into two stages "
                "first"
            )
        if how not in ("inner", "left"):
            raise ops.TrackedOperationError(
                f"join: how={how!r} between two tracked DataFrames is not supported; use inner "
                "or left (or join an untracked DataFrame for semi/anti joins)"
            )
        keys = tuple(ops.join_keys(on, left.columns, right.columns))
        clash = sorted((set(left.columns) & set(right.columns)) - set(keys))
        if clash:
            raise ops.TrackedOperationError(
                f"join: columns {clash} are on both sides (the output would have two columns of "
                "each name); rename them on one side first"
            )
        return self._barrier([left._node, right._node], JoinSpec(keys, how), "join", keys=keys)

    def source(
        self,
        df: Any,
        name: str | None = None,
        keys: list[str] | tuple[str, ...] = (),
        partitions: int | None = None,
    ) -> Tracked:
        """A tracked source over ``df``.

        With ``keys`` the source is hash-partitioned by them (``df.repartition(partitions,
        *keys)``, exactly as Spark does it) and replays go to the partition Spark assigns to the
        same key; without keys, replays go back to the partition the record was first read on.

        >>> # lines = p.source(spark.read.text(path), name="lines")
        """
        keys = tuple(keys)
        cols = tuple(df.columns)
        bad = [c for c in cols if c.startswith("_ft_")]
        if bad:
            raise StageSchemaError(f"source {name!r}: column names {bad} are reserved by xorack")
        check_columns(name or "source", cols, keys, "source")
        if keys or partitions or df.isStreaming:
            n = int(partitions or self.spark.conf.get("spark.sql.shuffle.partitions"))
        else:
            n = 0  # the input's own partitioning, counted when a replay needs it
        node = _Node(
            "source",
            self._unique(name, "source"),
            [],
            cols,
            schema=df.schema,
            df=df,
            keys=keys,
            fixed_partitions=n,
            source_index=len(self._sources),
            repartition=bool(keys or partitions or df.isStreaming),
        )
        self._sources.append(node)
        return self._add(node)

    # ---- service ------------------------------------------------------------------------------

    def replay_partitioner_spec(self, source: int) -> str:
        """The replay partitioning of a source: ``hash:n`` with keys, ``forward`` without."""
        node = self._sources[source]
        return f"hash:{node.partitions}" if node.keys else "forward"

    def _start_service(self) -> str:
        from ..service import AckerService

        # each run is a job of its own on the acker: its sources, rounds, replays, dead letters
        # and stats are kept apart from any other pipeline's on a shared `xorack serve`
        self._job = self.job or f"run-{os.urandom(8).hex()}"

        if self.service_location is not None:
            if self.tls_cert is not None:
                with open(self.tls_cert, "rb") as f:
                    self._tls_root_certs = f.read()
            try:
                client = self._client_for(self.service_location)
                client.ping()
                if hasattr(client, "check_shards"):  # a sharded location: in shard order?
                    client.check_shards()
            except ServiceError as exc:
                raise ServiceError(
                    f"pipeline: the acker service at {self.service_location} cannot be reached "
                    f"({exc}); start it with `xorack serve` or use the embedded one (service=None)"
                ) from None
            return self.service_location
        import xorack

        parts = {i: self.replay_partitioner_spec(i) for i in range(len(self._sources))}
        if self.ackers > 1:
            return self._start_shards(parts)
        self._ft_layer = xorack.FTLayer(
            storage=self.storage, max_attempts=self.max_attempts, replay_partitioners=parts
        )
        self._service = AckerService.embedded(
            self._ft_layer,
            token=self.token,
            job=self._job,
            host=self.acker_host,
            advertise=self.acker_advertise,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
        )
        self._tls_root_certs = self._service.tls_cert_pem
        return self._service.location

    def _start_shards(self, parts: dict[int, str]) -> str:
        """The embedded sharded acker: ``ackers`` processes serving this run's job."""
        from ..shards import ShardedAcker

        args = ["--max-attempts", str(self.max_attempts), "--rotate-interval", "0"]
        for i, spec in parts.items():
            args += ["--replay-partitioner", f"{i}={spec}"]
        self._shards = ShardedAcker(
            self.ackers,
            storage=self.storage,
            job=self._job,
            host=self.acker_host,
            advertise=self.acker_advertise,
            token=self.token,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            serve_args=args,
        )
        if self.tls_cert is not None:
            with open(self.tls_cert, "rb") as f:
                self._tls_root_certs = f.read()
        return self._shards.location

    def _stop_service(self) -> None:
        if self._shards is not None:
            shards, self._shards = self._shards, None
            try:  # the driver's client: its fan-out threads and connections end with the shards
                self._client_for(shards.location).close()
            finally:
                shards.close()
        if self._service is not None:
            self._service.shutdown()
            self._service = None
        if self._ft_layer is not None:
            self._ft_layer.close()
            self._ft_layer = None

    @property
    def client(self) -> Any:
        """The driver's client of the acker service (during :meth:`run`)."""
        if self._location is None:
            raise RuntimeError("the pipeline's service runs only during run()")
        return self._client_for(self._location)

    def _client_for(self, location: str) -> Any:
        """A client of the acker at ``location`` with this pipeline's token and TLS roots."""
        from ..service import AckerClient

        return AckerClient.get(
            location, token=self.token, job=self._job, tls_root_certs=self._tls_root_certs
        )

    # ---- building one round -------------------------------------------------------------------

    def _tagged_schema(self, node: _Node, without_src: bool = False) -> Any:
        from pyspark.sql.types import LongType, StructField, StructType

        fields = list(node.schema.fields)
        if self.ft and not without_src:
            fields.append(StructField(SRC, LongType(), False))
        if self.ft:
            fields.append(StructField(REC, LongType(), False))
        return StructType(fields)

    def _fetched_replays(self, node: _Node) -> tuple[Any, int]:
        """A batch replay round's replays of a source, never through the driver: the acker
        prepares them (routed to the partition the source's partitioning picks, born with
        their first attempt's ids) and the executors fetch their partition's rows
        (:mod:`xorack.spark.replays`). The frame's partition ``i`` holds the replays routed to
        ``i``; None when there are none."""
        from .replays import ReplayFetcher, replay_partitioning, replays_frame

        assert self._location is not None  # set by run() with FT on
        # one tag per prepare: a resumed driver (same job, same round numbers) never gets an
        # earlier driver's round; a retried request re-sends the same tag (same counts)
        tag = f"p{self.phase}-r{self.round}-{os.urandom(6).hex()}"
        spec = replay_partitioning(node.keys, node.partitions)
        counts = self.client.prepare_replays(node.source_index, spec, tag, first_ids=True)
        k = sum(counts.values())
        if not k:
            return None, 0
        large = self.spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")
        fetcher = ReplayFetcher(
            location=self._location,
            source=node.source_index,
            tag=tag,
            columns=node.columns,
            schema=declared_arrow_schema(node.schema, large.lower() == "true"),
            token=self.token,
            tls_root_certs=self._tls_root_certs,
            job=self._job,
        )
        return replays_frame(self.spark, node.partitions, fetcher, self._tagged_schema(node)), k

    def _replay_frame(self, node: _Node) -> tuple[Any, int]:
        """The replays of a source waiting in the FT layer, taken by the driver, as a DataFrame
        with lineage columns and ``_ft_route``, the route key of the partition the source's
        partitioning chooses: ``pmod(key hash, n)`` with keys (Spark's ``repartition(n,
        *keys)``), else the partition the record was first read on. The FT layer gives each
        replay its first attempt's id. Used where fresh rows and replays share a micro-batch
        (streaming); batch rounds use :meth:`_fetched_replays`."""
        import xorack.hashing as hashing

        from ..replay import HashReplayPartitioner

        parts = self.client.take_replays(source=node.source_index, first_ids=True)
        tables = [t for _, t in sorted(parts.items()) if t.num_rows]
        if self._on_replays is not None:  # streaming: the attempts for current_attempt(pdf)
            self._on_replays(tables)
        if not tables:
            return None, 0
        n = node.partitions
        route = hashing.route_keys(n)
        pieces = []
        for t in tables:
            # route here, from what the record carries, whatever the service's own replay
            # partitioners are (a standalone `xorack serve` knows nothing of this pipeline)
            if node.keys:
                key_hash = t.column("_ft_key_hash").to_numpy(zero_copy_only=False)
                original = np.full(t.num_rows, -1, dtype=np.int32)
                _, target = HashReplayPartitioner(n).assign(key_hash.astype(np.int32), original)
            else:
                target = t.column(ORIGIN_PARTITION).to_numpy(zero_copy_only=False)
            target = np.asarray(target, dtype=np.int64)
            if len(target) and (target.min() < 0 or target.max() >= n):
                raise ServiceError(
                    f"replays of source {node.name!r} routed outside [0, {n}): the source's "
                    "partition count changed since the records were persisted"
                )
            src = u64(t.column(SRC))
            rec = u64(t.column(REC))
            cols = [t.column(c) for c in node.columns]
            pieces.append(
                pa.table(
                    [
                        *cols,
                        pa.array(i64(src), pa.int64()),
                        pa.array(i64(rec), pa.int64()),
                        pa.array(route[target].astype(np.int32)),
                    ],
                    names=[*node.columns, SRC, REC, "_ft_route"],
                )
            )
        table = pa.concat_tables(pieces, promote_options="permissive")
        df = self.spark.createDataFrame(table, schema=self._route_schema(node))
        return df, table.num_rows

    def _route_schema(self, node: _Node) -> Any:
        from pyspark.sql.types import IntegerType, StructField

        st = self._tagged_schema(node)
        return st.add(StructField("_ft_route", IntegerType(), False))

    def _build(self, fresh: dict[int, Any], replays_wanted: bool) -> _Round:
        """The Spark work of one round or micro-batch (branches without input skipped).
        ``fresh``: new input per source index; ``replays_wanted``: feed the replays waiting in
        the FT layer too."""
        consumers: dict[int, list[int]] = {}
        for node in self._nodes:
            for par in node.parents:
                consumers.setdefault(id(par), []).append(id(node))
        built: dict[int, Any] = {}
        work = _Round()
        for node in self._nodes:
            df: Any
            if node.kind == "source":
                new = fresh.get(node.source_index)
                if new is None and node.derived is not None and not self.ft:
                    new = work.plain_barriers.get(id(node.derived))
                df, k = self._source_input(node, new, replays_wanted)
                work.replays += k
            else:
                inputs = [self._input(built, consumers, p, node) for p in node.parents]
                if all(x is None for x in inputs):
                    df = None
                elif node.kind == "union":
                    live = [x for x in inputs if x is not None]
                    df = live[0] if len(live) == 1 else live[0].unionByName(live[1])
                elif node.kind == "transform":
                    df = self._observed_transform(node, inputs[0], work)
                elif node.kind == "native":
                    df = self._reuse(node, inputs)
                    if df is None:
                        df = node.fn.apply(inputs[0], self.ft)
                elif node.kind in ("stage", "group", "arrow"):
                    df = self._stage_frame(node, inputs[0])
                elif node.kind == "barrier":
                    if self.ft:  # stage what arrives; the output comes in the barrier's phase
                        work.staged += [
                            (st, x)
                            for st, x in zip(node.staging, inputs, strict=True)
                            if x is not None
                        ]
                    else:
                        out = self._reuse(node, inputs)
                        work.plain_barriers[id(node)] = (
                            node.spec.compute(inputs) if out is None else out
                        )
                    df = None
                elif getattr(node.sink, "native", False):
                    if self.ft:
                        work.staged.append((node.staging[0], inputs[0]))
                    else:
                        df = inputs[0]
                        if df.columns != list(node.columns):  # FT off: rarely more columns
                            df = df.selectExpr(*map(q, node.columns))
                        work.plain_writes.append((node, df))
                    df = None
                else:  # a sink written from Python
                    work.summaries.append(self._sink_frame(node, inputs[0]))
                    df = None
            fanout = len(consumers.get(id(node), ()))
            if df is not None and self.ft and fanout > 1:
                df = self._tee(node, df, fanout)
            built[id(node)] = df
        return work

    def _tee(self, node: _Node, df: Any, copies: int) -> Any:
        """A branch point: one child record per consumer (own ids, anchored like any stage's
        outputs), materialized once so that the branches read the same rows — evaluating a
        tracked DataFrame twice would send its events twice."""
        from pyspark.sql.types import IntegerType, StructField, StructType

        fields = [f for f in df.schema.fields if f.name not in LINEAGE]
        lineage = [f for f in df.schema.fields if f.name in (SRC, REC)]
        schema = StructType([*fields, StructField(BRANCH, IntegerType(), False), *lineage])
        runner = StageRunner(
            name=f"{node.name}/tee",
            fn=Tee(copies),
            columns=(*node.columns, BRANCH),
            location=self._location,
            token=self.token,
            tls_root_certs=self._tls_root_certs,
            job=self._job,
            deterministic=self.deterministic_ids,
        )
        return _with_pending(df.mapInPandas(runner, schema)).localCheckpoint(eager=True)

    def _input(
        self, built: dict[int, Any], consumers: dict[int, list[int]], parent: _Node, node: _Node
    ) -> Any:
        from pyspark.sql import functions as F

        df = built[id(parent)]
        mine = consumers.get(id(parent), [])
        if df is None or not self.ft or len(mine) < 2:
            return df
        return df.where(F.col(BRANCH) == mine.index(id(node))).drop(BRANCH)

    def _lineage(self, cols: tuple[str, ...]) -> list[str]:
        return [*cols, *LINEAGE] if self.ft else list(cols)

    def _source_input(self, node: _Node, fresh: Any, replays_wanted: bool) -> tuple[Any, int]:
        """A source's rows for this round: its fresh input tagged, the replays routed to their
        partitions, or both (then one shuffle on the route key places every row)."""
        from pyspark.sql import functions as F

        tagged = None
        if fresh is not None:
            # with FT off a barrier's output goes on as Spark made it (plain Spark's plan: its
            # round-robin repartition only fixes the partitioning that replays are routed by)
            prepared = fresh if node.derived is not None and not self.ft else node.prepare(fresh)
            ordered = True  # a retried task reads the partition in the same order
            if self.resume and (node.repartition or node.derived is not None):
                # a shuffle's (or a barrier's) output order within a partition varies from run
                # to run: a resumed job skips a prefix of each partition, so fix the order
                prepared = prepared.sortWithinPartitions(*[F.col(q(c)) for c in node.columns])
            elif self.ft and self.deterministic_ids and self._chunk_bits and _shuffled(prepared):
                # chunked source ids follow the rows' positions: after a shuffle a retried task
                # may read the partition in another order, so order it by content (rows with
                # the same hash are the same row but for a 2**-64 accident); a type Spark
                # cannot hash (a map) keeps random ids: a retry then makes copies
                if _hashable(prepared.schema):
                    prepared = prepared.sortWithinPartitions(
                        F.xxhash64(*[F.col(q(c)) for c in node.columns])
                    )
                else:
                    ordered = False
            tagged = self._source_frame(node, prepared, ordered)
        replayed, k = (None, 0)
        if self.ft and replays_wanted and tagged is None and self._on_replays is None:
            replayed, k = self._fetched_replays(node)  # placed by the acker: no shuffle
            return (None if replayed is None else _with_pending(replayed)), k
        if self.ft and replays_wanted:
            replayed, k = self._replay_frame(node)
        if replayed is None:
            return (_with_pending(tagged) if self.ft and tagged is not None else tagged), 0
        cols = [q(c) for c in (*node.columns, SRC, REC)]
        if tagged is not None:
            import xorack.hashing as hashing

            route = F.array(*[F.lit(int(r)) for r in hashing.route_keys(node.partitions)])
            tagged = tagged.withColumn("_ft_route", F.element_at(route, F.spark_partition_id() + 1))
            replayed = tagged.unionByName(replayed)
        df = replayed.repartition(node.partitions, "_ft_route").selectExpr(*cols)
        return _with_pending(df), k

    def _source_frame(self, node: _Node, df: Any, ordered: bool = True) -> Any:
        if not self.ft:
            return df
        assert self._location is not None  # set by run() with FT on
        tagger = SourceTagger(
            name=node.name,
            source=node.source_index,
            keys=node.keys,
            location=self._location,
            token=self.token,
            tls_root_certs=self._tls_root_certs,
            job=self._job,
            deterministic=self.deterministic_ids,
            id_salt=self.id_salt,
            batch=self.round,
            chunk_bits=self._chunk_bits,
            ordered=ordered,
            progress=self.resume,
            skip=tuple(sorted(self._resume_skip.get(node.source_index, {}).items())),
        )
        from pyspark.sql import functions as F

        df = df.withColumn(PART, F.spark_partition_id())
        schema = self._tagged_schema(node)
        # PySpark's mapInArrow reads its input by column name, a name with a dot as a struct
        # field: such columns cross the tagger under names of their own
        odd = {c: f"_ft_c{i}" for i, c in enumerate(node.columns) if "." in c or "`" in c}
        if not odd:
            return df.mapInArrow(tagger, schema)
        tagger = dataclasses.replace(tagger, names=tuple(c for c in df.columns if c != PART))
        return df.withColumnsRenamed(odd).mapInArrow(tagger, schema)

    @classmethod
    def _settled(cls, node: _Node) -> bool:
        """Whether ``node``'s rows owe no pending event and hold no ghost: a source's, a Python
        stage's (their events are sent, or their pending columns constant); a native operator
        or an untracked transform may leave both."""
        if node.kind in ("source", "stage", "arrow", "group"):
            return True
        return node.kind == "union" and all(cls._settled(p) for p in node.parents)

    def _python_input(self, node: _Node, df: Any) -> Any:
        """The frame a Python stage or sink reads: without the pending-event columns when its
        input has none to send (two columns fewer to convert to Arrow and pandas, and Spark
        prunes their constants)."""
        if self.ft and self._settled(node.parents[0]):
            return df.drop(EV, KEEP)
        return df

    def _readers(self, node: _Node) -> list[_Node]:
        """The nodes that read ``node``'s rows, in declaration order."""
        return [n for n in self._nodes if any(p is node for p in n.parents)]

    def _births_in_stage(self, source: _Node) -> bool:
        """Whether an optimistic round leaves ``source``'s ids to the Python stage that alone
        reads it (a ``map_in_pandas`` or ``map_in_arrow`` stage)."""
        readers = self._readers(source)
        return len(readers) == 1 and readers[0].kind in ("stage", "arrow")

    def _stage_frame(
        self, node: _Node, df: Any, round_xor: Any = None, born: tuple[Any, int] | None = None
    ) -> Any:
        """A stage's output; ``round_xor``: an optimistic round's accumulator; ``born``: the
        round's count of the rows of the source the stage reads untagged, and the attempt id
        they get (the stage draws their ids)."""
        df = self._python_input(node, df)
        if node.kind == "arrow":
            large = self.spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")
            arrow = ArrowStageRunner(
                name=node.name,
                fn=node.fn,
                schema=declared_arrow_schema(node.schema, large.lower() == "true"),
                location=self._location,
                token=self.token,
                tls_root_certs=self._tls_root_certs,
                job=self._job,
                ft=self.ft,
                deterministic=self.deterministic_ids,
                tally=self._tally,
                round_xor=round_xor,
                born=born,
            )
            out = df.mapInArrow(arrow, self._tagged_schema(node, round_xor is not None))
            return self._stage_output(node, out, round_xor is not None)
        runner = StageRunner(
            name=node.name,
            fn=node.fn,
            columns=node.columns,
            location=self._location,
            token=self.token,
            tls_root_certs=self._tls_root_certs,
            job=self._job,
            ft=self.ft,
            deterministic=self.deterministic_ids,
            bisect=node.kind == "stage",
            single_record_groups=node.kind == "group",
            tally=self._tally,
            round_xor=round_xor,
            born=born,
        )
        if node.kind == "group":
            grouped = df.groupBy(*node.keys)
            out = grouped.applyInPandas(
                as_function(GroupStageRunner(runner)), self._tagged_schema(node)
            )
        else:
            out = df.mapInPandas(runner, self._tagged_schema(node, round_xor is not None))
        return self._stage_output(node, out, round_xor is not None)

    def _stage_output(self, node: _Node, out: Any, optimistic_round: bool) -> Any:
        """A Python stage's output with the lineage columns: an optimistic round's runner
        leaves the attempt id out (nothing in the round reads it: a constant here, which Spark
        folds away)."""
        if optimistic_round:  # one projection: the attempt id and the pending columns
            src = optimistic.round_salt(node.name)
            pending = (f"{src}L AS {SRC}", REC, f"0L AS {EV}", f"true AS {KEEP}")
            return out.selectExpr(*map(q, node.columns), *pending)
        return _with_pending(out) if self.ft else out

    def _sink_frame(self, node: _Node, df: Any, round_xor: Any = None) -> Any:
        """A Python sink's writers over ``df`` (their summaries); ``round_xor``: an optimistic
        round's accumulator."""
        df = self._python_input(node, df)
        runner = SinkRunner(
            name=node.name,
            sink=node.sink,
            columns=node.columns,
            location=self._location,
            token=self.token,
            tls_root_certs=self._tls_root_certs,
            job=self._job,
            ft=self.ft,
            tally=self._tally,
            round_xor=round_xor,
        )
        return df.mapInPandas(runner, SUMMARY_SCHEMA)

    # ---- running ------------------------------------------------------------------------------

    def run(self, on_round: Callable[[RoundInfo], None] | None = None) -> RunReport:
        """Run the pipeline to the end (rounds of replays until nothing is pending; a phase per
        barrier level); the report accounts for every source record.

        >>> # report = p.run(); assert report.lost == 0
        """
        sinks = self._sink_nodes()
        for node in sinks:
            if not getattr(node.sink, "native", False):
                _create_sink(node)
        start = time.perf_counter()
        report = RunReport(ft=self.ft)
        sc = self.spark.sparkContext
        workdir = self._open_staging() if self.ft else None
        self._workdir = workdir
        self._fast_records = self._fast_derived = 0
        self._lost_round_srcs = []
        ended: list[np.ndarray] = []
        derived_persisted = 0
        finished = not self.resume  # a resumable job keeps its staged rows until it finishes
        try:
            if self.ft:
                self._location = self._start_service()
            done_phases: set[int] = set()
            if self.resume:
                state = self.client.job_state()
                marks = state["marks"]
                if "report" in marks:  # the job finished in an earlier run
                    finished = True
                    known = {f.name for f in dataclasses.fields(RunReport)}
                    kept = {k: v for k, v in json.loads(marks["report"]).items() if k in known}
                    return RunReport(**{**kept, "resumed": True})
                report.resumed = bool(state["progress"] or marks)
                self._resume_skip = state["progress"]
                done_phases = {int(k[len("phase") :]) for k in marks if k.startswith("phase")}
                before = self.client.take_ended()  # earlier runs' ended attempts, and the
                ended.append(before)  # attempts the crash left pending (replayed now)
                if report.resumed:
                    self._adopt_staged(before)
                else:  # a new job: what another job left in the staging places is not ours
                    for node in self._nodes:
                        for st in node.staging:
                            st.remove()
            phases = self._phase_count() if self.ft else 1
            for phase in range(phases):
                self.phase = phase
                if phase > 0:
                    persisted_before = int(self.client.stats().get("persisted", 0))
                    self._open_phase(phase, np.concatenate(ended) if ended else None)
                if phase not in done_phases:
                    self._run_phase(phase, report, ended, on_round)
                    if self.resume and not self.client.stats().get("pending", 0):
                        self.client.job_state(marks={f"phase{phase}": "done"})
                if phase > 0:
                    derived_persisted += self._derived_persisted(phase, persisted_before)
            if self.ft:
                ended.append(self.client.take_ended())
                self._publish(sinks, np.concatenate(ended), report)
                self._fill(report, self.client.stats())
                self.client.release_replays()  # a standalone acker frees the last round's
                self._discount_derived(report, derived_persisted)
                self._count_optimistic(report)
                if not self.resume and self.ackers == 1:
                    with contextlib.suppress(ValueError):  # a sharded standalone acker
                        # a durable storage keeps ended attempts for a resumed job: not needed
                        self.client.job_state(clear=["ended"])
                if self.resume:
                    self._fill_job(report)
                    if not report.lost:
                        report.wall_seconds = round(time.perf_counter() - start, 3)
                        done = json.dumps(report.as_dict())
                        self.client.job_state(marks={"report": done}, clear=["ended"])
                        finished = True
            else:
                for k in TRACKING_COUNTS:
                    setattr(report, k, None)
        finally:
            sc.setLocalProperty(ROUND_PROPERTY, None)
            self.round = self.phase = 0
            self._resume_skip = {}
            for node in self._sources:
                if node.derived is not None:
                    node.df = None
            for node in self._nodes:
                node.fast_out, node.fast_rows, node.run_partitions = None, None, 0
                node.written = False
            self._workdir = None
            if self.ft:
                self._dead_letters = self._safe_dead_letters()
            self._stop_service()
            self._location = None
            if workdir is not None and finished:
                self._close_staging(workdir)
        report.wall_seconds = round(time.perf_counter() - start, 3)
        return report

    def _run_phase(
        self,
        phase: int,
        report: RunReport,
        ended: list[np.ndarray],
        on_round: Callable[[RoundInfo], None] | None,
    ) -> None:
        """Rounds until every record of the phase is completed or dead-lettered: the first
        round runs the phase's sources, the next ones their replays."""
        sc = self.spark.sparkContext
        if self.ft and phase > 0 and not self._phase_input(phase):
            return  # its barriers' outputs were written by an optimistic round, or go direct
        if self.ft and self._run_optimistic(phase, report):
            return  # every record of the phase completed in one optimistic round
        max_rounds = self.max_attempts + 1 if self.ft else 1
        guard = FailureTally(self.runaway_share)
        for round_no in range(max_rounds + 1):
            self.round = round_no
            # the first round of a phase that combines aggregates draws its ids in chunks
            partial_round = self.ft and round_no == 0 and phase in self._partial_phases
            self._chunk_bits = self.chunk_records.bit_length() - 1 if partial_round else 0
            sc.setLocalProperty(ROUND_PROPERTY, str(round_no))
            self._tally = sc.accumulator({}, tally_param()) if self.ft else None
            fresh = {}
            if round_no == 0:
                fresh = {
                    n.source_index: n.df
                    for n in self._sources
                    if n.phase == phase and n.df is not None and not self._direct(n)
                }
            work = self._build(fresh, replays_wanted=round_no > 0)
            if work.empty() and (round_no > 0 or phase > 0):
                break  # nothing left to replay, or a phase whose barriers feed native sinks only
            self._run_frames(work.summaries, report)
            for node, df in work.plain_writes:
                rows = node.sink.write(df)
                if rows is not None:  # a sink that cannot count what it wrote is not asked
                    report.sink_rows[node.name] = report.sink_rows.get(node.name, 0) + int(rows)
            report.rounds += 1
            if not self.ft:
                break
            bits = self._chunk_bits
            tag = f"{self._run_tag}p{phase:03d}-r{round_no:03d}"  # name order = write order
            paths, partial = [], []
            for st, df in work.staged:
                if isinstance(st, PartialStaging):
                    partial.append((st, st.write_partial(df, tag, bits)))
                else:
                    paths.append(st.write(df, tag))
            assert self._location is not None  # set by run() with FT on
            send_staged_events(
                self.spark,
                paths,
                self._location,
                self.token,
                self._tls_root_certs,
                self._job,
                hold=True,
                partial=[path for _, path in partial],
                chunk_bits=bits if partial else 0,
            )
            self._count_vanished(work, report)
            runaway = guard.add_round(dict(self._tally.value))
            if runaway is not None:
                raise RunawayFailure(runaway)
            self.client.expire_all()
            ended.append(self._release(ended_now=self.client.take_ended(), partial=partial))
            stats = self.client.stats()
            if on_round is not None:
                on_round(RoundInfo(round_no, work.replays, stats))
            if not stats.get("pending", 0) and not self._replays_waiting(stats):
                break

    # ---- optimistic rounds (xorack.spark.optimistic) -------------------------------------

    def _phase_nodes(self, phase: int) -> list[_Node]:
        """The nodes whose rows an optimistic round of ``phase`` runs through, in declaration
        order: the phase's sources and every node their rows reach, up to the barriers and the
        sinks (a union or a sink declared in a later phase gets this phase's rows too, as in
        the tracked rounds)."""
        touched: set[int] = set()
        nodes = []
        for node in self._nodes:
            if node.kind == "source":
                hit = node.phase == phase and not (node.derived and node.derived.written)
            else:
                hit = any(id(par) in touched for par in node.parents)
            if hit:
                touched.add(id(node))
                nodes.append(node)
        return nodes

    def _phase_count(self) -> int:
        return 1 + max((n.phase for n in self._nodes), default=0)

    def _phase_input(self, phase: int) -> bool:
        """Whether a source of ``phase`` has rows to run (a barrier output that an optimistic
        round wrote into its Python sink has none; one going straight to native sinks is
        written at the publish)."""
        return any(
            n.phase == phase and n.df is not None and not self._direct(n) for n in self._sources
        )

    def _optimistic_blocker(self, phase: int) -> str | None:
        """Why ``phase`` cannot run an optimistic round, or None when it can."""
        if not self.optimistic:
            return "optimistic=False"
        if self.resume:
            return "a resumable job runs tracked rounds"
        if self._on_replays is not None:
            return "streaming runs tracked rounds"
        if str(self.spark.conf.get("spark.speculation", "false")).lower() == "true":
            return "speculative execution is on (a speculative copy of a task can count twice)"
        fanout: dict[int, int] = {}
        for node in self._nodes:
            for par in node.parents:
                fanout[id(par)] = fanout.get(id(par), 0) + 1
        nodes = self._phase_nodes(phase)
        here = {id(n) for n in nodes}
        elsewhere = {  # the nodes other phases' rows reach
            id(n)
            for other in range(self._phase_count())
            if other != phase
            for n in self._phase_nodes(other)
        }
        for node in nodes:
            if node.kind == "group":
                return f"apply_in_pandas stage {node.name!r}"
            if node.kind == "sink" and not getattr(node.sink, "native", False):
                return f"sink {node.name!r} is written from Python"
            if node.kind == "sink" and id(node) in elsewhere:
                # its rows of each phase would be published apart
                return f"sink {node.name!r} gets rows of two phases"
            if node.kind == "barrier" and not all(id(par) in here for par in node.parents):
                # its other side's rows arrive in another phase: they would have to be kept
                # for it across phases, which the tracked rounds' staging does
                return f"{node.name!r} meets rows of two phases"
            if node.kind not in ("barrier", "sink"):
                if fanout.get(id(node), 0) > 1:
                    return f"{node.name!r} is a branch point"
                if not fanout.get(id(node), 0):
                    return f"the rows of {node.name!r} reach no sink"
            if node.kind == "source" and node.df is not None and node.df.isStreaming:
                return "streaming runs tracked rounds"
        return None

    def _run_optimistic(self, phase: int, report: RunReport) -> bool:
        """Run ``phase`` as one optimistic round; True when every record of it completed
        (its outputs are then in place for the next phase and the publish), False when it
        cannot run one or the round fell back (its outputs deleted; the reason reported)."""
        blocker = self._optimistic_blocker(phase)
        if blocker is None:
            try:
                work = self._build_optimistic(phase)
            except _NotOptimistic as e:
                blocker = str(e)
        if blocker is not None:
            if self.optimistic:
                report.tracked_phases.append(f"phase {phase}: {blocker}")
            return False
        if not work.jobs:
            return False  # nothing of this phase runs (its outputs go to native sinks)
        why = self._execute_optimistic(work, phase)  # a row failed: the round was cancelled
        if why is None:
            why = self._account_optimistic(work).verdict()
        if why is not None:
            self._discard_optimistic(work, report)
            report.optimistic_fallbacks.append(f"phase {phase}: {why}")
            return False
        self._accept_optimistic(work, report)
        report.rounds += 1
        report.optimistic_rounds += 1
        return True

    def _build_optimistic(self, phase: int) -> _OptimisticRound:
        """The Spark work of ``phase``'s optimistic round: its sources tagged in the JVM (births
        observed), its operators' tracked translations (Python stages report to the round's
        accumulator), and one write where rows leave the phase (:meth:`_optimistic_output`)."""
        from pyspark.sql import Observation

        sc = self.spark.sparkContext
        self._tally = sc.accumulator({}, tally_param())
        self.round = 0
        sc.setLocalProperty(ROUND_PROPERTY, "0")
        group = f"xorack-optimistic-{os.urandom(6).hex()}"
        assert self._workdir is not None  # set by run() with FT on
        # where a runner says at once that a row failed (the driver then cancels the round's
        # jobs); the executors see the driver's files on one machine, or with a shared workdir
        abort = None
        if os.path.isdir(self._workdir):
            abort = os.path.join(self._workdir, f"{group}.lost")
        work = _OptimisticRound(sc.accumulator((0, 0), optimistic.round_param()), group, abort)
        token = optimistic.RoundToken(work.accumulator, abort)
        built: dict[int, Any] = {}
        born: dict[int, tuple[Any, int]] = {}  # sources whose ids a Python stage draws
        for node in self._phase_nodes(phase):
            inputs = [built.get(id(p)) for p in node.parents]
            df: Any = None
            if node.kind == "source":
                if node.df is None or self._direct(node):
                    continue
                salt = optimistic.round_salt(node.name)
                if self._births_in_stage(node):
                    # its rows go straight into a Python stage, which draws their ids there
                    # and counts them: no ids and no observed metric in the JVM (an observed
                    # metric splits the generated code of the stage it is in)
                    count = sc.accumulator(0)
                    work.stage_births.append((node, count))
                    born[id(node)] = (count, salt)
                    df = node.prepare(node.df)
                else:
                    seen = Observation()
                    work.births.append((node, seen))
                    df = optimistic.tag_source(node.prepare(node.df), salt, node.source_index, seen)
            elif all(x is None for x in inputs):
                continue
            elif node.kind == "union":
                live = [x for x in inputs if x is not None]
                df = live[0] if len(live) == 1 else live[0].unionByName(live[1])
            elif node.kind == "transform":
                df = node.fn(inputs[0])
                check_columns(node.name, df.columns, self._lineage(node.columns), "transform")
            elif node.kind == "native":
                df = node.fn.apply(inputs[0], True)
            elif node.kind in ("stage", "arrow"):
                df = self._stage_frame(
                    node, inputs[0], round_xor=token, born=born.get(id(node.parents[0]))
                )
            elif node.kind in ("barrier", "sink"):
                work.jobs.append(self._optimistic_output(node, inputs, token))
                continue
            built[id(node)] = df
        return work

    def _execute_optimistic(self, work: _OptimisticRound, phase: int) -> str | None:
        """Run the round's writes in a job group of their own (the verdict reads its tasks'
        failures, and a failed row cancels it); the reason when a failed row cancelled it."""
        sc = self.spark.sparkContext
        previous = (
            sc.getLocalProperty("spark.jobGroup.id"),
            sc.getLocalProperty("spark.job.description"),
        )
        sc.setJobGroup(work.group, f"xorack: optimistic round of phase {phase}", False)
        self._fast_group = work.group
        abort = work.abort
        watch = (
            optimistic.AbortWatch(abort, lambda: sc.cancelJobGroup(work.group))
            if abort is not None
            else contextlib.nullcontext()
        )
        try:
            with watch:
                for job in work.jobs:
                    if job.src:  # a Python sink's writers: their summaries
                        job.summary = job.frame.collect()
                    else:
                        job.frame.write.mode("overwrite").parquet(job.path)
        except Exception:
            if abort is None or not os.path.exists(abort):
                raise  # not a round this driver cancelled: a real error
            return f"a row failed ({optimistic.first_line(abort)}); the round was cancelled"
        finally:
            self._fast_group = None
            sc.setLocalProperty("spark.jobGroup.id", previous[0])
            sc.setLocalProperty("spark.job.description", previous[1])
        return None

    def _account_optimistic(self, work: _OptimisticRound) -> optimistic.RoundAccount:
        """What the round's metrics, accumulators and Spark's task accounting say."""
        sc = self.spark.sparkContext
        account = optimistic.RoundAccount(task_failures=optimistic.task_failures(sc, work.group))
        for node, seen in work.births:
            got = optimistic.observed(seen)
            if got is None:
                account.missing.append(f"source {node.name!r}")
                continue
            account.births ^= got["x"]
            account.records += got["n"]
            work.records.append((node, got["n"]))
        for node, count in work.stage_births:  # their births are in the stage's events
            account.records += int(count.value)
            work.records.append((node, int(count.value)))
        for job in work.jobs:
            if job.src:  # its events are in the accumulator (see DerivedTagger)
                continue
            got = optimistic.observed(job.events)
            if got is None:
                account.missing.append(f"the rows reaching {job.name!r}")
                continue
            account.staged ^= got["x"]
        account.python, account.failed_rows = work.accumulator.value
        account.reasons = optimistic.reasons_of(dict(self._tally.value))
        return account

    def _discard_optimistic(self, work: _OptimisticRound, report: RunReport) -> None:
        """A round that falls back: its outputs are deleted, and the rows it wrote into Python
        sinks retracted once its tasks are over (again at the publish: a task the cancel had
        not stopped yet may have written after that)."""
        srcs = [job.src for job in work.jobs if job.src]
        if srcs:
            optimistic.await_tasks(self.spark.sparkContext, work.group)
        for job in work.jobs:
            if job.src:
                assert job.sink is not None
                self._lost_round_srcs.append(job.src)
                report.retracted_rows += int(
                    job.sink.sink.retract(np.array([job.src], dtype=np.uint64))
                )
            else:
                optimistic.remove_dir(self.spark, job.path)

    def _accept_optimistic(self, work: _OptimisticRound, report: RunReport) -> None:
        """A complete round: its sinks' rows wait for the publish (a Python sink's are in place),
        its barriers' outputs are the next phase's sources, its records count as completed."""
        for job in work.jobs:
            if job.src:  # the barrier's output is in its Python sink: its phase is done
                assert job.barrier is not None
                job.barrier.written = True
                self._add_summaries(job.summary, report)
                self._fast_derived += sum(int(r.rows) for r in job.summary)
                continue
            if job.sink is not None:
                got = optimistic.observed(job.rows)
                job.sink.fast_out = job.path
                job.sink.fast_rows = None if got is None else got["rows"]
            if job.barrier is not None:
                job.barrier.fast_out = job.path
                if job.sink is None:  # read by the next phase (or by several native sinks)
                    derived = self._derived_source(job.barrier)
                    derived.df = self.spark.read.parquet(job.path)
                    rows = (optimistic.observed(job.events) or {}).get("rows")
                    if rows is not None:  # a small output in few partitions, as Spark's
                        # adaptive execution would coalesce it (a task per partition costs)
                        wanted = -(-rows // ROWS_PER_PARTITION)
                        derived.run_partitions = max(1, min(derived.partitions, wanted))
        for node, n in work.records:
            if node.derived is None:
                self._fast_records += n
            else:
                self._fast_derived += n

    def optimistic_progress(self) -> float | None:
        """The share (0..1) of the Spark tasks of a running optimistic round that are done, or
        None when no optimistic round runs (then ``client.stats()`` counts the records). An
        optimistic round completes its records all at once at its end; this is for progress
        bars.

        >>> # share = p.optimistic_progress()  (from another thread, during run())
        """
        group = self._fast_group
        if group is None:
            return None
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                s = tracker.getStageInfo(stage)
                if s is not None:
                    done, total = done + s.numCompletedTasks, total + s.numTasks
        return done / total if total else 0.0

    def _derived_source(self, barrier: _Node) -> _Node:
        """The source node of a barrier's output (the next phase reads it)."""
        return next(n for n in self._sources if n.derived is barrier)

    def _optimistic_output(self, node: _Node, inputs: list[Any], token: Any) -> _FastOutput:
        """What an optimistic round writes where rows leave the phase at ``node`` (``inputs``:
        the tracked frames reaching it, lineage included): a native sink's live rows (into its
        staging directory, published at the end), or a barrier's output computed by Spark's
        own operator from the live rows — written straight into the staging of the one native
        sink that alone reads it, or by the writers of the one Python sink that alone reads an
        aggregate (:meth:`_round_sink_output`), else for the next phase. The events the rows
        owe are XORed on the way: per group inside an aggregation (the group's rows are read
        there anyway; ghosts form groups of their own, left out of the output), else by an
        observed metric over the rows."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        assert self._workdir is not None  # set by run() with FT on
        events: Any = Observation()
        barrier, sink = None, None
        if node.kind == "barrier":  # its output and who reads it
            derived = self._derived_source(node)
            readers = self._readers(derived)
        if node.kind == "sink":
            sink = node
            out = optimistic.staged(inputs[0], events).where(F.col(KEEP))
            out = out.selectExpr(*map(q, node.columns))
        elif isinstance(node.spec, AggregateSpec):
            barrier = node
            spec = node.spec
            xor = F.expr(f"bit_xor({EVENT})").alias(GROUP_XOR)
            if any(ops.reads_star(e) for e in spec.exprs):  # it would read the lineage too
                raise _NotOptimistic(f"the aggregate {node.name!r} reads `*`")
            grouped = inputs[0].groupBy(*spec.keys, KEEP).agg(*spec.exprs, xor)
            got = [fl for fl in grouped.schema.fields if fl.name not in (KEEP, GROUP_XOR)]
            if [(fl.name, fl.dataType.simpleString()) for fl in got] != [
                (fl.name, fl.dataType.simpleString()) for fl in node.schema.fields
            ]:  # an expression read the lineage columns too (not as a `*` we can see)
                raise _NotOptimistic(
                    f"the aggregate {node.name!r} reads more than its payload columns"
                )
            if self._round_writes(derived, readers):  # the groups' events XORed in Python
                groups = grouped.selectExpr(*map(q, node.columns), KEEP, GROUP_XOR)
                return self._round_sink_output(derived, readers[0], groups, token)
            # the XOR of the groups' events, and the output's rows (the live groups)
            counts = [
                F.expr(f"bit_xor({GROUP_XOR})").alias("x"),
                F.expr(f"count_if({KEEP})").alias("rows"),
            ]
            grouped = grouped.observe(events, *counts)
            out = grouped.where(F.col(KEEP)).selectExpr(*map(q, node.columns))
        else:  # a join of two tracked frames: each side's rows observed
            barrier = node
            lives, seen = [], []
            for x, par in zip(inputs, node.parents, strict=True):
                if x is None:  # no rows from that side this round
                    lives.append(empty_frame(self.spark, par.schema))
                    continue
                seen.append(Observation())
                x = optimistic.staged(x, seen[-1])
                lives.append(x.where(F.col(KEEP)).selectExpr(*map(q, par.columns)))
            out = node.spec.compute(lives)
            events = _Observations(seen)
        if barrier is not None and self._direct(derived) and len(readers) == 1:
            sink = readers[0]
            if list(sink.columns) != list(node.columns):
                out = out.selectExpr(*map(q, sink.columns))
        if sink is None:
            assert barrier is not None
            path = os.path.join(self._workdir, node.name, "fast")
            return _FastOutput(node.name, None, barrier, path, out, events)
        path = os.path.join(sink.sink.staging_dir, "optimistic")
        if barrier is None or isinstance(barrier.spec, AggregateSpec):  # counted above
            return _FastOutput(node.name, sink, barrier, path, out, events, events)
        rows = Observation()
        out = out.observe(rows, F.count(F.lit(1)).alias("rows"))
        return _FastOutput(node.name, sink, barrier, path, out, events, rows)

    def _round_writes(self, derived: _Node, readers: list[_Node]) -> bool:
        """Whether an optimistic round writes ``derived`` (a barrier's output) straight into
        its one reader, a Python sink: the barrier is a keyed aggregate (its rows are distinct,
        so the ids the output's tracked tagger would give them do not depend on where they
        are: content ids, which its phase's tracked rounds draw unless that phase stages
        partial aggregates — then its first round draws ids by position), and the sink can
        retract the round's rows should it fall back."""
        if len(readers) != 1 or readers[0].kind != "sink":
            return False
        if derived.phase in self._partial_phases and self.deterministic_ids:
            return False
        sink = readers[0].sink
        return (
            not getattr(sink, "native", False)
            and bool(getattr(sink, "round_writes", False))
            and isinstance(derived.derived.spec if derived.derived else None, AggregateSpec)
            and bool(derived.keys)
            and not any("." in c or "`" in c for c in derived.columns)
        )

    def _round_sink_output(
        self, derived: _Node, sink: _Node, groups: Any, token: Any
    ) -> _FastOutput:
        """An aggregate's output written by an optimistic round into the Python sink that alone
        reads it (the next phase folded into the round). ``groups``: the aggregate's groups,
        ghosts' included, with the XOR of their rows' events (``_ft_x``), which the
        :class:`DerivedTagger` folds into the round's accumulator (no observed metric in the
        JVM) before it gives each live row the record id the output's tracked tagger would
        give it and the round's attempt id; the sink's writers ack them there."""
        assert derived.derived is not None
        src = (int.from_bytes(os.urandom(8), "little") >> 1) or 1
        tagger = DerivedTagger(
            name=derived.name,
            source=derived.source_index,
            src=src,
            round_xor=token,
            deterministic=self.deterministic_ids,
            id_salt=self.id_salt,
        )
        tagged = groups.mapInArrow(tagger, self._tagged_schema(derived))
        frame = self._sink_frame(sink, tagged, round_xor=token)
        barrier = derived.derived
        return _FastOutput(barrier.name, sink, barrier, "", frame, None, src=src)

    def _publish_optimistic(self, node: _Node) -> int:
        """Publish a native sink's rows written by an optimistic round; returns their count."""
        assert node.fast_out is not None
        adopt = getattr(node.sink, "adopt", None)
        if adopt is not None:  # the sink takes the directory as it is (a rename)
            adopt(self.spark, node.fast_out)
            rows = node.fast_rows
        else:
            rows = node.sink.write(self.spark.read.parquet(node.fast_out))
            optimistic.remove_dir(self.spark, node.fast_out)
        if rows is None:
            rows = node.sink.read(self.spark).count()
        return int(rows)

    def _count_optimistic(self, report: RunReport) -> None:
        """Add the records the run's optimistic rounds completed (the acker never saw them)."""
        n = self._fast_records
        if report.source_records is not None and report.completed is not None:
            report.source_records += n
            report.completed += n
        report.derived_records += self._fast_derived

    def _release(
        self, ended_now: np.ndarray, partial: list[tuple[PartialStaging, str]]
    ) -> np.ndarray:
        """End the round's held completions: the chunks of the attempts that ended (this round)
        are tainted, their held records replayed as collateral; their partial rows are left out
        of the merge. Returns every attempt of the round that ended without completing."""
        bits = self._chunk_bits if partial else 0
        tainted = (
            sorted_distinct(ended_now >> np.uint64(bits)) if partial else np.empty(0, np.uint64)
        )
        self.client.release(tainted, bits)
        collateral = self.client.take_ended()
        if partial:
            frame = ids_frame(self.spark, tainted, column=CHUNK)
            for st, _ in partial:
                st.tainted.append(frame)
        return np.concatenate([ended_now, collateral])

    def _open_staging(self) -> str:
        """Give every barrier input and native sink its staging directory."""
        import tempfile

        if self.workdir is not None:
            os.makedirs(self.workdir, exist_ok=True)
        if self.resume:  # one place for every run of the job; tags unique per run
            assert self.workdir is not None  # checked by __init__
            workdir = os.path.join(self.workdir, "staging")
            self._run_tag = f"{time.time_ns():020d}-"
        else:
            workdir = tempfile.mkdtemp(prefix="xorack-run-", dir=self.workdir)
        self._partial_phases = set()
        for node in self._nodes:
            if node.kind == "barrier":
                plan = None
                if self.combine and isinstance(node.spec, AggregateSpec):
                    plan = combining_plan(node.spec, node.parents[0].schema, node.schema)
                if plan is not None:
                    node.staging = [
                        PartialStaging(
                            os.path.join(workdir, node.name, "0"),
                            node.parents[0].schema,
                            keys=node.spec.keys,
                            plan=plan,
                            output=node.schema,
                        )
                    ]
                    self._partial_phases.add(node.parents[0].phase)
                    continue
                node.staging = [
                    Staging(os.path.join(workdir, node.name, str(i)), p.schema)
                    for i, p in enumerate(node.parents)
                ]
            elif node.kind == "sink" and getattr(node.sink, "native", False):
                root = node.sink.staging_dir
                node.staging = [Staging(root, node.schema)]
                if not self.resume:
                    node.staging[0].remove()  # what an interrupted earlier run left
        return workdir

    def _adopt_staged(self, ended: np.ndarray) -> None:
        """A resumed job: the rows earlier runs staged (complete writes only, in the order they
        were written) join this run's; a partial write of a crashed run is deleted (its
        attempts did not ack, so they are replayed). The partial aggregates of the chunks of
        ``ended`` (attempts that ended, or that the crash left pending) are left out."""
        import shutil

        chunks = None
        bits = self.chunk_records.bit_length() - 1
        for node in self._nodes:
            for st in node.staging:
                if not os.path.isdir(st.root):
                    continue
                for name in sorted(os.listdir(st.root)):
                    path = os.path.join(st.root, name)
                    if not os.path.isdir(path) or name.startswith(("_", ".")):
                        continue
                    if not os.path.exists(os.path.join(path, "_SUCCESS")):
                        shutil.rmtree(path, ignore_errors=True)
                        continue
                    st.paths.append(path)
                    if isinstance(st, PartialStaging):
                        if chunks is None:
                            chunks = ids_frame(self.spark, ended >> np.uint64(bits), column=CHUNK)
                        st.tainted.append(chunks)

    def _fill_job(self, report: RunReport) -> None:
        """A resumable job's counts, over all of its runs: the records are the rows persisted
        (the progress notes), the dead-lettered ones are in the dead-letter table, the pending
        ones in the storage; every other record completed (a record leaves the storage only
        completed or dead-lettered)."""
        progress = self.client.job_state()["progress"]
        derived = {n.source_index for n in self._sources if n.derived is not None}
        rows = {True: 0, False: 0}
        for source, parts in progress.items():
            rows[source in derived] += sum(parts.values())
        dead = {True: 0, False: 0}
        table = self._safe_dead_letters()
        if table is not None and table.num_rows and "_ft_source" in table.schema.names:
            sources = table.column("_ft_source").to_numpy(zero_copy_only=False)
            dead[True] = int(np.isin(sources, list(derived)).sum())
            dead[False] = len(sources) - dead[True]
        lost = report.lost or 0
        report.source_records = rows[False]
        report.dead_lettered = dead[False]
        report.completed = rows[False] - dead[False] - lost
        report.derived_records = rows[True]
        report.derived_dead_lettered = dead[True]

    def _close_staging(self, workdir: str) -> None:
        import shutil

        for node in self._nodes:
            for st in node.staging:
                st.remove()
            node.staging = []
        shutil.rmtree(workdir, ignore_errors=True)

    def _open_phase(self, phase: int, ended: np.ndarray | None) -> None:
        """The outputs of the barriers that open ``phase``: Spark's own operator over the rows
        staged by completed attempts."""
        ended_df = None if ended is None else ids_frame(self.spark, ended)
        for node in self._sources:
            if node.derived is not None and node.phase == phase:
                barrier = node.derived
                if barrier.fast_out is not None or barrier.written:  # by an optimistic round
                    continue
                if isinstance(barrier.staging[0], PartialStaging):
                    node.df = barrier.staging[0].merged(self.spark)
                    continue
                inputs = [st.rows(self.spark, ended_df) for st in barrier.staging]
                node.df = barrier.spec.compute(inputs)

    def _observed_transform(self, node: _Node, df: Any, work: _Round) -> Any:
        """An untracked ``transform``: with FT on, the live rows going in and coming out are
        counted by Spark's observed metrics (no extra pass), so the report can name the
        transform where rows vanished (their records time out)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        live = F.sum(F.col(KEEP).cast("long")).alias("rows")
        if self.ft:
            seen_in, seen_out = Observation(), Observation()
            df = df.observe(seen_in, live)
        out = node.fn(df)
        check_columns(node.name, out.columns, self._lineage(node.columns), "transform")
        if self.ft:
            out = out.observe(seen_out, live)
            work.observed.append((node.name, seen_in, seen_out))
        return out

    def _count_vanished(self, work: _Round, report: RunReport) -> None:
        """Rows the round's transforms removed (after the round's actions ran)."""
        for name, seen_in, seen_out in work.observed:
            from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

            try:
                rows_in = int(seen_in.get.get("rows") or 0)
                rows_out = int(seen_out.get.get("rows") or 0)
            except Py4JJavaError:  # the plan never ran: Spark's adaptive execution dropped it
                continue  # as empty (no rows went in), and PySpark cannot read its metrics
            if rows_out < rows_in:
                gone = report.vanished_rows
                gone[name] = gone.get(name, 0) + rows_in - rows_out

    def _direct(self, node: _Node) -> bool:
        """A barrier output read only by native sinks needs no tracking: nothing between the
        barrier and the sink can fail a row, and the sink's write is Spark's own (all or
        nothing per task, retried by Spark). It is written straight to the sinks at publish
        time, which saves its phase (tagging, persisting, staging, acking)."""
        if node.derived is None:
            return False
        consumers = self._readers(node)
        return bool(consumers) and all(
            n.kind == "sink" and getattr(n.sink, "native", False) for n in consumers
        )

    def _derived_persisted(self, phase: int, before: int) -> int:
        """Records persisted by the barrier outputs of ``phase`` (they are not input records)."""
        return max(0, int(self.client.stats().get("persisted", 0)) - before)

    def _discount_derived(self, report: RunReport, persisted: int) -> None:
        """The FT layer counts the rows of barriers (tracked as records of the next phase) with
        the input records; the report accounts for the input records alone and gives the
        barrier rows apart."""
        derived = {n.source_index for n in self._sources if n.derived is not None}
        dead = 0
        if derived:
            table = self._safe_dead_letters()
            if table is not None and "_ft_source" in table.schema.names:
                sources = table.column("_ft_source").to_numpy(zero_copy_only=False)
                dead = int(np.isin(sources, list(derived)).sum())
        report.derived_records = persisted
        report.derived_dead_lettered = dead
        assert report.source_records is not None
        assert report.completed is not None
        assert report.dead_lettered is not None
        report.source_records -= persisted
        report.completed -= persisted - dead
        report.dead_lettered -= dead

    def _publish(self, sinks: list[_Node], ended: np.ndarray, report: RunReport) -> None:
        """Once every record is completed or dead-lettered: native sinks get the staged rows of
        completed attempts; sinks written from Python drop the rows of attempts that ended
        without completing. Either way a sink holds what the completed attempts wrote, and a
        dead-lettered record leaves nothing."""
        ended_df = None
        published = self.client.job_state()["marks"] if self.resume else {}
        for node in sinks:
            if getattr(node.sink, "native", False):
                parent = node.parents[0]
                if f"published:{node.name}" in published:  # by an earlier run of the job
                    report.sink_rows[node.name] = node.sink.read(self.spark).count()
                    continue
                if node.fast_out is not None:  # written by an optimistic round
                    report.sink_rows[node.name] = self._publish_optimistic(node)
                    node.staging[0].remove()
                    continue
                if self._direct(parent):  # a barrier's output, written as Spark computes it
                    rows = node.sink.write(parent.df.selectExpr(*map(q, node.columns)))
                else:
                    if ended_df is None and len(ended):
                        ended_df = ids_frame(self.spark, ended)
                    rows = node.sink.write(node.staging[0].rows(self.spark, ended_df))
                if self.resume:
                    self.client.job_state(marks={f"published:{node.name}": "1"})
                if rows is None:  # a sink that cannot count what it wrote
                    rows = node.sink.read(self.spark).count()
                report.sink_rows[node.name] = int(rows)
                node.staging[0].remove()
            elif hasattr(node.sink, "retract"):
                lost = np.asarray(self._lost_round_srcs, dtype=np.uint64)
                gone = int(node.sink.retract(np.concatenate([ended, lost]) if len(lost) else ended))
                report.retracted_rows += gone
                report.sink_rows[node.name] = report.sink_rows.get(node.name, 0) - gone

    def start_stream(
        self,
        timeout: float = 30.0,
        trigger_seconds: float | None = None,
        checkpoint_location: str | None = None,
        available_now: bool = False,
    ) -> Any:
        """Run the pipeline over its streaming source in ``foreachBatch``; returns a
        :class:`~xorack.spark.streaming.StreamingRun` (``.query``, ``.stop() -> RunReport``,
        ``.wait() -> RunReport``). Records not completed ``timeout`` seconds after they were
        persisted or replayed are replayed in a later micro-batch. ``available_now=True``
        (Spark's ``trigger(availableNow=True)``) reads what the source holds when the query
        starts and ends; ``run.wait()`` then drains and returns the report. With ``ft=False``
        the same stages run without tracking (the report's counts are ``None``).

        >>> # run = p.start_stream(timeout=10.0); ...; report = run.stop()
        >>> # report = p.start_stream(available_now=True).wait()
        """
        from .streaming import StreamingRun

        return StreamingRun(self, timeout, trigger_seconds, checkpoint_location, available_now)

    def _sink_nodes(self) -> list[_Node]:
        sinks = [n for n in self._nodes if n.kind == "sink"]
        if not sinks:
            raise StageSchemaError("pipeline: no sink declared; end at least one branch in .sink()")
        return sinks

    def _run_frames(self, frames: list[Any], report: RunReport) -> None:
        """One Spark action over all sinks of a round; adds their summaries to ``report``."""
        if not frames:
            return
        summary = frames[0]
        for f in frames[1:]:
            summary = summary.unionByName(f)
        self._add_summaries(summary.collect(), report)

    @staticmethod
    def _add_summaries(rows: list[Any], report: RunReport) -> None:
        """Python sinks' summary rows (sink, partition, rows, duplicates) into ``report``."""
        for row in rows:
            stored = int(row.rows) - int(row.duplicates)
            report.sink_rows[row.sink] = report.sink_rows.get(row.sink, 0) + stored
            dups = report.sink_duplicates
            dups[row.sink] = dups.get(row.sink, 0) + int(row.duplicates)
            report.duplicates_absorbed += int(row.duplicates)

    def _replays_waiting(self, stats: dict[str, Any]) -> bool:
        waiting = stats.get("replays_waiting")
        if waiting is not None:
            return bool(waiting)
        return True  # unknown: one more round (it ends at once when no replay is handed out)

    def _safe_dead_letters(self) -> Any:
        try:
            return self.client.dead_letters()
        except Exception:  # the report is already complete
            return None

    def dead_letters(self) -> pa.Table | None:
        """The dead-letter table of the last run (payload, origin id, attempts, last reason)."""
        return getattr(self, "_dead_letters", None)

    @staticmethod
    def _fill(report: RunReport, stats: dict[str, Any]) -> None:
        """Counts from the FT layer. ``lost`` = records neither completed nor dead-lettered
        when the run ended (the FT layer's pending count; 0 when every record is accounted
        for). Records a restarted acker recovered from its storage count as source records."""
        report.source_records = int(stats.get("persisted", 0)) + int(stats.get("recovered", 0))
        report.completed = int(stats.get("completed", 0))
        report.failed = int(stats.get("failed", 0))
        report.timed_out = int(stats.get("timed_out", 0))
        report.replayed = int(stats.get("replayed", 0))
        report.dead_lettered = int(stats.get("dead_lettered", 0))
        report.orphans = int(stats.get("orphans", 0))
        report.collateral_replays = int(stats.get("collateral", 0))
        report.repeats = int(stats.get("repeats", 0))
        report.lost = int(stats.get("pending", 0))


def _shuffled(df: Any) -> bool:
    """Whether ``df``'s plan shuffles (an Exchange): then the order of rows within a partition
    can differ between two attempts of a task (remote blocks are fetched in any order)."""
    return "Exchange" in df._jdf.queryExecution().executedPlan().toString()


def _hashable(schema: Any) -> bool:
    """Whether Spark's hash functions take every column (no map anywhere in the types)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    def ok(t: Any) -> bool:
        if isinstance(t, MapType):
            return False
        if isinstance(t, ArrayType):
            return ok(t.elementType)
        if isinstance(t, StructType):
            return all(ok(f.dataType) for f in t.fields)
        return True

    return ok(schema)


__all__ = ["REPORT_KEYS", "Pipeline", "RoundInfo", "RunReport", "Tracked"]
