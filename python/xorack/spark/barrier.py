"""Barriers: operators whose output depends on many source records (an aggregate, a join of two
tracked DataFrames) and native sinks, all built on one mechanism, the *staging* of rows.

Exactly-once under record-level replay means the result equals plain Spark on the input minus
the dead-lettered records, whichever records were replayed. A barrier gets there by waiting:

1. in every round, the rows reaching a barrier (or a native sink) are written durably by Spark
   itself (Parquet, Spark's commit protocol: a retried task leaves one copy), with each row's
   source attempt id and the XOR event it owes (its pending event and its ack);
2. the acks are computed from what was written: the staged rows' (source id, event) columns
   are read back by a ``mapInArrow`` that reduces them per source id and sends them (Python
   sees two int64 columns, no payload, no shuffle);
3. an attempt that ends without completing (failed, timed out, dead-lettered) is reported by
   the FT layer (``take_ended``); its staged rows are left out;
4. once every record upstream is completed or dead-lettered, the barrier computes its output
   with Spark's own operator over the staged rows of completed attempts only — every record
   counted once, a replayed record meeting the rows that went through before it. The output
   rows are the source records of the next *phase*: persisted, tracked and replayed like any
   source's. A native sink publishes its staged rows the same way when the run is over.

The staged rows cost their Parquet size on disk per round (payload + two 8-byte ids + a flag)
until the barrier has computed its output.

**Combining before staging.** Staging every row forgoes Spark's map-side combine, which is most
of the cost of an aggregation over many rows (a word count stages each word). An aggregation
whose functions all combine (``count``, ``sum``, ``min``, ``max``, ``avg`` over numbers; no
``distinct``) stages *partial* aggregates instead, one row per (chunk, group), where a *chunk* is
a block of ``2**CHUNK_BITS`` source records whose ids share their high bits (the source tagger
draws them so in the first round of such a phase; a replay's random id is a chunk of its own).
A partial row mixes the records of its chunk, so the chunk completes or fails as a whole:

1. each partial row carries the XOR of its rows' events; per chunk they reduce (a small
   shuffle) to one *chunk event*, which the acker checks against the XOR of the pending
   checksums of the chunk's records. When it cancels, the chunk's records are *held*: complete
   but not yet released. When it does not (a row was lost), they are all replayed;
2. once the round has settled, the chunks of every attempt that ended without completing are
   *tainted*: their held records are replayed too (as collateral: no attempt used up), the
   other held records complete (``FTLayer.release``);
3. the barrier's output merges the partial rows of the untainted chunks of every round
   (``sum`` of counts and sums, ``min`` of minimums, ``sum/count`` for ``avg``).

So the result is exact as before, at the price of replaying the chunk-mates of a record that
failed in the first round — cheap when failures are rare, one more pass over the first round's
records when they are not (the replays, with ids of their own, never taint each other).
``Pipeline(combine=False)`` stages rows instead.

>>> AggregateSpec(("word",), ()).describe()
'groupBy(word).agg()'
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa

from .._checks import sorted_distinct
from .lineage import EVT, KEEP, SRC, q, select_expr, staged_event
from .ops import reads_star
from .schema import empty_frame

CHUNK = "_ft_chunk"
#: Aggregate functions whose partial results merge exactly (``avg`` over integral or
#: floating-point inputs: a decimal average rounds in its own way).
COMBINING = ("count", "sum", "min", "max", "avg", "mean")


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class AggregateSpec:
    """``groupBy(*keys).agg(*exprs)`` over the staged rows of completed attempts."""

    keys: tuple[str, ...]
    exprs: tuple[Any, ...]

    def describe(self) -> str:
        return f"groupBy({', '.join(self.keys)}).agg({', '.join(map(str, self.exprs))})"

    def compute(self, inputs: Sequence[Any]) -> Any:
        return inputs[0].groupBy(*self.keys).agg(*self.exprs)


@dataclass(frozen=True)
class JoinSpec:
    """``left.join(right, on, how)`` of two tracked DataFrames over their staged rows: on
    shared column names, or on a Column ``condition`` (``t1.k == t2.k2``, with or without a
    residual non-equi part) over the two sides aliased ``qualifiers`` (what ``t1["k"]`` and
    ``t1.alias("a")`` name them)."""

    on: tuple[str, ...]
    how: str
    condition: Any = None
    qualifiers: tuple[str, str] = ("", "")
    #: the output columns kept (all when empty): those read after the join
    #: (:mod:`xorack.spark.prune`)
    keep: tuple[str, ...] = ()

    def describe(self) -> str:
        cut = f".select({', '.join(self.keep)})" if self.keep else ""
        if self.condition is not None:
            return f"join({self.condition}, {self.how!r}){cut}"
        return f"join({list(self.on)}, {self.how!r}){cut}"

    def compute(self, inputs: Sequence[Any]) -> Any:
        if self.condition is None:
            out = inputs[0].join(inputs[1], on=list(self.on), how=self.how)
        else:
            left, right = self.qualifiers
            out = inputs[0].alias(left).join(inputs[1].alias(right), self.condition, self.how)
        return select_expr(out, map(q, self.keep)) if self.keep else out

    def cartesian(self, out: Any) -> bool:
        """Whether Spark plans the join that :meth:`compute` made (``out``) as a cartesian
        product, which computes each partition of either side once per partition of the other
        (what runs before the join then counts its rows again). A join on column names, or on
        a condition Spark finds equality keys in (``ExtractEquiJoinKeys``), is a hash or a
        sort-merge join: only the others are planned, to see."""
        if self.condition is None:
            return False
        jvm = out.sparkSession._jvm
        join = _top_join(out._jdf.queryExecution().analyzed())
        if join is not None:
            keys = getattr(jvm.org.apache.spark.sql.catalyst.planning, "ExtractEquiJoinKeys$")
            if keys.__getattr__("MODULE$").unapply(join).isDefined():
                return False
        return "CartesianProduct" in str(out._jdf.queryExecution().sparkPlan().toString())


def _top_join(plan: Any) -> Any:
    """The first ``Join`` of a Catalyst logical plan going down single-child nodes, or None."""
    for _ in range(64):
        if str(plan.getClass().getSimpleName()) == "Join":
            return plan
        children = plan.children()
        if children.size() != 1:
            return None
        plan = children.head()
    return None


@dataclass(frozen=True)
class LimitSpec:
    """``limit(n)``, or ``orderBy(*order).limit(n)`` (the first ``n`` rows in that order),
    over the staged rows: Spark's own limit, once, over the complete input."""

    n: int
    order: tuple[Any, ...] = ()
    qualifier: str = ""  # the alias the order's columns may name the input by

    def describe(self) -> str:
        if self.order:
            return f"orderBy({', '.join(map(str, self.order))}).limit({self.n})"
        return f"limit({self.n})"

    def compute(self, inputs: Sequence[Any]) -> Any:
        if not self.order:
            return inputs[0].limit(self.n)
        df = inputs[0].alias(self.qualifier) if self.qualifier else inputs[0]
        return df.orderBy(*self.order).limit(self.n)


