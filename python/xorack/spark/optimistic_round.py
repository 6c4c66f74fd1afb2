"""One optimistic round of a phase (the idea is in :mod:`xorack.spark.optimistic`): build it,
execute it (cancelled at a failed row), account for it, then accept or discard it.

>>> # done = OptimisticRound(ctx, phase).run(report)
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import kept as kept_mod
from . import ops, optimistic
from .barrier import JoinSpec
from .context import RunContext
from .guard import tally_param
from .join_ops import LookupJoin
from .lineage import EV, EVENT, KEEP, REC, SRC, q, select_expr
from .node import Node
from .outputs import Aggregate, Barrier, NativeSinkNode, PythonSinkNode, Sink
from .report import PhaseNote, Reason, RunReport
from .round_plan import native_only, round_writes
from .row_errors import RowGuard, row_error
from .rows import PythonStage, RowOperation, Source, tagged_schema
from .schema import empty_frame
from .stages import ROUND_PROPERTY
from .tagging import GROUP_XOR, DerivedTagger
from .tasks import executors, round_tasks

log = logging.getLogger(__name__)

#: Rows per partition of a barrier output that an optimistic round counted (a small output goes
#: on in fewer partitions than ``spark.sql.shuffle.partitions``: one task per partition costs a
#: Python worker's round trip per stage and sink).
ROWS_PER_PARTITION = 1 << 16


class NotOptimistic(Exception):
    """A phase's optimistic round cannot be built: it runs tracked (``note`` says why)."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class FastOutput:
    """One write of an optimistic round: a native sink's rows, a barrier's output, or both (a
    barrier read only by one native sink, or an aggregate read only by one Python sink: then
    ``src`` is the round's attempt id in that sink and ``frame`` its writers' summaries);
    ``rows`` counts a sink's rows as they are written."""

    name: str  # where the rows leave the phase (a sink's or a barrier's name)
    sink: Sink | None
    barrier: Barrier | None
    path: str
    frame: Any
    events: Any  # the observation of the XOR of the events the rows owe
    rows: Any = None
    src: int = 0
    summary: list[Any] = field(default_factory=list)  # a Python sink's, once written
    # a keeping round's replay rounds (xorack.spark.kept): the rows they added, or the rows of
    # the aggregate once merged
    extra_rows: int = 0
    merged_rows: int | None = None
    merged_frame: Any = None  # an aggregate's merged rows the next phase reads (not written)
    # a replay round's aggregate written merged with the rows it adds to (xorack.spark.kept)
    premerged: bool = False


class Observations:
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


