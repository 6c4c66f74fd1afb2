"""The FT layer: persists source records, tracks them with the XOR acker, and replays the ones
that fail or time out (the seed's FTLayer + TimeoutPersistenceLayer + RecordReplayer).

A record's life in the FT layer::

    persist ──► pending ──xor reaches 0──► completed (storage row deleted)
                  │
                  └─ fail / timeout ──► attempt < max_attempts ? replay (new src id, waiting
                                        for take_replays, then pending again)
                                                              : dead letter (last reason)

Every step works on whole arrays; the decision logic is :meth:`FTLayer._retry` (one screen).

>>> import pyarrow as pa
>>> from xorack import FTLayer
>>> with FTLayer("memory", default_partitions=4) as ft:
...     src = ft.persist(pa.record_batch({"x": [1, 2]}), births=[11, 12])
...     done = ft.xor(src, [11, 12])                 # both records were acked: complete
...     new = ft.fail(ft.persist(pa.record_batch({"x": [3]}), births=[13]), reason="boom")
...     [t.column("x").to_pylist() for t in ft.take_replays().values()], ft.pending
([[3]], 1)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ._checks import (
    as_u64,
    count_distinct,
    exact_ints,
    positive_int,
    same_length,
    sorted_distinct,
)
from .acker import AckTable, TimeoutWheel, new_ids
from .clock import Clock, MonotonicClock
from .event_times import PendingEventTimes
from .protocol import (
    ATTEMPT,
    BIRTHS,
    KEY_HASH,
    ORIGIN,
    ORIGIN_PARTITION,
    ORIGIN_REC,
    PARTITION,
    REPLAY_COLUMNS,
    SRC,
)
from .replay import (
    BroadcastReplayPartitioner,
    ForwardReplayPartitioner,
    HashReplayPartitioner,
    PreparedReplays,
    ReplayPartitioner,
    replay_partitioner_from_spec,
)
from .sharding import Shard, draw_ids
from .storage import PayloadSchemaConflict, RecordMeta, Storage, check_progress, open_storage

__all__ = ["DEFAULT_PARTITIONS", "FTLayer", "FTStats"]

log = logging.getLogger(__name__)

#: Partitions of the default replay partitioner (hash of the stored key hash): Spark's default
#: ``spark.sql.shuffle.partitions``, which a ``repartition(col)`` without a count uses.
DEFAULT_PARTITIONS = 200
NUM_BUCKETS = 3  # Storm's TIMEOUT_BUCKET_NUM
MAX_ATTEMPTS = 5
#: Restarts of the FT layer a record may be pending at before it is dead-lettered as the cause.
MAX_RESTARTS = 3
TIMEOUT = "timeout"
RECOVERED = "recovered: the FT layer stopped before the record completed"
FAILED = "failed"
COLLATERAL = "collateral: another record of its chunk did not complete"
ABANDONED = "collateral: its round was abandoned (another record failed the whole Spark job)"
CRASHED = "crashed the acker: it stopped {n} times while the record was in process (max_restarts)"
#: The widest chunk ``xor(..., chunk_bits=)`` takes (65,536 ids: a chunk's ids are enumerated).
MAX_CHUNK_BITS = 16

_U64 = np.uint64
_EMPTY = np.empty(0, dtype=np.uint64)
_RESERVED_PREFIX = "_ft_"
_CLOCK_POLL = 0.05  # real seconds between the rotation thread's looks at the clock
_LATENCY_KEEP = 100_000  # completion latencies kept for the percentiles
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SAMPLE_SHIFT = np.uint64(60)  # 1 record in 16 is timed (ids are mixed first: unbiased) ...
_TIME_ALL_BELOW = 1024  # ... of calls this big or more; every record of smaller calls
_PREPARE_CHUNK = 16_384  # records read from storage at a time by prepare_replays


def _timed(ids: np.ndarray) -> np.ndarray:
    """The ids of a big call whose completion latency is measured (a fixed 1/16 sample)."""
    with np.errstate(over="ignore"):
        return ids[((ids * _GOLDEN) >> _SAMPLE_SHIFT) == 0]


@dataclass
class FTStats:
    """Counters of an FT layer since it was opened (a snapshot; see :meth:`FTLayer.stats`).

    ``persisted`` source records; ``completed``; ``failed`` explicitly (known records only;
    ``unknown_failures`` counts fails of unknown/completed ids); ``timed_out`` (by rotate or
    expire_all); ``replayed`` (replays created, ``replayed_by_source`` per source index);
    ``dead_lettered``; ``orphans`` (entries of never-persisted ids that timed out);
    ``recovered`` (records found in storage when the layer opened: a restart of the acker,
    which replays them without using up an attempt; ``restarts`` is 1 then, each record's
    ``attempt`` stays as it was); ``quarantined`` (records the storage found corrupt and set
    aside instead of recovering them: see ``storage.quarantine_notes``); ``pending`` (records
    neither completed nor dead-lettered, including ``replays_waiting``, the replays not yet
    handed out by ``take_replays``; ``held``, the completions held until ``release``);
    ``collateral`` (held or chunked records replayed because another record of their chunk did
    not complete, or pending records of a round the run abandoned: no attempt used up);
    ``duplicates`` (second copies of a source record — same first id, persisted twice by a
    retried Spark task or a persist retried against a restarted shard — that waited for the
    same replay round as the first: completed there instead of replayed, and counted in
    ``completed`` too); ``repeats`` (rows of an ``idempotent``
    persist whose record this job persisted before: a retried Spark task's rows, kept once),
    of which ``repeats_settled`` had left the pending set under that id (completed,
    dead-lettered, or replayed under a new id: a map stage Spark recomputed, a speculative
    copy, a persist retried against a restarted shard) and count nowhere; ``known_keys``
    (source ids kept to recognize them, 8 bytes each: see :mod:`xorack.known_keys`);
    ``kept_at_restart`` (records found in storage at a restart that kept their ids, see
    :class:`FTLayer`); ``crashed`` (records dead-lettered for having been pending at
    ``max_restarts`` restarts of the layer: taken for the cause of the crashes);
    ``rotations``; completion latency percentiles
    in seconds of the layer's clock (None before any completion; every record persisted or
    replayed in a call of fewer than 1024 records is timed, of bigger calls a fixed 1 in 16,
    so big batches cost nothing); ``min_event_time``, the smallest event time (``persist(...,
    event_time=)``) of the pending records — in flight, held or waiting for a replay — that
    have one (None when none has: a streaming watermark need not wait for any).

    >>> FTStats().as_dict()["pending"]
    0
    """

    persisted: int = 0
    completed: int = 0
    failed: int = 0
    unknown_failures: int = 0
    timed_out: int = 0
    replayed: int = 0
    dead_lettered: int = 0
    orphans: int = 0
    recovered: int = 0
    restarts: int = 0
    quarantined: int = 0
    pending: int = 0
    replays_waiting: int = 0
    held: int = 0
    collateral: int = 0
    duplicates: int = 0
    repeats: int = 0
    repeats_settled: int = 0
    known_keys: int = 0
    kept_at_restart: int = 0
    crashed: int = 0
    rotations: int = 0
    latency_p50: float | None = None
    latency_p90: float | None = None
    latency_p99: float | None = None
    min_event_time: int | None = None
    replayed_by_source: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The stats as a plain dict (JSON-friendly)."""
        return asdict(self)


@dataclass
class _Waiting:
    """Replay rows of one source not handed out yet (row-aligned)."""

    src: np.ndarray  # new source id (repeated for a broadcast)
    rec: np.ndarray  # the row's record id (its birth, XORed into src's registered value)
    partition: np.ndarray  # target partition


_W = ("src", "rec", "partition")


# --------------------------------------------------------------------------------------------
# argument checks


def _chunk_bits(bits: Any) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"chunk_bits must be an int, got {type(bits).__name__}")
    if not 0 <= int(bits) <= MAX_CHUNK_BITS:
        raise ValueError(f"chunk_bits must be in [0, {MAX_CHUNK_BITS}], got {int(bits)}")
    return int(bits)


def _ids(x: Any, name: str, *, nonzero: bool = True) -> np.ndarray:
    """uint64 array (lists of ids >= 2**63 too: ``to_pylist()`` output is accepted)."""
    return as_u64(exact_ints(x, name), name, nonzero=nonzero)


