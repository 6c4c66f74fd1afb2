"""A PySpark pipeline whose every source record is tracked by the XOR acker.

Declare sources, stages and sinks on a :class:`Pipeline`; :meth:`Pipeline.run` builds the Spark
plan and runs it in *rounds* (:mod:`xorack.spark.batch`):

1. run the whole pipeline once (one Spark action; every tracked DataFrame evaluated once);
2. ``expire_all()``: after the job, nothing still pending can complete: it timed out;
3. take the replays (explicit failures + timeouts) of every source, place each on the partition
   its replay partitioner chose, and run them again from the source's successor stage;
4. repeat until every source record is completed or dead-lettered (bounded by ``max_attempts``).

With ``ft=False`` the same Spark plan is built without tagging, service or extra columns.

``Pipeline`` is the declaration facade: the plan is :mod:`xorack.spark.plan` (one class per
node kind), a run is a :class:`~xorack.spark.context.RunContext` driven by
:class:`~xorack.spark.batch.BatchRun` or :class:`~xorack.spark.streaming.StreamingRun`.

>>> from xorack.spark import Pipeline, SQLiteSink               # doctest: +SKIP
>>> p = Pipeline(spark)                                          # doctest: +SKIP
>>> words = (p.source(df, name="lines")                          # doctest: +SKIP
...           .map_in_pandas(split, "word string", name="split"))
>>> words.sink(SQLiteSink("/tmp/words.db", "words"))            # doctest: +SKIP
>>> report = p.run(); report.lost                                # doctest: +SKIP
0
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ..protocol import CHUNK_BITS
from .batch import BatchRun
from .conf import default, name_the_key, resolve
from .context import PipelineConfig, RunContext
from .declare import PlanBuilder
from .guard import FailureTally
from .outputs import Aggregate
from .phases import how_phase_runs
from .plan import Plan
from .prune import prune
from .quiet import quiet_spark_logs
from .report import REPORT_KEYS, RoundInfo, RunReport
from .reproducible import check_speculation
from .tracked import GroupedTracked, Tracked


def _check_resumable(ft: bool, storage: Any, service: Any, ackers: int, workdir: Any) -> None:
    """``resume=True`` needs what outlives the driver: a SQLite storage and a work directory,
    in an acker the driver embeds (one: a batch persisted across shards is not atomic)."""
    from ..storage import SQLiteStorage, storage_path

    why = None
    if not ft:
        why = "with ft=False nothing is tracked"
    elif service is not None:
        why = "it needs the embedded acker (service=None): a standalone one keeps its own storage"
    elif ackers != 1:
        why = "a sharded acker does not persist a batch atomically: use ackers=1"
    elif not (
        isinstance(storage, SQLiteStorage)
        or (isinstance(storage, (str, os.PathLike)) and storage_path(storage) is not None)
    ):
        why = f"storage {storage!r} does not outlive the driver: give storage='sqlite:///path'"
    elif workdir is None:
        why = "give workdir= (staged rows of barriers and native sinks must outlive the driver)"
    if why is not None:
        raise ValueError(f"resume=True: {why}")


def _checked_config(
    spark: Any,
    ft: bool,
    storage: str,
    max_attempts: int,
    deterministic_ids: bool,
    service: str | None,
    token: str | None,
    id_salt: int,
    workdir: str | None,
    runaway_share: float | None,
    job: str | None,
    acker_host: str,
    acker_advertise: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    combine: bool,
    chunk_records: int,
    ackers: int,
    resume: bool,
    optimistic: bool,
    verbose: bool,
) -> PipelineConfig:
    """The pipeline's settings, each option checked (a ``ValueError`` says what is wrong)."""
    from pyspark.sql.types import StructType  # noqa: F401 - fail early without pyspark

    from ..sharding import MAX_SHARDS

    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if isinstance(ackers, bool) or not isinstance(ackers, int) or not 1 <= ackers <= MAX_SHARDS:
        raise ValueError(f"ackers must be an int in [1, {MAX_SHARDS}], got {ackers!r}")
    if ackers > 1 and service is not None:
        raise ValueError(
            "ackers=N starts an embedded sharded acker; with service=... the standalone "
            "acker's own shards apply (xorack serve --shards N): give one or the other"
        )
    if ackers > 1 and not isinstance(storage, (str, os.PathLike)):
        raise ValueError(
            "ackers=N runs N acker processes, each opening its own storage: give a storage "
            f"spec ('memory' or a SQLite path), not a {type(storage).__name__} object"
        )
    if resume:
        _check_resumable(ft, storage, service, ackers, workdir)
    if job is not None:
        from ..service import check_job

        job = check_job(job)
    FailureTally(runaway_share)  # checks the value now
    if (
        isinstance(chunk_records, bool)
        or not isinstance(chunk_records, int)
        or not 1 <= chunk_records <= 1 << CHUNK_BITS
        or chunk_records & (chunk_records - 1)
    ):
        raise ValueError(
            f"chunk_records must be a power of two from 1 to {1 << CHUNK_BITS}, got "
            f"{chunk_records!r}"
        )
    return PipelineConfig(
        spark=spark,
        ft=bool(ft),
        storage=storage,
        max_attempts=int(max_attempts),
        deterministic_ids=bool(deterministic_ids),
        service=service,
        token=token,
        id_salt=int(id_salt),
        workdir=workdir,
        runaway_share=runaway_share,
        job=job,
        acker_host=acker_host,
        acker_advertise=acker_advertise,
        tls_cert=tls_cert,
        tls_key=tls_key,
        combine=bool(combine),
        chunk_records=chunk_records,
        ackers=ackers,
        resume=bool(resume),
        optimistic=bool(optimistic),
        verbose=bool(verbose),
    )


