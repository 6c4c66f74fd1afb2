"""Native tracked operations: PySpark DataFrame operations that run in the JVM with their
lineage kept (see :mod:`xorack.spark.lineage` for the rules).

Each operation is a small frozen object with ``apply(df, ft)``: with FT on, ``df`` holds the
payload followed by the lineage columns and the result does too; with FT off it is the plain
PySpark call. At declaration time the pipeline calls ``declare(proto)`` on an empty frame of the
payload (so a bad expression is an error where it is written, not in the middle of a run): the
checks of the tracked translation and Spark's analysis of the plain operation, which gives the
output's payload schema. The tracked translation (larger expressions, a slower analysis) is
analyzed once, on the real frames of each round. The operations with expressions (``Select``,
``WithColumns``, ``Filter``) also have ``guarded(df, guard)``: the tracked translation in a
phase where a native expression raised on a row, each raising row made a ghost whose record
fails (:mod:`xorack.spark.row_errors`).

>>> Filter("x > 1").describe()
'filter(x > 1)'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .lineage import (
    KEEP,
    LINEAGE,
    POS,
    drop_where,
    fan_out,
    ghost_payload,
    kept_in_jvm,
    q,
    select_expr,
    select_kept,
)

GENERATORS = {
    # name: (outer, with position, inline)
    "explode": (False, False, False),
    "explode_outer": (True, False, False),
    "posexplode": (False, True, False),
    "posexplode_outer": (True, True, False),
    "inline": (False, False, True),
    "inline_outer": (True, False, True),
}


class TrackedOperationError(ValueError):
    """A tracked operation that cannot keep its guarantee as written (the message says why and
    what to write instead)."""


def salt_of(name: str) -> int:
    """A stable 63-bit salt for an operator's child ids (Python's hash() is per process)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def payload_of(df: Any) -> list[str]:
    """The payload columns of a tracked frame (everything but the lineage columns)."""
    return [c for c in df.columns if c not in LINEAGE]


def with_lineage_last(df: Any, payload: Sequence[str]) -> Any:
    """``df`` with ``payload`` first and the lineage columns after it."""
    cols = [*payload, *LINEAGE]
    return df if list(df.columns) == cols else select_expr(df, map(q, cols))


def check_output_names(what: str, names: Sequence[str]) -> None:
    bad = [c for c in names if c.startswith("_ft_")]
    if bad:
        raise TrackedOperationError(
            f"{what}: column names {bad} are reserved for xorack's lineage columns; "
            "choose other names"
        )
    dup = sorted({c for c in names if list(names).count(c) > 1})
    if dup:
        raise TrackedOperationError(f"{what}: duplicate output column names {dup}")


def as_column(c: Any) -> Any:
    f = _f()
    return f.col(c) if isinstance(c, str) else c


def condition(cond: Any) -> Any:
    """A filter's condition (a Column, or SQL text) as a Column."""
    return _condition(cond)


def _condition(cond: Any) -> Any:
    f = _f()
    if isinstance(cond, str):
        return f.expr(cond)
    if type(cond).__name__ != "Column":
        raise TypeError(f"filter: condition must be a Column or a SQL string, got {type(cond)}")
    return cond


_STAR = re.compile(r"\*\s*[),]")  # a `*` argument: `hash(*)`, `struct(t.*)` (not `x * 2`)
_COUNT_STAR = re.compile(r"(?i)\bcount\(\s*\*\s*\)")  # count(*) counts rows: no columns read


_OVER = re.compile(r"(?i)\bover\s*\(")  # a window function: `row_number() OVER (...)`


def _sql_of(c: Any) -> str | None:
    """The SQL text of a Column (or SQL text itself); None when it cannot be read."""
    if isinstance(c, str):
        return c
    try:
        return str(c._jc.node().sql())
    except Exception:  # not a classic Column (Spark Connect): not inspected
        return None


def reads_star(c: Any) -> bool:
    """Whether the expression ``c`` (a Column or SQL text) has a ``*`` inside it, as in
    ``F.hash("*")`` or ``F.struct("*")``: on a tracked frame that would read the lineage columns
    too. A column name, a top-level ``*`` and ``count(*)`` read no lineage.

    >>> reads_star("hash(*) % 2 = 0"), reads_star("x * 2"), reads_star("count(*) > 1")
    (True, False, False)
    """
    text = _sql_of(c)
    return text is not None and bool(_STAR.search(_COUNT_STAR.sub("", text)))


