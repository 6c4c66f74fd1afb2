"""Lineage through Spark's own operators: the columns every tracked row carries and the rules
that keep its XOR tree exact when a filter, a generator or a join runs in the JVM.

A tracked DataFrame carries four lineage columns after its payload:

* ``_ft_src`` — the source id of the attempt of the source record the row derives from;
* ``_ft_rec`` — the row's own record id;
* ``_ft_ev``  — an XOR event not sent yet: native operators cannot call the acker, so what a row
  owes its source record rides along with it to the next Python boundary (a stage, a sink, the
  staging of a barrier), where the events of a batch are reduced per source id and sent;
* ``_ft_keep`` — false for a *ghost*: a row a filter, an unmatched join or an empty generator
  removed. It is dropped at the next boundary after its event (the ack of the removed row) is
  sent, so that a removed row is acked as dropped and never times out.

The rules (each an expression over one row, so Spark evaluates them in generated code):

* 1→1 (select, withColumn, a semi-join match): the row keeps its id; nothing to send;
* 1→0 (filter, an unmatched inner join, an empty generator): ``ev ^= rec``, ``keep = false``;
* 1→n (a generator, a join with several matches): child ``i`` of ``n`` gets the id
  ``c_i = xxhash64(salt, rec, i)``. Child 0 carries the parent's ack, the parent's pending
  event, its own id and its next sibling's; every other child carries its next sibling's id
  (``c_(i+1)``, none for the last): ``ev_0 = ev ^ rec ^ c_0 ^ c_1``, ``ev_i = c_(i+1)``. A
  child's id thus enters the checksum no later than the event that replaces its parent's
  ack (child 0's) or its elder sibling's ack, so the checksum stays nonzero while any child is
  on its way: the children of one parent land in different batches and tasks, and were each
  child to carry only its own id, the other children's acks could arrive first and bring the
  checksum to zero with one child still unprocessed (a record completed with a row not
  processed yet, whose failure then came too late — seen when a failing row's task ran last).
  Each output row costs two hashes, in Spark's generated code.

A ghost stays a ghost (``keep`` is never set back) and owes nothing more; it is copied by a
later generator or join at most as "child 0", which carries its event once.

Ids made by ``xxhash64`` are deterministic (a replay re-creates them, so idempotent sinks
absorb duplicates), 64 bits, and 0 only with probability 2^-64 (an id 0 would make a lost row
undetectable; it is not worth a branch).

>>> LINEAGE
('_ft_src', '_ft_rec', '_ft_ev', '_ft_keep')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

SRC = "_ft_src"
REC = "_ft_rec"
EV = "_ft_ev"
KEEP = "_ft_keep"
LINEAGE = (SRC, REC, EV, KEEP)
EVT = "_ft_evt"  # staged rows: the whole event a staged row sends (its pending event ^ its ack)
POS = "_ft_pos"  # internal: a generator's position / a lookup row's rank among its key's rows


def q(name: str) -> str:
    """``name`` as a quoted Spark SQL identifier.

    >>> q("word"), q("a`b")
    ('`word`', '`a``b`')
    """
    return "`" + name.replace("`", "``") + "`"


_T = TypeVar("_T")

_SEP = "\u0001"  # between the expressions sent as one string (never in SQL text)
_SELECT_JVM: dict[Any, tuple[Any, Any]] = {}  # (splitter, Seq maker), by JVM view


def kept_in_jvm(cache: dict[Any, Any], key: Any, jvm: Any, build: Callable[[], _T]) -> _T:
    """``build()``, made once per ``key`` and JVM: the JVM objects in ``cache[key]`` are
    reused by every later call on the same JVM view and built anew when the JVM started again
    (a new SparkContext: the old objects point into a gateway that is gone). ``key`` must
    name everything ``build`` depends on.

    >>> cache = {}
    >>> kept_in_jvm(cache, "k", "jvm 1", lambda: [1]) is kept_in_jvm(cache, "k", "jvm 1", list)
    True
    >>> kept_in_jvm(cache, "k", "jvm 2", lambda: [2])
    [2]
    """
    known = cache.get(key)
    if known is None or known[0] is not jvm:
        known = cache[key] = (jvm, build())
    return known[1]


def select_expr(df: Any, exprs: Iterable[str]) -> Any:
    """``df.selectExpr(*exprs)`` in three py4j round trips whatever the number of expressions
    (two or fewer: PySpark's own call, which makes as few): PySpark sends a list to the JVM one
    element per round trip (py4j's list conversion), which
    for a frame of 20 columns doubled the cost of the call (4.5 ms against 2.4 ms, warm, on
    the 2-core machine). The expressions go as one string, split in the JVM into an array
    that Scala wraps as the ``Seq`` ``selectExpr`` takes. Errors are Spark's own, as from
    ``selectExpr`` (PySpark converts them on every py4j call)."""
    exprs = list(exprs)
    jdf = getattr(df, "_jdf", None)
    if jdf is None or len(exprs) < 3 or any(_SEP in e for e in exprs):
        return df.selectExpr(*exprs)
    try:
        from pyspark.sql.classic.dataframe import DataFrame
    except ImportError:  # pragma: no cover - another PySpark layout
        return df.selectExpr(*exprs)
    session = df.sparkSession
    jvm = session._jvm
    splitter, seq = kept_in_jvm(
        _SELECT_JVM,
        id(jvm),
        jvm,
        lambda: (
            jvm.java.util.regex.Pattern.compile(_SEP),
            jvm.scala.collection.immutable.ArraySeq,
        ),
    )
    array = splitter.split(_SEP.join(exprs), -1)
    return DataFrame(jdf.selectExpr(seq.unsafeWrapArray(array)), session)


def select_kept(df: Any, cache: dict[Any, Any], key: Any, columns: Callable[[], list[Any]]) -> Any:
    """``df.select(*columns())`` in one py4j round trip once ``key`` is in ``cache``: the JVM
    ``Seq`` of the columns (names or Columns) is built once, by the first call for ``key``, and
    given to every later select over another frame (a Column is an unresolved expression,
    resolved against each plan it is selected from). ``key`` must name everything ``columns``
    depends on. PySpark builds the ``Seq`` anew on every call, a round trip per column and
    several per Column built (``F.when(F.col(KEEP), c).alias(n)``): a streaming micro-batch
    rebuilt the same lists every round, 60 to 80 of its ~300 round trips."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # pragma: no cover - Spark Connect (no py4j)
        return df.select(*columns())
    from pyspark.sql.classic.dataframe import DataFrame

    session = df.sparkSession
    cols = kept_in_jvm(cache, key, session._jvm, lambda: df._jcols(*columns()))
    return DataFrame(jdf.select(cols), session)


def map_in_arrow_kept(df: Any, cache: dict[Any, Any], fn: Any, schema: Any) -> Any:
    """``df.mapInArrow(fn, schema)`` in three py4j round trips (two read ``df``'s columns)
    once ``fn`` (hashable: it must be equal only to a function that does the same) has been
    used over the same columns: the JVM's Python UDF over the columns by name is built once,
    by the first call, and given to every later ``mapInArrow`` (PySpark builds it anew on
    every call: the function pickled, ~35 round trips, 25-50 ms of a streaming micro-batch).
    ``cache`` holds at most 16 of them (a run's few functions; an entry of an earlier run is
    dropped first)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # pragma: no cover - Spark Connect (no py4j)
        return df.mapInArrow(fn, schema)
    from pyspark.sql import functions as F
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    columns = tuple(df.columns)
    key = (fn, columns, schema.json() if hasattr(schema, "json") else str(schema))

    def build() -> Any:
        udf = pandas_udf(  # type: ignore[call-overload]  # (as PySpark's mapInArrow does)
            fn, returnType=schema, functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF
        )
        return udf(*[F.col(q(c)) for c in columns])._jc

    if key not in cache and len(cache) >= 16:
        del cache[next(iter(cache))]
    session = df.sparkSession
    jc = kept_in_jvm(cache, key, session._jvm, build)
    return DataFrame(jdf.mapInArrow(jc, False, None), session)


# The rules below are Spark SQL text, parsed once per expression by the JVM (``selectExpr``):
# the same rules built as Column trees cost dozens of py4j round trips per expression (about
# 2,400 per tracked wordcount against 230 for plain Spark's, 0.2-0.4 s of driver time).

#: The event a row owes when it leaves the tracked rows (a barrier's input, a native sink): its
#: pending event, and its ack when it is alive.
EVENT = f"({EV} ^ CASE WHEN {KEEP} THEN {REC} ELSE 0L END)"


def ghost_payload(columns: Sequence[str], keep: str = KEEP) -> list[str]:
    """Payload columns with the values of ghost rows set to null (a ghost's values are never
    read again; nulls keep later expressions, such as an ANSI cast, from failing on rows the
    user removed on purpose). ``keep``: the SQL of the rows' live flag.

    >>> ghost_payload(["w"])
    ['CASE WHEN _ft_keep THEN `w` END AS `w`']
    """
    return [f"CASE WHEN {keep} THEN {q(c)} END AS {q(c)}" for c in columns]


def drop_where(cond: str) -> list[str]:
    """The lineage columns after removing the rows for which the SQL ``cond`` is false or null:
    the rows newly removed send their ack and become ghosts."""
    passes = f"coalesce({cond}, false)"
    return [
        SRC,
        REC,
        f"({EV} ^ CASE WHEN ({KEEP} AND NOT {passes}) THEN {REC} ELSE 0L END) AS {EV}",
        f"({KEEP} AND {passes}) AS {KEEP}",
    ]


def _child_id(salt: int, ordinal: str) -> str:
    return f"xxhash64({int(salt)}L, {REC}, coalesce(CAST({ordinal} AS INT), -1))"


def fan_out(
    salt: int, ordinal: str, is_child: str, same_id: bool = False, count: str | None = None
) -> list[str]:
    """The lineage columns (SQL) of the outputs of a 1→n operator (a generator, a join).

    ``ordinal`` (int, null for a parent that produced no match/element) tells each output row
    its rank among its parent's outputs, ``count`` how many outputs the parent has (ordinals
    ``0 .. count - 1``; a null ordinal is an output of its own, as an outer generator or a left
    join give); ``is_child``: the row is a real output (false: a ghost, or a removed parent).
    ``same_id``: outputs are 1→1 and keep their parent's id (a semi or anti join)."""
    first = f"({ordinal} IS NULL OR {ordinal} = 0)"
    if same_id:  # a 1→1 survivor: its ack and its own id cancel; a dropped row sends its ack
        child_id = REC
        dropped = f"CASE WHEN ({KEEP} AND NOT {is_child}) THEN {REC} ELSE 0L END"
        ev = f"CASE WHEN {first} THEN ({EV} ^ {dropped}) ELSE 0L END"
    else:
        if count is None:
            raise ValueError("fan_out: a 1→n operator must say how many outputs a parent has")
        child_id = _child_id(salt, ordinal)
        after = f"CAST(({ordinal}) + 1 AS INT)"
        sibling = f"CASE WHEN {after} < {count} THEN {_child_id(salt, after)} ELSE 0L END"
        # child 0: the parent's pending event and ack (it was alive) and its own id; every
        # child: its next sibling's id (see the module's doc)
        inherited = f"({EV} ^ CASE WHEN {KEEP} THEN {REC} ELSE 0L END)"
        head = f"({inherited} ^ CASE WHEN {is_child} THEN {child_id} ELSE 0L END)"
        ev = (
            f"(CASE WHEN {first} THEN {head} ELSE 0L END) ^ "
            f"(CASE WHEN {is_child} THEN {sibling} ELSE 0L END)"
        )
    return [
        SRC,
        f"CASE WHEN {is_child} THEN {child_id} ELSE {REC} END AS {REC}",
        f"CAST({ev} AS BIGINT) AS {EV}",
        f"({KEEP} AND {is_child}) AS {KEEP}",
    ]


def staged_event() -> str:
    """The event a row sends when it is staged (written durably by a native sink or a barrier),
    as the ``_ft_evt`` column (SQL)."""
    return f"{EVENT} AS {EVT}"


def settle(
    src: np.ndarray, rec: np.ndarray, ev: np.ndarray, keep: np.ndarray, ack_kept: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The events of a batch at a Python boundary, reduced per source id: every row's pending
    event, plus the ack of each live row when ``ack_kept`` (a sink consumed it; a stage instead
    anchors its live rows itself). Returns (source ids, values) with zero values left out.

    >>> import numpy as np
    >>> u = lambda *v: np.array(v, dtype=np.uint64)
    >>> s, v = settle(u(1, 1, 2), u(5, 6, 7), u(3, 0, 0), np.array([True, False, True]), True)
    >>> s.tolist(), v.tolist()
    ([1, 2], [6, 7])
    """
    from .. import acker

    value = ev.copy()
    if ack_kept:
        value[keep] ^= rec[keep]
    nz = value != 0
    if not nz.any():
        return np.empty(0, np.uint64), np.empty(0, np.uint64)
    s, v = acker.xor_reduce(src[nz], value[nz])
    s, v = np.asarray(s, np.uint64), np.asarray(v, np.uint64)
    nz = v != 0
    return s[nz], v[nz]


__all__ = [
    "EV",
    "EVENT",
    "EVT",
    "KEEP",
    "LINEAGE",
    "POS",
    "REC",
    "SRC",
    "drop_where",
    "fan_out",
    "ghost_payload",
    "q",
    "select_expr",
    "settle",
    "staged_event",
]