class Pipeline:
    """Sources, tracked stages and sinks, run with record-level guaranteed processing.

    ``ft=False`` builds the same Spark plan without tagging, service or extra columns.
    ``storage`` ("memory" or "sqlite:///path") and ``max_attempts`` configure the embedded FT
    layer; ``service`` is the location of a running ``xorack serve`` instead (then its own
    storage and attempts apply). ``deterministic_ids`` derives every id from its parent, so
    a replayed source record re-creates the same output ids (exactly-once results with an
    idempotent sink); ``id_salt`` makes the ids of two runs over the same input differ (by
    default a re-run into the same idempotent sink is absorbed as duplicates). ``token``:
    the service's shared token. On a cluster the executors must reach the embedded acker:
    ``acker_host`` is the address it binds (default 127.0.0.1; a non-loopback one needs
    ``token`` and TLS), ``acker_advertise`` the host name executors connect to (default
    ``acker_host``), ``tls_cert``/``tls_key`` its PEM certificate and key (the executors trust
    that certificate; with ``service=...`` ``tls_cert`` alone is the certificate to trust).
    ``job``: the run's namespace on the acker (default: a fresh one per run, so runs sharing a
    standalone acker never see each other's records). ``workdir``: where barriers stage their
    rows (a temporary directory by default; on a cluster a path every executor can write).
    ``runaway_share``: the share of a stage's records one error must fail on two attempts in a
    row to stop the run (None: never; a stage of fewer than 20 records: one error failing
    all of them, two at least). ``combine``: an aggregation whose functions combine
    (count, sum, min, max, avg) stages per-chunk partial aggregates instead of rows, as Spark's
    map-side combine does (see :mod:`xorack.spark.barrier`); ``False`` stages every row (no
    collateral replays of the chunk-mates of a record that fails in the first round).
    ``chunk_records`` (a power of two up to 1024): the source records per chunk — fewer
    replay fewer chunk-mates when first-round failures are frequent, but combine less.
    ``ackers``: acker processes of the embedded acker (default 1: a thread of the driver);
    N > 1 starts N shard processes (:mod:`xorack.shards`), each owning the chunks of source
    ids that hash to it, with its own storage (a SQLite file per shard, ``NAME.shard0ofN.db``),
    stopped with the run.

    ``optimistic`` (default True): each phase first runs as plain Spark would, acked as one
    XOR tree (:mod:`xorack.spark.optimistic`): when nothing failed, the phase is done at about
    plain Spark's cost, with nothing persisted; when something failed (a row, a lost row, a
    Spark task), its outputs are discarded and the phase runs in tracked rounds from its
    sources. A phase with a sink written from Python, an ``apply_in_pandas`` stage or a branch
    point, and streaming and resumable jobs, always run tracked rounds. Turn it off for a job
    whose first rounds are known to fail some records (the optimistic round would only cost).

    ``resume=True`` makes the job resumable after a driver crash (README: "Resuming after a
    driver crash"): its state lives in ``storage`` (a SQLite file) and ``workdir`` (staged barrier
    rows), and a later ``run()`` of the same pipeline with the same two continues where the
    crashed one stopped — rows persisted before are not read again, records the crash left
    pending are replayed, sinks end exactly-once. A job that finished answers its report
    again; start a new job with a new storage and workdir. Needs the embedded acker with
    ``ackers=1``.

    ``verbose`` (default False): Spark's own logs of the task failures a run expects (a
    failed record's task, a native row error narrowed, a cancelled optimistic round: the
    ERROR lines and Java stack traces of ``Executor``, ``TaskSetManager`` and the Python
    runners) are turned off while ``run()`` or ``repair()`` runs, and back as they were after
    (:mod:`xorack.spark.quiet`); ``True`` leaves them on.

    Every option but ``spark`` can also be set in the session's Spark configuration as
    ``spark.xorack.<option in camelCase>`` (``spark-submit --conf spark.xorack.maxAttempts=3``;
    :mod:`xorack.spark.conf`); an argument given here wins.

    >>> # p = Pipeline(spark, ft=True, storage="memory", max_attempts=5)
    """

    def __init__(
        self,
        spark: Any,
        ft: bool = default(True),
        storage: str = default("memory"),
        max_attempts: int = default(5),
        deterministic_ids: bool = default(True),
        service: str | None = default(None),
        token: str | None = default(None),
        id_salt: int = default(0),
        workdir: str | None = default(None),
        runaway_share: float | None = default(0.5),
        job: str | None = default(None),
        acker_host: str = default("127.0.0.1"),
        acker_advertise: str | None = default(None),
        tls_cert: str | None = default(None),
        tls_key: str | None = default(None),
        combine: bool = default(True),
        chunk_records: int = default(1 << CHUNK_BITS),
        ackers: int = default(1),
        resume: bool = default(False),
        optimistic: bool = default(True),
        verbose: bool = default(False),
    ) -> None:
        options, from_conf = resolve(
            spark,
            {
                "ft": ft,
                "storage": storage,
                "max_attempts": max_attempts,
                "deterministic_ids": deterministic_ids,
                "service": service,
                "token": token,
                "id_salt": id_salt,
                "workdir": workdir,
                "runaway_share": runaway_share,
                "job": job,
                "acker_host": acker_host,
                "acker_advertise": acker_advertise,
                "tls_cert": tls_cert,
                "tls_key": tls_key,
                "combine": combine,
                "chunk_records": chunk_records,
                "ackers": ackers,
                "resume": resume,
                "optimistic": optimistic,
                "verbose": verbose,
            },
        )
        try:
            self.config = _checked_config(spark, **options)
        except ValueError as exc:  # a value Spark configuration set is named by its key
            raise ValueError(name_the_key(str(exc), from_conf)) from None
        self._builder = PlanBuilder(self.config)
        self._run: RunContext | None = None  # the running (or last) run
        self._before: RunContext | None = None  # the run before it

    # ---- settings, read-only ------------------------------------------------------------------

    @property
    def spark(self) -> Any:
        return self.config.spark

    @property
    def ft(self) -> bool:
        return self.config.ft

    @property
    def resume(self) -> bool:
        return self.config.resume

    @property
    def max_attempts(self) -> int:
        return self.config.max_attempts

    @property
    def ackers(self) -> int:
        return self.config.ackers

    @property
    def storage(self) -> Any:
        return self.config.storage

    @property
    def workdir(self) -> str | None:
        return self.config.workdir

    @property
    def job(self) -> str | None:
        return self.config.job

    @property
    def optimistic(self) -> bool:
        return self.config.optimistic

    @property
    def verbose(self) -> bool:
        return self.config.verbose

    # ---- declaration --------------------------------------------------------------------------

    def source(
        self,
        df: Any,
        name: str | None = None,
        keys: list[str] | tuple[str, ...] = (),
        partitions: int | None = None,
    ) -> Tracked:
        """A tracked source over ``df``.

        With ``keys`` the source is hash-partitioned by them (``df.repartition(partitions,
        *keys)``, exactly as Spark does it) and replays go to the partition Spark assigns to the
        same key; without keys, replays go back to the partition the record was first read on.
        A streaming source without ``keys`` or ``partitions`` keeps each micro-batch's own
        partitions (coalesced to at most ``spark.sql.shuffle.partitions``, no shuffle); with
        ``partitions`` each micro-batch is spread over that many (round-robin).

        >>> # lines = p.source(spark.read.text(path), name="lines")
        """
        node = self._builder.source(df, name, tuple(keys), partitions)
        return Tracked(self._builder, node)

    def plan(self) -> Plan:
        """The plan as declared so far (immutable; :mod:`xorack.spark.plan`)."""
        return self._builder.plan()

    def explain(self) -> str:
        """The plan as text: per phase, whether it runs an optimistic round and, if not, why
        (a typed :class:`~xorack.spark.report.Reason`); its nodes with their parents and lineage
        rules. Asks Spark nothing that runs a job.

        >>> # print(p.explain())
        """
        if not self.ft:
            plan = self._builder.plan()
            return "xorack plan, FT off (plain Spark's plan)\n" + plan.explain()
        ctx = self._context(self.config)
        ctx.partial_phases = {
            b.parents[0].phase
            for b in ctx.plan.barriers()
            if isinstance(b, Aggregate) and b.combining(ctx) is not None
        }
        text = ctx.plan.explain(lambda phase: how_phase_runs(ctx, phase))
        return "xorack plan, FT on\n" + text

    # ---- running ------------------------------------------------------------------------------

    def run(self, on_round: Callable[[RoundInfo], None] | None = None) -> RunReport:
        """Run the pipeline to the end (rounds of replays until nothing is pending; a phase per
        barrier level); the report accounts for every source record.

        >>> # report = p.run(); assert report.lost == 0
        """
        self._builder.plan().sinks()  # a plan without a sink is an error
        ctx = self._context(self.config)
        if self.ft:
            check_speculation(self.spark)
        self._before, self._run = self._run, ctx
        with quiet_spark_logs(self.spark, self.config.verbose):
            run = BatchRun(ctx)
            report = run.run(on_round)
            while run.cascade is not None:  # voided: again without the records behind the row
                run = run.next_pass()
                self._run = run.ctx
                report = run.run(on_round)
        return report

    def _context(self, config: PipelineConfig) -> RunContext:
        """A batch run's context: with FT on, over the plan with each tracked join's output
        cut to the columns read after it (:mod:`xorack.spark.prune`)."""
        declared = self._builder.plan()
        if not config.ft:
            return RunContext(config, declared)
        return RunContext(config, prune(declared, self.spark), declared)

    def start_stream(
        self,
        timeout: float = 30.0,
        trigger_seconds: float | None = None,
        checkpoint_location: str | None = None,
        available_now: bool = False,
        output_mode: str = "append",
    ) -> Any:
        """Run the pipeline over its streaming source in ``foreachBatch``; returns a
        :class:`~xorack.spark.streaming.StreamingRun` (``.query``, ``.stop() -> RunReport``,
        ``.wait() -> RunReport``). ``output_mode``: ``"append"`` (Spark's default: an
        aggregation by a time window writes each window once, when the watermark passes its
        end), ``"update"`` (each changed group's row replaces its row in the sinks, by key,
        counting the rows of settled records) or ``"complete"`` (every aggregation's whole
        result replaces its sinks' content whenever every record has settled). With
        ``checkpoint_location`` (Spark's) the FT state is durable and kept inside it by
        default (``<checkpoint>/xorack/``: a SQLite storage and the work directory; the
        pipeline's own ``resume=True`` settings otherwise) and checked against it at every
        start: a restart after a driver crash is exactly once, and one whose FT state does not
        belong to the checkpoint is refused. Records not completed ``timeout`` seconds after
        they were persisted or replayed are replayed in a later micro-batch.
        ``available_now=True`` (Spark's ``trigger(availableNow=True)``) reads what the source
        holds when the query starts and ends; ``run.wait()`` then drains and returns the
        report. With ``ft=False``
        the same stages run without tracking (the report's counts are ``None``).

        >>> # run = p.start_stream(timeout=10.0); ...; report = run.stop()
        >>> # report = p.start_stream(available_now=True).wait()
        """
        from .streaming import StreamingRun, checkpoint_config

        if self.ft:
            check_speculation(self.spark)
        config = checkpoint_config(self.config, checkpoint_location)
        # an aggregation stages rows in a stream (its chunks would span micro-batches)
        config = dataclasses.replace(config, combine=False)
        ctx = RunContext(config, self._builder.plan())
        self._before, self._run = self._run, ctx
        return StreamingRun(
            ctx, timeout, trigger_seconds, checkpoint_location, available_now, output_mode
        )

    @property
    def round(self) -> int:
        """The round being built (0: the first attempt; streaming: the micro-batch id)."""
        return self._run.round if self._run is not None else 0

    @property
    def client(self) -> Any:
        """The driver's client of the acker service (during :meth:`run`)."""
        if self._run is None:
            raise RuntimeError("the pipeline's service runs only during run()")
        return self._run.client

    @property
    def run_context(self) -> RunContext | None:
        """The context of the running (or last) run: its acker, staging and rounds."""
        return self._run

    def optimistic_progress(self) -> float | None:
        """The share (0..1) of the Spark tasks of a running optimistic round that are done, or
        None when no optimistic round runs (then ``client.stats()`` counts the records). An
        optimistic round completes its records all at once at its end; this is for progress
        bars.

        >>> # share = p.optimistic_progress()  (from another thread, during run())
        """
        group = self._run.optimistic_group if self._run is not None else None
        if group is None:
            return None
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                s = tracker.getStageInfo(stage)
                if s is not None:
                    done, total = done + s.numCompletedTasks, total + s.numTasks
        return done / total if total else 0.0

    def repair(self) -> Any:
        """Run again only the dead-lettered source records of this job (its durable storage and
        workdir: ``resume=True``), through the plan as declared now (fixed stages), and merge
        their rows and aggregate contributions into the sinks the job wrote, exactly once
        (:mod:`xorack.spark.repair`). Returns a
        :class:`~xorack.spark.repair.RepairReport`; what cannot be merged exactly (an outer
        join of tracked frames, a holistic aggregate, a stream, a memory storage), and a
        declaration whose plan is not the job's (:mod:`xorack.spark.fingerprint`), are refused
        before anything is written (``RepairRefused``).

        >>> # report = p.repair(); report.repaired, report.failed_again, report.sinks
        """
        from .repair import Repair

        with quiet_spark_logs(self.spark, self.config.verbose):
            return Repair(self.config, self._builder.plan()).run()

    def dead_letters(self, view: bool = False) -> Any:
        """The dead-letter table of the last run (payload, origin id, attempts, last reason), a
        ``pyarrow.Table``. ``view=True``: the job's durable dead letters (``resume=True``) as a
        pandas DataFrame — ``stage``, ``error``, ``attempts``, ``source``, ``origin``, the
        payload columns, and each one's repair ``status`` (``dead``, ``repaired``, ``failed
        again``), ``repair`` and ``repaired_at``.

        >>> # p.dead_letters(view=True).query("status == 'dead'")
        """
        if view:
            from .repair import dead_letter_view

            return dead_letter_view(self.config)
        last = self._run if self._run is not None and self._run.ended else self._before
        return last.dead_letters if last is not None else None  # while running: the last run's


__all__ = ["REPORT_KEYS", "GroupedTracked", "Pipeline", "RoundInfo", "RunReport", "Tracked"]
