"""Kept rounds: an optimistic round that keeps what it computed for the records that did not
fail, and replays only the failed ones (issue 27's cheap failure path).

Before, one row failing in an optimistic round lost the whole round: its outputs were deleted
and the phase ran again in tracked rounds, every record persisted and acked one by one (five
times plain Spark's time on TPC-H Q5 with 0.1 % of ``lineitem`` failing once). A round *keeps*
its work instead when its shape lets the failed records' share of each output be added later:

* the rows that fail are **source records**: they fail in the ``map_in_pandas`` /
  ``map_in_arrow`` stage that alone reads an input source (its rows come into the stage
  untagged, one row per record, see :meth:`~xorack.spark.plan.Plan.births_in_stage`), and in
  no other stage of the round;
* every output of the round is **linear** in that source: ``out(S) = out(S - F) ⊕ out(F)``.
  From the source to each output there are only Python stages, native row operations (a
  lookup join of any type but right or full), tracked joins (not ``cross``) with the
  source's rows on an inner side (or the preserved side of a left, semi or anti join), then
  at most one aggregate whose functions are ``count``, ``sum``, ``min`` or ``max`` (their
  results merge: a sum of counts and sums, a min of minimums) and whose output leaves the
  round (is written, not read by a phase fused into it), or a native sink;
  no branch point, no ``transform``, no limit, no Python sink, no output the source's rows
  do not reach (the replay would write it again), and nothing on the other side of a join
  that a second read could give otherwise (a Python stage, ``rand()``, ``input_file_name()``
  …: the replay round reads it again).

Such a round runs as any optimistic round, but the stage neither fails its failed rows nor
cancels the round: it writes them (the source rows themselves, with the error) into the
round's *kept* directory and drops them — acked as dropped, so the round's XOR still checks
every other row. When the round is otherwise complete (its births cancel, no task failed,
every metric came back, the driver reads exactly as many kept rows as the stage counted, and
the stage saw as many rows as the source holds: a plan that computes the stage's input twice,
as a cartesian product does per partition of its other side, would keep copies), its outputs
are exact for the records that did not fail. The kept rows are then replayed:
a *replay round* runs the same phases as an optimistic round whose source is the kept rows
alone (written as Parquet, read by the executors), each with a new id, in round ``k`` (so
:func:`~xorack.spark.current_round` says ``k``: their ``k + 1``-th attempt); the other sources
are read again (a tracked join's other side), and what the replay round writes is merged into
the first round's outputs: rows are added (their files moved), an aggregate's rows merged by
key. A record that fails again is kept again, up to ``max_attempts``; then it is
dead-lettered with its last error (persisted in the FT layer and failed there, which keeps its
payload in the dead-letter table). Nothing is persisted for the records that complete.

A replay round that falls back for another reason (a task retried, another stage's row, a
native expression's error), a task whose stage fails more than :data:`SHARE` of its rows (a
bug, not a few bad records: the round is cancelled at once and the runaway guard of the
tracked rounds judges it), or kept rows the driver cannot read (a cluster whose executors do
not share the run's work directory) send the phase back to the path before: the outputs are
deleted and the phase runs tracked rounds.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .lineage import SRC, q, select_expr
from .optimistic import REASON, KeptRows
from .report import Reason, RunReport
from .tasks import live_files

if TYPE_CHECKING:
    from .context import RunContext
    from .optimistic_round import FastOutput, OptimisticRound
    from .rows import Source

log = logging.getLogger(__name__)

#: Whether an optimistic round of a keepable shape keeps its work when rows fail (see the
#: module's doc); False: a failed row loses the round, as before.
KEEP = True
#: Whether a replay round writes an aggregate merged with the rows before it, in its own job
#: (see :func:`premerge`); False: the keeper merges them in a job of its own, as before.
PREMERGE = True
#: The share of a task's source rows its stage may fail and keep; beyond it (and beyond
#: :data:`SLACK` rows) the round is lost at once, as before.
SHARE = 0.1
SLACK = 16
#: functions whose results over two sets of rows merge into their result over the union
MERGING = ("count", "sum", "min", "max")
_LINEAR_HOWS = {"inner"}
_LEFT_HOWS = {"left", "leftouter", "left_outer", "semi", "leftsemi", "left_semi", "anti",
              "leftanti", "left_anti"}  # fmt: skip


# ---- which rounds keep -----------------------------------------------------------------------


def candidate(ctx: RunContext, phases: list[int]) -> tuple[Source, Any] | None:
    """The source and the stage of a round over ``phases`` that can keep its failed rows (see
    the module's doc), or None. Conservative: a fused round that stops earlier than the plan
    says only turns inner outputs (a tracked join's rows) into written ones, which merge too."""
    from .barrier import combining_plan
    from .join_ops import LookupJoin
    from .ops import Qualified
    from .outputs import Aggregate, NativeSinkNode, PythonSinkNode, TrackedJoin
    from .rows import ArrowStage, PandasStage, PythonStage, RowOperation, Source, Union

    if not KEEP:
        return None
    skip = lambda s: ctx.of(s).written  # noqa: E731
    nodes = [n for p in phases for n in ctx.plan.phase_nodes(p, skip)]
    first = [
        n
        for n in nodes
        if isinstance(n, (PandasStage, ArrowStage))
        and isinstance(n.parents[0], Source)
        and n.parents[0].derived is None
        and n.parents[0].phase == phases[0]
        and ctx.plan.births_in_stage(n.parents[0])
    ]
    if len(first) != 1:
        return None
    stage = first[0]
    source = stage.parents[0]
    assert isinstance(source, Source)
    if isinstance(stage, PandasStage) and not _plain_types(source.schema):
        return None  # a pandas frame's timestamps and nested values do not come back exact
    in_round = {id(n) for n in nodes}
    down = {id(source)}
    for node in nodes:
        if len([r for r in ctx.plan.readers(node) if id(r) in in_round]) > 1:
            return None  # a branch point
        if isinstance(node, Source):
            if node.derived is not None and id(node.derived) in down:
                down.add(id(node))
            elif node is not source and node.recomputed() is not None:
                return None  # a replay round reads it again: it must give the same rows
            continue
        reached = [id(p) in down for p in node.parents]
        if not any(reached):
            if not isinstance(node, RowOperation) or node.recomputed() is not None:
                return None  # an output or a barrier the source's rows do not reach, or what
            continue  # a replay round would compute otherwise (a Python stage sees round k)
        if isinstance(node, TrackedJoin):
            how = node.spec.how.lower()
            if all(reached) or not (how in _LINEAR_HOWS or (how in _LEFT_HOWS and reached[0])):
                return None
        elif type(node) is Aggregate:
            derived = ctx.plan.derived_source(node)
            readers = ctx.plan.readers(derived)
            if id(derived) in in_round or any(isinstance(r, PythonSinkNode) for r in readers):
                return None  # read by a phase of the round, or (maybe) written by it to Python
            if any(
                isinstance(r, NativeSinkNode) and not set(node.columns) <= set(r.columns)
                for r in readers
            ):
                return None  # a sink that drops a column the merge needs
            plan = combining_plan(node.spec, node.parents[0].schema, node.schema, global_ok=True)
            if plan is None or any(p.function not in MERGING for p in plan):
                return None
        elif isinstance(node, RowOperation):
            op = node.op.op if isinstance(node.op, Qualified) else node.op
            if isinstance(op, LookupJoin) and op.how.lower() not in _LINEAR_HOWS | _LEFT_HOWS:
                return None
        elif isinstance(node, Union):
            if not all(reached):
                return None  # the other input's rows would be written again
        elif isinstance(node, PythonStage):
            if not isinstance(node, (PandasStage, ArrowStage)):
                return None
        elif not isinstance(node, NativeSinkNode):
            return None  # a Python sink, a transform, a limit, a stream's operator
        down.add(id(node))
    return source, stage


def _plain_types(schema: Any) -> bool:
    """Whether a pandas frame of ``schema``'s rows converts back to the same rows: not a float
    (NaN and null are one value in pandas), a timestamp or a nested value. (A long column that
    holds a null in a batch is a float in pandas, 2^53 + 1 then 2^53: such a batch's failed
    rows are not kept, see :meth:`~xorack.spark.optimistic.KeptRows.table_of`.)"""
    from pyspark.sql import types as T

    simple = (
        T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType, T.StringType,
        T.BooleanType, T.BinaryType, T.DateType,
    )  # fmt: skip
    return all(isinstance(f.dataType, simple) for f in schema.fields)


def kept_rows(ctx: RunContext, rnd: OptimisticRound, phases: list[int]) -> KeptRows | None:
    """The :class:`~xorack.spark.optimistic.KeptRows` of a round about to be built (over
    ``phases``, as far as the plan says), or None when it cannot keep."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if rnd.abort is None or rnd.phase in ctx.unkept:
        return None
    found = candidate(ctx, phases)
    if found is None:
        return None
    source, stage = found
    rnd.kept_source = source
    try:
        schema = to_arrow_schema(source.schema, prefers_large_types=ctx.arrow_large_types())
    except Exception:  # a type Arrow cannot carry: no keeping
        return None
    schema = schema.append(pa.field(SRC, pa.int64()))
    share = SHARE
    runaway = ctx.config.runaway_share
    if runaway is not None:  # never keep a share the runaway guard would stop the run for
        share = min(share, float(runaway) / 2)
    count = ctx.spark.sparkContext.accumulator(0)
    path = os.path.join(str(ctx.workdir), f"{rnd.group}.kept")
    return KeptRows(stage.name, path, schema, count, share, SLACK, replay=rnd.attempt > 0)


# ---- the replay rounds -----------------------------------------------------------------------


def _read_kept(path: str, dead: set[int]) -> pa.Table | None:
    """The rows a round's tasks kept, but for the files of its task attempts that failed
    (``dead``: Spark retried them, and counted only the retry's rows)."""
    import pyarrow.parquet as pq

    if not os.path.isdir(path):
        return None
    names = live_files(sorted(f for f in os.listdir(path) if f.endswith(".parquet")), dead)
    files = [os.path.join(path, f) for f in names]
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files])


class Keeper:
    """The replay rounds of a keeping round that completed with kept rows, and the merge of
    their outputs into its own (see the module's doc)."""

    def __init__(self, first: OptimisticRound) -> None:
        self.first = first
        self.ctx = first.ctx
        self.rounds: list[OptimisticRound] = []
        self.dirs: list[str] = []

    def run(self, report: RunReport) -> tuple[Reason, str] | None:
        """None when the round's outputs are now exact for every record (the failed ones
        completed by replay rounds, or dead-lettered); else why the phase falls back (every
        replay round's outputs deleted)."""
        first, ctx = self.first, self.ctx
        kept = first.kept
        assert kept is not None
        expected = int(kept.count.value)
        if not expected:
            return None
        from .stages import ROUND_PROPERTY

        self.dirs.append(kept.path)
        try:
            why = self._replay(report, expected)
        except Exception as exc:  # any doubt: the whole phase again, in tracked rounds
            log.warning("phase %d: replaying the kept rows failed: %r", first.phase, exc)
            why = Reason.ROW_FAILED, f"rows failed, and replaying them alone failed: {exc!r}"
        finally:
            ctx.round = 0
            ctx.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, "0")
        if why is not None:
            self._discard()
            ctx.unkept.add(first.phase)
            born = sum(int(c.value) for b in first.builders for _, c in b.stage_births)
            first.kept_rate = expected / born if born else 0.0
        self._clean()
        return why

    def _replay(self, report: RunReport, expected: int) -> tuple[Reason, str] | None:
        from .. import acker

        first, ctx = self.first, self.ctx
        kept = first.kept
        assert kept is not None
        table = _read_kept(kept.path, first.dead_attempts)
        if table is None or table.num_rows != expected:
            got = 0 if table is None else table.num_rows
            return Reason.ROW_FAILED, (
                f"{expected} row(s) failed; the driver read {got} of them from the round's "
                "work directory (shared with the executors?)"
            )
        source = first.kept_source
        assert source is not None
        born = sum(int(c.value) for b in first.builders for n, c in b.stage_births if n is source)
        read = int(ctx.source_input(source).count())
        if born != read:  # Spark computed the stage's input more than once (a cartesian
            # product computes a partition once per partition of the other side): its kept
            # rows may be copies, and its counts are not the records'
            return Reason.ROW_FAILED, (
                f"rows failed, and the stage saw {born} rows of {read} records (computed "
                "again by the plan): they cannot be replayed alone"
            )
        payload = [n for n in kept.schema.names if n != SRC]
        # an aggregate written into its sink's staging: each replay round writes it merged
        # with the rows before it (the first round's, then the last replay round's), in its
        # own job; the keeper then only moves the last one in place
        merge = {job.name: job.path for job in first.outputs if PREMERGE and _premergeable(job)}
        attempts = max(1, int(ctx.config.max_attempts))
        failures = expected  # every failed attempt of a kept row, the first round's included
        replays = 0
        pending = table
        log.info(
            "phase %d: the optimistic round kept its work; %d failed row(s) replayed alone",
            first.phase,
            expected,
        )
        for attempt in range(1, attempts):
            ids = np.asarray(acker.new_ids(pending.num_rows), dtype=np.uint64)
            rows = pending.select(payload).append_column(SRC, pa.array(ids.view(np.int64)))
            path = os.path.join(str(ctx.workdir), f"{first.group}.replay{attempt}")
            self.dirs.append(path)
            df = self._frame(rows, path, source)
            rnd = type(first)(  # an OptimisticRound, replaying
                ctx, first.phase, fuse=first.fuse, replace={id(source): df}, attempt=attempt
            )
            self.rounds.append(rnd)
            why = rnd.replay(merge)
            report.rounds += 1
            report.kept_rounds += 1
            replays += pending.num_rows
            if why is not None:
                return why[0], f"rows failed, and their replay round fell back: {why[1]}"
            if sorted(o.name for o in rnd.outputs) != sorted(o.name for o in first.outputs):
                return Reason.ROW_FAILED, "rows failed, and their replay round wrote elsewhere"
            merge.update((o.name, o.path) for o in rnd.outputs if o.name in merge)
            assert rnd.kept is not None
            again = int(rnd.kept.count.value)
            if not again:
                pending = pending.slice(0, 0)
                break
            assert rnd.kept is not None
            self.dirs.append(rnd.kept.path)
            failed = _read_kept(rnd.kept.path, rnd.dead_attempts)
            if failed is None or failed.num_rows != again:
                return Reason.ROW_FAILED, "rows failed again, and the driver could not read them"
            failures += again
            pending = failed
        for job in first.outputs:  # before the dead letters: should a merge fail, the phase
            # goes to tracked rounds with nothing of this path left in the FT layer
            self._merge(job, [o for r in self.rounds for o in r.outputs if o.name == job.name])
        dead = pending.num_rows
        if dead:  # failed on every attempt: dead-lettered with their last error
            self._dead_letter(pending, source.index, payload)
            failures -= dead * attempts  # the FT layer counts theirs
            replays -= dead * (attempts - 1)
        ctx.fast_records -= dead  # counted by the FT layer, which holds their dead letters
        ctx.kept_failed += failures
        ctx.kept_replayed += replays
        report.kept_records += expected
        return None

    def _frame(self, rows: pa.Table, path: str, source: Source) -> Any:
        """The replayed rows as the executors read them (a Parquet file in the work
        directory): the source's payload, then ``_ft_src``."""
        import pyarrow.parquet as pq
        from pyspark.sql.types import LongType, StructField, StructType

        os.makedirs(path, exist_ok=True)
        pq.write_table(rows, os.path.join(path, "part-0.parquet"))
        schema = StructType([*source.schema.fields, StructField(SRC, LongType(), False)])
        return self.ctx.spark.read.schema(schema).parquet(path)

    def _dead_letter(self, rows: pa.Table, source: int, payload: list[str]) -> None:
        """Records that failed every attempt: persisted in the FT layer and failed there until
        it dead-letters them (their payload and last error in its dead-letter table)."""
        client = self.ctx.client
        reasons = rows.column(REASON).to_pylist()
        persisted = client.persist(rows.select(payload), source=source, partition=0)
        src = np.asarray(persisted, dtype=np.uint64)
        for reason in sorted(set(reasons)):
            ids = src[np.asarray([r == reason for r in reasons])]
            for _ in range(int(self.ctx.config.max_attempts) + 1):
                if not len(ids):
                    break
                ids = np.asarray(client.fail(ids, reason=reason), dtype=np.uint64)

    def _merge(self, job: FastOutput, extra: list[FastOutput]) -> None:
        """The replay rounds' share of one output merged into the first round's."""
        from .optimistic import observed
        from .outputs import Aggregate

        if not extra:
            return
        spark = self.ctx.spark
        if extra[-1].premerged:  # the last replay round wrote every round's rows, merged
            from .optimistic import move_dir, remove_dir

            move_dir(spark, extra[-1].path, job.path, replace=True)
            for out in extra[:-1]:
                remove_dir(spark, out.path)
            job.merged_rows = int((observed(extra[-1].rows) or {}).get("rows", 0))
            return
        if type(job.barrier) is Aggregate:
            self._merge_groups(job, extra)
            return
        for out in extra:
            _move_parts(spark, out.path, job.path)
            got = observed(out.rows) if out.rows is not None else None
            if got is not None and "rows" in got:
                job.extra_rows += int(got["rows"])

    def _merge_groups(self, job: FastOutput, extra: list[FastOutput]) -> None:
        """An aggregate's rows from every round, merged by key (a sum of counts and sums, a
        min of minimums, a max of maximums), rewritten in place."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from .optimistic import move_dir, observed, remove_dir

        spark = self.ctx.spark
        assert job.barrier is not None
        schema = job.frame.schema
        df = spark.read.schema(schema).parquet(job.path, *[o.path for o in extra])
        merged = merged_groups(job.barrier, df)
        if job.sink is None:  # read by the next phase: merged in its job, not written here
            job.merged_frame = merged
            return
        counted = Observation()
        merged = merged.observe(counted, F.count(F.lit(1)).alias("rows"))
        tmp = job.path + "-merged"
        merged.write.mode("overwrite").parquet(tmp)
        remove_dir(spark, job.path)
        move_dir(spark, tmp, job.path, replace=True)
        for out in extra:
            remove_dir(spark, out.path)
        job.merged_rows = int((observed(counted) or {}).get("rows", 0))

    def _discard(self) -> None:
        from .optimistic import remove_dir

        for rnd in self.rounds:
            for job in rnd.outputs:
                remove_dir(self.ctx.spark, job.path)

    def _clean(self) -> None:
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)


def merged_groups(node: Any, df: Any) -> Any:
    """An aggregate's rows from several rounds (``df``: in the columns its sink writes, the
    keys and the aggregates among them) merged by key: a sum of counts and sums, a min of
    minimums, a max of maximums."""
    from pyspark.sql import functions as F

    from .barrier import combining_plan

    plan = combining_plan(node.spec, node.parents[0].schema, node.schema, global_ok=True)
    assert plan is not None
    keys = list(node.spec.keys)
    parts = df.select(
        *[F.col(q(k)) for k in keys],
        *[F.col(q(p.name)).alias(f"_ft_p{i}") for i, p in enumerate(plan)],
    )
    merged = parts.groupBy(*[F.col(q(k)) for k in keys]).agg(
        *[p.merge(i) for i, p in enumerate(plan)]
    )
    return select_expr(merged, map(q, df.schema.fieldNames()))


def _premergeable(job: FastOutput) -> bool:
    """Whether a replay round writes this output of the first round merged with it: an
    aggregate written into its native sink's staging (not read by a later phase)."""
    from .outputs import Aggregate

    return type(job.barrier) is Aggregate and job.sink is not None and not job.src


