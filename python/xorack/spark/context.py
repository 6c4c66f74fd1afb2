"""The run context shared by batch and streaming runs: the pipeline's settings
(:class:`PipelineConfig`), the acker the run talks to (endpoint, job, token, TLS roots,
storage), where it stages rows, its round and phase, and what the run made of each plan node
(:class:`NodeRun`). Nodes stay as they were declared; everything a run changes is here.

>>> # ctx = RunContext(config, plan); ctx.start_service(); ctx.client.stats(); ctx.stop_service()
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import ServiceError
from ..protocol import CHUNK_BITS
from .barrier import Staging

if TYPE_CHECKING:
    from .plan import Plan
    from .row_errors import RowGuard
    from .rows import Source


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline's settings, checked by :class:`~xorack.spark.Pipeline` (see its docstring
    for each one)."""

    spark: Any
    ft: bool = True
    storage: Any = "memory"
    max_attempts: int = 5
    deterministic_ids: bool = True
    service: str | None = None
    token: str | None = None
    id_salt: int = 0
    workdir: str | None = None
    runaway_share: float | None = 0.5
    job: str | None = None
    acker_host: str = "127.0.0.1"
    acker_advertise: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    combine: bool = True
    chunk_records: int = 1 << CHUNK_BITS
    ackers: int = 1
    resume: bool = False
    optimistic: bool = True
    verbose: bool = False  # Spark's logs of expected task failures left on during runs

    @property
    def chunk_bits(self) -> int:
        """log2 of ``chunk_records``."""
        return self.chunk_records.bit_length() - 1


@dataclass
class NodeRun:
    """What one run made of a plan node."""

    df: Any = None  # a barrier output's rows (the source of the next phase)
    staging: list[Staging] = field(default_factory=list)  # a barrier's / native sink's inputs
    partitions: int = 0  # a barrier output's partitions, chosen from its size (0: declared)
    fast_out: str | None = None  # an optimistic round's output: rows ready to publish
    fast_rows: int | None = None  # the rows of a native sink's fast_out
    written: bool = False  # an aggregate's output written into its Python sink by a round