@dataclass(frozen=True)
class _Partial:
    """One aggregate of a combined aggregation: its partial columns and how they merge."""

    function: str  # count | sum | min | max | avg
    expr: Any  # the user's aggregate Column without its alias
    argument: Any  # its argument Column
    name: str  # the output column's name
    dtype: Any  # the output column's type

    def partials(self, i: int) -> list[Any]:
        f = _f()
        if self.function == "avg":
            value = self.argument.cast("double")
            return [f.sum(value).alias(f"_ft_p{i}s"), f.count(self.argument).alias(f"_ft_p{i}c")]
        return [self.expr.alias(f"_ft_p{i}")]

    def merge(self, i: int) -> Any:
        f = _f()
        if self.function == "avg":
            merged = f.sum(f"_ft_p{i}s") / f.sum(f"_ft_p{i}c")
        elif self.function in ("count", "sum"):
            merged = f.sum(f"_ft_p{i}")
        else:
            merged = getattr(f, self.function)(f"_ft_p{i}")
        return merged.cast(self.dtype).alias(self.name)


def combining_plan(
    spec: AggregateSpec, input_schema: Any, output_schema: Any, global_ok: bool = False
) -> Any:
    """The partial aggregates of ``spec`` when every one of its functions combines (see the
    module's doc), else None. ``output_schema``: plain Spark's output (keys, then one column
    per expression). ``global_ok``: a global aggregate too (a repair merges its one row)."""
    from pyspark.sql.types import DecimalType, NumericType

    try:
        from pyspark.sql.classic.column import Column
        from pyspark.sql.session import SparkSession
    except ImportError:  # pragma: no cover - Spark Connect only
        return None
    if not spec.keys and not global_ok:  # a global aggregate: one row even over no rows, which
        return None  # merged partials of no chunk would not give (a count of null, not 0)
    spark = SparkSession.getActiveSession()
    if spark is None or spark._jvm is None:
        return None
    proto = empty_frame(spark, input_schema)
    fields = output_schema.fields[len(spec.keys) :]
    if len(fields) != len(spec.exprs):
        return None
    plan = []
    for expr, out in zip(spec.exprs, fields, strict=True):
        if reads_star(expr):  # the partials are taken on tracked rows: `*` would read lineage
            return None
        try:
            node = expr._jc.node()
            if node.getClass().getSimpleName() == "Alias":
                node = node.child()
            if node.getClass().getSimpleName() != "UnresolvedFunction":
                return None
            name = str(node.functionName()).lower()
            if name not in COMBINING or node.isDistinct() or node.isUserDefinedFunction():
                return None
            if node.arguments().size() != 1:
                return None
            jvm = spark._jvm.org.apache.spark.sql
            argument = Column(jvm.Column(node.arguments().head()))
            bare = Column(jvm.Column(node))
        except Exception:  # not a classic Column, or a shape we do not know: stage rows
            return None
        function = "avg" if name == "mean" else name
        if function == "avg":
            t = proto.select(argument.alias("a")).schema["a"].dataType
            if not isinstance(t, NumericType) or isinstance(t, DecimalType):
                return None
        plan.append(_Partial(function, bare, argument, out.name, out.dataType))
    return tuple(plan)


