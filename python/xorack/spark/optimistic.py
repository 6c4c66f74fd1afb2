"""Optimistic rounds: a whole phase acked as one XOR tree, per-record acking only when it fails.

Most rounds of most jobs fail nothing. For them, per-record acking is pure cost: every source
row goes through Python to be persisted, every (chunk, group) partial aggregate is staged and
read back, and a second job merges the partials. An *optimistic round* runs a phase the way
plain Spark would and checks it at the end with the acker's own arithmetic, applied to the
union of the phase's record trees:

1. the phase's sources are tagged in the JVM (``_ft_rec = xxhash64(salt, position)``); an
   observed metric XORs every source row's id (the *births*) on the way in;
2. native operators keep their lineage columns exactly as in a tracked round; Python stages
   anchor their outputs as usual, but their XOR events go into a Spark accumulator
   (:class:`RoundXor`, the acker of an optimistic round) instead of the acker service;
3. where rows leave the phase (a barrier's input, a native sink), an observed metric XORs the
   event every row owes (its pending event and its ack) — and Spark's own operator computes
   the barrier's output right there, from the live rows, as plain Spark would;
4. after the phase's jobs, the round is complete exactly when the births equal the XOR of
   every event (the staged ones and the Python stages'), no row failed in a Python stage, and
   Spark's task accounting leaves no doubt (:mod:`xorack.spark.tasks`: a task attempt that
   failed and was retried left nothing behind; a stage run again, or a task resubmitted, may
   have counted twice). The XOR of the events of a set of record trees equals
   the XOR of their births only when every row of every tree was accounted for (the
   property the acker relies on for one tree, DESIGN.md), so a lost row, a failed row or a
   row counted twice shows as a mismatch (but for a 2^-64 accident).

A complete round publishes its outputs (a rename for a native sink) and the phase is done:
nothing was persisted, nothing is pending. Otherwise its outputs are deleted, nothing it did
is kept, and the phase runs in tracked rounds from its sources (read again, like a retried
Spark task reads its partition again): per-record acking, replays, dead letters. The
optimistic round is not an attempt of any record; the cost of a lost one is its jobs.

A phase runs optimistically when it only holds sources, native operators, untracked
transforms, unions, ``map_in_pandas`` / ``map_in_arrow`` stages, barriers and native sinks; a
branch point only when Spark computes it alike for each reader (no Python stage or ``transform``
before it, see ``node.branch_blocker``); ``Pipeline(optimistic=False)`` turns it off. Sinks
written from Python, grouped stages (``apply_in_pandas``), streaming and resumable jobs always
run tracked rounds.

>>> a = RoundAccount(records=2, births=5, staged=4, python=1)
>>> a.verdict() is None
True
>>> RoundAccount(records=2, births=5, staged=4, python=0).verdict()[0]
<Reason.UNBALANCED: 'unbalanced'>
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .lineage import EV, EVENT, KEEP, REC, SRC, q, select_expr
from .report import Reason
from .tasks import attempt_file_name, current_attempt

MASK = (1 << 64) - 1


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def round_param() -> Any:
    """A Spark ``AccumulatorParam`` over ``(xor of 64-bit events, failed rows)`` pairs."""
    from pyspark.accumulators import AccumulatorParam

    class _RoundParam(AccumulatorParam):
        def zero(self, value: tuple[int, int]) -> tuple[int, int]:
            return (0, 0)

        def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return (a[0] ^ b[0], a[1] + b[1])

    return _RoundParam()


@dataclass(frozen=True)
class RoundToken:
    """What the runners of an optimistic round carry to the executors: the round's
    accumulator, and where to say at once that a row failed (a file the driver watches, to
    cancel the round's jobs instead of finishing work it will throw away; None when the
    driver cannot see the executors' files)."""

    accumulator: Any
    abort_path: str | None = None
    #: where the one stage that may keep its failed rows for a replay round writes them
    #: (:class:`KeptRows`, :mod:`xorack.spark.kept`), or None: a failed row loses the round
    kept: Any = None


#: the column of a kept row's error (:class:`KeptRows`)
REASON = "_ft_reason"


@dataclass(frozen=True)
class KeptRows:
    """What the runners of a keeping round carry: the stage whose failed rows are kept, where
    they go (one Parquet file per task that kept some, written at its end), their Arrow schema
    (the stage's input payload, then ``_ft_src``), the accumulator counting them as they are
    kept, and the share of a task's rows that may be kept."""

    stage: str
    path: str
    schema: pa.Schema
    count: Any
    share: float = 0.1
    slack: int = 16
    replay: bool = False  # a replay round's: no share (every row it reads failed before)

    def table_of(self, rows: Any, positions: np.ndarray) -> pa.Table:
        """The rows at ``positions`` of a stage's input batch (a pandas frame or an Arrow
        record batch), payload and ``_ft_src``, in :attr:`schema`."""
        names = self.schema.names
        if isinstance(rows, pa.RecordBatch):
            part = rows.take(pa.array(positions, pa.int64()))
            arrays = [part.column(n).cast(f.type) for n, f in zip(names, self.schema, strict=True)]
            return pa.Table.from_arrays(arrays, schema=self.schema)
        part = rows.iloc[positions][names]
        for f in self.schema:  # a long column turned float by a null: not the record's values
            if pa.types.is_int64(f.type) and part[f.name].dtype.kind == "f":
                raise ValueError(f"column {f.name!r} is a float in pandas")
        return pa.Table.from_pandas(part, schema=self.schema, preserve_index=False)

    def allows(self, kept: int, seen: int) -> bool:
        """Whether a task may keep ``kept`` rows of the ``seen`` it read."""
        # a task whose every row failed (two or more) is a bug's, not a few bad records': the
        # round is lost, and the tracked rounds' runaway guard judges it
        if self.replay:  # its rows all failed before: keeping them all is what it is for
            return True
        return kept <= max(self.slack, self.share * seen) and (kept < seen or kept < 2)

    @staticmethod
    def with_reasons(rows: pa.Table, reasons: list[str]) -> pa.Table:
        return rows.append_column(REASON, pa.array(reasons, pa.string()))

    def write(self, tables: list[pa.Table]) -> bool:
        """Write a task's kept rows as one Parquet file (the task counted them as it kept
        them: the driver reads as many, else the round is lost); False when the file cannot
        be written (the caller then loses the round)."""
        table = pa.concat_tables(tables)
        try:
            import pyarrow.parquet as pq

            os.makedirs(self.path, exist_ok=True)
            # named by the task attempt: the driver ignores a failed attempt's file
            task = current_attempt()
            suffix = uuid.uuid4().hex
            name = f"{suffix}.parquet" if task is None else attempt_file_name(task, suffix)
            pq.write_table(table, os.path.join(self.path, name))
        except Exception:  # whatever it is: the round is lost, the rows failed as before
            return False
        return True


def keep_rows(client: Any, stage: str, rows: Any, failures: list[tuple[np.ndarray, str]]) -> bool:
    """In a keeping round, the failed rows of a stage's input batch ``rows`` kept for a replay
    round (True: the caller drops them as the stage's own filter would, acked as dropped);
    False: fail them as before (not the keeping stage, over its share, not convertible)."""
    keep = getattr(client, "keep", None)
    kept = getattr(client, "kept", None)
    if keep is None or kept is None or kept.stage != stage:
        return False
    positions = np.concatenate([p for p, _ in failures]).astype(np.int64)
    reasons = [f"stage {stage}: {r}" for p, r in failures for _ in range(len(p))]
    try:
        table = kept.table_of(rows, positions)
    except (pa.ArrowException, KeyError, TypeError, ValueError):
        return False
    return bool(keep(stage, table, reasons))


class RoundXor:
    """The acker of an optimistic round inside a task: the same ``xor`` / ``fail`` calls a
    runner makes to the acker service, folded into the round's accumulator (one XOR of every
    event; a count of failed rows). ``failed`` tells the runner that the round is lost, so it
    skips the rest of its work; the first failure also writes its reason to the token's
    abort file.

    >>> class Acc:
    ...     value = (0, 0)
    ...     def add(self, v): self.value = (self.value[0] ^ v[0], self.value[1] + v[1])
    >>> r = RoundXor(RoundToken(Acc()))
    >>> r.xor(np.array([1, 2], np.uint64), np.array([6, 3], np.uint64))
    >>> r.fail(np.array([7], np.uint64), reason="x"); r.accumulator.value, r.failed
    ((5, 1), True)
    """

    def __init__(self, token: RoundToken) -> None:
        self.accumulator = token.accumulator
        self.abort_path = token.abort_path
        self.kept = token.kept
        self.failed = False
        self.rows_seen = 0  # this task's source rows (see :meth:`keep`)
        self.rows_kept = 0
        self._kept: list[Any] = []  # the rows kept so far, written at the task's end

    def saw(self, n: int) -> None:
        """Count ``n`` source rows that reached the task's stage (the share :meth:`keep`
        allows is of these)."""
        self.rows_seen += int(n)

    def keep(self, stage: str, rows: Any, reasons: list[str]) -> bool:
        """Keep the failed source rows ``rows`` (an Arrow table: payload and ``_ft_src``) of
        ``stage`` for a replay round instead of losing the round (:mod:`xorack.spark.kept`);
        False when the round keeps none of this stage's, or when this task's failed rows
        exceed the share a round keeps: the caller then fails them as before."""
        if self.kept is None or self.failed or stage != self.kept.stage:
            return False
        if not self.kept.allows(self.rows_kept + rows.num_rows, self.rows_seen):
            return False
        self.rows_kept += rows.num_rows
        self._kept.append(self.kept.with_reasons(rows, reasons))
        self.kept.count.add(rows.num_rows)  # the driver reads exactly as many, or falls back
        return True

    def finish(self) -> None:
        """At the end of the task: write the rows it kept (one file); should that fail, the
        round is lost (they were dropped from its outputs and nobody else has them)."""
        if not self._kept or self.kept is None:
            return
        tables, self._kept = self._kept, []
        if not self.kept.write(tables):
            n = sum(t.num_rows for t in tables)
            self.fail(np.zeros(n, np.uint64), reason="the rows it failed could not be kept")

    def xor(self, src: Any, values: Any, **_: Any) -> None:
        v = np.asarray(values, dtype=np.uint64)
        if len(v):
            self.accumulator.add((int(np.bitwise_xor.reduce(v)), 0))

    def fail(self, src: Any, reason: str = "", **_: Any) -> None:
        if not self.failed and self.abort_path is not None:
            try:  # best effort: the driver then cancels the round's jobs
                with open(self.abort_path, "a", encoding="utf-8") as f:
                    f.write(f"{reason[:300]}\n")
            except OSError:  # not reachable from this executor: the round runs to its end
                pass
        self.failed = True
        self.accumulator.add((0, max(1, len(np.asarray(src)))))

    def failure_share(self, failed: int, rows: int) -> None:
        """Note that ``failed`` of a batch's ``rows`` failed (a line ``failed rows`` in the
        abort file's ``.share`` file): the driver estimates from these lines how often the
        phase's records fail (:func:`failure_rate`)."""
        if self.abort_path is None or rows <= 0:
            return
        try:  # best effort, like the abort file itself
            with open(self.abort_path + SHARE_SUFFIX, "a", encoding="utf-8") as f:
                f.write(f"{int(failed)} {int(rows)}\n")
        except OSError:
            pass


class AbortWatch:
    """Watches an optimistic round's abort file while its jobs run, and cancels the round's
    job group as soon as a runner writes it (a row failed: the round is lost). ``reason()``:
    what the runner wrote, or None when nothing was.

    >>> import pathlib, tempfile, time
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "abort"
    >>> cancelled = []
    >>> with AbortWatch(str(path), lambda: cancelled.append(1), interval=0.01) as watch:
    ...     _ = path.write_text("stage 's': boom\\n")
    ...     time.sleep(0.2)
    >>> cancelled, watch.reason()
    ([1], "stage 's': boom")
    """

    def __init__(self, path: str, cancel: Any, interval: float = 0.05) -> None:
        import threading

        self.path = path
        self._cancel = cancel
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xorack-abort-watch", daemon=True)
        self.cancelled = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if os.path.exists(self.path):
                self.cancelled = True
                self._cancel()
                return

    def reason(self) -> str | None:
        return first_line(self.path)

    def __enter__(self) -> AbortWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


#: the file next to an abort file where failing batches note their share of failed records
SHARE_SUFFIX = ".share"


def failure_rate(abort_path: str) -> float | None:
    """An estimate of the share of a phase's records that fail, from the batches that failed
    a row before its optimistic round was cancelled (their ``failed rows`` lines, see
    :meth:`RoundXor.failure_share`); None when no batch said (the file was not reachable).
    An optimistic round's rows carry no record ids, so this is the share of failed rows of
    the stage that failed them (below the records' share when a record has several rows).

    Each line comes from a batch that failed at least once (which is why it was written), so
    one failure per line is taken as the condition and only the others count: a lone failed
    row in a batch of 10,000 says "rare" (0.0), eleven say "about one in a thousand".

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); a = os.path.join(d, "r.lost")
    >>> failure_rate(a) is None
    True
    >>> with open(a + SHARE_SUFFIX, "w") as f:
    ...     _ = f.write("1 10000\\n11 10000\\n")
    >>> failure_rate(a)
    0.0005
    """
    try:
        with open(abort_path + SHARE_SUFFIX, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    failed = records = 0
    for line in lines:
        parts = line.split()
        if len(parts) != 2:
            continue  # a line cut short by a cancelled task
        try:
            k, n = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        failed += max(k - 1, 0)
        records += max(n, k)
    return failed / records if records else None


def first_line(path: str) -> str | None:
    """The first line of a file (an abort file's first reason), or None when unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return None
    return text.splitlines()[0] if text else ""


_KEPT = "_ft_kept"


def tag_source(
    df: Any,
    salt: int,
    source: int,
    observation: Any,
    keep: Any = None,
    qualifier: str | None = None,
    filter_first: bool = False,
) -> Any:
    """A source's rows with lineage columns drawn in the JVM, observed on the way (their count
    ``n`` and the XOR of their ids ``x``, the births): ``_ft_rec`` = ``xxhash64(salt, source,
    monotonically_increasing_id())`` (distinct rows, distinct ids but for a 2^-64 accident), no
    pending event. ``_ft_src`` is the round's salt for every row: the round acks its records
    as one tree, and Python stages pass the column through. The constant columns are added
    after the observation, so that Spark folds them into the operators that read them.

    ``keep``: the condition of a filter that alone reads the source. A row it removes is born
    and acked as dropped at once: its id would cancel itself in the round's sum. So it is left
    out of ``x`` and removed right here, and no later operator carries it as a ghost (``n``
    still counts every source row). ``qualifier``: the name the condition may give the frame
    (``t["k"]``). ``filter_first``: the source's rows are counted apart (``n`` is then the
    rows ``keep`` passes, and :class:`CountedApart` gives the count): the filter comes before
    the ids, where Spark pushes it into the scan of the source's files."""
    f = _f()
    rec = f"xxhash64({int(salt)}L, {int(source)}, monotonically_increasing_id()) AS {REC}"
    salt_id = int(salt) or 1  # a nonzero id: the kernels refuse id 0
    payload = [q(c) for c in df.columns]
    if keep is None:
        tagged = select_expr(df, [*payload, rec]).observe(
            observation, f.expr("count(1)").alias("n"), f.expr(f"bit_xor({REC})").alias("x")
        )
    elif filter_first:
        named = df.alias(qualifier) if qualifier else df
        tagged = select_expr(named.where(keep), [*payload, rec]).observe(
            observation, f.expr("count(1)").alias("n"), f.expr(f"bit_xor({REC})").alias("x")
        )
    else:  # the condition evaluated once per row, into a column of its own
        kept = f.coalesce(keep, f.lit(False)).alias(_KEPT)
        births = f"bit_xor(CASE WHEN {_KEPT} THEN {REC} ELSE 0L END)"
        named = df.alias(qualifier) if qualifier else df
        # every column of ``df`` (the payload) then the two new ones: withColumns does not send
        # the payload's names over py4j one column at a time, as a select of Columns does
        tagged = named.withColumns({REC: f.expr(rec), _KEPT: kept})
        tagged = tagged.observe(
            observation, f.expr("count(1)").alias("n"), f.expr(births).alias("x")
        ).where(f.col(_KEPT))
    return select_expr(
        tagged, [*payload, f"{salt_id}L AS {SRC}", REC, f"0L AS {EV}", f"true AS {KEEP}"]
    )


