"""Staging and publishing: where a run keeps the rows of barrier inputs and native sinks
between rounds, how a later phase opens on a barrier's output, and how the sinks come to hold
exactly what the completed attempts wrote once every record is completed or dead-lettered.

>>> # workdir = open_staging(ctx); ...; Publisher(ctx, ended, report).publish(sinks)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from . import optimistic
from .barrier import CHUNK, PartialStaging, ids_frame
from .context import RunContext
from .lineage import q
from .outputs import NativeSinkNode, PythonSinkNode
from .report import RunReport
from .rows import Source

log = logging.getLogger(__name__)


def open_staging(ctx: RunContext) -> str:
    """Give every barrier input and native sink of the plan its staging place; returns the
    run's staging directory."""
    cfg = ctx.config
    if cfg.workdir is not None:
        os.makedirs(cfg.workdir, exist_ok=True)
    if cfg.resume:  # one place for every run of the job; tags unique per run
        assert cfg.workdir is not None  # checked by Pipeline
        workdir = os.path.join(cfg.workdir, "staging")
        ctx.run_tag = f"{time.time_ns():020d}-"
    else:
        workdir = tempfile.mkdtemp(prefix="xorack-run-", dir=cfg.workdir)
    ctx.partial_phases = set()
    for barrier in ctx.plan.barriers():
        ctx.of(barrier).staging = barrier.open_staging(ctx, workdir)
    for sink in ctx.plan.native_sinks():
        ctx.of(sink).staging = sink.open_staging(ctx)
    return workdir


def staged_places(ctx: RunContext) -> list[Any]:
    """Every staging place of the run."""
    nodes = [*ctx.plan.barriers(), *ctx.plan.native_sinks()]
    return [st for node in nodes for st in ctx.of(node).staging]


def adopt_staged(ctx: RunContext, ended: np.ndarray) -> None:
    """A resumed job: the rows earlier runs staged (complete writes only, in the order they
    were written) join this run's; a partial write of a crashed run is deleted (its attempts
    did not ack, so they are replayed). The partial aggregates of the chunks of ``ended``
    (attempts that ended, or that the crash left pending) are left out."""
    chunks = None
    bits = ctx.config.chunk_bits
    for st in staged_places(ctx):
        if not os.path.isdir(st.root):
            continue
        for name in sorted(os.listdir(st.root)):
            path = os.path.join(st.root, name)
            if not os.path.isdir(path) or name.startswith(("_", ".")):
                continue
            if not os.path.exists(os.path.join(path, "_SUCCESS")):
                shutil.rmtree(path, ignore_errors=True)
                continue
            st.adopt(path)
            if isinstance(st, PartialStaging):
                if chunks is None:
                    chunks = ids_frame(ctx.spark, ended >> np.uint64(bits), column=CHUNK)
                st.tainted.append(chunks)


def remove_staged(ctx: RunContext) -> None:
    """A new job: what another job left in the staging places is not ours."""
    for st in staged_places(ctx):
        st.remove()


def close_staging(ctx: RunContext, workdir: str) -> None:
    for st in staged_places(ctx):
        st.remove()
    for node in [*ctx.plan.barriers(), *ctx.plan.native_sinks()]:
        ctx.of(node).staging = []
    shutil.rmtree(workdir, ignore_errors=True)


def open_phase(ctx: RunContext, phase: int, ended: np.ndarray | None) -> None:
    """The outputs of the barriers that open ``phase``: Spark's own operator over the rows
    staged by completed attempts."""
    ended_df = None if ended is None else ids_frame(ctx.spark, ended)
    for source in ctx.plan.sources:
        if source.derived is None or source.phase != phase:
            continue
        barrier = source.derived
        if ctx.of(barrier).fast_out is not None or ctx.of(source).written:  # by a round
            continue
        ctx.of(source).df = barrier.output(ctx, ended_df)


def phase_has_input(ctx: RunContext, phase: int) -> bool:
    """Whether a source of ``phase`` has rows to run (a barrier output that an optimistic
    round wrote into its Python sink has none; one going straight to native sinks is written
    at the publish)."""
    return any(
        s.phase == phase and ctx.source_input(s) is not None and not ctx.plan.direct(s)
        for s in ctx.plan.sources
    )


