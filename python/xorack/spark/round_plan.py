"""What an optimistic round of a phase does with it, from the plan alone: whether it writes a
barrier's output straight into its Python sink, whether it runs Spark's own operations only.

>>> # round_writes(ctx, derived), native_only(ctx, phase)
"""

from __future__ import annotations

from .context import RunContext
from .outputs import Aggregate, Barrier, Limit, NativeSinkNode, PythonSinkNode, TrackedJoin
from .rows import RowOperation, Source, Union


def round_writes(ctx: RunContext, derived: Source) -> bool:
    """Whether an optimistic round writes ``derived`` (a barrier's output) straight into its
    one reader, a Python sink: the barrier is a keyed aggregate (its rows are distinct, so the
    ids the output's tracked tagger would give them do not depend on where they are: content
    ids, which its phase's tracked rounds draw unless that phase stages partial aggregates —
    then its first round draws ids by position), and the sink can retract the round's rows
    should it fall back."""
    readers = ctx.plan.readers(derived)
    if len(readers) != 1 or not isinstance(readers[0], PythonSinkNode):
        return False
    if derived.phase in ctx.partial_phases and ctx.deterministic_ids:
        return False
    caps = readers[0].caps
    return (
        caps.round_writable
        and caps.retractable
        and isinstance(derived.derived, Aggregate)
        and bool(derived.keys)
        and not any("." in c or "`" in c for c in derived.columns)
    )


def native_only(ctx: RunContext, phase: int) -> bool:
    """Whether every node an optimistic round of ``phase`` runs is one of Spark's own
    operations: sources, native row operations (joins with untracked DataFrames and generators
    included), unions, aggregates, tracked joins, limits and native sinks; no Python stage, no
    Python sink, no untracked ``transform``, no aggregate the round writes into a Python sink.

    Such a round draws no record ids. Between its sources and its outputs nothing but Spark's
    own operators, within one Spark job, touch the rows: the XOR of the events at the outputs
    would equal the XOR of the births at the sources by construction (Spark neither loses nor
    doubles a row inside a job it reports successful), so the sum would check nothing that
    Spark's task accounting does not: the round still falls back when a task failed or was
    retried, or a native expression raised on a row. Its sources' rows are counted (an
    observed metric) for the report. A row lost or doubled outside Spark's operators (a Python
    stage or sink, an untracked ``transform``) is what the XOR catches, and a phase holding one
    draws its ids as before."""
    for node in ctx.plan.phase_nodes(phase, skip=lambda s: ctx.of(s).written):
        if isinstance(node, Source):
            if node.derived is not None and round_writes(ctx, node):
                return False
        elif isinstance(node, Barrier):
            if type(node) not in (Aggregate, TrackedJoin, Limit):
                return False  # a stream's window, join or deduplication
            if round_writes(ctx, ctx.plan.derived_source(node)):
                return False
        elif not isinstance(node, (RowOperation, Union, NativeSinkNode)):
            return False
    return True


__all__ = ["native_only", "round_writes"]
