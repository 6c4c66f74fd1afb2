"""The barrier cascade: Storm's multi-anchoring across an aggregate. A row of an aggregate's
output is anchored to every input record behind it, so when that row is dead-lettered (a
poison row after the aggregation) those input records are failed with it: dead-lettered with
the reason ``cascade from <the row's error>``, and their contributions retracted from every
other group, sink and later barrier they reached — so every sink equals plain Spark over the
input records that are not dead-lettered.

A batch run (FT on) whose phases left a dead-lettered aggregate row:

1. **traces** the input records behind it (:func:`trace`): the aggregate's phase is built once
   more, as a tracked round on a scratch acker of its own (nothing of the run's acker, staging
   or sinks is touched), and the live rows reaching the aggregate with the dead row's group
   keys give the source records behind it; their payloads come back from the scratch acker.
   Behind an aggregate of a later phase the records found are rows of an earlier aggregate,
   traced in turn, down to the input records;
2. **voids** the pass: the rows it wrote into sinks written from Python are retracted (the
   attempts that wrote them were gathered while it ran: :func:`ids_param`), the native sinks
   are not published, the staging is removed;
3. runs again from the start over the input minus the records dead-lettered so far (the
   traced ones and those the pass dead-lettered itself), until a pass leaves no dead-lettered
   aggregate row (each pass removes at least one more record; at most :data:`MAX_PASSES`).

What cannot be made exact is refused with :class:`CascadeRefused`, when the dead-lettered row
is found (before any sink is published): a row of a tracked join, a ``limit`` or a time window,
a resumable job (``resume=True``: its passes would have to be resumable too), a sink written
from Python that cannot retract its rows, a stage that fails rows while the trace runs.

>>> MAX_PASSES
8
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .build import RoundBuilder, content_of
from .context import RunContext
from .lineage import KEEP, SRC, q
from .outputs import Aggregate, Barrier, PythonSinkNode, WindowAggregate
from .rows import Source
from .stages import ROUND_PROPERTY

log = logging.getLogger(__name__)

#: Passes of a run at most (each dead-letters at least one more input record).
MAX_PASSES = 8
#: The prefix of a cascaded record's dead-letter reason.
CASCADE = "cascade from "
_META = ("_ft_origin", "_ft_source", "_ft_attempts", "_ft_reason")


class CascadeRefused(RuntimeError):
    """A dead-lettered row of a barrier's output whose input records cannot be failed
    exactly (see :mod:`xorack.spark.cascade`)."""


def ids_param() -> Any:
    """A Spark ``AccumulatorParam`` gathering uint64 id arrays (the attempts whose rows a sink
    wrote) as a list, joined once read (:func:`gathered`)."""
    from pyspark.accumulators import AccumulatorParam

    class _Ids(AccumulatorParam):
        def zero(self, value: Any) -> Any:
            return []

        def addInPlace(self, a: Any, b: Any) -> Any:
            if isinstance(b, np.ndarray):
                a.append(b)
            else:
                a.extend(b)
            return a

    return _Ids()


def gathered(value: Any) -> np.ndarray:
    """The distinct ids an :func:`ids_param` accumulator gathered."""
    if not value:
        return np.empty(0, np.uint64)
    return np.unique(np.concatenate([np.asarray(v, np.uint64) for v in value]))


@dataclass
class Cascade:
    """What a voided pass leaves to the next: the dead letters it had (``letters``: input
    records and the dead-lettered barrier rows), the input records traced behind those rows
    (``cascaded``: their dead letters, reason ``cascade from ...``), and per input source the
    payload rows the next pass leaves out (both kinds)."""

    letters: list[pa.Table] = field(default_factory=list)
    cascaded: list[pa.Table] = field(default_factory=list)
    excluded: dict[int, list[pa.Table]] = field(default_factory=dict)
    causes: int = 0  # dead-lettered barrier rows
    records: int = 0  # input records dead-lettered by the pass itself
    traced: int = 0  # input records dead-lettered by the cascade
    passes: int = 0  # passes voided
    rounds: int = 0  # the rounds those passes ran
    seconds: float = 0.0  # their wall time

    def exclude(self, source: int, rows: pa.Table) -> None:
        if rows.num_rows:
            self.excluded.setdefault(source, []).append(rows)

    def merge(self, later: Cascade) -> None:
        """Add a later pass's cascade to this one (what every later pass leaves out)."""
        self.letters += later.letters
        self.cascaded += later.cascaded
        for source, tables in later.excluded.items():
            self.excluded.setdefault(source, []).extend(tables)
        self.causes += later.causes
        self.records += later.records
        self.traced += later.traced
        self.rounds += later.rounds
        self.seconds += later.seconds

    def dead_letters(self, last: pa.Table | None) -> pa.Table | None:
        """Every pass's dead letters, the cascaded records' included, and the last pass's."""
        tables = [t for t in [*self.letters, *self.cascaded, last] if t is not None]
        tables = [t for t in tables if t.num_rows] or tables[:1]
        return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _letters(ctx: RunContext, source: Source) -> pa.Table:
    table: pa.Table = ctx.client.dead_letters(source=source.index)
    return table


