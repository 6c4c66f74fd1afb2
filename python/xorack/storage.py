"""Where the FT layer keeps its persisted source records until they complete.

A persisted record is the seed's *semi-deserialized record*: one row of an Arrow batch (the
payload, never re-parsed by the FT layer) plus the little the FT layer needs to replay it — its
source id (``src``), key hash, source index, original partition, attempt number, origin id
(the first source id the record ever had), origin record id (the ``_ft_rec`` its first attempt
was born with) and event time (``NO_EVENT_TIME`` when it has none). A replay keeps the payload
row and changes only the id (:meth:`Storage.renew`), so a record's bytes are written once,
whatever happens to it.

Two storages share one interface, all of it batched (numpy ``uint64`` id arrays in, Arrow out):

* :class:`MemoryStorage` keeps each persisted ``RecordBatch`` as is, and one ``(batch, row)``
  reference per record; a batch is dropped when no record refers to it any more.
* :class:`SQLiteStorage` (stdlib ``sqlite3``, WAL) stores each persisted batch once as an Arrow IPC
  blob and one row per record; every call is one transaction, so a process killed at any point
  leaves every accepted, unfinished record on disk, and reopening the file replays them.

In both, a batch three quarters of whose records are gone is rewritten with its live rows only
(at once in memory, at SQLite's periodic sweep or :meth:`SQLiteStorage.compact`): the space kept
follows the pending records (at most about 4 times their bytes), not the batches they came in.

>>> import numpy as np, pyarrow as pa
>>> from xorack.storage import open_storage, RecordMeta
>>> s = open_storage("memory")
>>> meta = RecordMeta.new(np.array([11, 12], dtype=np.uint64), source=0)
>>> s.persist(pa.record_batch({"x": [1, 2]}), meta)
>>> len(s), s.delete(np.array([11], dtype=np.uint64)), len(s)
(2, 1, 1)
>>> s.fetch(np.array([12], dtype=np.uint64))[0].column("x").to_pylist()
[2]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from .errors import StorageError
from .known_keys import KnownKeys
from .protocol import NO_EVENT_TIME

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "NO_EVENT_TIME",
    "MemoryStorage",
    "PayloadSchemaConflict",
    "RecordMeta",
    "SQLiteStorage",
    "Storage",
    "open_storage",
    "storage_path",
]

log = logging.getLogger(__name__)

_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_I32 = np.empty(0, dtype=np.int32)
_EMPTY_I64 = np.empty(0, dtype=np.int64)

#: Columns a dead-letter table carries besides the payload.
DEAD_LETTER_COLUMNS = ("_ft_origin", "_ft_source", "_ft_attempts", "_ft_reason")


@dataclass(frozen=True)
class RecordMeta:
    """What the FT layer knows about a set of persisted records: row-aligned numpy columns.

    ``src`` (uint64) is the current source id, ``key_hash`` (int32) the hash the replay
    partitioner routes by, ``source`` (int32) the source index, ``partition`` (int32) the partition
    the record first went to (-1 unknown), ``attempt`` (int32, 1 at the first persist) and
    ``origin`` (uint64) the record's first source id, ``origin_rec`` (uint64) the record id
    (``_ft_rec``) its first attempt was born with (0 = unknown): what a replay is given back when
    its outputs must re-create the first attempt's ids; ``event_time`` (int64) the record's event
    time, kept across its replays (``NO_EVENT_TIME`` = none).

    >>> import numpy as np
    >>> m = RecordMeta.new(np.array([5, 6], dtype=np.uint64), source=2, event_time=np.array([9, 8]))
    >>> m.attempt.tolist(), m.origin.tolist(), m.origin_rec.tolist(), m.event_time.tolist(), len(m)
    ([1, 1], [5, 6], [0, 0], [9, 8], 2)
    """

    src: np.ndarray
    key_hash: np.ndarray
    source: np.ndarray
    partition: np.ndarray
    attempt: np.ndarray
    origin: np.ndarray
    origin_rec: np.ndarray
    event_time: np.ndarray

    @classmethod
    def new(
        cls,
        src: np.ndarray,
        key_hash: np.ndarray | None = None,
        source: int = 0,
        partition: np.ndarray | None = None,
        origin_rec: np.ndarray | None = None,
        event_time: np.ndarray | None = None,
    ) -> RecordMeta:
        """Metadata of freshly persisted records (attempt 1, origin = src; ``origin_rec``: their
        record ids, None = unknown; ``event_time``: int64 per record, None = none)."""
        n = len(src)
        return cls(
            src=src,
            key_hash=np.zeros(n, np.int32) if key_hash is None else key_hash,
            source=np.full(n, source, np.int32),
            partition=np.full(n, -1, np.int32) if partition is None else partition,
            attempt=np.ones(n, np.int32),
            origin=src.copy(),
            origin_rec=np.zeros(n, np.uint64) if origin_rec is None else origin_rec,
            event_time=_no_event_times(n) if event_time is None else event_time,
        )

    @classmethod
    def empty(cls) -> RecordMeta:
        return cls(
            _EMPTY_U64,
            _EMPTY_I32,
            _EMPTY_I32,
            _EMPTY_I32,
            _EMPTY_I32,
            _EMPTY_U64,
            _EMPTY_U64,
            _EMPTY_I64,
        )

    @classmethod
    def concat(cls, parts: list[RecordMeta]) -> RecordMeta:
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _META_FIELDS))

    def __len__(self) -> int:
        return len(self.src)

    def take(self, index: np.ndarray) -> RecordMeta:
        """The rows at ``index`` (an int array or a boolean mask)."""
        return RecordMeta(*(getattr(self, f)[index] for f in _META_FIELDS))


_META_FIELDS = (
    "src",
    "key_hash",
    "source",
    "partition",
    "attempt",
    "origin",
    "origin_rec",
    "event_time",
)


def _no_event_times(n: int) -> np.ndarray:
    """``n`` times NO_EVENT_TIME, as a read-only view of one value (no memory per record)."""
    return np.broadcast_to(np.array(NO_EVENT_TIME, np.int64), (n,))


def _has_event_times(event_time: np.ndarray) -> bool:
    """Whether any record of a column has an event time (one look at a constant view)."""
    if not len(event_time):
        return False
    if event_time.strides[0] == 0:
        return bool(event_time[0] != NO_EVENT_TIME)
    return bool((event_time != NO_EVENT_TIME).any())


class Storage(ABC):
    """The FT layer's persistence interface (the seed's AbstractPersistenceStorage), batched.

    Every method takes and returns whole arrays; ids are ``uint64``. Unknown ids are ignored by
    ``delete``/``lookup``/``fetch``/``renew`` (the FT layer decides what an unknown id means).
    Implementations are thread-safe and raise :class:`xorack.StorageError` when the medium fails;
    a failed call changes nothing. ``quarantined`` counts the records a durable storage found
    corrupt (and set aside, ``quarantine_notes`` saying what was wrong) instead of recovering.
    """

    quarantined: int = 0
    quarantine_notes: list[str]
    _job_progress: dict[tuple[int, int], int]  # the job state of a storage that is not durable
    _job_marks: dict[str, str]
    #: The source ids the job persisted idempotently (see :mod:`xorack.known_keys`), per epoch:
    #: in memory for every storage, kept across restarts by a durable one.
    known_keys: KnownKeys

    def __new__(cls, *args: Any, **kwargs: Any) -> Storage:
        self = super().__new__(cls)
        self.quarantine_notes = []
        self._job_progress = {}
        self._job_marks = {}
        self.known_keys = KnownKeys()
        return self

    @abstractmethod
    def persist(self, batch: pa.RecordBatch, meta: RecordMeta) -> None:
        """Store ``batch`` once and one record per row (row ``i`` is ``meta`` row ``i``).
        Concrete storages also take ``progress`` (a resume note) and ``known_epoch`` (the
        records' ids, which the caller checked are not known yet, join :attr:`known_keys`
        under that epoch, with the records: both or neither)."""

    def forget_known(self, through_epoch: int) -> int:
        """Drop the known ids of the epochs ``<= through_epoch``; returns how many."""
        return self.known_keys.forget(through_epoch)

    def note_in_flight(self, origins: np.ndarray) -> None:  # noqa: B027 - optional hook
        """These records (by first id) are handed out for processing: a crash before the
        next :meth:`take_in_flight` may be theirs. A durable storage keeps them (one row per
        replay handed out since the layer started); a memory storage none (its records do
        not outlive a crash)."""

    def take_in_flight(self) -> np.ndarray:
        """The records noted in flight since the previous call (uint64 first ids); clears
        them."""
        return np.empty(0, dtype=np.uint64)

    def count_restarts(self, origins: np.ndarray) -> np.ndarray:
        """One more restart of the FT layer while the records of these first ids
        (``origin``) were pending; returns each one's count so far (int64). A durable storage
        keeps the counts across restarts; this one for the life of the object."""
        counts = self.__dict__.setdefault("_restarts", {})
        out = np.empty(len(origins), np.int64)
        for i, o in enumerate(np.asarray(origins, np.uint64).tolist()):
            out[i] = counts[o] = counts.get(o, 0) + 1
        return out

    @abstractmethod
    def delete(self, src_ids: np.ndarray) -> int:
        """Forget these records (they completed); returns how many were stored."""

    @abstractmethod
    def lookup(self, src_ids: np.ndarray) -> RecordMeta:
        """Metadata of the stored ones among ``src_ids`` (in ``src_ids`` order)."""

    @abstractmethod
    def renew(self, old_ids: np.ndarray, new_ids: np.ndarray, *, next_attempt: bool = True) -> None:
        """Replay bookkeeping: record ``old_ids[i]`` becomes ``new_ids[i]``, attempt + 1 (the
        same attempt with ``next_attempt=False``: a replay after a restart of the FT layer,
        which is no attempt of the record); the payload row stays where it is. Every
        ``old_ids`` must be stored."""

    @abstractmethod
    def fetch(self, src_ids: np.ndarray) -> tuple[pa.Table, RecordMeta]:
        """Payload rows and metadata of the stored ones among ``src_ids`` (in ``src_ids`` order)."""

    @abstractmethod
    def stored_ids(self) -> np.ndarray:
        """The ids of every stored record (uint64)."""

    def iter_pending(self, chunk_size: int = 65536) -> Iterator[RecordMeta]:
        """Every stored record, in chunks (crash recovery)."""
        ids = self.stored_ids()
        for start in range(0, len(ids), chunk_size):
            meta = self.lookup(ids[start : start + chunk_size])
            if len(meta):
                yield meta

    @abstractmethod
    def dead_letter(self, src_ids: np.ndarray, reason: str) -> None:
        """Move these records to the dead-letter table with ``reason``."""

    @abstractmethod
    def dead_letters(self, source: int | None = None) -> pa.Table:
        """Payload + ``_ft_origin``, ``_ft_source``, ``_ft_attempts``, ``_ft_reason`` (of one
        source index when ``source`` is given). PayloadSchemaConflict when the dead-lettered
        payloads' schemas do not unify into one table (read them per source then)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of stored (pending) records."""

    # ---- a job's resume state: kept across restarts by a durable storage, in memory here

    def _note_progress(self, progress: tuple[int, int, int] | None) -> None:
        if progress is not None:
            source, part, end = progress
            key = (int(source), int(part))
            self._job_progress[key] = max(self._job_progress.get(key, 0), int(end))

    def progress(self) -> dict[int, dict[int, int]]:
        """``{source: {partition: rows}}``: how many rows of each source partition were
        persisted with a ``progress`` note (the first ``rows`` rows of the partition, in the
        order it is read). A resumed job skips them when it reads the source again."""
        out: dict[int, dict[int, int]] = {}
        for (source, part), rows in self._job_progress.items():
            out.setdefault(source, {})[part] = rows
        return out

    def ended(self) -> np.ndarray:
        """The source ids of attempts that ended without completing (replayed or
        dead-lettered), as far as this storage keeps them: a durable storage keeps every one
        until :meth:`update_job` clears them, so that a resumed job still leaves their rows
        out; a memory storage keeps none (its job cannot outlive the process)."""
        return np.empty(0, dtype=np.uint64)

    def marks(self) -> dict[str, str]:
        """The job's marks (``update_job``): what a resumed job needs to know of the runs
        before it (phases done, sinks published, the final report)."""
        return dict(self._job_marks)

    def update_job(
        self, marks: Mapping[str, str | None] | None = None, clear: Sequence[str] = ()
    ) -> None:
        """Set (None: remove) marks, and clear parts of the job state (``"progress"``,
        ``"ended"``, ``"marks"``), in one transaction of a durable storage."""
        _check_job_update(marks, clear)
        if "progress" in clear:
            self._job_progress.clear()
        if "marks" in clear:
            self._job_marks.clear()
        for k, v in (marks or {}).items():
            if v is None:
                self._job_marks.pop(k, None)
            else:
                self._job_marks[k] = v

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the medium. Stored records stay (for a durable storage)."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Helpers shared by both storages

