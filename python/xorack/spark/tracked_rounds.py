"""Tracked rounds of one phase: the phase's sources, then their replays, round after round,
until every record of the phase is completed or dead-lettered (bounded by ``max_attempts``).
Each round is one Spark action over every sink written from Python, the staging of every
barrier input and native sink, the events of the staged rows, a runaway check, then
``expire_all`` (after the round nothing still pending can complete: it timed out).

>>> # TrackedRounds(ctx, phase).run(report, ended, on_round)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from .._checks import sorted_distinct
from .barrier import CHUNK, PartialStaging, ids_frame, send_staged_events
from .build import RoundBuilder, RoundWork
from .context import RunContext
from .guard import FailureTally, RunawayFailure, tally_param
from .report import RoundInfo, RunReport
from .stages import ROUND_PROPERTY

log = logging.getLogger(__name__)


def run_summaries(frames: list[Any], report: RunReport) -> None:
    """One Spark action over all Python sinks of a round; adds their summaries to ``report``."""
    if not frames:
        return
    summary = frames[0]
    for f in frames[1:]:
        summary = summary.unionByName(f)
    report.add_summaries(summary.collect())


def count_vanished(work: RoundWork, report: RunReport) -> None:
    """Rows the round's transforms removed (after the round's actions ran)."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    for name, seen_in, seen_out in work.observed:
        try:
            rows_in = int(seen_in.get.get("rows") or 0)
            rows_out = int(seen_out.get.get("rows") or 0)
        except Py4JJavaError:  # the plan never ran: Spark's adaptive execution dropped it
            continue  # as empty (no rows went in), and PySpark cannot read its metrics
        if rows_out < rows_in:
            gone = report.vanished_rows
            gone[name] = gone.get(name, 0) + rows_in - rows_out


def replays_waiting(stats: dict[str, Any]) -> bool:
    waiting = stats.get("replays_waiting")
    if waiting is not None:
        return bool(waiting)
    return True  # unknown: one more round (it ends at once when no replay is handed out)


class TrackedRounds:
    """The rounds of one phase with per-record acking (FT on), or its one plain round (FT
    off)."""

    def __init__(self, ctx: RunContext, phase: int) -> None:
        self.ctx = ctx
        self.phase = phase

    def run(
        self,
        report: RunReport,
        ended: list[np.ndarray],
        on_round: Callable[[RoundInfo], None] | None,
    ) -> None:
        ctx, cfg, phase = self.ctx, self.ctx.config, self.phase
        sc = ctx.spark.sparkContext
        max_rounds = cfg.max_attempts + 1 if ctx.ft else 1
        guard = FailureTally(cfg.runaway_share)
        for round_no in range(max_rounds + 1):
            ctx.round = round_no
            # the first round of a phase that combines aggregates draws its ids in chunks
            partial_round = ctx.ft and round_no == 0 and phase in ctx.partial_phases
            ctx.chunk_bits = cfg.chunk_bits if partial_round else 0
            sc.setLocalProperty(ROUND_PROPERTY, str(round_no))
            ctx.tally = sc.accumulator({}, tally_param()) if ctx.ft else None
            fresh = {}
            if round_no == 0:
                for s in ctx.plan.sources:
                    df = ctx.source_input(s)
                    if s.phase == phase and df is not None and not ctx.plan.direct(s):
                        fresh[s.index] = df
            work = RoundBuilder(ctx, fresh, replays_wanted=round_no > 0).build()
            if work.empty() and (round_no > 0 or phase > 0):
                break  # nothing left to replay, or a phase whose barriers feed native sinks only
            run_summaries(work.summaries, report)
            for node, df in work.plain_writes:
                rows = node.sink.write(df)
                if rows is not None:  # a sink that cannot count what it wrote is not asked
                    report.sink_rows[node.name] = report.sink_rows.get(node.name, 0) + int(rows)
            report.rounds += 1
            if not ctx.ft:
                break
            partial = self._stage(work, round_no)
            count_vanished(work, report)
            runaway = guard.add_round(dict(ctx.tally.value))
            if runaway is not None:
                raise RunawayFailure(runaway)
            ctx.client.expire_all()
            ended.append(self._release(ctx.client.take_ended(), partial))
            stats = ctx.client.stats()
            log.debug(
                "phase %d round %d: %d replayed in, %s pending, %s dead-lettered",
                phase,
                round_no,
                work.replays,
                stats.get("pending"),
                stats.get("dead_lettered"),
            )
            if on_round is not None:
                on_round(RoundInfo(round_no, work.replays, stats))
            if not stats.get("pending", 0) and not replays_waiting(stats):
                break

    def _stage(self, work: RoundWork, round_no: int) -> list[tuple[PartialStaging, str]]:
        """Write the round's staged frames, then send the events of their rows (held: a
        record completes only once the round is released)."""
        ctx = self.ctx
        bits = ctx.chunk_bits
        tag = f"{ctx.run_tag}p{self.phase:03d}-r{round_no:03d}"  # name order = write order
        paths, partial = [], []
        for st, df in work.staged:
            if isinstance(st, PartialStaging):
                partial.append((st, st.write_partial(df, tag, bits)))
            else:
                paths.append(st.write(df, tag))
        assert ctx.location is not None  # set by the run with FT on
        send_staged_events(
            ctx.spark,
            paths,
            ctx.location,
            ctx.token,
            ctx.tls_root_certs,
            ctx.job,
            hold=True,
            partial=[path for _, path in partial],
            chunk_bits=bits if partial else 0,
        )
        return partial

    def _release(
        self, ended_now: np.ndarray, partial: list[tuple[PartialStaging, str]]
    ) -> np.ndarray:
        """End the round's held completions: the chunks of the attempts that ended (this round)
        are tainted, their held records replayed as collateral; their partial rows are left out
        of the merge. Returns every attempt of the round that ended without completing."""
        ctx = self.ctx
        bits = ctx.chunk_bits if partial else 0
        tainted = (
            sorted_distinct(ended_now >> np.uint64(bits)) if partial else np.empty(0, np.uint64)
        )
        ctx.client.release(tainted, bits)
        collateral = ctx.client.take_ended()
        if partial:
            frame = ids_frame(ctx.spark, tainted, column=CHUNK)
            for st, _ in partial:
                st.tainted.append(frame)
        return np.concatenate([ended_now, collateral])


__all__ = ["TrackedRounds", "count_vanished", "replays_waiting", "run_summaries"]