def check_expressions(what: str, cols: Sequence[Any]) -> None:
    """A clear error for an expression of a row operation that a tracked frame cannot compute
    as Spark does: a ``*`` inside it (it would read the lineage columns too, see
    :func:`reads_star`), or a window function (it reads other rows, of other source records:
    a replayed record would be computed without them, and a removed row would count)."""
    exprs = [c for c in cols if not isinstance(c, str)]
    for c in exprs:
        if reads_star(c):
            raise TrackedOperationError(
                f"{what}: {c} has a `*` inside it, which on a tracked DataFrame would also read "
                "xorack's lineage columns; name the columns instead, e.g. "
                "F.struct(*[F.col(c) for c in t.columns])"
            )
        text = _sql_of(c)
        if text is not None and _OVER.search(text):
            raise TrackedOperationError(
                f"{what}: {c} is a window function, which reads other rows: on a tracked "
                "DataFrame they may belong to other source records, and a replayed record "
                "would be computed without them. Aggregate with groupBy(...).agg(...) and join "
                "the result back, or compute the window before p.source() or after the sink"
            )


def _plan_nodes(plan: Any) -> list[str]:
    """The class names of a JVM logical plan's operators, top down."""
    names = [str(plan.getClass().getSimpleName())]
    children = plan.children()
    for i in range(children.size()):
        names += _plan_nodes(children.apply(i))
    return names


def _added_nodes(plan: Any, under: Any) -> list[str] | None:
    """The class names of the operators of the JVM logical plan ``plan`` above each copy of
    its input's plan ``under`` (top down), or None when ``under`` is not in it. Walks only the
    operators an operation added (a few py4j calls), not the input's whole plan."""
    names: list[str] = []
    stack, found = [plan], False
    while stack:
        node = stack.pop()
        if bool(node.fastEquals(under)):
            found = True
            continue
        names.append(str(node.getClass().getSimpleName()))
        children = node.children()
        stack.extend(children.apply(i) for i in reversed(range(children.size())))
    return names if found else None


def check_row_plan(what: str, out: Any, proto: Any, allowed: frozenset[str]) -> None:
    """A clear error, at declaration, for a row operation whose rows a tracked frame cannot
    anchor or a replay would not reproduce. ``out`` is the operation applied to the payload-only
    frame ``proto``; the operators it adds must be of the kinds in ``allowed`` — Spark rewrites
    ``F.window`` with a filter on the time column (a tumbling window; a ghost or a null time
    would vanish unacked) or an ``Expand`` that copies each row (a sliding window) — and its
    expressions deterministic (a replayed record would get other values than its first
    attempt; ``input_file_name()`` reads ``''`` after a tracked source)."""
    try:
        plan = out._jdf.queryExecution().analyzed()
        under = proto._jdf.queryExecution().analyzed()
        added = _added_nodes(plan, under)
        if added is None:  # the analysis rewrote the input's plan: count both trees
            nodes = _plan_nodes(plan)
            added = nodes[: len(nodes) - len(_plan_nodes(under))]
        deterministic = bool(plan.deterministic())
    except Exception:  # not a classic DataFrame (Spark Connect): not inspected
        return
    extra = set(added) - allowed
    if "Expand" in extra:
        raise TrackedOperationError(
            f"{what}: makes several rows of each input row (a sliding window, F.window(ts, "
            "duration, slide), does), which a tracked DataFrame cannot anchor to their record; "
            "group by the window instead: groupBy(F.window(ts, duration, slide), ...).agg(...)"
        )
    if extra:
        raise TrackedOperationError(
            f"{what}: Spark rewrites it with {sorted(extra)} (F.window filters on its time "
            "column), which would drop rows behind the lineage; group by the window instead: "
            "groupBy(F.window(ts, duration), ...).agg(...) (or compute its bounds from the "
            "time, F.timestamp_seconds(F.floor(F.unix_timestamp('ts') / 10) * 10))"
        )
    if not deterministic:
        raise TrackedOperationError(
            f"{what}: a non-deterministic expression (monotonically_increasing_id(), "
            "input_file_name(), rand(), uuid(), spark_partition_id() ...) would give a replayed "
            "record other values than its first attempt (input_file_name() reads '' after a "
            "tracked source); compute it on the input DataFrame before p.source(), where its "
            "values are persisted with the record"
        )


