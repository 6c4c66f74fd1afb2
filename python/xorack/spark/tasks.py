"""What Spark's task accounting says about an optimistic round's jobs.

A round trusts the sums Spark hands back: its accumulators and observed metrics, and the files
its writes committed. A task attempt that *failed* leaves none of them behind. The executor
sends back only the updates of accumulators that count failed values (Spark's own task
metrics; xorack's accumulators and ``observe`` metrics do not), and the commit protocol never
commits a failed attempt's output. A task that Spark retried and that then succeeded once
therefore counts exactly once, like any other (``retried``).

A round cannot trust what it cannot tell apart from a task counted twice (``bad``):

- a job that did not succeed, or that Spark no longer knows;
- a stage attempted again: its map tasks ran again, and Spark merges the accumulators of
  every successful map task;
- a partition that succeeded twice in one stage attempt (a speculative copy, a map task
  resubmitted after its executor was lost);
- an executor lost during the round (a task failed with ``ExecutorLostFailure``, or an
  executor of the round's start gone at its end): with it went the shuffle output of the
  stages that had finished on it, which a later job of the round (adaptive execution runs
  each shuffle stage as a job of its own) computes again under a new stage id, in attempt 0,
  without any failed task to show for it;
- a task still running after the job ended;
- a stage whose failed tasks Spark no longer lists in full (``spark.ui.retainedTasks``).

The status store is fed by Spark's listener bus, which the driver's action does not wait for:
the bus is drained first (else a job just ended may still read as running, or be missing).
The failed attempts' task ids (``dead``) let the driver ignore the files such an attempt wrote
itself (a keeping round's kept rows, :mod:`xorack.spark.kept`).

>>> ok = judge_stage(StageCounts(0, tasks=3, complete=3, indices=3, failed=1), [
...     (1, 1, "FAILED", "worker died")])
>>> ok.bad, ok.retried, sorted(ok.dead)
(0, 1, [1])
>>> judge_stage(StageCounts(0, tasks=2, complete=2, indices=2), []).bad  # nothing failed
0
>>> judge_stage(StageCounts(1, tasks=2, complete=2, indices=2), []).reasons
['stage attempted again (attempt 1)']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: a failed or killed task attempt as the status store lists it: (task id, partition index,
#: status, error message or None)
Task = tuple[int, int, str, "str | None"]

#: the most failed task attempts of one stage the driver lists (more: the stage is not trusted)
MAX_LISTED = 10_000

#: False: a retried task makes the round fall back, as before (an A/B switch for benchmarks)
TRUST_RETRIES = True

#: how long the driver waits for Spark's listener bus to drain before reading the store (ms)
DRAIN_MS = 10_000


@dataclass(frozen=True)
class StageCounts:
    """One stage's counts in the status store (its last attempt): ``tasks`` of the attempt,
    attempts ``complete``, distinct partitions that completed (``indices``), attempts
    ``failed`` and ``killed``, and ``active`` (still running)."""

    attempt: int
    tasks: int
    complete: int
    indices: int
    failed: int = 0
    killed: int = 0
    active: int = 0


@dataclass
class TaskAccount:
    """Spark's accounting of a round's task attempts (see the module's doc)."""

    bad: int = 0
    retried: int = 0
    dead: set[int] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)

    def add(self, other: TaskAccount) -> None:
        self.bad += other.bad
        self.retried += other.retried
        self.dead |= other.dead
        self.reasons += other.reasons

    def untrusted(self, why: str) -> None:
        self.bad += 1
        self.reasons.append(why)


def judge_stage(counts: StageCounts, listed: Iterable[Task]) -> TaskAccount:
    """One stage of a round's job: its ``counts``, and (where a task failed, was killed or
    runs) its failed and killed attempts of that stage attempt as the status store lists
    them."""
    c, out = counts, TaskAccount()
    if c.attempt:
        out.untrusted(f"stage attempted again (attempt {c.attempt})")
        return out
    if not (c.failed or c.killed or c.active):
        return out
    if c.active:
        out.untrusted(f"{c.active} task(s) still running after the job")
    if c.complete != c.indices:  # a partition that succeeded twice: counted twice
        out.untrusted(f"{c.complete - c.indices} partition(s) succeeded twice")
    if c.indices != c.tasks:
        out.untrusted(f"{c.tasks - c.indices} partition(s) never succeeded")
    tasks = list(listed)
    if len(tasks) < c.failed + c.killed:
        out.untrusted(f"Spark lists {len(tasks)} of the stage's {c.failed + c.killed} failed tasks")
    for task_id, _index, status, error in tasks:
        if status not in ("FAILED", "KILLED"):
            out.untrusted(f"task {task_id} is {status}")
            continue
        out.dead.add(task_id)
        out.retried += 1
        text = error or ""
        if text.startswith(("ExecutorLostFailure", "Resubmitted")):  # shuffle output lost
            out.untrusted(f"task {task_id}: {text[:100]}")
    return out


def executors(sc: Any) -> set[str]:
    """The ids of Spark's executors now (none in local mode: the driver runs the tasks)."""
    text = str(sc._jsc.sc().getExecutorIds().mkString(","))
    return {x for x in text.split(",") if x}


