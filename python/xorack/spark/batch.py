"""A batch run, one named step per line (Catalyst's ``QueryExecution`` is the model):

1. open the staging places and start the acker (FT on);
2. a resumed job: adopt what its earlier runs staged;
3. per phase: open it on its barriers' outputs, try an optimistic round, else tracked rounds;
4. a dead-lettered row of an aggregate's output: trace the input records behind it, void the
   pass and run the next one without them (:mod:`xorack.spark.cascade`, :meth:`next_pass`);
5. publish the sinks, fill the report from the acker, keep the dead letters;
6. stop the acker, remove the staging (unless a resumable job is unfinished).

>>> # report = BatchRun(ctx).run(on_round)
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import cascade
from .cascade import Cascade, CascadeRefused
from .context import RunContext
from .fingerprint import MARK as PLAN_MARK
from .fingerprint import fingerprint
from .optimistic_round import OptimisticRound
from .publish import (
    Publisher,
    adopt_staged,
    close_staging,
    note_counts,
    open_phase,
    open_staging,
    phase_has_input,
    remove_staged,
)
from .report import RoundInfo, RunReport
from .stages import ROUND_PROPERTY
from .tracked_rounds import TrackedRounds

log = logging.getLogger(__name__)


class BatchRun:
    """One ``Pipeline.run()`` over the run context ``ctx``."""

    def __init__(self, ctx: RunContext, earlier: Cascade | None = None) -> None:
        self.ctx = ctx
        self.ended: list[np.ndarray] = []  # attempts that ended without completing
        self.derived_persisted = 0  # records the barrier outputs persisted
        self.earlier = earlier  # what the voided passes before this one dead-lettered
        self.cascade: Cascade | None = None  # this pass was voided: what the next leaves out
        self.fused: set[int] = set()  # phases an earlier phase's optimistic round ran

    def next_pass(self) -> BatchRun:
        """The run's next pass, after this one was voided by a cascade: a run of its own over
        the inputs without every record dead-lettered so far."""
        assert self.cascade is not None
        found = self.cascade
        if self.earlier is not None:
            self.earlier.merge(found)
            found = self.earlier
        found.passes += 1
        if found.passes >= cascade.MAX_PASSES:
            raise CascadeRefused(
                f"{found.passes} passes each dead-lettered rows of an aggregate's output "
                f"({found.causes} rows, {found.traced} input records behind them): stopped"
            )
        old = self.ctx
        ctx = RunContext(old.config, old.plan, old.declared)
        for source in old.plan.sources:
            tables = found.excluded.get(source.index)
            if source.derived is None and tables:
                ctx.inputs[source.index] = cascade.exclude(ctx, source, source.df, tables)
        return BatchRun(ctx, earlier=found)

    def run(self, on_round: Callable[[RoundInfo], None] | None = None) -> RunReport:
        ctx = self.ctx
        for sink in ctx.plan.python_sinks():
            sink.create()
        note_counts(ctx)
        start = time.perf_counter()
        report = RunReport(ft=ctx.ft)
        workdir = open_staging(ctx) if ctx.ft else None
        ctx.workdir = workdir
        finished = not ctx.config.resume  # a resumable job keeps its staged rows until done
        if ctx.ft and cascade.writes_python_sinks(ctx):
            sc = ctx.spark.sparkContext
            ctx.written = sc.accumulator([], cascade.ids_param())
        try:
            if ctx.ft:
                ctx.start_service()
            done_phases: set[int] = set()
            if ctx.config.resume:
                earlier = self._resume(report)
                if earlier is not None:  # the job finished in an earlier run
                    finished = True
                    return earlier
                done_phases = self._done_phases()
            for phase in range(ctx.plan.phase_count() if ctx.ft else 1):
                if phase in self.fused:  # run by an earlier phase's optimistic round
                    continue
                self._phase(phase, phase in done_phases, report, on_round)
            if ctx.ft:
                self.cascade = cascade.find(ctx)
            if self.cascade is not None:
                self._void(report, start)
            elif ctx.ft:
                finished = self._finish(report, start) or finished
            else:
                report.untracked()
        finally:
            ctx.spark.sparkContext.setLocalProperty(ROUND_PROPERTY, None)
            ctx.round = ctx.phase = 0
            ctx.resume_skip = {}
            ctx.workdir = None
            if ctx.ft and ctx.dead_letters is None:  # a run that did not get to _finish
                ctx.dead_letters = ctx.fetch_dead_letters()
            ctx.stop_service()
            if workdir is not None and finished:
                close_staging(ctx, workdir)
            ctx.release()
        report.wall_seconds = round(time.perf_counter() - start, 3)
        if self.earlier is not None and self.cascade is None:
            report.add_cascade(self.earlier)
            ctx.dead_letters = self.earlier.dead_letters(ctx.dead_letters)
        return report

    def _void(self, report: RunReport, start: float) -> None:
        """A pass whose dead-lettered aggregate rows call for a cascade: nothing it did is
        kept — the rows it wrote from Python are retracted, its native sinks not published
        (their staging is removed with the run's)."""
        ctx = self.ctx
        assert self.cascade is not None
        written = cascade.gathered(ctx.written.value if ctx.written is not None else None)
        removed = cascade.void(ctx, written)
        self.cascade.rounds += report.rounds
        self.cascade.seconds += time.perf_counter() - start
        log.warning(
            "a pass of the run dead-lettered %d row(s) of an aggregate's output: the %d input "
            "record(s) behind them are dead-lettered too (cascade) and the run goes again "
            "without them (%d rows retracted from sinks written from Python)",
            self.cascade.causes,
            self.cascade.traced,
            removed,
        )

    def _resume(self, report: RunReport) -> RunReport | None:
        """A resumable job's state on the acker: the report of a finished job, else None
        (the rows its earlier runs staged adopted, or what another job left removed)."""
        ctx = self.ctx
        state = ctx.client.job_state()
        marks = state["marks"]
        if "report" in marks:
            stored = json.loads(marks["report"])
            return RunReport.from_dict({**stored, "resumed": True, "finished_before": True})
        report.resumed = bool(state["progress"] or marks)
        ctx.resume_skip = state["progress"]
        if report.resumed:
            report.earlier = self._earlier(state["progress"])
        before = ctx.client.take_ended()  # earlier runs' ended attempts, and the attempts
        self.ended.append(before)  # the crash left pending (replayed now)
        if report.resumed:
            adopt_staged(ctx, before)
        else:
            remove_staged(ctx)
        return None

    def _earlier(self, progress: dict[int, dict[int, int]]) -> dict[str, int]:
        """What the earlier runs of a resumed job had done: the input records they read, of
        which dead-lettered and completed, and the records they left pending (replayed now).
        Phases run in order: once a barrier's rows were persisted, every input record had
        settled, so the pending records are the input's only while no barrier row exists."""
        ctx = self.ctx
        derived = ctx.plan.derived_indexes()
        rows = {True: 0, False: 0}
        for source, parts in progress.items():
            rows[source in derived] += sum(parts.values())
        dead = dead_by_kind(ctx.fetch_dead_letters(), derived)
        stats = ctx.client.stats()
        pending = int(stats.get("pending", 0))
        pending_input = pending if not rows[True] else 0
        return {
            "source_records": rows[False],
            "completed": rows[False] - dead[False] - pending_input,
            "dead_lettered": dead[False],
            "pending": pending,
        }

    def _done_phases(self) -> set[int]:
        marks = self.ctx.client.job_state()["marks"]
        return {int(k[len("phase") :]) for k in marks if k.startswith("phase")}

    def _phase(
        self,
        phase: int,
        done: bool,
        report: RunReport,
        on_round: Callable[[RoundInfo], None] | None,
    ) -> None:
        ctx = self.ctx
        ctx.phase, ctx.round = phase, 0
        if phase > 0:
            persisted_before = int(ctx.client.stats().get("persisted", 0))
            open_phase(ctx, phase, np.concatenate(self.ended) if self.ended else None)
        if not done:
            self._run_phase(phase, report, on_round)
            if ctx.config.resume and not ctx.client.stats().get("pending", 0):
                ctx.client.job_state(marks={f"phase{phase}": "done"})
        if phase > 0:
            now = int(ctx.client.stats().get("persisted", 0))
            again = ctx.reread.get(phase, 0)  # persisted twice (an abandoned first round)
            self.derived_persisted += max(0, now - persisted_before - again)

    def _run_phase(
        self, phase: int, report: RunReport, on_round: Callable[[RoundInfo], None] | None
    ) -> None:
        """An optimistic round when the phase can run one, else (or when it fell back)
        tracked rounds until every record of the phase is completed or dead-lettered."""
        ctx = self.ctx
        if ctx.ft and phase > 0 and not phase_has_input(ctx, phase):
            log.info("phase %d: nothing to run (written by a round, or straight to sinks)", phase)
            return
        opt = OptimisticRound(ctx, phase)
        if ctx.ft and opt.run(report):
            self.fused.update(opt.phases[1:])
            log.info("phases %s: complete in one optimistic round", opt.phases)
            return
        why = report.phase_reasons.get(phase)
        said = why.value if why else ("optimistic=False" if ctx.ft else "FT off")
        log.info("phase %d: tracked rounds (%s)", phase, said)
        TrackedRounds(ctx, phase).run(report, self.ended, on_round)

    def _finish(self, report: RunReport, start: float) -> bool:
        """Publish and account (FT on); True when a resumable job finished."""
        ctx = self.ctx
        self.ended.append(ctx.client.take_ended())
        Publisher(ctx, np.concatenate(self.ended), report).publish()
        ctx.dead_letters = ctx.fetch_dead_letters()  # final: every record has settled
        report.fill(ctx.client.stats())
        ctx.client.release_replays()  # a standalone acker frees the last round's
        report.discount_derived(self.derived_persisted, self._derived_dead())
        report.discount_reread(sum(ctx.reread.values()))
        report.add_optimistic(ctx.fast_records, ctx.fast_derived)
        report.add_kept(ctx.kept_failed, ctx.kept_replayed)
        if not ctx.config.resume and ctx.config.ackers == 1:
            with contextlib.suppress(ValueError):  # a sharded standalone acker
                # a durable storage keeps ended attempts for a resumed job: not needed
                ctx.client.job_state(clear=["ended"])
        if not ctx.config.resume:
            return False
        fill_job(ctx, report)
        if report.lost:
            return False
        report.wall_seconds = round(time.perf_counter() - start, 3)
        done = json.dumps(report.as_dict())
        # what a repair's declaration must match (xorack.spark.fingerprint)
        plan = json.dumps(fingerprint(ctx.declared, ctx.config.workdir or "."))
        ctx.client.job_state(marks={"report": done, PLAN_MARK: plan}, clear=["ended"])
        return True

    def _derived_dead(self) -> int:
        """Dead-lettered records of barrier outputs."""
        derived = self.ctx.plan.derived_indexes()
        if not derived:
            return 0
        return dead_by_kind(self.ctx.dead_letters, derived)[True]


def dead_by_kind(table: Any, derived: set[int]) -> dict[bool, int]:
    """Dead letters of the job (its dead-letter table): of barrier outputs (True) and of input
    sources (False)."""
    dead = {True: 0, False: 0}
    if table is not None and table.num_rows and "_ft_source" in table.schema.names:
        sources = table.column("_ft_source").to_numpy(zero_copy_only=False)
        dead[True] = int(np.isin(sources, list(derived)).sum())
        dead[False] = len(sources) - dead[True]
    return dead


def fill_job(ctx: RunContext, report: RunReport) -> None:
    """A resumable job's counts, over all of its runs: the records are the rows persisted (the
    progress notes), the dead-lettered ones are in the dead-letter table, the pending ones in
    the storage; every other record completed (a record leaves the storage only completed or
    dead-lettered)."""
    progress = ctx.client.job_state()["progress"]
    derived = ctx.plan.derived_indexes()
    rows = {True: 0, False: 0}
    for source, parts in progress.items():
        rows[source in derived] += sum(parts.values())
    if ctx.dead_letters is None:
        ctx.dead_letters = ctx.fetch_dead_letters()
    dead = dead_by_kind(ctx.dead_letters, derived)
    lost = report.lost or 0
    report.source_records = rows[False]
    report.dead_lettered = dead[False]
    report.completed = rows[False] - dead[False] - lost
    report.derived_records = rows[True]
    report.derived_dead_lettered = dead[True]


__all__ = ["BatchRun", "fill_job"]
