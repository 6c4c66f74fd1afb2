"""Building one tracked round (or micro-batch): every node's frame, in declaration order.

The builder walks the plan and asks each node for its frame (:meth:`Node.tracked`); a node
read by several consumers is a branch point, materialized once and split into one copy per
consumer (:meth:`RoundBuilder.tee`). A source's rows come fresh (tagged), replayed (fetched by
the executors, or taken by the driver when fresh rows and replays share a micro-batch), or
both. With FT off the same walk builds plain Spark's plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..protocol import ATTEMPT
from .arrow_stage import declared_arrow_schema
from .context import RunContext
from .lineage import KEEP, LINEAGE, q
from .node import Node
from .outputs import NativeSinkNode
from .rows import Source, Transform, tagged_schema, with_pending
from .stages import BRANCH, REC, SRC, StageRunner, Tee

if TYPE_CHECKING:
    from .row_errors import RowGuard


@dataclass
class RoundWork:
    """The Spark work of one round: the summary frames of the Python sinks (one action), the
    frames to stage (barrier inputs, native sinks), and with FT off the barriers' outputs and
    the native sinks' writes."""

    summaries: list[Any] = field(default_factory=list)
    staged: list[tuple[Any, Any]] = field(default_factory=list)  # (Staging, frame)
    plain_barriers: dict[int, Any] = field(default_factory=dict)
    plain_writes: list[tuple[NativeSinkNode, Any]] = field(default_factory=list)
    replays: int = 0
    observed: list[tuple[str, Any, Any]] = field(default_factory=list)  # transform, in, out
    # reading the fresh input again tags every row with the ids it got this round (false:
    # random ids, see TrackedRounds' abandoned rounds)
    reproducible: bool = True

    def empty(self) -> bool:
        return not (self.summaries or self.staged or self.plain_writes)


def branch_storage(spark: Any) -> Any:
    """The storage level of a branch point's local checkpoint: memory and disk, replicated on
    two executors on a cluster (a lost executor's blocks cannot be computed again: without a
    copy, Spark fails the round's job with ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``); one copy
    in local mode (the driver is the only executor). Two executors lost at once, or a cluster
    with one, can still fail the run — loudly, never with a wrong result."""
    from pyspark import StorageLevel

    master = str(spark.sparkContext.master)
    if master == "local" or master.startswith("local["):
        return StorageLevel.MEMORY_AND_DISK
    return StorageLevel.MEMORY_AND_DISK_2


