"""``dropDuplicates`` of a tracked stream, exact while the query runs.

Spark's streaming ``dropDuplicates(cols)`` writes the first row of each key it sees and drops
the later ones (a row at or below the watermark is late and dropped before; the keys are kept
until the watermark passes their event time when the event-time column is among ``cols``,
else for ever). Under record-level replay the first row of a key may belong to a record that
dies later, on another branch of the pipeline: a sink would then hold a row of a dead record,
and the key's other rows would be dropped for nothing. So, as for a stream-stream join
(:mod:`xorack.spark.stream_join`), the rows are *staged* as they arrive (each with an id of
its own) and a key is written once, from the staged rows of records that have **settled**
(event time below the smallest event time still pending in the FT layer; or nothing pending
at all when the rows carry no event time). The keys written are kept (``<dedup>/emitted/``):
a later row of such a key is a duplicate, as in Spark.

Which row of a key is written: of the rows that settle together, the one with the smallest
event time (then the first staged); Spark writes the first to arrive. A replayed row is
staged after rows that came after it, but its record holds the rows at or above its event
time back until it settles, so a key's copies that come in event-time order are taken in
their order of arrival; copies that come out of event-time order and settle together may be
taken otherwise (within one micro-batch Spark's order is the partitions' anyway).

``dropDuplicatesWithinWatermark(keys)`` (Spark's ``StreamingDeduplicateWithinWatermarkExec``)
differs in the state kept: the row written for a key keeps the key until the watermark reaches
its event time + the delay (``expiresAt``); a row of the key that comes while the key lives is
dropped, one that comes after is written again (and keeps the key anew). The event-time column
must reach the operator, but need not be among ``keys``. Spark judges a row by the state of
its micro-batch, evicted by the watermark the late rows of that micro-batch are judged by
(``StreamingDeduplicateWithinWatermarkExec`` with the watermark propagation of Spark 3.5+).
Here each staged row keeps that watermark as plain Spark has it (``_ft_swm``; the late rows'
``_ft_wm`` is held back by pending records, this one is not: a record pending elsewhere must
not keep alive a key that Spark let expire), and the keys written keep their expiry
(``_ft_expires``): a settled row is written when its key was never written or every write of
it expired at the row's watermark (``expires <= _ft_swm``, and below the row's event time),
taking the settled rows of a key in
the order above, each one written keeping the key for the next. A key's expiry only grows, so
a row dropped once stays dropped. A replayed row is judged by the watermark of the micro-batch
that replays it (never late, as above): where a key's expiry falls between a row's first
micro-batch and its replay, Spark (which saw the row in its first micro-batch) may have
dropped it and xorack writes it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from .lineage import q
from .windows import RID_NO, RID_TAG, ROW_ID, WM, WindowStaging, kept_dirs, write_dir

#: The column of a written key's expiry (microseconds) in ``dropDuplicatesWithinWatermark``.
EXPIRES = "_ft_expires"
#: A staged row's plain-Spark watermark (timestamp): the one Spark judges the state of the
#: row's micro-batch by, not held back by pending records (``dropDuplicatesWithinWatermark``).
SPARK_WM = "_ft_swm"


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class StreamDedupSpec:
    """``dropDuplicates(keys)`` of a tracked stream: ``time`` the event-time column its rows
    keep (the source's watermark column), None when they keep none (no late rows then, and a
    key is written once nothing is pending). ``within_us``: ``dropDuplicatesWithinWatermark``,
    a written key living until the watermark reaches its event time + this delay (Spark's
    delay, in whole milliseconds); None for ``dropDuplicates``.

    >>> StreamDedupSpec(("user",), "ts", within_us=10_000_000).describe()
    "dropDuplicatesWithinWatermark(['user']) of a stream"
    """

    keys: tuple[str, ...]
    time: str | None = None
    within_us: int | None = None

    @property
    def name(self) -> str:
        """The DataFrame method it is."""
        return "dropDuplicates" if self.within_us is None else "dropDuplicatesWithinWatermark"

    def describe(self) -> str:
        return f"{self.name}({list(self.keys)}) of a stream"

    def compute(self, inputs: Any) -> Any:
        """Spark's own operator (the declaration's analysis, over a batch frame: the output is
        the input's columns, for both forms)."""
        return inputs[0].dropDuplicates(list(self.keys))