#: the operators a row operation may add to its input's plan
_SELECT_NODES = frozenset({"Project", "Generate"})
_FILTER_NODES = frozenset({"Filter"})


def live_only(c: Any) -> Any:
    """``c`` evaluated on live rows only (null on a ghost, a row removed upstream): Spark never
    evaluates a removed row's expressions, so neither may a tracked frame (an ANSI cast,
    ``raise_error``, ``assert_true`` would fail on it). A column given by name is left as it
    is (a ghost's payload is null already). Python UDFs are evaluated by Spark for every row
    even inside ``when``; they see a ghost's nulls (README: Limits)."""
    f = _f()
    if isinstance(c, str):
        return c
    return f.when(f.col(KEEP), c)


# --------------------------------------------------------------------------------------------
# generators inside select / withColumn


@dataclass(frozen=True)
class _Generator:
    function: str
    argument: Any  # the array / map Column
    aliases: tuple[str, ...]

    @property
    def outer(self) -> bool:
        return GENERATORS[self.function][0]

    @property
    def with_position(self) -> bool:
        return GENERATORS[self.function][1]

    @property
    def inline(self) -> bool:
        return GENERATORS[self.function][2]


def _generator_of(col: Any) -> _Generator | None:
    """The generator a select column is (``F.explode(...)``, aliased or not), or None."""
    if isinstance(col, str) or not hasattr(col, "_jc"):
        return None
    try:
        text = str(col._jc.toString()).lower()  # one py4j call for the common case: none
        if not any(f"{name}(" in text for name in GENERATORS):
            return None
        node = col._jc.node()
    except Exception:  # not a classic Column (Spark Connect): no generator rewrite
        return None
    aliases: tuple[str, ...] = ()
    if node.getClass().getSimpleName() == "Alias":
        names = node.name()
        aliases = tuple(str(names.apply(i)) for i in range(names.size()))
        node = node.child()
    if node.getClass().getSimpleName() != "UnresolvedFunction":
        return None
    name = str(node.functionName()).lower()
    if name not in GENERATORS:
        return None
    args = node.arguments()
    if args.size() != 1:
        raise TrackedOperationError(f"{name}: expected one argument, got {args.size()}")
    from pyspark.sql.classic.column import Column
    from pyspark.sql.session import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    assert spark._jvm is not None
    argument = Column(spark._jvm.org.apache.spark.sql.Column(args.head()))
    return _Generator(name, argument, aliases)


def _is_star(c: Any) -> bool:
    """``"*"`` or ``F.col("*")``: every column (on a tracked frame: the payload)."""
    if isinstance(c, str):
        return c == "*"
    try:
        if "*" not in str(c._jc.toString()):  # one py4j call for the common case: a column
            return False
        node = c._jc.node()
        return node.getClass().getSimpleName() == "UnresolvedStar" and str(node.sql()) == "*"
    except Exception:  # not a classic Column
        return False


def _plan_kind(df: Any) -> str | None:
    """The class of the top operator of ``df``'s analyzed plan (``Project``, ``Aggregate``...)."""
    try:
        return str(df._jdf.queryExecution().analyzed().getClass().getSimpleName())
    except Exception:  # not a classic DataFrame (Spark Connect): not inspected
        return None