class RoundBuilder:
    """Builds a round over ``ctx``'s plan: ``fresh`` input per source index, and the replays
    waiting in the FT layer when ``replays_wanted``; with ``guard``, the native row operations
    evaluate their expressions so that a row on which one raises fails its record instead of
    the task (:mod:`xorack.spark.row_errors`)."""

    def __init__(
        self,
        ctx: RunContext,
        fresh: dict[int, Any],
        replays_wanted: bool,
        guard: RowGuard | None = None,
    ) -> None:
        self.ctx = ctx
        self.fresh = fresh
        self.replays_wanted = replays_wanted
        self.guard = guard
        self.work = RoundWork()

    def build(self) -> RoundWork:
        ctx = self.ctx
        plan = ctx.plan
        built: dict[int, Any] = {}
        for node in plan.nodes:
            inputs = [self._input(built, p, node) for p in node.parents]
            if node.parents and all(x is None for x in inputs):
                df = None  # a branch without input this round
            else:
                df = node.tracked(self, inputs)
            fanout = len(plan.readers(node))
            if df is not None and ctx.ft and fanout > 1:
                df = self.tee(node, df, fanout)
            built[id(node)] = df
        return self.work

    def _input(self, built: dict[int, Any], parent: Node, node: Node) -> Any:
        """``parent``'s frame as ``node`` reads it (its own copy after a branch point)."""
        from pyspark.sql import functions as F

        df = built[id(parent)]
        mine = self.ctx.plan.readers(parent)
        if df is None or not self.ctx.ft or len(mine) < 2:
            return df
        branch = next(i for i, n in enumerate(mine) if n is node)
        return df.where(F.col(BRANCH) == branch).drop(BRANCH)

    def tee(self, node: Node, df: Any, copies: int) -> Any:
        """A branch point: one child record per consumer (own ids, anchored like any stage's
        outputs), materialized once so that the branches read the same rows — evaluating a
        tracked DataFrame twice would send its events twice. A local checkpoint cannot be
        computed again: on a cluster its blocks are kept on two executors, so that one lost
        executor leaves the branches a copy (:func:`branch_storage`)."""
        from pyspark.sql.types import IntegerType, StructField, StructType

        fields = [f for f in df.schema.fields if f.name not in LINEAGE]
        lineage = [f for f in df.schema.fields if f.name in (SRC, REC)]
        schema = StructType([*fields, StructField(BRANCH, IntegerType(), False), *lineage])
        runner = StageRunner(
            name=f"{node.name}/tee",
            fn=Tee(copies),
            columns=(*node.columns, BRANCH),
            deterministic=self.ctx.deterministic_ids,
            **self.ctx.runner_args(),
        )
        tee = with_pending(df.mapInPandas(runner, schema))
        return tee.localCheckpoint(eager=True, storageLevel=branch_storage(self.ctx.spark))

    # ---- transforms --------------------------------------------------------------------------

    def observed_transform(self, node: Transform, df: Any) -> Any:
        """An untracked ``transform``: with FT on, the live rows going in and coming out are
        counted by Spark's observed metrics (no extra pass), so the report can name the
        transform where rows vanished (their records time out)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        ft = self.ctx.ft
        live = F.sum(F.col(KEEP).cast("long")).alias("rows")
        if ft:
            seen_in, seen_out = Observation(), Observation()
            df = df.observe(seen_in, live)
        out = node.apply(df, ft)
        if ft:
            out = out.observe(seen_out, live)
            self.work.observed.append((node.name, seen_in, seen_out))
        return out

    # ---- sources -----------------------------------------------------------------------------

    def source(self, node: Source) -> Any:
        """A source's rows for this round: its fresh input tagged, the replays routed to their
        partitions, or both (then one shuffle on the route key places every row)."""
        ctx = self.ctx
        new = self.fresh.get(node.index)
        if new is None and node.derived is not None and not ctx.ft:
            new = self.work.plain_barriers.get(id(node.derived))
        df, k = self._source_rows(node, new)
        self.work.replays += k
        return df

    def _source_rows(self, node: Source, fresh: Any) -> tuple[Any, int]:
        from pyspark.sql import functions as F

        ctx = self.ctx
        cfg = ctx.config
        tagged = None
        if fresh is not None:
            # with FT off a barrier's output goes on as Spark made it (plain Spark's plan: its
            # round-robin repartition only fixes the partitioning that replays are routed by)
            plain_output = node.derived is not None and not ctx.ft
            prepared = fresh if plain_output else node.prepare(fresh, ctx)
            if cfg.resume and (node.repartition or node.derived is not None):
                # a shuffle's (or a barrier's) output order within a partition varies from run
                # to run: a resumed job skips a prefix of each partition, so fix the order
                prepared = prepared.sortWithinPartitions(*[F.col(q(c)) for c in node.columns])
            elif ctx.ft and cfg.deterministic_ids and ctx.chunk_bits and shuffled(prepared):
                # chunked source ids follow the rows' positions: after a shuffle a retried task
                # may read the partition in another order, so order it by content (rows with
                # the same hash are the same row but for a 2**-64 accident; a map is hashed as
                # its entries sorted by key, which Spark cannot hash as a map)
                fields = {f.name: f.dataType for f in prepared.schema.fields}
                prepared = prepared.sortWithinPartitions(
                    F.xxhash64(*[content_of(F.col(q(c)), fields[c]) for c in node.columns])
                )
            if not cfg.deterministic_ids:
                self.work.reproducible = False
            tagged = node.tagged(ctx, prepared)
        if not (ctx.ft and self.replays_wanted):
            return (with_pending(tagged) if ctx.ft and tagged is not None else tagged), 0
        # the acker routes the replays to the partition the source's partitioning picks, and
        # the executors fetch them there: no replay row passes through the driver
        replayed, k = self._fetched_replays(node)
        if tagged is None or replayed is None:  # one of them alone is placed already
            one = replayed if tagged is None else tagged
            return (None if one is None else with_pending(one)), k
        # a micro-batch with fresh rows and replays (streaming): partition i of each goes to
        # partition i of the round, by its route key (Spark's hash of it picks i)
        import xorack.hashing as hashing

        n = ctx.partitions(node)
        route = F.array(*[F.lit(int(r)) for r in hashing.route_keys(n)])
        routed = [
            d.withColumn("_ft_route", F.element_at(route, F.spark_partition_id() + 1))
            for d in (tagged, replayed)
        ]
        cols = [q(c) for c in (*node.columns, SRC, REC)]
        df = routed[0].unionByName(routed[1]).repartition(n, "_ft_route").selectExpr(*cols)
        return with_pending(df), k

    def _fetched_replays(self, node: Source) -> tuple[Any, int]:
        """A batch replay round's replays of a source, never through the driver: the acker
        prepares them (routed to the partition the source's partitioning picks, born with
        their first attempt's ids) and the executors fetch their partition's rows
        (:mod:`xorack.spark.replays`). The frame's partition ``i`` holds the replays routed to
        ``i``; None when there are none."""
        import os

        from .replays import ReplayFetcher, replay_partitioning, replays_frame

        ctx = self.ctx
        assert ctx.location is not None  # set by the run with FT on
        n = ctx.partitions(node)
        # one tag per prepare: a resumed driver (same job, same round numbers) never gets an
        # earlier driver's round; a retried request re-sends the same tag (same counts)
        tag = f"p{ctx.phase}-r{ctx.round}-{os.urandom(6).hex()}"
        spec = replay_partitioning(node.keys, n)
        counts = ctx.client.prepare_replays(node.index, spec, tag, first_ids=True)
        k = sum(counts.values())
        if ctx.on_replays is not None:  # streaming: the attempts, for current_attempt(pdf)
            ctx.on_replays(
                [
                    ctx.client.fetch_replays(node.index, tag, p, columns=(SRC, ATTEMPT))
                    for p, rows in sorted(counts.items())
                    if rows
                ]
            )
        if not k:
            return None, 0
        fetcher = ReplayFetcher(
            location=ctx.location,
            source=node.index,
            tag=tag,
            columns=node.columns,
            schema=declared_arrow_schema(node.schema, ctx.arrow_large_types()),
            token=ctx.token,
            tls_root_certs=ctx.tls_root_certs,
            job=ctx.job,
        )
        return replays_frame(ctx.spark, n, fetcher, tagged_schema(node, True)), k


def shuffled(df: Any) -> bool:
    """Whether ``df``'s plan shuffles (an Exchange): then the order of rows within a partition
    can differ between two attempts of a task (remote blocks are fetched in any order)."""
    return "Exchange" in df._jdf.queryExecution().executedPlan().toString()


def hashable(schema: Any) -> bool:
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


def content_of(c: Any, t: Any) -> Any:
    """Column ``c`` of Spark type ``t`` in a form Spark's hash functions take and that depends
    on its content only: a map becomes the array of its entries sorted by key (two equal maps
    built in another order hash alike), inside arrays and structs too; any other type is
    ``c`` itself.

    >>> # F.xxhash64(content_of(F.col("m"), MapType(StringType(), LongType())))
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    if hashable(t):
        return c
    if isinstance(t, MapType):

        def by_key(a: Any, b: Any) -> Any:
            return F.when(a["key"] < b["key"], -1).when(a["key"] > b["key"], 1).otherwise(0)

        entries = F.array_sort(F.map_entries(c), by_key)
        if hashable(t.valueType):  # a key is never a map
            return entries
        return F.transform(
            entries,
            lambda e: F.struct(
                e["key"].alias("key"), content_of(e["value"], t.valueType).alias("value")
            ),
        )
    if isinstance(t, ArrayType):
        return F.transform(c, lambda x: content_of(x, t.elementType))
    assert isinstance(t, StructType)
    fields = [content_of(c[f.name], f.dataType).alias(f.name) for f in t.fields]
    return F.when(c.isNull(), F.lit(None)).otherwise(F.struct(*fields))


__all__ = ["RoundBuilder", "RoundWork", "content_of", "hashable", "shuffled"]
