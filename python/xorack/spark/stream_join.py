"""Stream-stream joins of two tracked streams (inner and left outer), exact while the query
runs.

``left.join(right, condition, how)`` where each side comes from a streaming source with a
watermark is Spark's stream-stream join. Under record-level replay a joined row has two
parents, a record on each side, and may only reach a sink once both have completed: a row of
an attempt that dies later would otherwise stay in the sink. So the rows of both sides are
*staged* as they arrive (their records complete once the rows are written), and the join runs
over the staged rows of records that have **settled**: a staged row is settled once its event
time is below the smallest event time still pending in the FT layer (every row keeps its
source record's event time: :func:`~xorack.spark.stream_state.check_event_time_path`), or when
nothing is pending at all.

Each emission writes the pairs among settled rows that no emission wrote before (each staged
row carries an id of its own, ``(_ft_rtag, _ft_rno)``: the pairs written are kept as id
quadruples), so a pair is written once, as soon as both its rows settle — plain Spark writes
it as soon as both rows arrive. A row is *late*, as in Spark, when its event time is at or
below the watermark in force when it was staged (Spark drops it before the join); a replayed
record is never late (the watermark waited for it).

A left outer join also writes each left row that found no match, with nulls, once no right
row that can still come could match it: Spark's own reasoning on the time-range condition
(``StreamingJoinHelper.getStateValueWatermark``) gives the left rows' *state watermark* from
the right side's watermark; xorack asks Spark for it over the watermark held back by the
records still pending. Rows below both sides' state watermarks can meet nothing new: a
compaction drops them (with the pairs written for them), which keeps a long stream's state
bounded.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from .lineage import q
from .windows import RID_NO, RID_TAG, WM, WindowStaging, kept_dirs, write_dir

#: The id columns of a pair written: the left row's and the right row's (an unmatched left
#: row of a left outer join has right id (0, -1)).
PAIR = ("_ft_lt", "_ft_ln", "_ft_rt", "_ft_rn")
#: A watermark far from 0 (ms): Spark's helper takes and returns boxed longs, and py4j boxes a
#: small Python int as an Integer.
_PROBE_MS = 1 << 41
#: Spark's key for the watermark delay in a column's metadata (``EventTimeWatermark``).
DELAY_KEY = "spark.watermarkDelayMs"


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class StreamJoinSpec:
    """``left.join(right, on, how)`` of two tracked streams: ``on`` a join condition (Column)
    or column names, ``how`` inner or left; ``times``: each side's event-time column (its
    source's watermark); ``lags``: how far (ms) each side's state watermark lies below the
    watermark (None: Spark finds no bound — the side's rows are kept until ``stop()``)."""

    on: Any
    how: str
    times: tuple[str, str]
    lags: tuple[int | None, int | None] = (None, None)

    def describe(self) -> str:
        on = list(self.on) if isinstance(self.on, (list, tuple)) else str(self.on)
        return f"join({on}, {self.how!r}) of two streams"

    def compute(self, inputs: Any) -> Any:
        """Spark's join of two frames (the declaration's analysis, and each emission)."""
        on = list(self.on) if isinstance(self.on, (list, tuple)) else self.on
        return inputs[0].join(inputs[1], on=on, how=self.how)


def state_lags(
    spark: Any, schemas: tuple[Any, Any], spec: StreamJoinSpec, delays_ms: tuple[int, int]
) -> tuple[int | None, int | None]:
    """Ask Spark how far below the watermark each side's *state watermark* lies for the join
    condition of ``spec``: rows of a side with event time at or below
    ``watermark - lag`` can match no row of the other side that can still come. None: no
    bound (no time-range condition between the two event times)."""
    from .schema import empty_frame

    f = _f()
    sides = []
    for schema, time, delay in zip(schemas, spec.times, delays_ms, strict=True):
        df = empty_frame(spark, schema)
        cols = [
            f.col(q(c)).alias(c, metadata={DELAY_KEY: int(delay)}) if c == time else f.col(q(c))
            for c in df.columns
        ]
        sides.append(df.select(*cols))
    plan = spec.compute(sides)._jdf.queryExecution().analyzed()
    while plan.getClass().getSimpleName() != "Join":  # a USING join projects its keys
        plan = plan.child()
    jvm = spark._jvm
    helper = getattr(jvm.org.apache.spark.sql.catalyst.analysis, "StreamingJoinHelper$")
    helper = helper.__getattr__("MODULE$")
    probe = jvm.scala.Some(_PROBE_MS)
    left, right = plan.left().outputSet(), plan.right().outputSet()
    lags: list[int | None] = []
    for mine, other in ((left, right), (right, left)):
        got = helper.getStateValueWatermark(mine, other, plan.condition(), probe)
        lags.append(_PROBE_MS - int(got.get()) if got.isDefined() else None)
    return lags[0], lags[1]


def state_bound_us(watermark_us: int, lag_ms: int | None) -> int | None:
    """The event time (µs) at or below which a side's rows meet nothing new, for the
    watermark ``watermark_us`` (None: no bound)."""
    if lag_ms is None:
        return None
    return (watermark_us // 1000 - lag_ms) * 1000


class JoinState:
    """What a stream-stream join keeps between micro-batches: the staged rows of both sides
    (two :class:`~xorack.spark.windows.WindowStaging`, with row ids) and the ids of the pairs
    written (``<join>/emitted/<name>`` directories, one per emission)."""

    def __init__(self, node: Any, stagings: list[Any]) -> None:
        self.node = node
        self.spec: StreamJoinSpec = node.spec
        self.left: WindowStaging
        self.right: WindowStaging
        self.left, self.right = stagings
        self.emitted_root = os.path.join(os.path.dirname(self.left.root), "emitted")
        self.emitted: list[str] = []

    # ---- the rows --------------------------------------------------------------------------

    def settled(self, spark: Any, side: int, ended: Any, frontier_us: int | None) -> Any:
        """A side's staged rows of attempts not in ``ended``, not late, whose records have
        settled (event time below ``frontier_us``; None: every record has), with their ids
        under the side's names (``PAIR``)."""
        f = _f()
        st = self.left if side == 0 else self.right
        rows = st.staged(spark, ended, ids=True)
        t = f.col(q(st.time))
        rows = rows.where(t.isNull() | (t > f.col(WM)))  # Spark drops ts <= watermark
        if frontier_us is not None:
            rows = rows.where(f.unix_micros(t) < f.lit(int(frontier_us)))
        tag, no = PAIR[2 * side], PAIR[2 * side + 1]
        return rows.drop(WM).withColumnRenamed(RID_TAG, tag).withColumnRenamed(RID_NO, no)

    def written(self, spark: Any) -> Any:
        """The ids of the pairs written so far."""
        from pyspark.sql.types import LongType, StructField, StructType

        if self.emitted:
            return spark.read.parquet(*self.emitted)
        schema = StructType([StructField(c, LongType()) for c in PAIR])
        return spark.createDataFrame([], schema)

    def new_rows(self, spark: Any, ended: Any, frontier_us: int | None, watermark_us: int) -> Any:
        """The join's rows that no emission wrote yet, over the settled rows: matched pairs,
        and (left outer) the left rows that found no match and can find none any more (their
        event time at or below the left state watermark of ``watermark_us``). Columns: plain
        Spark's, then ``PAIR``."""
        f = _f()
        spec = self.spec
        left = self.settled(spark, 0, ended, frontier_us)
        right = self.settled(spark, 1, ended, frontier_us)
        cols = list(self.node.columns)
        matched = StreamJoinSpec(spec.on, "inner", spec.times)  # the outer rows come below
        pairs = matched.compute([left, right]).select(*map(q, cols), *PAIR)
        out = pairs
        bound = state_bound_us(watermark_us, spec.lags[0]) if spec.how == "left" else None
        if bound is not None:
            t = f.unix_micros(f.col(q(spec.times[0])))
            lonely = StreamJoinSpec(spec.on, "left_anti", spec.times).compute(
                [left.where(t <= f.lit(bound)), right]
            )
            types = dict(zip(cols, self.node.schema.fields, strict=True))
            fill = [
                f.col(q(c)) if c in lonely.columns else f.lit(None).cast(types[c].dataType).alias(c)
                for c in cols
            ]
            out = out.unionByName(
                lonely.select(
                    *fill,
                    PAIR[0],
                    PAIR[1],
                    f.lit(0).cast("long").alias(PAIR[2]),
                    f.lit(-1).cast("long").alias(PAIR[3]),
                )
            )
        return out.join(self.written(spark), list(PAIR), "left_anti")

    # ---- the ids of the pairs written ------------------------------------------------------

    def record(self, new: Any, name: str) -> None:
        """Keep the ids of the rows ``new`` just written (hidden until complete)."""
        self.emitted.append(write_dir(new.select(*PAIR), self.emitted_root, name))

    def restore(self, cut: str | None) -> None:
        """A restarted query: the ids its runs recorded (an emission ``cut`` short is undone:
        it is emitted again)."""
        self.emitted = kept_dirs(self.emitted_root, cut)

    def compact_sides(
        self, spark: Any, ended: Any, frontier_us: int | None, watermark_us: int, name: str
    ) -> list[tuple[WindowStaging, str]]:
        """Write each side's staged rows without the settled ones that can meet nothing new
        (at or below the side's state watermark), as hidden directories ``name`` (the caller
        commits them); nothing when Spark gives no bound for a side (its rows stay)."""
        f = _f()
        bounds = [state_bound_us(watermark_us, lag) for lag in self.spec.lags]
        hidden: list[tuple[WindowStaging, str]] = []
        for st, bound in zip((self.left, self.right), bounds, strict=True):
            if bound is None:
                return []
            if not st.paths:
                continue
            t = f.unix_micros(f.col(q(st.time)))
            gone = t <= f.lit(int(bound))
            if frontier_us is not None:
                gone = gone & (t < f.lit(int(frontier_us)))
            hidden.append((st, st.rewrite(spark, ended, t.isNull() | ~gone, name)))
        return hidden

    def compact_ids(self, spark: Any, name: str) -> None:
        """Keep only the ids of pairs whose left row is still staged (a pair of a row that
        left can never come again). The new directory is in place before the old ones go: a
        crash leaves a superset, which is harmless."""
        if not self.emitted:
            return
        kept = self.left.staged(spark, None, ids=True).select(
            _f().col(RID_TAG).alias(PAIR[0]), _f().col(RID_NO).alias(PAIR[1])
        )
        ids = self.written(spark).join(kept, [PAIR[0], PAIR[1]], "left_semi")
        path = write_dir(ids, self.emitted_root, name)
        old, self.emitted = [p for p in self.emitted if p != path], [path]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)


__all__ = [
    "DELAY_KEY",
    "PAIR",
    "JoinState",
    "StreamJoinSpec",
    "state_bound_us",
    "state_lags",
]