class DedupStaging(WindowStaging):
    """The staged rows of a ``dropDuplicatesWithinWatermark``: as a
    :class:`~xorack.spark.windows.WindowStaging` with row ids, each row also keeping plain
    Spark's watermark of its micro-batch (``SPARK_WM``, ``spark_wm_us`` set by the run before
    each round), which a key's expiry is compared with. A pending record elsewhere holds the
    late rows' watermark (``_ft_wm``) back, never this one: a key that expired in Spark's
    micro-batch is written again, whatever else is pending."""

    spark_wm_us: int = 0

    def write(self, df: Any, tag: str) -> str:
        """Stage ``df`` (payload + lineage) for round ``tag`` with both watermarks and the
        rows' ids; returns the directory."""
        from .lineage import KEEP, SRC, staged_event
        from .windows import micros_literal

        f = _f()
        path = os.path.join(self.root, tag)
        out = df.selectExpr(*map(q, self.payload), SRC, staged_event(), KEEP)
        out = out.withColumn(WM, micros_literal(self.watermark_us or 0))
        out = out.withColumn(SPARK_WM, micros_literal(self.spark_wm_us))
        out = out.withColumn(RID_TAG, f.xxhash64(f.lit(tag)))
        out = out.withColumn(RID_NO, f.monotonically_increasing_id())
        out.write.mode("overwrite").parquet(path)
        self.paths.append(path)
        return path

    def staged(
        self,
        spark: Any,
        ended: Any,
        ids: bool = False,
        paths: list[str] | None = None,
        within: tuple[int, int, int] | None = None,
    ) -> Any:
        """The staged rows of attempts not in ``ended``, with their ``_ft_wm``, ``SPARK_WM``
        and ids; those of ``paths`` only, if given. Its writes observe no event times, so
        ``within`` reads every directory (a superset: see ``WindowStaging.staged``)."""
        from .lineage import KEEP, SRC
        from .schema import empty_frame
        from .windows import micros_literal

        f = _f()
        paths = self.paths if paths is None else paths
        if not paths:
            df = empty_frame(spark, self.schema).withColumn(WM, micros_literal(0))
            df = df.withColumn(SPARK_WM, micros_literal(0))
            for c in (RID_TAG, RID_NO):
                df = df.withColumn(c, f.lit(0).cast("long"))
            return df.where(f.lit(False))
        df = spark.read.parquet(*paths).where(f.col(KEEP))
        if ended is not None:
            df = df.join(ended, SRC, "left_anti")
        return df.selectExpr(*map(q, self.payload), WM, SPARK_WM, RID_TAG, RID_NO)