@dataclass
class Staging:
    """The staged rows of one input of a barrier, or of a native sink, over a run's rounds."""

    root: str
    #: the payload StructType, or a function of no argument that computes it when it is first
    #: needed (a pruned join's sides: an optimistic round that completes stages nothing)
    payload_schema: Any
    paths: list[str] = field(default_factory=list)

    @property
    def schema(self) -> Any:
        if callable(self.payload_schema):
            self.payload_schema = self.payload_schema()
        return self.payload_schema

    @property
    def payload(self) -> list[str]:
        return list(self.schema.fieldNames())

    def write(self, df: Any, tag: str) -> str:
        """Stage ``df`` (payload + lineage) for round ``tag``; returns the directory."""
        path = os.path.join(self.root, tag)
        cols = [*map(q, self.payload), SRC, staged_event(), KEEP]
        df.selectExpr(*cols).write.mode("overwrite").parquet(path)
        self.paths.append(path)
        return path

    def adopt(self, path: str) -> None:
        """A directory an earlier run of a resumed job staged (complete) joins this run's."""
        self.paths.append(path)

    def rows(self, spark: Any, ended: Any) -> Any:
        """The staged payload rows of the attempts not in ``ended`` (a DataFrame of ``_ft_src``
        or None), ghosts left out."""
        if not self.paths:
            return empty_frame(spark, self.schema)
        df = spark.read.parquet(*self.paths).where(_f().col(KEEP))
        if ended is not None:
            df = df.join(ended, SRC, "left_anti")
        return select_expr(df, map(q, self.payload))

    def remove(self) -> None:
        """Delete the staged rows (local or ``file:`` paths; elsewhere they are left)."""
        remove_local(self.root)
        self.paths.clear()