def find(ctx: RunContext) -> Cascade | None:
    """After a pass's phases: the cascade its dead-lettered barrier rows call for, or None
    when it has none (one stats call when nothing was dead-lettered)."""
    plan = ctx.plan
    derived = [s for s in plan.sources if s.derived is not None]
    if not derived or not int(ctx.client.stats().get("dead_lettered", 0)):
        return None
    dead = {s.index: _letters(ctx, s) for s in derived}
    dead = {i: t for i, t in dead.items() if t.num_rows}
    if not dead:
        return None
    found = Cascade()
    for s in plan.sources:  # the pass's own dead letters: left out of the trace too
        if s.derived is None:
            own = _letters(ctx, s)
            if own.num_rows:
                found.letters.append(own)
                found.exclude(s.index, _payload(own))
                found.records += own.num_rows
    inputs = {
        s.index: exclude(ctx, s, ctx.source_input(s), found.excluded[s.index])
        for s in plan.sources
        if s.derived is None and s.index in found.excluded
    }
    seen: set[tuple[int, str]] = set()  # rows behind an earlier dead row: cascaded once
    for source in derived:
        rows = dead.get(source.index)
        if rows is None:
            continue
        _check(ctx, source.derived, rows)
        found.letters.append(rows)
        found.causes += rows.num_rows
        for origin, letter in _reasons(rows):
            traced = trace(ctx, source.derived, letter, CASCADE + origin, inputs)
            for index, behind in traced.items():
                roots = _unseen(index, behind, seen)
                if not roots.num_rows:
                    continue
                found.cascaded.append(roots)
                found.exclude(index, _payload(roots))
                found.traced += roots.num_rows
    return found


def _unseen(index: int, roots: pa.Table, seen: set[tuple[int, str]]) -> pa.Table:
    """The rows of ``roots`` whose content no earlier trace found (equal rows are found
    together: the records of one trace all stay), ``seen`` updated."""
    keys = [(index, repr(sorted(r.items()))) for r in _payload(roots).to_pylist()]
    fresh = [k not in seen for k in keys]
    seen.update(keys)
    return roots if all(fresh) else roots.filter(pa.array(fresh))


def _payload(letters: pa.Table) -> pa.Table:
    return letters.drop_columns([c for c in _META if c in letters.schema.names])


def _reasons(rows: pa.Table) -> list[tuple[str, pa.Table]]:
    """The dead rows grouped by their reason (each group traced once)."""
    reasons = rows.column("_ft_reason").to_pylist()
    out = []
    for reason in dict.fromkeys(reasons):
        mask = pa.array([r == reason for r in reasons])
        out.append((str(reason), rows.filter(mask)))
    return out