def staged(df: Any, observation: Any) -> Any:
    """``df`` (rows leaving the phase, ghosts included) observed: the XOR of the event each row
    owes (``x``) and its live rows (``rows``)."""
    f = _f()
    return df.observe(
        observation,
        f.expr(f"bit_xor({EVENT})").alias("x"),
        f.expr(f"count_if({KEEP})").alias("rows"),
    )


def observed(observation: Any) -> dict[str, int] | None:
    """An observation's values after its job, or None when Spark has none for it (its plan
    did not run)."""
    try:
        values = observation.get
    except Exception:  # the plan never ran (e.g. adaptive execution dropped it as empty)
        return None
    return {k: int(v or 0) for k, v in values.items()}


#: Count a file source of a phase of native operations only by a job of its own
#: (:class:`ScanCount`); False: by an observed metric over its rows (as before; an A/B switch
#: for the benchmarks).
COUNT_SCANS = True
#: The logical operators a source's plan may hold above its files for :class:`ScanCount` to
#: count it: none changes the rows, none is evaluated by a count. (A source filtered in its
#: own plan is observed in the round: a count would evaluate its condition, a Python UDF's
#: included, on every row, and Spark pushes that filter into the scan below the metric.)
_SCAN_ABOVE = frozenset({"Project", "SubqueryAlias"})