@dataclass(frozen=True)
class Select:
    """``select(*cols)`` — at most one generator among ``cols`` (each generated row is a child
    with its own id; a row generating nothing is acked as dropped)."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = (
        "1 → 1, or 1 → 0..n with a generator (each generated row a child; none: acked)"
    )

    cols: tuple[Any, ...]
    name: str
    # what a generator's translation asked Spark of an input's columns (the argument's type,
    # the other columns' names), by input columns: asked once for the declaration's empty frame
    # and reused for every round's real one (each question is an analysis in the JVM)
    _probes: dict[tuple[str, ...], Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )
    # the output's names, by input columns (a guarded expression is aliased to its own name)
    _names: dict[tuple[str, ...], list[str]] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )
    # the select list and its generator, by input columns (each column is inspected in the JVM)
    _lists: dict[tuple[str, ...], Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )
    # the tracked translation's JVM column lists, by (step, input columns): select_kept
    _kept: dict[Any, Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )

    def describe(self) -> str:
        return f"select({', '.join(map(str, self.cols))})"

    def _columns(self, payload: list[str]) -> tuple[list[Any], tuple[int, _Generator] | None]:
        """The select list ("*" is the payload, never the lineage) and its generator (its
        position), if any; worked out once per input payload."""
        key = tuple(payload)
        got = self._lists.get(key)
        if got is None:
            got = self._lists[key] = self._list_of(payload)
        return got

    def _list_of(self, payload: list[str]) -> tuple[list[Any], tuple[int, _Generator] | None]:
        cols: list[Any] = []
        for c in self.cols:
            cols.extend(payload if _is_star(c) else [c])
        gens = [(i, g) for i, g in ((i, _generator_of(c)) for i, c in enumerate(cols)) if g]
        if len(gens) > 1:
            raise TrackedOperationError(
                f"{self.describe()}: only one generator is allowed per select clause "
                "(Spark's own rule); chain two selects"
            )
        return cols, (gens[0] if gens else None)

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        cols, gen = self._columns(list(proto.columns))
        check_expressions("select", cols)
        if gen is not None:
            self._probe(proto, cols, *gen)
        out = proto.select(*cols)
        if _plan_kind(out) == "Aggregate":
            raise TrackedOperationError(
                f"{self.describe()}: an aggregate function without groupBy aggregates every row "
                "into one, which a tracked DataFrame does as a barrier: write t.agg(...) (or "
                "t.groupBy().agg(...)) instead of t.select(...)"
            )
        check_output_names("select", out.columns)
        check_row_plan(self.describe(), out, proto, _SELECT_NODES)
        self._names[tuple(proto.columns)] = list(out.columns)
        return out

    def apply(self, df: Any, ft: bool) -> Any:
        if not ft:
            return df.select(*self.cols)
        payload = payload_of(df)
        cols, gen = self._columns(payload)
        if gen is None:
            names = self._output_names(df, cols)

            def guarded() -> list[Any]:
                live = [
                    c if isinstance(c, str) else live_only(c).alias(n)
                    for c, n in zip(cols, names, strict=True)
                ]
                return [*live, *LINEAGE]

            return select_kept(df, self._kept, ("apply", tuple(payload)), guarded)
        return self._generate(df, cols, *gen)

    def guarded(self, df: Any, guard: Any) -> Any:
        """The tracked translation with its expressions evaluated by ``guard`` (a
        :class:`~xorack.spark.row_errors.NodeGuard`: a row on which one raises becomes a ghost
        whose record is failed, instead of failing the task)."""
        cols, gen = self._columns(payload_of(df))
        if gen is not None:
            return self._generate(df, cols, *gen, guard=guard)
        exprs = [(f"_ft_v{i}", c) for i, c in enumerate(cols) if not isinstance(c, str)]
        if not exprs:  # names only: nothing can raise
            return self.apply(df, True)
        names = self._output_names(df, cols)
        step = guard.columns(df, exprs)
        f = _f()
        out = [
            c if isinstance(c, str) else f.col(f"_ft_v{i}").alias(n)
            for i, (c, n) in enumerate(zip(cols, names, strict=True))
        ]
        return step.select(*out, *LINEAGE)

    def _output_names(self, df: Any, cols: list[Any]) -> list[str]:
        """The names of the select's outputs over ``df``'s payload (asked of Spark once)."""
        key = tuple(payload_of(df))
        names = self._names.get(key)
        if names is None:  # (declare() asked it for the same payload)
            names = self._names[key] = list(df.select(*cols).columns)
        check_output_names("select", names)
        return names

    def _probe(self, df: Any, cols: list[Any], at: int, gen: _Generator) -> Any:
        """(the generator argument's type, the names of the columns before and after it), asked
        of Spark once per input payload (one analysis) and kept."""
        key = tuple(payload_of(df))
        probe = self._probes.get(key)
        if probe is None:
            before = [as_column(c) for c in cols[:at]]
            after = [as_column(c) for c in cols[at + 1 :]]
            asked = df.select(*before, gen.argument, *after)
            fields = asked.schema.fields
            names = [fl.name for fl in fields]
            probe = (fields[at].dataType, names[:at], names[at + 1 :])
            self._probes[key] = probe
        return probe

    def _generate(
        self, df: Any, cols: list[Any], at: int, gen: _Generator, guard: Any = None
    ) -> Any:
        from pyspark.sql.types import ArrayType, MapType, StructType

        t, names_before, names_after = self._probe(df, cols, at, gen)
        is_map = isinstance(t, MapType)
        if gen.inline and not (isinstance(t, ArrayType) and isinstance(t.elementType, StructType)):
            raise TrackedOperationError(f"{gen.function}: expected an array of structs, got {t}")
        if not isinstance(t, (ArrayType, MapType)):
            raise TrackedOperationError(f"{gen.function}: expected an array or a map, got {t}")
        elements = ["_ft_k", "_ft_v"] if is_map else ["_ft_gen"]
        if gen.inline:
            assert isinstance(t, ArrayType)  # checked above
            assert isinstance(t.elementType, StructType)
            natural = list(t.elementType.fieldNames())
        else:
            natural = ["key", "value"] if is_map else ["col"]
        natural = (["pos"] if gen.with_position else []) + natural
        names = list(gen.aliases) or natural
        if len(names) != len(natural):
            raise TrackedOperationError(
                f"{gen.function}: {len(names)} alias(es) {names} for {len(natural)} generated "
                f"column(s) {natural}"
            )
        # a ghost generates nothing new: its array is null, posexplode_outer keeps it as one row.
        # The argument is computed once: the generator and the children's count read it (the
        # count must be taken beside the generator: a count projected after it would be
        # computed once per child; and evaluating the argument twice, for the count and in the
        # generator, measured slower than this in a word count: 1.17 s against 0.98 s)
        b = [f"_ft_b{i}" for i in range(at)]
        a = [f"_ft_a{i}" for i in range(len(cols) - at - 1)]

        def sides() -> tuple[list[Any], list[Any]]:
            return [as_column(c) for c in cols[:at]], [as_column(c) for c in cols[at + 1 :]]

        if guard is None:

            def step_columns() -> list[Any]:
                before, after = sides()
                return [
                    *[live_only(c).alias(n) for c, n in zip(before, b, strict=True)],
                    live_only(gen.argument).alias("_ft_arg"),
                    *[live_only(c).alias(n) for c, n in zip(after, a, strict=True)],
                    *LINEAGE,
                ]

            step = select_kept(df, self._kept, ("step", tuple(payload_of(df))), step_columns)
        else:  # the same columns, a raising row turned into a ghost (its record failed)
            before, after = sides()
            exprs = [
                *zip(b, before, strict=True),
                ("_ft_arg", gen.argument),
                *zip(a, after, strict=True),
            ]
            step = guard.columns(df, exprs).select(*b, "_ft_arg", *a, *LINEAGE)
        step = select_expr(
            step,
            [
                *b,
                f"posexplode_outer(_ft_arg) AS ({POS}, {', '.join(elements)})",
                *a,
                "size(_ft_arg) AS _ft_n",  # the parent's children
                *LINEAGE,
            ],
        )
        generated = [f"{POS} AS {q(names[0])}"] if gen.with_position else []
        rest = names[1:] if gen.with_position else names
        if gen.inline:
            assert isinstance(t, ArrayType)  # checked above
            assert isinstance(t.elementType, StructType)
            fields = t.elementType.fieldNames()
            generated += [f"_ft_gen.{q(n)} AS {q(al)}" for n, al in zip(fields, rest, strict=True)]
        else:
            generated += [f"{e} AS {q(al)}" for e, al in zip(elements, rest, strict=True)]
        is_child = f"({KEEP} AND ({POS} IS NOT NULL OR {str(gen.outer).lower()}))"
        lineage = fan_out(salt_of(self.name), POS, is_child, count="_ft_n")
        check_output_names("select", [*names_before, *names, *names_after])
        # a parent that generated nothing leaves a ghost: its other columns are nulled, as every
        # ghost's are (ghost_payload), so that no later expression fails on a row Spark drops
        kept = f"CASE WHEN {is_child} THEN {{}} END" if not gen.outer else "{}"
        return select_expr(
            step,
            [
                *[f"{kept.format(x)} AS {q(n)}" for x, n in zip(b, names_before, strict=True)],
                *generated,
                *[f"{kept.format(x)} AS {q(n)}" for x, n in zip(a, names_after, strict=True)],
                *lineage,
            ],
        )


@dataclass(frozen=True)
class WithColumns:
    """``withColumn(name, col)`` / ``withColumns({name: col})``; one generator allowed (then it
    is ``select("*", generator.alias(name))``, as in Spark)."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = (
        "1 → 1, or 1 → 0..n with a generator (each generated row a child; none: acked)"
    )

    mapping: tuple[tuple[str, Any], ...]
    name: str
    # the select a generator amounts to, by input columns (one object per payload: it keeps
    # what its translation asked of Spark, see Select); None without a generator
    _selects: dict[tuple[str, ...], Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )
    # the tracked translation's JVM lists (select_kept)
    _kept: dict[Any, Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )

    def describe(self) -> str:
        return f"withColumns({[n for n, _ in self.mapping]})"

    def _select(self, payload: list[str]) -> Select | None:
        """The select a generator column amounts to (as in Spark), or None without one."""
        key = tuple(payload)
        if key not in self._selects:
            self._selects[key] = self._select_of(payload)
        return self._selects[key]

    def _select_of(self, payload: list[str]) -> Select | None:
        check_output_names("withColumn", [n for n, _ in self.mapping])
        gens = [n for n, c in self.mapping if _generator_of(c) is not None]
        if not gens:
            return None
        if len(self.mapping) != 1:
            raise TrackedOperationError(
                f"withColumns: a generator ({gens}) must be added alone: use withColumn"
            )
        ((col_name, col),) = self.mapping
        cols: list[Any] = [c for c in payload if c != col_name]
        if col_name in payload:
            at = payload.index(col_name)
            cols = [*payload[:at], col.alias(col_name), *payload[at + 1 :]]
        else:
            cols = [*payload, col.alias(col_name)]
        return Select(tuple(cols), self.name)

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        select = self._select(list(proto.columns))
        if select is not None:
            return select.declare(proto)
        check_expressions("withColumn", [c for _, c in self.mapping])
        out = proto.withColumns(dict(self.mapping))
        check_row_plan(self.describe(), out, proto, _SELECT_NODES)
        return out

    def apply(self, df: Any, ft: bool) -> Any:
        select = self._select(payload_of(df) if ft else list(df.columns))
        if select is not None:
            return select.apply(df, ft)
        if not ft:
            return df.withColumns(dict(self.mapping))
        jdf = getattr(df, "_jdf", None)
        if jdf is None:  # pragma: no cover - Spark Connect
            out = df.withColumns({n: live_only(c) for n, c in self.mapping})
        else:  # the names and the guarded columns sent once (select_kept)
            from pyspark.sql.classic.column import _to_seq
            from pyspark.sql.classic.dataframe import DataFrame

            session = df.sparkSession

            def lists() -> tuple[Any, Any]:
                names = _to_seq(session.sparkContext, [n for n, _ in self.mapping])
                return names, df._jcols(*[live_only(c) for _, c in self.mapping])

            names, cols = kept_in_jvm(self._kept, "with", session._jvm, lists)
            out = DataFrame(jdf.withColumns(names, cols), session)
        payload = payload_of(df)
        new = [n for n, _ in self.mapping if n not in payload]
        return with_lineage_last(out, [*payload, *new])

    def guarded(self, df: Any, guard: Any) -> Any:
        """The tracked translation with its expressions evaluated by ``guard`` (see
        :meth:`Select.guarded`)."""
        payload = payload_of(df)
        select = self._select(payload)
        if select is not None:
            return select.guarded(df, guard)
        f = _f()
        temp = [f"_ft_v{i}" for i in range(len(self.mapping))]
        step = guard.columns(df, [(t, c) for t, (_, c) in zip(temp, self.mapping, strict=True)])
        out = step.withColumns(
            {n: f.col(t) for t, (n, _) in zip(temp, self.mapping, strict=True)}
        ).drop(*temp)
        new = [n for n, _ in self.mapping if n not in payload]
        return with_lineage_last(out, [*payload, *new])