_JOB_PARTS = ("progress", "ended", "marks")


def _check_job_update(marks: Mapping[str, str | None] | None, clear: Sequence[str]) -> None:
    if isinstance(clear, str) or not all(c in _JOB_PARTS for c in clear):
        raise ValueError(f"clear: a list of {list(_JOB_PARTS)}, got {clear!r}")
    for k, v in (marks or {}).items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str)):
            raise TypeError(f"marks: str keys and str (or None) values, got {k!r}: {v!r}")


def check_progress(progress: Any, rows: int) -> tuple[int, int] | None:
    """``progress`` of a persist: None, or ``(partition, end)`` — the batch is rows
    ``[end - rows, end)`` of source partition ``partition`` (both non-negative ints)."""
    if progress is None:
        return None
    try:
        part, end = progress
    except (TypeError, ValueError):
        raise TypeError(f"progress must be (partition, end) or None, got {progress!r}") from None
    for name, v in (("partition", part), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"progress {name} must be a non-negative int, got {v!r}")
    if end < rows:
        raise ValueError(f"progress end {end} is before the batch's {rows} rows end")
    return int(part), int(end)


def _dead_letter_table(payload: pa.Table, meta: RecordMeta, reason: str) -> pa.Table:
    n = len(meta)
    return (
        payload.append_column("_ft_origin", pa.array(meta.origin, pa.uint64()))
        .append_column("_ft_source", pa.array(meta.source, pa.int32()))
        .append_column("_ft_attempts", pa.array(meta.attempt, pa.int32()))
        .append_column("_ft_reason", pa.array([reason] * n, pa.string()))
    )


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def _dead_letters_of(tables: list[pa.Table], source: int | None) -> pa.Table:
    """The dead-letter tables (one per dead-letter call and payload schema) as one table."""
    if source is not None:
        tables = [t.filter(pa.compute.equal(t.column("_ft_source"), int(source))) for t in tables]
        tables = [t for t in tables if t.num_rows]
    if not tables:
        return _empty_dead_letters()
    try:
        return _concat(tables)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise PayloadSchemaConflict(
            f"the dead-lettered payloads have incompatible schemas ({exc}): read them one "
            "source at a time with dead_letters(source=...)",
            np.empty(0, np.uint64),
        ) from None


def _empty_dead_letters() -> pa.Table:
    return pa.table(
        {
            "_ft_origin": pa.array([], pa.uint64()),
            "_ft_source": pa.array([], pa.int32()),
            "_ft_attempts": pa.array([], pa.int32()),
            "_ft_reason": pa.array([], pa.string()),
        }
    )


