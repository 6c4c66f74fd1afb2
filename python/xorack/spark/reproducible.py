"""What a replay cannot reproduce, refused at declaration in one line.

A replayed record is read from the FT layer's persisted copy, in another round (another Spark
query), on the partition its source's partitioning picks, among other rows than the first
time. An expression whose value depends on that context — the file a row was read from
(``input_file_name()``, ``input_file_block_start()``), its partition or position
(``spark_partition_id()``, ``monotonically_increasing_id()``), a random draw (``rand()``,
``uuid()``, ``shuffle()``, a UDF declared ``asNondeterministic()``) or the time of the query
(``current_timestamp()``, ``current_date()``, ``now()``) — gives a replayed record other values
than its first attempt: after a tracked source ``input_file_name()`` reads ``''``, and
``monotonically_increasing_id()`` repeats the ids of other rows. Spark marks such expressions
itself (``Expression.deterministic``; the time of the query as a date or time expression with
the ``CURRENT_LIKE`` tree pattern, which Spark's optimizer replaces with a constant per query);
the checks here read those marks in the analyzed plan, never a list of names.

The way around is the input DataFrame given to ``p.source(...)``: a column computed there is
part of the record's persisted payload, and a replay reads it from the FT layer, not the file.

>>> # check_reproducible("transform 'ids'", out)  # raises TrackedOperationError, or nothing
"""

from __future__ import annotations

from typing import Any

from .lineage import kept_in_jvm
from .ops import TrackedOperationError

#: Where to compute what a replay cannot reproduce (the last words of every error here).
WAY_AROUND = (
    "compute it on the input DataFrame before p.source(...), where its value is persisted with "
    "the record and a replay reads it back"
)


def _children(node: Any) -> list[Any]:
    seq = node.children()
    return [seq.apply(i) for i in range(seq.size())]


def _expressions(plan: Any) -> list[Any]:
    """Every expression of a JVM logical plan's operators, top down."""
    out: list[Any] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        seq = node.expressions()
        out.extend(seq.apply(i) for i in range(seq.size()))
        stack.extend(_children(node))
    return out


def _innermost(exprs: list[Any], bad: Any) -> list[Any]:
    """The expressions, innermost first, for which ``bad(e)`` holds while no child's does
    (``InputFileName`` under ``Alias(Concat(...))``)."""
    found: list[Any] = []
    stack = [e for e in exprs if bad(e)]
    while stack:
        e = stack.pop()
        inner = [c for c in _children(e) if bad(c)]
        if inner:
            stack.extend(inner)
        else:
            found.append(e)
    return found


def _sql(e: Any) -> str:
    try:
        return str(e.sql())
    except Exception:  # an expression without SQL text (a Python UDF's, a lambda's)
        return str(e.prettyName())


def _is_time(type_name: str) -> bool:
    """A date, a timestamp (with or without time zone) or a time of day."""
    return type_name == "date" or type_name.startswith("time")


_CURRENT_LIKE: dict[int, Any] = {}  # by JVM view: the lookup is 8 py4j calls


def _current_like(spark: Any) -> Any:
    jvm = spark._jvm
    return kept_in_jvm(
        _CURRENT_LIKE,
        id(jvm),
        jvm,
        lambda: jvm.org.apache.spark.sql.catalyst.trees.TreePattern.CURRENT_LIKE(),
    )


def context_expression(df: Any) -> tuple[str, str] | None:
    """``(sql, why)`` of the first expression in ``df``'s analyzed plan whose value a replay
    would not reproduce, or None (also for a DataFrame whose plan cannot be inspected: Spark
    Connect)."""
    try:
        plan = df._jdf.queryExecution().analyzed()
        deterministic = bool(plan.deterministic())
        current = _current_like(df.sparkSession)
        timed = bool(plan.containsPattern(current))
    except Exception:  # not a classic DataFrame: not inspected
        return None
    if not deterministic:
        # an aggregate function whose result depends on the order of its rows (first, last in
        # some Spark versions) runs once, over complete groups: any order is plain Spark's
        aggregate = df.sparkSession._jvm.java.lang.Class.forName(
            "org.apache.spark.sql.catalyst.expressions.aggregate.AggregateFunction"
        )
        culprits = _innermost(_expressions(plan), lambda x: not bool(x.deterministic()))
        for e in culprits:
            if bool(aggregate.isInstance(e)):
                continue
            return _sql(e), (
                "is not deterministic (it reads the row's file, partition or position, or "
                "draws at random): a replayed record, read from the FT layer in a later round, "
                "would get another value than its first attempt"
            )
    if timed:
        stack = [x for x in _expressions(plan) if bool(x.containsPattern(current))]
        while stack:  # only the subtrees that hold one are walked
            e = stack.pop()
            own = bool(e.nodePatterns().contains(current))
            if own and _is_time(str(e.dataType().typeName())):
                return _sql(e), (
                    "is the time of the Spark query, and each round of replays is another "
                    "query: a replayed record would get a later time than the rows of its "
                    "first round"
                )
            stack.extend(c for c in _children(e) if bool(c.containsPattern(current)))
    return None


def check_reproducible(what: str, df: Any) -> None:
    """A clear error when ``df`` (a tracked operation applied to payload-only frames) holds an
    expression a replay would not reproduce (see the module's doc); nothing otherwise.

    >>> # check_reproducible("groupBy(['k']).agg(...)", out)
    """
    found = context_expression(df)
    if found is not None:
        sql, why = found
        raise TrackedOperationError(f"{what}: {sql} {why}; {WAY_AROUND}")


def check_speculation(spark: Any) -> None:
    """A clear error when Spark runs speculative copies of tasks (``spark.speculation=true``):
    a copy that runs beside its task sends the events of its rows a second time (a copy that
    finishes after the records completed is recognized and counts nowhere, but one that runs
    while they are pending makes them time out and replay, and an optimistic round's metrics
    are not verified with it)."""
    try:  # the scheduler's own settings (one py4j call; getConf() copies them all)
        conf = spark.sparkContext._jsc.sc().conf()
    except Exception:  # no SparkContext here (Spark Connect): the server's settings are unseen
        return
    on = str(conf.get("spark.speculation", "false")).strip().lower() == "true"
    if on:
        raise ValueError(
            "spark.speculation=true is not supported with ft=True: a speculative copy of a "
            "task running beside it sends the events of its rows twice (records time out and "
            "replay; an optimistic round's checks do not cover it); run the pipeline in a "
            "session with spark.speculation=false (Pipeline(ft=False) runs plain Spark)"
        )


__all__ = ["WAY_AROUND", "check_reproducible", "check_speculation", "context_expression"]
