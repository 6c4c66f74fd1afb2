"""Tracked rounds of one phase: the phase's sources, then their replays, round after round,
until every record of the phase is completed or dead-lettered (bounded by ``max_attempts``).
Each round is one Spark action over every sink written from Python, the staging of every
barrier input and native sink, the events of the staged rows, a runaway check, then
``expire_all`` (after the round nothing still pending can complete: it timed out). A round
that a native expression fails on one row is abandoned: its records are replayed as collateral
and the phase's later rounds are guarded (:mod:`xorack.spark.row_errors`).

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
from .ids import u64
from .lineage import REC, SRC
from .report import RoundInfo, RunReport
from .row_errors import NativeRowError, RowError, RowGuard, row_error
from .stages import ROUND_PROPERTY

log = logging.getLogger(__name__)

#: log2 of the records per chunk (at least) in the first tracked round of a phase whose
#: optimistic round fell back because rows failed: a failed record taints its chunk, whose
#: other records are replayed as collateral (0.1 % of records failing taints ~3 % of 32-record
#: chunks, ~64 % of 1024-record ones), while smaller chunks stage more partial rows (each
#: chunk's partial aggregate per group: 32-record chunks stage several times the rows of
#: 1024-record ones). So the chunks shrink only as far as the failure rate the optimistic
#: round saw asks.
FAILED_CHUNK_BITS = 5

#: the share of chunks a phase's failures may taint before its chunks shrink
TAINTED_CHUNKS = 0.05


def failed_chunk_bits(bits: int, rate: float | None) -> int:
    """log2 of the records per chunk for a first tracked round after an optimistic round whose
    batches saw ``rate`` of their records fail (None: unknown): the configured ``bits``, or
    fewer, down to :data:`FAILED_CHUNK_BITS`, until about :data:`TAINTED_CHUNKS` of the
    chunks hold a failed record.

    >>> failed_chunk_bits(10, 0.0), failed_chunk_bits(10, None), failed_chunk_bits(10, 1e-4)
    (10, 10, 8)
    >>> failed_chunk_bits(10, 1e-3), failed_chunk_bits(10, 0.5), failed_chunk_bits(3, 0.5)
    (5, 5, 3)
    """
    if rate is None:
        return bits
    while bits > FAILED_CHUNK_BITS and rate * (1 << bits) > TAINTED_CHUNKS:
        bits -= 1
    return bits


def round_chunk_bits(ctx: RunContext, phase: int, round_no: int) -> int:
    """log2 of the records per chunk that round ``round_no`` of ``phase`` draws its source ids
    in: 0 but in the first round of a phase that combines aggregates (FT on).

    >>> from types import SimpleNamespace as NS
    >>> ctx = NS(ft=True, partial_phases={0}, rows_failed={}, config=NS(chunk_bits=10))
    >>> round_chunk_bits(ctx, 0, 0), round_chunk_bits(ctx, 0, 1), round_chunk_bits(ctx, 1, 0)
    (10, 0, 0)
    >>> ctx.rows_failed[0] = 0.001; round_chunk_bits(ctx, 0, 0)
    5
    """
    if not (ctx.ft and round_no == 0 and phase in ctx.partial_phases):
        return 0
    bits = int(ctx.config.chunk_bits)
    if phase in ctx.rows_failed:
        return failed_chunk_bits(bits, ctx.rows_failed[phase])
    return bits


def collect_summaries(frames: list[Any]) -> list[Any]:
    """One Spark action over all Python sinks of a round: their summary rows."""
    if not frames:
        return []
    summary = frames[0]
    for f in frames[1:]:
        summary = summary.unionByName(f)
    rows: list[Any] = summary.collect()
    return rows


def run_summaries(frames: list[Any], report: RunReport) -> None:
    """One Spark action over all Python sinks of a round; adds their summaries to ``report``."""
    report.add_summaries(collect_summaries(frames))


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
    off). A round that fails because a native expression raised on a row is abandoned and the
    phase goes on guarded (:mod:`xorack.spark.row_errors`)."""

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
        rounds = cfg.max_attempts + 2 if ctx.ft else 1  # an abandoned round adds one
        guard = FailureTally(cfg.runaway_share)
        # what the acker counted before the phase (an abandoned first round's completions)
        before = ctx.client.stats() if ctx.ft and phase not in ctx.guarded else {}
        round_no = abandoned = 0
        while round_no < rounds:
            ctx.round = round_no
            # the first round of a phase that combines aggregates draws its ids in chunks
            ctx.chunk_bits = round_chunk_bits(ctx, phase, round_no)
            if ctx.chunk_bits and ctx.chunk_bits < cfg.chunk_bits:
                log.info(
                    "phase %d: its optimistic round failed rows: its first tracked round "
                    "combines in chunks of %d records",
                    phase,
                    1 << ctx.chunk_bits,
                )
            # current_round(): the records of round r are on attempt r + 1 (an abandoned
            # round's are replayed on the same attempt)
            sc.setLocalProperty(ROUND_PROPERTY, str(round_no - abandoned))
            ctx.tally = sc.accumulator({}, tally_param()) if ctx.ft else None
            fresh = {}
            if round_no == 0:
                for s in ctx.plan.sources:
                    df = ctx.source_input(s)
                    if s.phase == phase and df is not None and not ctx.plan.direct(s):
                        fresh[s.index] = df
            rows = ctx.guarded.get(phase)
            try:
                work = RoundBuilder(ctx, fresh, replays_wanted=round_no > 0, guard=rows).build()
                if work.empty() and (round_no > 0 or phase > 0):
                    break  # nothing left to replay, or a phase whose barriers feed native sinks
                summaries, staged = self._write(work, round_no, report)
            except Exception as exc:
                error = row_error(exc) if ctx.ft else None
                if error is None:
                    raise
                self._abandon(error, exc, fresh, before, ended)
                report.abandoned_rounds += 1
                abandoned += 1
                rounds += 1
                round_no += 1
                continue
            report.add_summaries(summaries)
            report.rounds += 1
            if staged is None:
                break  # FT off: one plain round
            partial = self._send_staged(*staged)
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
            round_no += 1
        for note in guard.undecided():
            log.warning("phase %d: %s", phase, note)

    def _write(
        self, work: RoundWork, round_no: int, report: RunReport
    ) -> tuple[list[Any], tuple[list[str], list[tuple[PartialStaging, str]]] | None]:
        """The round's Spark actions: the Python sinks' summaries, the plain writes (FT off),
        the staged frames (FT on: see :meth:`_write_staged`); in a guarded phase, then, the
        records of the rows that raised are failed (before the staged events are sent: their
        chunk-mates can complete)."""
        ctx = self.ctx
        summaries = collect_summaries(work.summaries)
        for node, df in work.plain_writes:
            written = node.sink.write(df)
            if written is not None:  # a sink that cannot count what it wrote is not asked
                report.sink_rows[node.name] = report.sink_rows.get(node.name, 0) + int(written)
        if not ctx.ft:
            return summaries, None
        staged = self._write_staged(work, round_no)
        rows = ctx.guarded.get(self.phase)
        if rows is not None:
            rows.settle(ctx.client, ctx.tally)
        return summaries, staged

    def _write_staged(
        self, work: RoundWork, round_no: int
    ) -> tuple[list[str], list[tuple[PartialStaging, str]]]:
        """Write the round's staged frames: the paths of the staged rows and of the partial
        aggregates."""
        ctx = self.ctx
        tag = f"{ctx.run_tag}p{self.phase:03d}-r{round_no:03d}"  # name order = write order
        paths, partial = [], []
        for st, df in work.staged:
            if isinstance(st, PartialStaging):
                partial.append((st, st.write_partial(df, tag, ctx.chunk_bits)))
            else:
                paths.append(st.write(df, tag))
        return paths, partial

    def _send_staged(
        self, paths: list[str], partial: list[tuple[PartialStaging, str]]
    ) -> list[tuple[PartialStaging, str]]:
        """Send the events of the staged rows (held: a record completes only once the round
        is released)."""
        ctx = self.ctx
        bits = ctx.chunk_bits
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

    def _abandon(
        self,
        error: RowError,
        exc: BaseException,
        fresh: dict[int, Any],
        before: dict[str, Any],
        ended: list[np.ndarray],
    ) -> None:
        """A round that a native expression failed on a row: its records come back as
        collateral replays (no attempt used up, checksums afresh), and the phase's next rounds
        are guarded. A first round persists its input first (its records are not all
        persisted: Spark stopped the job at the row); the records it had completed or ended
        are persisted again there (those it ended are completed at once, unprocessed: their
        replays are waiting; those it completed are replayed, and counted once)."""
        ctx, phase = self.ctx, self.phase
        if phase in ctx.guarded:  # it raised with every row operation guarded
            raise raised_while_guarded(phase, error) from exc
        log.warning(
            "phase %d round %d: a native expression raised on a row (%s): the round is "
            "abandoned (its records replayed, no attempt used up) and the phase goes on with "
            "its row operations guarded",
            phase,
            ctx.round,
            error.message,
        )
        ctx.guarded[phase] = RowGuard(ctx.spark, error)
        gone = ctx.client.take_ended()  # attempts the round ended (failed by a stage, a sink)
        ended.append(gone)
        if fresh:
            # the round's outputs are thrown away: the records it completed or ended are
            # persisted again as new ones, not recognized as already settled
            ctx.client.forget_known(ctx.round)
            completed = int(ctx.client.stats().get("completed", 0))
            persisted_again = completed - int(before.get("completed", 0))
            persisted_again += persist_fresh(ctx, phase, fresh, gone, error, exc)
            ctx.reread[phase] = ctx.reread.get(phase, 0) + persisted_again
        ctx.client.expire_all(collateral=True)
        ended.append(ctx.client.take_ended())

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


