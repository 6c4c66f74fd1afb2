"""Native tracked operations: PySpark DataFrame operations that run in the JVM with their
lineage kept (see :mod:`xorack.spark.lineage` for the rules).

Each operation is a small frozen object with ``apply(df, ft)``: with FT on, ``df`` holds the
payload followed by the lineage columns and the result does too; with FT off it is the plain
PySpark call. The pipeline applies it to an empty prototype at declaration time (so a bad
expression is an error where it is written, not in the middle of a run) and to the real frames
of each round.

>>> Filter("x > 1").describe()
'filter(x > 1)'
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .lineage import KEEP, LINEAGE, POS, drop_where, fan_out, ghost_payload

GENERATORS = {
    # name: (outer, with position, inline)
    "explode": (False, False, False),
    "explode_outer": (True, False, False),
    "posexplode": (False, True, False),
    "posexplode_outer": (True, True, False),
    "inline": (False, False, True),
    "inline_outer": (True, False, True),
}
JOIN_TYPES = ("inner", "left", "left_semi", "left_anti")
_JOIN_ALIASES = {
    "inner": "inner",
    "left": "left",
    "leftouter": "left",
    "left_outer": "left",
    "semi": "left_semi",
    "leftsemi": "left_semi",
    "left_semi": "left_semi",
    "anti": "left_anti",
    "leftanti": "left_anti",
    "left_anti": "left_anti",
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
    return df if list(df.columns) == cols else df.select(*cols)


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


def _condition(cond: Any) -> Any:
    f = _f()
    if isinstance(cond, str):
        return f.expr(cond)
    if type(cond).__name__ != "Column":
        raise TypeError(f"filter: condition must be a Column or a SQL string, got {type(cond)}")
    return cond


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


@dataclass(frozen=True)
class Select:
    """``select(*cols)`` — at most one generator among ``cols`` (each generated row is a child
    with its own id; a row generating nothing is acked as dropped)."""

    cols: tuple[Any, ...]
    name: str

    def describe(self) -> str:
        return f"select({', '.join(map(str, self.cols))})"

    def apply(self, df: Any, ft: bool) -> Any:
        if not ft:
            return df.select(*self.cols)
        payload = payload_of(df)
        cols: list[Any] = []
        for c in self.cols:  # "*" is the payload, never the lineage
            cols.extend(payload if isinstance(c, str) and c == "*" else [c])
        gens = [(i, g) for i, g in ((i, _generator_of(c)) for i, c in enumerate(cols)) if g]
        if len(gens) > 1:
            raise TrackedOperationError(
                f"{self.describe()}: only one generator is allowed per select clause "
                "(Spark's own rule); chain two selects"
            )
        if not gens:
            out = df.select(*cols, *LINEAGE)
            check_output_names("select", payload_of(out))
            return out
        at, gen = gens[0]
        return self._generate(df, cols, at, gen)

    def _generate(self, df: Any, cols: list[Any], at: int, gen: _Generator) -> Any:
        from pyspark.sql.types import ArrayType, MapType, StructType

        f = _f()
        keep = f.col(KEEP)
        salt = salt_of(self.name)
        t = df.select(gen.argument.alias("_ft_arg")).schema["_ft_arg"].dataType
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
        # a ghost generates nothing new: its array is null, posexplode_outer keeps it as one row
        # (the argument is computed once: the generator and the children's count read it)
        exploded = f.posexplode_outer(f.col("_ft_arg")).alias(POS, *elements)
        before = [as_column(c) for c in cols[:at]]
        after = [as_column(c) for c in cols[at + 1 :]]
        names_before = df.select(*before).columns if before else []
        names_after = df.select(*after).columns if after else []
        step = df.select(
            *[c.alias(f"_ft_b{i}") for i, c in enumerate(before)],
            f.when(keep, gen.argument).alias("_ft_arg"),
            *[c.alias(f"_ft_a{i}") for i, c in enumerate(after)],
            *LINEAGE,
        )
        step = step.select(
            *[f"_ft_b{i}" for i in range(len(before))],
            exploded,
            *[f"_ft_a{i}" for i in range(len(after))],
            f.size(f.col("_ft_arg")).alias("_ft_n"),  # the parent's children
            *LINEAGE,
        )
        generated = [f.col(POS).alias(names[0])] if gen.with_position else []
        rest = names[1:] if gen.with_position else names
        if gen.inline:
            assert isinstance(t, ArrayType)  # checked above
            assert isinstance(t.elementType, StructType)
            fields = t.elementType.fieldNames()
            generated += [
                f.col("_ft_gen").getField(n).alias(a) for n, a in zip(fields, rest, strict=True)
            ]
        else:
            generated += [f.col(e).alias(a) for e, a in zip(elements, rest, strict=True)]
        ordinal = f.col(POS)
        is_child = keep & (ordinal.isNotNull() | f.lit(gen.outer))
        lineage = fan_out(salt, ordinal, is_child, count=f.col("_ft_n"))
        out = step.select(
            *[f.col(f"_ft_b{i}").alias(n) for i, n in enumerate(names_before)],
            *generated,
            *[f.col(f"_ft_a{i}").alias(n) for i, n in enumerate(names_after)],
            *lineage,
        )
        check_output_names("select", payload_of(out))
        return out


@dataclass(frozen=True)
class WithColumns:
    """``withColumn(name, col)`` / ``withColumns({name: col})``; one generator allowed (then it
    is ``select("*", generator.alias(name))``, as in Spark)."""

    mapping: tuple[tuple[str, Any], ...]
    name: str

    def describe(self) -> str:
        return f"withColumns({[n for n, _ in self.mapping]})"

    def apply(self, df: Any, ft: bool) -> Any:
        check_output_names("withColumn", [n for n, _ in self.mapping])
        gens = [n for n, c in self.mapping if _generator_of(c) is not None]
        if gens:
            if len(self.mapping) != 1:
                raise TrackedOperationError(
                    f"withColumns: a generator ({gens}) must be added alone: use withColumn"
                )
            ((col_name, col),) = self.mapping
            payload = payload_of(df) if ft else list(df.columns)
            cols: list[Any] = [c for c in payload if c != col_name]
            if col_name in payload:
                at = payload.index(col_name)
                cols = [*payload[:at], col.alias(col_name), *payload[at + 1 :]]
            else:
                cols = [*payload, col.alias(col_name)]
            return Select(tuple(cols), self.name).apply(df, ft)
        out = df.withColumns(dict(self.mapping))
        if not ft:
            return out
        payload = payload_of(df)
        new = [n for n, _ in self.mapping if n not in payload]
        return with_lineage_last(out, [*payload, *new])


@dataclass(frozen=True)
class Renamed:
    """``withColumnRenamed(old, new)``."""

    old: str
    new: str

    def describe(self) -> str:
        return f"withColumnRenamed({self.old!r}, {self.new!r})"

    def apply(self, df: Any, ft: bool) -> Any:
        check_output_names("withColumnRenamed", [self.new])
        if ft and self.old in LINEAGE:
            raise TrackedOperationError(f"withColumnRenamed: {self.old!r} is a lineage column")
        return df.withColumnRenamed(self.old, self.new)


@dataclass(frozen=True)
class Drop:
    """``drop(*cols)`` (names)."""

    cols: tuple[str, ...]

    def describe(self) -> str:
        return f"drop({', '.join(self.cols)})"

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

    cond: Any

    def describe(self) -> str:
        return f"filter({self.cond})"

    def apply(self, df: Any, ft: bool) -> Any:
        cond = _condition(self.cond)
        if not ft:
            return df.where(cond)
        payload = payload_of(df)
        step = df.select(*payload, *drop_where(cond))
        return step.select(*ghost_payload(payload), *LINEAGE)


# --------------------------------------------------------------------------------------------
# joins with an untracked DataFrame (a lookup or dimension table)


def join_type(how: str) -> str:
    key = str(how).lower()
    if key not in _JOIN_ALIASES:
        raise TrackedOperationError(
            f"join: how={how!r} is not supported on a tracked DataFrame; use one of "
            f"{list(JOIN_TYPES)}"
        )
    return _JOIN_ALIASES[key]


def join_keys(on: Any, left: Sequence[str], right: Sequence[str]) -> list[str]:
    keys = [on] if isinstance(on, str) else list(on) if isinstance(on, (list, tuple)) else None
    if not keys or not all(isinstance(k, str) for k in keys):
        raise TrackedOperationError(
            "join: `on` must be a column name or a list of names on a tracked DataFrame (an "
            f"equi-join on columns both sides have), got {on!r}; rename the key columns so "
            "both sides share their names"
        )
    for side, cols in (("left", left), ("right", right)):
        missing = [k for k in keys if k not in cols]
        if missing:
            raise TrackedOperationError(f"join: key(s) {missing} not in the {side} side {cols}")
    return keys


def _has_broadcast_hint(df: Any) -> bool:
    try:
        plan = df._jdf.queryExecution().logical()
        return "Hint" in str(plan.getClass().getSimpleName())
    except Exception:
        return False


@dataclass(frozen=True)
class LookupJoin:
    """``join(df, on, how)`` with an untracked DataFrame. Inner/left: each match is a child
    (several matches, several children); an unmatched row under inner is acked as dropped.
    Semi/anti: the row itself passes or is acked as dropped."""

    other: Any
    on: tuple[str, ...]
    how: str
    name: str

    def describe(self) -> str:
        return f"join(<DataFrame>, {list(self.on)}, {self.how!r})"

    def apply(self, df: Any, ft: bool) -> Any:
        f = _f()
        keys = list(self.on)
        if not ft:
            return df.join(self.other, on=keys, how=self.how)
        payload = payload_of(df)
        right = list(self.other.columns)
        check_output_names("join (the other side)", right)
        clash = sorted((set(right) - set(keys)) & set(payload))
        if clash and self.how in ("inner", "left"):
            raise TrackedOperationError(
                f"join: columns {clash} are on both sides (the output would have two columns "
                "of each name); rename them on one side first"
            )
        keep = f.col(KEEP)
        if self.how in ("left_semi", "left_anti"):
            lk = self.other.select(*keys).distinct().withColumn(POS, f.lit(0))
            lk = f.broadcast(lk) if _has_broadcast_hint(self.other) else lk
            j = df.join(lk, on=keys, how="left")
            matched = f.col(POS).isNotNull()
            passes = matched if self.how == "left_semi" else ~matched
            lineage = fan_out(0, f.lit(0), keep & passes, same_id=True)
            order = [*keys, *[c for c in payload if c not in keys]]  # Spark's USING-join order
            out = j.select(*order, *lineage)
            return out.select(*ghost_payload(order), *LINEAGE)
        from pyspark.sql import Window

        rank = Window.partitionBy(*keys).orderBy(f.xxhash64(*[f.col(c) for c in right]))
        lk = self.other.withColumn(POS, f.row_number().over(rank) - 1)
        lk = lk.withColumn("_ft_n", f.count(f.lit(1)).over(Window.partitionBy(*keys)))
        lk = f.broadcast(lk) if _has_broadcast_hint(self.other) else lk
        salt = salt_of(self.name)
        j = df.join(lk, on=keys, how="left")
        matched = f.col(POS).isNotNull()
        is_child = keep & matched if self.how == "inner" else keep
        lineage = fan_out(salt, f.col(POS), is_child, count=f.col("_ft_n"))
        order = [
            *keys,
            *[c for c in payload if c not in keys],
            *[c for c in right if c not in keys],
        ]
        out = j.select(*order, *lineage)
        if self.how == "inner":
            out = out.select(*ghost_payload(order), *LINEAGE)
        return out


def mapping_arg(mapping: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(mapping, Mapping):
        raise TypeError(f"withColumns: expected a dict {{name: Column}}, got {type(mapping)}")
    return tuple(mapping.items())


__all__ = [
    "GENERATORS",
    "JOIN_TYPES",
    "Drop",
    "Filter",
    "LookupJoin",
    "Renamed",
    "Select",
    "TrackedOperationError",
    "WithColumns",
    "join_keys",
    "join_type",
    "payload_of",
]
