"""Joins of a tracked frame with an untracked DataFrame (a lookup or dimension table, the
:class:`LookupJoin` row operation), and the join arguments every tracked join shares: ``how``
with Spark's aliases, ``on`` as names or a condition, the equi-keys of a condition.

>>> join_type("leftouter"), tracked_join_type("outer")
('left', 'full')
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .lineage import KEEP, LINEAGE, POS, fan_out, ghost_payload, q, select_expr
from .ops import (
    TrackedOperationError,
    _f,
    check_output_names,
    is_column,
    payload_of,
    salt_of,
)

JOIN_TYPES = ("inner", "left", "left_semi", "left_anti")
#: the join types between two tracked frames (a barrier: Spark's own join, once, over complete
#: inputs, so every type is exact)
TRACKED_JOIN_TYPES = ("inner", "left", "right", "full", "left_semi", "left_anti")
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
_TRACKED_JOIN_ALIASES = {
    **_JOIN_ALIASES,
    "right": "right",
    "rightouter": "right",
    "right_outer": "right",
    "full": "full",
    "outer": "full",
    "fullouter": "full",
    "full_outer": "full",
}


def _join_kind(how: str, aliases: dict[str, str], types: Any, between: str) -> str:
    """``how`` normalized through Spark's ``aliases``, or one line naming the ``types``."""
    key = str(how).lower()
    if key not in aliases:
        raise TrackedOperationError(
            f"join: how={how!r} {between} is not supported; use one of {list(types)}"
        )
    return aliases[key]


def join_type(how: str) -> str:
    """``how`` of a join with an untracked DataFrame, normalized (Spark's aliases)."""
    return _join_kind(how, _JOIN_ALIASES, JOIN_TYPES, "on a tracked DataFrame")


def tracked_join_type(how: str) -> str:
    """``how`` of a join between two tracked frames, normalized (Spark's aliases)."""
    return _join_kind(
        how, _TRACKED_JOIN_ALIASES, TRACKED_JOIN_TYPES, "between two tracked DataFrames"
    )


def join_condition(on: Any) -> Any:
    """A join's ``on`` as one Column condition (a list of Columns is ANDed, as Spark does), or
    None when ``on`` names columns."""
    if is_column(on):
        return on
    if isinstance(on, (list, tuple)) and on and all(is_column(c) for c in on):
        cond = on[0]
        for c in on[1:]:
            cond = cond & c
        return cond
    if isinstance(on, (list, tuple)) and any(is_column(c) for c in on):
        raise TrackedOperationError(
            f"join: `on` mixes column names and Columns ({on!r}); give names or Columns"
        )
    return None


def _attribute(node: Any) -> tuple[str, ...] | None:
    """The name parts of an attribute reference (``F.col("t.k")``: ("t", "k")), else None."""
    if node.getClass().getSimpleName() != "UnresolvedAttribute":
        return None
    parts = node.nameParts()
    return tuple(str(parts.apply(i)) for i in range(parts.size()))


def equi_keys(
    cond: Any, left: tuple[str, Sequence[str]], right: tuple[str, Sequence[str]]
) -> list[tuple[str, str]]:
    """The equi-join keys of a join condition: the (left column, right column) of each
    ``a == b`` conjunct between a column of either side (``left``/``right``: the side's
    qualifier and columns; a name without qualifier belongs to the one side that has it).
    Conjuncts of another shape (the residual condition) are left out; [] when the condition
    cannot be read (Spark Connect)."""

    def side(parts: tuple[str, ...]) -> tuple[int, str] | None:
        if len(parts) == 2:
            for i, (qual, cols) in enumerate((left, right)):
                if parts[0] == qual and parts[1] in cols:
                    return i, parts[1]
            return None
        if len(parts) == 1:
            found = [i for i, (_, cols) in enumerate((left, right)) if parts[0] in cols]
            return (found[0], parts[0]) if len(found) == 1 else None
        return None

    def walk(node: Any) -> list[tuple[str, str]]:
        if node.getClass().getSimpleName() != "UnresolvedFunction":
            return []
        name = str(node.functionName()).lower()
        args = [node.arguments().apply(i) for i in range(node.arguments().size())]
        if name == "and":
            return [k for a in args for k in walk(a)]
        if name not in ("==", "=", "equalto") or len(args) != 2:
            return []
        a, b = (_attribute(x) for x in args)
        sa, sb = (side(p) if p is not None else None for p in (a, b))
        if sa is None or sb is None or sa[0] == sb[0]:
            return []
        return [(sa[1], sb[1])] if sa[0] == 0 else [(sb[1], sa[1])]

    try:
        return walk(cond._jc.node())
    except Exception:  # not a classic Column (Spark Connect): no keys read
        return []