def _distinct(nos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of batch numbers: a bincount, as they span a small range."""
    if not len(nos):
        return nos, nos
    lo = int(nos.min())
    if int(nos.max()) - lo > 4 * len(nos) + 1024:
        return np.unique(nos, return_counts=True)
    counts = np.bincount(nos - lo)
    values = np.flatnonzero(counts)
    return values + lo, counts[values]


def _positions(nos: np.ndarray, rows: np.ndarray, kept: dict[int, np.ndarray | None]) -> np.ndarray:
    """Where rows ``(nos[i], rows[i])`` (batch, row as first stored) are in their batches now:
    a compacted batch holds only the rows ``kept[no]`` (their first row numbers, ascending);
    ``None`` means all of them."""
    if all(k is None for k in kept.values()):
        return rows
    out = rows.copy()
    order = np.argsort(nos, kind="stable")
    sorted_nos = nos[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(sorted_nos)) + 1, len(order)].tolist()
    for start, stop in itertools.pairwise(bounds):
        k = kept.get(int(sorted_nos[start])) if start < stop else None
        if k is not None:
            at = order[start:stop]
            out[at] = np.searchsorted(k, rows[at])
    return out


class PayloadSchemaConflict(ValueError):
    """Payload rows asked for in one call come from batches whose schemas cannot be unified into
    one table (e.g. a column ``x`` int64 in one persisted batch and string in another).
    ``src`` holds the source ids (uint64) of the requested rows that do unify with the first
    batch's schema: ask for those and the rest separately."""

    def __init__(self, message: str, src: np.ndarray) -> None:
        super().__init__(message)
        self.src = src


def _schema_groups(pieces: list[pa.Table]) -> list[int]:
    """A group number per piece: greedily, a piece joins the first group whose (permissively
    unified) schema it unifies with."""
    schemas: list[pa.Schema] = []
    groups = []
    for t in pieces:
        for g, schema in enumerate(schemas):
            if t.schema == schema:
                groups.append(g)
                break
            try:
                schemas[g] = pa.unify_schemas([schema, t.schema], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                continue
            groups.append(g)
            break
        else:
            groups.append(len(schemas))
            schemas.append(t.schema)
    return groups


def _gather_groups(
    batches: dict[int, pa.RecordBatch], batch_no: np.ndarray, rows: np.ndarray
) -> list[tuple[np.ndarray, pa.Table]]:
    """Rows ``(batch_no[i], rows[i])`` of the given batches as ``[(positions i, table)]``: one
    table per group of batches whose schemas unify (almost always one group), its rows in
    ``positions`` order."""
    order = np.argsort(batch_no, kind="stable")
    sorted_b = batch_no[order]
    cuts = np.flatnonzero(np.diff(sorted_b)) + 1
    pieces, positions = [], []
    for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
        b = batches[int(sorted_b[start])]
        pieces.append(pa.Table.from_batches([b.take(pa.array(rows[order[start:stop]]))]))
        positions.append(order[start:stop])
    groups = _schema_groups(pieces) if len(pieces) > 1 else [0]
    out = []
    for g in range(max(groups) + 1):
        members = [k for k, gk in enumerate(groups) if gk == g]
        pos = np.concatenate([positions[k] for k in members])
        table = _concat([pieces[k] for k in members])
        back = np.argsort(pos, kind="stable")  # back to request order
        if len(members) > 1 or not (np.diff(pos) > 0).all():
            table = table.take(pa.array(back))
        out.append((pos[back], table))
    return out


def _gather(
    batches: dict[int, pa.RecordBatch], batch_no: np.ndarray, rows: np.ndarray, src: np.ndarray
) -> pa.Table:
    """Rows ``(batch_no[i], rows[i])`` of the given batches, in that order (``src[i]`` names
    row i); PayloadSchemaConflict when their batches' schemas do not unify."""
    groups = _gather_groups(batches, batch_no, rows)
    if len(groups) == 1:
        return groups[0][1]
    raise PayloadSchemaConflict(
        "the requested records were persisted in batches with incompatible payload schemas ("
        + "; ".join(_schema_text(t.schema) for _, t in groups[:3])
        + ")",
        src[np.sort(groups[0][0])],
    )


def _check_batch(batch: pa.RecordBatch, n: int) -> None:
    """A batch a storage can persist: ``n`` rows (one per record), at least one column."""
    if batch.num_rows != n:
        raise ValueError(f"batch has {batch.num_rows} rows but meta has {n}")
    if n and not batch.num_columns:
        raise ValueError(f"batch has {n} rows but no columns: a record needs a payload to replay")


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


# --------------------------------------------------------------------------------------------
# MemoryStorage


class _Chunk:
    """One persisted batch and the per-row metadata of its records (``alive``: a record still
    refers to the row; a record's location in the index stays (batch, first row))."""

    __slots__ = (
        "alive",
        "attempt",
        "batch",
        "event_time",
        "kept",
        "key_hash",
        "live",
        "origin",
        "origin_rec",
        "partition",
        "source",
    )

    def __init__(self, batch: pa.RecordBatch, meta: RecordMeta) -> None:
        self.batch = batch
        self.key_hash = meta.key_hash
        self.source = _compact(meta.source)
        self.partition = _compact(meta.partition)
        self.attempt = meta.attempt.copy()
        self.origin = meta.origin
        self.origin_rec = _compact(meta.origin_rec)  # all 0 without births
        self.event_time = _compact(meta.event_time)  # all NO_EVENT_TIME without event times
        self.alive = np.ones(len(meta), bool)  # the rows held that a record still refers to
        self.live = len(meta)
        self.kept: np.ndarray | None = None  # first row numbers of the rows held, once compacted

    def position(self, rows: np.ndarray) -> np.ndarray:
        """Where the rows first stored at ``rows`` are held now."""
        return rows if self.kept is None else np.searchsorted(self.kept, rows)

    def wasteful(self) -> bool:
        """Worth compacting (see ``_sparse``)."""
        return _sparse(self.live, len(self.alive))

    def release(self, rows: np.ndarray) -> None:
        """The records first stored at ``rows`` are gone (each row released once)."""
        self.alive[self.position(rows)] = False
        self.live -= len(rows)

    def compact(self) -> None:
        """Keep only the live rows (a copy: the old buffers are freed). Records keep their
        locations (batch, first row) in the id index: ``kept`` maps them to the rows held
        now."""
        first = np.arange(len(self.alive), dtype=np.int64) if self.kept is None else self.kept
        rows = np.flatnonzero(self.alive)
        self.batch = self.batch.take(pa.array(rows))
        for name in ("key_hash", "attempt", "origin"):
            setattr(self, name, getattr(self, name)[rows])
        self.origin_rec = _compact(self.origin_rec[rows])
        self.event_time = _compact(self.event_time[rows])
        self.source = _compact(self.source[rows])
        self.partition = _compact(self.partition[rows])
        self.kept = first[rows]
        self.alive = np.ones(len(rows), bool)
        self.live = len(rows)


#: A batch is rewritten with its live rows only once at most 1/_COMPACT_SHARE of its rows are
#: live (and at least _COMPACT_MIN_GONE are gone): a pending record pins at most about
#: _COMPACT_SHARE times its own bytes, and a row is copied 1/(_COMPACT_SHARE - 1) times on
#: average over its life. Records keep their location (batch, first row): a compacted batch maps
#: first rows to the rows it holds (``kept``), so compaction never rewrites the record index.
#: Records completed in random order (the worst case: every batch shrinks step by step)
#: measured 10-30 % more CPU per delete (memory and SQLite, 10 K-row batches); a batch whose
#: records complete together is dropped whole, never copied.
_COMPACT_SHARE = 4
_COMPACT_MIN_GONE = 16


def _sparse(live: int, rows: int) -> bool:
    """A batch of ``rows`` rows, ``live`` of them still stored, is worth rewriting."""
    return rows - live >= _COMPACT_MIN_GONE and _COMPACT_SHARE * live <= rows


def _compact(column: np.ndarray) -> np.ndarray:
    """``column`` itself, or a read-only view of one value when all its values are equal (a
    batch's source index, often its partition): no memory per record."""
    if len(column) and column.strides[0] == 0:  # one value already
        return column
    if len(column) and (column == column[0]).all():
        return np.broadcast_to(column[:1].copy(), column.shape)
    return column


_ROW_BITS = 32
_ROW_MASK = (1 << _ROW_BITS) - 1


class _IdIndex:
    """Source id (uint64) -> location (int64 >= 0), batched: 16 bytes per record.

    Sorted runs of (id, location), LSM-style: ``add`` appends a sorted run and merges runs of
    similar size (so there are O(log n) runs and each entry is merged O(log n) times, the
    merges being numpy sorts of two sorted runs: near linear); lookups binary-search each run;
    ``pop`` marks the location -1, and the removed entries are dropped when they outnumber the
    live ones. (A dict of Python ints costs ~100 bytes per record.) Ids added must not be
    live already (the FT layer checks).

    >>> ix = _IdIndex()
    >>> ix.add(np.array([7, 3], np.uint64), np.array([70, 30]))
    >>> ix.get(np.array([3, 9], np.uint64)).tolist(), ix.pop(np.array([7], np.uint64)).tolist()
    ([30, -1], [70])
    >>> len(ix), ix.keys().tolist()
    (1, [3])
    """

    compact_min = 4096  # removed entries are dropped once more than this (and than live ones)

    def __init__(self) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted ids, locations)
        self._live = 0
        self._removed = 0

    def __len__(self) -> int:
        return self._live

    def add(self, keys: np.ndarray, locs: np.ndarray) -> None:
        keys = np.asarray(keys, np.uint64)
        order = np.argsort(keys, kind="stable")
        self._runs.append((keys[order], np.asarray(locs, np.int64)[order]))
        self._live += len(keys)
        runs = self._runs
        while len(runs) > 1 and 2 * len(runs[-1][0]) >= len(runs[-2][0]):
            runs[-2:] = [_merge_runs(runs[-2:])]

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The location of each id, -1 for the absent ones."""
        keys = np.asarray(keys, np.uint64)
        out = np.full(len(keys), -1, np.int64)
        order, sk = _sorted_query(keys)
        for rk, rl in self._runs:
            pos, hit = _search(rk, rl, sk)
            out[order[hit]] = rl[pos[hit]]
        return out

    def pop(self, keys: np.ndarray) -> np.ndarray:
        """Like ``get``, and the ids found are removed (a repeated id is found once)."""
        keys = np.asarray(keys, np.uint64)
        out = np.full(len(keys), -1, np.int64)
        order, sk = _sorted_query(keys)
        for rk, rl in self._runs:
            pos, hit = _search(rk, rl, sk)
            at = np.flatnonzero(hit)
            if not len(at):
                continue
            p = pos[at]  # ascending: the query is sorted
            again = np.zeros(len(p), dtype=bool)
            np.equal(p[1:], p[:-1], out=again[1:])
            if again.any():  # the same id asked for twice: found once (its first place)
                at, p = at[~again], p[~again]
            idx = order[at]
            out[idx] = rl[p]
            rl[p] = -1
            self._live -= len(idx)
            self._removed += len(idx)
        if self._removed > max(self._live, self.compact_min):
            self._runs = [_merge_runs(self._runs)] if self._runs else []
            self._removed = 0
        return out

    def keys(self) -> np.ndarray:
        """Every live id."""
        parts = [rk[rl >= 0] for rk, rl in self._runs]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def _sorted_query(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, keys[order])``, the ids sorted (stable: a repeated id's first place first).
    Binary searches of sorted ids into a sorted run walk it forwards: 64 K random ids in a 1 M
    run took 12.4 ms unsorted, 2.2 ms sorted (plus 4 ms for the sort, once per call)."""
    order = np.argsort(keys, kind="stable")
    return order, keys[order]


def _search(rk: np.ndarray, rl: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the run, found mask) of ``keys`` in the sorted run ``rk``."""
    if not len(rk):
        return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
    pos = np.minimum(np.searchsorted(rk, keys), len(rk) - 1)
    return pos, (rk[pos] == keys) & (rl[pos] >= 0)


def _merge_runs(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([rk for rk, _ in runs])
    locs = np.concatenate([rl for _, rl in runs])
    live = locs >= 0
    if not live.all():
        keys, locs = keys[live], locs[live]
    order = np.argsort(keys, kind="stable")  # sorted runs back to back: timsort merges them
    return keys[order], locs[order]


class MemoryStorage(Storage):
    """Records kept in this process: the persisted ``RecordBatch`` objects themselves plus one
    ``(batch, row)`` reference per record in a compact index (``_IdIndex``, 16 bytes), and the
    rows' metadata as numpy columns per batch (a constant column costs nothing) and a live flag:
    ~33 bytes per record besides the payload. A batch mostly completed is rewritten with its live
    rows (records keep their ``(batch, first row)`` location in the index). Lost with the
    process (use :class:`SQLiteStorage` for durability).

    >>> import numpy as np, pyarrow as pa
    >>> s = MemoryStorage()
    >>> s.persist(pa.record_batch({"x": [1]}), RecordMeta.new(np.array([7], dtype=np.uint64)))
    >>> len(s)
    1
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._chunks: dict[int, _Chunk] = {}
        self._loc = _IdIndex()  # src id -> chunk number << 32 | row
        self._next_chunk = 0
        self._dead: list[pa.Table] = []

    def __len__(self) -> int:
        return len(self._loc)

    def persist(
        self,
        batch: pa.RecordBatch,
        meta: RecordMeta,
        progress: tuple[int, int, int] | None = None,
        known_epoch: int | None = None,
    ) -> None:
        n = len(meta)
        _check_batch(batch, n)
        if n == 0:
            return
        with self._lock:
            self._note_progress(progress)
            no = self._next_chunk
            self._next_chunk += 1
            self._chunks[no] = _Chunk(batch, meta)
            locs = np.arange(n, dtype=np.int64) + (no << _ROW_BITS)
            self._loc.add(meta.src, locs)
            if known_epoch is not None:
                self.known_keys.add(known_epoch, meta.src, fresh=True)

    def _locate(self, src_ids: np.ndarray, *, pop: bool) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, locations of the found ones)."""
        locs = self._loc.pop(src_ids) if pop else self._loc.get(src_ids)
        found = locs >= 0
        return found, locs[found]

    def _release(self, locs: np.ndarray) -> None:
        chunk_nos = locs >> _ROW_BITS
        for no in _distinct(chunk_nos)[0].tolist():
            chunk = self._chunks[no]
            chunk.release(locs[chunk_nos == no] & _ROW_MASK)
            if chunk.live <= 0:
                del self._chunks[no]
            elif chunk.wasteful():
                chunk.compact()

    def delete(self, src_ids: np.ndarray) -> int:
        with self._lock:
            _, locs = self._locate(src_ids, pop=True)
            self._release(locs)
            return len(locs)

    def _meta_at(self, src: np.ndarray, locs: np.ndarray) -> RecordMeta:
        cols: dict[str, list[np.ndarray]] = {f: [] for f in _META_FIELDS[1:]}
        chunk_nos = locs >> _ROW_BITS
        order = np.argsort(chunk_nos, kind="stable")
        sorted_nos = chunk_nos[order]
        cuts = np.flatnonzero(np.diff(sorted_nos)) + 1
        for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
            if start == stop:
                continue
            chunk = self._chunks[int(sorted_nos[start])]
            rows = chunk.position(locs[order[start:stop]] & _ROW_MASK)
            for f in cols:
                cols[f].append(getattr(chunk, f)[rows])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        out = {
            f: (
                np.concatenate(v)[inverse]
                if v
                else np.empty(0, getattr(RecordMeta.empty(), f).dtype)
            )
            for f, v in cols.items()
        }
        return RecordMeta(src=src, **out)

    def lookup(self, src_ids: np.ndarray) -> RecordMeta:
        with self._lock:
            found, locs = self._locate(src_ids, pop=False)
            return self._meta_at(src_ids[found], locs)

    def renew(self, old_ids: np.ndarray, new_ids: np.ndarray, *, next_attempt: bool = True) -> None:
        if len(old_ids) != len(new_ids):
            raise ValueError("old_ids and new_ids must have the same length")
        with self._lock:
            found, locs = self._locate(old_ids, pop=True)
            if not found.all():
                # put back what was taken: a failed call changes nothing
                self._loc.add(old_ids[found], locs)
                raise ValueError("renew: some old_ids are not stored")
            self._loc.add(new_ids, locs)
            chunk_nos = locs >> _ROW_BITS
            for no in _distinct(chunk_nos)[0].tolist():
                chunk = self._chunks[no]
                rows = chunk.position(locs[chunk_nos == no] & _ROW_MASK)
                if next_attempt:
                    chunk.attempt[rows] += 1

    def fetch(self, src_ids: np.ndarray) -> tuple[pa.Table, RecordMeta]:
        with self._lock:
            found, locs = self._locate(src_ids, pop=False)
            meta = self._meta_at(src_ids[found], locs)
            if not len(locs):
                return pa.table({}), meta
            nos = _distinct(locs >> _ROW_BITS)[0].tolist()
            batches = {no: self._chunks[no].batch for no in nos}
            return _gather(batches, locs >> _ROW_BITS, self._rows(locs), meta.src), meta

    def _rows(self, locs: np.ndarray) -> np.ndarray:
        """The rows the batches hold these locations at now (compacted batches moved them)."""
        nos = locs >> _ROW_BITS
        kept = {no: self._chunks[no].kept for no in _distinct(nos)[0].tolist()}
        return _positions(nos, locs & _ROW_MASK, kept)

    def stored_ids(self) -> np.ndarray:
        with self._lock:
            return self._loc.keys()

    def dead_letter(self, src_ids: np.ndarray, reason: str) -> None:
        if not len(src_ids):
            return
        with self._lock:
            found, locs = self._locate(src_ids, pop=False)
            if not len(locs):
                return
            meta = self._meta_at(src_ids[found], locs)
            batches = {
                no: self._chunks[no].batch for no in _distinct(locs >> _ROW_BITS)[0].tolist()
            }
            self._dead.extend(
                _dead_letter_table(payload, meta.take(pos), reason)
                for pos, payload in _gather_groups(batches, locs >> _ROW_BITS, self._rows(locs))
            )
            _, locs = self._locate(meta.src, pop=True)
            self._release(locs)

    def dead_letters(self, source: int | None = None) -> pa.Table:
        with self._lock:
            return _dead_letters_of(list(self._dead), source)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# SQLiteStorage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS xorack_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY, payload BLOB NOT NULL, meta BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    src INTEGER PRIMARY KEY, loc INTEGER NOT NULL, attempt INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letters (id INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY, what TEXT NOT NULL, reason TEXT NOT NULL,
    payload BLOB, meta BLOB, records TEXT);
CREATE TABLE IF NOT EXISTS progress (
    source INTEGER NOT NULL, part INTEGER NOT NULL, rows INTEGER NOT NULL,
    PRIMARY KEY (source, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ended (src INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS restarts (origin INTEGER PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS in_flight (origin INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS known (
    id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, ids BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letter_repairs (
    origin INTEGER PRIMARY KEY, repair TEXT NOT NULL, at TEXT NOT NULL, outcome TEXT NOT NULL,
    again INTEGER);
"""
#: The columns each table must have (a file with other tables of these names is not ours).
_TABLES = {
    "xorack_meta": ["key", "value"],
    "batches": ["id", "payload", "meta"],
    "records": ["src", "loc", "attempt"],
    "dead_letters": ["id", "payload"],
    "quarantine": ["id", "what", "reason", "payload", "meta", "records"],
    "progress": ["source", "part", "rows"],
    "ended": ["src"],
    "restarts": ["origin", "n"],
    "in_flight": ["origin"],
    "known": ["id", "epoch", "ids"],
    "dead_letter_repairs": ["origin", "repair", "at", "outcome", "again"],
}
_MARK = "mark:"  # the job's marks live in xorack_meta under this prefix
_META_TYPES = [("key_hash", pa.int32()), ("source", pa.int32()), ("partition", pa.int32())]
_META_TYPES += [("origin", pa.uint64()), ("origin_rec", pa.uint64())]
#: The metadata columns of a batch written before ft-3 (no origin_rec: read as 0, unknown).
_FT2_META_TYPES = _META_TYPES[:-1]
#: The column a batch's metadata has after origin_rec when some of its records have an event
#: time (from ft-4; absent: none of them has one, so a job without event times stores nothing).
_EVENT_TIME_TYPE = ("event_time", pa.int64())
_KEPT_TYPE = ("row", pa.uint32())  # the last metadata column of a compacted batch
#: Every metadata layout a stored batch may have (a compacted batch: + _KEPT_TYPE).
_META_LAYOUTS = [_FT2_META_TYPES, _META_TYPES, [*_META_TYPES, _EVENT_TIME_TYPE]]
# ft-2: a compacted batch's meta blob has one more column (the first row numbers of the rows it
# holds). ft-3: the meta blob has an origin_rec column after origin (the record id of the
# record's first attempt). ft-4: it may have an event_time column after origin_rec (code of
# ft-3 would take such a batch for a corrupt one and quarantine its records). An older file is
# read as is (its batches keep their older meta blobs; a batch rewritten by compaction gets the
# new layout) and marked ft-4 when opened; code that knows only an older format then refuses
# the file instead of misreading it.
_FORMAT = "xorack-ft-4"
_OLDER_FORMATS = ("xorack-ft-1", "xorack-ft-2", "xorack-ft-3")
_BATCH_CACHE = 32  # decoded batches kept for replays (most replays are of recent batches)
_MIN_SQLITE = (3, 35, 0)
# Blobs no record refers to are dropped by a scan of the record table once as many records were
# removed as are left (at least this many): O(1) per record, and deletes stay one plain
# statement per id (~1.5x faster than tracking a live count per batch).
_GC_MIN_ROWS = 65536