class OptimisticBuilder:
    """Builds the Spark work of a phase's optimistic round: its sources tagged in the JVM
    (births observed), its operators' tracked translations (Python stages report to the
    round's accumulator), and one write where rows leave the phase."""

    def __init__(
        self,
        ctx: RunContext,
        phase: int,
        accumulator: Any,
        abort: str | None,
        kept: Any = None,
        replaced: dict[int, Any] | None = None,
        suffix: str = "",
    ) -> None:
        self.ctx = ctx
        self.phase = phase
        self.token = optimistic.RoundToken(accumulator, abort, kept)
        # a replay round's sources read from its kept rows instead (xorack.spark.kept), and
        # the suffix of its outputs' paths
        self.replaced = replaced or {}
        self.suffix = suffix
        self.outputs: list[FastOutput] = []
        self.births: list[tuple[Source, Any]] = []
        # sources whose rows a Python stage tags, and the accumulator counting them
        self.stage_births: list[tuple[Source, Any]] = []
        self._born: dict[int, tuple[Any, int]] = {}  # sources whose ids a Python stage draws
        # branch points: the observation of their fan-out events, and each reader's copy
        self.tees: list[tuple[Node, Any]] = []
        # lookup joins: the observations of what their input rows owe and of their output's
        # births (:meth:`lookup_join`)
        self.joins: list[tuple[Node, Any]] = []
        # Python stages whose input's ghosts the JVM dropped: the observation of what they owe
        self.ghosts: list[tuple[Node, Any]] = []
        self._copies: dict[int, dict[int, Any]] = {}
        # filters applied as their source's rows were tagged (:func:`optimistic.tag_source`)
        self.prefiltered: set[int] = set()
        # barrier outputs that the same round computes in an earlier phase (not written):
        # their rows go on in Spark's own partitioning (see :meth:`OptimisticRound._fuse`)
        self.fused: set[int] = set()
        # its barrier outputs that a later phase of the round reads (not written: accounted)
        self.inner: list[FastOutput] = []
        # every node of the phase is Spark's own (:func:`native_only`): no record ids, the
        # sources' rows counted
        self.plain = NATIVE_PHASES and native_only(ctx, phase)

    def build(self) -> None:
        built: dict[int, Any] = {}
        ctx = self.ctx
        for node in ctx.plan.phase_nodes(self.phase, skip=lambda s: ctx.of(s).written):
            inputs = [self._input(built, p, node) for p in node.parents]
            if node.parents and all(x is None for x in inputs):
                continue
            df = node.optimistic(self, inputs)
            if df is not None and len(ctx.plan.readers(node)) > 1 and not self.plain:
                self._copies[id(node)] = self.tee(node, df)
            built[id(node)] = df

    def _input(self, built: dict[int, Any], parent: Node, node: Node) -> Any:
        """``parent``'s frame as ``node`` reads it (its own copy after a branch point)."""
        copies = self._copies.get(id(parent))
        return built.get(id(parent)) if copies is None else copies[id(node)]

    def tee(self, node: Node, df: Any) -> dict[int, Any]:
        """A branch point's rows, one copy per reader (by the reader's identity), computed in
        the JVM and not materialized: Spark computes ``df`` once per reader, as plain Spark
        would (:func:`~xorack.spark.node.branch_blocker` makes sure each time gives the same
        rows with the same ids). Reader ``j``'s copy of a live row is a child record with its
        own id ``c_j = xxhash64(salt, rec, j)``, no pending event, no ghost: a fresh source's
        row for the reader. What the branch point's rows owe — each row's pending event, a
        live row's ack and its children's ids ``c_0 ^ … ^ c_(k-1)`` — is XORed once, by an
        observation on ``df`` (Spark reports one evaluation of it; they are all alike). A copy
        lost or doubled on its way to a sink leaves its ``c_j`` uncancelled, so the round
        stays exactly accounted."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        readers = self.ctx.plan.readers(node)
        salt = optimistic.round_salt(f"{node.name}/tee")
        child = [f"xxhash64({salt}L, {REC}, {j})" for j in range(len(readers))]
        owed = f"({EVENT} ^ CASE WHEN {KEEP} THEN {' ^ '.join(child)} ELSE 0L END)"
        seen = Observation()
        self.tees.append((node, seen))
        live = df.observe(seen, F.expr(f"bit_xor({owed})").alias("x")).where(F.col(KEEP))
        payload = [q(c) for c in node.columns]
        return {
            id(reader): select_expr(
                live, [*payload, SRC, f"{child[j]} AS {REC}", f"0L AS {EV}", f"true AS {KEEP}"]
            )
            for j, reader in enumerate(readers)
        }

    def lookup_join(self, node: RowOperation, op: LookupJoin, df: Any) -> Any:
        """An inner or left lookup join (with an untracked DataFrame) as plain Spark runs it:
        the input's live rows joined with the other side by Spark's own join of that type (so
        Spark picks plain Spark's strategy, a broadcast of either side included). Each output
        row is a new record of the round, its id ``xxhash64(salt, parent id, xxhash64(its
        other-side columns))``: the same rows get the same ids however often Spark computes
        them. What the input's rows owe (a row's pending event, a live row's ack) is XORed by
        an observation on the input, the output rows' births by one on the output. The round
        is one XOR tree checked at its end, so no output row need carry a sibling's id (the
        chain of :func:`~xorack.spark.lineage.fan_out`, which a tracked round's per-record
        acking needs), nor the other side a numbering of its rows (a window over it: a shuffle
        and a sort per round). An output row lost on its way to a sink or a barrier leaves its
        birth uncancelled; Spark's join itself is trusted, as its aggregates are. Two equal
        rows of the other side make a parent's two children one id: their births and acks
        cancel in pairs, so losing one of them is still seen."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        owed, born = Observation(), Observation()
        self.joins += [(node, owed), (node, born)]
        payload = list(node.parents[0].columns)
        live = optimistic.staged(df, owed).where(F.col(KEEP))
        live = select_expr(live, [*map(q, payload), SRC, REC])
        joined = live.join(op.other, on=list(op.on), how=op.how)
        right = [c for c in op.other.columns if c not in op.on]
        content = f"xxhash64({', '.join(map(q, right))})" if right else "0L"
        salt = optimistic.round_salt(f"{node.name}/join")
        child = f"xxhash64({salt}L, {REC}, {content}) AS {REC}"
        tagged = select_expr(joined, [*map(q, node.columns), SRC, child]).observe(
            born, F.expr(f"bit_xor({REC})").alias("x")
        )
        return select_expr(
            tagged, [*map(q, node.columns), SRC, REC, f"0L AS {EV}", f"true AS {KEEP}"]
        )

    def add_output(self, out: FastOutput) -> None:
        self.outputs.append(out)

    def source(self, node: Source) -> Any:
        ctx = self.ctx
        df = ctx.source_input(node)
        if df is None or ctx.plan.direct(node):
            return None
        prepared = df if id(node) in self.fused else node.prepare(df, ctx)
        prepared = self.replaced.get(id(node), prepared)
        if self.plain:  # its rows counted, no ids: nothing in the phase could lose one
            from pyspark.sql import Observation
            from pyspark.sql import functions as F

            apart = optimistic.counted_apart(node, df, id(node) in self.replaced)
            if apart is not None:  # counted apart from the round: its filters reach the scan
                self.births.append((node, apart))
                return prepared
            counted = Observation()
            self.births.append((node, counted))
            return prepared.observe(counted, F.count(F.lit(1)).alias("n"))
        salt = optimistic.round_salt(node.name)
        if ctx.plan.births_in_stage(node):
            # its rows go straight into a Python stage, which draws their ids there and counts
            # them: no ids and no observed metric in the JVM (an observed metric splits the
            # generated code of the stage it is in)
            count = ctx.spark.sparkContext.accumulator(0)
            self.stage_births.append((node, count))
            self._born[id(node)] = (count, salt)
            return prepared
        from pyspark.sql import Observation

        seen = Observation()
        self.births.append((node, seen))
        found = node.first_filter(ctx.plan)
        if found is not None:
            alone, op, qualifier = found
            self.prefiltered.add(id(alone))
            keep = ops.condition(op.cond)
            apart = optimistic.counted_apart(node, df, id(node) in self.replaced)
            if apart is not None:  # the filter reaches the scan; its rows are counted apart
                self.births[-1] = (node, optimistic.CountedApart(seen, apart))
            return optimistic.tag_source(
                prepared, salt, node.index, seen, keep, qualifier, filter_first=apart is not None
            )
        return optimistic.tag_source(prepared, salt, node.index, seen)

    def stage(self, node: PythonStage, df: Any) -> Any:
        parent = node.parents[0]
        born = self._born.get(id(parent))
        if (
            GHOSTS_BEFORE_STAGES
            and isinstance(parent, RowOperation)
            and id(parent) not in self.prefiltered
            and len(self.ctx.plan.readers(parent)) == 1
        ):
            df, seen = optimistic.without_ghosts(df)
            self.ghosts.append((node, seen))
        return node.frame(self.ctx, df, round_xor=self.token, born=born)

    # ---- where rows leave the phase ----------------------------------------------------------
    # The events the rows owe are XORed on the way: per group inside an aggregation (the
    # group's rows are read there anyway; ghosts form groups of their own, left out of the
    # output), else by an observed metric over the rows.

    def sink_output(self, node: NativeSinkNode, df: Any) -> FastOutput:
        """A native sink's live rows, into its staging directory (published at the end)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        path = os.path.join(node.sink.staging_dir, "optimistic" + self.suffix)
        if self.plain:  # payload rows only: their count for the report
            rows = Observation()
            out = select_expr(df, map(q, node.columns))
            out = out.observe(rows, F.count(F.lit(1)).alias("rows"))
            return FastOutput(node.name, node, None, path, out, Observations([]), rows)
        events = Observation()
        out = optimistic.staged(df, events).where(F.col(KEEP))
        out = select_expr(out, map(q, node.columns))
        return FastOutput(node.name, node, None, path, out, events, events)

    def aggregate_output(self, node: Aggregate, df: Any) -> FastOutput:
        """An aggregate computed by Spark's own operator from the live rows, the XOR of each
        group's events on the way."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        spec = node.spec
        if self.plain:  # Spark's own aggregate of the payload rows, its output rows counted
            counted = Observation()
            out = spec.compute([df]).observe(counted, F.count(F.lit(1)).alias("rows"))
            return self._barrier_output(node, out, counted, counted=True)
        xor = F.expr(f"bit_xor({EVENT})").alias(GROUP_XOR)
        if any(ops.reads_star(e) for e in spec.exprs):  # it would read the lineage too
            raise NotOptimistic(
                Reason.AGGREGATE_READS_STAR, f"the aggregate {node.name!r} reads `*`"
            )
        if not spec.keys:  # a global aggregate: one row, even when no live row reaches it
            events = Observation()
            live = optimistic.staged(df, events).where(F.col(KEEP))
            out = select_expr(live, map(q, node.parents[0].columns)).groupBy().agg(*spec.exprs)
            return self._barrier_output(node, out, events, counted=False)
        grouped = df.groupBy(*spec.keys, KEEP).agg(*spec.exprs, xor)
        got = [fl for fl in grouped.schema.fields if fl.name not in (KEEP, GROUP_XOR)]
        if [(fl.name, fl.dataType.simpleString()) for fl in got] != [
            (fl.name, fl.dataType.simpleString()) for fl in node.schema.fields
        ]:  # an expression read the lineage columns too (not as a `*` we can see)
            raise NotOptimistic(
                Reason.AGGREGATE_READS_LINEAGE,
                f"the aggregate {node.name!r} reads more than its payload columns",
            )
        derived = self.ctx.plan.derived_source(node)
        readers = self.ctx.plan.readers(derived)
        if round_writes(self.ctx, derived):  # the groups' events XORed in Python
            groups = select_expr(grouped, [*map(q, node.columns), KEEP, GROUP_XOR])
            reader = readers[0]
            assert isinstance(reader, PythonSinkNode)
            return self._round_sink_output(derived, reader, groups)
        # the XOR of the groups' events, and the output's rows (the live groups)
        events = Observation()
        counts = [
            F.expr(f"bit_xor({GROUP_XOR})").alias("x"),
            F.expr(f"count_if({KEEP})").alias("rows"),
        ]
        grouped = grouped.observe(events, *counts)
        out = select_expr(grouped.where(F.col(KEEP)), map(q, node.columns))
        return self._barrier_output(node, out, events, counted=True)

    def join_output(self, node: Barrier, inputs: list[Any]) -> FastOutput:
        """A barrier's Spark operator (a join of two tracked frames, a limit) over its inputs'
        live rows, each input's events observed."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        lives, seen = [], []
        spec = node.spec
        for x, par in zip(inputs, node.parents, strict=True):
            if x is None:  # no rows from that side this round
                lives.append(empty_frame(self.ctx.spark, par.schema))
                continue
            if self.plain:  # payload rows only
                lives.append(x)
                continue
            seen.append(Observation())
            x = optimistic.staged(x, seen[-1])
            lives.append(select_expr(x.where(F.col(KEEP)), map(q, par.columns)))
        out = spec.compute(lives)
        if isinstance(spec, JoinSpec) and spec.cartesian(out):
            raise NotOptimistic(
                Reason.CARTESIAN,
                f"Spark plans the join {node.name!r} as a cartesian product, which computes "
                "each side again per partition of the other (the round would count its rows "
                "again)",
            )
        return self._barrier_output(node, out, Observations(seen), counted=False)

    def _barrier_output(self, node: Barrier, out: Any, events: Any, counted: bool) -> FastOutput:
        """A barrier's output, written straight into the staging of the one native sink that
        alone reads it, else for the next phase. ``counted``: ``events`` counts the rows."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        ctx = self.ctx
        derived = ctx.plan.derived_source(node)
        readers = ctx.plan.readers(derived)
        if not (ctx.plan.direct(derived) and len(readers) == 1):
            assert ctx.workdir is not None  # set by the run with FT on
            path = os.path.join(ctx.workdir, node.name, "fast" + self.suffix)
            return FastOutput(node.name, None, node, path, out, events)
        sink = readers[0]
        assert isinstance(sink, NativeSinkNode)
        if list(sink.columns) != list(node.columns):
            out = select_expr(out, map(q, sink.columns))
        path = os.path.join(sink.sink.staging_dir, "optimistic" + self.suffix)
        if counted:
            return FastOutput(node.name, sink, node, path, out, events, events)
        rows = Observation()
        out = out.observe(rows, F.count(F.lit(1)).alias("rows"))
        return FastOutput(node.name, sink, node, path, out, events, rows)

    def _round_sink_output(self, derived: Source, sink: PythonSinkNode, groups: Any) -> FastOutput:
        """An aggregate's output written by the round into the Python sink that alone reads it
        (the next phase folded into the round). ``groups``: the aggregate's groups, ghosts'
        included, with the XOR of their rows' events (``_ft_x``), which the
        :class:`DerivedTagger` folds into the round's accumulator (no observed metric in the
        JVM) before it gives each live row the record id the output's tracked tagger would
        give it and the round's attempt id; the sink's writers ack them there."""
        ctx = self.ctx
        src = (int.from_bytes(os.urandom(8), "little") >> 1) or 1
        tagger = DerivedTagger(
            name=derived.name,
            source=derived.index,
            src=src,
            round_xor=self.token,
            deterministic=ctx.deterministic_ids,
            id_salt=ctx.config.id_salt,
        )
        tagged = groups.mapInArrow(tagger, tagged_schema(derived, True))
        frame = sink.frame(ctx, tagged, round_xor=self.token)
        barrier = derived.derived
        return FastOutput(barrier.name, sink, barrier, "", frame, None, src=src)