def _as_batch(batch: Any) -> pa.RecordBatch | pa.Table:
    """A RecordBatch, or a Table of several chunks (persisted chunk by chunk: never copied
    into one)."""
    if isinstance(batch, pa.Table):
        batches = batch.to_batches()
        if len(batches) == 1:
            batch = batches[0]
        elif not batches:
            batch = pa.RecordBatch.from_pylist([], batch.schema)
    elif not isinstance(batch, pa.RecordBatch):
        raise TypeError(f"batch must be a pyarrow RecordBatch or Table, got {type(batch).__name__}")
    cols = batch.schema.names
    if not cols:
        raise ValueError(
            f"batch has no columns ({batch.num_rows} rows): a record is replayed from its "
            "persisted payload, so persist at least one payload column"
        )
    reserved = [c for c in cols if c.startswith(_RESERVED_PREFIX)]
    if reserved:
        raise ValueError(
            f"batch has reserved column(s) {reserved}: persist the payload columns only "
            f"(names starting with {_RESERVED_PREFIX!r} belong to the FT layer)"
        )
    return batch


def _rechunk(queue: list[_Waiting], size: int) -> list[_Waiting]:
    """The rows of ``queue`` regrouped in pieces of at most ``size`` rows (in order; the
    queue is consumed as it goes, so the rows are held about once)."""
    out: list[_Waiting] = []
    group: list[_Waiting] = []
    rows = 0

    def flush() -> None:
        nonlocal group, rows
        if group:
            only = group[0] if len(group) == 1 else None
            out.append(
                only or _Waiting(*(np.concatenate([getattr(g, f) for g in group]) for f in _W))
            )
        group, rows = [], 0

    queue.reverse()
    while queue:
        q = queue.pop()
        for start in range(0, len(q.src), size):
            piece = (
                q
                if len(q.src) <= size
                else _Waiting(*(getattr(q, f)[start : start + size] for f in _W))
            )
            if rows + len(piece.src) > size:
                flush()
            group.append(piece)
            rows += len(piece.src)
    flush()
    return out


def _first_copies(first: np.ndarray, seen: list[np.ndarray]) -> np.ndarray:
    """The rows whose first-attempt id (``first``, 0 = unknown) is given out here: the first
    row per id, unless a sorted piece of ``seen`` (ids given out before in the same round) has
    it. Ids are unique within a round."""
    out = np.zeros(len(first), dtype=bool)
    out[np.unique(first, return_index=True)[1]] = True
    for given in seen:  # sorted pieces: no big array rebuilt per chunk
        at = np.minimum(np.searchsorted(given, first), len(given) - 1)
        out &= given[at] != first
    return out & (first != 0)


def _replay_table(
    payload: pa.Table, src: np.ndarray, rec: np.ndarray, meta: RecordMeta, parts: np.ndarray
) -> pa.Table:
    """The payload rows of replays (row-aligned with ``meta``) plus ``REPLAY_COLUMNS``."""
    table = payload
    for name, values in (
        (SRC, src),
        (BIRTHS, rec),
        (KEY_HASH, meta.key_hash),
        (ATTEMPT, meta.attempt),
        (ORIGIN, meta.origin),
        (ORIGIN_REC, meta.origin_rec),
        (ORIGIN_PARTITION, meta.partition),
        (PARTITION, parts),
    ):
        table = table.append_column(name, pa.array(values, REPLAY_COLUMNS[name]))
    return table


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _as_i32(x: Any, name: str, n: int, default: int, lo: int = -(2**31)) -> np.ndarray:
    if x is None:
        return np.full(n, default, np.int32)
    if isinstance(x, (pa.Array, pa.ChunkedArray)):
        if x.null_count:
            raise ValueError(f"{name} must not contain nulls")
        x = x.to_numpy(zero_copy_only=False)
    arr = np.asarray(x)
    if arr.ndim == 0:
        if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
            raise TypeError(f"{name} must be an int or an int32 array, got {type(x).__name__}")
        arr = np.full(n, int(arr), np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} values but the batch has {n} rows")
    if n == 0:
        return np.empty(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be int32, got {arr.dtype}")
    if arr.dtype != np.int32:
        lo_v, hi_v = int(arr.min()), int(arr.max())
        if lo_v < lo or hi_v > 2**31 - 1:
            raise ValueError(
                f"{name} must fit int32 and be >= {lo}, got {lo_v if lo_v < lo else hi_v}"
            )
        arr = arr.astype(np.int32)
    elif lo > -(2**31) and int(arr.min()) < lo:
        raise ValueError(f"{name} must be >= {lo}, got {int(arr.min())}")
    return np.ascontiguousarray(arr)


def _as_event_time(x: Any, n: int) -> np.ndarray:
    """``event_time`` of a persist as a fresh int64 array of ``n`` rows (an int: every row)."""
    if isinstance(x, (pa.Array, pa.ChunkedArray)):
        if x.null_count:
            raise ValueError(
                "event_time must not contain nulls: give NO_EVENT_TIME (xorack.protocol) for a "
                "row without one"
            )
        x = x.to_numpy(zero_copy_only=False)
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":  # bool, float, datetime64, object, ...
        what = type(x).__name__ if arr.ndim == 0 else str(arr.dtype)
        hint = (
            " (for datetime64 values: .astype('datetime64[us]').view('int64'))"
            if arr.dtype.kind == "M"
            else ""
        )
        raise TypeError(
            f"event_time must be int64 (an integer per row, e.g. microseconds since the "
            f"epoch), got {what}{hint}"
        )
    if arr.ndim == 0:
        arr = np.full(n, arr, arr.dtype)
    if arr.ndim != 1:
        raise ValueError(f"event_time must be 1-D, got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"event_time has {len(arr)} values but the batch has {n} rows")
    if arr.dtype == np.uint64 and n and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"event_time must fit int64, got {int(arr.max())}")
    return arr.astype(np.int64)  # a copy: the caller's array stays the caller's


def _epoch_arg(epoch: Any, name: str) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"{name} must be an int >= 0, got {epoch!r}")
    return int(epoch)


def _source_arg(source: Any) -> int:
    if isinstance(source, bool) or not isinstance(source, (int, np.integer)):
        raise TypeError(f"source must be an int (the source index), got {type(source).__name__}")
    if not 0 <= int(source) < 2**31:
        raise ValueError(f"source must be in [0, 2**31), got {source}")
    return int(source)


@dataclass(frozen=True)
class PersistArgs:
    """The arguments of ``persist``, checked once: ``FTLayer.persist`` and the service client
    (``AckerClient.persist``) both take them through :func:`check_persist_args`, so a call is
    accepted or refused the same way in and out of process. ``None`` = not given."""

    batch: pa.RecordBatch | pa.Table  # a Table of several chunks is kept as it is
    source: int
    key_hash: np.ndarray | None  # int32 per row
    partition: np.ndarray | None  # int32 per row, >= -1
    births: np.ndarray | None  # uint64 per row
    src_ids: np.ndarray | None  # uint64 per row, distinct, nonzero
    event_time: np.ndarray | None = None  # int64 per row (NO_EVENT_TIME: none)


def check_persist_args(
    batch: Any,
    key_hash: Any = None,
    source: Any = 0,
    partition: Any = None,
    births: Any = None,
    src_ids: Any = None,
    event_time: Any = None,
) -> PersistArgs:
    """Validate and normalize ``persist``'s arguments (clear TypeError/ValueError otherwise).

    >>> a = check_persist_args(pa.record_batch({"v": [1, 2]}), key_hash=[7, 8], partition=3)
    >>> a.key_hash.tolist(), a.partition.tolist(), a.births, a.event_time
    ([7, 8], [3, 3], None, None)
    """
    batch = _as_batch(batch)
    n = batch.num_rows
    source = _source_arg(source)
    kh = None if key_hash is None else _as_i32(key_hash, "key_hash", n, 0)
    part = None if partition is None else _as_i32(partition, "partition", n, -1, lo=-1)
    if births is not None:
        births = _ids(births, "births", nonzero=False)
        same_length(batch=np.empty(n), births=births)
    if src_ids is not None:
        src_ids = _ids(src_ids, "src_ids")
        same_length(batch=np.empty(n), src_ids=src_ids)
        if count_distinct(src_ids) != n:
            raise ValueError("src_ids must be distinct")
    times = None if event_time is None else _as_event_time(event_time, n)
    return PersistArgs(batch, source, kh, part, births, src_ids, times)


def _partitioner_arg(p: Any, where: str) -> ReplayPartitioner:
    if isinstance(p, str):
        return replay_partitioner_from_spec(p)
    if not isinstance(p, ReplayPartitioner):
        raise TypeError(
            f"{where} must be a ReplayPartitioner or a spec string, got {type(p).__name__}"
        )
    return p


# --------------------------------------------------------------------------------------------