def _i64(ids: np.ndarray) -> list[int]:
    """uint64 ids as the signed 64-bit integers SQLite stores (same bits)."""
    return ids.view(np.int64).tolist()


def _opt_i64(v: int | None) -> int | None:
    """An optional uint64 id as SQLite stores it (signed, same bits)."""
    return None if v is None else _i64(np.array([v], np.uint64))[0]


def _ipc_bytes(table: pa.Table | pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return sink.getvalue().to_pybytes()


def _read_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], table.schema)


class _StoredBatch:
    """A persisted batch as read back: the payload and its rows' immutable metadata."""

    __slots__ = (
        "event_time",
        "kept",
        "key_hash",
        "origin",
        "origin_rec",
        "partition",
        "payload",
        "source",
    )

    def __init__(self, payload: pa.RecordBatch, meta: pa.RecordBatch) -> None:
        names = meta.schema.names
        self.payload = payload
        self.key_hash = meta.column("key_hash").to_numpy()
        self.source = meta.column("source").to_numpy()
        self.partition = meta.column("partition").to_numpy()
        self.origin = meta.column("origin").to_numpy()
        self.origin_rec = (  # absent from a batch stored before ft-3: unknown
            meta.column("origin_rec").to_numpy()
            if "origin_rec" in names
            else np.zeros(meta.num_rows, np.uint64)
        )
        self.event_time = (  # absent: none of its records has one (or stored before ft-4)
            meta.column("event_time").to_numpy()
            if "event_time" in names
            else _no_event_times(meta.num_rows)
        )
        # a compacted batch: the first row numbers of the rows it holds (records keep theirs)
        kept = meta.column("row").to_numpy().astype(np.int64) if "row" in names else None
        self.kept: np.ndarray | None = kept

    def position(self, rows: np.ndarray) -> np.ndarray:
        """Where the rows first stored at ``rows`` are held now."""
        return rows if self.kept is None else np.searchsorted(self.kept, rows)

    def compacted(self, rows: np.ndarray) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """(payload, metadata) of a batch holding only the rows first stored at ``rows``
        (ascending): the metadata gains their first row numbers (column ``row``)."""
        at = self.position(rows)
        meta = _meta_columns(
            self.key_hash[at],
            self.source[at],
            self.partition[at],
            self.origin[at],
            self.origin_rec[at],
            self.event_time[at],
        )
        meta.append(("row", pa.array(rows, pa.uint32())))
        names, arrays = zip(*meta, strict=True)
        return self.payload.take(pa.array(at)), pa.record_batch(list(arrays), names=list(names))