def _check(ctx: RunContext, barrier: Barrier, rows: pa.Table) -> None:
    """Refuse what the cascade cannot make exact, naming the row and the reason."""
    first = rows.column("_ft_reason")[0].as_py()
    where = f"{rows.num_rows} dead-lettered row(s) of {barrier.name!r}'s output ({first})"
    _traceable(barrier, where)
    if ctx.config.resume:
        raise CascadeRefused(
            f"{where}: failing the input records behind it runs the job again from its start, "
            "which a resumable job (resume=True) cannot do yet: run it with resume=False, or "
            "make the stage after the aggregate not fail the row"
        )
    for sink in ctx.plan.python_sinks():
        if not sink.caps.retractable:
            raise CascadeRefused(
                f"{where}: failing the input records behind it retracts the rows this run "
                f"wrote, which sink {sink.name!r} cannot do (no retract(src_ids))"
            )


def _traceable(barrier: Barrier, where: str) -> None:
    """Refuse a barrier whose rows' input records cannot be traced (but an aggregate's)."""
    if not isinstance(barrier, Aggregate) or isinstance(barrier, WindowAggregate):
        raise CascadeRefused(
            f"{where}: the input records behind a row of a {barrier.label} cannot be failed "
            "exactly (only an aggregate's can): make the stage after it not fail the row, or "
            "filter the bad input out before p.source()"
        )


# ---- tracing the input records behind barrier rows -------------------------------------------


def trace(
    ctx: RunContext, barrier: Barrier, rows: pa.Table, reason: str, inputs: dict[int, Any]
) -> dict[int, pa.Table]:
    """The input records behind ``rows`` (dead letters of ``barrier``'s output: payload +
    dead-letter columns), per input source index: their payloads as dead letters with
    ``reason``. Runs ``barrier``'s phase as one tracked round on a scratch acker (memory
    storage, one attempt) over the run's inputs of that phase (``inputs``: those replaced,
    the records the run dead-lettered left out): the records whose rows reach the barrier
    with the dead rows' group keys are the ones behind them."""
    _traceable(barrier, f"{rows.num_rows} row(s) of {barrier.name!r}'s output behind {reason!r}")
    assert isinstance(barrier, Aggregate)
    phase = barrier.parents[0].phase
    scratch = _scratch(ctx)
    try:
        fresh = {}
        for s in ctx.plan.sources:
            df = inputs.get(s.index, ctx.source_input(s))
            if s.phase == phase and df is not None:
                fresh[s.index] = df
        sc = ctx.spark.sparkContext
        # a stage's transient failure (first attempts) is not what the trace looks for
        sc.setLocalProperty(ROUND_PROPERTY, str(ctx.config.max_attempts - 1))
        work = RoundBuilder(scratch, fresh, replays_wanted=False).build()
        (staging,) = ctx.of(barrier).staging
        frame = next(df for st, df in work.staged if st is staging)
        found = _behind(ctx, frame, barrier, rows)
        stats = scratch.client.stats()
        if int(stats.get("failed", 0)) or int(stats.get("orphans", 0)):
            raise CascadeRefused(
                f"tracing the input records behind {rows.num_rows} dead-lettered row(s) of "
                f"{barrier.name!r}'s output: a stage failed rows while tracing ({reason}); the "
                "records behind the row cannot be known exactly"
            )
        out: dict[int, pa.Table] = {}
        if not len(found):
            return out
        scratch.client.fail(found, reason=reason)
        for s in ctx.plan.sources:
            if s.phase != phase:
                continue
            got = scratch.client.dead_letters(source=s.index)
            if not got.num_rows:
                continue
            if s.derived is None:
                out[s.index] = got
                continue
            # rows of an earlier barrier: the input records behind them, in turn
            for index, roots in trace(ctx, s.derived, got, reason, inputs).items():
                out[index] = (
                    pa.concat_tables([out[index], roots], promote_options="permissive")
                    if index in out
                    else roots
                )
        return out
    finally:
        ctx.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, None)
        scratch.stop_service()