class Publisher:
    """Once every record is completed or dead-lettered: native sinks get the staged rows of
    completed attempts; sinks written from Python drop the rows of attempts that ended without
    completing. Either way a sink holds what the completed attempts wrote, and a dead-lettered
    record leaves nothing. ``ended``: the attempts that ended without completing."""

    def __init__(self, ctx: RunContext, ended: np.ndarray, report: RunReport) -> None:
        self.ctx = ctx
        self.ended = ended
        self.report = report
        self._ended_df: Any = None
        self.published = ctx.client.job_state()["marks"] if ctx.config.resume else {}

    def publish(self) -> None:
        for sink in self.ctx.plan.sinks():
            sink.publish(self)

    def _ended_frame(self) -> Any:
        if self._ended_df is None and len(self.ended):
            self._ended_df = ids_frame(self.ctx.spark, self.ended)
        return self._ended_df

    def native(self, node: NativeSinkNode) -> None:
        ctx, report = self.ctx, self.report
        parent = node.parents[0]
        (staging,) = ctx.of(node).staging
        if f"published:{node.name}" in self.published:  # by an earlier run of the job
            report.sink_rows[node.name] = node.sink.read(ctx.spark).count()
            return
        if ctx.of(node).fast_out is not None:  # written by an optimistic round
            report.sink_rows[node.name] = self._publish_optimistic(node)
            staging.remove()
            return
        if isinstance(parent, Source) and ctx.plan.direct(parent):  # a barrier's output
            out = ctx.source_input(parent)
            rows = node.sink.write(out.selectExpr(*map(q, node.columns)))
        else:
            rows = node.sink.write(staging.rows(ctx.spark, self._ended_frame()))
        if ctx.config.resume:
            ctx.client.job_state(marks={f"published:{node.name}": "1"})
        if rows is None:  # a sink that cannot count what it wrote
            rows = node.sink.read(ctx.spark).count()
        report.sink_rows[node.name] = int(rows)
        staging.remove()

    def _publish_optimistic(self, node: NativeSinkNode) -> int:
        """Publish a native sink's rows written by an optimistic round; returns their count."""
        ctx = self.ctx
        run = ctx.of(node)
        assert run.fast_out is not None
        if node.caps.adopts:  # the sink takes the directory as it is (a rename)
            node.sink.adopt(ctx.spark, run.fast_out)
            rows = run.fast_rows
        else:
            rows = node.sink.write(ctx.spark.read.parquet(run.fast_out))
            optimistic.remove_dir(ctx.spark, run.fast_out)
        if rows is None:
            rows = node.sink.read(ctx.spark).count()
        return int(rows)

    def python(self, node: PythonSinkNode) -> None:
        lost = np.asarray(self.ctx.lost_round_srcs, dtype=np.uint64)
        ended = np.concatenate([self.ended, lost]) if len(lost) else self.ended
        retract(node, ended, self.report)
        recount(self.ctx, node, self.report)


def retract(node: PythonSinkNode, ended: np.ndarray, report: RunReport) -> None:
    """Remove from a sink written from Python the rows of the attempts ``ended`` (that ended
    without completing); a sink that cannot retract keeps them."""
    if node.caps.retractable and len(ended):
        report.add_retracted(node.name, int(node.sink.retract(ended)))


def note_counts(ctx: RunContext) -> None:
    """With FT on, what each sink written from Python that can count (capability ``counts``)
    holds as the run starts, once created (:func:`recount` counts an abandoned round's writes from
    it)."""
    if not ctx.ft:
        return
    for node in ctx.plan.python_sinks():
        if node.caps.counts:
            ctx.sink_counts[node.name] = int(node.sink.count())


def recount(ctx: RunContext, node: PythonSinkNode, report: RunReport) -> None:
    """After an abandoned round (a native row error stopped its Spark job), the rows the run
    added to a sink written from Python: that job's tasks that ran wrote rows whose counts
    never came back. A sink that can count is asked (its count now less its count at the
    start, :func:`note_counts`); another keeps the counted rows, and a warning says its figure
    leaves that job's rows out."""
    if not report.abandoned_rounds:
        return
    before = ctx.sink_counts.get(node.name)
    if before is not None:
        report.sink_rows[node.name] = int(node.sink.count()) - before
    else:
        log.warning(
            "sink %r: the report's row count leaves out the rows written by a round that a "
            "native row error abandoned (the sink has no count())",
            node.name,
        )


__all__ = [
    "Publisher",
    "adopt_staged",
    "close_staging",
    "note_counts",
    "open_phase",
    "open_staging",
    "phase_has_input",
    "recount",
    "remove_staged",
    "retract",
]