def _check_stored_batch(payload: bytes, meta: bytes) -> range | frozenset[int]:
    """The first row numbers held by a stored batch whose blobs decode into a payload with at
    least one column and the metadata columns of as many rows (one of ``_META_LAYOUTS``; a
    compacted batch: one more, ascending), without nulls; an exception (of any type: the blobs
    are untrusted bytes) otherwise."""
    if not isinstance(payload, bytes) or not isinstance(meta, bytes):
        raise TypeError("the batch's blobs are not BLOBs")
    p = _read_ipc(payload)
    m = _read_ipc(meta)
    if not p.num_columns:
        raise ValueError("the payload has no columns")
    got = [(f.name, f.type) for f in m.schema]
    layouts = _META_LAYOUTS
    if got not in [*layouts, *([*t, _KEPT_TYPE] for t in layouts)]:
        raise ValueError(f"the metadata columns are {got}, expected {_META_TYPES}")
    if m.num_rows != p.num_rows:
        raise ValueError(f"{p.num_rows} payload rows but {m.num_rows} metadata rows")
    if any(c.null_count for c in m.columns):
        raise ValueError("the metadata has nulls")
    p.validate(full=True)
    if got[-1] != _KEPT_TYPE:
        return range(p.num_rows)
    kept = m.column("row").to_numpy().astype(np.int64)
    if len(kept) > 1 and not (np.diff(kept) > 0).all():
        raise ValueError("the compacted batch's row numbers are not ascending")
    return frozenset(kept.tolist())


def _meta_columns(
    key_hash: np.ndarray,
    source: np.ndarray,
    partition: np.ndarray,
    origin: np.ndarray,
    origin_rec: np.ndarray,
    event_time: np.ndarray,
) -> list[tuple[str, pa.Array]]:
    """The metadata columns of a stored batch (``event_time`` only when a record has one)."""
    cols = [
        ("key_hash", pa.array(key_hash, pa.int32())),
        ("source", pa.array(source, pa.int32())),
        ("partition", pa.array(partition, pa.int32())),
        ("origin", pa.array(origin, pa.uint64())),
        ("origin_rec", pa.array(origin_rec, pa.uint64())),
    ]
    if _has_event_times(event_time):
        cols.append(("event_time", pa.array(event_time, pa.int64())))
    return cols


def _meta_batch(meta: RecordMeta) -> pa.RecordBatch:
    names, arrays = zip(
        *_meta_columns(
            meta.key_hash,
            meta.source,
            meta.partition,
            meta.origin,
            meta.origin_rec,
            meta.event_time,
        ),
        strict=True,
    )
    return pa.record_batch(list(arrays), names=list(names))


