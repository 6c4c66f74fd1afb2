"""The plan's node: what every operator of a pipeline is (Catalyst's ``LogicalPlan``, small).

A node is declared once, by :class:`~xorack.spark.tracked.Tracked`, and never changed by a
run: what a run makes of it (a barrier output's rows, staging directories, an optimistic
round's files) lives in the run's :class:`~xorack.spark.context.RunContext`. The type of a node
is its kind; each kind (:mod:`xorack.spark.rows`, :mod:`xorack.spark.outputs`) owns

* its **lineage rule** (how record ids flow through it: ``1 → 0..1`` for a filter, ``n → 1``
  for an aggregate …), shown by ``explain()``;
* its **round translation** (:meth:`Node.tracked`): the Spark frame of one tracked round, or,
  with FT off, of plain Spark;
* its **optimistic translation** (:meth:`Node.optimistic`), or the reason it has none
  (:meth:`Node.blocker`).

The run loop walks the nodes in declaration order and calls these; it never asks a node's
kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .report import Reason

if TYPE_CHECKING:
    from .build import RoundBuilder
    from .optimistic_round import OptimisticBuilder


@dataclass(frozen=True)
class Scope:
    """What :meth:`Node.blocker` may ask about the phase an optimistic round would run: the
    readers of each node, which nodes this phase's rows reach (``here``) and which other
    phases' rows reach (``elsewhere``), all by node identity."""

    readers: dict[int, int]
    here: frozenset[int]
    elsewhere: frozenset[int]


@dataclass(eq=False)
class Node:
    """One operator of the plan. ``columns``/``schema``: its payload (lineage columns are
    added with FT on); ``phase``: barriers split a run into phases, a barrier's output opens a
    later one. Nodes compare by identity."""

    name: str
    parents: tuple[Node, ...]
    columns: tuple[str, ...]
    schema: Any
    phase: int = field(default=0, kw_only=True)
    #: the frame a declaration on this node's output is analyzed against (None: an empty
    #: frame of its payload); with FT off a source's input or a native node's own output
    proto: Any = field(default=None, kw_only=True, repr=False)
    #: the input frames ``proto`` was analyzed from (FT off: a run fed the very same frames
    #: reuses ``proto`` instead of building the operation again, see :meth:`reused`)
    analyzed_from: tuple[Any, ...] = field(default=(), kw_only=True, repr=False)

    #: how record ids flow through the node (explain's words)
    lineage: ClassVar[str] = ""
    #: the node's kind in explain's words
    label: ClassVar[str] = ""
    #: its rows owe no pending event and hold no ghost (their events are sent, or their
    #: pending columns constant)
    settled: ClassVar[bool] = False
    #: where rows leave a phase (a barrier or a sink): an optimistic round writes there
    terminal: ClassVar[bool] = False

    def is_settled(self) -> bool:
        return self.settled

    def reused(self, inputs: list[Any]) -> Any:
        """The frame the declaration analyzed, if the run feeds the node the very frames that
        analysis was given (FT off: DataFrames are immutable, so applying the operation again
        would build the same plan; the declaration's analysis is not paid twice); else None."""
        given = self.analyzed_from
        if not given or len(given) != len(inputs):
            return None
        same = all(a is b for a, b in zip(given, inputs, strict=True))
        return self.proto if same else None

    def tracked(self, b: RoundBuilder, inputs: list[Any]) -> Any:
        """This node's frame in a round (FT on: tracked; FT off: plain Spark's), given its
        parents' frames (None for a parent without rows this round; not all None), or None
        when nothing reads on from here."""
        raise NotImplementedError

    def optimistic(self, b: OptimisticBuilder, inputs: list[Any]) -> Any:
        """This node's frame in an optimistic round (lineage as in a tracked round, events
        into the round's accumulator), or None."""
        raise NotImplementedError

    def recomputed(self) -> str | None:
        """Why Spark computing this node's rows once more (an optimistic round's branch point
        after it is computed once per reader) could give other rows, or count the node's
        events twice; None when it gives the same rows, with the same ids."""
        return None

    def blocker(self, scope: Scope) -> tuple[Reason, str] | None:
        """Why an optimistic round cannot carry this node, or None. A row node must have a
        reader (rows that reach no sink would go unaccounted); a branch point (several
        readers) must be computed alike for each of them (:func:`branch_blocker`)."""
        readers = scope.readers.get(id(self), 0)
        if readers > 1:
            return branch_blocker(self, scope)
        if not readers:
            return Reason.UNREAD, f"the rows of {self.name!r} reach no sink"
        return None

    def describe(self) -> str:
        """The node in one line for ``explain()``."""
        return f"{self.label} {self.name!r}"


def branch_blocker(point: Node, scope: Scope) -> tuple[Reason, str] | None:
    """Why an optimistic round cannot carry the branch point ``point``, or None. The round does
    not materialize it: Spark computes its rows once per reader (as plain Spark does), so every
    node of the phase up to it must give the same rows, with the same ids, each time, and send
    no event of its own (:meth:`Node.recomputed`)."""
    stack, seen = [point], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or id(node) not in scope.here:
            continue
        seen.add(id(node))
        why = node.recomputed()
        if why is not None:
            where = "" if node is point else f" after {node.name!r}"
            return Reason.BRANCH_POINT, f"{point.name!r} is a branch point{where}: {why}"
        stack.extend(node.parents)
    return None


def roots(node: Node) -> list[Node]:
    """The nodes without parents whose rows reach ``node`` (sources, or a barrier's output
    for a node after it), each once."""
    found: dict[int, Node] = {}
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if not n.parents:
            found[id(n)] = n
        stack.extend(n.parents)
    return list(found.values())


def event_time_of(event_times: dict[str, str], node: Node) -> str | None:
    """The watermark column (``event_times``: source name -> column) of the source whose rows
    reach ``node``, else None: a stage checks per row that it keeps the column unchanged."""
    for n in roots(node) if event_times else ():
        if n.name in event_times:
            return event_times[n.name]
    return None


__all__ = ["Node", "Scope", "branch_blocker", "event_time_of", "roots"]
