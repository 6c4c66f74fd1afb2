"""The client side of the acker service: what executors and the driver use to reach an acker.

``AckerClient`` speaks to one ``AckerService`` (:mod:`xorack.service`) over Arrow Flight;
``ShardedAckerClient`` speaks to the shards of a sharded acker (:mod:`xorack.shards`), routing
each record's calls by source id. ``AckerClient.get(location)`` hands out one cached client per
process and picks the kind from the location: a location naming several shards
(``grpc://h:p1,grpc://h:p2``) gets a ``ShardedAckerClient``. Both kinds share the cache, which
this module alone owns (:func:`forget_client` drops a client from it).

Dependencies run one way: this module knows the wire protocol (:mod:`xorack.protocol`), the
shard map (:mod:`xorack.sharding`) and the FT layer's argument checks, never the server side;
:mod:`xorack.service` and :mod:`xorack.shards` import it (and re-export its names).

>>> import pyarrow as pa
>>> from xorack import FTLayer
>>> from xorack.service import AckerService
>>> with AckerService.embedded(FTLayer()) as svc:
...     client = AckerClient.get(svc.location)
...     src = client.persist(pa.record_batch({"x": [1, 2]}), births=[1, 2])
...     sorted(client.xor(src, [1, 2]).tolist()) == sorted(src.tolist())
True
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ._checks import as_u64, same_length
from .errors import ServiceError
from .event_buffer import EventBuffer, Kind, Part
from .ftlayer import _chunk_bits as check_chunk_bits
from .ftlayer import check_persist_args  # the FT layer's own checks, before the wire
from .protocol import (
    AUTH_HEADER,
    BIRTHS,
    DEFAULT_MAX_ROWS,
    EVENT_TIME,
    FAIL_SCHEMA,
    JOB_HEADER,
    KEY_HASH,
    PARTITION,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SRC,
    TOUCH_SCHEMA,
    XOR_SCHEMA,
    check_job,
    check_token,
)
from .sharding import BLOCK_BITS, draw_ids, shard_of, split_by_shard, split_locations
from .storage import check_progress

__all__ = [
    "CHUNK_BYTES",
    "EVENT_CHUNK_ROWS",
    "RESTART_RETRY",
    "AckerClient",
    "RetryPolicy",
    "ShardedAckerClient",
    "forget_client",
    "merge_stats",
]

T = TypeVar("T")
_EMPTY_IDS = np.empty(0, dtype=np.uint64)

#: The client sends an xor/fail/touch of more events than this as several requests.
EVENT_CHUNK_ROWS = DEFAULT_MAX_ROWS
#: The client sends a put's rows in messages of about this many bytes (the service reads and
#: counts them one at a time, so an oversized request is refused before it is all in memory).
CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class RetryPolicy:
    """How an ``AckerClient`` retries when the service is unavailable or a call times out.

    Attempt ``k`` (from 1) that fails waits ``min(initial_backoff * multiplier**(k-1),
    max_backoff)`` seconds (± ``jitter``) before the next; after ``attempts`` the call raises
    ``ServiceError``. The default budget is ~4 s of waiting when the service is down.
    ``call_timeout`` bounds each attempt (a big persist to SQLite may take a while).

    >>> RetryPolicy().total_backoff() < 5
    True
    """

    attempts: int = 8
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 2.0
    jitter: float = 0.2
    call_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and multiplier >= 1")
        if self.call_timeout <= 0:
            raise ValueError(f"call_timeout must be > 0, got {self.call_timeout}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), without jitter."""
        return min(self.initial_backoff * self.multiplier ** (attempt - 1), self.max_backoff)

    def total_backoff(self) -> float:
        """Total waiting between attempts (without jitter) before giving up."""
        return sum(self.backoff(k) for k in range(1, self.attempts))


_RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError)
_grpc_pid: int | None = None  # the process in which this module first started gRPC


def mark_grpc() -> None:
    """Remember that gRPC runs in this process (called before a Flight client/server is made)."""
    global _grpc_pid
    if _grpc_pid is None:
        _grpc_pid = os.getpid()


def check_grpc_usable() -> None:
    """gRPC cannot be used in a child forked after the parent started it: any call hangs. Say so
    instead. (PySpark's daemon forks its workers before any of them opens a client: fine.)"""
    if _grpc_pid is not None and _grpc_pid != os.getpid():
        raise ServiceError(
            f"this process was forked from process {_grpc_pid} after it had opened an Arrow "
            "Flight (gRPC) connection; gRPC cannot be used in such a child. Open acker clients "
            "only in processes that fork before any gRPC use (PySpark workers do), or start "
            "children with multiprocessing's 'spawn' or 'forkserver' method"
        )


#: One client per (process, location, token, job, TLS roots): an AckerClient, or a
#: ShardedAckerClient for a location naming several shards. Owned here: read and filled only
#: by ``AckerClient.get``, emptied only by :func:`forget_client`.
_clients: dict[tuple[int, str, str | None, str, bytes | None], Any] = {}
_clients_lock = threading.Lock()


def forget_client(client: Any) -> None:
    """Drop ``client`` from this process's client cache (every key it is cached under; nothing
    when it is not cached), so that the next ``AckerClient.get`` of its location makes a new
    one. Closing a client calls it; it does not close the client."""
    with _clients_lock:
        for key, value in list(_clients.items()):
            if value is client:
                del _clients[key]


