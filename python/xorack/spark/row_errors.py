"""Rows that raise in a native expression — an ANSI cast of a malformed value, ``raise_error``,
``assert_true``, an ANSI overflow or division by zero, a failing Java UDF — are found, and only
their source records fail, as a Python stage's raising rows do.

Spark cannot step over a row whose expression raises: the task fails, Spark retries it, then
fails the job. xorack recognizes such a failure by Spark's error condition (:func:`row_error`)
and goes on in two steps:

1. **the failed round is abandoned** (:mod:`xorack.spark.tracked_rounds`): in a phase's first
   round the input is persisted first (the source taggers alone, one Spark job: deterministic
   ids make the records it had persisted before the same records); then every record left
   pending is replayed as collateral — no attempt used up, its checksum afresh
   (``FTLayer.expire_all(collateral=True)``), whatever events of the abandoned round reached
   it. An optimistic round that fails so just falls back (it leaves no trace);
2. **the phase's later rounds are guarded** (:class:`RowGuard`): each native row operation
   (``select``, ``withColumn(s)``, ``filter``, a generator's argument) evaluates its
   expressions as one struct inside Spark's ``TryEval`` (what ``try_add`` and the other
   ``try_`` functions are made of: any exception of its child becomes null). A row whose struct
   is null raised: it becomes a ghost whose ack is withheld (its record cannot complete), and
   an observed metric brings its source id to the driver. After the round's writes, before the
   staged events are sent, :meth:`RowGuard.settle` evaluates up to :data:`SAMPLES` of those
   rows alone with plain Spark (Spark's own condition and message, as the reason; a replay of
   the same row is not evaluated again) and fails their records, which are replayed and
   dead-lettered after ``max_attempts`` like any failed record. The runaway guard counts them
   per operation and condition: in a batch run an error that every row raises stops the run
   (``RunawayFailure``); one that a guarded round still meets (an aggregate's own expression,
   an untracked ``transform``, a Java UDF, a sink) stops it with :class:`NativeRowError`. (A
   Python UDF's exception is not a native row error: Spark's own error stops the run.)

In a stream (:mod:`xorack.spark.streaming`) the round of a micro-batch or a replay round that
meets such an error is abandoned the same way and run again at once, guarded: the micro-batch's
input is persisted first (Spark commits its offsets when the round returns), the records the
round completed stay completed, and the stream's later rounds stay guarded until a micro-batch
passes with no row raising and no replay waiting. An error in a stateful operation or after it
(an aggregate's own expression, a join condition, the operations over a window's, a join's, a
deduplication's output) stops the stream with :class:`NativeRowError`.

Why this design and not another:

* bisecting the round (re-running halves of its records until single records fail) needs no
  Spark internals and gets every row's own message, but costs about ``2·k·log2(n/k)`` Spark
  jobs for ``k`` bad rows among ``n``, each over the round's whole input in a first round (its
  records are not all persisted yet); guarding costs one round for any ``k``;
* evaluating with ANSI off or the ``try_`` forms covers casts and arithmetic only:
  ``raise_error``, ``assert_true`` and Java UDFs have no such form, and a null from ``try_cast``
  cannot be told from a null input. ``TryEval`` over a struct (never null itself) catches them
  all, and tells exactly the rows that raised.

What it costs when no row raises: nothing measurable — the same plans and Spark jobs (the
translations change only in a phase that met a row error), and one ``stats()`` call to the
acker when a phase starts its tracked rounds (what an abandoned first round completed is
counted once). When one does: the failed job (Spark's task retries included), in a first round
one Spark job that persists the input, then per attempt a guarded round (``TryEval`` and an
observed metric per operation) and a small query on the driver per sampled row.

>>> row_error(ValueError("not Spark's")) is None
True
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import XorackError
from .guard import SEEN
from .lineage import EV, KEEP, LINEAGE, REC, SRC, ghost_payload, q
from .ops import live_only, payload_of

#: Rows of one guarded operation and round evaluated alone for Spark's own message; the other
#: rows that raised get the most frequent error condition of those.
SAMPLES = 8
#: Error conditions of a row's native expression besides SQLSTATE class 22 ("data exception":
#: CAST_INVALID_INPUT, DIVIDE_BY_ZERO, ARITHMETIC_OVERFLOW, INVALID_ARRAY_INDEX, ...).
ROW_CONDITIONS = frozenset({"USER_RAISED_EXCEPTION", "FAILED_EXECUTE_UDF"})
#: The column of a guarded step holding the struct of its expressions (null: the row raised).
GUARDED = "_ft_guarded"
#: The column holding, on a raising row, the later pushed-down filters' verdict (null: it
#: raised too).
SPARE = "_ft_spare"
_U64_MASK = (1 << 64) - 1  # a Spark bigint id as the FT layer's uint64


class NativeRowError(XorackError, RuntimeError):
    """A native expression raised on a row, and the run could not isolate the row (the message
    says why and what to do)."""


@dataclass(frozen=True)
class RowError:
    """A row-level error of a native expression: Spark's error condition and the first line of
    its message (``[CONDITION] ... SQLSTATE: ...``)."""

    condition: str
    message: str


def _chain(exc: BaseException) -> Iterator[Any]:
    """``exc`` and its causes: PySpark's captured causes, then the JVM's."""
    seen: set[int] = set()
    e: Any = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = getattr(e, "_cause", None) or e.__cause__
    java = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    for _ in range(16):  # a JVM cause chain (bounded: a cycle is possible there too)
        if java is None:
            break
        yield java
        try:
            java = java.getCause()
        except Exception:
            break


def _ask(e: Any, *methods: str) -> str | None:
    """The first of ``methods`` that ``e`` answers with a value (PySpark or a JVM throwable)."""
    for m in methods:
        fn = getattr(e, m, None)
        if fn is None:
            continue
        try:
            value = fn()
        except Exception:  # a JVM object without that method: py4j raises
            continue
        if value:
            return str(value)
    return None


def first_line(text: str) -> str:
    """The first line of an error message, at most 500 characters (Spark's messages go on
    with the query context and the stack)."""
    return (text.strip().splitlines() or [""])[0][:500]


def row_error(exc: BaseException) -> RowError | None:
    """Spark's error for ``exc`` when a row's native expression raised it (see
    :data:`ROW_CONDITIONS`), else None."""
    for e in _chain(exc):
        condition = _ask(e, "getCondition", "getErrorClass")
        state = _ask(e, "getSqlState") or ""
        if (condition in ROW_CONDITIONS) or state.startswith("22"):
            message = _ask(e, "getMessage") or str(e)
            return RowError(condition or f"SQLSTATE {state}", first_line(message))
    return None


def try_eval(col: Any) -> Any:
    """``col`` inside Catalyst's ``TryEval`` (null wherever its evaluation raises), as a Column.
    NativeRowError when this Spark has no way to build it (Spark Connect)."""
    from pyspark.sql.session import SparkSession

    spark = SparkSession.getActiveSession()
    jvm = getattr(spark, "_jvm", None)
    jc = getattr(col, "_jc", None)
    if jvm is None or jc is None:
        raise NativeRowError(
            "a native expression raised on a row; isolating it needs a classic Spark session "
            "(the JVM's TryEval), not Spark Connect: fix the data or use a try_ function"
        )
    from pyspark.sql.classic.column import Column

    wrap = jvm.org.apache.spark.sql.catalyst.expressions.TryEval
    for path in _EXPRESSION_UTILS:
        try:  # Column <-> Catalyst Expression, where this Spark version keeps them
            helper = getattr(jvm, path)
            return Column(helper.column(wrap(helper.expression(jc))))
        except Exception:  # not there: py4j raises on the call
            continue
    raise NativeRowError(
        "a native expression raised on a row; this Spark version gives xorack no way to guard "
        "expressions (TryEval): fix the data or use a try_ function"
    )


#: Where Spark keeps its Column <-> Expression conversions (4.1+, then 4.0).
_EXPRESSION_UTILS = (
    "org.apache.spark.sql.classic.ExpressionUtils",
    "org.apache.spark.sql.internal.ExpressionUtils",
)


def observed(observation: Any) -> dict[str, Any] | None:
    """An observation's values after its job ran, or None when Spark has none."""
    try:
        values: dict[str, Any] = observation.get
    except Exception:  # the plan never ran (adaptive execution dropped it as empty)
        return None
    return values