def premerge(spark: Any, outputs: list[FastOutput], merge: dict[str, str]) -> None:
    """A replay round's aggregates named in ``merge`` written merged, by key, with the rows
    already written at its path (the rounds before), in the replay round's own job: one Spark
    job fewer per replay round. The merged rows are counted as they are written (``rows``);
    the round's events are observed before the merge, as in any round."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    for job in outputs:
        base = merge.get(job.name)
        if base is None or not _premergeable(job):
            continue
        schema = job.frame.schema
        both = spark.read.schema(schema).parquet(base).union(job.frame)
        counted = Observation()
        job.frame = merged_groups(job.barrier, both).observe(
            counted, F.count(F.lit(1)).alias("rows")
        )
        job.rows = counted
        job.premerged = True


def _move_parts(spark: Any, src: str, dst: str) -> None:
    """Move the data files of the Parquet directory ``src`` into ``dst`` (Spark names them
    with its write job's id: no two writes share a name) and delete ``src``."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path
    s, d = path(src), path(dst)
    fs = d.getFileSystem(conf)
    if not fs.exists(s):
        raise OSError(f"a replay round's output {src} is missing")
    if not fs.exists(d):
        fs.mkdirs(d)
    for status in fs.listStatus(s):
        name = status.getPath().getName()
        if name.startswith(("_", ".")):
            continue
        if not fs.rename(status.getPath(), path(d, name)):
            raise OSError(f"could not move {status.getPath()} into {dst}")
    fs.delete(s, True)


__all__ = [
    "KEEP",
    "SHARE",
    "SLACK",
    "Keeper",
    "candidate",
    "kept_rows",
    "merged_groups",
    "premerge",
]