#: At most this many local Parquet files have their footers read on the driver for a count.
FOOTER_FILES = 256


def file_scan(df: Any) -> str | None:
    """How ``df``'s rows can be counted apart from a round, or None: ``"footers"`` for local
    Parquet files read as they are (projections and aliases only above them, no file listed
    twice), ``"job"`` for other Parquet or ORC files read so (a job reading their metadata).
    Either gives what a second read of the files gives. Other formats are not counted apart:
    a CSV or JSON reader that drops malformed lines (``mode=DROPMALFORMED``) drops them by the
    columns it parses, and a count parses none."""
    try:
        node = df._jdf.queryExecution().analyzed()
        while node.getClass().getSimpleName() in _SCAN_ABOVE:
            if not node.deterministic():
                return None
            node = node.child()
        if node.getClass().getSimpleName() != "LogicalRelation":
            return None
        relation = node.relation()
        if relation.getClass().getSimpleName() != "HadoopFsRelation":
            return None
        fmt = relation.fileFormat().getClass().getSimpleName()
        if fmt not in ("ParquetFileFormat", "OrcFileFormat"):
            return None
        if fmt == "ParquetFileFormat" and _distinct_roots(relation):
            return "footers"
    except Exception:  # not a classic DataFrame, or a plan of another shape: observed instead
        return None
    return "job"


