"""The acker service (the seed's FTLayerVertex): one ``FTLayer`` behind an Arrow Flight server.
The client that Spark executors use to reach it lives in :mod:`xorack.client` (which knows
nothing of this module); ``AckerClient`` and ``RetryPolicy`` are re-exported here.

Every task reports to the one FT layer through this service: sources persist their batches
(payload kept as Arrow, never re-parsed), stages send their XOR events per Arrow batch, the driver
fetches replays per (source, partition), rotates timeouts and reads the stats and dead letters.

>>> import numpy as np, pyarrow as pa
>>> from xorack import FTLayer
>>> from xorack.service import AckerClient, AckerService
>>> with AckerService.embedded(FTLayer()) as svc:
...     client = AckerClient.get(svc.location)
...     batch = pa.record_batch({"word": ["a", "b"]})
...     src = client.persist(batch, births=np.array([5, 6], dtype=np.uint64))
...     sorted(client.xor(src, np.array([5, 6], dtype=np.uint64)).tolist()) == sorted(src.tolist())
True

Wire protocol (all schemas are the service's own; anything else is rejected with a message that
names the expected schema):

=============  ==========  =============================================================
operation      Flight RPC  request → response
=============  ==========  =============================================================
persist        DoPut       command ``{"op": "persist", "source", "partition", "req",
                           "progress"?}``;
                           stream = payload columns + optional ``_ft_key_hash int32``,
                           ``_ft_rec uint64`` (birth values), ``_ft_partition int32``,
                           ``_ft_src uint64`` (source ids the caller drew itself),
                           ``_ft_event_time int64`` (event times)
                           → one metadata message: the new source ids (raw uint64 LE)
xor            DoPut       ``{"op": "xor", "req", "hold"?, "chunk_bits"?}``; stream
                           ``_ft_src uint64, _ft_xor uint64`` → completed (or held) source ids
                           (raw uint64 LE); see ``FTLayer.xor`` for hold and chunk events
release        DoPut       ``{"op": "release", "chunk_bits", "req"}``; stream ``_ft_src uint64``
                           (tainted chunks) → collateral source ids (raw uint64 LE)
fail           DoPut       ``{"op": "fail", "reason", "req"}``; stream ``_ft_src uint64``
                           → new replay source ids (raw uint64 LE)
touch          DoPut       ``{"op": "touch"}``; stream ``_ft_src uint64`` → nothing
replays        DoGet       ticket ``{"op": "replays", "source", "partition", "req",
                           "first_ids"?}`` → one table, partitions concatenated (column
                           ``_ft_partition``; the columns of ``protocol.REPLAY_COLUMNS``)
dead_letters   DoGet       ticket ``{"op": "dead_letters", "source": k?}`` → the dead-letter table
ping, stats    DoAction    body ``{}`` → ``b"pong"`` / JSON of ``FTLayer.stats()`` + service
                           (``min_event_time``: the pending records' smallest event time)
rotate,        DoAction    body ``{"req"}`` (expire_all: ``"collateral"?``) → expired / replayed
expire_all                 source ids (raw uint64 LE)
job_state      DoAction    body ``{"marks"?, "clear"?}`` → JSON ``{"progress", "marks"}``
=============  ==========  =============================================================

Every call carries its job in the header ``x-xorack-job`` (absent: ``"default"``; see
``AckerService`` on jobs). A put's command may say its size (``"bytes"``, ``"rows"``: the client
always does): one bigger than the service's ``max_request_bytes`` / ``max_request_rows`` is refused
before its data is read, and the data is read one message at a time and refused as soon as it
passes the cap.

Retries never double-apply a request. Every non-idempotent request (persist, xor, fail, rotate,
expire_all, replays) carries a random request id, the same on every retry of one logical call. The
service remembers each (job, operation, request id) and its result (``RequestLog``) for
``dedup_seconds`` (default 600 s) after it completed, and a retry that arrives while the first
attempt is still running waits for it. So a retry after a lost reply or a client-side timeout gets
the first result back instead of XOR-ing the events twice (which would corrupt the checksums) or
handing out the same replays twice (or losing them). The client's whole retry budget (attempts x
call timeout + backoff) is well below ``dedup_seconds``. The log lives in the service's memory: if
the acker process itself restarts, the FT layer reopens on its durable storage and replays every
unfinished record under a *new* source id, so a retried event for an old id is an orphan (counted,
harmless) and a retried persist at worst duplicates a record — a duplicate delivery, never a loss
and never a false completion.

Sharding: several acker processes can share the records of a job, each owning the source ids
that hash to it (``xorack serve --shards N``, ``Pipeline(ackers=N)``). Each shard is a service as
described here; a location naming them all (``grpc://h:p1,grpc://h:p2``) gets a client that routes
every call by source id (:mod:`xorack.shards`).

One RPC per call (DoPut, not a long-lived DoExchange stream): each call has its own deadline,
retry and auth check, and one client is safe to share between threads. It costs ~0.1-0.3 ms per
call on loopback (a persistent DoExchange stream measured ~0.04-0.17 ms), negligible next to
the batch of thousands of rows each call carries.

Security: the service listens on loopback unless told otherwise; a non-loopback address needs a
token, sent by clients as ``authorization: Bearer <token>`` on every call and compared in
constant time, and TLS (``tls_cert``/``tls_key``: the location becomes ``grpc+tls://``; clients
trust the certificate through ``tls_root_certs``, or the system's roots), so the token never
crosses a network in clear.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from . import kernels
from .client import (  # re-exported: executors' code and the README import them from here
    AckerClient,
    RetryPolicy,
    ShardedAckerClient,
    check_grpc_usable,
    mark_grpc,
)
from .errors import ServiceError, XorackError
from .protocol import (
    AUTH_HEADER,
    BIRTHS,
    CONTROL_PREFIX,
    DEFAULT_JOB,
    DEFAULT_MAX_ROWS,
    EVENT_TIME,
    FAIL_SCHEMA,
    JOB_HEADER,
    KEY_HASH,
    PARTITION,
    PERSIST_CONTROL,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SRC,
    TOUCH_SCHEMA,
    XOR,
    XOR_SCHEMA,
    Op,
    check_job,
    check_token,
)

__all__ = [
    "DEFAULT_JOB",
    "FAIL_SCHEMA",
    "TOUCH_SCHEMA",
    "XOR_SCHEMA",
    "AckerClient",
    "AckerService",
    "RequestLog",
    "RetryPolicy",
    "ShardedAckerClient",
    "check_job",
    "check_token",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

_PERSIST_DOC = (
    "payload columns (names not starting with '_ft_') + optional _ft_key_hash: int32, "
    "_ft_rec: uint64 (birth values), _ft_partition: int32, _ft_src: uint64 (caller-drawn ids), "
    "_ft_event_time: int64 (event times)"
)
_EMPTY_REPLAYS = pa.schema([pa.field(SRC, pa.uint64()), pa.field(PARTITION, pa.int32())])
_EMPTY_IDS = np.empty(0, dtype=np.uint64)

DEFAULT_PORT = 8815
#: Largest request (the Arrow data of one put) an acker accepts unless told otherwise.
DEFAULT_MAX_REQUEST = 256 << 20
_PUT_OPS = tuple(op.value for op in Op.of("put"))
_GET_OPS = tuple(op.value for op in Op.of("get"))
_ACTIONS = {
    "ping": "liveness check; returns b'pong'",
    "stats": "JSON: the FT layer's stats plus the service's counters",
    "rotate": "one timeout rotation; returns the replayed source ids (uint64 LE)",
    "expire_all": "time out every pending record; returns the replayed source ids (uint64 LE)",
    "take_ended": "the source ids of attempts that ended without completing since the last call "
    "(failed, timed out, dead-lettered; uint64 LE)",
    "prepare_replays": "route a source's waiting replays to partitions for a round "
    '{"source", "partitioner", "tag", "first_ids": bool}; returns JSON {"counts": {partition: '
    "rows}}",
    "release_replays": 'free the replays prepared for a round {"source", "tag"}',
    "forget_known": 'forget the source ids persisted idempotently in epochs <= {"epoch"}; '
    'returns JSON {"forgotten": n}',
    "job_state": 'update and read the job\'s resume state {"marks"?, "clear"?}; returns JSON '
    '{"progress": {source: {partition: rows}}, "marks": {key: value}}',
}


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (127.0.0.0/8, ::1, ``localhost``).

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: may resolve anywhere, treat as exposed


def _location(host: str, port: int, tls: bool = False) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{'grpc+tls' if tls else 'grpc'}://{host}:{port}"


def _read_pem(path: Any, what: str) -> bytes:
    """The bytes of a PEM file, or a ``ServiceError`` naming the file and the option."""
    try:
        with open(os.fspath(path), "rb") as f:
            data = f.read()
    except (OSError, TypeError) as exc:
        raise ServiceError(f"cannot read the TLS {what} {path!r}: {exc}") from None
    if b"-----BEGIN" not in data:
        raise ServiceError(f"the TLS {what} {path!r} is not a PEM file (no '-----BEGIN' line)")
    return data


def _tls_pair(tls_cert: Any, tls_key: Any) -> tuple[bytes, bytes] | None:
    """The (certificate, key) PEM bytes of a TLS service, or None without TLS."""
    if (tls_cert is None) != (tls_key is None):
        raise ServiceError(
            "TLS needs both tls_cert and tls_key (xorack serve --tls-cert/--tls-key): got only "
            + ("tls_cert" if tls_cert is not None else "tls_key")
        )
    if tls_cert is None:
        return None
    return _read_pem(tls_cert, "certificate"), _read_pem(tls_key, "private key")


@dataclass
class _Entry:
    op: str
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


#: What a request id may be: the client draws 32 hex digits; anything printable up to 128.
REQUEST_ID_MAX = 128


def check_request_id(value: Any) -> str | None:
    """``value`` if it is a valid request id (None, or a string of 1-128 printable ASCII
    characters); ``ValueError`` otherwise. Checked before a request is applied.

    >>> check_request_id("5f0c"), check_request_id(None)
    ('5f0c', None)
    """
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= REQUEST_ID_MAX
        or not value.isascii()
        or not value.isprintable()
    ):
        raise ValueError(
            f"'req' (the request id) must be a string of 1-{REQUEST_ID_MAX} printable ASCII "
            f"characters, got {value!r:.80}"
        )
    return value


class RequestIdReused(ValueError):
    """A request id already used for another operation: the client must draw a fresh one."""


class RequestLog:
    """Remembers recent requests by (operation, request id) with their results, so that a
    retried request is answered from memory instead of being applied twice.

    An entry is kept ``ttl`` seconds after its request completed; beyond ``max_bytes`` of
    remembered results (each entry counted with its own bookkeeping, ``ENTRY_BYTES``, so that
    many small results are bounded too) the oldest completed entries are dropped early (counted
    in ``evicted_early``; the newest one always stays). A request that failed is forgotten
    (nothing was applied: a retry runs it again). A duplicate that arrives while the first
    attempt still runs waits for its result (at most ``max_waiters`` threads wait at once; more
    are told to retry later). A request id seen with another operation is refused
    (``RequestIdReused``): an xor must never be answered with a persist's result. Each call
    costs O(1) amortized.

    >>> log = RequestLog()
    >>> calls = []
    >>> log.run("r1", lambda: calls.append(1) or "applied", op="xor")
    'applied'
    >>> log.run("r1", lambda: calls.append(1) or "applied again", op="xor"), len(calls)
    ('applied', 1)
    """

    #: What remembering one completed request costs besides its result (key, entry, dict slot).
    ENTRY_BYTES = 384

    def __init__(
        self, ttl: float = 600.0, max_bytes: int = 256 << 20, max_waiters: int = 64
    ) -> None:
        self.ttl = float(ttl)
        self.max_bytes = int(max_bytes)
        self.max_waiters = int(max_waiters)
        self._running: dict[Any, _Entry] = {}
        # completed: key -> (op, result, counted bytes, finished at), in completion order
        self._done: OrderedDict[Any, tuple[str, Any, int, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._waiters = 0
        self.hits = 0
        self.evicted_early = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._done) + len(self._running)

    @property
    def nbytes(self) -> int:
        """The bytes counted for the completed requests remembered now."""
        return self._bytes

    @property
    def running(self) -> int:
        """Requests being applied now (their ids are remembered until they finish)."""
        with self._lock:
            return len(self._running)

    def run(self, req_id: Any, fn: Callable[[], T], *, op: str = "", wait: float = 300.0) -> T:
        """``fn()`` applied at most once per ``req_id`` while remembered; its result otherwise.

        ``req_id`` is a string, or any hashable key (a tuple of a job and a request id); None
        means "not deduplicated". ``op`` names the operation: the same id with another op is
        refused with ``RequestIdReused`` before anything is applied."""
        if req_id is None or req_id == "":
            return fn()
        with self._lock:
            self._expire(time.monotonic())
            done = self._done.get(req_id)
            if done is not None:
                self._same_op(req_id, done[0], op)
                self.hits += 1
                return done[1]
            entry = self._running.get(req_id)
            owner = entry is None
            if owner:
                entry = self._running[req_id] = _Entry(op)
            else:
                assert entry is not None
                self._same_op(req_id, entry.op, op)
                if self._waiters >= self.max_waiters:
                    raise flight.FlightUnavailableError(
                        f"request {_key_text(req_id)} is still being applied and "
                        f"{self._waiters} duplicates already wait: retry later"
                    )
                self._waiters += 1
                self.hits += 1
        assert entry is not None
        if not owner:
            try:
                if not entry.done.wait(wait):
                    raise flight.FlightTimedOutError(
                        f"request {_key_text(req_id)} is still being applied by an earlier attempt"
                    )
            finally:
                with self._lock:
                    self._waiters -= 1
            if entry.error is not None:
                raise entry.error
            return entry.result
        try:
            result = fn()
            size = _nbytes(result) + self.ENTRY_BYTES + len(_key_text(req_id))
        except BaseException as exc:
            entry.error = exc
            with self._lock:
                self._running.pop(req_id, None)
            entry.done.set()
            raise
        entry.result = result
        with self._lock:
            self._running.pop(req_id, None)
            self._done[req_id] = (op, result, size, time.monotonic())
            self._bytes += size
            self._shrink()
        entry.done.set()
        return result

    @staticmethod
    def _same_op(req_id: Any, seen: str, op: str) -> None:
        if seen != op:
            raise RequestIdReused(
                f"request id {_key_text(req_id)} was already used for {seen or 'another op'!r}, "
                f"not {op or 'this op'!r}: draw a fresh request id for each logical call"
            )

    def _expire(self, now: float) -> None:
        done = self._done
        while done:
            key = next(iter(done))
            if now - done[key][3] < self.ttl:
                break
            self._drop(key)

    def _shrink(self) -> None:
        while self._bytes > self.max_bytes and len(self._done) > 1:
            self._drop(next(iter(self._done)))
            self.evicted_early += 1

    def _drop(self, key: Any) -> None:
        _op, _result, size, _at = self._done.pop(key)
        self._bytes -= size


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else ":".join(map(str, key))


def _nbytes(result: Any) -> int:
    if isinstance(result, np.ndarray):
        return int(result.nbytes)
    if isinstance(result, (pa.Table, pa.RecordBatch)):
        return int(result.nbytes)
    if isinstance(result, (bytes, bytearray)):
        return len(result)
    return 64


class _RequestError(Exception):
    """A request the service rejects (bad schema, bad arguments): the client's fault."""