def _clean(exc: BaseException) -> str:
    text = str(exc)
    for marker in (". Detail:", ". gRPC client debug context:"):
        text = text.split(marker)[0]
    return text.strip()


class AckerClient:
    """A connection to an acker service; its methods mirror ``FTLayer``.

    Use ``AckerClient.get(location, token, job=...)`` inside executors: one client per
    (process, location, token, job, TLS roots), reused by every task a Python worker runs, and
    re-created in a forked child. A ``grpc+tls://`` location is verified against
    ``tls_root_certs`` (PEM bytes, e.g. the service's self-signed certificate) or, without them,
    the system's roots. Calls are retried (``RetryPolicy``) when the service is unavailable or
    times out; non-idempotent calls carry a request id the service deduplicates, so a retry
    never applies twice. When the budget is spent the call raises ``xorack.ServiceError``.

    >>> import pyarrow as pa
    >>> from xorack import FTLayer
    >>> from xorack.service import AckerService
    >>> with AckerService.embedded(FTLayer()) as svc:
    ...     c = AckerClient.get(svc.location)
    ...     src = c.persist(pa.record_batch({"x": [1, 2, 3]}), births=[1, 2, 3])
    ...     c.fail(src[:1], reason="bad row").size, c.stats()["pending"]
    (1, 3)
    """

    def __init__(
        self,
        location: str,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        job: str | None = None,
        tls_root_certs: bytes | None = None,
    ) -> None:
        if not isinstance(location, str) or "://" not in location:
            raise ValueError(f"location must look like grpc://host:port, got {location!r}")
        if tls_root_certs is not None and not isinstance(tls_root_certs, bytes):
            raise TypeError(
                "tls_root_certs must be the PEM bytes of the certificates to trust (read the "
                f"file first), got {type(tls_root_certs).__name__}"
            )
        if tls_root_certs is not None and not location.startswith("grpc+tls://"):
            raise ValueError(
                f"tls_root_certs given but {location!r} is not a TLS location: a TLS service's "
                "location starts with grpc+tls://"
            )
        self.location = location
        self.retry = retry or RetryPolicy()
        token = check_token(token)
        self.job = check_job(job)
        self._pid = os.getpid()
        headers = [(PROTOCOL_HEADER.encode(), str(PROTOCOL_VERSION).encode())]
        if token:
            headers.append((AUTH_HEADER.encode(), f"Bearer {token}".encode()))
        if job is not None:
            headers.append((JOB_HEADER.encode(), self.job.encode()))
        self._options = flight.FlightCallOptions(timeout=self.retry.call_timeout, headers=headers)
        check_grpc_usable()
        mark_grpc()
        # Reconnect quickly after the service restarts (gRPC's default backoff grows to 120 s).
        tls = {"tls_root_certs": tls_root_certs} if tls_root_certs is not None else {}
        self._client = flight.FlightClient(
            location,
            **tls,
            generic_options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        #: The events of :meth:`xor_deferred` calls not sent yet (``deferred.limit`` events
        #: make a request; see :mod:`xorack.event_buffer`).
        self.deferred = EventBuffer(1, self._send_deferred)

    @classmethod
    def get(
        cls,
        location: str,
        token: str | None = None,
        job: str | None = None,
        retry: RetryPolicy | None = None,
        tls_root_certs: bytes | None = None,
    ) -> AckerClient:
        """The cached client of this process for ``location``, ``token`` and ``job`` (created on
        first use). A location naming several shards (``grpc://h:p1,grpc://h:p2``, as
        :class:`xorack.shards.ShardedAcker` names them) gets a ``ShardedAckerClient``, which
        has the same methods and routes each record to its shard. Every call of the client
        belongs to ``job`` (1-64 of ``A-Z a-z 0-9 _ . -``; None = the job ``"default"``): it
        sees only that job's records, replays, dead letters, stats and ended attempts.

        The cache is keyed by process id: a client inherited through ``fork`` is never used in
        the child (gRPC connections do not survive a fork), the child makes its own — provided
        its parent had not started gRPC yet (else ``ServiceError`` says so at once; a gRPC call
        in such a child would hang).
        """
        key = (os.getpid(), location, token, check_job(job), tls_root_certs)
        client = _clients.get(key)
        if client is None:
            with _clients_lock:
                client = _clients.get(key)
                if client is None:
                    # a sharded acker: one location per shard, comma-separated
                    make: Any = ShardedAckerClient if "," in location else cls
                    client = make(
                        location,
                        token=token,
                        retry=retry,
                        job=job,
                        tls_root_certs=tls_root_certs,
                    )
                    _clients[key] = client
        return client

    def close(self) -> None:
        """Send the deferred events, close the connection (only in the process that opened it)
        and drop it from the cache."""
        forget_client(self)
        if os.getpid() == self._pid:
            try:
                self.flush()
            finally:
                self.deferred.close()
                self._client.close()

    def __enter__(self) -> AckerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- retries -----------------------------------------------------------------------------

    def _call(self, op: str, fn: Callable[[], T]) -> T:
        if os.getpid() != self._pid:
            raise ServiceError(
                "this AckerClient was created in another process (before a fork); "
                "use AckerClient.get(location) in each process"
            )
        check_grpc_usable()
        if self.deferred.waiting():  # deferred events go first: calls reach the acker in order
            self.deferred.flush()
        policy = self.retry
        last: BaseException | None = None
        for attempt in range(1, policy.attempts + 1):
            try:
                return fn()
            except _RETRYABLE as exc:
                last = exc
                if attempt == policy.attempts:
                    break
                pause = policy.backoff(attempt)
                time.sleep(pause * (1 + policy.jitter * (2 * random.random() - 1)))
            except flight.FlightUnauthenticatedError as exc:
                raise ServiceError(
                    f"acker service at {self.location} refused {op}: unauthenticated "
                    f"({_clean(exc)})"
                ) from None
            except flight.FlightError as exc:
                raise ServiceError(
                    f"acker service at {self.location}: {op} failed: {_clean(exc)}"
                ) from None
        hint = (
            "; TLS: does the client trust the service's certificate (tls_root_certs) and does "
            "the certificate name this host?"
            if self.location.startswith("grpc+tls://")
            else ""
        )
        raise ServiceError(
            f"acker service at {self.location} unreachable after {policy.attempts} attempts "
            f"({op}): {_clean(last) if last else 'no attempt made'}{hint}"
        ) from None

    def _put(self, op: str, cmd: dict[str, Any], data: pa.RecordBatch | pa.Table) -> np.ndarray:
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        size = int(table.nbytes)
        rows = max(1, (CHUNK_BYTES * table.num_rows) // max(size, 1))
        parts = table.to_batches(max_chunksize=rows)  # slices: no copy
        cmd = {"op": op, **cmd, "bytes": size, "rows": table.num_rows}  # refused at once if big
        descriptor = flight.FlightDescriptor.for_command(json.dumps(cmd))

        def attempt() -> np.ndarray:
            writer, reader = self._client.do_put(descriptor, table.schema, options=self._options)
            try:
                for part in parts:
                    writer.write_batch(part)
                writer.done_writing()
                buf = reader.read()
            finally:
                writer.close()
            if buf is None:
                return _EMPTY_IDS
            return np.frombuffer(buf, dtype="<u8").astype(np.uint64, copy=False)

        return self._call(op, attempt)

    def _put_events(
        self,
        op: str,
        cmd: Callable[[], dict[str, Any]],
        batch: pa.RecordBatch,
        *,
        dedupe: bool = True,
    ) -> np.ndarray:
        """An xor/fail/touch, as one request per ``EVENT_CHUNK_ROWS`` rows (the service's
        default row cap), each with its own request id; their results concatenated. (A call of
        more rows that fails part way has applied the requests before: events are independent,
        and each request is applied once.)"""
        out = []
        for start in range(0, batch.num_rows, EVENT_CHUNK_ROWS):
            part = batch.slice(start, EVENT_CHUNK_ROWS)
            command = cmd() | ({"req": _request_id()} if dedupe else {})
            out.append(self._put(op, command, part))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _get(self, op: str, ticket: dict[str, Any]) -> pa.Table:
        t = flight.Ticket(json.dumps({"op": op, **ticket}).encode())
        return self._call(op, lambda: self._client.do_get(t, options=self._options).read_all())

    def _action(self, kind: str, body: dict[str, Any]) -> bytes:
        action = flight.Action(kind, json.dumps(body).encode())

        def attempt() -> bytes:
            results = list(self._client.do_action(action, options=self._options))
            return results[0].body.to_pybytes() if results else b""

        return self._call(kind, attempt)

    # ---- the FT layer's API ------------------------------------------------------------------

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
        """Persist ``batch`` (payload only) in the FT layer; returns its source ids (uint64).

        ``key_hash`` (int32 per row), ``births`` (uint64 per row: each record's first
        ``_ft_rec``), ``partition`` (one int, or int32 per row) and ``src_ids`` (uint64 per
        row, distinct and nonzero, when the caller draws the ids itself; else the acker draws
        them) are optional; so are ``progress`` (``(partition, end)``), ``idempotent``
        (rows whose ``src_ids`` are already pending are left as they are) and ``event_time``
        (int64 per row, sent as the column ``_ft_event_time``; the pending records' smallest
        is ``stats()["min_event_time"]``) and ``epoch`` (the micro-batch the ids are known
        under; an id 0 comes back for a row whose record already left: drop it): see
        ``FTLayer.persist``.
        """
        a = check_persist_args(batch, key_hash, source, partition, births, src_ids, event_time)
        noted = check_progress(progress, a.batch.num_rows)
        if a.batch.num_rows == 0:
            return _EMPTY_IDS
        wire = a.batch if isinstance(a.batch, pa.Table) else pa.Table.from_batches([a.batch])
        for column, values, kind in (
            (KEY_HASH, a.key_hash, pa.int32()),
            (BIRTHS, a.births, pa.uint64()),
            (SRC, a.src_ids, pa.uint64()),
            (PARTITION, a.partition, pa.int32()),
            (EVENT_TIME, a.event_time, pa.int64()),
        ):
            if values is not None:
                wire = wire.append_column(column, pa.array(values, kind))
        cmd: dict[str, Any] = {"source": a.source, "req": _request_id()}
        if noted is not None:
            cmd["progress"] = list(noted)
        if idempotent:
            if a.src_ids is None:
                raise ValueError("idempotent: give the src_ids (derived from the records)")
            cmd["idempotent"] = True
        if epoch:
            cmd["epoch"] = int(epoch)
        return self._put("persist", cmd, wire)

    def job_state(
        self, marks: dict[str, str | None] | None = None, clear: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The job's resume state (``FTLayer.job_state``), after setting ``marks`` and clearing
        ``clear``: ``{"progress": {source: {partition: rows}}, "marks": {key: value}}``."""
        body: dict[str, Any] = {"clear": list(clear)}
        if marks:
            body["marks"] = dict(marks)
        out = json.loads(self._action("job_state", body))
        progress = {
            int(s): {int(p): int(n) for p, n in parts.items()}
            for s, parts in out.get("progress", {}).items()
        }
        return {"progress": progress, "marks": dict(out.get("marks", {}))}

    def xor(self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0) -> np.ndarray:
        """Apply XOR events ``(src, value)``; returns the source ids completed by this call
        (held, with ``hold``; chunk events with ``chunk_bits``: see ``FTLayer.xor``)."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        val = as_u64(values, "values")
        same_length(src_ids=src, values=val)
        if not src.size:
            return _EMPTY_IDS
        batch = pa.RecordBatch.from_arrays([pa.array(src), pa.array(val)], schema=XOR_SCHEMA)
        extra: dict[str, Any] = {}
        if hold or chunk_bits:
            extra = {"hold": bool(hold), "chunk_bits": int(chunk_bits)}
        # (a chunk's event is one row: splitting the rows into requests keeps it whole)
        return self._put_events("xor", lambda: dict(extra), batch)

    def xor_deferred(
        self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0
    ) -> None:
        """:meth:`xor`, sent later: the events wait in :attr:`deferred` until ``deferred.limit``
        of them make one request, :meth:`flush`, or any other call of this client (see
        :mod:`xorack.event_buffer`). For callers that do not need the completions at once and
        flush before they report their work done (a Spark task, before it ends)."""
        src, val = _event_arrays(src_ids, values)
        kind = _kind(hold, chunk_bits)
        if src.size:
            self.deferred.add([(0, src, val)], kind)

    def flush(self) -> np.ndarray:
        """Send the deferred events; the source ids their sends completed since the previous
        flush (held ones, for ``hold``). Returns once all are applied."""
        return self.deferred.flush()

    def _send_deferred(self, parts: list[Part], kind: Kind) -> np.ndarray:
        hold, bits = kind
        return self._ids([self.xor(src, val, hold=hold, chunk_bits=bits) for _k, src, val in parts])

    @staticmethod
    def _ids(results: list[np.ndarray]) -> np.ndarray:
        parts = [r for r in results if len(r)]
        if not parts:
            return _EMPTY_IDS.copy()
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def release(self, chunks: Any = (), chunk_bits: int = 0) -> np.ndarray:
        """End the held completions (``FTLayer.release``): those of ``chunks`` are replayed as
        collateral; returns their ended source ids."""
        c = as_u64(chunks, "chunks", nonzero=True)
        batch = pa.RecordBatch.from_arrays([pa.array(c, pa.uint64())], schema=FAIL_SCHEMA)
        cmd = {"chunk_bits": int(chunk_bits), "req": _request_id()}
        return self._put("release", cmd, batch)

    def fail(self, src_ids: Any, reason: str | None = None) -> np.ndarray:
        """Fail records explicitly; returns the new source ids of their replays."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        if not src.size:
            return _EMPTY_IDS
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None, got {type(reason).__name__}")
        batch = pa.RecordBatch.from_arrays([pa.array(src)], schema=FAIL_SCHEMA)
        return self._put_events("fail", lambda: {"reason": reason}, batch)

    def touch(self, src_ids: Any) -> None:
        """Reset the timeout of these records (idempotent: retried without a request id)."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        if src.size:
            batch = pa.RecordBatch.from_arrays([pa.array(src)], schema=TOUCH_SCHEMA)
            self._put_events("touch", dict, batch, dedupe=False)

    def take_replays(
        self, source: int = 0, partition: int | None = None, first_ids: bool = False
    ) -> dict[int, pa.Table]:
        """The replays waiting for ``source`` (one partition or all): ``{partition: table}``;
        with ``first_ids``, born again with their first attempt's record ids (see
        ``FTLayer.take_replays``). Each replay is handed out once (a retried fetch returns the
        same tables)."""
        ticket = {
            "source": int(source),
            "partition": None if partition is None else int(partition),
            "req": _request_id(),
        }
        if first_ids:
            ticket["first_ids"] = True
        table = self._get("replays", ticket)
        if table.num_rows == 0:
            return {}
        parts = table.column(PARTITION).to_numpy()
        bounds = np.flatnonzero(np.diff(parts)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(parts)]))
        out: dict[int, pa.Table] = {}
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            p = int(parts[s])
            piece = table.slice(s, e - s)
            out[p] = pa.concat_tables([out[p], piece]) if p in out else piece
        return out

    def prepare_replays(
        self,
        source: int,
        partitioner: str | None,
        tag: str,
        first_ids: bool = False,
    ) -> dict[int, int]:
        """Route the replays of ``source`` waiting in the acker to partitions for one round
        (``partitioner``: ``"hash:N"``, ``"forward:N"``, ...; None = the acker's own) and keep
        them there under ``tag``; returns ``{partition: rows}``. Executors then get their
        partition's rows with :meth:`fetch_replays`; the rows are freed by the next prepare of
        the source, :meth:`release_replays` or the acker's close. Retried with the same
        ``tag``, it answers the same counts. See ``FTLayer.prepare_replays`` (``first_ids``:
        the replays are born again with their first attempt's record ids).

        A sharded client forwards it to every shard and adds up the counts per partition.
        """
        body = {
            "source": int(source),
            "partitioner": partitioner,
            "tag": str(tag),
            "first_ids": bool(first_ids),
        }
        out = json.loads(self._action("prepare_replays", body))
        return {int(p): int(n) for p, n in out.get("counts", {}).items()}

    def fetch_replays(
        self, source: int, tag: str, partition: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The replays :meth:`prepare_replays` routed to ``partition`` under ``tag`` (the same
        rows on every call of the round; an empty table when none): payload columns plus
        ``protocol.REPLAY_COLUMNS``, or only ``columns`` (e.g. a round's source ids and
        attempts, without the payload). A sharded client concatenates every shard's."""
        ticket: dict[str, Any] = {
            "source": int(source),
            "tag": str(tag),
            "partition": int(partition),
        }
        if columns is not None:
            ticket["columns"] = [str(c) for c in columns]
        table = self._get("fetch_replays", ticket)
        # an acker of an earlier version sends every column: the projection is made here then
        return table if columns is None else table.select(list(columns))

    def release_replays(self, source: int | None = None, tag: str | None = None) -> None:
        """Free the replays prepared for ``source`` (every source when None; with ``tag``
        only those prepared under it)."""
        self._action("release_replays", {"source": source, "tag": tag})

    def dead_letters(self, source: int | None = None) -> pa.Table:
        """The dead-letter table (payload, origin id, attempts, last reason); only source index
        ``source``'s when given (when the sources' payload schemas do not unify)."""
        return self._get("dead_letters", {} if source is None else {"source": int(source)})

    def stats(self) -> dict[str, Any]:
        """The FT layer's stats (``FTStats.as_dict()``) plus ``"service"`` counters."""
        out = json.loads(self._action("stats", {}))
        per_source = out.get("replayed_by_source")
        if isinstance(per_source, dict):  # JSON made the source indices strings
            out["replayed_by_source"] = {int(k): v for k, v in per_source.items()}
        return out

    def rotate(self) -> np.ndarray:
        """One timeout rotation; returns the new source ids of records replayed for a timeout."""
        return np.frombuffer(self._action("rotate", {"req": _request_id()}), dtype="<u8").astype(
            np.uint64
        )

    def expire_all(self, collateral: bool = False) -> np.ndarray:
        """Time out every pending record now; returns the new source ids of their replays.
        ``collateral``: no attempt used up (see :meth:`xorack.FTLayer.expire_all`)."""
        body: dict[str, Any] = {"req": _request_id()}
        if collateral:
            body["collateral"] = True
        return np.frombuffer(self._action("expire_all", body), dtype="<u8").astype(np.uint64)

    def take_ended(self) -> np.ndarray:
        """The source ids of attempts that ended without completing (failed, timed out or
        dead-lettered) since the previous call: each id is handed out once."""
        return np.frombuffer(
            self._action("take_ended", {"req": _request_id()}), dtype="<u8"
        ).astype(np.uint64, copy=False)

    def forget_known(self, through_epoch: int) -> int:
        """Forget the ids persisted idempotently in epochs ``<= through_epoch``
        (``FTLayer.forget_known``); returns how many."""
        body = {"epoch": int(through_epoch)}
        return int(json.loads(self._action("forget_known", body))["forgotten"])

    def ping(self) -> bool:
        """True when the service answers (after retries); ``ServiceError`` otherwise."""
        return self._action("ping", {}) == b"pong"


def _request_id() -> str:
    return os.urandom(16).hex()


def _kind(hold: Any, chunk_bits: Any) -> Kind:
    """A deferred xor's (hold, chunk_bits), checked at the call (not when it is sent)."""
    if not isinstance(hold, (bool, np.bool_)):
        raise TypeError(f"hold must be True or False, got {type(hold).__name__}")
    return bool(hold), check_chunk_bits(chunk_bits)


def _event_arrays(src_ids: Any, values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A deferred xor's arrays, checked (the buffer copies them: the caller may reuse its
    own)."""
    src = as_u64(src_ids, "src_ids", nonzero=True)
    val = as_u64(values, "values")
    same_length(src_ids=src, values=val)
    return src, val


def _check_block_chunks(chunk_bits: Any) -> None:
    """A sharded acker's chunks lie within one block (hence one shard)."""
    if chunk_bits and not 0 < int(chunk_bits) <= BLOCK_BITS:
        raise ValueError(
            f"chunk_bits={chunk_bits}: a sharded acker keeps the ids of one block of "
            f"2**{BLOCK_BITS} on one shard, so its chunks can have at most {BLOCK_BITS} bits"
        )


# --------------------------------------------------------------------------------------------
# A sharded acker's client (the shard processes themselves: xorack.shards)
# --------------------------------------------------------------------------------------------

#: Deferred events are scattered by shard straight into the buffer's per-shard buffers (one
#: pass); False: split by shard first, then copied in (two passes; the A/B switch of
#: ``benchmarks/bench_shards.py --send split``).
SCATTER_EVENTS = True


def merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stats of a sharded acker from its shards' stats: counters (ints) summed, nested
    dicts merged the same way (``replayed_by_source``, the service's ``calls``), latency
    percentiles the largest shard's (an upper bound: the shards' samples are not shipped),
    ``min_event_time`` the smallest of the shards that have one (None if none has), anything
    else (names) the first shard's.

    >>> merge_stats([{"pending": 2, "latency_p50": 0.1, "replayed_by_source": {0: 1}},
    ...              {"pending": 3, "latency_p50": None, "replayed_by_source": {0: 2, 1: 1}}])
    {'pending': 5, 'latency_p50': 0.1, 'replayed_by_source': {0: 3, 1: 1}}
    >>> merge_stats([{"min_event_time": 7}, {"min_event_time": None}, {"min_event_time": 5}])
    {'min_event_time': 5}
    """
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p[key] for p in parts if key in p]
        if key in _MIN_STATS:
            known = [v for v in values if v is not None]
            out[key] = min(known) if known else None
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = merge_stats(values)
        elif all(v is None or isinstance(v, float) for v in values):
            numbers = [v for v in values if v is not None]
            out[key] = max(numbers) if numbers else None
        else:
            out[key] = values[0]
    return out


#: Stats merged over shards as their minimum (not summed): a time, not a counter.
_MIN_STATS = frozenset({"min_event_time"})


#: The default retry budget of a sharded client's calls (~16 s of waiting): longer than a
#: single acker's (~4 s), to span a shard process's restart (a new Python process importing
#: xorack and reopening its storage: 1-2 s idle, several on a busy machine). Retried calls are
#: never applied twice within a shard's life (request ids); across a restart a retried event
#: of an old id is an orphan, as with any restarted acker.
RESTART_RETRY = RetryPolicy(attempts=20)


class ShardedAckerClient:
    """A client of a sharded acker (``location`` = the shards' locations joined by commas, in
    shard order); its methods mirror :class:`AckerClient`.

    Persists, XOR events, fails and touches are split by source id (``shard_of``) and the
    parts sent to their shards in parallel; a persist whose caller drew no ids gets ids drawn
    here (the shard of a record is known before it is sent). The driver's operations go to
    every shard and their results are combined. A call that fails on one shard raises
    ``ServiceError`` after the other shards' parts have been applied (as a chunked call of
    ``AckerClient`` does: events are independent; a persist then retried by Spark is a
    duplicate delivery, never a loss). Without ``retry``, calls retry for ~16 s
    (``RESTART_RETRY``: a shard process that died is restarted meanwhile). Get one with
    ``AckerClient.get(location, ...)``: cached per process like a single-shard client.
    """

    def __init__(
        self,
        location: str,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        job: str | None = None,
        tls_root_certs: bytes | None = None,
    ) -> None:
        self.locations = split_locations(location)
        retry = retry or RESTART_RETRY
        self.location = location
        self.count = len(self.locations)
        self.shards = [
            AckerClient(loc, token=token, retry=retry, job=job, tls_root_certs=tls_root_certs)
            for loc in self.locations
        ]
        self.job = self.shards[0].job
        self.retry = self.shards[0].retry
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: The events of :meth:`xor_deferred` calls not sent yet, per shard: a shard's
        #: ``deferred.limit`` events make one request (see :mod:`xorack.event_buffer`).
        self.deferred = EventBuffer(self.count, self._send_deferred)

    @classmethod
    def get(cls, location: str, **kwargs: Any) -> Any:
        """The cached client of this process for ``location`` (see ``AckerClient.get``)."""
        return AckerClient.get(location, **kwargs)

    def close(self) -> None:
        """Send the deferred events, close every shard's connection and the fan-out threads;
        drop it from the cache."""
        forget_client(self)
        try:
            if os.getpid() == self._pid:
                self.flush()
        finally:
            self.deferred.close()
            for shard in self.shards:
                shard.close()
        if self._pool is not None and os.getpid() == self._pid:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> ShardedAckerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedAckerClient({self.location!r}, job={self.job!r})"

    # ---- fan-out ------------------------------------------------------------------------------

    def _run(self, calls: list[Callable[[], T]]) -> list[T]:
        """Run the calls (one per shard involved) in parallel; their results in order. Every
        call has ended when this returns or raises (the first error is raised). Deferred
        events are sent first (every call of this client comes through here)."""
        if self.deferred.waiting():
            self.deferred.flush()
        if len(calls) == 1:
            return [calls[0]()]
        if self._pool is None or os.getpid() != self._pid:
            with self._pool_lock:
                if self._pool is None or os.getpid() != self._pid:
                    self._pid = os.getpid()
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.count, thread_name_prefix="xorack-shards"
                    )
        futures = [self._pool.submit(c) for c in calls]
        results, error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
        return results

    def broadcast(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` of every shard's client with the same arguments (in parallel); the
        results in shard order. The hook for driver operations that every shard answers.

        >>> # client.broadcast("ping") == [True, True]
        """
        return self._run([_bind(getattr(s, method), args, kwargs) for s in self.shards])

    def broadcast_tables(self, method: str, *args: Any, **kwargs: Any) -> pa.Table:
        """:meth:`broadcast` of a method that returns an Arrow table: the tables concatenated
        (schemas unified: a column one shard lacks is null there). For per-partition replay
        fetches and the dead-letter table."""
        return _concat([t for t in self.broadcast(method, *args, **kwargs) if t is not None])

    def _split(self, src: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
        """``[(shard, row indices)]`` of the shards that own rows of ``src``; ``None`` = all
        rows (one shard owns them all: nothing to gather)."""
        owner = shard_of(src, self.count)
        first = int(owner[0]) if len(owner) else 0
        if not len(owner) or (owner == first).all():
            return [(first, None)]
        parts = [(k, np.flatnonzero(owner == k)) for k in range(self.count)]
        return [(k, rows) for k, rows in parts if len(rows)]

    def _ids(self, results: list[np.ndarray]) -> np.ndarray:
        parts = [r for r in results if len(r)]
        if not parts:
            return _EMPTY_IDS.copy()
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    # ---- routed by source id ----------------------------------------------------------------

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
        """Persist ``batch``: each row on the shard its source id belongs to (ids drawn here
        when not given); returns the source ids in row order (see ``AckerClient.persist``).
        ``progress`` is refused: a batch split over shards is not persisted atomically, so a
        sharded acker cannot resume a job (see :meth:`job_state`)."""
        if progress is not None:
            self.job_state()

        a = check_persist_args(batch, key_hash, source, partition, births, src_ids, event_time)
        if idempotent and a.src_ids is None:
            raise ValueError("idempotent: give the src_ids (derived from the records)")
        n = a.batch.num_rows
        if n == 0:
            return _EMPTY_IDS.copy()
        src = a.src_ids if a.src_ids is not None else draw_ids(n)

        def part(k: int, rows: np.ndarray | None) -> Callable[[], np.ndarray]:
            def pick(x: Any) -> Any:
                return x if x is None or rows is None else x[rows]

            data = a.batch if rows is None else a.batch.take(pa.array(rows))
            return lambda: self.shards[k].persist(
                data,
                key_hash=pick(a.key_hash),
                source=a.source,
                partition=pick(a.partition),
                births=pick(a.births),
                src_ids=pick(src),
                idempotent=idempotent,
                event_time=pick(a.event_time),
                epoch=epoch,
            )

        splits = self._split(src)
        got = self._run([part(k, rows) for k, rows in splits])
        if not idempotent:
            return src
        out = np.array(src, dtype=np.uint64)  # a 0 where a shard found the record settled
        for (_, rows), ids in zip(splits, got, strict=True):
            out[slice(None) if rows is None else rows] = np.asarray(ids, dtype=np.uint64)
        return out

    def xor(self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0) -> np.ndarray:
        """Apply XOR events, each on its source id's shard; the source ids completed (held,
        with ``hold``). With ``chunk_bits`` each row is one chunk's event (``src_ids`` are chunk
        numbers, see ``FTLayer.xor``): routed to the shard of the chunk's block, which holds
        every record of the chunk (chunks of at most ``2**BLOCK_BITS`` ids)."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        val = as_u64(values, "values")
        same_length(src_ids=src, values=val)
        if not src.size:
            return _EMPTY_IDS.copy()
        return self._send_deferred(self._by_shard(src, val, chunk_bits), (hold, chunk_bits))

    def xor_deferred(
        self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0
    ) -> None:
        """:meth:`xor`, sent later: each shard's events wait in :attr:`deferred` until
        ``deferred.limit`` of them make one request to it, :meth:`flush`, or any other call
        of this client (see :mod:`xorack.event_buffer`). With many shards this keeps requests
        as large as one acker's (a plain xor splits every batch into one request per shard).
        For callers that do not need the completions at once and flush before they report
        their work done (a Spark task, before it ends)."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        val = as_u64(values, "values")
        same_length(src_ids=src, values=val)
        kind = _kind(hold, chunk_bits)
        _check_block_chunks(kind[1])
        if not src.size:
            return
        if SCATTER_EVENTS:
            self.deferred.add_split(src, val, kind[1], kind)  # copied, by shard, in one pass
        else:
            self.deferred.add(self._by_shard(src, val, kind[1]), kind)

    def flush(self) -> np.ndarray:
        """Send the deferred events (each shard's as one request, the shards in parallel); the
        source ids their sends completed since the previous flush. Returns once all are
        applied."""
        return self.deferred.flush()

    def _by_shard(self, src: np.ndarray, val: np.ndarray, chunk_bits: int) -> list[Part]:
        """The events' parts per shard, ``[(shard, src, values)]``, each shard's in their
        order (chunk events by their chunk's block): one ``split_by_shard`` kernel call."""
        _check_block_chunks(chunk_bits)
        ids, vals, offsets = split_by_shard(src, val, self.count, chunk_bits)
        bounds = offsets.tolist()
        return [
            (k, ids[bounds[k] : bounds[k + 1]], vals[bounds[k] : bounds[k + 1]])
            for k in range(self.count)
            if bounds[k + 1] > bounds[k]
        ]

    def _send_deferred(self, parts: list[Part], kind: Kind) -> np.ndarray:
        """One xor request per part, the shards in parallel; the completed source ids."""
        hold, bits = kind
        kw: dict[str, Any] = {"hold": bool(hold), "chunk_bits": int(bits)} if hold or bits else {}
        return self._ids(self._run([_bind(self.shards[k].xor, (s, v), kw) for k, s, v in parts]))

    def release(self, chunks: Any = (), chunk_bits: int = 0) -> np.ndarray:
        """End the held completions on every shard (those of ``chunks`` replayed as
        collateral); the collateral replays' ended source ids (see ``AckerClient.release``)."""
        c = as_u64(chunks, "chunks", nonzero=True)
        return self._ids(self.broadcast("release", c, chunk_bits))

    def fail(self, src_ids: Any, reason: str | None = None) -> np.ndarray:
        """Fail records explicitly, each on its shard; the new source ids of their replays."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        if not src.size:
            return _EMPTY_IDS.copy()
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None, got {type(reason).__name__}")
        return self._ids(
            self._run(
                [
                    _bind(self.shards[k].fail, (src if r is None else src[r],), {"reason": reason})
                    for k, r in self._split(src)
                ]
            )
        )

    def touch(self, src_ids: Any) -> None:
        """Reset the timeout of these records, each on its shard."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        if src.size:
            self._run(
                [
                    _bind(self.shards[k].touch, (src if r is None else src[r],))
                    for k, r in self._split(src)
                ]
            )

    # ---- every shard ------------------------------------------------------------------------

    def take_replays(
        self, source: int = 0, partition: int | None = None, first_ids: bool = False
    ) -> dict[int, pa.Table]:
        """The replays waiting on every shard: ``{partition: table}`` (the shards' tables of a
        partition concatenated). With ``first_ids`` each shard gives its replays their first
        ids (a record's copies share its source id, hence its shard, when the source derives
        its ids from the records)."""
        merged: dict[int, list[pa.Table]] = {}
        calls = self.broadcast(
            "take_replays", source=source, partition=partition, first_ids=first_ids
        )
        for parts in calls:
            for p, table in parts.items():
                merged.setdefault(p, []).append(table)
        return {p: _concat(tables) for p, tables in sorted(merged.items())}

    # per-partition replay rounds (executors fetch their partition from every shard): each
    # shard prepares, serves and frees its own replays; nothing here knows their format

    def prepare_replays(
        self, source: int, partitioner: str | None, tag: str, first_ids: bool = False
    ) -> dict[int, int]:
        """Every shard prepares its replays of ``source`` for the round ``tag``; the rows per
        partition added up over the shards (see ``AckerClient.prepare_replays``)."""
        counts: dict[int, int] = {}
        for part in self.broadcast("prepare_replays", source, partitioner, tag, first_ids):
            for p, n in part.items():
                counts[int(p)] = counts.get(int(p), 0) + int(n)
        return dict(sorted(counts.items()))

    def fetch_replays(
        self, source: int, tag: str, partition: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Every shard's replays of ``partition`` for the round ``tag`` (only ``columns`` when
        given), concatenated."""
        if columns is None:
            return self.broadcast_tables("fetch_replays", source, tag, partition)
        return self.broadcast_tables("fetch_replays", source, tag, partition, columns)

    def release_replays(self, source: int | None = None, tag: str | None = None) -> None:
        """Free the prepared replays on every shard."""
        self.broadcast("release_replays", source, tag)

    def dead_letters(self, source: int | None = None) -> pa.Table:
        """Every shard's dead letters, concatenated."""
        return self.broadcast_tables("dead_letters", source)

    def job_state(self, marks: Any = None, clear: Any = ()) -> dict[str, Any]:
        """Not served: resuming a job needs its batches persisted atomically, in one acker."""
        raise ValueError(
            "a sharded acker cannot resume a job after a driver crash (a batch split over "
            "shards is not persisted atomically): use one acker (ackers=1) with resume"
        )

    def stats(self) -> dict[str, Any]:
        """The shards' stats merged (:func:`merge_stats`); ``service.shards`` lists each
        shard's own service counters."""
        parts = self.broadcast("stats")
        out = merge_stats(parts)
        service = out.setdefault("service", {})
        service["location"] = self.location
        service["shard"] = None
        service["jobs"] = max((p.get("service", {}).get("jobs", 0) for p in parts), default=0)
        service["shards"] = [p.get("service", {}) for p in parts]
        return out

    def rotate(self) -> np.ndarray:
        """One timeout rotation on every shard; the new ids of the replays."""
        return self._ids(self.broadcast("rotate"))

    def expire_all(self, collateral: bool = False) -> np.ndarray:
        """Time out every pending record on every shard; the new ids of their replays
        (``collateral``: no attempt used up)."""
        return self._ids(self.broadcast("expire_all", collateral=collateral))

    def take_ended(self) -> np.ndarray:
        """The ended attempts of every shard since the previous call (each id once)."""
        return self._ids(self.broadcast("take_ended"))

    def forget_known(self, through_epoch: int) -> int:
        """Forget the known ids of epochs ``<= through_epoch`` on every shard."""
        return sum(self.broadcast("forget_known", through_epoch))

    def ping(self) -> bool:
        """True when every shard answers; ``ServiceError`` naming the first that does not."""
        return all(self.broadcast("ping"))

    def check_shards(self) -> None:
        """Ask every shard which shard it is; ``ServiceError`` when the location lists them in
        another order or count than they were started with (events would reach the wrong
        shard: records would time out and replay instead of completing)."""
        for k, stats in enumerate(self.broadcast("stats")):
            said = (stats.get("service") or {}).get("shard")
            if said is not None and said != f"{k}/{self.count}":
                raise ServiceError(
                    f"the acker at {self.locations[k]} is shard {said}, but the location names "
                    f"it as shard {k}/{self.count}: give every shard's location, in shard order "
                    "(as `xorack serve --shards N` prints them)"
                )
            if said is None and self.count > 1:
                raise ServiceError(
                    f"the acker at {self.locations[k]} is not a shard (started without "
                    "--shard): a sharded location must name the shards of one "
                    "`xorack serve --shards N`"
                )


def _bind(fn: Callable[..., T], args: tuple = (), kwargs: dict | None = None) -> Callable[[], T]:
    return lambda: fn(*args, **(kwargs or {}))


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t is not None]
    if len(tables) == 1:
        return tables[0]
    nonempty = [t for t in tables if t.num_rows] or tables[:1]
    if all(t.schema == nonempty[0].schema for t in nonempty):
        return pa.concat_tables(nonempty)
    return pa.concat_tables(nonempty, promote_options="permissive")