def _distinct_roots(relation: Any) -> bool:
    """Whether no root path of the relation's files is listed twice or holds another (Spark
    reads a file reached from two roots twice; ``inputFiles`` lists it once)."""
    roots = relation.location().rootPaths()
    paths = [str(roots.apply(i).toUri().getPath()).rstrip("/") for i in range(roots.size())]
    if len(set(paths)) != len(paths):
        return False
    return not any(a != b and b.startswith(a + "/") for a in paths for b in paths)


def footer_rows(df: Any) -> int | None:
    """The rows of ``df``'s Parquet files from their footers (read on the driver), when they
    are at most :data:`FOOTER_FILES` local files; else None."""
    from urllib.parse import unquote, urlparse

    import pyarrow.parquet as pq

    files = list(df.inputFiles())
    if not files or len(files) > FOOTER_FILES:
        return None
    rows = 0
    for uri in files:
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            return None
        try:
            rows += pq.ParquetFile(unquote(parsed.path)).metadata.num_rows
        except Exception:  # unreadable here: Spark counts it
            return None
    return rows


class ScanCount:
    """A file source's row count, in place of an observed count: from its Parquet footers
    (``how="footers"``, :func:`footer_rows`) or else by a Spark job of its own (``df.count()``,
    in a job group of its own) in a thread, so that it runs beside the round's jobs. It starts
    when the round's jobs do (:meth:`start`), or when first asked for (:attr:`get`); a round
    that falls back cancels it (:meth:`cancel`).

    An observed metric over a source stands between its files and the filter that reads
    them: Spark then pushes no filter into the scan (no row group skipped, every row decoded)
    and splits the generated code there. TPC-H Q6 at scale factor 1 on this 2-core machine:
    plain Spark 0.55 s, with the observed count 0.85 s, plain Spark then its count 0.73 s.
    ``get`` waits for the count (``{"n": rows}``); it raises what the count raised, which
    :func:`observed` takes for a metric Spark did not report (the round falls back)."""

    def __init__(self, df: Any, how: str = "job") -> None:
        self.df = df
        self.how = how
        self.group = f"xorack-count-{uuid.uuid4().hex}"
        self._n: int | None = None
        self._error: BaseException | None = None
        self._thread: Any = None
        self._started = False

    def start(self) -> None:
        """Count (footers: at once; else a job in a thread), once."""
        if self._started:
            return
        self._started = True
        if self.how == "footers":
            self._n = footer_rows(self.df)
            if self._n is not None:
                return
        import threading

        def count() -> None:
            try:
                sc = self.df.sparkSession.sparkContext
                sc.setJobGroup(self.group, "xorack: a source's row count", True)
                self._n = int(self.df.count())
            except BaseException as exc:  # kept for get
                self._error = exc

        self._thread = threading.Thread(target=count, name="xorack-scan-count", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Cancel a count job still running (its round fell back: nothing reads it)."""
        if self._thread is not None and self._thread.is_alive():
            import contextlib

            with contextlib.suppress(Exception):  # the context is stopping: nothing runs
                self.df.sparkSession.sparkContext.cancelJobGroup(self.group)

    @property
    def get(self) -> dict[str, int]:
        self.start()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return {"n": int(self._n or 0)}


class CountedApart:
    """A source's births observed in the round over the rows its filter passes (``x``), its
    record count (``n``) from a :class:`ScanCount`."""

    def __init__(self, observation: Any, count: ScanCount) -> None:
        self.observation = observation
        self.count = count

    def start(self) -> None:
        self.count.start()

    def cancel(self) -> None:
        self.count.cancel()

    @property
    def get(self) -> dict[str, int]:
        return {**self.observation.get, "n": self.count.get["n"]}


def counted_apart(node: Any, df: Any, replaced: bool) -> ScanCount | None:
    """A :class:`ScanCount` of the input source ``node`` read from files (``df``), or None: it
    is counted by an observed metric in the round (a derived source, one whose frame the round
    ``replaced``, any other input)."""
    if not COUNT_SCANS or node.derived is not None or replaced:
        return None
    how = file_scan(df)
    return None if how is None else ScanCount(df, how)


def without_ghosts(df: Any) -> tuple[Any, Any]:
    """``df`` without its ghosts (rows a native filter, join or generator removed) and the
    observation that XORs what they owe (their pending events), for a Python stage's input:
    the stage would drop them too, after Arrow had carried them to its worker (a filter keeping
    2.5 % of 6 M rows sent the other 97.5 % there)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation()
    owed = F.expr(f"bit_xor(CASE WHEN {KEEP} THEN 0L ELSE {EV} END)").alias("x")
    return df.observe(seen, owed).where(F.col(KEEP)), seen


def await_tasks(sc: Any, group: str, timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Wait until no task of the jobs of ``group`` runs any more (a cancelled job's tasks are
    killed after the job has failed); False when some still ran after ``timeout`` seconds."""
    import time

    tracker = sc.statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        running = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                s = tracker.getStageInfo(stage)
                running += int(s.numActiveTasks) if s is not None else 0
        if not running:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@dataclass
class RoundAccount:
    """What an optimistic round saw: its source rows (``records``), the XOR of their ids
    (``births``), of the events staged where rows left the phase (``staged``) and of the events
    its Python stages folded into the round's accumulator (``python``); rows that failed in a
    Python stage, with their reasons; what Spark's task accounting cannot vouch for
    (``task_failures``, :mod:`xorack.spark.tasks`), and the failed task attempts it retried
    (harmless); and observations Spark did not report."""

    records: int = 0
    births: int = 0
    staged: int = 0
    python: int = 0
    failed_rows: int = 0
    reasons: list[str] = field(default_factory=list)
    task_failures: int = 0
    task_reasons: list[str] = field(default_factory=list)
    retried: int = 0
    missing: list[str] = field(default_factory=list)

    def add_phase(self, builder: Any) -> list[tuple[Any, int]]:
        """One phase's births and events (an ``OptimisticBuilder``'s: its sources, lookup
        joins, branch points, outputs, and the barrier outputs of it that a later phase of the
        round reads); the records of each of its sources."""
        records: list[tuple[Any, int]] = []
        for node, seen in builder.births:
            got = observed(seen)
            if got is None:
                self.missing.append(f"source {node.name!r}")
                continue
            self.births ^= got.get("x", 0)  # none in a phase of native operations only
            self.records += got["n"]
            records.append((node, got["n"]))
        for node, count in builder.stage_births:  # their births are in the stage's events
            self.records += int(count.value)
            records.append((node, int(count.value)))
        staged = [(f"the lookup join {j.name!r}", seen) for j, seen in builder.joins]
        staged += [(f"the branch point {p.name!r}", seen) for p, seen in builder.tees]
        staged += [
            (f"the rows removed before {s.name!r}", seen)
            for s, seen in getattr(builder, "ghosts", ())
        ]
        staged += [  # a Python sink's events are in the accumulator (see DerivedTagger)
            (f"the rows reaching {job.name!r}", job.events)
            for job in [*builder.outputs, *builder.inner]
            if not job.src
        ]
        for what, seen in staged:
            got = observed(seen)
            if got is None:
                self.missing.append(what)
                continue
            self.staged ^= got.get("x", 0)  # none in a phase of native operations only
        return records

    def verdict(self) -> tuple[Reason, str] | None:
        """None when every record of the round completed, else why the round falls back."""
        if self.failed_rows or self.reasons:
            why = "; ".join(self.reasons[:3]) or "a stage failed rows"
            return Reason.ROW_FAILED, f"{self.failed_rows} row(s) failed: {why}"
        if self.task_failures:
            return (
                Reason.TASK_FAILED,
                "Spark's task accounting cannot vouch for the round: "
                + ("; ".join(self.task_reasons[:2]) or f"{self.task_failures} doubt(s)"),
            )
        if self.missing:  # e.g. adaptive execution dropped an operator whose input was empty
            return (
                Reason.METRICS_MISSING,
                f"Spark reported no metrics for {', '.join(self.missing)}",
            )
        if (self.births ^ self.staged ^ self.python) & MASK:
            return (
                Reason.UNBALANCED,
                "the events of the round do not cancel its births (a row was lost or counted "
                "twice)",
            )
        return None


def move_dir(spark: Any, src: str, dst: str, replace: bool) -> None:
    """Move directory ``src`` to ``dst`` through Hadoop's file system API (any file system
    Spark writes to). With ``replace`` an existing ``dst`` is deleted first; otherwise an
    existing ``dst`` is an error, as Spark's ``mode("error")``."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    s, d = jvm.org.apache.hadoop.fs.Path(src), jvm.org.apache.hadoop.fs.Path(dst)
    fs = d.getFileSystem(conf)
    if fs.exists(d):
        if not replace:
            raise FileExistsError(f"path {dst} already exists (mode 'error')")
        fs.delete(d, True)
    parent = d.getParent()
    if parent is not None and not fs.exists(parent):
        fs.mkdirs(parent)
    if not fs.rename(s, d):
        raise OSError(f"could not move {src} to {dst}")