@dataclass
class PartialStaging(Staging):
    """The staged partial aggregates of a combined aggregation (see the module's doc): per
    round, one row per (chunk, live flag, group) with the partial columns and the XOR of the
    rows' events; ``tainted`` holds, per round, the chunks whose rows are left out."""

    keys: tuple[str, ...] = ()
    plan: tuple[_Partial, ...] = ()
    output: Any = None  # plain Spark's output schema
    tainted: list[Any] = field(default_factory=list)  # per round: DataFrame of CHUNK, or None

    def write_partial(self, df: Any, tag: str, bits: int) -> str:
        f = _f()
        path = os.path.join(self.root, tag)
        chunk = f"shiftrightunsigned({SRC}, {int(bits)}) AS {CHUNK}"
        partials = [c for i, p in enumerate(self.plan) for c in p.partials(i)]
        grouped = df.selectExpr("*", chunk, staged_event()).groupBy(CHUNK, KEEP, *self.keys)
        grouped.agg(*partials, f.bit_xor(EVT).alias(EVT)).write.mode("overwrite").parquet(path)
        self.paths.append(path)
        return path

    def merged(self, spark: Any) -> Any:
        """The aggregation's output: the partial rows of the untainted chunks, merged."""
        f = _f()
        if not self.paths:
            return empty_frame(spark, self.output)
        parts = []
        for path, tainted in zip(self.paths, self.tainted, strict=True):
            df = spark.read.parquet(path).where(f.col(KEEP))
            if tainted is not None:
                df = df.join(tainted, CHUNK, "left_anti")
            parts.append(df)
        rows = reduce(lambda a, b: a.unionByName(b), parts)
        merges = [p.merge(i) for i, p in enumerate(self.plan)]
        out = rows.groupBy(*self.keys).agg(*merges)
        return select_expr(out, map(q, self.output.fieldNames()))

    def remove(self) -> None:
        super().remove()
        self.tainted.clear()


@dataclass(frozen=True)
class EventSender:
    """``mapInArrow`` function over staged (source id, event) rows: reduces them per source id
    and sends them to the acker, in calls of up to ``chunk`` rows (the events of one source id
    may be split between calls and tasks: XOR is associative). Yields one count per task."""

    location: str
    token: str | None = None
    tls_root_certs: bytes | None = None
    job: str | None = None  # the pipeline run's namespace on the acker
    chunk: int = 1 << 20
    hold: bool = False  # completions held until the round is released
    chunk_bits: int = 0  # > 0: the rows are whole chunk events (one row per chunk)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .ids import client_of, u64
        from .lineage import settle

        client = client_of(self.location, self.token, self.tls_root_certs, self.job)
        sent, buffered = 0, 0
        src: list[np.ndarray] = []
        val: list[np.ndarray] = []

        def flush() -> int:
            if not buffered:
                return 0
            s, v = np.concatenate(src), np.concatenate(val)
            if self.chunk_bits:  # already one row per chunk; a zero event counts too
                client.xor(s, v, hold=True, chunk_bits=self.chunk_bits)
                return len(s)
            ev_src, ev_val = settle(s, s, v, np.zeros(len(s), dtype=bool), ack_kept=False)
            if len(ev_src):
                client.xor(ev_src, ev_val, hold=self.hold)
            return len(ev_src)

        for batch in batches:
            if batch.num_rows:
                src.append(u64(batch.column(0)))
                val.append(u64(batch.column(1)))
                buffered += batch.num_rows
            if buffered >= self.chunk:
                sent += flush()
                src, val, buffered = [], [], 0
        sent += flush()
        yield pa.record_batch([pa.array([sent], pa.int64())], names=["n"])


#: Staged event rows up to which the driver reads them itself and reduces them per source id
#: (or chunk) before sending: 16 bytes a row, so at most 64 MiB of driver memory, against a
#: Spark job (a scan, a shuffle for chunk events, a Python task) that costs ~0.5 s even for a
#: few rows. Above it, or with staging the driver cannot read (not a local path), Spark sends.
DRIVER_EVENT_ROWS = 1 << 22


def _local_dir(path: str) -> str | None:
    """The local directory of a staging path (``file:`` or no scheme), else None."""
    root = path[len("file:") :] if path.startswith("file:") else path
    return None if "://" in root or not os.path.isdir(root) else root