def raised_while_guarded(phase: int, error: RowError) -> NativeRowError:
    """The error of a native row error met again in a phase whose row operations are guarded:
    it comes from an expression xorack does not evaluate row by row."""
    return NativeRowError(
        f"phase {phase}: {error.message} — raised again with the phase's row operations "
        "guarded: it comes from an expression xorack does not evaluate row by row (in "
        "the DataFrame given to p.source(), an aggregate, a transform, a Python UDF, a "
        "sink). Fix the data or the expression (a try_ function), or filter the rows out "
        "before p.source()"
    )


def persist_fresh(
    ctx: RunContext,
    phase: int,
    fresh: dict[int, Any],
    gone: np.ndarray,
    error: RowError,
    exc: BaseException,
) -> int:
    """Persist every record of a round's ``fresh`` input (the source taggers alone, one Spark
    job per source: the records the round had persisted keep their ids and are left as they
    are), after a native expression failed the round on a row (``error``, raised as ``exc``).
    The copies of the ``gone`` attempts (failed by the round: their replays wait already) are
    completed at once; returns how many."""
    from pyspark.sql import functions as F

    builder = RoundBuilder(ctx, fresh, replays_wanted=False)
    frames = [builder.source(s) for s in ctx.plan.sources if s.index in fresh]
    if not builder.work.reproducible:
        raise NativeRowError(
            f"phase {phase}: {error.message} — isolating the row reads the input "
            "again, which must give every record the ids it got the first time: run with "
            "deterministic_ids=True"
        ) from exc
    gone_ids = ids_frame(ctx.spark, gone)
    copies = 0
    for df in frames:
        try:
            if gone_ids is None:
                df.write.format("noop").mode("overwrite").save()
                continue
            rows = df.join(F.broadcast(gone_ids), SRC, "left_semi").select(SRC, REC)
            table = rows.toArrow()
        except Exception as again:
            if row_error(again) is None:
                raise
            raise NativeRowError(
                f"phase {phase}: {error.message} — raised by the DataFrame given to "
                "p.source() itself (read again without the tracked operations): xorack "
                "isolates rows in its tracked operations only. Fix the data or the "
                "expression (a try_ function), or declare it on the tracked DataFrame"
            ) from again
        if table.num_rows:
            ctx.client.xor(u64(table.column(SRC)), u64(table.column(REC)))
            copies += table.num_rows
    return copies


__all__ = [
    "TrackedRounds",
    "collect_summaries",
    "count_vanished",
    "persist_fresh",
    "raised_while_guarded",
    "replays_waiting",
    "run_summaries",
]
