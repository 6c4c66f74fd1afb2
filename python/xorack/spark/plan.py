"""The plan: a pipeline's nodes in declaration order (parents before children), immutable,
with the questions a run asks of the graph — who reads a node, which nodes a phase's rows
reach, which barrier outputs go straight to native sinks — and :meth:`Plan.explain`.

>>> # print(p.explain())
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .node import Node, Scope
from .outputs import Barrier, NativeSinkNode, PythonSinkNode, Sink
from .rows import ArrowStage, PandasStage, Source
from .stages import StageSchemaError
from .windows import Watermark


@dataclass(frozen=True)
class Plan:
    """The declared nodes, in declaration order; ``sources`` by source index."""

    nodes: tuple[Node, ...]
    sources: tuple[Source, ...]
    watermark: Watermark | None = None  # the watermark, when the pipeline has one only
    watermarks: tuple[Watermark, ...] = ()  # withWatermark(column, delay), one per source
    _readers: dict[int, tuple[Node, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        readers: dict[int, list[Node]] = {}
        for node in self.nodes:
            for par in node.parents:
                readers.setdefault(id(par), []).append(node)
        object.__setattr__(self, "_readers", {k: tuple(v) for k, v in readers.items()})

    # ---- the graph ---------------------------------------------------------------------------

    def readers(self, node: Node) -> tuple[Node, ...]:
        """The nodes that read ``node``'s rows, in declaration order."""
        return self._readers.get(id(node), ())

    def sinks(self) -> list[Sink]:
        """The sinks; a plan without one is an error (nothing would be written)."""
        sinks = [n for n in self.nodes if isinstance(n, Sink)]
        if not sinks:
            raise StageSchemaError("pipeline: no sink declared; end at least one branch in .sink()")
        return sinks

    def python_sinks(self) -> list[PythonSinkNode]:
        return [n for n in self.nodes if isinstance(n, PythonSinkNode)]

    def barriers(self) -> list[Barrier]:
        return [n for n in self.nodes if isinstance(n, Barrier)]

    def native_sinks(self) -> list[NativeSinkNode]:
        return [n for n in self.nodes if isinstance(n, NativeSinkNode)]

    def derived_source(self, barrier: Barrier) -> Source:
        """The source node of a barrier's output (the next phase reads it)."""
        return next(s for s in self.sources if s.derived is barrier)

    def derived_indexes(self) -> set[int]:
        """The source indexes of barrier outputs (their records are not input records)."""
        return {s.index for s in self.sources if s.derived is not None}

    def direct(self, source: Node) -> bool:
        """A barrier output read only by native sinks needs no tracking: nothing between the
        barrier and the sink can fail a row, and the sink's write is Spark's own (all or
        nothing per task, retried by Spark). It is written straight to the sinks at publish
        time, which saves its phase (tagging, persisting, staging, acking)."""
        if not isinstance(source, Source) or source.derived is None:
            return False
        readers = self.readers(source)
        return bool(readers) and all(isinstance(n, NativeSinkNode) for n in readers)

    def births_in_stage(self, source: Source) -> bool:
        """Whether an optimistic round leaves ``source``'s ids to the Python stage that alone
        reads it (a ``map_in_pandas`` or ``map_in_arrow`` stage)."""
        readers = self.readers(source)
        return len(readers) == 1 and isinstance(readers[0], (PandasStage, ArrowStage))

    # ---- phases ------------------------------------------------------------------------------

    def phase_count(self) -> int:
        return 1 + max((n.phase for n in self.nodes), default=0)

    def phase_nodes(self, phase: int, skip: Callable[[Source], bool] | None = None) -> list[Node]:
        """The nodes whose rows an optimistic round of ``phase`` runs through, in declaration
        order: the phase's sources (but those ``skip`` says have nothing to run) and every node
        their rows reach, up to the barriers and the sinks (a union or a sink declared in a
        later phase gets this phase's rows too, as in the tracked rounds)."""
        touched: set[int] = set()
        nodes = []
        for node in self.nodes:
            if isinstance(node, Source):
                hit = node.phase == phase and not (skip is not None and skip(node))
            else:
                hit = any(id(par) in touched for par in node.parents)
            if hit:
                touched.add(id(node))
                nodes.append(node)
        return nodes

    def scope(self, phase: int, skip: Callable[[Source], bool] | None = None) -> Scope:
        """What the nodes of ``phase`` are asked when it would run an optimistic round."""
        here = frozenset(id(n) for n in self.phase_nodes(phase, skip))
        elsewhere = frozenset(
            id(n)
            for other in range(self.phase_count())
            if other != phase
            for n in self.phase_nodes(other, skip)
        )
        readers = {k: len(v) for k, v in self._readers.items()}
        return Scope(readers=readers, here=here, elsewhere=elsewhere)

    # ---- explain -----------------------------------------------------------------------------

    def explain(self, head: Callable[[int], str | None] | None = None) -> str:
        """The plan as text: per phase, its nodes in declaration order with their parents and
        lineage rules; ``head(phase)`` says how the phase runs (shown after its number)."""
        lines: list[str] = []
        for phase in range(self.phase_count()):
            how = head(phase) if head is not None else None
            lines.append(f"phase {phase}" + (f": {how}" if how else ""))
            for node in (n for n in self.nodes if n.phase == phase):
                parents = ", ".join(repr(p.name) for p in node.parents)
                src = f" <- {parents}" if parents else ""
                lines.append(f"  {_readable(node.describe())}{src}")
                if node.lineage:
                    lines.append(f"      lineage: {node.lineage}")
        return "\n".join(lines)


def _readable(text: str) -> str:
    """PySpark's ``Column<'expr'>`` as ``expr``."""
    return re.sub(r"Column<'(.*?)'>", r"\1", text)


__all__ = ["Plan"]