def round_tasks(
    sc: Any, group: str, before: set[str] | None = None, python_sink: bool = False
) -> TaskAccount:
    """The task accounting of the jobs of job group ``group`` (a round's), from Spark's status
    store through py4j, once Spark's listener bus has drained: each job's status, each stage's
    counts, and the failed and killed attempts of a stage only where there are any (a clean
    round asks for nothing more). ``before``: the executors when the round started;
    ``python_sink``: the round writes a sink from Python, where a failed attempt may have
    written rows already (no retry is trusted)."""
    out = TaskAccount()
    jsc = sc._jsc.sc()
    try:
        jsc.listenerBus().waitUntilEmpty(DRAIN_MS)
    except Exception as exc:  # a timeout: the store may not have the round's last events
        out.untrusted(f"Spark's listener bus did not drain: {str(exc)[:80]}")
    if before is not None:
        gone = before - executors(sc)
        if gone:
            out.untrusted(f"executor(s) {', '.join(sorted(gone))} lost during the round")
    # the JVM's tracker itself, asked for the jobs (PySpark's wrapper reads arrays an element
    # per py4j call); the stages from the status store (killed tasks and completed partitions)
    tracker = sc._jsc.statusTracker()
    store = jsc.statusStore()
    arrays = sc._jvm.java.util.Arrays
    seen: set[int] = set()  # a stage of two jobs is judged once
    for job in _ints(arrays.toString(tracker.getJobIdsForGroup(group))):
        info = tracker.getJobInfo(job)
        if info is None:
            out.untrusted(f"job {job} is no longer known to Spark")
            continue
        status = str(info.status().toString())
        if status != "SUCCEEDED":
            out.untrusted(f"job {job} is {status}")
        for stage in _ints(arrays.toString(info.stageIds())):
            if stage in seen:
                continue
            seen.add(stage)
            try:
                s = store.lastStageAttempt(stage)
            except Exception:  # not in the store: a stage Spark skipped (no tasks), or one
                # it no longer keeps (spark.ui.retainedStages): then the tracker's counts
                t = tracker.getStageInfo(stage)
                if t is not None and (int(t.numFailedTasks()) or int(t.currentAttemptId())):
                    out.untrusted(f"stage {stage} failed tasks that Spark no longer lists")
                continue
            counts = StageCounts(
                int(s.attemptId()),
                int(s.numTasks()),
                int(s.numCompleteTasks()),
                int(s.numCompletedIndices()),
                int(s.numFailedTasks()),
                int(s.numKilledTasks()),
                int(s.numActiveTasks()),
            )
            listed: list[Task] = []
            if not counts.attempt and (counts.failed or counts.killed):
                listed = _listed(sc, store, stage)
            out.add(judge_stage(counts, listed))
    if out.retried and python_sink:
        out.untrusted(
            "a task retried in a round that writes a Python sink (its failed attempt may "
            "have written rows)"
        )
    elif out.retried and not TRUST_RETRIES:
        out.untrusted(f"{out.retried} task attempt(s) failed and were retried (TRUST_RETRIES)")
    return out


def _listed(sc: Any, store: Any, stage: int) -> list[Task]:
    """The failed and killed task attempts of attempt 0 of ``stage`` in Spark's status store."""
    v1 = sc._jvm.org.apache.spark.status.api.v1
    statuses = sc._jvm.java.util.ArrayList()
    statuses.add(v1.TaskStatus.FAILED)
    statuses.add(v1.TaskStatus.KILLED)
    listed = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        store.taskList(stage, 0, 0, MAX_LISTED, v1.TaskSorting.ID, statuses)
    )
    tasks: list[Task] = []
    for t in listed:
        error = t.errorMessage()
        tasks.append(
            (
                int(t.taskId()),
                int(t.index()),
                str(t.status()),
                str(error.get()) if error.isDefined() else None,
            )
        )
    return tasks


def _ints(text: Any) -> list[int]:
    """The ints of a Java array's ``Arrays.toString`` (``[1, 2]``)."""
    inner = str(text).strip()[1:-1]
    return [int(x) for x in inner.split(",") if x.strip()]


def attempt_of(name: str) -> int | None:
    """The task attempt id a file of :func:`attempt_file_name` names, or None.

    >>> attempt_of(attempt_file_name(42, "ab")), attempt_of("x.parquet")
    (42, None)
    """
    head = name.split("-", 1)[0]
    return int(head[1:]) if head.startswith("t") and head[1:].isdigit() else None


def attempt_file_name(task_id: int, suffix: str) -> str:
    """The name of a file a task attempt writes itself: its task attempt id first."""
    return f"t{task_id}-{suffix}.parquet"


def current_attempt() -> int | None:
    """The task attempt id of the Spark task running here, or None outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else int(ctx.taskAttemptId())


def live_files(names: Sequence[str], dead: set[int]) -> list[str]:
    """``names`` without the files of the task attempts in ``dead``.

    >>> live_files([attempt_file_name(1, "a"), attempt_file_name(2, "b"), "c.parquet"], {1})
    ['t2-b.parquet', 'c.parquet']
    """
    return [n for n in names if attempt_of(n) not in dead]


__all__ = [
    "TaskAccount",
    "attempt_file_name",
    "attempt_of",
    "current_attempt",
    "judge_stage",
    "live_files",
    "round_tasks",
]
