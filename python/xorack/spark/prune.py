"""Column pruning across phases: a tracked join's output keeps only the columns the rest of
the pipeline reads.

Spark prunes the columns a query does not need down to its scans. A phase boundary hides
that from it: the output of a tracked ⋈ tracked join is written for the next phase, and a
write needs every column, so Spark reads, shuffles and writes all the columns of both sides
(TPC-H Q3: the 16 columns of ``lineitem``, where the aggregate after the join reads 4). At the
start of a batch run with FT on, :func:`prune` asks Spark's own optimizer which columns of each
join's output the nodes after it read, and gives the join a final ``select`` of those. Spark
then prunes the join's inputs, down to the sources' scans, as it would in plain Spark; in
tracked rounds each side stages only what the join's condition and the kept columns read.

How the columns are found. The join's output is stood in for by a *probe*: an empty
``LogicalRDD`` of its schema, which the optimizer cannot fold away as it folds an empty local
relation. The nodes reached from it are built over the probe as plain Spark builds them (a
native operation's ``apply``), up to where each branch ends (:func:`_ends`):

* a native sink, a Python sink, a Python stage, a transform, a union, a barrier of another kind:
  it reads its whole input — every column that reaches it is read;
* an aggregate, a tracked join, a ``limit``: Spark's own operator over its input (a later
  join's output already pruned), whose references the optimizer knows.

Each end is optimized, and the columns read from the probe are those the operators directly
above each occurrence of the probe in the optimized plan reference, climbing through the
operators that pass every column on (a filter, a sort, a repartition, a limit) up to the first
``Project`` or ``Aggregate``; any other operator above the probe counts as reading every column.
So the count can only err towards more columns; a plan in which the optimizer folded the
probe away (``limit(0)``, ``isin([])``) shows nothing, and counts as reading every column. The
derived source's partitioning keys are kept too (a replay is partitioned by them); a cut to no
column at all is no cut (an empty ``keep`` means every column).

The plan is then rewritten: a native operation after a cut join gets the schema it has over
the cut frame (what a barrier after it stages), and each side of a cut join stages what the
join reads of it, or, when it reads all (or none), what its parent has after the cut. What a
side stages is asked of Spark only when a tracked round first stages the join (one more
optimized plan per join): a phase whose optimistic round completes never needs it, and the
analysis at the start of a run costs about half as much (TPC-H Q3 at SF 0.1, warm: 0.35 s →
0.13 s).

What is left alone: a join whose output names a column twice (a ``select`` by name would be
ambiguous); a streaming plan; a plan the analysis cannot build (any error: nothing is pruned);
a plan where a cut would change what a barrier outputs, or what reaches any node other than a
native operation, an aggregate, a tracked join or a limit (nothing is pruned).
A dead-lettered row of a pruned join's output holds its kept columns only.

>>> from xorack.spark.prune import _operator, _references
>>> _operator({"class": "org.apache.spark.sql.catalyst.plans.logical.Filter"})
'Filter'
>>> ref = {"class": "x.AttributeReference", "name": "k", "exprId": {"id": 7}}
>>> sorted(_references({"class": "x.Filter", "condition": [{"class": "x.IsNotNull"}, ref]}))
[7]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import Any

from .node import Node
from .outputs import Aggregate, Barrier, Limit, TrackedJoin
from .plan import Plan
from .rows import RowOperation, Source

log = logging.getLogger(__name__)

#: Catalyst operators whose output is their child's (every column passed on, none computed):
#: the columns read above one of them are read from below it too.
_PASS = frozenset(
    {"Filter", "Sort", "Repartition", "RepartitionByExpression", "LocalLimit", "GlobalLimit"}
)
#: Catalyst operators that output only what their expressions name.
_NARROW = frozenset({"Project", "Aggregate"})


def prune(plan: Plan, spark: Any) -> Plan:
    """``plan`` with each tracked join's output cut to the columns read after it (itself
    when nothing can be cut, or the plan is streaming)."""
    joins = [n for n in plan.nodes if isinstance(n, TrackedJoin)]
    if not joins or any(s.df is not None and s.df.isStreaming for s in plan.sources):
        return plan
    keep: dict[int, tuple[str, ...]] = {}
    try:
        for join in reversed(joins):  # a later join's cut is known when an earlier one ends in it
            cols = _read_after(plan, spark, join, keep)
            if cols and len(cols) < len(join.columns):  # a cut to none would keep all
                keep[id(join)] = cols
    except Exception as exc:  # pragma: no cover - Spark refused a probe: prune nothing
        log.debug("column pruning skipped: %s", exc)
        return plan
    if not keep:
        return plan
    try:
        return _rewrite(plan, spark, keep)
    except Exception as exc:  # a node the cut would change in a way not followed: prune nothing
        log.debug("column pruning skipped: %s", exc)
        return plan


def _read_after(
    plan: Plan, spark: Any, join: TrackedJoin, keep: dict[int, tuple[str, ...]]
) -> tuple[str, ...] | None:
    """The columns of ``join``'s output read after it, in its order; None: all of them."""
    if len(set(join.columns)) != len(join.columns):
        return None
    derived = plan.derived_source(join)
    probe = _probe(spark, join.schema)
    ends = _ends(plan, spark, derived, probe, keep)
    if ends is None:
        return None
    read = set(derived.keys)
    for end in ends:
        got = _columns_read(_optimized(end), _token(probe))
        if got is None:
            return None
        read |= got
    return tuple(c for c in join.columns if c in read)