def _local_events(
    paths: Sequence[str], partial: Sequence[str], chunk_bits: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The staged events at ``paths`` (rows: source id, event) and ``partial`` (rows: chunk,
    event), read by the driver and reduced per source id (per chunk with ``chunk_bits``):
    (keys, XOR values) as uint64, zero values kept. None when a path is not a local directory
    or there are more than :data:`DRIVER_EVENT_ROWS` rows (only Parquet metadata is read
    then)."""
    import pyarrow.dataset as ds

    from .. import acker
    from .stages import u64

    found = []
    total = 0
    for path, column in [*((p, SRC) for p in paths), *((p, CHUNK) for p in partial)]:
        root = _local_dir(path)
        if root is None:
            return None
        data = ds.dataset(root, format="parquet")  # Spark's _SUCCESS, .crc files left out
        total += data.count_rows()
        if total > DRIVER_EVENT_ROWS:
            return None
        found.append((data, column))
    keys, values = [], []
    for data, column in found:
        table = data.to_table(columns=[column, EVT])
        key = u64(table.column(0))
        if column == SRC and chunk_bits:
            key = key >> np.uint64(chunk_bits)
        keys.append(key)
        values.append(u64(table.column(1)))
    if not keys:
        return np.empty(0, np.uint64), np.empty(0, np.uint64)
    k, v = acker.xor_reduce(np.concatenate(keys), np.concatenate(values))
    return np.asarray(k, np.uint64), np.asarray(v, np.uint64)


def send_staged_events(
    spark: Any,
    paths: Sequence[str],
    location: str,
    token: str | None,
    tls_root_certs: bytes | None = None,
    job: str | None = None,
    hold: bool = False,
    partial: Sequence[str] = (),
    chunk_bits: int = 0,
) -> int:
    """Send the events of the rows staged at ``paths`` and of the partial rows at ``partial``
    (read back from what was durably written: an ack never precedes its write), completions
    held with ``hold``. With ``chunk_bits`` the events reduce per chunk first and go as chunk
    events. Up to :data:`DRIVER_EVENT_ROWS` locally staged rows are read and reduced by the
    driver; more go through a Spark job (a small shuffle per chunk with ``chunk_bits``;
    otherwise Python sees two int64 columns, no shuffle). Returns the number of (reduced)
    events sent."""
    if not paths and not partial:
        return 0
    local = _local_events(paths, partial, chunk_bits)
    if local is not None:  # few enough to reduce here: no Spark job
        from .ids import client_of

        keys, values = local
        client = client_of(location, token, tls_root_certs, job)
        if chunk_bits:  # one event per chunk; a zero event counts too
            client.xor(keys, values, hold=True, chunk_bits=chunk_bits)
            return len(keys)
        live = values != 0
        keys, values = keys[live], values[live]
        if len(keys):
            client.xor(keys, values, hold=hold)
        return len(keys)
    f = _f()
    if chunk_bits:
        parts = [
            spark.read.parquet(p).select(
                f.shiftrightunsigned(f.col(SRC), chunk_bits).alias(CHUNK), EVT
            )
            for p in paths
        ] + [spark.read.parquet(p).select(CHUNK, EVT) for p in partial]
        staged = reduce(lambda a, b: a.unionByName(b), parts)
        staged = staged.groupBy(CHUNK).agg(f.bit_xor(EVT).alias(EVT))
    else:
        parts = [spark.read.parquet(p).select(SRC, EVT) for p in paths]
        parts += [spark.read.parquet(p).select(f.col(CHUNK).alias(SRC), EVT) for p in partial]
        staged = reduce(lambda a, b: a.unionByName(b), parts).where(f.col(EVT) != 0)
    sender = EventSender(
        location,
        token,
        tls_root_certs,
        job=job,
        hold=hold or bool(chunk_bits),
        chunk_bits=chunk_bits,
    )
    sent = staged.mapInArrow(sender, "n long").agg(f.sum("n")).collect()
    return int(sent[0][0] or 0)


def remove_local(path: str) -> None:
    """Delete a staged directory (a local or ``file:`` path; elsewhere it is left)."""
    local = path[len("file:") :] if path.startswith("file:") else path
    if "://" not in local and os.path.isdir(local):
        shutil.rmtree(local, ignore_errors=True)


def ids_frame(spark: Any, ids: np.ndarray, column: str = SRC) -> Any:
    """A one-column DataFrame (``column`` bigint) of uint64 ids, or None when there are none."""
    if not len(ids):
        return None
    values = sorted_distinct(np.ascontiguousarray(ids, dtype=np.uint64)).view(np.int64)
    return spark.createDataFrame(pa.table({column: pa.array(values, pa.int64())}))


__all__ = [
    "CHUNK",
    "COMBINING",
    "AggregateSpec",
    "EventSender",
    "JoinSpec",
    "LimitSpec",
    "PartialStaging",
    "Staging",
    "combining_plan",
    "ids_frame",
    "remove_local",
    "send_staged_events",
]