class _CallJob(flight.ServerMiddleware):
    """What the service knows of a call before its handler runs: the job it belongs to."""

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job = job


class _CallFactory(flight.ServerMiddlewareFactory):
    """Reads the job of every call (header ``x-xorack-job``, absent = ``"default"``) and checks
    its credential: a job with its own token (``job_tokens``) needs exactly that one, any other
    job the service's token (when it has one), as ``authorization: Bearer <token>``, compared
    in constant time."""

    def __init__(self, token: str | None, job_tokens: dict[str, str]) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode() if token else None
        self._job_expected = {j: f"Bearer {t}".encode() for j, t in job_tokens.items()}

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> _CallJob:
        version = headers.get(PROTOCOL_HEADER, ())
        if version and str(version[0]) != str(PROTOCOL_VERSION):
            raise flight.FlightServerError(
                f"xorack acker rejected the call: the client speaks protocol version "
                f"{str(version[0])[:20]!r}, this acker speaks {PROTOCOL_VERSION}: run the same "
                "xorack version on both sides"
            )
        values = headers.get(JOB_HEADER, ())
        raw = values[0] if values else None
        raw = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        try:
            job = check_job(raw)
        except ValueError as exc:
            raise flight.FlightServerError(f"xorack acker rejected the call: {exc}") from None
        expected = self._job_expected.get(job, self._expected)
        if expected is not None and not any(
            hmac.compare_digest(v if isinstance(v, bytes) else str(v).encode(), expected)
            for v in headers.get(AUTH_HEADER, ())
        ):
            raise flight.FlightUnauthenticatedError(
                f"xorack acker: missing or wrong token for job {job!r} (pass token=... to "
                "AckerClient.get, or set XORACK_TOKEN)"
            )
        return _CallJob(job)