def _ends(
    plan: Plan, spark: Any, derived: Source, probe: Any, keep: dict[int, tuple[str, ...]]
) -> list[Any] | None:
    """Where the branches from ``derived`` end, as frames over ``probe`` (see the module's
    doc); None when an end reads ``derived``'s rows as they are (every column is read)."""
    frames: dict[int, Any] = {id(derived): probe}
    ends: list[Any] = []
    for node in plan.nodes:
        if not any(id(p) in frames for p in node.parents):
            continue
        inputs = [frames.get(id(p)) for p in node.parents]
        if isinstance(node, RowOperation):
            frames[id(node)] = node.op.apply(inputs[0], False)
            continue
        if isinstance(node, Barrier) and type(node) in (Aggregate, TrackedJoin, Limit):
            given = [
                x if x is not None else _probe(spark, p.schema)
                for x, p in zip(inputs, node.parents, strict=True)
            ]
            spec = node.spec
            if id(node) in keep:
                spec = dataclasses.replace(spec, keep=keep[id(node)])
            ends.append(spec.compute(given))
            continue
        # anything else reads every column of what reaches it
        for x in inputs:
            if x is probe:
                return None
            if x is not None:
                ends.append(x)
    return ends


def _staged_sides(
    spark: Any, join: TrackedJoin, cut: tuple[str, ...], parents: tuple[Node, ...]
) -> tuple[Any, ...]:
    """What each side of ``join`` (cut to ``cut``, its parents now ``parents``) stages in
    tracked rounds: :func:`_sides`, less what a cut parent no longer has; each parent's whole
    payload when Spark cannot tell (the join reads a part of it: staging all is safe)."""
    from pyspark.sql.types import StructType

    try:
        sides = _sides(spark, join, cut)
    except Exception as exc:  # pragma: no cover - Spark refused a probe: stage every column
        log.debug("the sides of %r staged whole: %s", join.name, exc)
        return tuple(p.schema for p in parents)
    # a side read whole stages what its parent has (less, when the parent is cut)
    return tuple(
        StructType([f for f in side.fields if f.name in p.columns]) or p.schema
        for side, p in zip(sides, parents, strict=True)
    )


def _sides(spark: Any, join: TrackedJoin, cut: tuple[str, ...]) -> tuple[Any, ...]:
    """The payload each side of ``join`` stages in tracked rounds when its output is ``cut``:
    the columns the join's condition and the kept columns read (a side whose read Spark
    does not show, or that reads none, stages all of its columns)."""
    from pyspark.sql.types import StructType

    probes = [_probe(spark, p.schema) for p in join.parents]
    out = dataclasses.replace(join.spec, keep=cut).compute(probes)
    tree = _optimized(out)
    sides = []
    for probe, parent in zip(probes, join.parents, strict=True):
        read = _columns_read(tree, _token(probe))
        cols = [c for c in parent.columns if read and c in read] or list(parent.columns)
        sides.append(StructType([parent.schema[c] for c in cols]))
    return tuple(sides)


def _probe(spark: Any, schema: Any) -> Any:
    """An empty frame of ``schema`` the optimizer cannot fold (a ``LogicalRDD``)."""
    from pyspark.sql.classic.dataframe import DataFrame

    jspark = spark._jsparkSession
    jdf = jspark.createDataFrame(spark._jsc.emptyRDD(), jspark.parseDataType(schema.json()))
    probe = DataFrame(jdf, spark)
    probe._xorack_probe = tuple(schema.fieldNames())  # type: ignore[attr-defined]
    return probe


def _token(probe: Any) -> tuple[str, ...]:
    """What tells the probe in an optimized plan: a ``LogicalRDD`` with its column names (the
    optimizer's copies of it get new expression ids — a self-join reads it twice —, and the
    JSON form of a plan does not name the RDD: another relation with the very same names
    counts as the probe too, which can only add columns)."""
    return tuple(probe._xorack_probe)


#: A Catalyst logical plan as (operator, children): one call to the JVM (``toJSON``).
Tree = tuple[dict[str, Any], list[Any]]