def fusable(ctx: RunContext, phase: int) -> bool:
    """Whether the plan lets an optimistic round of ``phase - 1`` take ``phase`` in (see
    :meth:`OptimisticRound._fuse`): every source of ``phase`` is a barrier output read once,
    by a node of the phase (not straight by native sinks, nor written by the round into a
    Python sink), the phase ends in one sink or barrier with no branch point before it, and
    both phases can run an optimistic round."""
    if not FUSE or phase <= 0:
        return False
    sources = [s for s in ctx.plan.sources if s.phase == phase]
    if not sources:
        return False
    for source in sources:
        if source.derived is None or ctx.plan.direct(source) or round_writes(ctx, source):
            return False
        if len(ctx.plan.readers(source)) != 1:
            return False
    # one output (one Spark job), no branch point: else each job would compute the barrier
    # outputs it reads, and all before them, again
    nodes = ctx.plan.phase_nodes(phase, skip=lambda s: ctx.of(s).written)
    if len([n for n in nodes if isinstance(n, (Sink, Barrier))]) != 1:
        return False
    if any(len(ctx.plan.readers(n)) > 1 for n in nodes):
        return False
    rounds = OptimisticRound(ctx, phase - 1), OptimisticRound(ctx, phase)
    return all(r.blocker() is None for r in rounds)