class DedupState:
    """What a stream's ``dropDuplicates`` keeps between micro-batches: its staged rows (a
    :class:`~xorack.spark.windows.WindowStaging` with row ids) and the keys written
    (``<dedup>/emitted/<name>`` directories, one per emission)."""

    def __init__(self, node: Any, staging: WindowStaging) -> None:
        self.node = node
        self.spec: StreamDedupSpec = node.spec
        self.staging = staging
        self.emitted_root = os.path.join(os.path.dirname(staging.root), "emitted")
        self.emitted: list[str] = []

    def _settled(self, spark: Any, ended: Any, frontier_us: int | None) -> Any:
        f = _f()
        rows = self.staging.staged(spark, ended, ids=True)
        if self.spec.time is not None:
            t = f.col(q(self.spec.time))
            rows = rows.where(t.isNull() | (t > f.col(WM)))  # Spark drops ts <= watermark
            if frontier_us is not None:
                rows = rows.where(f.unix_micros(t) < f.lit(int(frontier_us)))
        return rows

    def written(self, spark: Any) -> Any:
        """The keys written so far (with their expiry, ``EXPIRES``, within a watermark)."""
        from .schema import empty_frame

        if self.emitted:
            return spark.read.parquet(*self.emitted)
        schema = self.node.schema
        keys = empty_frame(spark, schema).select(*map(q, self.spec.keys))
        if self.spec.within_us is not None:
            keys = keys.withColumn(EXPIRES, _f().lit(0).cast("long"))
        return keys

    def _blocked(self, rows: Any, by: Any) -> Any:
        """``rows`` whose key ``by`` (keys written, with their expiry within a watermark)
        does not hold: no row of it for ``dropDuplicates`` (keys equal null-safe, as Spark's);
        none whose expiry is above the row's watermark for the within-watermark form."""
        f = _f()
        r, w = rows.alias("r"), by.alias("w")
        cond = [f.col(f"r.{q(k)}").eqNullSafe(f.col(f"w.{q(k)}")) for k in self.spec.keys]
        if self.spec.within_us is not None:  # the key lives while expiresAt > watermark
            cond.append(f.col(f"w.{EXPIRES}") > self._judged_by("r."))
        return r.join(w, cond, "left_anti")

    def _judged_by(self, prefix: str = "") -> Any:
        """The watermark a row's key is judged by (microseconds): plain Spark's of its
        micro-batch, and below its own event time (a row Spark does not drop as late is
        judged by a watermark below its event time; a replayed row, judged by a later
        micro-batch, is held to that too, so a copy of an event written is never written
        again from its replay)."""
        f = _f()
        t = f.unix_micros(f.col(prefix + q(self.spec.time or "")))
        return f.least(f.unix_micros(f.col(prefix + SPARK_WM)), t - f.lit(1))

    def _unwritten(self, rows: Any, spark: Any) -> Any:
        """``rows`` that no key written holds."""
        return self._blocked(rows, self.written(spark))

    def _expiry(self, rows: Any) -> Any:
        """``rows`` with the expiry their write gives their key."""
        f = _f()
        assert self.spec.time is not None
        assert self.spec.within_us is not None
        t = f.unix_micros(f.col(q(self.spec.time)))
        return rows.withColumn(EXPIRES, t + f.lit(int(self.spec.within_us)))

    def new_rows(self, spark: Any, ended: Any, frontier_us: int | None) -> Any:
        """The rows to write among the settled rows: one per key that no emission wrote
        (within a watermark: the first of a key whose writes all expired, then the first of
        the key at or after that one's expiry, and so on); plain Spark's columns, then the
        row's id (``RID_TAG``, ``RID_NO``)."""
        from functools import reduce

        from pyspark.sql import Window

        f = _f()
        rows = self._unwritten(self._settled(spark, ended, frontier_us), spark)
        order = [f.col(WM)]
        if self.spec.time is not None:  # event time first: a replay is staged late
            order.insert(0, f.col(q(self.spec.time)))
        w = Window.partitionBy(*[f.col(q(k)) for k in self.spec.keys]).orderBy(
            *order, f.col(RID_TAG), f.col(RID_NO)
        )
        cols = [*map(q, self.node.columns), RID_TAG, RID_NO]
        first = rows.withColumn("_ft_first", f.row_number().over(w)).where("_ft_first = 1")
        if self.spec.within_us is None:
            return first.select(*cols)
        # the first row of a key has its smallest event time: its write holds the key until
        # that + the delay; most often no other row of the key comes after that (one pass)
        t = f.unix_micros(f.col(q(self.spec.time or "")))
        by_key = Window.partitionBy(*[f.col(q(k)) for k in self.spec.keys])
        expiry = f.min(t).over(by_key) + f.lit(int(self.spec.within_us))
        marked = rows.withColumn("_ft_first", f.row_number().over(w))
        marked = marked.withColumn("_ft_later", self._judged_by() >= expiry)
        marked = marked.localCheckpoint(eager=True)
        if marked.where("_ft_later AND _ft_first > 1").isEmpty():
            return marked.where("_ft_first = 1").select(*cols)
        picks = [first.select(*cols).where(f.lit(False))]
        rows = marked.drop("_ft_first", "_ft_later")
        while not rows.isEmpty():  # a key's next write: its first row the writes do not hold
            first = rows.withColumn("_ft_first", f.row_number().over(w)).where("_ft_first = 1")
            picks.append(first.select(*cols).localCheckpoint(eager=True))
            rows = rows.join(picks[-1].select(RID_TAG, RID_NO), [RID_TAG, RID_NO], "left_anti")
            rows = self._blocked(rows, self._expiry(picks[-1])).localCheckpoint(eager=True)
        return reduce(lambda a, b: a.unionByName(b), picks)

    def with_row_id(self, new: Any) -> Any:
        """``new`` (from :meth:`new_rows`) with each row's deterministic id (``ROW_ID``): its
        key's (written once), so a write done again after a crash that picks another row of
        the key is absorbed by an idempotent sink; within a watermark, its key's and its event
        time's (two writes of a key differ in event time by the delay at least)."""
        f = _f()
        parts = [f.to_json(f.struct(*[f.col(q(k)) for k in self.spec.keys]))]
        if self.spec.within_us is not None:
            assert self.spec.time is not None
            parts.append(f.col(q(self.spec.time)))
        return new.withColumn(ROW_ID, f.xxhash64(*parts))

    # ---- the keys written ------------------------------------------------------------------

    def record(self, new: Any, name: str) -> None:
        """Keep the keys of the rows ``new`` just written (hidden until complete), with the
        expiry each write gives its key within a watermark."""
        keys = new.select(*map(q, self.spec.keys))
        if self.spec.within_us is not None:
            keys = self._expiry(new).select(*map(q, self.spec.keys), EXPIRES)
        self.emitted.append(write_dir(keys, self.emitted_root, name))

    def restore(self, cut: str | None) -> None:
        """A restarted query: the keys its runs recorded (an emission ``cut`` short is undone:
        it is written again)."""
        self.emitted = kept_dirs(self.emitted_root, cut)

    def compact_rows(self, spark: Any, ended: Any, name: str) -> str:
        """Write the staged rows as one hidden directory ``name`` without those whose key was
        written, the late ones, the ghosts and those of attempts in ``ended``; returns its
        path (the caller commits it)."""
        from .lineage import KEEP, SRC

        f = _f()
        st = self.staging
        rows = spark.read.parquet(*st.paths).where(f.col(KEEP))
        if ended is not None:
            rows = rows.join(ended, SRC, "left_anti")
        if self.spec.time is not None:
            t = f.col(q(self.spec.time))
            rows = rows.where(t.isNull() | (t > f.col(WM)))
        hidden = os.path.join(st.root, "_" + name)  # hidden from a restart until committed
        self._unwritten(rows, spark).write.mode("overwrite").parquet(hidden)
        return hidden

    def compact_keys(self, spark: Any, watermark_us: int, name: str) -> None:
        """Keep the keys written as one directory, without those whose event time is below
        ``watermark_us`` when it is among the keys (a row of such a key can only come late
        now); within a watermark, without the writes expired at ``watermark_us`` (the
        watermark rows are staged by from now on, at most) and at every staged row's. The new
        directory is in place before the old ones go: a crash leaves a superset, which is
        harmless."""
        f = _f()
        if self.emitted:
            keys = self.written(spark)
            if self.spec.within_us is not None:
                low = watermark_us
                if self.staging.paths:
                    staged = spark.read.parquet(*self.staging.paths)
                    first = staged.agg(f.min(self._judged_by())).first()[0]
                    low = min(low, int(first)) if first is not None else low
                keys = keys.where(f.col(EXPIRES) > f.lit(int(low)))
            elif self.spec.time is not None and self.spec.time in self.spec.keys:
                t = f.unix_micros(f.col(q(self.spec.time)))
                keys = keys.where(f.col(q(self.spec.time)).isNull() | (t >= f.lit(watermark_us)))
            path = write_dir(keys, self.emitted_root, name)
            old, self.emitted = [p for p in self.emitted if p != path], [path]
            for p in old:
                shutil.rmtree(p, ignore_errors=True)


__all__ = ["DedupStaging", "DedupState", "StreamDedupSpec"]