def _optimized(frame: Any) -> Tree:
    """``frame``'s optimized logical plan, read from its JSON form (pre-order)."""
    nodes = iter(json.loads(frame._jdf.queryExecution().optimizedPlan().toJSON()))

    def build() -> Tree:
        node = next(nodes)
        return node, [build() for _ in range(int(node.get("num-children", 0)))]

    return build()


def _operator(node: dict[str, Any]) -> str:
    return str(node.get("class", "")).rsplit(".", 1)[-1]


def _attributes(value: Any) -> list[dict[str, Any]]:
    """The attribute references anywhere in a JSON value (an operator's expressions)."""
    found: list[dict[str, Any]] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if str(v.get("class", "")).endswith(".AttributeReference"):
                found.append(v)
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return found


def _output(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A relation's output attributes, in order (``output``: one flattened expression per
    attribute)."""
    return [a for expr in node.get("output") or () for a in _attributes(expr)[:1]]


def _references(node: dict[str, Any]) -> set[int]:
    """The expression ids an operator's expressions name (its own fields; not its children)."""
    fields = [v for k, v in node.items() if k not in ("class", "num-children")]
    return {int(a["exprId"]["id"]) for a in _attributes(fields)}


def _columns_read(tree: Tree, token: tuple[str, ...]) -> set[str] | None:
    """The names of the probe's (:func:`_token`) columns that ``tree`` (:func:`_optimized`)
    reads; None when an operator above the probe may read them all, or when the optimizer
    folded the probe away (``limit(0)``, ``where(F.col(c).isin([]))``: what the plan reads is
    not shown)."""
    read: set[str] = set()
    found = False
    stack: list[tuple[Tree, list[dict[str, Any]]]] = [(tree, [])]
    while stack:
        (node, children), above = stack.pop()
        if _operator(node) == "LogicalRDD":
            output = [(int(a["exprId"]["id"]), a["name"]) for a in _output(node)]
            if tuple(name for _, name in output) != token:
                continue  # another relation
            found = True
            names = dict(output)
            for op in reversed(above):
                read |= {names[i] for i in _references(op) if i in names}
                if _operator(op) in _NARROW:
                    break
                if _operator(op) not in _PASS:
                    return None
            else:
                return None  # the probe itself is the result: all of it is read
            continue
        stack.extend((child, [*above, node]) for child in children)
    return read if found else None


def _shape(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


class _Unfollowed(Exception):
    """A node whose input a cut changes, of a kind :func:`_rewrite` cannot follow."""


def _rewrite(
    plan: Plan,
    spark: Any,
    keep: dict[int, tuple[str, ...]],
) -> Plan:
    """``plan`` with the joins in ``keep`` (and their derived sources) cut to those columns,
    each join staging what it reads of its sides (:func:`_staged_sides`, found when a tracked
    round first stages it); a native operation over a cut frame gets the schema it has over
    it (a barrier after it stages that). Raises :class:`_Unfollowed` when a barrier's output
    would change, or another kind of node's input."""
    from pyspark.sql.types import StructType

    new: dict[int, Node] = {}
    for node in plan.nodes:
        parents = tuple(new[id(p)] for p in node.parents)
        changed = any(n.schema != p.schema for n, p in zip(parents, node.parents, strict=True))
        cut = keep.get(id(node.derived)) if isinstance(node, Source) else keep.get(id(node))
        if cut is None:
            changes: dict[str, Any] = {"parents": parents}
            if changed and isinstance(node, RowOperation):
                schema = node.op.apply(_probe(spark, parents[0].schema), False).schema
                changes.update(columns=tuple(schema.fieldNames()), schema=schema)
            elif (
                changed
                and isinstance(node, Barrier)
                and type(node) in (Aggregate, TrackedJoin, Limit)
            ):
                out = node.spec.compute([_probe(spark, p.schema) for p in parents]).schema
                if _shape(out) != _shape(node.schema):  # its output would lack columns
                    raise _Unfollowed(f"{node.name!r} would output other columns")
            elif changed:
                raise _Unfollowed(f"{node.name!r} reads a cut frame")
        else:
            schema = StructType([node.schema[c] for c in cut])
            changes = {"parents": parents, "columns": cut, "schema": schema}
            if isinstance(node, TrackedJoin):
                changes["spec"] = dataclasses.replace(node.spec, keep=cut)
                changes["sides"] = functools.partial(_staged_sides, spark, node, cut, parents)
        if isinstance(node, Source) and node.derived is not None:
            changes["derived"] = new[id(node.derived)]
        new[id(node)] = dataclasses.replace(node, **changes)
    sources = tuple(s for s in (new[id(s)] for s in plan.sources) if isinstance(s, Source))
    return dataclasses.replace(plan, nodes=tuple(new[id(n)] for n in plan.nodes), sources=sources)


__all__ = ["prune"]