def _scratch(ctx: RunContext) -> RunContext:
    """A run context over the same plan and node runs (staging places, barrier outputs) with
    an acker of its own: memory storage, one attempt, embedded."""
    config = dataclasses.replace(
        ctx.config,
        storage="memory",
        max_attempts=1,
        service=None,
        job=None,
        ackers=1,
        resume=False,
    )
    scratch = RunContext(config, ctx.plan)
    scratch._nodes = ctx._nodes  # read only: the staging places and the barrier outputs
    scratch.start_service()
    return scratch


def _behind(ctx: RunContext, frame: Any, barrier: Aggregate, rows: pa.Table) -> np.ndarray:
    """The attempt ids (of the scratch acker) of the live rows of ``frame`` (the barrier's
    input) that fall in the groups of ``rows``: every row of a global aggregate."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    from .ids import u64

    live = frame.where(F.col(KEEP))
    keys = list(barrier.spec.keys)
    if keys:
        types = {f.name: f.dataType for f in barrier.schema.fields}
        named = [f"_ft_k{i}" for i in range(len(keys))]
        table = pa.table([rows.column(k) for k in keys], names=named)
        schema = StructType(
            [StructField(n, types[k], True) for k, n in zip(keys, named, strict=True)]
        )
        dead = ctx.spark.createDataFrame(table, schema=schema).distinct()
        cond = None
        for k, n in zip(keys, named, strict=True):
            c = F.col(q(k)).eqNullSafe(F.col(n))
            cond = c if cond is None else cond & c
        live = live.join(F.broadcast(dead), cond, "left_semi")
    got = live.select(SRC).distinct().toArrow()
    return u64(got.column(SRC)) if got.num_rows else np.empty(0, np.uint64)


# ---- leaving the records out of the next pass --------------------------------------------------


def exclude(ctx: RunContext, source: Source, df: Any, tables: list[pa.Table]) -> Any:
    """``df`` (a source's input) without the rows equal to one of ``tables`` (payloads of
    records dead-lettered by an earlier pass): a broadcast anti-join, null-safe on every
    column (a map compared as its entries sorted by key)."""
    from pyspark.sql import functions as F

    cols = list(source.columns)
    fields = {f.name: f.dataType for f in source.schema.fields}
    table = pa.concat_tables([t.select(cols) for t in tables], promote_options="permissive")
    gone = ctx.spark.createDataFrame(table, schema=source.schema)
    named = [f"_ft_x{i}" for i in range(len(cols))]
    gone = gone.select(
        *[content_of(F.col(q(c)), fields[c]).alias(n) for c, n in zip(cols, named, strict=True)]
    ).distinct()
    cond = None
    for c, n in zip(cols, named, strict=True):
        same = content_of(F.col(q(c)), fields[c]).eqNullSafe(F.col(n))
        cond = same if cond is None else cond & same
    return df.join(F.broadcast(gone), cond, "left_anti")


def void(ctx: RunContext, written: np.ndarray) -> int:
    """Retract from every sink written from Python the rows of the pass (``written``: the
    attempts that wrote them); returns the rows removed."""
    lost = np.asarray(ctx.lost_round_srcs, dtype=np.uint64)
    ids = np.unique(np.concatenate([np.asarray(written, np.uint64), lost]))
    removed = 0
    for sink in ctx.plan.python_sinks():
        if len(ids):
            removed += int(sink.sink.retract(ids))
    return removed


def writes_python_sinks(ctx: RunContext) -> bool:
    """Whether a cascade could need to retract what this run writes from Python: an
    aggregate's output is tracked (a phase of its own), and a sink is written from Python."""
    plan = ctx.plan
    tracked = any(s.derived is not None and not plan.direct(s) for s in plan.sources)
    return tracked and any(isinstance(n, PythonSinkNode) for n in plan.nodes)


__all__ = [
    "CASCADE",
    "MAX_PASSES",
    "Cascade",
    "CascadeRefused",
    "exclude",
    "find",
    "gathered",
    "ids_param",
    "trace",
    "void",
    "writes_python_sinks",
]