@dataclass(frozen=True)
class Renamed:
    """``withColumnRenamed(old, new)``."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 1 (the row keeps its id)"

    old: str
    new: str

    def describe(self) -> str:
        return f"withColumnRenamed({self.old!r}, {self.new!r})"

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        return self.apply(proto, ft=True)

    def apply(self, df: Any, ft: bool) -> Any:
        check_output_names("withColumnRenamed", [self.new])
        if ft and self.old in LINEAGE:
            raise TrackedOperationError(f"withColumnRenamed: {self.old!r} is a lineage column")
        return df.withColumnRenamed(self.old, self.new)


@dataclass(frozen=True)
class Drop:
    """``drop(*cols)`` (names)."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 1 (the row keeps its id)"

    cols: tuple[str, ...]

    def describe(self) -> str:
        return f"drop({', '.join(self.cols)})"

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        return self.apply(proto, ft=True)

    def apply(self, df: Any, ft: bool) -> Any:
        bad = [c for c in self.cols if not isinstance(c, str)]
        if bad:
            raise TypeError(f"drop: takes column names on a tracked DataFrame, got {bad}")
        if ft and any(c in LINEAGE for c in self.cols):
            raise TrackedOperationError(f"drop: {list(self.cols)} includes lineage columns")
        return df.drop(*self.cols)


