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
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from .lineage import q
from .windows import RID_NO, RID_TAG, WM, WindowStaging, kept_dirs, write_dir


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class StreamDedupSpec:
    """``dropDuplicates(keys)`` of a tracked stream: ``time`` the event-time column its rows
    keep (the source's watermark column), None when they keep none (no late rows then, and a
    key is written once nothing is pending)."""

    keys: tuple[str, ...]
    time: str | None = None

    def describe(self) -> str:
        return f"dropDuplicates({list(self.keys)}) of a stream"

    def compute(self, inputs: Any) -> Any:
        """Spark's own operator (the declaration's analysis)."""
        return inputs[0].dropDuplicates(list(self.keys))


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
        """The keys written so far."""
        from .schema import empty_frame

        if self.emitted:
            return spark.read.parquet(*self.emitted)
        schema = self.node.schema
        return empty_frame(spark, schema).select(*map(q, self.spec.keys))

    def _unwritten(self, rows: Any, spark: Any) -> Any:
        """``rows`` whose key no emission wrote (keys equal null-safe, as Spark's)."""
        f = _f()
        r, w = rows.alias("r"), self.written(spark).alias("w")
        cond = [f.col(f"r.{q(k)}").eqNullSafe(f.col(f"w.{q(k)}")) for k in self.spec.keys]
        return r.join(w, cond, "left_anti")

    def new_rows(self, spark: Any, ended: Any, frontier_us: int | None) -> Any:
        """One row per key among the settled rows whose key no emission wrote: plain Spark's
        columns, then the row's id (``RID_TAG``, ``RID_NO``)."""
        from pyspark.sql import Window

        f = _f()
        rows = self._unwritten(self._settled(spark, ended, frontier_us), spark)
        order = [f.col(WM)]
        if self.spec.time is not None:  # event time first: a replay is staged late
            order.insert(0, f.col(q(self.spec.time)))
        w = Window.partitionBy(*[f.col(q(k)) for k in self.spec.keys]).orderBy(
            *order, f.col(RID_TAG), f.col(RID_NO)
        )
        first = rows.withColumn("_ft_first", f.row_number().over(w)).where("_ft_first = 1")
        return first.select(*map(q, self.node.columns), RID_TAG, RID_NO)

    # ---- the keys written ------------------------------------------------------------------

    def record(self, new: Any, name: str) -> None:
        """Keep the keys of the rows ``new`` just written (hidden until complete)."""
        keys = new.select(*map(q, self.spec.keys))
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
        now). The new directory is in place before the old ones go: a crash leaves a
        superset, which is harmless."""
        f = _f()
        if self.emitted:
            keys = self.written(spark)
            if self.spec.time is not None and self.spec.time in self.spec.keys:
                t = f.unix_micros(f.col(q(self.spec.time)))
                keys = keys.where(f.col(q(self.spec.time)).isNull() | (t >= f.lit(watermark_us)))
            path = write_dir(keys, self.emitted_root, name)
            old, self.emitted = [p for p in self.emitted if p != path], [path]
            for p in old:
                shutil.rmtree(p, ignore_errors=True)


__all__ = ["DedupState", "StreamDedupSpec"]
