"""How a batch run will run each phase, from the plan alone (``explain()``'s words): an
optimistic round (one that can keep its work when rows fail, one fused into an earlier
phase's, one of Spark's own operations only) or tracked rounds, and why."""

from __future__ import annotations

from . import kept as kept_mod
from . import optimistic_round as rounds
from .context import RunContext
from .optimistic_round import OptimisticRound, fusable, round_phases
from .round_plan import native_only, round_writes


def how_phase_runs(ctx: RunContext, phase: int) -> str:
    """How a batch run will run ``phase`` (``explain()``'s words), from the plan alone: before
    it runs, a round's outcome is unknown, so an optimistic round says what follows a fall
    back."""
    sources = [s for s in ctx.plan.sources if s.phase == phase]
    if phase > 0 and sources and all(ctx.plan.direct(s) for s in sources):
        return "no rounds of its own: the barrier's output goes straight to its native sinks"
    if fusable(ctx, phase):
        head = phase - 1
        while fusable(ctx, head):
            head -= 1
        return (
            f"in phase {head}'s optimistic round, the same Spark job (should that round fall "
            "back: an optimistic round of its own, tracked rounds if it falls back)"
        )
    note = OptimisticRound(ctx, phase).blocker()
    if phase > 0 and sources and all(round_writes(ctx, s) for s in sources):
        earlier = OptimisticRound(ctx, phase - 1).blocker()
        if earlier is None:
            then = "tracked rounds" if note is None else f"tracked rounds [{note.reason.value}]"
            return (
                f"written into its sink by phase {phase - 1}'s optimistic round ({then} if that "
                "round falls back)"
            )
    if note is None and rounds.NATIVE_PHASES and native_only(ctx, phase):
        return (
            "an optimistic round of Spark's own operations only (no record ids: its sources' "
            "rows counted, Spark's task accounting checked; tracked rounds if it falls back)"
        )
    if note is None:
        found = kept_mod.candidate(ctx, round_phases(ctx, phase, rounds.FUSE))
        if found is not None:
            return (
                f"an optimistic round (rows the stage {found[1].name!r} fails are replayed "
                "alone, in rounds of their own, and the rest of its work kept; tracked rounds "
                "if it falls back)"
            )
        return "an optimistic round (tracked rounds if it falls back)"
    return f"tracked rounds [{note.reason.value}] {note.detail}"


__all__ = ["how_phase_runs"]