@dataclass(frozen=True)
class Filter:
    """``filter(cond)`` / ``where(cond)``: a removed row is acked as dropped at once."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 0..1 (a removed row is acked as dropped)"

    cond: Any
    # the tracked translation's JVM lists (select_kept)
    _kept: dict[Any, Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )

    def describe(self) -> str:
        return f"filter({self.cond})"

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        check_expressions("filter", [_condition(self.cond)])
        out = self.apply(proto, ft=False)
        check_row_plan(self.describe(), out, proto, _FILTER_NODES)
        return out

    def apply(self, df: Any, ft: bool) -> Any:
        if not ft:
            return df.where(_condition(self.cond))
        payload = payload_of(df)
        if isinstance(self.cond, str):  # SQL text: evaluated once, into a column of its own
            cond = f"CASE WHEN {KEEP} THEN ({self.cond}) END AS _ft_cond"
            step = select_expr(df, [*map(q, payload), *LINEAGE, cond])
        else:  # (the column sent once: select_kept)

            def columns() -> list[Any]:
                return ["*", live_only(_condition(self.cond)).alias("_ft_cond")]

            step = select_kept(df, self._kept, "cond", columns)
        lineage = drop_where("_ft_cond")
        keep = f"({KEEP} AND coalesce(_ft_cond, false))"
        return select_expr(step, [*ghost_payload(payload, keep), *lineage])

    def guarded(self, df: Any, guard: Any) -> Any:
        """The tracked translation with the condition evaluated by ``guard`` (see
        :meth:`Select.guarded`)."""
        cond = _f().expr(self.cond) if isinstance(self.cond, str) else _condition(self.cond)
        step = guard.columns(df, [("_ft_cond", cond)])
        keep = f"({KEEP} AND coalesce(_ft_cond, false))"
        return select_expr(step, [*ghost_payload(payload_of(df), keep), *drop_where("_ft_cond")])


def is_column(c: Any) -> bool:
    """Whether ``c`` is a PySpark Column (classic or Connect)."""
    return type(c).__name__ == "Column"


@dataclass(frozen=True)
class Qualified:
    """An operation with expressions (``Select``, ``WithColumns``, ``Filter``) whose input is
    aliased ``qualifier`` first, so that ``t["k"]`` / ``t.k`` (``F.col("`t`.`k`")``) and
    ``t.alias("a")``'s ``F.col("a.k")`` resolve against it; Spark removes the alias when it
    optimizes, so it costs nothing."""

    op: Any
    qualifier: str

    @property
    def lineage(self) -> str:
        """The wrapped operation's lineage rule."""
        return str(self.op.lineage)

    def describe(self) -> str:
        return str(self.op.describe())

    def declare(self, proto: Any) -> Any:
        """The wrapped operation's declaration on the aliased frame."""
        return self.op.declare(proto.alias(self.qualifier))

    def apply(self, df: Any, ft: bool) -> Any:
        return self.op.apply(df.alias(self.qualifier), ft)

    def guarded(self, df: Any, guard: Any) -> Any:
        """The wrapped operation's guarded translation on the aliased frame."""
        return self.op.guarded(df.alias(self.qualifier), guard)