def join_keys(on: Any, left: Sequence[str], right: Sequence[str]) -> list[str]:
    keys = [on] if isinstance(on, str) else list(on) if isinstance(on, (list, tuple)) else None
    if not keys or not all(isinstance(k, str) for k in keys):
        raise TrackedOperationError(
            "join: `on` must be a column name, a list of names (an equi-join on columns both "
            "sides have) or, between two tracked DataFrames, a Column condition "
            f"(t1.k == t2.k2), got {on!r}"
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


#: The other side of lookup joins as their tracked translation joins it, by the untracked
#: DataFrame and ``(on, how)``: built once for every round, run and join of the same frame (an
#: iterative job joins one frame in each iteration; each build is a few dozen py4j calls). A
#: DataFrame is immutable, and the entry goes with it.
_LOOKUP_SIDES: weakref.WeakKeyDictionary[Any, dict[tuple[Any, str], Any]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class LookupJoin:
    """``join(df, on, how)`` with an untracked DataFrame. Inner/left: each match is a child
    (several matches, several children); an unmatched row under inner is acked as dropped.
    Semi/anti: the row itself passes or is acked as dropped."""

    #: how record ids flow through it (``explain()``)
    lineage: ClassVar[str] = "1 → 0..n (each match a child; no match under inner/semi: acked)"

    other: Any
    on: tuple[str, ...]
    how: str
    name: str

    def describe(self) -> str:
        return f"join(<DataFrame>, {list(self.on)}, {self.how!r})"

    def _other_side(self) -> Any:
        """The other side's distinct keys (semi, anti) or its rows with each match's rank
        (``_ft_pos``) among its key's and their count (``_ft_n``): inner, left."""
        built = _LOOKUP_SIDES.setdefault(self.other, {})
        if (self.on, self.how) in built:
            return built[(self.on, self.how)]
        f = _f()
        keys = list(self.on)
        if self.how in ("left_semi", "left_anti"):
            lk = self.other.selectExpr(*map(q, keys)).distinct().withColumn(POS, f.lit(0))
        else:
            from pyspark.sql import Window

            right = list(self.other.columns)
            by = [f.col(q(k)) for k in keys]
            rank = Window.partitionBy(*by).orderBy(f.xxhash64(*[f.col(q(c)) for c in right]))
            lk = self.other.withColumn(POS, f.row_number().over(rank) - 1)
            lk = lk.withColumn("_ft_n", f.count(f.lit(1)).over(Window.partitionBy(*by)))
        lk = f.broadcast(lk) if _has_broadcast_hint(self.other) else lk
        built[(self.on, self.how)] = lk
        return lk

    def _check(self, payload: list[str], right: list[str]) -> None:
        check_output_names("join (the other side)", right)
        clash = sorted((set(right) - set(self.on)) & set(payload))
        if clash and self.how in ("inner", "left"):
            raise TrackedOperationError(
                f"join: columns {clash} are on both sides (the output would have two columns "
                "of each name); rename them on one side first"
            )

    def declare(self, proto: Any) -> Any:
        """The declaration-time analysis on a payload-only frame (see the module's doc)."""
        self._check(list(proto.columns), list(self.other.columns))
        return self.apply(proto, ft=False)

    def apply(self, df: Any, ft: bool) -> Any:
        keys = list(self.on)
        if not ft:
            return df.join(self.other, on=keys, how=self.how)
        payload = payload_of(df)
        right = list(self.other.columns)
        self._check(payload, right)
        lk = self._other_side()
        if self.how in ("left_semi", "left_anti"):
            j = df.join(lk, on=keys, how="left")
            passes = f"({POS} IS {'NOT ' if self.how == 'left_semi' else ''}NULL)"
            lineage = fan_out(0, "0", f"({KEEP} AND {passes})", same_id=True)
            order = [*keys, *[c for c in payload if c not in keys]]  # Spark's USING-join order
            out = select_expr(j, [*map(q, order), *lineage])
            return select_expr(out, [*ghost_payload(order), *LINEAGE])
        salt = salt_of(self.name)
        j = df.join(lk, on=keys, how="left")
        is_child = f"({KEEP} AND {POS} IS NOT NULL)" if self.how == "inner" else KEEP
        lineage = fan_out(salt, POS, is_child, count="_ft_n")
        order = [
            *keys,
            *[c for c in payload if c not in keys],
            *[c for c in right if c not in keys],
        ]
        out = select_expr(j, [*map(q, order), *lineage])
        if self.how == "inner":
            out = select_expr(out, [*ghost_payload(order), *LINEAGE])
        return out


# --------------------------------------------------------------------------------------------
# column access by qualifier, renames, null filling


__all__ = [
    "JOIN_TYPES",
    "TRACKED_JOIN_TYPES",
    "LookupJoin",
    "equi_keys",
    "join_condition",
    "join_keys",
    "join_type",
    "tracked_join_type",
]