class FTLayer:
    """Record-level fault tolerance: persist, XOR-ack, fail, time out, replay, dead-letter.

    ``storage``: ``"memory"``, ``"sqlite:///path/ft.db"`` or a :class:`~xorack.Storage`; on a
    storage that holds records (a durable one, reopened after a crash) every stored record is
    replayed at once. ``num_buckets``: rotations until a record times out (Storm's 3).
    ``max_attempts``: a record's runs (its first included) before it is dead-lettered.
    ``max_restarts``: crashes of the layer (on a durable storage) a record may be in
    process at — handed out as a replay since the layer started, not completed; at the last
    one it is taken for their cause and dead-lettered (a record whose processing kills the
    acker would otherwise be replayed, and kill it, forever). A record that only waits, or
    clean restarts, count nothing.
    ``replay_partitioners``: ``{source index: ReplayPartitioner | spec}``; other sources use
    ``HashReplayPartitioner(default_partitions)`` (200 = Spark's default shuffle partitions).
    ``clock`` (latencies) defaults to monotonic time; ``backend`` picks the kernels.
    ``shard``: this layer is one shard of a sharded acker (``Shard(k, n)`` or ``(k, n)``,
    see :mod:`xorack.sharding`): it draws the ids of its replays (and of persists without
    ``src_ids``) among the ids it owns, and refuses a persist of ids it does not own.
    Thread-safe: one lock around each call, the work inside being whole-array kernel calls.

    >>> import pyarrow as pa
    >>> from xorack import FTLayer, ManualClock
    >>> ft = FTLayer(clock=ManualClock(), num_buckets=2, max_attempts=1)
    >>> src = ft.persist(pa.record_batch({"x": [7]}), births=[5])
    >>> ft.rotate().tolist(), ft.rotate().tolist()   # timed out at the 2nd rotation, no retry left
    ([], [])
    >>> ft.dead_letters().to_pydict()["_ft_reason"], ft.pending
    (['timeout'], 0)
    """

    def __init__(
        self,
        storage: str | Storage = "memory",
        num_buckets: int = NUM_BUCKETS,
        max_attempts: int = MAX_ATTEMPTS,
        replay_partitioners: Mapping[int, ReplayPartitioner | str] | None = None,
        default_partitions: int = DEFAULT_PARTITIONS,
        clock: Clock | None = None,
        backend: str | None = None,
        shard: Shard | tuple[int, int] | None = None,
        max_restarts: int = MAX_RESTARTS,
    ) -> None:
        self.shard = shard if shard is None or isinstance(shard, Shard) else Shard(*shard)
        self.num_buckets = positive_int(num_buckets, "num_buckets")
        self.max_attempts = positive_int(max_attempts, "max_attempts")
        self.max_restarts = positive_int(max_restarts, "max_restarts")
        self.default_partitions = positive_int(default_partitions, "default_partitions")
        if replay_partitioners is not None and not isinstance(replay_partitioners, Mapping):
            raise TypeError(
                "replay_partitioners must be a dict {source index: partitioner}, got "
                f"{type(replay_partitioners).__name__}"
            )
        self._partitioners: dict[int, ReplayPartitioner] = {
            _source_arg(s): _partitioner_arg(p, f"replay_partitioners[{s}]")
            for s, p in (replay_partitioners or {}).items()
        }
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise TypeError(f"clock must have a now() method, got {type(clock).__name__}")
        self.clock: Clock = clock or MonotonicClock()
        self.backend = backend
        self._table = AckTable(backend=backend)
        self._wheel = TimeoutWheel(self.num_buckets, backend=backend)
        self._lock = threading.RLock()
        self._stats = FTStats()
        self._registered = 0  # records pending (= registered entries of the table)
        self._waiting: dict[int, list[_Waiting]] = {}
        self._prepared: dict[int, PreparedReplays] = {}  # prepare_replays: the round's rows
        self._orphan_watch = _EMPTY  # sorted ids of unregistered entries put on the wheel
        self._undeleted: list[np.ndarray] = []  # completed, storage delete failed: retried
        self._ended: list[np.ndarray] = []  # attempts that ended without completing (take_ended)
        self._held: list[np.ndarray] = []  # completions held until release()
        self._event_times = PendingEventTimes()  # of the pending records that have one
        self._failed_while_held = False  # a fail or timeout came while completions were held
        self._kept = _EMPTY  # sorted ids of records a restart kept under their first id
        self._born: dict[int, float] = {}  # timed 1/16 sample of big calls: src id -> start
        self._born_small: dict[int, float] = {}  # every record of small calls: src id -> start
        self._latencies: deque[float] = deque(maxlen=_LATENCY_KEEP)
        self._thread: threading.Thread | None = None
        self._stop_event: threading.Event | None = None
        self._next_rotation = 0.0  # clock time of the rotation thread's next rotation
        self.rotation_error: BaseException | None = None
        self._closed = False
        self._storage = open_storage(storage)
        try:
            self._recover()
        except BaseException:
            if not isinstance(storage, Storage):  # opened here from a spec: ours to close
                self._storage.close()
            raise

    # ---------------------------------------------------------------- public API

    @property
    def storage(self) -> Storage:
        """The storage the records are persisted in."""
        return self._storage

    @property
    def pending(self) -> int:
        """Records neither completed nor dead-lettered (replays waiting included)."""
        return self._registered

    def replay_partitioner(self, source: int = 0) -> ReplayPartitioner:
        """The partitioner that routes the replays of ``source``."""
        source = _source_arg(source)
        with self._lock:
            p = self._partitioners.get(source)
            if p is None:
                p = self._partitioners[source] = HashReplayPartitioner(self.default_partitions)
            return p

    def persist(
        self,
        batch: pa.RecordBatch | pa.Table,
        key_hash: Any = None,
        source: int = 0,
        partition: Any = None,
        births: Any = None,
        src_ids: Any = None,
        progress: tuple[int, int] | None = None,
        idempotent: bool = False,
        event_time: Any = None,
        epoch: int = 0,
    ) -> np.ndarray:
        """Persist a batch of source records; returns their new source ids (uint64, row order).

        ``key_hash``: int32 per row (None → 0), what hash replay partitioning routes by;
        ``partition``: the partition each row first goes to (int or int32 per row; -1/None
        unknown); ``births``: uint64 per row, the records' own ids (``_ft_rec``) registered as
        their birth values (None → 0: the births come as events), and kept with the records as
        their first attempt's ids (``origin_rec``: see ``first_ids`` of :meth:`take_replays`).
        Both the partition and the first ids travel with every replay of a record, as the
        columns ``_ft_origin_partition`` and ``_ft_origin_rec``. ``src_ids``: the source ids,
        when the caller drew them itself (fresh, distinct, nonzero); default: drawn here.
        ``progress``: ``(partition, end)``, the batch is rows ``[end - n, end)`` of that
        partition of ``source`` as it is read: noted with the batch, atomically, so a resumed
        job skips the rows persisted before (see :meth:`job_state`). ``idempotent`` (with
        ``src_ids`` derived from the records themselves, as a deterministic source tagger
        does): a row whose source id is already pending is the same record persisted again by
        a retried Spark task, and is left as it is (counted in ``stats().repeats``) instead of
        refused; the retried task's rows then ack the one record. Every id persisted so is
        *known* to the job (under ``epoch``, a streaming micro-batch; 0 in a batch run): a row
        whose id is known but no longer pending under it — its record completed, was
        dead-lettered or is replayed under a new id, and Spark ran its source task again (a
        map stage recomputed, a speculative copy) — is not persisted and gets the id 0: the
        caller drops it (``stats().repeats_settled``). :meth:`forget_known` drops the epochs
        Spark will not run again.
        ``event_time``: int64 per row (or one int for all), the records' event times (an
        ordering key, e.g. microseconds since the epoch; ``NO_EVENT_TIME`` for a row without
        one); kept with each record through its replays and a restart, the smallest pending
        one is ``stats().min_event_time``. None: no event times (nothing is kept).
        Persisted, registered and timed atomically w.r.t. other calls; on a storage error
        nothing of the batch is kept.

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> len(ft.persist(pa.record_batch({"v": [1, 2, 3]}), key_hash=[4, 5, 6])), ft.pending
        (3, 3)
        """
        self._check_open()
        args = check_persist_args(batch, key_hash, source, partition, births, src_ids, event_time)
        batch, source, src_ids, times = args.batch, args.source, args.src_ids, args.event_time
        n = batch.num_rows
        noted = check_progress(progress, n)
        key_hash = np.zeros(n, np.int32) if args.key_hash is None else args.key_hash
        partition = np.full(n, -1, np.int32) if args.partition is None else args.partition
        births = np.zeros(n, _U64) if args.births is None else args.births
        self._check_routable(source, partition)
        if idempotent and src_ids is None:
            raise ValueError("idempotent: give the src_ids (derived from the records)")
        epoch = _epoch_arg(epoch, "epoch")
        if n == 0:
            return _EMPTY.copy()
        n_in = n
        out = src_ids
        with self._lock:
            if src_ids is None:
                src = self._new_src(n)
            else:
                self._check_owned(src_ids)
                taken = self._storage.lookup(src_ids).src
                settled = self._settled(src_ids, taken, epoch) if idempotent else None
                if settled is not None:  # counts nowhere: the caller drops it
                    out = np.where(settled, _U64(0), src_ids)
                    self._stats.repeats_settled += int(settled.sum())
                if idempotent and (len(taken) or settled is not None):
                    # a retried task's copy of a pending record: keep the one record
                    new = ~np.isin(src_ids, taken)
                    if settled is not None:
                        new &= ~settled
                    if not new.any():  # (its progress was noted with the first persist)
                        self._stats.repeats += n
                        return out
                    batch, n = batch.filter(pa.array(new)), int(new.sum())
                    key_hash, partition, births = key_hash[new], partition[new], births[new]
                    times = None if times is None else times[new]
                    src = src_ids[new]
                elif len(taken):
                    raise ValueError(
                        f"src_ids: {len(taken)} id(s) are already pending (e.g. {int(taken[0])}): "
                        "draw fresh ids for new records"
                    )
                else:
                    src = src_ids
            note = None if noted is None else (source, *noted)
            meta = RecordMeta.new(
                src, key_hash, source, partition, origin_rec=births, event_time=times
            )
            self._store(batch, meta, note, known_epoch=epoch if idempotent else None)
            if times is not None:
                self._event_times.add(src, times)
            self._registered += n
            self._stats.persisted += n
            self._unwatch(src)
            self._wheel.add(src)
            self._start_timer(src)
            done = self._table.register(src, births)
            if len(done):
                self._complete(done)
            if src_ids is not None:
                self._stats.repeats += n_in - n
        return src if out is None else out

    def _settled(self, src_ids: np.ndarray, pending: np.ndarray, epoch: int) -> np.ndarray | None:
        """Which of ``src_ids`` this job persisted before in ``epoch`` (a re-run Spark task
        re-creates its epoch with its ids) and are no longer pending under that id (None: none
        is)."""
        known = self._storage.known_keys
        if not len(known):
            return None
        settled = known.contains(src_ids, epoch)
        if settled.any() and len(pending):
            settled &= ~np.isin(src_ids, pending)
        return settled if settled.any() else None

    def forget_known(self, through_epoch: int) -> int:
        """Forget the ids persisted idempotently in the epochs ``<= through_epoch`` (a
        stream's micro-batches that Spark's checkpoint committed: Spark runs none of their
        tasks again); returns how many.

        >>> ft = FTLayer()
        >>> _ = ft.persist(pa.record_batch({"v": [1]}), src_ids=[6], idempotent=True, epoch=2)
        >>> ft.forget_known(1), ft.forget_known(2)
        (0, 1)
        """
        self._check_open()
        through = _epoch_arg(through_epoch, "through_epoch")
        with self._lock:
            return self._storage.forget_known(through)

    def xor(self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0) -> np.ndarray:
        """Apply XOR events ``(src_ids[i], values[i])``; returns the source ids completed by them
        (their records are deleted from storage). Events of unknown ids wait (early events) or
        end up as orphans.

        ``hold``: a record these events complete is *held* instead (kept in storage, off the
        timeout wheel, counted pending) until :meth:`release` completes it or replays it.
        ``chunk_bits`` (implies ``hold``): each event is the XOR of every remaining event of a
        whole *chunk*, the source ids ``(c << chunk_bits) | j``, ``j < 2**chunk_bits``, given
        as ``c``. When it cancels the chunk's pending checksums, all of them are held; when it
        does not (a lost row, a failed record), the chunk's pending records are replayed as
        collateral (no attempt used up: a record that keeps failing is found when it comes
        back on its own). A chunk's event must come in one call.

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> src = ft.persist(pa.record_batch({"v": [1]}), births=[9])
        >>> ft.xor(src, [3]).tolist(), ft.xor(src, [3 ^ 9]).tolist() == src.tolist()
        ([], True)
        """
        self._check_open()
        src_ids = _ids(src_ids, "src_ids")
        values = _ids(values, "values", nonzero=False)
        same_length(src_ids=src_ids, values=values)
        bits = _chunk_bits(chunk_bits)
        with self._lock:
            self._retry_deletes()
            if bits:
                return self._xor_chunks(src_ids, values, bits)
            done = self._table.xor(src_ids, values)
            if len(done):
                if hold:
                    self._hold(done)
                else:
                    self._complete(done)
        return done

    def release(self, chunks: Any = None, chunk_bits: int = 0) -> np.ndarray:
        """End the held completions: those whose chunk (``src >> chunk_bits``) is in ``chunks``
        are replayed as collateral (no attempt used up), the others complete. Returns the
        source ids of the collateral replays' ended attempts (also handed out by
        :meth:`take_ended`).

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> src = ft.persist(pa.record_batch({"v": [1, 2]}), births=[9, 5], src_ids=[8, 12])
        >>> ft.xor(src, [9, 5], hold=True).tolist(), ft.pending
        ([8, 12], 2)
        >>> ft.release([12 >> 2], chunk_bits=2).tolist(), ft.stats().completed, ft.pending
        ([12], 1, 1)
        """
        self._check_open()
        bits = _chunk_bits(chunk_bits)
        tainted = sorted_distinct(_ids(chunks if chunks is not None else [], "chunks"))
        with self._lock:
            self._retry_deletes()
            held, self._held = (np.concatenate(self._held) if self._held else _EMPTY), []
            if not len(held):
                return _EMPTY.copy()
            if self._failed_while_held:  # a record failed since it was held has left
                held = self._storage.lookup(held).src
            self._failed_while_held = False
            victim = np.isin(held >> np.uint64(bits), tainted) if len(tainted) else None
            if victim is None or not victim.any():
                self._complete(held)
                return _EMPTY.copy()
            self._complete(held[~victim])
            return self._collateral(held[victim])

    def _hold(self, done: np.ndarray) -> None:
        self._wheel.discard(done)
        self._held.append(done)

    def _collateral(self, ids: np.ndarray) -> np.ndarray:
        meta = self._storage.lookup(ids)
        self._retry(meta, COLLATERAL, attempt=False)
        self._stats.collateral += len(meta)
        return np.asarray(meta.src, dtype=_U64)

    def _xor_chunks(self, chunks: np.ndarray, values: np.ndarray, bits: int) -> np.ndarray:
        """Chunk events (see :meth:`xor`): returns the ids held."""
        if not len(chunks):
            return _EMPTY.copy()
        if count_distinct(chunks) != len(chunks):
            raise ValueError("chunk events: each chunk's event must come once (reduce them first)")
        if int(chunks.max()) >> (64 - bits):
            raise ValueError(f"chunk ids must be below 2**{64 - bits} with chunk_bits={bits}")
        width = 1 << bits
        ids = (chunks[:, None] << np.uint64(bits)) | np.arange(width, dtype=_U64)[None, :]
        ids = ids.ravel()  # chunk ids are nonzero, so no id is 0
        current = self._table.gather(ids)
        rest = np.bitwise_xor.reduce(current.reshape(-1, width), axis=1) ^ values
        pending = (current != 0).reshape(-1, width)
        ok = (rest == 0)[:, None] & pending
        bad = (rest != 0)[:, None] & pending
        held = ids.reshape(-1, width)[ok]
        if len(held):
            self._table.fail(held)
            self._hold(held)
        if bad.any():
            loose = ids.reshape(-1, width)[bad]
            known = self._storage.lookup(loose).src
            self._table.fail(known)  # their replays start afresh
            self._collateral(known)
        return held

    def fail(self, src_ids: Any, reason: str | None = None) -> np.ndarray:
        """Fail records explicitly; returns the new source ids of the replays created
        (dead-lettered records have none). Unknown or completed ids are a counted no-op.

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> src = ft.persist(pa.record_batch({"v": [1]}), births=[9])
        >>> new = ft.fail(src, reason="bad row"); len(new), ft.fail([12345]).tolist()
        (1, [])
        """
        self._check_open()
        ids = _ids(src_ids, "src_ids")
        reason = FAILED if reason is None else str(reason)
        with self._lock:
            self._retry_deletes()  # a completed record whose delete failed is not failed again
            ids = ids[np.sort(np.unique(ids, return_index=True)[1])]
            meta = self._storage.lookup(ids)
            new = self._retry(meta, reason)  # counted once it is done (a retry may follow)
            self._stats.unknown_failures += len(ids) - len(meta)
            self._stats.failed += len(meta)
            return new

    def touch(self, src_ids: Any) -> None:
        """Restart the timeout of these pending records (Storm's resetTimeout)."""
        self._check_open()
        ids = _ids(src_ids, "src_ids")
        with self._lock:
            self._wheel.touch(ids)

    def rotate(self) -> np.ndarray:
        """One timeout rotation: records not completed (nor touched) during the last
        ``num_buckets`` rotations time out and are replayed; returns the replays' new ids."""
        self._check_open()
        with self._lock:
            self._retry_deletes()
            self._watch_orphans()
            self._stats.rotations += 1
            return self._expire(self._wheel.rotate())

    def expire_all(self, collateral: bool = False) -> np.ndarray:
        """Time out every pending record now (end of a batch round: nothing in flight can still
        complete); replays waiting to be handed out are left alone. Returns the new ids.

        ``collateral``: the round was abandoned by the run, not by its records (one row failed
        the whole Spark job): each record is replayed with no attempt used up and counted in
        ``collateral``, not ``timed_out`` (its checksum starts afresh, whatever events of the
        abandoned round reached it).

        >>> import pyarrow as pa
        >>> ft = FTLayer(max_attempts=1)
        >>> _ = ft.persist(pa.record_batch({"v": [1]}), births=[9])
        >>> len(ft.expire_all(collateral=True)), ft.stats().dead_lettered, ft.stats().collateral
        (1, 0, 1)
        """
        self._check_open()
        with self._lock:
            self._retry_deletes()
            self._watch_orphans()
            expired = [self._wheel.rotate() for _ in range(self.num_buckets)]
            return self._expire(np.concatenate(expired), collateral=collateral)

    def take_replays(
        self, source: int = 0, partition: int | None = None, first_ids: bool = False
    ) -> dict[int, pa.Table]:
        """Hand out the replays of ``source`` waiting so far (each once): ``{partition: table}``
        with the payload columns plus the replay columns (``REPLAY_COLUMNS``: ``_ft_src``,
        ``_ft_rec``, ``_ft_key_hash``, ``_ft_attempt``, ``_ft_origin``, ``_ft_origin_rec``,
        ``_ft_origin_partition``, ``_ft_partition``). With ``partition``, only that
        partition's. With ``first_ids``, a replay is born again with its first attempt's record
        id (the ``births`` it was persisted with; the first copy per id in this call: later
        copies of one record, persisted twice by a retried source task, keep fresh ids, since
        ids must be unique within a round), so that what it derives re-creates the ids of the
        first attempt; its checksum moves with it, here, atomically with the hand-out. A
        replay's timeout starts when it is handed out. When the waiting replays
        were persisted in batches whose payload schemas do not unify, the replays of the first
        schema are handed out and the others stay waiting for the next call (so a loop
        ``while ft.take_replays(s): ...`` gets them all); on any error nothing is handed out.

        >>> import pyarrow as pa
        >>> ft = FTLayer(replay_partitioners={0: "single"})
        >>> _ = ft.fail(ft.persist(pa.record_batch({"v": [1]})))
        >>> {p: t.num_rows for p, t in ft.take_replays().items()}, ft.take_replays()
        ({0: 1}, {})
        """
        self._check_open()
        source = _source_arg(source)
        first_ids = _flag(first_ids, "first_ids")
        with self._lock:
            self._retry_deletes()
            queue = self._waiting.get(source)
            if not queue:
                return {}
            w = _Waiting(
                *(
                    np.concatenate([getattr(q, f) for q in queue])
                    for f in ("src", "rec", "partition")
                )
            )
            rest = _Waiting(_EMPTY, _EMPTY, np.empty(0, np.int32))
            if partition is not None:
                mine = w.partition == int(partition)
                rest = _Waiting(w.src[~mine], w.rec[~mine], w.partition[~mine])
                w = _Waiting(w.src[mine], w.rec[mine], w.partition[mine])
            if not len(w.src):
                return {}
            try:  # until the replays are handed out, the queue stays as it was
                payload, meta = self._storage.fetch(w.src)  # rows in w.src order
            except PayloadSchemaConflict as conflict:  # hand out one schema's replays now
                first = np.isin(w.src, conflict.src)
                rest = _Waiting(
                    *(np.concatenate([getattr(rest, f), getattr(w, f)[~first]]) for f in _W)
                )
                w = _Waiting(*(getattr(w, f)[first] for f in _W))
                payload, meta = self._storage.fetch(w.src)
            if len(meta) != len(w.src):  # some replays were failed again since: superseded
                live = np.isin(w.src, meta.src)
                w = _Waiting(w.src[live], w.rec[live], w.partition[live])
            pos = np.arange(len(w.src))
            order = np.argsort(w.partition, kind="stable")
            pos, w = pos[order], _Waiting(w.src[order], w.rec[order], w.partition[order])
            meta = meta.take(pos)
            rec, fix = w.rec, np.zeros(len(pos), dtype=bool)
            if first_ids:
                first = _first_copies(meta.origin_rec, [])
                fix = first & (w.rec != meta.origin_rec)
                rec = np.where(fix, meta.origin_rec, w.rec)
            table = _replay_table(payload.take(pa.array(pos)), w.src, rec, meta, w.partition)
            self._storage.note_in_flight(meta.origin)  # a crash from here on may be theirs
            # handed out: from here on nothing can fail
            self._move_births(w.src[fix], w.rec[fix], rec[fix])
            if len(rest.src):
                self._waiting[source] = [rest]
            else:
                del self._waiting[source]
            if not len(w.src):
                return {}
            self._wheel.add(w.src)  # the replays' timeouts start now
        parts, starts = np.unique(w.partition, return_index=True)
        stops = np.r_[starts[1:], len(w.partition)]
        return {
            int(p): table.slice(int(a), int(b - a))
            for p, a, b in zip(parts, starts, stops, strict=True)
        }

    def prepare_replays(
        self,
        source: int = 0,
        partitioner: ReplayPartitioner | str | None = None,
        tag: str = "",
        first_ids: bool = False,
    ) -> dict[int, int]:
        """Take the replays of ``source`` waiting so far and prepare them for a round under
        ``tag``; returns the rows per partition (``{partition: rows}``, partitions without rows
        left out). The rows themselves stay here until the round is over: executors fetch them
        partition by partition with :meth:`fetch_replays` (as often as a retried task needs),
        and they are freed by the next prepare of ``source``, :meth:`release_replays` or
        :meth:`close`. A second call with the same ``tag`` returns the same counts (a retried
        request prepares nothing new).

        ``partitioner`` (spec or object; broadcast is refused) routes each replay from what its
        record carries: ``"hash:N"`` by its stored key hash (Spark's ``repartition(N, *keys)``),
        ``"forward:N"`` to the partition it was first read on; None keeps the partitions of the
        source's own replay partitioner. ``first_ids``: a replay is born again with its first
        attempt's record id (the ``births`` it was persisted with), so that what it derives
        re-creates the ids of the first attempt — done here, atomically with the take; a second
        copy of one record in the round completes as a duplicate instead (see
        :meth:`_prepare_rows`). The replays' timeouts start now. Fetched rows carry the payload
        columns plus the replay columns of :meth:`take_replays` (``_ft_partition``: the target
        partition). On an error nothing is taken.

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> _ = ft.fail(ft.persist(pa.record_batch({"v": [1, 2]}), key_hash=[0, 1]))
        >>> ft.prepare_replays(0, "hash:2", tag="r1")
        {0: 1, 1: 1}
        >>> ft.fetch_replays(0, "r1", 1).column("v").to_pylist()
        [2]
        >>> ft.release_replays(0)
        """
        self._check_open()
        source = _source_arg(source)
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, got {type(tag).__name__}")
        first_ids = _flag(first_ids, "first_ids")
        router = None if partitioner is None else _partitioner_arg(partitioner, "partitioner")
        if isinstance(router, BroadcastReplayPartitioner):
            raise ValueError(
                "prepare_replays: broadcast routing copies rows; use take_replays for it"
            )
        with self._lock:
            self._retry_deletes()
            old = self._prepared.get(source)
            if old is not None and old.tag == tag:
                return old.counts()
            if old is not None:  # the previous round is over
                self._prepared.pop(source).close()
            chunks = _rechunk(self._waiting.pop(source, []), _PREPARE_CHUNK)
            prepared = PreparedReplays(tag)
            seen: list[np.ndarray] = []  # sorted first ids given out by this prepare
            taken = []
            try:
                for w in chunks:
                    taken.append(self._prepare(prepared, w, router, first_ids, seen))
            except BaseException:
                prepared.close()
                if chunks:  # the ids fixed so far stay fixed: the table has them
                    self._waiting[source] = chunks
                raise
            self._prepared[source] = prepared
            for ids in taken:
                self._wheel.add(ids)  # the replays' timeouts start now
            return prepared.counts()

    def _prepare(
        self,
        prepared: PreparedReplays,
        w: _Waiting,
        router: ReplayPartitioner | None,
        first_ids: bool,
        seen: list[np.ndarray],
    ) -> np.ndarray:
        """Route one chunk of replays, fix their first ids and write them to ``prepared``
        (memory follows the chunk, not the round); returns the source ids taken (replays
        failed again since are superseded: left out)."""
        taken = []
        todo = np.arange(len(w.src))
        while len(todo):
            try:
                payload, meta = self._storage.fetch(w.src[todo])  # rows in todo order
                now, todo = todo, todo[:0]
            except PayloadSchemaConflict as conflict:  # one payload schema at a time
                first = np.isin(w.src[todo], conflict.src)
                if not first.any():
                    raise
                now, todo = todo[first], todo[~first]
                payload, meta = self._storage.fetch(w.src[now])
            rows = now[np.isin(w.src[now], meta.src)]
            if len(rows):
                kept = self._prepare_rows(prepared, w, rows, payload, meta, router, first_ids, seen)
                taken.append(w.src[rows[kept]])
        return np.concatenate(taken) if taken else _EMPTY.copy()

    def _prepare_rows(
        self,
        prepared: PreparedReplays,
        w: _Waiting,
        rows: np.ndarray,
        payload: pa.Table,
        meta: RecordMeta,
        router: ReplayPartitioner | None,
        first_ids: bool,
        seen: list[np.ndarray],
    ) -> np.ndarray:
        """Rows of one chunk (``payload``/``meta`` row-aligned with ``rows``); ``seen`` gets
        the first ids given out. Returns the mask of ``rows`` handed out: with ``first_ids``,
        a second copy of a record whose first id this round already gave out (the same source
        record persisted twice: a Spark task retry, or a persist retried against a restarted
        shard that had recovered the first copy) is not replayed but completes as a duplicate,
        so the round processes each source record once."""
        src, rec = w.src[rows], w.rec[rows]
        kept = np.ones(len(rows), dtype=bool)
        if router is None:
            parts = w.partition[rows]
        else:
            _, parts = router.assign(meta.key_hash, meta.partition, backend=self.backend)
            n = router.num_partitions
            if n is not None and len(parts) and (parts.min() < 0 or parts.max() >= n):
                raise ValueError(
                    f"prepare_replays: {router.spec!r} routed a replay outside [0, {n})"
                )
        if first_ids:
            det = meta.origin_rec
            first = _first_copies(det, seen)
            kept = first | (det == 0)  # 0: no first id, nothing to compare
            if not kept.all():
                dup = ~kept  # registered with their fresh id as birth: acking it completes them
                done = self._table.xor(src[dup], rec[dup])
                self._complete(done)
                self._stats.duplicates += len(done)
                kept |= dup & ~np.isin(src, done)  # cannot happen (no events yet); never lose one
                src, rec, det, first = src[kept], rec[kept], det[kept], first[kept]
                rows, parts = rows[kept], parts[kept]
                payload, meta = payload.filter(pa.array(kept)), meta.take(np.flatnonzero(kept))
            fix = first & (rec != det)
            if fix.any():
                self._move_births(src[fix], rec[fix], det[fix])
                rec = np.where(fix, det, rec)
                w.rec[rows[fix]] = det[fix]  # a queue put back after an error agrees
            if first.any():
                seen.append(np.sort(det[first]))
        prepared.add(_replay_table(payload, src, rec, meta, parts), parts)
        self._storage.note_in_flight(meta.origin)  # a crash from here on may be theirs
        return kept

    def _move_births(self, src: np.ndarray, fresh: np.ndarray, first: np.ndarray) -> None:
        """Replays ``src`` born with the record ids ``fresh`` are born with ``first`` instead:
        their checksums move with them (XOR of both ids), so that their outputs re-create the
        first attempt's ids (idempotent sinks absorb the duplicates)."""
        if len(src):
            done = self._table.xor(src, fresh ^ first)
            if len(done):  # cannot happen (the value becomes first != 0); never lose it
                self._complete(done)

    def fetch_replays(self, source: int, tag: str, partition: int) -> pa.Table:
        """The rows :meth:`prepare_replays` routed to ``partition`` under ``tag`` (empty when
        none); the same rows each time until the round's replays are released. ValueError
        when ``tag`` is not the source's prepared round (released, or another round's)."""
        return self.replay_reader(source, tag, partition).read_all()

    def replay_reader(self, source: int, tag: str, partition: int) -> pa.RecordBatchReader:
        """:meth:`fetch_replays` as a stream, read from the round's spill file a piece at a
        time (what the acker service sends: its memory follows a piece, not the partition)."""
        self._check_open()
        source = _source_arg(source)
        partition = _source_arg(partition)
        with self._lock:
            prepared = self._prepared.get(source)
            if prepared is None or prepared.tag != tag:
                now = "none" if prepared is None else repr(prepared.tag)
                raise ValueError(
                    f"fetch_replays: no replays of source {source} prepared under {tag!r} "
                    f"(prepared now: {now}); the round is over or was never prepared"
                )
        return prepared.reader(partition)

    def release_replays(self, source: int | None = None, tag: str | None = None) -> None:
        """Free the replays prepared for ``source`` (every source when None); with ``tag``,
        only when they were prepared under it. A no-op when there are none."""
        with self._lock:
            sources = list(self._prepared) if source is None else [_source_arg(source)]
            for s in sources:
                p = self._prepared.get(s)
                if p is not None and (tag is None or p.tag == tag):
                    self._prepared.pop(s).close()

    def take_ended(self) -> np.ndarray:
        """The source ids of the attempts that ended without completing since the previous
        call: failed, timed out or recovered (each then replayed under a new id or
        dead-lettered). Each id is handed out once. A sink or an aggregate that kept rows of
        such an attempt drops them: only a completed attempt's rows count.

        >>> import pyarrow as pa
        >>> ft = FTLayer()
        >>> src = ft.persist(pa.record_batch({"x": [1, 2]}), births=[5, 6])
        >>> _ = ft.fail(src[:1])
        >>> ft.take_ended().tolist() == src[:1].tolist(), ft.take_ended().tolist()
        (True, [])
        """
        self._check_open()
        with self._lock:
            ended, self._ended = self._ended, []
        return np.concatenate(ended) if ended else _EMPTY.copy()

    def job_state(
        self, marks: Mapping[str, str | None] | None = None, clear: Sequence[str] = ()
    ) -> dict[str, Any]:
        """What a resumed job needs: set (None: remove) ``marks`` and clear parts of the job
        state (``"progress"``, ``"ended"``, ``"marks"``) first, in one storage transaction,
        then answer ``{"progress": {source: {partition: rows}}, "marks": {...}}``. A durable
        storage keeps them across restarts (a memory one for the life of this layer).

        >>> ft = FTLayer()
        >>> _ = ft.persist(pa.record_batch({"v": [1, 2]}), partition=3, progress=(3, 2))
        >>> ft.job_state(marks={"phase0": "done"})
        {'progress': {0: {3: 2}}, 'marks': {'phase0': 'done'}}
        """
        self._check_open()
        with self._lock:
            if marks or clear:
                self._storage.update_job(marks, clear)
            return {"progress": self._storage.progress(), "marks": self._storage.marks()}

    def dead_letters(self, source: int | None = None) -> pa.Table:
        """Records that used up ``max_attempts``: payload + ``_ft_origin``, ``_ft_source``,
        ``_ft_attempts``, ``_ft_reason`` (the last failure's reason); only those of source index
        ``source`` when given (needed when the sources' payload schemas do not unify)."""
        self._check_open()
        if source is None:
            return self._storage.dead_letters()
        return self._storage.dead_letters(source=_source_arg(source))

    def stats(self) -> FTStats:
        """A snapshot of the counters (see :class:`FTStats`)."""
        with self._lock:
            s = FTStats(
                **{
                    **asdict(self._stats),
                    "replayed_by_source": dict(self._stats.replayed_by_source),
                }
            )
            s.pending = self._registered
            s.known_keys = len(self._storage.known_keys)
            s.held = sum(len(h) for h in self._held)
            s.quarantined = int(getattr(self._storage, "quarantined", 0))
            s.replays_waiting = self._replays_waiting()
            s.min_event_time = self._event_times.min()
            if self._latencies:
                p50, p90, p99 = np.percentile(np.fromiter(self._latencies, float), [50, 90, 99])
                s.latency_p50, s.latency_p90, s.latency_p99 = float(p50), float(p90), float(p99)
            return s

    def _replays_waiting(self) -> int:
        """Records with replays waiting. Only a broadcast repeats a record in the queue: else
        the rows are the records (no sort of a queue that can hold every record)."""
        copies = any(isinstance(p, BroadcastReplayPartitioner) for p in self._partitioners.values())
        total = 0
        for queue in self._waiting.values():
            if queue and copies:
                total += count_distinct(np.concatenate([q.src for q in queue]))
            elif queue:
                total += sum(len(q.src) for q in queue)
        return total

    def start(self, interval: float) -> None:
        """Rotate once per ``interval`` seconds of the layer's clock, from a background daemon
        thread (until :meth:`stop`): a record then times out between (N-1)/N*T and T after its
        last persist/touch, T = N*interval. The thread looks at the clock every
        min(interval, 50 ms) of real time, so an injected ManualClock drives it too; after a
        pause it catches up (at most N rotations). An error in a rotation is logged and kept
        in ``rotation_error``; the thread goes on."""
        self._check_open()
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the rotation thread is already running: call stop() first")
            self._stop_event = stop = threading.Event()
            self._next_rotation = self.clock.now() + interval
            self._thread = threading.Thread(
                target=self._rotate_every,
                args=(float(interval), stop),
                name="xorack-ft-rotation",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the background rotation thread (no-op when not running)."""
        with self._lock:
            thread, stop = self._thread, self._stop_event
            self._thread = self._stop_event = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def close(self) -> None:
        """Stop rotating and close the storage. Pending records stay in a durable storage (the
        next FT layer on it replays them)."""
        if self._closed:
            return
        self.stop()
        with self._lock:
            self._closed = True
            self.release_replays()
            try:
                self._retry_deletes()
                self._storage.take_in_flight()  # a clean close: no record caused it
            finally:
                self._storage.close()

    def __enter__(self) -> FTLayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"FTLayer(storage={type(self._storage).__name__}, pending={self._registered}, "
            f"num_buckets={self.num_buckets}, max_attempts={self.max_attempts})"
        )

    # ---------------------------------------------------------------- decision logic

    def _retry(self, meta: RecordMeta, reason: str, *, attempt: bool = True) -> np.ndarray:
        """The records of ``meta`` failed (explicitly or by timeout): replay each one with a new
        source id, attempt + 1, to the partition its source's replay partitioner picks — or
        dead-letter it once ``max_attempts`` are used up (or when no partition can be computed
        for it). With ``attempt=False`` (recovery after a restart: the record's run was cut
        short by the acker, not by the record) the replay keeps its attempt number and nothing
        is dead-lettered for attempts. Returns the new ids. Routing first and storage next, so
        that an error leaves every record where it was."""
        if self._held:
            self._failed_while_held = True
        if not len(meta):
            return _EMPTY.copy()
        self._ended.append(np.array(meta.src, dtype=_U64))
        exhausted = (meta.attempt >= self.max_attempts) & attempt
        again = meta.take(~exhausted)
        routes, unroutable = self._route(again)
        self._dead_letter(meta.take(exhausted), reason)
        for indices, error in unroutable:
            self._dead_letter(again.take(indices), f"{reason}; replay routing failed: {error}")
        if not routes:
            return _EMPTY.copy()
        if len(routes) == 1 and len(routes[0][1]) == len(again):  # not broadcast: a permutation
            routed = np.arange(len(again))
        else:
            routed = np.unique(np.concatenate([rows for _, rows, _, _ in routes]))
        new = np.zeros(len(again), _U64)
        new[routed] = self._new_src(len(routed))
        if attempt:
            self._storage.renew(again.src[routed], new[routed])
        else:
            self._storage.renew(again.src[routed], new[routed], next_attempt=False)
        self._forget(again.src[routed])
        births = np.zeros(len(again), _U64)
        for source, rows, parts, count in routes:
            rec = new_ids(len(rows), backend=self.backend)
            np.bitwise_xor.at(births, rows, rec)  # a broadcast record: all its copies count
            self._waiting.setdefault(source, []).append(_Waiting(new[rows], rec, parts))
            by_source = self._stats.replayed_by_source
            by_source[source] = by_source.get(source, 0) + count
        new, births = new[routed], births[routed]
        self._event_times.add(new, again.event_time[routed])  # a replay keeps its event time
        self._table.register(new, births)
        self._start_timer(new)
        self._stats.replayed += len(new)
        return new

    def _route(
        self, meta: RecordMeta
    ) -> tuple[list[tuple[int, np.ndarray, np.ndarray, int]], list[tuple[np.ndarray, str]]]:
        """Where the replays of ``meta`` go: ``[(source, rows of meta, partitions, records)]``
        (a broadcast repeats rows) and the rows no partition could be computed for, with the
        partitioner's error."""
        routes: list[tuple[int, np.ndarray, np.ndarray, int]] = []
        unroutable: list[tuple[np.ndarray, str]] = []
        if not len(meta):
            return routes, unroutable
        one = (meta.source == meta.source[0]).all()
        for source in [int(meta.source[0])] if one else np.unique(meta.source).tolist():
            mine = np.flatnonzero(meta.source == source)
            try:
                rows, parts = self.replay_partitioner(source).assign(
                    meta.key_hash[mine], meta.partition[mine], backend=self.backend
                )
            except ValueError as exc:
                log.error("xorack FT layer: cannot route replays of source %d: %s", source, exc)
                unroutable.append((mine, str(exc)))
                continue
            rows = mine[np.asarray(rows, np.int64)]
            routes.append((source, rows, np.asarray(parts, np.int32), len(mine)))
        return routes, unroutable

    def _store(
        self,
        batch: pa.RecordBatch | pa.Table,
        meta: RecordMeta,
        progress: tuple[int, int, int] | None = None,
        known_epoch: int | None = None,
    ) -> None:
        """Persist ``batch`` (chunk by chunk when it is a Table of several): all or nothing.
        The progress note goes with the last chunk; the known ids with their records."""

        def put(part: pa.RecordBatch, m: RecordMeta, last: bool) -> None:
            extra: dict[str, Any] = {}
            if progress is not None and last:
                extra["progress"] = progress
            if known_epoch is not None:
                extra["known_epoch"] = known_epoch
            self._storage.persist(part, m, **extra)

        if isinstance(batch, pa.RecordBatch):
            put(batch, meta, True)
            return
        stored, start = [], 0
        try:
            for part in batch.to_batches():
                rows = np.arange(start, start + part.num_rows)
                start += part.num_rows
                if part.num_rows:
                    put(part, meta.take(rows), start == batch.num_rows)
                    stored.append(meta.src[rows])
        except BaseException:
            if stored:  # nothing of the batch is kept
                self._storage.delete(np.concatenate(stored))
            raise

    def _dead_letter(self, meta: RecordMeta, reason: str) -> None:
        if len(meta):
            self._storage.dead_letter(meta.src, reason)
            self._forget(meta.src)
            self._registered -= len(meta)
            self._stats.dead_lettered += len(meta)

    def _expire(self, expired: np.ndarray, collateral: bool = False) -> np.ndarray:
        """Ids whose timeout ran out: orphan entries are dropped and counted, records retried
        (``collateral``: with no attempt used up, see :meth:`expire_all`)."""
        if not len(expired):
            return _EMPTY.copy()
        if len(self._orphan_watch):
            orphan = np.isin(expired, self._orphan_watch, assume_unique=True)
            if orphan.any():
                self._unwatch(expired[orphan])
                self._stats.orphans += int(self._table.fail(expired[orphan]).sum())
                expired = expired[~orphan]
        try:
            meta = self._storage.lookup(expired)
            kept = None
            if len(self._kept) and len(meta):  # kept at a restart: the restart's replay now
                kept = np.isin(meta.src, self._kept)
                self._kept = np.setdiff1d(self._kept, meta.src[kept], assume_unique=True)
            if collateral:
                new = self._retry(meta, ABANDONED, attempt=False)
            elif kept is not None and kept.any():
                new = np.concatenate(
                    [
                        self._retry(meta.take(kept), RECOVERED, attempt=False),
                        self._retry(meta.take(~kept), TIMEOUT),
                    ]
                )
            else:
                new = self._retry(meta, TIMEOUT)
        except BaseException:
            self._wheel.add(expired)  # not retried: they time out again at a later rotation
            raise
        if collateral:
            self._stats.collateral += len(meta)
        else:
            self._stats.timed_out += len(meta)
        return new

    def _complete(self, done: np.ndarray) -> None:
        self._wheel.discard(done)
        self._event_times.discard(done)
        self._registered -= len(done)
        self._stats.completed += len(done)
        self._stop_timer(done)
        try:
            self._storage.delete(done)
        except Exception as exc:
            # The completion is applied and recorded: the call reports it (a caller that saw an
            # error would retry the events and XOR them twice). The delete is retried first
            # thing in the next call, which fails, applying nothing, while the storage does.
            self._undeleted.append(done)
            log.warning("xorack FT layer: deleting %d completed records failed: %s", len(done), exc)

    # ---------------------------------------------------------------- bookkeeping

    def _recover(self) -> None:
        """Take back every record found in the storage (a previous FT layer did not finish
        it); hand out the attempts the storage says ended before (``take_ended``) with theirs.

        A record persisted idempotently in its first attempt keeps its id, registered again
        with its birth, until it times out: the Spark task that persisted it, retrying its
        persist against this restarted layer, acks that one record (a replay under a new id
        would make it two: the retried task's copy and the replay). The others are replayed
        at once. Either way a restart uses up no attempt of the record."""
        before = self._storage.ended()
        if len(before):
            self._ended.append(before)
        known = self._storage.known_keys
        in_flight = sorted_distinct(self._storage.take_in_flight())
        kept = []
        for meta in self._storage.iter_pending():
            self._registered += len(meta)
            self._stats.recovered += len(meta)
            self._stats.restarts = 1
            meta = self._dead_letter_crashed(meta, in_flight)
            keep = (meta.attempt == 1) & (meta.origin_rec != 0) & (meta.src == meta.origin)
            if keep.any() and len(known):
                keep &= known.contains(meta.src)
            else:
                keep[:] = False
            if keep.any():
                kept.append(self._keep(meta.take(keep)))
            self._retry(meta.take(~keep), RECOVERED, attempt=False)
        if kept:
            self._kept = np.sort(np.concatenate(kept))

    def _dead_letter_crashed(self, meta: RecordMeta, in_flight: np.ndarray) -> RecordMeta:
        """Count one more crash for each recovered record that was being processed (handed
        out as a replay since the layer before this one started, and not closed cleanly), by
        its first id and durably; dead-letter those at ``max_restarts``; returns the others.
        A record that only waited (never processed, or across clean restarts) is never
        blamed."""
        if not len(in_flight):
            return meta
        hit = np.isin(meta.origin, in_flight, assume_unique=False)
        if not hit.any():
            return meta
        crashed = np.zeros(len(meta), dtype=bool)
        crashed[hit] = self._storage.count_restarts(meta.origin[hit]) >= self.max_restarts
        if not crashed.any():
            return meta
        dead = meta.take(crashed)
        self._ended.append(np.array(dead.src, dtype=_U64))
        self._dead_letter(dead, CRASHED.format(n=self.max_restarts))
        self._stats.crashed += len(dead)
        return meta.take(~crashed)

    def _keep(self, meta: RecordMeta) -> np.ndarray:
        """Register recovered first attempts again under their ids (see :meth:`_recover`)."""
        src = np.asarray(meta.src, dtype=_U64)
        self._table.register(src, np.asarray(meta.origin_rec, dtype=_U64))
        self._wheel.add(src)
        self._event_times.add(src, meta.event_time)
        self._start_timer(src)
        self._stats.kept_at_restart += len(src)
        return src

    def _new_src(self, n: int) -> np.ndarray:
        """``n`` fresh source ids (owned by this layer's shard, when it is one)."""
        if self.shard is None:
            return new_ids(n, backend=self.backend)
        return draw_ids(n, self.shard, backend=self.backend)

    def _check_owned(self, src_ids: np.ndarray) -> None:
        if self.shard is not None and self.shard.count > 1:
            stray = ~self.shard.owns(src_ids)
            if stray.any():
                raise ValueError(
                    f"src_ids: {int(stray.sum())} id(s) (e.g. {int(src_ids[stray][0])}) belong "
                    f"to another shard than this acker's ({self.shard}): route each persist by "
                    "xorack.sharding.shard_of (the sharded client does), and give every shard's "
                    "location in shard order"
                )

    def _check_routable(self, source: int, partition: np.ndarray) -> None:
        p = self._partitioners.get(source)
        if not isinstance(p, ForwardReplayPartitioner) or not len(partition):
            return
        if partition.min() < 0:
            raise ValueError(
                f"source {source} replays with forward partitioning, which needs each "
                "record's original partition: pass partition= (got -1/None)"
            )
        if p.num_partitions is not None and partition.max() >= p.num_partitions:
            raise ValueError(
                f"source {source} replays with {p.spec!r}: partition must be in "
                f"[0, {p.num_partitions}), got {int(partition.max())}"
            )

    def _forget(self, ids: np.ndarray) -> None:
        """The records under ``ids`` left (replayed under a new id, or dead-lettered)."""
        self._table.fail(ids)
        self._wheel.discard(ids)
        self._event_times.discard(ids)
        self._drop_waiting(ids)
        self._timer_starts(ids)

    def _drop_waiting(self, ids: np.ndarray) -> None:
        for source, queue in list(self._waiting.items()):
            kept = []
            for q in queue:
                gone = np.isin(q.src, ids)
                if gone.any():
                    q = _Waiting(q.src[~gone], q.rec[~gone], q.partition[~gone])
                if len(q.src):
                    kept.append(q)
            self._waiting[source] = kept

    def _watch_orphans(self) -> None:
        """Put table entries that are not registered records (early events, events of ids that
        were never persisted or already finished) on the wheel, once: they time out as orphans
        unless their record is persisted first."""
        if len(self._table) - self._registered <= len(self._orphan_watch):
            # No new loose entry (the common case costs nothing). A watched entry that dropped
            # out (back to 0) can hide a new one until it expires: orphans time out within 2N.
            return
        keys, _values, registered = self._table.snapshot()
        loose = keys[~registered]
        new = np.setdiff1d(loose, self._orphan_watch, assume_unique=True)
        if len(new):
            self._wheel.add(new)
            self._orphan_watch = np.union1d(self._orphan_watch, new)

    def _unwatch(self, ids: np.ndarray) -> None:
        if len(self._orphan_watch):
            self._orphan_watch = self._orphan_watch[~np.isin(self._orphan_watch, ids)]

    def _retry_deletes(self) -> None:
        while self._undeleted:
            self._storage.delete(self._undeleted[0])
            self._undeleted.pop(0)

    def _start_timer(self, ids: np.ndarray) -> None:
        small = len(ids) < _TIME_ALL_BELOW
        timed, born = (ids, self._born_small) if small else (_timed(ids), self._born)
        if len(timed):
            born.update(dict.fromkeys(timed.tolist(), self.clock.now()))

    def _timer_starts(self, ids: np.ndarray) -> list[float]:
        """Forget the timers of ``ids``; their start times."""
        starts = [self._born.pop(k, None) for k in _timed(ids).tolist()]
        if self._born_small:
            if len(ids) > 4 * len(self._born_small):  # few small-call timers: filter first
                ids = ids[np.isin(ids, np.fromiter(self._born_small, np.uint64))]
            starts += [self._born_small.pop(k, None) for k in ids.tolist()]
        return [t for t in starts if t is not None]

    def _stop_timer(self, ids: np.ndarray) -> None:
        starts = self._timer_starts(ids)
        if starts:
            now = self.clock.now()
            self._latencies.extend(now - t for t in starts)

    def _rotate_every(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(min(interval, _CLOCK_POLL)):
            try:
                with self._lock:
                    now = self.clock.now()
                    if now < self._next_rotation or self._closed:
                        continue
                    due = int((now - self._next_rotation) // interval) + 1
                    self._next_rotation += due * interval
                    for _ in range(min(due, self.num_buckets)):  # more would expire nothing new
                        self.rotate()
            except Exception as exc:  # keep rotating: a transient storage error must not stop
                self.rotation_error = exc
                log.exception("xorack FT layer: a timeout rotation failed")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this FTLayer is closed")