def _parse_command(raw: bytes, what: str) -> dict[str, Any]:
    try:
        cmd = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        cmd = None
    if not isinstance(cmd, dict) or not isinstance(cmd.get("op"), str):
        raise _RequestError(
            f"not an xorack {what}: expected a JSON object with an 'op' key, got {raw[:60]!r}"
        )
    return cmd


def _opt_int(cmd: dict[str, Any], key: str, default: int | None) -> int | None:
    value = cmd.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _RequestError(f"'{key}' must be an integer, got {value!r}")
    return value


def _opt_flag(cmd: dict[str, Any], key: str, op: str) -> bool:
    """``cmd[key]`` as a flag: absent or null is False; anything but a JSON boolean is refused."""
    value = cmd.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _RequestError(f"{op}: {key!r} must be true or false, got {value!r:.80}")
    return value


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _expect_schema(schema: pa.Schema, expected: pa.Schema, op: str) -> None:
    if schema.names != expected.names or schema.types != expected.types:
        raise _RequestError(
            f"{op}: unexpected schema ({_schema_text(schema)}); expected ({_schema_text(expected)})"
        )


def _persist_payload_columns(schema: pa.Schema) -> list[str]:
    """The payload columns of a persist stream; its control columns checked."""
    payload_cols: list[str] = []
    for f in schema:
        if f.name in PERSIST_CONTROL:
            if f.type != PERSIST_CONTROL[f.name]:
                raise _RequestError(
                    f"persist: column {f.name} must be {PERSIST_CONTROL[f.name]}, got {f.type}; "
                    f"expected schema: {_PERSIST_DOC}"
                )
        elif f.name.startswith(CONTROL_PREFIX):
            raise _RequestError(
                f"persist: unexpected control column {f.name!r}; expected schema: {_PERSIST_DOC}"
            )
        else:
            payload_cols.append(f.name)
    if not payload_cols:
        raise _RequestError(f"persist: no payload columns; expected schema: {_PERSIST_DOC}")
    return payload_cols