class SQLiteStorage(Storage):
    """Durable records in one SQLite file (WAL mode): each persisted batch once, as Arrow IPC
    blobs (the payload, and the rows' key hash, source, partition, origin, origin record id
    and, when some have one, event time), plus one narrow
    row per record (source id, batch and row, attempt); each call is one transaction. A process
    killed at any moment loses nothing a call had returned for (``synchronous="NORMAL"``
    survives a killed process; ``"FULL"`` survives a power loss too). A batch's blobs are
    dropped once no record refers to them (see :meth:`compact`).

    ``max_bytes`` caps the file size (a quota): a persist beyond it raises StorageError and
    leaves the records stored before. ``busy_timeout``: seconds to wait for another process's
    lock on the file before a call fails with StorageError.

    >>> import numpy as np, pyarrow as pa, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ft.db")
    >>> with SQLiteStorage(path) as s:
    ...     s.persist(pa.record_batch({"x": [1]}), RecordMeta.new(np.array([7], dtype=np.uint64)))
    >>> len(SQLiteStorage(path))
    1
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        max_bytes: int | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        if not isinstance(synchronous, str) or synchronous.upper() not in (
            "OFF",
            "NORMAL",
            "FULL",
            "EXTRA",
        ):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}")
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StorageError(
                f"SQLiteStorage needs SQLite >= 3.35 (this Python has {sqlite3.sqlite_version})"
            )
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._cache: OrderedDict[int, _StoredBatch] = OrderedDict()
        self._db: sqlite3.Connection | None = None
        self._removed_since_gc = 0
        self._batch_rows: dict[int, int] = {}  # rows of each stored batch, once known
        lock_file = self.path + ".lock"
        lock_existed = os.path.lexists(lock_file)
        self._owner = _own_file(self.path, busy_timeout)
        try:
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.execute("PRAGMA temp_store=MEMORY")
            self._db.executescript(_SCHEMA)
            self._db.execute("CREATE TEMP TABLE IF NOT EXISTS ids (src INTEGER PRIMARY KEY)")
            row = self._db.execute("SELECT value FROM xorack_meta WHERE key='format'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO xorack_meta VALUES ('format', ?)", (_FORMAT,))
            elif row[0] in _OLDER_FORMATS:
                self._db.execute("UPDATE xorack_meta SET value = ? WHERE key='format'", (_FORMAT,))
            elif row[0] != _FORMAT:
                raise StorageError(f"{self.path}: unsupported storage format {row[0]!r}")
            if max_bytes is not None:
                page = self._db.execute("PRAGMA page_size").fetchone()[0]
                self._db.execute(f"PRAGMA max_page_count={max(1, int(max_bytes) // page)}")
            self._check_tables()
            self._drop_unreferenced()
            self._quarantine_corrupt()
            self._load_known()
            (self._count,) = self._db.execute("SELECT count(*) FROM records").fetchone()
            (self._next_batch,) = self._db.execute(
                "SELECT coalesce(max(id), 0) + 1 FROM batches"
            ).fetchone()
        except BaseException as exc:
            if self._db is not None:
                self._db.close()
            if self._owner is not None and not lock_existed:  # a failed open leaves no lock file
                with contextlib.suppress(OSError):
                    os.unlink(lock_file)
            owner, self._owner = self._owner, None
            _release_file(owner)
            if isinstance(exc, StorageError) or not isinstance(exc, Exception):
                raise
            raise StorageError(
                f"cannot open SQLite storage {self.path!r}: {type(exc).__name__}: {exc}"
            ) from exc

    @property
    def _con(self) -> sqlite3.Connection:
        # The open connection, for code that runs while the storage is open (at open, and in
        # _transaction, which checks it); typed without the None that close() leaves.
        assert self._db is not None
        return self._db

    def _check_tables(self) -> None:
        for table, columns in _TABLES.items():
            got = [r[1] for r in self._con.execute(f"PRAGMA table_info({table})").fetchall()]
            if got != columns:
                raise StorageError(
                    f"{self.path}: not an xorack storage file (table {table} has columns "
                    f"{got}, expected {columns}); give the FT layer its own file"
                )

    def _quarantine_corrupt(self) -> None:
        """Check every stored batch and record once, at open; move the corrupt ones (a blob
        that does not decode, a record row that is not integers or points at no row) into the
        ``quarantine`` table, where they stay for a human to look at, and note them in
        ``quarantined`` / ``quarantine_notes``. The healthy records are recovered as usual."""
        db = self._con
        good_rows: dict[int, range | frozenset[int]] = {}
        corrupt: list[tuple[int, str]] = []
        for no, payload, meta in db.execute("SELECT id, payload, meta FROM batches"):
            try:
                good_rows[int(no)] = _check_stored_batch(payload, meta)
            except Exception as exc:  # any decoding failure: the blob is corrupt
                corrupt.append((int(no), f"{type(exc).__name__}: {exc}"[:300]))
        corrupt_nos = {no for no, _ in corrupt}
        rows = db.execute(
            "SELECT src, loc, attempt, typeof(loc) = 'integer' AND typeof(attempt) = 'integer' "
            "AND attempt >= 1 FROM records"
        ).fetchall()
        bad_records: dict[str, list[int]] = {}
        for src, loc, _attempt, typed in rows:
            if not typed:
                reason = "record row with a non-integer location or attempt"
            elif (loc >> _ROW_BITS) in good_rows:
                if loc >= 0 and (loc & _ROW_MASK) in good_rows[loc >> _ROW_BITS]:
                    continue
                reason = "record row points past the end of its batch"
            elif loc >> _ROW_BITS in corrupt_nos:
                continue  # quarantined with its batch below
            else:
                reason = "record row points at a missing batch"
            bad_records.setdefault(reason, []).append(int(src))
        if not corrupt and not bad_records:
            return
        moved = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            for no, reason in corrupt:
                srcs = [
                    r[0]
                    for r in db.execute(
                        f"SELECT src FROM records WHERE loc >> {_ROW_BITS} = ?", (no,)
                    ).fetchall()
                ]
                db.execute(
                    "INSERT INTO quarantine (what, reason, payload, meta, records) "
                    "SELECT ?, ?, payload, meta, ? FROM batches WHERE id = ?",
                    (f"batch {no}", reason, json.dumps(srcs), no),
                )
                db.execute("DELETE FROM batches WHERE id = ?", (no,))
                db.execute(f"DELETE FROM records WHERE loc >> {_ROW_BITS} = ?", (no,))
                self.quarantine_notes.append(f"batch {no} ({len(srcs)} records): {reason}")
                moved += len(srcs)
            for reason, srcs in bad_records.items():
                db.execute(
                    "INSERT INTO quarantine (what, reason, records) VALUES ('records', ?, ?)",
                    (reason, json.dumps(srcs)),
                )
                db.executemany("DELETE FROM records WHERE src = ?", zip(srcs))
                self.quarantine_notes.append(f"{len(srcs)} records: {reason}")
                moved += len(srcs)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self.quarantined += moved
        log.warning(
            "xorack storage %s: %d corrupt record(s) moved to its quarantine table: %s",
            self.path,
            moved,
            "; ".join(self.quarantine_notes),
        )

    def __len__(self) -> int:
        return self._count

    # One transaction per call; an sqlite error rolls it back and becomes a StorageError.
    def _transaction(self, what: str, fn: Any, *args: Any) -> Any:
        with self._lock:
            if self._db is None:
                raise StorageError(f"SQLite storage {self.path!r} is closed")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(*args)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # SQLite may have rolled back already (FULL)
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                self._cache.clear()
                raise StorageError(
                    f"SQLite storage {self.path!r}: {what} failed ({exc}); records stored before "
                    "are kept"
                ) from exc
            return result

    def _load_ids(self, src_ids: np.ndarray) -> None:
        self._con.execute("DELETE FROM temp.ids")
        # in key order: B-tree inserts and the lookups that follow touch pages in order (~1.6x)
        ids = np.sort(src_ids.view(np.int64)).tolist()
        self._con.executemany("INSERT OR IGNORE INTO temp.ids VALUES (?)", zip(ids))

    def persist(
        self,
        batch: pa.RecordBatch,
        meta: RecordMeta,
        progress: tuple[int, int, int] | None = None,
        known_epoch: int | None = None,
    ) -> None:
        n = len(meta)
        _check_batch(batch, n)
        if n == 0:
            return
        meta_batch = _meta_batch(meta)

        def run() -> int:
            if known_epoch is not None:  # one blob of 8 bytes an id, with the records
                self._con.execute(
                    "INSERT INTO known (epoch, ids) VALUES (?, ?)",
                    (int(known_epoch), np.sort(meta.src).astype("<u8").tobytes()),
                )
            if progress is not None:  # in the persist's transaction: both or neither
                self._con.execute(
                    "INSERT INTO progress VALUES (?, ?, ?) ON CONFLICT (source, part) "
                    "DO UPDATE SET rows = max(rows, excluded.rows)",
                    tuple(int(v) for v in progress),
                )
            no = self._next_batch
            self._con.execute(
                "INSERT INTO batches VALUES (?, ?, ?)",
                (no, _ipc_bytes(batch), _ipc_bytes(meta_batch)),
            )
            keys = meta.src.view(np.int64)
            order = np.argsort(keys)  # key order: the B-tree inserts touch pages in order
            locs = order + (no << _ROW_BITS)
            self._con.executemany(
                "INSERT INTO records VALUES (?, ?, ?)",
                zip(keys[order].tolist(), locs.tolist(), meta.attempt[order].tolist(), strict=True),
            )
            return no

        no = self._transaction("persist", run)
        self._next_batch = no + 1
        self._count += n
        self._batch_rows[no] = n
        self._cache_put(no, _StoredBatch(batch, meta_batch))
        if known_epoch is not None:
            self.known_keys.add(known_epoch, meta.src, fresh=True)

    def forget_known(self, through_epoch: int) -> int:
        self._transaction(
            "forgetting known ids",
            lambda: self._con.execute("DELETE FROM known WHERE epoch <= ?", (int(through_epoch),)),
        )
        return self.known_keys.forget(through_epoch)

    def note_in_flight(self, origins: np.ndarray) -> None:
        if not len(origins):
            return
        keys = _i64(np.asarray(origins, np.uint64))
        self._transaction(
            "noting records in flight",
            lambda: self._con.executemany("INSERT OR IGNORE INTO in_flight VALUES (?)", zip(keys)),
        )

    def take_in_flight(self) -> np.ndarray:
        def run() -> list[tuple[int]]:
            rows = self._con.execute("SELECT origin FROM in_flight").fetchall()
            self._con.execute("DELETE FROM in_flight")
            return rows

        rows = self._transaction("taking records in flight", run)
        return np.array(rows, dtype=np.int64).reshape(-1).view(np.uint64)

    def count_restarts(self, origins: np.ndarray) -> np.ndarray:
        if not len(origins):
            return np.empty(0, np.int64)
        keys = _i64(np.asarray(origins, np.uint64))

        def run() -> np.ndarray:
            self._con.executemany(
                "INSERT INTO restarts VALUES (?, 1) ON CONFLICT (origin) DO UPDATE SET n = n + 1",
                zip(keys),
            )
            self._load_ids(np.asarray(origins, np.uint64))
            rows = dict(
                self._con.execute(
                    "SELECT r.origin, r.n FROM restarts r JOIN temp.ids i ON r.origin = i.src"
                ).fetchall()
            )
            return np.array([rows[k] for k in keys], np.int64)

        out: np.ndarray = self._transaction("counting restarts", run)
        return out

    def _load_known(self) -> None:
        for epoch, blob in self._con.execute("SELECT epoch, ids FROM known ORDER BY id"):
            self.known_keys.add(epoch, np.frombuffer(blob, dtype="<u8").astype(np.uint64))

    def _remove(self, src_ids: np.ndarray) -> int:
        """Delete these records (in key order: B-tree pages are visited in order)."""
        ids = np.sort(src_ids.view(np.int64)).tolist()
        removed = self._con.executemany("DELETE FROM records WHERE src = ?", zip(ids)).rowcount
        self._removed_since_gc += removed
        if self._removed_since_gc >= max(_GC_MIN_ROWS, self._count - removed):
            self._rewrite_sparse_batches()
            self._drop_unreferenced()
        return removed

    def _drop_unreferenced(self) -> None:
        self._con.execute(
            f"DELETE FROM batches WHERE id NOT IN (SELECT DISTINCT loc >> {_ROW_BITS} FROM records)"
        )
        self._removed_since_gc = 0

    def _rewrite_sparse_batches(self) -> None:
        """Rewrite every sparse batch (``_sparse``) with its live rows only, so that a pending
        record does not keep its whole batch. Runs with the unreferenced-blob sweep (when as
        many records were removed as are left): two scans of the record table in SQLite, Python
        work only for the rows moved; each row is copied O(1) times over its life."""
        counts = self._con.execute(
            f"SELECT loc >> {_ROW_BITS}, count(*) FROM records GROUP BY 1"
        ).fetchall()
        live = dict(counts)
        for no in [no for no in self._batch_rows if no not in live]:
            del self._batch_rows[no]
        sparse = []
        for no, n in live.items():
            rows = self._batch_rows.get(no)
            if rows is None:  # stored before this process opened the file
                rows = self._batch_rows[no] = self._batches([no])[no].payload.num_rows
            if _sparse(n, rows):
                sparse.append(no)
        for at in range(0, len(sparse), 500):
            part = sparse[at : at + 500]
            found = self._con.execute(
                f"SELECT loc FROM records WHERE loc >> {_ROW_BITS} "
                f"IN ({','.join('?' * len(part))}) ORDER BY loc",
                part,
            ).fetchall()
            locs = np.array(found, dtype=np.int64).reshape(-1)
            nos = locs >> _ROW_BITS
            bounds = np.r_[0, np.flatnonzero(np.diff(nos)) + 1, len(locs)].tolist()
            for start, stop in itertools.pairwise(bounds):
                if start < stop:
                    self._rewrite_batch(int(nos[start]), locs[start:stop] & _ROW_MASK)

    def _rewrite_batch(self, no: int, rows: np.ndarray) -> None:
        """Rewrite batch ``no`` in place with only the rows first stored at ``rows`` (its live
        records, ascending); the records keep their locations (inside the caller's
        transaction)."""
        payload, meta_batch = self._batches([no])[no].compacted(rows)
        self._con.execute(
            "UPDATE batches SET payload = ?, meta = ? WHERE id = ?",
            (_ipc_bytes(payload), _ipc_bytes(meta_batch), no),
        )
        self._batch_rows[no] = len(rows)
        self._cache_put(no, _StoredBatch(payload, meta_batch))

    def compact(self) -> None:
        """Rewrite the sparse batches (at most a quarter of their rows still stored) with their
        live rows only, and drop the payload blobs no stored record refers to any more (this
        also happens on its own after enough deletes; unreferenced blobs are also dropped when
        the file is opened). Freed pages are reused by later writes (the file does not shrink)."""

        def run() -> None:
            self._rewrite_sparse_batches()
            self._drop_unreferenced()

        self._transaction("compact", run)

    def delete(self, src_ids: np.ndarray) -> int:
        if not len(src_ids):
            return 0
        removed = self._transaction("delete", self._remove, src_ids)
        self._count -= removed
        return removed

    def _select(self, src_ids: np.ndarray) -> tuple[RecordMeta, np.ndarray]:
        """(meta, locations) of the stored ones among ``src_ids``, in ``src_ids`` order."""
        self._load_ids(src_ids)
        rows = self._con.execute(
            "SELECT src, loc, attempt FROM records WHERE src IN (SELECT src FROM temp.ids)"
        ).fetchall()
        if not rows:
            return RecordMeta.empty(), np.empty(0, np.int64)
        a = np.array(rows, dtype=np.int64)
        a = a[np.argsort(a[:, 0], kind="stable")]
        want = src_ids.view(np.int64)
        at = np.minimum(np.searchsorted(a[:, 0], want), len(a) - 1)
        a = a[at[a[at, 0] == want]]  # back in src_ids order, absent ids left out
        locs = a[:, 1].copy()
        nos = locs >> _ROW_BITS
        rows_ = locs & _ROW_MASK  # as first stored: each batch's position() finds them now
        batches = self._batches(_distinct(nos)[0].tolist())
        cols = {f: np.empty(len(a), getattr(RecordMeta.empty(), f).dtype) for f in _META_FIELDS[1:]}
        for no, b in batches.items():
            mine = nos == no
            r = b.position(rows_[mine])
            cols["key_hash"][mine] = b.key_hash[r]
            cols["source"][mine] = b.source[r]
            cols["partition"][mine] = b.partition[r]
            cols["origin"][mine] = b.origin[r]
            cols["origin_rec"][mine] = b.origin_rec[r]
            cols["event_time"][mine] = b.event_time[r]
        cols["attempt"] = a[:, 2].astype(np.int32)
        return RecordMeta(src=a[:, 0].view(np.uint64).copy(), **cols), locs

    def lookup(self, src_ids: np.ndarray) -> RecordMeta:
        if not len(src_ids):
            return RecordMeta.empty()
        return self._transaction("lookup", lambda: self._select(src_ids)[0])

    def renew(self, old_ids: np.ndarray, new_ids: np.ndarray, *, next_attempt: bool = True) -> None:
        if len(old_ids) != len(new_ids):
            raise ValueError("old_ids and new_ids must have the same length")
        if not len(old_ids):
            return
        step = 1 if next_attempt else 0

        def run() -> None:
            cur = self._con.executemany(
                f"UPDATE records SET src = ?, attempt = attempt + {step} WHERE src = ?",
                zip(_i64(new_ids), _i64(old_ids), strict=True),
            )
            if cur.rowcount != len(old_ids):
                raise _Abort("renew: some old_ids are not stored")
            self._note_ended(old_ids)

        try:
            self._transaction("renew", run)
        except _Abort as exc:
            raise ValueError(str(exc)) from None

    def _cache_put(self, no: int, batch: _StoredBatch) -> None:
        self._cache[no] = batch
        self._cache.move_to_end(no)
        while len(self._cache) > _BATCH_CACHE:
            self._cache.popitem(last=False)

    def _batches(self, nos: list[int]) -> dict[int, _StoredBatch]:
        out = {}
        for no in nos:
            b = self._cache.get(no)
            if b is None:
                row = self._con.execute(
                    "SELECT payload, meta FROM batches WHERE id = ?", (no,)
                ).fetchone()
                if row is None:
                    raise StorageError(
                        f"SQLite storage {self.path!r} is corrupt: batch {no} is missing "
                        "(reopen the storage: corrupt records are quarantined at open)"
                    )
                try:
                    b = _StoredBatch(_one_batch(_read_ipc(row[0])), _one_batch(_read_ipc(row[1])))
                except Exception as exc:
                    raise StorageError(
                        f"SQLite storage {self.path!r} is corrupt: batch {no} does not decode "
                        f"({type(exc).__name__}: {exc}); reopen the storage: corrupt records "
                        "are quarantined at open"
                    ) from exc
                self._cache_put(no, b)
            out[no] = b
        return out

    def _held(self, locs: np.ndarray) -> tuple[dict[int, pa.RecordBatch], np.ndarray, np.ndarray]:
        """(payload per batch, batch numbers, rows held now) of these locations."""
        nos = locs >> _ROW_BITS
        stored = self._batches(_distinct(nos)[0].tolist())
        rows = _positions(nos, locs & _ROW_MASK, {no: b.kept for no, b in stored.items()})
        return {no: b.payload for no, b in stored.items()}, nos, rows

    def _payload_groups(self, locs: np.ndarray) -> list[tuple[np.ndarray, pa.Table]]:
        return _gather_groups(*self._held(locs))

    def _payload(self, locs: np.ndarray, src: np.ndarray) -> pa.Table:
        return _gather(*self._held(locs), src)

    def fetch(self, src_ids: np.ndarray) -> tuple[pa.Table, RecordMeta]:
        if not len(src_ids):
            return pa.table({}), RecordMeta.empty()

        def run() -> tuple[pa.Table, RecordMeta]:
            meta, locs = self._select(src_ids)
            if not len(meta):
                return pa.table({}), meta
            return self._payload(locs, meta.src), meta

        return self._transaction("fetch", run)

    def stored_ids(self) -> np.ndarray:
        def run() -> np.ndarray:
            rows = self._con.execute("SELECT src FROM records").fetchall()
            return np.array(rows, dtype=np.int64).reshape(-1).view(np.uint64)

        return self._transaction("listing pending records", run)

    def dead_letter(self, src_ids: np.ndarray, reason: str) -> None:
        if not len(src_ids):
            return

        def run() -> int:
            meta, locs = self._select(src_ids)
            if not len(meta):
                return 0
            for pos, payload in self._payload_groups(locs):  # one table per payload schema
                table = _dead_letter_table(payload, meta.take(pos), reason)
                self._con.execute(
                    "INSERT INTO dead_letters (payload) VALUES (?)", (_ipc_bytes(table),)
                )
            self._note_ended(meta.src)
            return self._remove(meta.src)

        self._count -= self._transaction("dead_letter", run)

    def dead_letters(self, source: int | None = None) -> pa.Table:
        def run() -> list[pa.Table]:
            tables = []
            for no, blob in self._con.execute(
                "SELECT id, payload FROM dead_letters ORDER BY id"
            ).fetchall():
                try:
                    tables.append(_read_ipc(blob))
                except Exception as exc:  # a corrupt blob: quarantined, the others returned
                    reason = f"{type(exc).__name__}: {exc}"[:300]
                    self._con.execute(
                        "INSERT INTO quarantine (what, reason, payload) VALUES (?, ?, ?)",
                        (f"dead letters {no}", reason, blob),
                    )
                    self._con.execute("DELETE FROM dead_letters WHERE id = ?", (no,))
                    self.quarantine_notes.append(f"dead letters {no}: {reason}")
                    log.warning(
                        "xorack storage %s: dead-letter blob %d is corrupt (%s): moved to its "
                        "quarantine table",
                        self.path,
                        no,
                        reason,
                    )
            return tables

        return _dead_letters_of(self._transaction("dead_letters", run), source)

    # ---- repairs of dead letters (xorack.spark.repair), durable

    def settle_repair(
        self,
        repair: str,
        at: str,
        outcomes: Sequence[tuple[int, str, int | None]],
        again: pa.Table | None,
        marks: Mapping[str, str | None],
    ) -> bool:
        """Record a repair of dead letters in one transaction: ``outcomes`` (origin id of a
        dead letter, ``"repaired"`` or ``"failed again"``, the origin id it was dead-lettered
        again under), the dead letters of the records that failed again (``again``, a
        dead-letter table) and the job's ``marks``. Only while the job's ``repairing`` mark
        names ``repair``: returns False (nothing written) when it does not (settled before)."""
        _check_job_update(marks, ())

        def run() -> bool:
            row = self._con.execute(
                "SELECT value FROM xorack_meta WHERE key = ?", (_MARK + "repairing",)
            ).fetchone()
            if row is None or row[0] != repair:
                return False
            self._con.executemany(
                "INSERT OR REPLACE INTO dead_letter_repairs VALUES (?, ?, ?, ?, ?)",
                [
                    (_i64(np.array([o], np.uint64))[0], repair, at, what, _opt_i64(new))
                    for o, what, new in outcomes
                ],
            )
            if again is not None and again.num_rows:
                self._con.execute(
                    "INSERT INTO dead_letters (payload) VALUES (?)", (_ipc_bytes(again),)
                )
            for k, v in marks.items():
                if v is None:
                    self._con.execute("DELETE FROM xorack_meta WHERE key = ?", (_MARK + k,))
                else:
                    self._con.execute(
                        "INSERT OR REPLACE INTO xorack_meta VALUES (?, ?)", (_MARK + k, v)
                    )
            return True

        done: bool = self._transaction("settling a repair", run)
        return done

    def repairs(self) -> pa.Table:
        """The repair log: per repaired dead letter (``origin``), the repair that ran it, when
        (``at``, ISO 8601 UTC), its ``outcome`` and the origin id it failed ``again`` under."""
        rows = self._transaction(
            "reading repairs",
            lambda: self._con.execute(
                "SELECT origin, repair, at, outcome, again FROM dead_letter_repairs ORDER BY origin"
            ).fetchall(),
        )
        cols = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
        u64 = [np.array(c, dtype=np.int64).view(np.uint64) for c in (cols[0],)]
        return pa.table(
            {
                "origin": pa.array(u64[0], pa.uint64()),
                "repair": pa.array(cols[1], pa.string()),
                "at": pa.array(cols[2], pa.string()),
                "outcome": pa.array(cols[3], pa.string()),
                "again": pa.array(
                    [None if v is None else int(np.int64(v).view(np.uint64)) for v in cols[4]],
                    pa.uint64(),
                ),
            }
        )

    # ---- the job's resume state, durable

    def _note_ended(self, src_ids: np.ndarray) -> None:
        ids = np.sort(np.asarray(src_ids, dtype=np.uint64).view(np.int64)).tolist()
        self._con.executemany("INSERT OR IGNORE INTO ended VALUES (?)", zip(ids))

    def progress(self) -> dict[int, dict[int, int]]:
        rows = self._transaction(
            "reading progress",
            lambda: self._con.execute("SELECT source, part, rows FROM progress").fetchall(),
        )
        out: dict[int, dict[int, int]] = {}
        for source, part, n in rows:
            out.setdefault(int(source), {})[int(part)] = int(n)
        return out

    def ended(self) -> np.ndarray:
        rows = self._transaction(
            "reading ended attempts",
            lambda: self._con.execute("SELECT src FROM ended").fetchall(),
        )
        return np.array(rows, dtype=np.int64).reshape(-1).view(np.uint64)

    def marks(self) -> dict[str, str]:
        rows = self._transaction(
            "reading marks",
            lambda: self._con.execute(
                "SELECT key, value FROM xorack_meta WHERE key LIKE 'mark:%'"
            ).fetchall(),
        )
        return {k[len(_MARK) :]: v for k, v in rows}

    def update_job(
        self, marks: Mapping[str, str | None] | None = None, clear: Sequence[str] = ()
    ) -> None:
        _check_job_update(marks, clear)

        def run() -> None:
            if "progress" in clear:
                self._con.execute("DELETE FROM progress")
            if "ended" in clear:
                self._con.execute("DELETE FROM ended")
            if "marks" in clear:
                self._con.execute("DELETE FROM xorack_meta WHERE key LIKE 'mark:%'")
            for k, v in (marks or {}).items():
                if v is None:
                    self._con.execute("DELETE FROM xorack_meta WHERE key = ?", (_MARK + k,))
                else:
                    self._con.execute(
                        "INSERT OR REPLACE INTO xorack_meta VALUES (?, ?)", (_MARK + k, v)
                    )

        self._transaction("updating the job state", run)

    def __del__(self) -> None:  # an unclosed, unreferenced storage gives its file back
        owner, self._owner = getattr(self, "_owner", None), None
        _release_file(owner)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error as exc:  # pragma: no cover - close rarely fails
                    raise StorageError(f"closing SQLite storage {self.path!r}: {exc}") from exc
                finally:
                    self._db = None
                    self._cache.clear()
                    owner, self._owner = self._owner, None
                    _release_file(owner)


def _own_file(path: str, timeout: float) -> tuple[int, list[int]] | None:
    """Make this storage the only one using the SQLite file ``path``: exclusive ``flock``s on
    ``<real path> + ".lock"`` (symbolic links resolved: a link to the file, or to a directory on
    its path, finds the same lock) and on a lock named by the file's device and inode in this
    user's temporary directory (a hard link to the file finds it too), held until close (the OS
    drops them when the process dies, so a restart after a crash gets them). Two FT layers on
    one file would each replay the other's pending records as "recovered" (duplicate replays,
    wrong counts): the second one waits up to ``timeout`` seconds for the first to close, then
    gets a StorageError. None where ``flock`` is not available, or for an in-memory database."""
    if path == ":memory:" or path.startswith("file:") or fcntl is None:
        return None
    path = os.path.realpath(path)  # the database itself, not the name it was opened by
    try:
        with contextlib.suppress(FileExistsError):  # an empty file is a new SQLite database
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
        st = os.stat(path)
        folder = os.path.join(tempfile.gettempdir(), f"xorack-locks-{os.getuid()}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        locks = [path + ".lock", os.path.join(folder, f"{st.st_dev}-{st.st_ino}.lock")]
    except OSError as exc:
        raise StorageError(f"cannot open SQLite storage {path!r}: {exc}") from exc
    fds: list[int] = []
    deadline = time.monotonic() + max(0.0, float(timeout))
    try:
        for lock in locks:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageError(f"cannot open SQLite storage {path!r}: {exc}") from exc
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    _HELD.add(fd)
                    break
                except OSError as exc:
                    if time.monotonic() >= deadline:
                        raise StorageError(
                            f"cannot open SQLite storage {path!r}: it is in use by another FT "
                            f"layer (lock {lock!r} held: {exc.strerror}); one storage file "
                            "serves one FT layer at a time (run one acker service and share it)"
                        ) from None
                    time.sleep(0.02)
    except BaseException:
        _release_file((os.getpid(), fds))
        raise
    return os.getpid(), fds


def _release_file(owner: tuple[int, list[int]] | None) -> None:
    """Close the lock descriptors (which drops the flocks) — in the process that took them
    only: a forked child closed its copies already, and the numbers may name other files
    there."""
    if owner is not None and owner[0] == os.getpid():
        for fd in owner[1]:
            _HELD.discard(fd)
            os.close(fd)


# Lock descriptors held by this process. A forked child drops its copies at once: a flock belongs
# to the open file, so a child that lives on would otherwise keep the file locked after the
# parent closed its storage.
_HELD: set[int] = set()


def _drop_inherited_locks() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


class _Abort(Exception):
    """Rolls a transaction back without it being a storage failure."""


def open_storage(spec: str | os.PathLike[str] | Storage) -> Storage:
    """A storage from its spec (a Storage object is returned as is):

    * ``"memory"``: :class:`MemoryStorage`;
    * a SQLite URL, SQLAlchemy's rule: what follows ``sqlite:///`` is the path, so
      ``"sqlite:///ft.db"`` is ``ft.db`` relative to the working directory and
      ``"sqlite:////var/lib/ft.db"`` (four slashes) is absolute;
    * a plain file path (``"/var/lib/ft.db"``, ``"./ft.db"``, ``"ft.sqlite"``, a ``Path``): a
      path with a directory separator or ending in ``.db``, ``.sqlite`` or ``.sqlite3``.

    >>> type(open_storage("memory")).__name__
    'MemoryStorage'
    >>> storage_path("sqlite:///data/ft.db"), storage_path("sqlite:////var/lib/ft.db")
    ('data/ft.db', '/var/lib/ft.db')
    """
    if isinstance(spec, Storage):
        return spec
    path = storage_path(spec)
    if path is None:
        return MemoryStorage()
    try:
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise StorageError(
                f"cannot open SQLite storage {path!r}: the directory {directory!r} does not exist"
            )
        return SQLiteStorage(path)
    except StorageError as exc:
        hint = _absolute_hint(spec, path)
        if hint:
            raise StorageError(f"{exc}; {hint}") from exc
        raise


_SQLITE_URL = "sqlite:///"
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
_SPEC_FORMS = (
    "expected 'memory', 'sqlite:///relative/ft.db', 'sqlite:////absolute/ft.db' or a file path "
    "such as /absolute/ft.db or ./ft.db"
)


def storage_path(spec: str | os.PathLike[str]) -> str | None:
    """The SQLite file named by a storage spec (see :func:`open_storage`), or None for
    ``"memory"``; a ValueError says what a spec may look like. Nothing is opened.

    >>> storage_path("memory") is None, storage_path("sqlite:///ft.db"), storage_path("/tmp/ft.db")
    (True, 'ft.db', '/tmp/ft.db')
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"storage must be a spec string or a Storage, got {type(spec).__name__}")
    if spec == "memory":
        return None
    if spec.startswith(_SQLITE_URL):
        path = spec[len(_SQLITE_URL) :]
        if not path or path.endswith("/"):
            raise ValueError(f"storage spec {spec!r} names no file: {_SPEC_FORMS}")
        return path
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:", spec):  # another scheme (redis://, file:, ...)
        raise ValueError(f"unknown storage spec {spec!r}: {_SPEC_FORMS}")
    if (
        spec
        and not spec.endswith(("/", os.sep))
        and (os.sep in spec or "/" in spec or spec.lower().endswith(_SQLITE_SUFFIXES))
    ):
        return spec
    raise ValueError(f"unknown storage spec {spec!r}: {_SPEC_FORMS}")


def _absolute_hint(spec: object, path: str) -> str:
    """A hint for the classic slip: ``sqlite:///tmp/x.db`` meant as absolute (it is relative)."""
    if not (isinstance(spec, str) and spec.startswith(_SQLITE_URL)) or os.path.isabs(path):
        return ""
    if os.path.isdir(os.path.dirname(path) or "."):
        return ""
    return (
        f"{spec!r} is the path {path!r} relative to {os.getcwd()!r}; for the absolute path "
        f"/{path} write 'sqlite:////{path}' (four slashes)"
    )
