"""A repair's tracked joins: a repaired record meets the other side's rows that went through
before.

With ``A`` and ``B`` the two sides of an inner join, ``R_A``/``R_B`` the rows of the records a
repair runs (the dead letters not repaired yet) and ``OK_A``/``OK_B`` those of the records the
job completed, the job's sinks hold ``OK_A ⋈ OK_B``; plain Spark over every record not (or no
longer) dead-lettered is ``(OK_A + R_A) ⋈ (OK_B + R_B)``, so the repair adds

    (R_A ⋈ (OK_B + R_B)) + (OK_A ⋈ R_B)      (+: a union of rows)

— each new pair once, and no pair the job wrote. ``R_A``/``R_B`` are the delta run's own,
tracked (a record that fails again joins nothing); ``OK_A``/``OK_B`` are computed again as
plain Spark (:func:`completed_sides`): each declared source read again minus its dead letters
not repaired yet (``exceptAll`` on the payload: one copy per dead letter), through the side's
row operations and (fixed) stages. That costs a pass over the sources that feed the join, the
size of the other side, not of the repaired records. The join's output then goes on as any
barrier output: its rows reach the row sinks (added) and the aggregates (merged).

Only inner joins add rows and nothing else: an outer, semi or anti join would have to take
back rows the job wrote (a null-extended row that now finds its match), so a repair refuses
them, as it refuses a join of an aggregate's (or another join's) output.

>>> INNER
'inner'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .build import RoundBuilder
from .context import PipelineConfig, RunContext
from .lineage import q
from .node import Node
from .outputs import Barrier, TrackedJoin
from .plan import Plan

#: The join type whose repair only adds rows.
INNER = "inner"


class RepairRefused(ValueError):
    """What a repair cannot do exactly, said before anything is written."""


def check_join(join: Barrier) -> None:
    """Refuses a tracked join a repair cannot merge exactly (see the module's docstring)."""
    how = getattr(join.spec, "how", None)
    if how != INNER:
        raise RepairRefused(
            f"join {join.name!r} is {how!r}: a repair merges inner joins of tracked frames only "
            "(an outer, semi or anti join would take back rows the job wrote)"
        )
    if any(p.phase != 0 for p in join.parents):
        raise RepairRefused(
            f"join {join.name!r} reads an aggregate's or a join's output: a repair joins the "
            "rows of the job's sources only"
        )


@dataclass(eq=False)
class RepairJoin(TrackedJoin):
    """A delta run's tracked join: the repaired rows of each side (staged, completed attempts
    only) joined with the other side's rows, the job's completed ones included (``done``: the
    plain frames of the left and right side)."""

    done: tuple[Any, ...] = field(default=(), kw_only=True)

    lineage: ClassVar[str] = TrackedJoin.lineage + "; the job's completed rows joined too"

    def output(self, ctx: RunContext, ended_df: Any) -> Any:
        new_a, new_b = (st.rows(ctx.spark, ended_df) for st in ctx.of(self).staging)
        done_a, done_b = self.done
        either = new_b.union(done_b.selectExpr(*map(q, new_b.columns)))
        first = self.spec.compute([new_a, either])
        second = self.spec.compute([done_a.selectExpr(*map(q, new_a.columns)), new_b])
        return first.union(second)


def repair_join(node: TrackedJoin, parents: tuple[Node, ...], done: tuple[Any, Any]) -> RepairJoin:
    """``node`` for a delta run: reading ``parents``, meeting the completed rows ``done``."""
    given = {f.name: getattr(node, f.name) for f in dataclasses.fields(node) if f.init}
    return RepairJoin(**{**given, "parents": parents}, done=done)


def _ancestors(nodes: list[Node]) -> set[int]:
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.parents)
    return seen


def completed_sides(
    config: PipelineConfig, plan: Plan, repaired: dict[int, Any]
) -> dict[int, tuple[Any, Any]]:
    """Per tracked join of ``plan`` (by node identity), the plain frames of its two sides over
    the records the job completed: every declared source minus ``repaired[index]`` (the
    payload rows of its dead letters not repaired yet), through the plan's row operations
    and stages as declared now, run as plain Spark (FT off: nothing tracked, nothing
    written)."""
    joins = [n for n in plan.nodes if isinstance(n, TrackedJoin)]
    if not joins:
        return {}
    fresh = {}
    for source in plan.sources:
        if source.derived is None:
            columns = list(map(q, source.columns))
            dead = repaired[source.index].selectExpr(*columns)
            fresh[source.index] = source.df.selectExpr(*columns).exceptAll(dead)
    plain = dataclasses.replace(config, ft=False, storage="memory", resume=False, job=None)
    builder = RoundBuilder(RunContext(plain, plan), fresh, replays_wanted=False)
    wanted = _ancestors([p for j in joins for p in j.parents])
    built: dict[int, Any] = {}
    for node in plan.nodes:
        if id(node) in wanted:
            assert not isinstance(node, Barrier)  # the sides of a join of phase 0
            built[id(node)] = node.tracked(builder, [built[id(p)] for p in node.parents])
    return {id(j): (built[id(j.parents[0])], built[id(j.parents[1])]) for j in joins}


__all__ = ["INNER", "RepairJoin", "RepairRefused", "check_join", "completed_sides", "repair_join"]