@dataclass
class NodeGuard:
    """The guarded step of one native row operation in one round (see :class:`RowGuard`)."""

    name: str
    op: Any
    observation: Any = None
    schema: Any = None  # the operation's input payload (to evaluate a row alone)
    #: the later filters plain Spark's optimizer evaluates before the operation, over its
    #: input (:func:`pushed_filters`): a raising row they drop is dropped, not failed
    spare: Any = None

    @property
    def stage(self) -> str:
        """The operation as the runaway guard names it."""
        return f"native {self.name!r}"

    def columns(self, df: Any, exprs: Sequence[tuple[str, Any]]) -> Any:
        """``df`` (payload + lineage) with a column per ``(name, Column)`` of ``exprs``: the
        Column's value on live rows (null on ghosts). A row on which one of them raises
        becomes a ghost whose ack is withheld (``_ft_keep`` false, ``_ft_ev`` as it was, its
        payload and values null) and is observed; nothing raises. Columns: payload, ``exprs``'
        names, lineage."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        payload = payload_of(df)
        self.schema = StructType([f for f in df.schema.fields if f.name not in LINEAGE])
        values = F.struct(*[live_only(c).alias(n) for n, c in exprs])
        guarded = {GUARDED: try_eval(values)}
        raised = f"({KEEP} AND {GUARDED} IS NULL)"
        event = EV
        if self.spare is not None:  # over the same input (its qualifier), guarded in turn
            guarded[SPARE] = try_eval(F.struct(self.spare.alias("c")))
            # false, not null: a null first conjunct skips the row in Spark's generated code,
            # but its interpreted AND evaluates the next (a later filter inlining the raising
            # expression: wide plans and failed code generation run interpreted)
            dropped = f"({SPARE} IS NOT NULL AND {SPARE}.c IS FALSE)"
            # a raising row the later filter drops: acked as dropped here, as that filter would
            event = f"({EV} ^ CASE WHEN ({raised} AND {dropped}) THEN {REC} ELSE 0L END) AS {EV}"
            raised = f"({raised} AND NOT {dropped})"
        step = df.withColumns(guarded)
        raised_src = F.expr(f"CASE WHEN {raised} THEN {SRC} END")
        sample = F.struct(F.col(SRC), *[F.col(q(c)) for c in payload])
        # the rows sampled by their record ids, which a replay re-creates: it samples the same
        # rows again (their errors are known by then)
        order = F.expr(f"CASE WHEN {raised} THEN {REC} END")
        self.observation = Observation()
        step = step.observe(
            self.observation,
            F.expr(f"count_if({KEEP})").alias("seen"),
            F.expr(f"count_if({raised})").alias("rows"),
            F.collect_list(raised_src).alias("ids"),
            _first_rows(sample, order).alias("samples"),
        )
        alive = f"{GUARDED} IS NOT NULL"
        return step.selectExpr(
            *ghost_payload(payload, alive),
            *[f"{GUARDED}.{q(n)} AS {q(n)}" for n, _ in exprs],
            SRC,
            REC,
            event,
            f"({KEEP} AND {alive}) AS {KEEP}",
        )

    def evaluate(self, spark: Any, row: Any) -> RowError | None:
        """Spark's error for the operation over one row's payload alone (plain Spark, on the
        driver), or None when it does not raise there."""
        try:
            one = spark.createDataFrame([tuple(row)[1:]], self.schema)
            self.op.apply(one, False).collect()
        except Exception as exc:
            return row_error(exc) or RowError(type(exc).__name__, first_line(str(exc)))
        return None


def pushed_filters(op: Any, later: Sequence[Any], df: Any) -> Any:
    """The condition plain Spark's optimizer evaluates *before* the guarded ``op`` (a
    ``select`` or ``withColumn(s)`` over ``df``'s payload), given the row operations that
    read its output one after the other (``later``, each the only reader of the one before),
    as a Column over ``op``'s input; None when there is none.

    Spark pushes a filter below a projection whose expressions are all deterministic
    (``PushPredicateThroughNonJoin``, inlining the projection's aliases), and two filters in a
    row are evaluated as one ``AND``, the first first. So a row on which ``op`` raises is never
    evaluated there by plain Spark when such a filter drops it first: it is dropped, not failed.
    Only the filters over columns that ``op`` and the operations between pass on unchanged are
    taken, up to the first filter that reads any other (inlined, it evaluates the raising
    expression itself, first); anything else in between (a generator, a rename, a stage, a
    second reader) ends the walk. A filter dropping a row by a column computed in between is
    not taken, and a row the filters give null (not false) is not spared: such a row still
    fails (the conservative side: a record dead-lettered that plain Spark may have dropped;
    the sinks are the same)."""
    from pyspark.errors import AnalysisException

    from .ops import Filter, condition, unqualified

    inner, qualifier = unqualified(op)
    payload = payload_of(df)
    out = _projected(inner, df.select(*map(q, payload)), qualifier)
    if out is None:
        return None  # a filter's own condition goes first; a generator, a rename ...
    kept = _unchanged(inner, payload)
    if not kept:
        return None
    conditions: list[Any] = []
    for later_op in later:
        step, its_qualifier = unqualified(later_op)
        if its_qualifier != qualifier:
            break  # t.k names another frame there
        if isinstance(step, Filter):
            cond = condition(step.cond)
            try:  # reads only the unchanged columns (an analysis, no job)
                _aliased(out.select(*map(q, kept)), qualifier).where(cond)
            except AnalysisException:
                break
            conditions.append(cond)
            out = step.apply(_aliased(out, qualifier), False)
            continue
        nxt = _projected(step, out, qualifier)
        if nxt is None:
            break
        kept = [c for c in _unchanged(step, list(out.columns)) if c in kept]
        out = nxt
        if not kept:
            break
    if not conditions:
        return None
    both = conditions[0]
    for cond in conditions[1:]:
        both = both & cond
    return both


def _aliased(df: Any, qualifier: str | None) -> Any:
    return df if qualifier is None else df.alias(qualifier)


def _unchanged(op: Any, payload: list[str]) -> list[str]:
    """The columns of ``payload`` that ``op`` (a select or withColumn(s)) passes on as they
    are, under the same name."""
    from .ops import Select

    if isinstance(op, Select):
        cols, gen = op._columns(payload)
        return [] if gen is not None else [c for c in cols if isinstance(c, str) and c in payload]
    if op._select(payload) is not None:  # a generator column
        return []
    replaced = {n for n, _ in op.mapping}
    return [c for c in payload if c not in replaced]


def _projected(op: Any, frame: Any, qualifier: str | None) -> Any:
    """``op`` applied to ``frame`` as plain Spark runs it, when plain Spark's optimizer pushes
    a filter through it: a ``select`` or ``withColumn(s)`` of deterministic expressions
    without a generator; else None."""
    from .ops import Select, WithColumns

    columns = list(frame.columns)
    if isinstance(op, Select):
        if op._columns(columns)[1] is not None:
            return None
    elif not isinstance(op, WithColumns) or op._select(columns) is not None:
        return None
    out = op.apply(_aliased(frame, qualifier), False)
    try:
        plan = out._jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() != "Project":
            return None
        exprs = plan.expressions()
        if not all(exprs.apply(i).deterministic() for i in range(exprs.size())):
            return None
    except Exception:  # not a classic DataFrame: nothing known, nothing spared
        return None
    return out


def _first_rows(sample: Any, order: Any) -> Any:
    """The ``sample`` structs of up to :data:`SAMPLES` rows with the smallest non-null
    ``order``, as an array (``min_by(x, ord, k)``; one row where Spark has no ``k``)."""
    from pyspark.sql import functions as F

    try:
        return F.min_by(sample, order, SAMPLES)
    except TypeError:  # an older PySpark: one row
        return F.array(F.min_by(sample, order))


@dataclass
class RowGuard:
    """The guarded native row operations of a phase, round after round (see the module's doc).
    ``hint``: the error that made the phase guarded (its condition is given when no row can be
    evaluated alone); the errors of the rows evaluated alone are kept by content, so a replayed
    row is evaluated once."""

    spark: Any
    hint: RowError
    nodes: list[NodeGuard] = field(default_factory=list)  # this round's
    known: dict[tuple[str, str], RowError | None] = field(default_factory=dict)
    spares: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict)

    def at(self, name: str, op: Any) -> NodeGuard:
        """The guard of the native operation ``op`` of node ``name`` in this round."""
        node = NodeGuard(name, op)
        self.nodes.append(node)
        return node

    def spare(self, node: Any, df: Any, later: Any) -> Any:
        """The pushed-down filters of the guarded operation of ``node`` over ``df``
        (:func:`pushed_filters`; ``later()``: the row operations reading it one after the
        other), found once per node and input columns."""
        key = (id(node), tuple(df.columns))
        if key not in self.spares:
            self.spares[key] = pushed_filters(node.op, later(), df)
        return self.spares[key]

    def settle(self, client: Any, tally: Any) -> int:
        """After the round's writes: fail the records whose rows raised (reason: Spark's error,
        ``native 'name': [CONDITION] message``) and count them for the runaway guard. Returns
        the records failed."""
        failed = 0
        for node in self.nodes:
            got = observed(node.observation)
            if got is None:
                continue  # its rows never ran (none reached it)
            counts: dict[tuple[str, str], int] = {(node.stage, SEEN): int(got["seen"] or 0)}
            if got["rows"]:
                ids = np.unique(np.asarray(got["ids"], dtype=np.int64).view(np.uint64))
                reasons, condition = self._reasons(node, [s for s in got["samples"] or [] if s])
                for reason, src in _by_reason(ids, reasons, condition, node):
                    client.fail(src, reason=reason)
                counts[(node.stage, f"{condition} in {node.op.describe()}")] = len(ids)
                failed += len(ids)
            if tally is not None:
                tally.add(counts)
        self.nodes.clear()
        return failed

    def _reasons(self, node: NodeGuard, samples: list[Any]) -> tuple[dict[int, str], str]:
        """The sampled rows' own reasons (by source id) and the most frequent condition."""
        reasons: dict[int, str] = {}
        conditions: collections.Counter[str] = collections.Counter()
        for row in samples:
            key = (node.name, repr(tuple(row)[1:]))
            if key not in self.known:
                self.known[key] = node.evaluate(self.spark, row)
            error = self.known[key]
            if error is not None:
                reasons[row[0] & _U64_MASK] = f"native {node.name!r}: {error.message}"
                conditions[error.condition] += 1
        if conditions:
            return reasons, conditions.most_common(1)[0][0]
        return reasons, self.hint.condition


def _by_reason(
    ids: np.ndarray, reasons: dict[int, str], condition: str, node: NodeGuard
) -> list[tuple[str, np.ndarray]]:
    """``ids`` grouped by failure reason: a sampled row's own, else the operation's."""
    rest = f"native {node.name!r}: [{condition}] {node.op.describe()} raised on this row"
    groups: dict[str, list[int]] = {}
    for src in ids.tolist():
        groups.setdefault(reasons.get(src, rest), []).append(src)
    return [(r, np.asarray(v, dtype=np.uint64)) for r, v in groups.items()]


__all__ = [
    "GUARDED",
    "ROW_CONDITIONS",
    "SAMPLES",
    "NativeRowError",
    "NodeGuard",
    "RowError",
    "RowGuard",
    "first_line",
    "observed",
    "pushed_filters",
    "row_error",
    "try_eval",
]