def round_phases(ctx: RunContext, phase: int, fuse: bool) -> list[int]:
    """The phases an optimistic round of ``phase`` runs, as far as the plan says (a fused
    round may stop earlier: :meth:`OptimisticRound._fuse`)."""
    phases = [phase]
    last = ctx.plan.phase_count() - 1
    while fuse and phases[-1] < last and fusable(ctx, phases[-1] + 1):
        phases.append(phases[-1] + 1)
    return phases


#: Whether a phase of Spark's own operations only (:func:`native_only`) runs its optimistic
#: round without record ids; False: every round draws them.
NATIVE_PHASES = True

#: Whether an optimistic round drops the ghosts of a native row operation's output in the JVM
#: before a Python stage reads it (:func:`~xorack.spark.optimistic.without_ghosts`); False: the
#: stage's worker drops them.
GHOSTS_BEFORE_STAGES = True

#: Whether an optimistic round takes the phases after its own into the same Spark job when
#: they can run one too (:meth:`OptimisticRound._fuse`); False: a round per phase.
FUSE = True


class OptimisticRound:
    """A phase run once as plain Spark would, acked as one XOR tree; with the phases after it
    when each reads only barrier outputs the round computes (:meth:`_fuse`)."""

    def __init__(
        self,
        ctx: RunContext,
        phase: int,
        fuse: bool | None = None,
        replace: dict[int, Any] | None = None,
        attempt: int = 0,
    ) -> None:
        self.ctx = ctx
        self.phase = phase
        self.fuse = FUSE if fuse is None else fuse
        self.group = f"xorack-optimistic-{os.urandom(6).hex()}"
        self.records: list[tuple[Source, int]] = []
        self.builders: list[OptimisticBuilder] = []
        self.abort: str | None = None  # where its runners say that a row failed
        # where its keeping stage writes the rows it failed (xorack.spark.kept), or None
        self.kept: kept_mod.KeptRows | None = None
        self.kept_source: Source | None = None  # the source whose rows it keeps
        # a replay round of a keeping round: its source's input (by the node's identity) is
        # the kept rows, and it runs as round ``attempt``
        self.replace = replace or {}
        self.attempt = attempt
        self._suffix = f"-replay{attempt}" if attempt else ""  # of its outputs' paths
        # the share of its records its keeping stage failed, once its keeping fell back (the
        # chunks of the tracked rounds that follow are sized from it), else None
        self.kept_rate: float | None = None
        # Spark's task accounting: the failed task attempts it retried (their ids: files they
        # wrote themselves are ignored), harmless (xorack.spark.tasks)
        self.retried = 0
        self.dead_attempts: set[int] = set()
        self.executors: set[str] | None = None  # Spark's executors when its jobs started

    @property
    def phases(self) -> list[int]:
        """The phases this round runs (its own, then those fused into it)."""
        return [b.phase for b in self.builders] or [self.phase]

    @property
    def inner(self) -> list[FastOutput]:
        """The barrier outputs the round computes and reads in a later phase of its own: their
        events are accounted, they are not jobs of their own."""
        return [job for b in self.builders for job in b.inner]

    @property
    def outputs(self) -> list[FastOutput]:
        """The round's writes (its jobs), every phase's."""
        return [job for b in self.builders for job in b.outputs]

    def blocker(self) -> PhaseNote | None:
        """Why the phase cannot run an optimistic round, or None when it can."""
        ctx, cfg = self.ctx, self.ctx.config

        def note(reason: Reason, detail: str) -> PhaseNote:
            return PhaseNote(self.phase, reason, detail)

        if not cfg.optimistic:
            return note(Reason.OPTIMISTIC_OFF, "optimistic=False")
        if cfg.resume:
            return note(Reason.RESUMABLE, "a resumable job runs tracked rounds")
        if ctx.on_replays is not None:
            return note(Reason.STREAMING, "streaming runs tracked rounds")
        if str(ctx.spark.conf.get("spark.speculation", "false")).lower() == "true":
            return note(
                Reason.SPECULATION,
                "speculative execution is on (a speculative copy of a task can count twice)",
            )
        skip = lambda s: ctx.of(s).written  # noqa: E731
        scope = ctx.plan.scope(self.phase, skip)
        for node in ctx.plan.phase_nodes(self.phase, skip):
            why = node.blocker(scope)
            if why is not None:
                return note(*why)
        return None

    def run(self, report: RunReport) -> bool:
        """Run the phase as one optimistic round; True when every record of it completed (its
        outputs are then in place for the next phase and the publish), False when it cannot
        run one or the round fell back (its outputs deleted; the reason reported)."""
        note = self.blocker()
        if note is None:
            try:
                self.builders = [self._build()]
            except NotOptimistic as e:
                note = PhaseNote(self.phase, e.reason, e.detail)
        if note is not None:
            if self.ctx.config.optimistic:
                report.note(note)
            return False
        if not self.outputs:
            return False  # nothing of this phase runs (its outputs go to native sinks)
        if self.fuse:
            self._fuse()
        why = self._verdict()
        keeper = None
        if why is None and self.kept is not None:  # rows it kept: replayed alone, merged
            keeper = kept_mod.Keeper(self)
            why = keeper.run(report)
        if why is not None and len(self.builders) > 1:
            return self._fused_fell_back(why, report)
        if why is not None:
            self._discard(report)
            self._fall_back(why, report)
            return False
        self._accept(report)
        replays = keeper.rounds if keeper is not None else []
        report.retried_tasks += self.retried + sum(r.retried for r in replays)
        report.rounds += len(self.builders)
        report.optimistic_rounds += len(self.builders)
        report.fused_phases += len(self.builders) - 1
        return True

    def replay(self, merge: dict[str, str] | None = None) -> tuple[Reason, str] | None:
        """Run as a keeping round's replay round (:class:`~xorack.spark.kept.Keeper`): built,
        fused as the first round was, executed and accounted; why it fell back, or None. Its
        outputs stay where they are for the keeper to merge (or delete); an aggregate named in
        ``merge`` is written merged with the rows at that path, in the round's own job."""
        try:
            self.builders = [self._build()]
        except NotOptimistic as e:
            return e.reason, e.detail
        if self.fuse:
            self._fuse()
        if merge:
            kept_mod.premerge(self.ctx.spark, self.outputs, merge)
        return self._verdict()

    def _verdict(self) -> tuple[Reason, str] | None:
        """Execute the round and account for it: why it falls back, or None."""
        why = self._execute()  # a row failed: the round was cancelled
        return why if why is not None else self._account().verdict()

    def _fall_back(self, why: tuple[Reason, str], report: RunReport) -> None:
        """Note why the phase's round fell back (its outputs discarded): its tracked rounds
        run next."""
        if why[0] is Reason.ROW_FAILED:  # its tracked rounds expect failed records
            rate = optimistic.failure_rate(self.abort) if self.abort else None
            if rate is None:
                rate = self.kept_rate
            self.ctx.rows_failed[self.phase] = rate
            if rate is not None:
                seen = f"about {rate:.2%}" if rate >= 1e-4 else "under 0.01 %"
                why = (why[0], f"{why[1]}; {seen} of its records fail")
        report.note(PhaseNote(self.phase, *why))
        log.info("phase %d: the optimistic round fell back: %s", self.phase, why[1])

    def _fused_fell_back(self, why: tuple[Reason, str], report: RunReport) -> bool:
        """A fused round that fell back: its outputs are deleted and its phases go again, a
        round each (the first of them that fails falls back to tracked rounds). When the
        first row that failed is a stage's of this round's own phase, that phase's round would
        fail it again: the phase goes to its tracked rounds at once."""
        failing = self._failing_phase(why)
        phases = self.phases
        self._discard(report)
        self._unfuse()
        self.builders, self.records = [], []
        report.fused_fallbacks += 1
        log.info("phases %s: the fused optimistic round fell back (%s)", phases, why[1])
        if failing == self.phase:
            self._fall_back(why, report)
            return False
        return OptimisticRound(self.ctx, self.phase, fuse=False).run(report)

    def _failing_phase(self, why: tuple[Reason, str]) -> int | None:
        """The phase of the stage whose row failed first in a round cancelled for it (the
        abort file's first line, ``stage NAME: reason``), else None (not known)."""
        if self.kept_rate is not None:  # its keeping stage failed rows: in its own phase
            return self.phase
        if why[0] is not Reason.ROW_FAILED or self.abort is None:
            return None
        line = optimistic.first_line(self.abort) or ""
        named = [
            n for n in self.ctx.plan.nodes if isinstance(n, PythonStage) and n.phase in self.phases
        ]
        hits = {n.phase for n in named if line.startswith(f"stage {n.name}: ")}
        return hits.pop() if len(hits) == 1 else None

    def _fuse(self) -> None:
        """Take the phases after this one into the round while the next reads nothing but
        barrier outputs the round computes, each read once (no branch point), can run an
        optimistic round itself, and writes one output (one Spark job): such a barrier
        output is not written for the next phase to read back, its rows go on in the same
        Spark job, born there as the next phase's records (their ids drawn in the JVM,
        observed as any source's). Plain Spark runs such a
        query as one job too. The round is still one XOR tree: the births of every phase
        against the events of every phase."""
        ctx = self.ctx
        last = ctx.plan.phase_count() - 1
        while self.builders[-1].phase < last:
            phase = self.builders[-1].phase + 1
            inner = self._inner_outputs(phase)
            if inner is None:
                return
            builder = OptimisticBuilder(
                ctx, phase, self.accumulator, self.abort, self.kept, self.replace, self._suffix
            )
            for job in inner:
                assert job.barrier is not None
                derived = ctx.plan.derived_source(job.barrier)
                ctx.of(derived).df = job.frame
                builder.fused.add(id(derived))
            try:
                builder.build()
            except NotOptimistic as e:
                log.info("phase %d: not fused into phase %d's round (%s)", phase, self.phase, e)
                self._unfuse(inner)
                return
            if len(builder.outputs) != 1 or builder.tees:
                # one job must compute the barrier outputs it reads: two jobs (two sinks, a
                # branch point) would compute them, and everything before them, twice (a
                # Python stage's events counted twice: the round would never balance)
                self._unfuse(inner)
                return
            for job in inner:
                for b in self.builders:
                    if job in b.outputs:
                        b.outputs.remove(job)
                        b.inner.append(job)
            self.builders.append(builder)
            log.info("phase %d: fused into phase %d's optimistic round", phase, self.phase)

    def _inner_outputs(self, phase: int) -> list[FastOutput] | None:
        """The round's barrier outputs that ``phase`` reads, when it reads nothing else and
        reads each of them once; else None (the phase is not fused)."""
        ctx = self.ctx
        if not fusable(ctx, phase):
            return None
        sources = [s for s in ctx.plan.sources if s.phase == phase]
        jobs = {id(job.barrier): job for job in self.outputs if job.barrier is not None}
        inner = []
        for source in sources:  # fusable(): each a barrier output, read once, not direct
            job = jobs.get(id(source.derived))
            if job is None or job.sink is not None or job.src:
                return None
            inner.append(job)
        return inner

    def _unfuse(self, inner: list[FastOutput] | None = None) -> None:
        """The barrier outputs fused into a later phase no longer feed it (a round that fell
        back, or a phase that could not be fused)."""
        for job in self.inner if inner is None else inner:
            assert job.barrier is not None
            self.ctx.of(self.ctx.plan.derived_source(job.barrier)).df = None

    def _build(self) -> OptimisticBuilder:
        ctx = self.ctx
        sc = ctx.spark.sparkContext
        ctx.tally = sc.accumulator({}, tally_param())
        ctx.round = self.attempt
        sc.setLocalProperty(ROUND_PROPERTY, str(self.attempt))
        assert ctx.workdir is not None  # set by the run with FT on
        # where a runner says at once that a row failed (the driver then cancels the round's
        # jobs); the executors see the driver's files on one machine, or with a shared workdir
        abort = None
        if os.path.isdir(ctx.workdir):
            abort = os.path.join(ctx.workdir, f"{self.group}.lost")
        self.abort = abort
        self.accumulator = sc.accumulator((0, 0), optimistic.round_param())
        self.kept = kept_mod.kept_rows(ctx, self, round_phases(ctx, self.phase, self.fuse))
        builder = OptimisticBuilder(
            ctx, self.phase, self.accumulator, abort, self.kept, self.replace, self._suffix
        )
        builder.build()
        return builder

    def _execute(self) -> tuple[Reason, str] | None:
        """Run the round's writes in a job group of their own (the verdict reads its tasks'
        failures, and a failed row cancels it); the reason when a failed row cancelled it."""
        ctx = self.ctx
        sc = ctx.spark.sparkContext
        previous = (
            sc.getLocalProperty("spark.jobGroup.id"),
            sc.getLocalProperty("spark.job.description"),
        )
        phases = ", ".join(map(str, self.phases))
        sc.setJobGroup(self.group, f"xorack: optimistic round of phase {phases}", False)
        self.executors = executors(sc)  # one lost during the round: it is not trusted
        ctx.optimistic_group = self.group
        abort = self.abort
        watch = (
            optimistic.AbortWatch(abort, lambda: sc.cancelJobGroup(self.group))
            if abort is not None
            else contextlib.nullcontext()
        )
        for builder in self.builders:  # the sources counted apart: beside the round's jobs
            for _, seen in builder.births:
                getattr(seen, "start", lambda: None)()
        try:
            with watch:
                for job in self.outputs:
                    if job.src:  # a Python sink's writers: their summaries
                        job.summary = job.frame.collect()
                    else:
                        job.frame.write.mode("overwrite").parquet(job.path)
        except Exception as exc:
            if abort is not None and os.path.exists(abort):
                first = optimistic.first_line(abort)
                return Reason.ROW_FAILED, f"a row failed ({first}); the round was cancelled"
            error = row_error(exc)
            if error is None:
                raise  # not a round this driver cancelled, nor a row's error: a real error
            # its tracked rounds fail the raising rows alone (a fused round's phases go again
            # a round each: which of them raised is not known)
            if len(self.builders) == 1:
                ctx.guarded[self.phase] = RowGuard(ctx.spark, error)
            return Reason.NATIVE_ROW_ERROR, f"a native expression raised on a row: {error.message}"
        finally:
            ctx.optimistic_group = None
            sc.setLocalProperty("spark.jobGroup.id", previous[0])
            sc.setLocalProperty("spark.job.description", previous[1])
        return None

    def _account(self) -> optimistic.RoundAccount:
        """What the round's metrics, accumulators and Spark's task accounting say."""
        sc = self.ctx.spark.sparkContext
        sinks = any(job.src for job in self.outputs)  # written from Python: no retry trusted
        tasks = round_tasks(sc, self.group, self.executors, python_sink=sinks)
        self.dead_attempts, self.retried = tasks.dead, tasks.retried
        account = optimistic.RoundAccount(
            task_failures=tasks.bad, task_reasons=tasks.reasons, retried=tasks.retried
        )
        for builder in self.builders:
            self.records += account.add_phase(builder)
        account.python, account.failed_rows = self.accumulator.value
        account.reasons = optimistic.reasons_of(dict(self.ctx.tally.value))
        return account

    def _discard(self, report: RunReport) -> None:
        """A round that falls back: its outputs are deleted, and the rows it wrote into Python
        sinks retracted once its tasks are over (again at the publish: a task the cancel had
        not stopped yet may have written after that)."""
        ctx = self.ctx
        for builder in self.builders:  # a count nothing will read
            for _, seen in builder.births:
                getattr(seen, "cancel", lambda: None)()
        jobs = self.outputs
        if any(job.src for job in jobs):
            optimistic.await_tasks(ctx.spark.sparkContext, self.group)
        for job in jobs:
            if job.src:
                assert job.sink is not None
                ctx.lost_round_srcs.append(job.src)
                report.retracted_rows += int(
                    job.sink.sink.retract(np.array([job.src], dtype=np.uint64))
                )
            else:
                optimistic.remove_dir(ctx.spark, job.path)

    def _accept(self, report: RunReport) -> None:
        """A complete round: its sinks' rows wait for the publish (a Python sink's are in place),
        its barriers' outputs are the next phase's sources, its records count as completed."""
        ctx = self.ctx
        for job in self.outputs:
            if job.src:  # the barrier's output is in its Python sink: its phase is done
                assert job.barrier is not None
                ctx.of(ctx.plan.derived_source(job.barrier)).written = True
                report.add_summaries(job.summary)
                ctx.fast_derived += sum(int(r.rows) for r in job.summary)
                continue
            if job.sink is not None:
                got = optimistic.observed(job.rows)
                ctx.of(job.sink).fast_out = job.path
                rows = None if got is None else got["rows"] + job.extra_rows
                ctx.of(job.sink).fast_rows = rows if job.merged_rows is None else job.merged_rows
            if job.barrier is not None:
                ctx.of(job.barrier).fast_out = job.path
                if job.sink is None:  # read by the next phase (or by several native sinks)
                    derived = ctx.of(ctx.plan.derived_source(job.barrier))
                    # with the schema it was written with: no Spark job to read a footer
                    derived.df = ctx.spark.read.schema(job.frame.schema).parquet(job.path)
                    if job.merged_frame is not None:  # with a keeping round's replays'
                        derived.df = job.merged_frame
                    # (a keeping round's merge adds rows to an aggregate's groups: a hint)
                    rows = (optimistic.observed(job.events) or {}).get("rows")
                    if rows is not None:  # a small output in few partitions, as Spark's
                        # adaptive execution would coalesce it (a task per partition costs)
                        wanted = -(-rows // ROWS_PER_PARTITION)
                        source = ctx.plan.derived_source(job.barrier)
                        derived.partitions = max(1, min(source.partitions, wanted))
        for node, n in self.records:
            if node.derived is None:
                ctx.fast_records += n
            else:
                ctx.fast_derived += n


__all__ = [
    "FastOutput",
    "NotOptimistic",
    "OptimisticBuilder",
    "OptimisticRound",
    "fusable",
    "round_phases",
    "round_writes",
]
