"""The account of a run (:class:`RunReport`), why a phase ran tracked rounds (:class:`Reason`),
and the arithmetic that fills a report from the acker's counts.

Nothing here imports Spark: the demo's ``--json`` contract (:data:`REPORT_KEYS`) and the bench
read it without starting a JVM.

>>> r = RunReport(source_records=3, completed=3)
>>> r.as_dict()["lost"], list(r.as_dict())[:2]
(0, ['source_records', 'completed'])
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

REPORT_KEYS = (
    "source_records",
    "completed",
    "failed",
    "timed_out",
    "replayed",
    "dead_lettered",
    "lost",
    "duplicates_absorbed",
    "results_match",
    "wall_seconds",
)

# the acker's counts: None in the report of a run with FT off
TRACKING_COUNTS = (
    *REPORT_KEYS[: REPORT_KEYS.index("lost") + 1],
    "orphans",
    "collateral_replays",
    "repeats",
    "repeats_settled",
)


class Reason(str, enum.Enum):
    """Why a phase ran tracked rounds: it could not run an optimistic round (the first group),
    or its optimistic round fell back (the second). A ``str`` enum: reports stay JSON.

    >>> Reason.PYTHON_SINK.value, Reason.PYTHON_SINK.fell_back
    ('python_sink', False)
    """

    # the phase runs no optimistic round
    OPTIMISTIC_OFF = "optimistic_off"  # Pipeline(optimistic=False)
    RESUMABLE = "resumable"  # Pipeline(resume=True)
    STREAMING = "streaming"  # a micro-batch mixes fresh rows and replays
    SPECULATION = "speculation"  # a speculative copy of a task could count twice
    GROUPED_STAGE = "grouped_stage"  # an apply_in_pandas stage
    PYTHON_SINK = "python_sink"  # a sink written from Python (an aggregate's is written)
    SINK_OF_TWO_PHASES = "sink_of_two_phases"
    BARRIER_OF_TWO_PHASES = "barrier_of_two_phases"
    BRANCH_POINT = "branch_point"
    UNREAD = "unread"  # rows that reach no sink
    AGGREGATE_READS_STAR = "aggregate_reads_star"
    AGGREGATE_READS_LINEAGE = "aggregate_reads_lineage"
    TIME_WINDOW = "time_window"  # an aggregation by a time window (Spark's Expand)
    CARTESIAN = "cartesian"  # a join Spark plans as a cartesian product (computes sides again)
    # the phase's optimistic round fell back
    ROW_FAILED = "row_failed"  # a Python stage failed a row (the round may have been cancelled)
    NATIVE_ROW_ERROR = "native_row_error"  # a native expression raised on a row (a failed job)
    # Spark's task accounting cannot vouch for the round (a stage or a task run again after
    # it succeeded, a task retried in a round that writes a Python sink: xorack.spark.tasks)
    TASK_FAILED = "task_failed"
    METRICS_MISSING = "metrics_missing"  # Spark reported no metrics for an observation
    UNBALANCED = "unbalanced"  # the events do not cancel the births (a row lost or doubled)

    @property
    def fell_back(self) -> bool:
        """Whether this is the reason of a round that ran and fell back."""
        return self in _FALLBACKS


_FALLBACKS = frozenset(
    {
        Reason.ROW_FAILED,
        Reason.NATIVE_ROW_ERROR,
        Reason.TASK_FAILED,
        Reason.METRICS_MISSING,
        Reason.UNBALANCED,
    }
)


@dataclass(frozen=True)
class PhaseNote:
    """Why one phase ran tracked rounds: the typed reason and the words for people.

    >>> str(PhaseNote(0, Reason.PYTHON_SINK, "sink 'words' is written from Python"))
    "phase 0: sink 'words' is written from Python"
    """

    phase: int
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"phase {self.phase}: {self.detail}"


@dataclass
class RunReport:
    """The account of a run: every source record ends completed or dead-lettered (``lost == 0``).

    ``results_match`` is filled by callers that compare the output with a reference (the demo);
    with FT off the tracking counts are ``None``.

    >>> RunReport(source_records=3, completed=3).as_dict()["lost"]
    0
    """

    source_records: int | None = 0
    completed: int | None = 0
    failed: int | None = 0
    timed_out: int | None = 0
    replayed: int | None = 0
    dead_lettered: int | None = 0
    lost: int | None = 0
    duplicates_absorbed: int = 0
    results_match: bool | None = None
    wall_seconds: float = 0.0
    rounds: int = 0
    ft: bool = True
    sink_rows: dict[str, int] = field(default_factory=dict)  # rows each sink holds at the end
    sink_duplicates: dict[str, int] = field(default_factory=dict)  # rows absorbed as duplicates
    orphans: int | None = 0
    # replays of records whose chunk-mate failed in a combined aggregation's first round (no
    # attempt used up; counted in ``replayed`` too)
    collateral_replays: int | None = 0
    # rows a retried source task persisted again under the ids its failed attempt used: the
    # acker kept one record each (counted once in source_records)
    repeats: int | None = 0
    # of those, rows of records that had completed, been dead-lettered or replayed under a new
    # id when Spark ran their source task again (a recomputed map stage): they count nowhere
    repeats_settled: int | None = 0
    derived_records: int = 0  # rows of barriers (aggregates, tracked joins) tracked as records
    derived_dead_lettered: int = 0  # of those, dead-lettered (a failure after the barrier)
    retracted_rows: int = 0  # rows of attempts that did not complete, removed from sinks
    # live rows an untracked transform removed, by transform: their records timed out (use
    # filter/where to drop rows on purpose: those are acked)
    vanished_rows: dict[str, int] = field(default_factory=dict)
    # the run continued a job an earlier driver left unfinished (Pipeline(resume=True)): the
    # record counts are the whole job's; failed/timed_out/replayed/orphans this run's
    resumed: bool = False
    # a resumed job: what its earlier runs had done when this one began (source_records,
    # completed, dead_lettered of the input; pending records of any kind, replayed now)
    earlier: dict[str, int] = field(default_factory=dict)
    # a resumed job that had finished: its stored report, returned again (nothing ran)
    finished_before: bool = False
    # phases completed by an optimistic round (acked as one tree: nothing persisted), why
    # the optimistic rounds that fell back to tracked rounds did, and why a phase did not try
    # one (Pipeline(optimistic=); with optimistic=False, this stays empty)
    optimistic_rounds: int = 0
    optimistic_fallbacks: list[str] = field(default_factory=list)
    # of those phases, the ones run in an earlier phase's round (the same Spark job: the
    # barrier output between them never written), and the fused rounds that fell back (their
    # phases then ran a round each)
    fused_phases: int = 0
    fused_fallbacks: int = 0
    # optimistic rounds that kept their work when rows failed (xorack.spark.kept): the replay
    # rounds they ran for the failed records alone, and the records they replayed
    kept_rounds: int = 0
    kept_records: int = 0
    # failed Spark task attempts that Spark retried inside optimistic rounds it accepted (a
    # failed attempt leaves no metric and no committed output: the retry counted once)
    retried_tasks: int = 0
    tracked_phases: list[str] = field(default_factory=list)
    # the same, typed: phase -> why it ran tracked rounds (blocked, or fell back)
    phase_reasons: dict[int, Reason] = field(default_factory=dict)
    # tracked rounds that a native expression raising on a row failed as a whole: their
    # records were replayed (no attempt used up), the raising rows' records failed alone
    abandoned_rounds: int = 0
    # input records dead-lettered because a row of an aggregate's output they reached was
    # (the cascade: counted in dead_lettered too), and the passes of the run voided for it
    cascaded: int = 0
    cascade_passes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The report as a dict whose first keys are :data:`REPORT_KEYS`, in that order."""
        d = dataclasses.asdict(self)
        rest = {k: v for k, v in d.items() if k not in REPORT_KEYS}
        return {**{k: d[k] for k in REPORT_KEYS}, **rest}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunReport:
        """A report from :meth:`as_dict` (JSON-decoded: phase keys as strings); unknown keys
        are left out (a report of another xorack version)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in d.items() if k in known}
        if "phase_reasons" in kept:
            kept["phase_reasons"] = {int(k): Reason(v) for k, v in kept["phase_reasons"].items()}
        return cls(**kept)

    def note(self, note: PhaseNote) -> None:
        """Record why a phase ran tracked rounds."""
        self.phase_reasons[note.phase] = note.reason
        (self.optimistic_fallbacks if note.reason.fell_back else self.tracked_phases).append(
            str(note)
        )

    def untracked(self) -> None:
        """A run with FT off: the acker's counts are unknown (None), not zero."""
        for k in TRACKING_COUNTS:
            setattr(self, k, None)

    def fill(self, stats: dict[str, Any]) -> None:
        """Counts from the FT layer. ``lost`` = records neither completed nor dead-lettered
        when the run ended (the FT layer's pending count; 0 when every record is accounted
        for). Records a restarted acker recovered from its storage count as source records."""
        self.source_records = int(stats.get("persisted", 0)) + int(stats.get("recovered", 0))
        self.completed = int(stats.get("completed", 0))
        self.failed = int(stats.get("failed", 0))
        self.timed_out = int(stats.get("timed_out", 0))
        self.replayed = int(stats.get("replayed", 0))
        self.dead_lettered = int(stats.get("dead_lettered", 0))
        self.orphans = int(stats.get("orphans", 0))
        self.collateral_replays = int(stats.get("collateral", 0))
        self.repeats = int(stats.get("repeats", 0))
        self.repeats_settled = int(stats.get("repeats_settled", 0))
        self.lost = int(stats.get("pending", 0))

    def add_kept(self, failed: int, replayed: int) -> None:
        """Failed attempts and replays of the records kept rounds completed (the FT layer
        counts those of the records they dead-lettered)."""
        if self.failed is not None and self.replayed is not None:
            self.failed += failed
            self.replayed += replayed

    def add_summaries(self, rows: list[Any]) -> None:
        """Python sinks' summary rows (sink, partition, rows, duplicates)."""
        for row in rows:
            stored = int(row.rows) - int(row.duplicates)
            self.sink_rows[row.sink] = self.sink_rows.get(row.sink, 0) + stored
            dups = self.sink_duplicates
            dups[row.sink] = dups.get(row.sink, 0) + int(row.duplicates)
            self.duplicates_absorbed += int(row.duplicates)

    def add_retracted(self, sink: str, rows: int) -> None:
        """Rows of ended attempts removed from a sink written from Python."""
        self.retracted_rows += rows
        self.sink_rows[sink] = self.sink_rows.get(sink, 0) - rows

    def add_optimistic(self, records: int, derived: int) -> None:
        """Records the run's optimistic rounds completed (the acker never saw them)."""
        if self.source_records is not None and self.completed is not None:
            self.source_records += records
            self.completed += records
        self.derived_records += derived

    def discount_derived(self, persisted: int, dead: int) -> None:
        """The FT layer counts the rows of barriers (tracked as records of the next phase) with
        the input records; the report accounts for the input records alone and gives the
        barrier rows apart (``persisted`` of them, ``dead`` dead-lettered)."""
        self.derived_records = persisted
        self.derived_dead_lettered = dead
        assert self.source_records is not None
        assert self.completed is not None
        assert self.dead_lettered is not None
        self.source_records -= persisted
        self.completed -= persisted - dead
        self.dead_lettered -= dead

    def add_cascade(self, cascade: Any) -> None:
        """What the voided passes before the last one dead-lettered (``cascade``: a
        :class:`~xorack.spark.cascade.Cascade`): the input records left out of the last pass
        (the cascaded ones and those an earlier pass dead-lettered itself) count as source
        records dead-lettered; the aggregate rows that started it as barrier rows
        dead-lettered."""
        left_out = cascade.records + cascade.traced
        if self.source_records is not None and self.dead_lettered is not None:
            self.source_records += left_out
            self.dead_lettered += left_out
        self.derived_records += cascade.causes
        self.derived_dead_lettered += cascade.causes
        self.cascaded = cascade.traced
        self.cascade_passes = cascade.passes
        self.rounds += cascade.rounds
        self.wall_seconds = round(self.wall_seconds + cascade.seconds, 3)

    def discount_reread(self, records: int) -> None:
        """Records that an abandoned first round had completed (or ended) were persisted again
        when the round's input was read again, and completed again: each counts once."""
        if records and self.source_records is not None and self.completed is not None:
            self.source_records -= records
            self.completed -= records


@dataclass(frozen=True)
class RoundInfo:
    """What the run loop tells ``on_round`` after each round."""

    round: int
    replays: int
    stats: dict[str, Any]


__all__ = [
    "REPORT_KEYS",
    "TRACKING_COUNTS",
    "PhaseNote",
    "Reason",
    "RoundInfo",
    "RunReport",
]