def _check_put_schema(op: str, schema: pa.Schema) -> None:
    if op == "persist":
        _persist_payload_columns(schema)
    else:
        _expect_schema(schema, XOR_SCHEMA if op == "xor" else FAIL_SCHEMA, op)  # release too


def _column_u64(table: pa.Table, name: str, op: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        raise _RequestError(f"{op}: column {name} must not contain nulls")
    return col.to_numpy() if col.num_chunks != 1 else col.chunk(0).to_numpy(zero_copy_only=False)


def _ids_buffer(ids: Any) -> pa.Buffer:
    arr = np.ascontiguousarray(np.asarray(ids, dtype=np.uint64))
    return pa.py_buffer(arr.astype("<u8", copy=False).tobytes())


class AckerService(flight.FlightServerBase):
    """An Arrow Flight server hosting the FT layers of one or more jobs (the seed's
    FTLayerVertex).

    ``AckerService(ft)`` listens on 127.0.0.1 and a free port as soon as it is built; call
    ``serve()`` to block, or use ``AckerService.embedded(ft)`` to run it in a thread of this
    process. A non-loopback ``host`` requires a ``token`` and TLS (``tls_cert``, ``tls_key``:
    PEM files); with a token every call must present it. ``advertise`` is the host name put in
    ``location`` (the name clients route to; default ``host``). ``ft`` stays owned by the
    caller unless ``close_ft=True``.

    Jobs: every call belongs to a job (``AckerClient.get(location, job=...)``; none = the job
    ``"default"``), and each job has its own FT layer — its own sources, rounds, replays, dead
    letters, stats and ended attempts: a client of one job cannot take, ack or fail another
    job's records. ``ft`` serves the job ``job``. ``ft_factory(job)`` (a standalone acker:
    ``xorack serve``) makes the FT layer of a job on its first call, up to ``max_jobs`` jobs;
    without it, calls of other jobs are refused. When ``max_jobs`` are served and a new job
    comes, the factory-made jobs with nothing pending and no call for ``job_idle_seconds`` are
    closed first (a later call of such a job opens it again: with durable storage its dead
    letters are still there, its counters start over). ``job_tokens`` ``{job: token}`` gives a job a
    credential of its own: its calls must present that token (the service's ``token`` does not
    open it), other jobs' calls the service's ``token``. FT layers made by ``ft_factory`` are
    closed with the service.

    ``max_request_bytes`` / ``max_request_rows`` bound one request's Arrow data / rows: a
    request that says it is bigger is refused before its data is read, one that sends more is
    refused as soon as the total passes the cap (the client sends its rows in messages of
    ``CHUNK_BYTES``). Running out of memory
    applying a request refuses that request (nothing of it applied); the service stays up.

    >>> from xorack import FTLayer
    >>> from xorack.service import AckerClient, AckerService
    >>> with AckerService.embedded(FTLayer()) as svc:
    ...     AckerClient.get(svc.location).ping()
    True
    """

    def __init__(
        self,
        ft: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        job: str | None = None,
        ft_factory: Callable[[str], Any] | None = None,
        job_tokens: dict[str, str] | None = None,
        max_jobs: int = 256,
        job_idle_seconds: float = 3600.0,
        max_request_bytes: int = DEFAULT_MAX_REQUEST,
        max_request_rows: int = DEFAULT_MAX_ROWS,
        dedup_seconds: float = 600.0,
        dedup_max_bytes: int = 256 << 20,
        close_ft: bool = False,
        advertise: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            token = check_token(token)
            tokens = {check_job(j): check_token(t) for j, t in (job_tokens or {}).items()}
        except ValueError as exc:
            raise ServiceError(f"cannot serve with this token: {exc}") from None
        if any(t is None for t in tokens.values()):
            raise ServiceError("job_tokens: every job's token must be a non-empty string")
        job = check_job(job)
        if ft is None and ft_factory is None:
            raise ValueError("give the FT layer to serve (ft) or a factory of FT layers per job")
        if not is_loopback(host) and not token:
            raise ServiceError(
                f"refusing to listen on non-loopback address {host!r} without a token: "
                "pass token=... (xorack serve --token, or XORACK_TOKEN) so that only your jobs "
                "can report to this acker"
            )
        tls = _tls_pair(tls_cert, tls_key)
        if not is_loopback(host) and tls is None:
            raise ServiceError(
                f"refusing to listen on non-loopback address {host!r} without TLS: the token "
                "would cross the network in clear; pass tls_cert=... and tls_key=... (PEM files; "
                "xorack serve --tls-cert/--tls-key)"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        middleware = {"xorack": _CallFactory(token, {j: t for j, t in tokens.items() if t})}
        check_grpc_usable()
        mark_grpc()
        bind = _location(host, port, tls=tls is not None)
        try:
            super().__init__(
                bind, middleware=middleware, tls_certificates=[tls] if tls is not None else []
            )
        except Exception as exc:  # address in use, bad host, bad certificate, ...
            raise ServiceError(
                f"cannot listen on {bind} (port in use? host not local? certificate and key "
                f"not a pair?): {str(exc).splitlines()[0]}"
            ) from exc
        self.ft = ft
        self.job = job
        self.host = host
        self.advertise = advertise
        #: The PEM certificate this service presents (None without TLS): the ``tls_root_certs``
        #: of its clients when it is self-signed.
        self.tls_cert_pem = tls[0] if tls is not None else None
        self.token = token
        self.max_jobs = int(max_jobs)
        self.job_idle_seconds = float(job_idle_seconds)
        self.jobs_retired = 0
        for name, value in (
            ("max_request_bytes", max_request_bytes),
            ("max_request_rows", max_request_rows),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.max_request_bytes = max_request_bytes
        self.max_request_rows = max_request_rows
        self.requests = RequestLog(ttl=dedup_seconds, max_bytes=dedup_max_bytes)
        self._jobs: dict[str, Any] = {} if ft is None else {job: ft}
        self._made: list[Any] = []  # FT layers made by the factory: closed with the service
        self._used: dict[str, float] = {}  # job -> monotonic time of its last call
        self._ft_factory = ft_factory
        self._jobs_lock = threading.Lock()
        self._close_ft = close_ft
        self._thread: threading.Thread | None = None
        self._closed = False
        self._calls: dict[str, int] = {}
        self._rejected = 0
        self._failed = 0
        self._counter_lock = threading.Lock()

    @property
    def jobs(self) -> dict[str, Any]:
        """``{job: FT layer}`` of the jobs served so far."""
        with self._jobs_lock:
            return dict(self._jobs)

    def ft_of(self, job: str | None = None) -> Any:
        """The FT layer of ``job`` (made by ``ft_factory`` on first use); ``_RequestError``
        when this service does not serve that job."""
        job = check_job(job)
        with self._jobs_lock:
            ft = self._jobs.get(job)
            if ft is not None:
                self._used[job] = time.monotonic()
                return ft
            if self._ft_factory is None:
                raise _RequestError(
                    f"this acker serves job {self.job!r} only, not {job!r}: pass "
                    f"job={self.job!r} to AckerClient.get (or run a standalone xorack serve, "
                    "which serves any job)"
                )
            if self._closed:
                raise flight.FlightUnavailableError("the acker is shutting down")
            if len(self._jobs) >= self.max_jobs:
                self._retire_idle_jobs()
            if len(self._jobs) >= self.max_jobs:
                raise _RequestError(
                    f"this acker already serves {len(self._jobs)} jobs with records pending or "
                    f"used in the last {self.job_idle_seconds:g} s (max_jobs): cannot start job "
                    f"{job!r}; use another acker, or restart this one with more"
                )
            ft = self._ft_factory(job)
            self._made.append(ft)
            self._jobs[job] = ft
            self._used[job] = time.monotonic()
            return ft

    def _retire_idle_jobs(self) -> None:
        """Close the jobs made by the factory that have nothing pending and were not used for
        ``job_idle_seconds`` (called when ``max_jobs`` are served and a new job comes)."""
        now = time.monotonic()
        for job, ft in list(self._jobs.items()):
            if ft not in self._made or now - self._used.get(job, now) < self.job_idle_seconds:
                continue
            if ft.pending:  # records (or replays waiting) of a job not finished
                continue
            with contextlib.suppress(AttributeError):
                ft.stop()
            ft.close()
            self._made.remove(ft)
            del self._jobs[job]
            self._used.pop(job, None)
            self.jobs_retired += 1

    # ---- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def embedded(
        cls,
        ft: Any,
        *,
        token: str | None = None,
        job: str | None = None,
        host: str = "127.0.0.1",
        advertise: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> AckerService:
        """Start a service for ``ft`` (serving the job ``job``, None = ``"default"``) on ``host``
        (127.0.0.1 by default) and a free port, in a daemon thread. ``advertise`` is the host
        name executors reach it by (default ``host``); a non-loopback ``host`` needs ``token``
        and TLS (``tls_cert``, ``tls_key``).

        >>> from xorack import FTLayer
        >>> svc = AckerService.embedded(FTLayer())
        >>> svc.location.startswith("grpc://127.0.0.1:")
        True
        >>> svc.shutdown()
        """
        svc = cls(
            ft,
            host,
            0,
            token=token,
            job=job,
            advertise=advertise,
            tls_cert=tls_cert,
            tls_key=tls_key,
            **kwargs,
        )
        svc.start()
        return svc

    def start(self) -> AckerService:
        """Serve in a daemon thread (the server already listens; this only waits on it)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve, name="xorack-acker", daemon=True)
            self._thread.start()
        return self

    @property
    def location(self) -> str:
        """``grpc://host:port`` (``grpc+tls://`` with TLS) for clients: the actual port when
        built with ``port=0``; the ``advertise`` host when given, else this machine's host name
        when listening on every interface."""
        host = self.advertise or self.host
        if host in ("0.0.0.0", "::", "[::]", ""):
            host = socket.gethostname()
        return _location(host, self.port, tls=self.tls_cert_pem is not None)

    def shutdown(self) -> None:
        """Stop accepting calls, finish the running ones, stop the thread; close the FT layer if
        this service owns it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        super().shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._jobs_lock:
            owned = list(self._made)
            if self._close_ft and self.ft is not None:
                owned.append(self.ft)
        for ft in owned:
            with contextlib.suppress(AttributeError):
                ft.stop()
            ft.close()

    def __enter__(self) -> AckerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- dispatch ----------------------------------------------------------------------------

    def _guard(self, op: str, fn: Callable[[], T]) -> T:
        """Run a handler; turn the client's mistakes and the FT layer's errors into clear
        Flight errors (never a Python traceback on the wire, never a crash)."""
        with self._counter_lock:
            self._calls[op] = self._calls.get(op, 0) + 1
        try:
            return fn()
        except flight.FlightError:
            raise
        except MemoryError as exc:  # before ArrowException: ArrowMemoryError is both
            self._count_reject()
            raise flight.FlightServerError(
                f"xorack acker ran out of memory on {op} and refused it (nothing of it was "
                f"applied; {type(exc).__name__}: {exc}): send smaller batches, or give the "
                "acker more memory / a lower max_request_bytes"
            ) from None
        except _RequestError as exc:
            self._count_reject()
            raise flight.FlightServerError(f"xorack acker rejected {op}: {exc}") from None
        except (TypeError, ValueError) as exc:  # the checks of the FT layer's arguments
            self._count_reject()
            raise flight.FlightServerError(f"xorack acker rejected {op}: {exc}") from None
        except XorackError as exc:  # the storage failed: the client's request was fine
            with self._counter_lock:
                self._failed += 1
            raise flight.FlightServerError(
                f"xorack acker failed on {op}: {type(exc).__name__}: {exc}"
            ) from None
        except Exception as exc:  # a bug of the acker: logged with its traceback, said so
            with self._counter_lock:
                self._failed += 1
            log.exception("xorack acker: internal error on %s", op)
            raise flight.FlightServerError(
                f"xorack acker failed on {op} (internal error, not a problem of the request: "
                f"{type(exc).__name__}: {exc}); the acker's log has the details"
            ) from None

    def _count_reject(self) -> None:
        with self._counter_lock:
            self._rejected += 1

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        def handle() -> None:
            if descriptor.descriptor_type != flight.DescriptorType.CMD:
                raise _RequestError("expected a command descriptor (JSON), got a path")
            cmd = _parse_command(descriptor.command, "put command")
            op = cmd["op"]
            if op not in _PUT_OPS:
                raise _RequestError(f"unknown put op {op!r}: expected one of {_PUT_OPS}")
            req = check_request_id(cmd.get("req"))  # before anything is applied
            job = _job_of(context)
            ft = self.ft_of(job)
            _check_put_schema(op, reader.schema)  # before reading a foreign stream's data
            declared = _opt_int(cmd, "bytes", None)
            if declared is not None and declared > self.max_request_bytes:
                raise _RequestError(self._too_big(op, declared, "says it is"))
            rows = _opt_int(cmd, "rows", None)
            if rows is not None and rows > self.max_request_rows:
                raise _RequestError(self._too_many(op, rows, "says it has"))
            table = self._read_bounded(op, reader)
            result = self.requests.run(
                _req_key(job, req), lambda: self._apply_put(ft, op, cmd, table), op=op
            )
            if result is not None:
                writer.write(_ids_buffer(result))

        self._guard(_op_name(descriptor.command, "put"), handle)

    def _too_big(self, op: str, size: int, verb: str) -> str:
        return (
            f"{op}: the request {verb} {size} bytes, more than this acker's limit of "
            f"{self.max_request_bytes} bytes (max_request_bytes; xorack serve --max-request-mb): "
            "send it in smaller batches"
        )

    def _too_many(self, op: str, rows: int, verb: str) -> str:
        return (
            f"{op}: the request {verb} {rows} rows, more than this acker's limit of "
            f"{self.max_request_rows} rows (max_request_rows; xorack serve --max-request-rows; "
            "each pending record costs the acker ~150-250 bytes): send it in smaller batches"
        )

    def _read_bounded(self, op: str, reader: flight.MetadataRecordBatchReader) -> pa.Table:
        """The put's data, read one message at a time and refused as soon as it passes
        ``max_request_bytes`` (the rest is never read)."""
        batches, total, rows = [], 0, 0
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            batch = chunk.data
            if batch is None:
                continue
            total += batch.get_total_buffer_size()
            if total > self.max_request_bytes:
                raise _RequestError(self._too_big(op, total, "sent at least"))
            rows += batch.num_rows
            if rows > self.max_request_rows:
                raise _RequestError(self._too_many(op, rows, "sent at least"))
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)

    def _apply_put(
        self, ft: Any, op: str, cmd: dict[str, Any], table: pa.Table
    ) -> np.ndarray | None:
        if op == "persist":
            return self._persist(ft, cmd, table)
        src = _column_u64(table, SRC, op)
        if op == "xor":
            values = _column_u64(table, XOR, op)
            hold, bits = cmd.get("hold", False), _opt_int(cmd, "chunk_bits", 0)
            if not isinstance(hold, bool):
                raise _RequestError(f"xor: 'hold' must be true or false, got {hold!r}")
            if hold or bits:
                return np.asarray(ft.xor(src, values, hold=hold, chunk_bits=bits), np.uint64)
            return np.asarray(ft.xor(src, values), dtype=np.uint64)
        if op == "release":
            bits = _opt_int(cmd, "chunk_bits", 0)
            return np.asarray(ft.release(src, chunk_bits=bits), dtype=np.uint64)
        if op == "fail":
            reason = cmd.get("reason")
            if reason is not None and not isinstance(reason, str):
                raise _RequestError(f"fail: 'reason' must be a string, got {reason!r}")
            return np.asarray(ft.fail(src, reason=reason), dtype=np.uint64)
        ft.touch(src)
        return None

    def _persist(self, ft: Any, cmd: dict[str, Any], table: pa.Table) -> np.ndarray:
        source = _opt_int(cmd, "source", 0)
        partition: Any = _opt_int(cmd, "partition", None)
        payload_cols = _persist_payload_columns(table.schema)
        if table.num_rows == 0:
            return _EMPTY_IDS
        names = table.schema.names
        key_hash = table.column(KEY_HASH).to_numpy() if KEY_HASH in names else None
        births = _column_u64(table, BIRTHS, "persist") if BIRTHS in names else None
        src_ids = _column_u64(table, SRC, "persist") if SRC in names else None
        if PARTITION in names:
            if partition is not None:
                raise _RequestError("persist: give the partition in the command or as a column")
            partition = table.column(PARTITION).to_numpy()
        for name in (KEY_HASH, PARTITION, EVENT_TIME):
            if name in names and table.column(name).null_count:
                raise _RequestError(f"persist: column {name} must not contain nulls")
        batch = table.select(payload_cols)  # chunk by chunk, never copied into one
        progress = cmd.get("progress")
        if progress is not None and not (
            isinstance(progress, list)
            and len(progress) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in progress)
        ):
            raise _RequestError(f"persist: 'progress' must be [partition, end], got {progress!r}")
        extra: dict[str, Any] = {} if progress is None else {"progress": tuple(progress)}
        idempotent = cmd.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise _RequestError(f"persist: 'idempotent' must be true or false, got {idempotent!r}")
        if idempotent:
            extra["idempotent"] = True
        epoch = cmd.get("epoch", 0)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise _RequestError(f"persist: 'epoch' must be an int >= 0, got {epoch!r}")
        if epoch:
            extra["epoch"] = epoch
        if EVENT_TIME in names:  # absent: no event times (and an FT layer of tests may lack it)
            extra["event_time"] = table.column(EVENT_TIME).to_numpy()
        ids = ft.persist(
            batch,
            key_hash=key_hash,
            source=source,
            partition=partition,
            births=births,
            src_ids=src_ids,
            **extra,
        )
        return np.asarray(ids, dtype=np.uint64)

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        def handle() -> flight.FlightDataStream:
            cmd = _parse_command(ticket.ticket, "ticket")
            op = cmd["op"]
            if op not in _GET_OPS:
                raise _RequestError(f"unknown ticket op {op!r}: expected one of {_GET_OPS}")
            job = _job_of(context)
            ft = self.ft_of(job)
            if op == "fetch_replays":
                return self._fetch(ft, cmd)
            if op == "dead_letters":
                source = _opt_int(cmd, "source", None)
                if source is None:
                    return flight.RecordBatchStream(ft.dead_letters())
                return flight.RecordBatchStream(ft.dead_letters(source=source))
            source = _opt_int(cmd, "source", 0)
            partition = _opt_int(cmd, "partition", None)
            first = _opt_flag(cmd, "first_ids", "replays")
            req = check_request_id(cmd.get("req"))
            table = self.requests.run(
                _req_key(job, req), lambda: self._take(ft, source, partition, first), op=op
            )
            return flight.RecordBatchStream(table)

        return self._guard(_op_name(ticket.ticket, "get"), handle)

    def _fetch(self, ft: Any, cmd: dict[str, Any]) -> flight.FlightDataStream:
        source = _opt_int(cmd, "source", 0)
        partition = _opt_int(cmd, "partition", None)
        if partition is None:
            raise _RequestError("fetch_replays: the ticket must name a partition")
        tag = cmd.get("tag")
        if not isinstance(tag, str):
            raise _RequestError(f"fetch_replays: 'tag' must be a string, got {tag!r}")
        columns = cmd.get("columns")
        if columns is not None:  # a projection (the driver's look at a round's attempts)
            if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
                raise _RequestError(
                    f"fetch_replays: 'columns' must be a list of names, got {columns!r}"
                )
            table = ft.fetch_replays(source, tag, partition)
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise _RequestError(f"fetch_replays: no column {missing[0]!r} in the replays")
            return flight.RecordBatchStream(table.select(columns))
        if hasattr(ft, "replay_reader"):  # streamed a piece at a time
            return flight.RecordBatchStream(ft.replay_reader(source, tag, partition))
        return flight.RecordBatchStream(ft.fetch_replays(source, tag, partition))

    def _prepare(self, ft: Any, body: dict[str, Any]) -> list[pa.Buffer]:
        source = _opt_int(body, "source", 0)
        tag, spec = body.get("tag"), body.get("partitioner")
        first = _opt_flag(body, "first_ids", "prepare_replays")
        if not isinstance(tag, str):
            raise _RequestError(f"prepare_replays: 'tag' must be a string, got {tag!r}")
        if spec is not None and not isinstance(spec, str):
            raise _RequestError(f"prepare_replays: 'partitioner' must be a string, got {spec!r}")
        counts = ft.prepare_replays(source, partitioner=spec, tag=tag, first_ids=first)
        out = {"counts": {str(p): int(n) for p, n in counts.items()}}
        return [pa.py_buffer(json.dumps(out).encode())]

    def _take(
        self, ft: Any, source: int | None, partition: int | None, first_ids: bool
    ) -> pa.Table:
        first = {"first_ids": True} if first_ids else {}  # (an FT layer of tests may lack it)
        parts = ft.take_replays(source=source, partition=partition, **first)
        tables = [parts[p] for p in sorted(parts) if parts[p].num_rows]
        if not tables:
            return _EMPTY_REPLAYS.empty_table()
        if all(t.schema == tables[0].schema for t in tables):
            return pa.concat_tables(tables)
        return pa.concat_tables(tables, promote_options="permissive")

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[pa.Buffer]:
        def handle() -> list[pa.Buffer]:
            kind = action.type
            if kind not in _ACTIONS:
                raise _RequestError(f"unknown action {kind!r}: expected one of {sorted(_ACTIONS)}")
            raw = action.body.to_pybytes() if action.body is not None else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise _RequestError(f"{kind}: body must be a JSON object, got {raw[:60]!r}")
            job = _job_of(context)
            ft = self.ft_of(job)
            if kind == "ping":
                return [pa.py_buffer(b"pong")]
            if kind == "stats":
                stats = self.stats(job)
                return [pa.py_buffer(json.dumps(stats, default=_json_default).encode())]
            if kind == "prepare_replays":  # idempotent per (source, tag): no request log
                return self._prepare(ft, body)
            if kind == "job_state":  # marks are set, not toggled: a retry changes nothing more
                marks, clear = body.get("marks"), body.get("clear", [])
                if marks is not None and not isinstance(marks, dict):
                    raise _RequestError(f"job_state: 'marks' must be an object, got {marks!r}")
                if not isinstance(clear, list):
                    raise _RequestError(f"job_state: 'clear' must be a list, got {clear!r}")
                state = ft.job_state(marks=marks, clear=clear)
                return [pa.py_buffer(json.dumps(state).encode())]
            if kind == "forget_known":  # forgetting twice forgets nothing more: no request log
                epoch = body.get("epoch")
                if isinstance(epoch, bool) or not isinstance(epoch, int):
                    raise _RequestError(f"forget_known: 'epoch' must be an int, got {epoch!r}")
                out = {"forgotten": int(ft.forget_known(epoch))}
                return [pa.py_buffer(json.dumps(out).encode())]
            if kind == "release_replays":
                tag = body.get("tag")
                if tag is not None and not isinstance(tag, str):
                    raise _RequestError(f"release_replays: 'tag' must be a string, got {tag!r}")
                ft.release_replays(_opt_int(body, "source", None), tag=tag)
                return [pa.py_buffer(b"{}")]
            fn = {"rotate": ft.rotate, "expire_all": ft.expire_all, "take_ended": ft.take_ended}[
                kind
            ]
            if kind == "expire_all" and body.get("collateral"):  # see FTLayer.expire_all
                fn = partial(ft.expire_all, collateral=True)
            req = check_request_id(body.get("req"))
            ids = self.requests.run(
                _req_key(job, req), lambda: np.asarray(fn(), dtype=np.uint64), op=kind
            )
            return [_ids_buffer(ids)]

        return iter(self._guard(action.type, handle))

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return sorted(_ACTIONS.items())

    def stats(self, job: str | None = None) -> dict[str, Any]:
        """The stats of ``job``'s FT layer plus the service's own counters (under
        ``"service"``)."""
        job = check_job(job) if job is not None else self.job
        ft = self.ft_of(job)
        shard = getattr(ft, "shard", None)
        stats = ft.stats()
        out = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
        with self._counter_lock:
            calls = dict(self._calls)
            rejected = self._rejected
            failed = self._failed
        out["service"] = {
            "location": self.location,
            "job": job,
            "shard": None if shard is None else str(shard),
            "jobs": len(self._jobs),
            "jobs_retired": self.jobs_retired,
            "calls": calls,
            "rejected": rejected,
            "failed": failed,
            "retries_deduplicated": self.requests.hits,
            "dedup_evicted_early": self.requests.evicted_early,
            # which kernels apply the events, and the process's CPU seconds so far (all its
            # threads): what benchmarks/bench_shards.py reads from each shard
            "backend": getattr(ft, "backend", None) or kernels.backend,
            "cpu_s": time.process_time(),
        }
        return out


def _job_of(context: flight.ServerCallContext) -> str:
    """The job of a call (read and checked by ``_CallFactory`` before the handler runs)."""
    call = context.get_middleware("xorack")
    return call.job if call is not None else DEFAULT_JOB


def _req_key(job: str, req: str | None) -> tuple[str, str] | None:
    """The request log's key: request ids are the job's own."""
    return None if req is None else (job, req)


def _op_name(command: bytes | None, default: str) -> str:
    """The op a command/ticket names, for counters and messages (``default`` if unreadable)."""
    try:
        op = json.loads(command or b"").get("op", default)
    except Exception:
        return default
    return op if isinstance(op, str) and op in (*_PUT_OPS, *_GET_OPS) else default


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
