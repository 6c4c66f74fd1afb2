"""A plan's fingerprint: what a repair's declaration must share with the run it repairs.

A resumable run (``resume=True``, a SQLite storage) stores it in the job's storage when it
finishes (the mark ``plan``, next to its report); :meth:`Pipeline.repair` computes it again
from its own declaration and refuses, before anything is written, when the two differ. One
line per node, in declaration order, each naming its kind and its parents' positions:

* a source: its name, schema, partitioning keys, and the files it reads (``inputFiles()``,
  as paths relative to the job's workdir, so a job moved whole keeps its fingerprint; a
  DataFrame made in the driver reads no file and is known by its name and schema only);
* a barrier: its kind and spec (an aggregate's keys and functions, a join's keys or
  condition and type, a limit's order and count);
* a sink: its name, kind and target (a ``ParquetSink``'s path, a ``SQLiteSink``'s file and
  table, relative to the workdir; a Python sink's class);
* a lookup join (with an untracked DataFrame): its keys, its type and the files the other
  side reads;
* any other row operation or stage: its kind (``Filter``, ``Select``, ``map_in_pandas`` …)
  and its output columns only — not its function or expressions: the stages are what a
  repair may change (fixed code).

>>> # fingerprint(plan, workdir) == json.loads(marks["plan"])
"""

from __future__ import annotations

import os
from typing import Any

from .node import Node
from .outputs import Barrier, Sink
from .plan import Plan
from .rows import Source

#: The job mark that holds a finished run's fingerprint (a JSON list of strings).
MARK = "plan"


def _local(path: str, workdir: str) -> str:
    """``path`` (a local path or a ``file:`` URI) relative to ``workdir``; other URIs as they
    are."""
    if path.startswith("file:"):
        path = path[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
    if "://" in path:
        return path
    return os.path.relpath(os.path.abspath(path), os.path.abspath(workdir))


def _files(df: Any, workdir: str) -> list[str]:
    try:
        files = df.inputFiles()
    except Exception:  # a source Spark cannot list (its identity is then its name and schema)
        return []
    return sorted(_local(str(f), workdir) for f in files)


def _target(sink: Any, workdir: str) -> str:
    kind = type(sink).__qualname__
    path, table = getattr(sink, "path", None), getattr(sink, "table", None)
    if isinstance(path, str):
        where = _local(path, workdir)
        return f"{kind}({where}" + (f", {table})" if isinstance(table, str) else ")")
    return kind


def _line(node: Node, position: dict[int, int], workdir: str) -> str:
    parents = ",".join(str(position[id(p)]) for p in node.parents)
    head = f"{type(node).__name__}<-[{parents}]"
    if isinstance(node, Source):
        if node.derived is not None:
            return f"{head} output of {position[id(node.derived)]}"
        schema = node.schema.simpleString() if hasattr(node.schema, "simpleString") else ""
        files = _files(node.df, workdir) if node.df is not None else []
        return (
            f"{head} source {node.name!r} {schema} keys={list(node.keys)} "
            f"repartition={node.repartition} files={files}"
        )
    if isinstance(node, Barrier):
        return f"{head} {node.describe()}"
    if isinstance(node, Sink):
        return f"{head} sink {node.name!r} {_target(node.sink, workdir)}"
    op = getattr(node, "op", None)  # a native row operation: its kind, not its expressions
    kind = node.label if op is None else f"{node.label} {type(op).__name__}"
    if op is not None and hasattr(op, "how"):  # a lookup join: its keys, type and other side
        other = _files(op.other, workdir) if hasattr(op, "other") else []
        kind += f" on={list(getattr(op, 'on', ()))} how={op.how!r} other={other}"
    return f"{head} {kind} -> {list(node.columns)}"


def fingerprint(plan: Plan, workdir: str) -> list[str]:
    """The fingerprint of ``plan`` (see the module's docstring), paths relative to
    ``workdir``."""
    position = {id(n): i for i, n in enumerate(plan.nodes)}
    return [_line(n, position, workdir) for n in plan.nodes]


def difference(mine: list[str], job: list[str]) -> str | None:
    """The first line where a repair's fingerprint ``mine`` and the job's differ, in words, or
    None when they are the same."""
    for i, (a, b) in enumerate(zip(mine, job, strict=False)):
        if a != b:
            return f"node {i} is {a!r} where the job's run had {b!r}"
    if len(mine) > len(job):
        return f"node {len(job)} ({mine[len(job)]!r}) was not in the job's run"
    if len(job) > len(mine):
        return f"the job's run had node {len(mine)} ({job[len(mine)]!r}), not declared now"
    return None


__all__ = ["MARK", "difference", "fingerprint"]