def unqualified(op: Any) -> tuple[Any, str | None]:
    """A row operation and the qualifier its input is aliased with (``t.k``), if any."""
    return (op.op, op.qualifier) if isinstance(op, Qualified) else (op, None)


@dataclass(frozen=True)
class Renames:
    """``withColumnsRenamed({old: new})``."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 1 (the row keeps its id)"

    mapping: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return f"withColumnsRenamed({dict(self.mapping)!r})"

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        out = self.apply(proto, ft=True)
        check_output_names("withColumnsRenamed", out.columns)
        return out

    def apply(self, df: Any, ft: bool) -> Any:
        bad = [k for k, v in self.mapping if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"withColumnsRenamed: takes {{old name: new name}}, got {bad!r}")
        check_output_names("withColumnsRenamed", [v for _, v in self.mapping])
        if ft and any(k in LINEAGE for k, _ in self.mapping):
            raise TrackedOperationError(
                f"withColumnsRenamed: {dict(self.mapping)} renames lineage columns"
            )
        return df.withColumnsRenamed(dict(self.mapping))


@dataclass(frozen=True)
class FillNull:
    """``fillna(value, subset)`` / ``na.fill``: Spark's own fill on the payload columns (a
    ghost's payload stays null)."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 1 (the row keeps its id)"

    value: Any  # a scalar or a tuple of (column, value) pairs
    subset: tuple[str, ...] | None

    def describe(self) -> str:
        value = dict(self.value) if isinstance(self.value, tuple) else self.value
        sub = "" if self.subset is None else f", subset={list(self.subset)}"
        return f"fillna({value!r}{sub})"

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        return self.apply(proto, ft=False)

    def _fill(self, df: Any, payload: list[str]) -> Any:
        if isinstance(self.value, tuple):
            mapping = dict(self.value)
            missing = [c for c in mapping if c not in payload]
            if missing:
                raise TrackedOperationError(f"fillna: columns {missing} not in {payload}")
            return df.fillna(mapping)
        subset = list(self.subset) if self.subset is not None else payload
        missing = [c for c in subset if c not in payload]
        if missing:
            raise TrackedOperationError(f"fillna: columns {missing} not in {payload}")
        return df.fillna(self.value, subset=subset)

    def apply(self, df: Any, ft: bool) -> Any:
        if not ft:
            return self._fill(df, list(df.columns))
        payload = payload_of(df)
        out = self._fill(df, payload)
        return select_expr(out, [*ghost_payload(payload), *LINEAGE])


def present_count(schema: Any, cols: Sequence[str]) -> Any:
    """How many of ``cols`` hold a value (neither null nor, in a floating-point column, NaN):
    Spark's ``na.drop`` rule (``AtLeastNNonNulls``)."""
    from pyspark.sql.types import DoubleType, FloatType

    f = _f()
    total = f.lit(0)
    for c in cols:
        col = f.col(q(c))
        if isinstance(schema[c].dataType, (DoubleType, FloatType)):
            there = col.isNotNull() & ~f.isnan(col)
        else:
            there = col.isNotNull()
        total = total + f.when(there, 1).otherwise(0)
    return total


def mapping_arg(mapping: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(mapping, Mapping):
        raise TypeError(f"withColumns: expected a dict {{name: Column}}, got {type(mapping)}")
    return tuple(mapping.items())


__all__ = [
    "GENERATORS",
    "Drop",
    "FillNull",
    "Filter",
    "Qualified",
    "Renamed",
    "Renames",
    "Select",
    "TrackedOperationError",
    "WithColumns",
    "is_column",
    "payload_of",
    "present_count",
]
