"""A stream's aggregations in update output mode (:class:`Updates`): after each micro-batch
or replay round, the groups whose row changed replace their rows in the sinks, by key, once the
records behind them have settled. Used by :mod:`xorack.spark.stream_state`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .context import RunContext
from .outputs import Aggregate, Sink, WindowAggregate
from .stream_emission import Written
from .windows import WindowStaging

#: A resumable stream's mark, per windowed aggregation: the last staged directory known settled.
MARK_SETTLED = "stream:settled:"


class Updates:
    """The update-mode aggregations of a stream, what each last wrote, and up to which staged
    directory its rows are known settled. ``count`` adds a write's rows to the report;
    ``note`` notes a mark in a resumable query's FT state."""

    def __init__(
        self,
        ctx: RunContext,
        aggs: list[Aggregate],
        count: Callable[[Written], None],
        note: Callable[[dict[str, str | None]], None],
    ) -> None:
        self.ctx = ctx
        self.aggs = aggs
        self._count = count
        self._note = note
        self._upserted: dict[str, set[int]] = {}  # per aggregation: the rows' hashes written
        # per windowed aggregation: its staged directories written before an instant when
        # nothing was pending (their rows' records have all settled)
        self._settled: dict[str, str] = {}
        self._at = -1  # the watermark of the last update
        self.writes = 0  # writes of an aggregation's changed groups

    def restore(self, marks: dict[str, str]) -> None:
        """A restarted query: the settled directories its last run noted."""
        self._settled = {
            k[len(MARK_SETTLED) :]: v for k, v in marks.items() if k.startswith(MARK_SETTLED) and v
        }

    def write(
        self, pending: bool, dirty: bool, watermark_us: int, ended: Callable[[], Any]
    ) -> bool:
        """Write the groups whose row changed since the last write (``dirty``: rows were
        staged since; ``ended``: the frame of the attempts that ended without completing);
        returns whether it looked at them. A row counts once its record has settled: an
        aggregation by a time window counts the rows staged before the last instant when
        nothing was pending, and the later ones below the watermark (a record still pending
        has an event time at or above it), late rows left out as Spark drops them — so a
        window's row is written as its records settle, and its count never falls; an
        aggregation without a window is written whenever nothing is pending."""
        from pyspark.sql import functions as F

        from .lineage import q

        ctx = self.ctx
        if not self.aggs or not (dirty or watermark_us != self._at):
            return False
        ended_df = ended()
        wrote = False
        for agg in self.aggs:
            if isinstance(agg, WindowAggregate):
                (staging,) = ctx.of(agg).staging
                assert isinstance(staging, WindowStaging)
                if not pending and staging.paths:
                    self._settled[agg.name] = os.path.basename(staging.paths[-1])
                    self._note({MARK_SETTLED + agg.name: self._settled[agg.name]})
                cut = self._settled.get(agg.name, "")
                old = [p for p in staging.paths if os.path.basename(p) <= cut]
                new = [p for p in staging.paths if os.path.basename(p) > cut]
                rows = staging.staged(ctx.spark, ended_df, paths=old)
                if new:
                    t = F.unix_micros(F.col(q(agg.spec.time)).cast("timestamp"))
                    fresh = staging.staged(ctx.spark, ended_df, paths=new)
                    rows = rows.unionByName(fresh.where(t < F.lit(watermark_us)))
                out = agg.spec.emit(rows, -(1 << 62), 1 << 62)
            elif pending:
                continue
            else:
                out = agg.output(ctx, ended_df)
            digest = F.xxhash64(*[F.col(q(c)) for c in out.columns])
            rows = out.withColumn("_ft_digest", digest).toPandas()
            seen = self._upserted.get(agg.name, set())
            changed = rows[~rows["_ft_digest"].isin(seen)]
            keys = list(ctx.plan.derived_source(agg).keys)
            for node in ctx.plan.readers(ctx.plan.derived_source(agg)):
                assert isinstance(node, Sink)  # checked at start_stream
                self._count([(node, int(node.sink.upsert(changed[list(node.columns)], keys)))])
            self._upserted[agg.name] = set(rows["_ft_digest"].tolist())
            wrote = wrote or bool(len(changed))
        self._at = watermark_us
        self.writes += int(wrote)
        return True


__all__ = ["MARK_SETTLED", "Updates"]
