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
- a partition that succeeded twice in one stage attempt (a speculative copy);
- a task *resubmitted* after its executor was lost (Spark then runs a successful map task
  again);
- a task still running after the job ended;
- a stage whose tasks Spark no longer lists in full (``spark.ui.retainedTasks``).

The failed attempts' task ids (``dead``) let the driver ignore the files such an attempt wrote
itself (a keeping round's kept rows, :mod:`xorack.spark.kept`).

>>> ok = judge_stage(0, completed=3, failed=1, active=0, tasks=[
...     (0, 0, "SUCCESS", None, False), (1, 1, "FAILED", "worker died", False),
...     (2, 2, "SUCCESS", None, False), (3, 1, "SUCCESS", None, False)])
>>> ok.bad, ok.retried, sorted(ok.dead)
(0, 1, [1])
>>> twice = judge_stage(0, completed=2, failed=0, active=0, tasks=[])
>>> twice.bad  # no failure: nothing to look at
0
>>> judge_stage(1, completed=2, failed=0, active=0, tasks=[]).reasons
['stage attempted again (attempt 1)']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: a task attempt as the status store lists it: (task id, partition index, status, error
#: message or None, speculative)
Task = tuple[int, int, str, "str | None", bool]

#: the most task attempts of one stage the driver lists (more: the stage is not trusted)
MAX_LISTED = 100_000

#: False: a retried task makes the round fall back, as before (an A/B switch for benchmarks)
TRUST_RETRIES = True


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


def judge_stage(
    attempt: int, completed: int, failed: int, active: int, tasks: Iterable[Task]
) -> TaskAccount:
    """One stage of a round's job: its current ``attempt``, its counts of completed, failed
    and running task attempts, and (where any failed or runs) its attempts of stage attempt
    0 as the status store lists them."""
    out = TaskAccount()
    if attempt:
        out.untrusted(f"stage attempted again (attempt {attempt})")
        return out
    if not failed and not active:
        return out
    if active:
        out.untrusted(f"{active} task(s) still running after the job")
    listed = list(tasks)
    if len(listed) < completed + failed:
        out.untrusted(f"Spark lists {len(listed)} of the stage's {completed + failed} tasks")
    wins: Counter[int] = Counter()
    lost: set[int] = set()
    for task_id, index, status, error, speculative in listed:
        if status == "SUCCESS":
            wins[index] += 1
            if error is not None:  # "Resubmitted (...)": a map task run again after success
                out.untrusted(f"task {task_id} was resubmitted: {error[:80]}")
            if speculative:
                out.untrusted(f"task {task_id} is a speculative copy")
        elif status in ("FAILED", "KILLED"):
            lost.add(index)
            out.dead.add(task_id)
            out.retried += 1
        else:
            out.untrusted(f"task {task_id} is {status}")
    for index, n in wins.items():
        if n > 1:
            out.untrusted(f"partition {index} succeeded {n} times")
    for index in lost:
        if wins[index] != 1:
            out.untrusted(f"partition {index} failed and succeeded {wins[index]} times")
    return out


def round_tasks(sc: Any, group: str) -> TaskAccount:
    """The task accounting of the jobs of job group ``group`` (a round's), from Spark's status
    store through py4j: the job and stage counts of every stage, and the task list of a stage
    only where a task failed or still runs (a clean round asks for nothing more than before)."""
    # the JVM's tracker itself, asked for the numbers of a stage it needs (PySpark's wrapper
    # asks for its eight, and reads arrays an element per py4j call)
    tracker = sc._jsc.statusTracker()
    arrays = sc._jvm.java.util.Arrays
    out = TaskAccount()
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
            s = tracker.getStageInfo(stage)
            if s is None:
                continue
            attempt = int(s.currentAttemptId())
            failed, active = int(s.numFailedTasks()), int(s.numActiveTasks())
            tasks: list[Task] = []
            if not attempt and (failed or active):
                tasks = _listed(sc, stage)
            out.add(judge_stage(attempt, int(s.numCompletedTasks()), failed, active, tasks))
    if out.retried and not TRUST_RETRIES:
        out.untrusted(f"{out.retried} task attempt(s) failed and were retried (TRUST_RETRIES)")
    return out


def _listed(sc: Any, stage: int) -> list[Task]:
    """The task attempts of attempt 0 of ``stage`` in Spark's status store."""
    store = sc._jsc.sc().statusStore()
    listed = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        store.taskList(stage, 0, MAX_LISTED)
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
                bool(t.speculative()),
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