class RunContext:
    """One run of a plan (a batch ``run()`` or a streaming query): its acker, staging and
    rounds. Public: the run's parts (rounds, builders, the streaming run) share it."""

    def __init__(self, config: PipelineConfig, plan: Plan, declared: Plan | None = None) -> None:
        self.config = config
        self.plan = plan
        #: the plan as declared (``plan`` may be its pruned form, :mod:`xorack.spark.prune`)
        self.declared = plan if declared is None else declared
        self.spark = config.spark
        self.ft = config.ft
        self.deterministic_ids = config.deterministic_ids
        self.token = config.token
        self.job: str | None = None  # the run's namespace on the acker
        self.location: str | None = None  # the acker's endpoint, while it runs
        self.tls_root_certs: bytes | None = None
        self.ft_layer: Any = None  # the embedded FTLayer (one acker in the driver)
        self.shards: Any = None  # the embedded ShardedAcker (ackers > 1)
        self._service: Any = None
        self.workdir: str | None = None  # the run's staging directory (FT on)
        self.run_tag = ""  # staging tags of a resumable run: unique per run
        self.round = 0
        self.phase = 0
        self.tally: Any = None  # the running round's failure accumulator
        self.chunk_bits = 0  # the running round's source ids are drawn in chunks of 2**bits
        self.partial_phases: set[int] = set()  # phases that stage partial aggregates
        # phases whose optimistic round fell back because rows failed, with the share of
        # records seen failing (None: unknown): their first tracked round draws ids in chunks
        # sized from it (xorack.spark.tracked_rounds.round_chunk_bits)
        self.rows_failed: dict[int, float | None] = {}
        self.resume_skip: dict[int, dict[int, int]] = {}  # source -> partition -> rows
        # streaming: told the replay tables each round takes (for current_attempt(pdf))
        self.on_replays: Any = None
        # a stream's watermark column: the sources persist each record's event time
        self.event_times: dict[str, str] = {}  # source name -> its watermark's column
        # the running micro-batch's largest event time per source (accumulators)
        self.event_max: dict[str, Any] = {}
        self.optimistic_group: str | None = None  # the job group of a running optimistic round
        self.fast_records = 0  # records of input sources completed by optimistic rounds
        self.fast_derived = 0  # records of barrier outputs completed by optimistic rounds
        # kept rounds (xorack.spark.kept): the failed attempts and replays of the records they
        # completed (the FT layer never saw them), and the phases whose keeping fell back
        self.kept_failed = 0
        self.kept_replayed = 0
        self.unkept: set[int] = set()
        # attempt ids of optimistic rounds that fell back after writing Python sinks (their
        # rows are retracted with the ended attempts')
        self.lost_round_srcs: list[int] = []
        self.dead_letters: pa.Table | None = None  # the run's, once it ended
        # phases whose row operations are guarded since a native expression raised on a row
        # (xorack.spark.row_errors); records an abandoned first round had completed or ended
        # and persisted again, by phase (counted once in the report)
        self.guarded: dict[int, RowGuard] = {}
        self.reread: dict[int, int] = {}
        # what each Python sink that can count held when the run started (FT on): an
        # abandoned round's writes are counted from it (xorack.spark.publish.recount)
        self.sink_counts: dict[str, int] = {}
        self.ended = False  # the run is over (its dead letters are final)
        # input sources' DataFrames replaced for this run (a cascade's later pass leaves the
        # records dead-lettered so far out: xorack.spark.cascade), by source index
        self.inputs: dict[int, Any] = {}
        # the attempts that wrote rows into sinks written from Python (an accumulator, when a
        # cascade may have to retract them), or None
        self.written: Any = None
        self._nodes: dict[int, NodeRun] = {}

    # ---- per node --------------------------------------------------------------------------

    def of(self, node: Any) -> NodeRun:
        """What this run made of ``node``."""
        got = self._nodes.get(id(node))
        if got is None:
            got = self._nodes[id(node)] = NodeRun()
        return got

    def release(self) -> None:
        """Forget what the run made of the nodes (barrier outputs, staging) once it is over:
        what a finished run keeps is its dead letters."""
        self._nodes.clear()
        self.ended = True

    def partitions(self, source: Source) -> int:
        """A source's partition count in this run."""
        return self.of(source).partitions or source.partitions

    def source_input(self, source: Source) -> Any:
        """A source's input DataFrame in this run: the declared one (or the one this run
        replaced it with), or a barrier output's."""
        if source.derived is None:
            return self.inputs.get(source.index, source.df)
        return self.of(source).df

    def arrow_large_types(self) -> bool:
        """Whether PySpark hands Arrow batches with large string/binary types."""
        large = self.spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")
        return large.lower() == "true"

    # ---- the acker -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The driver's client of the acker service (while the run holds one)."""
        if self.location is None:
            raise RuntimeError("the pipeline's service runs only during run()")
        return self.client_for(self.location)

    def client_for(self, location: str) -> Any:
        """A client of the acker at ``location`` with this run's token, job and TLS roots."""
        from ..service import AckerClient

        return AckerClient.get(
            location, token=self.token, job=self.job, tls_root_certs=self.tls_root_certs
        )

    def runner_args(self) -> dict[str, Any]:
        """What every executor-side runner needs to reach the acker."""
        return {
            "location": self.location,
            "token": self.token,
            "tls_root_certs": self.tls_root_certs,
            "job": self.job,
        }

    def replay_partitioner_spec(self, source: Source) -> str:
        """The replay partitioning of a source: ``hash:n`` with keys, ``forward`` without."""
        return f"hash:{source.partitions}" if source.keys else "forward"

    def start_service(self) -> str:
        """Start (or reach) the run's acker; returns its location. Each run is a job of its
        own on the acker: its sources, rounds, replays, dead letters and stats are kept apart
        from any other pipeline's on a shared ``xorack serve``."""
        cfg = self.config
        self.job = cfg.job or f"run-{os.urandom(8).hex()}"
        if cfg.service is not None:
            self._trust_given_cert()
            try:
                client = self.client_for(cfg.service)
                client.ping()
                if hasattr(client, "check_shards"):  # a sharded location: in shard order?
                    client.check_shards()
            except ServiceError as exc:
                raise ServiceError(
                    f"pipeline: the acker service at {cfg.service} cannot be reached ({exc}); "
                    "start it with `xorack serve` or use the embedded one (service=None)"
                ) from None
            self.location = cfg.service
            return self.location
        parts = {s.index: self.replay_partitioner_spec(s) for s in self.plan.sources}
        if cfg.ackers > 1:
            self.location = self._start_shards(parts)
            return self.location
        from ..ftlayer import FTLayer
        from ..service import AckerService

        self.ft_layer = FTLayer(
            storage=cfg.storage, max_attempts=cfg.max_attempts, replay_partitioners=parts
        )
        self._service = AckerService.embedded(
            self.ft_layer,
            token=cfg.token,
            job=self.job,
            host=cfg.acker_host,
            advertise=cfg.acker_advertise,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
        )
        self.tls_root_certs = self._service.tls_cert_pem
        self.location = self._service.location
        return self.location

    def _start_shards(self, parts: dict[int, str]) -> str:
        """The embedded sharded acker: ``ackers`` processes serving this run's job."""
        from ..shards import ShardedAcker

        cfg = self.config
        args = ["--max-attempts", str(cfg.max_attempts), "--rotate-interval", "0"]
        for i, spec in parts.items():
            args += ["--replay-partitioner", f"{i}={spec}"]
        self.shards = ShardedAcker(
            cfg.ackers,
            storage=cfg.storage,
            job=self.job,
            host=cfg.acker_host,
            advertise=cfg.acker_advertise,
            token=cfg.token,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            serve_args=args,
        )
        self._trust_given_cert()
        return str(self.shards.location)

    def _trust_given_cert(self) -> None:
        """The executors trust the certificate the pipeline was given (``tls_cert``)."""
        if self.config.tls_cert is not None:
            with open(self.config.tls_cert, "rb") as f:
                self.tls_root_certs = f.read()

    def stop_service(self) -> None:
        """Stop what :meth:`start_service` started (a standalone acker keeps running)."""
        try:
            if self.shards is not None:
                shards, self.shards = self.shards, None
                try:  # the driver's client: its fan-out threads end with the shards
                    self.client_for(shards.location).close()
                finally:
                    shards.close()
            if self._service is not None:
                self._service.shutdown()
                self._service = None
            if self.ft_layer is not None:
                self.ft_layer.close()
                self.ft_layer = None
        finally:
            self.location = None

    def fetch_dead_letters(self) -> pa.Table | None:
        """The job's dead-letter table (None when the acker cannot answer: the report is
        complete without it)."""
        try:
            table: pa.Table = self.client.dead_letters()
        except Exception:
            return None
        return table


__all__ = ["NodeRun", "PipelineConfig", "RunContext"]