def remove_dir(spark: Any, path: str) -> None:
    """Delete ``path`` (recursively) if it exists, on any file system Spark writes to."""
    jvm = spark._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(p):
        fs.delete(p, True)


def round_salt(source: str) -> int:
    """The salt of a source's ids in optimistic rounds: a 63-bit value of the source's name,
    the same in every run. The ids only need to differ within a round (they never reach the
    acker or a sink), and a salt that changed per run would change the text of the code Spark
    generates for the plan, which Spark then compiles anew on every run (~0.1 s) instead of
    taking it from its cache.

    >>> round_salt("lines") == round_salt("lines") != round_salt("words")
    True
    """
    from .ops import salt_of

    return salt_of(f"optimistic:{source}") or 1


def reasons_of(tally: dict[tuple[str, str], int]) -> list[str]:
    """The failure reasons a round's tally holds, as ``where: reason (n records)``."""
    from .guard import SEEN

    return [f"{where}: {reason} ({n})" for (where, reason), n in tally.items() if reason != SEEN]


def xor_all(values: Sequence[int]) -> int:
    out = 0
    for v in values:
        out ^= v & MASK
    return out


__all__ = [
    "COUNT_SCANS",
    "AbortWatch",
    "CountedApart",
    "RoundAccount",
    "RoundToken",
    "RoundXor",
    "ScanCount",
    "await_tasks",
    "file_scan",
    "footer_rows",
    "move_dir",
    "observed",
    "reasons_of",
    "remove_dir",
    "round_param",
    "round_salt",
    "staged",
    "tag_source",
    "xor_all",
]
