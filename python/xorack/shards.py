"""A sharded acker: N acker processes, each owning the source ids that hash to it
(:mod:`xorack.sharding`), with its own storage; and the client that routes to them.

One acker process applies the events of a whole cluster on one core (the FT layer takes one
lock per call). A sharded acker spreads the records over N processes: shard ``k`` owns the
blocks of 1024 source ids (``id >> 10``) whose mixed value falls in the ``k``-th slice (see
:mod:`xorack.sharding`), and draws its replays' ids in its own blocks too, so every event about
a record, and every chunk event of a barrier, goes to the one shard that holds it. A SQLite
storage becomes one file per shard (``name.shard0of2.db``); memory stays memory.

Location: a sharded acker is named by its shards' locations joined by commas, in shard order,
``grpc://127.0.0.1:8815,grpc://127.0.0.1:8816``: one string that executors receive like any
location. ``AckerClient.get(location)`` returns a :class:`ShardedAckerClient` for such a
string (so the Spark code never knows), which splits persists, events, fails and touches by
source id and sends the parts to their shards in parallel; the driver's operations go to every
shard (``expire_all``, ``rotate``, ``take_ended``, ``take_replays``, ``dead_letters``: results
concatenated; ``stats``: counters summed).

>>> import pyarrow as pa
>>> with ShardedAcker(2) as acker:
...     client = AckerClient.get(acker.location)
...     src = client.persist(pa.record_batch({"x": [1, 2, 3]}), births=[1, 2, 3])
...     len(client.xor(src, [1, 2, 3])), client.stats()["completed"]
(3, 3)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from ._checks import as_u64, same_length
from .errors import ServiceError
from .service import AckerClient, RetryPolicy
from .sharding import (
    BLOCK_BITS,
    Shard,
    draw_ids,
    join_locations,
    shard_of,
    shard_storage,
    split_locations,
)

__all__ = ["ShardedAcker", "ShardedAckerClient", "merge_stats"]

T = TypeVar("T")
log = logging.getLogger(__name__)
_EMPTY = np.empty(0, dtype=np.uint64)


# --------------------------------------------------------------------------------------------
# Client


def merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stats of a sharded acker from its shards' stats: counters (ints) summed, nested
    dicts merged the same way (``replayed_by_source``, the service's ``calls``), latency
    percentiles the largest shard's (an upper bound: the shards' samples are not shipped),
    anything else (names) the first shard's.

    >>> merge_stats([{"pending": 2, "latency_p50": 0.1, "replayed_by_source": {0: 1}},
    ...              {"pending": 3, "latency_p50": None, "replayed_by_source": {0: 2, 1: 1}}])
    {'pending': 5, 'latency_p50': 0.1, 'replayed_by_source': {0: 3, 1: 1}}
    """
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p[key] for p in parts if key in p]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = merge_stats(values)
        elif all(v is None or isinstance(v, float) for v in values):
            numbers = [v for v in values if v is not None]
            out[key] = max(numbers) if numbers else None
        else:
            out[key] = values[0]
    return out


#: The default retry budget of a sharded client's calls (~16 s of waiting): longer than a
#: single acker's (~4 s), to span a shard process's restart (a new Python process importing
#: xorack and reopening its storage: 1-2 s idle, several on a busy machine). Retried calls are
#: never applied twice within a shard's life (request ids); across a restart a retried event
#: of an old id is an orphan, as with any restarted acker.
RESTART_RETRY = RetryPolicy(attempts=20)


class ShardedAckerClient:
    """A client of a sharded acker (``location`` = the shards' locations joined by commas, in
    shard order); its methods mirror :class:`~xorack.service.AckerClient`.

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

    @classmethod
    def get(cls, location: str, **kwargs: Any) -> Any:
        """The cached client of this process for ``location`` (see ``AckerClient.get``)."""
        return AckerClient.get(location, **kwargs)

    def close(self) -> None:
        """Close every shard's connection and the fan-out threads; drop it from the cache."""
        from . import service

        with service._clients_lock:
            for key, value in list(service._clients.items()):
                if value is self:
                    del service._clients[key]
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
        call has ended when this returns or raises (the first error is raised)."""
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
            return _EMPTY.copy()
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
    ) -> np.ndarray:
        """Persist ``batch``: each row on the shard its source id belongs to (ids drawn here
        when not given); returns the source ids in row order (see ``AckerClient.persist``).
        ``progress`` is refused: a batch split over shards is not persisted atomically, so a
        sharded acker cannot resume a job (see :meth:`job_state`)."""
        from .ftlayer import check_persist_args

        if progress is not None:
            self.job_state()

        a = check_persist_args(batch, key_hash, source, partition, births, src_ids)
        if idempotent and a.src_ids is None:
            raise ValueError("idempotent: give the src_ids (derived from the records)")
        n = a.batch.num_rows
        if n == 0:
            return _EMPTY.copy()
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
            )

        self._run([part(k, rows) for k, rows in self._split(src)])
        return src

    def xor(self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0) -> np.ndarray:
        """Apply XOR events, each on its source id's shard; the source ids completed (held,
        with ``hold``). With ``chunk_bits`` each row is one chunk's event (``src_ids`` are chunk
        numbers, see ``FTLayer.xor``): routed to the shard of the chunk's block, which holds
        every record of the chunk (chunks of at most ``2**BLOCK_BITS`` ids)."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        val = as_u64(values, "values")
        same_length(src_ids=src, values=val)
        if not src.size:
            return _EMPTY.copy()
        kw: dict[str, Any] = {}
        route = src
        if hold or chunk_bits:
            kw = {"hold": bool(hold), "chunk_bits": int(chunk_bits)}
        if chunk_bits:
            if not 0 < int(chunk_bits) <= BLOCK_BITS:
                raise ValueError(
                    f"chunk_bits={chunk_bits}: a sharded acker keeps the ids of one block of "
                    f"2**{BLOCK_BITS} on one shard, so its chunks can have at most "
                    f"{BLOCK_BITS} bits"
                )
            with np.errstate(over="ignore"):
                route = src << np.uint64(chunk_bits)  # an id of the chunk: its block's shard
        return self._ids(
            self._run(
                [
                    _bind(self.shards[k].xor, (src, val) if r is None else (src[r], val[r]), kw)
                    for k, r in self._split(route)
                ]
            )
        )

    def release(self, chunks: Any = (), chunk_bits: int = 0) -> np.ndarray:
        """End the held completions on every shard (those of ``chunks`` replayed as
        collateral); the collateral replays' ended source ids (see ``AckerClient.release``)."""
        c = as_u64(chunks, "chunks", nonzero=True)
        return self._ids(self.broadcast("release", c, chunk_bits))

    def fail(self, src_ids: Any, reason: str | None = None) -> np.ndarray:
        """Fail records explicitly, each on its shard; the new source ids of their replays."""
        src = as_u64(src_ids, "src_ids", nonzero=True)
        if not src.size:
            return _EMPTY.copy()
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

    def take_replays(self, source: int = 0, partition: int | None = None) -> dict[int, pa.Table]:
        """The replays waiting on every shard: ``{partition: table}`` (the shards' tables of a
        partition concatenated)."""
        merged: dict[int, list[pa.Table]] = {}
        for parts in self.broadcast("take_replays", source=source, partition=partition):
            for p, table in parts.items():
                merged.setdefault(p, []).append(table)
        return {p: _concat(tables) for p, tables in sorted(merged.items())}

    # per-partition replay rounds (executors fetch their partition from every shard): each
    # shard prepares, serves and frees its own replays; nothing here knows their format

    def prepare_replays(
        self, source: int, partitioner: str | None, tag: str, first_ids: str | None = None
    ) -> dict[int, int]:
        """Every shard prepares its replays of ``source`` for the round ``tag``; the rows per
        partition added up over the shards (see ``AckerClient.prepare_replays``)."""
        counts: dict[int, int] = {}
        for part in self.broadcast("prepare_replays", source, partitioner, tag, first_ids):
            for p, n in part.items():
                counts[int(p)] = counts.get(int(p), 0) + int(n)
        return dict(sorted(counts.items()))

    def fetch_replays(self, source: int, tag: str, partition: int) -> pa.Table:
        """Every shard's replays of ``partition`` for the round ``tag``, concatenated."""
        return self.broadcast_tables("fetch_replays", source, tag, partition)

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

    def expire_all(self) -> np.ndarray:
        """Time out every pending record on every shard; the new ids of their replays."""
        return self._ids(self.broadcast("expire_all"))

    def take_ended(self) -> np.ndarray:
        """The ended attempts of every shard since the previous call (each id once)."""
        return self._ids(self.broadcast("take_ended"))

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


# --------------------------------------------------------------------------------------------
# Processes

#: How long a shard process may take to start listening (imports, opening SQLite, recovery).
START_TIMEOUT = 60.0
#: Restarts of one shard process (after it died) before the supervisor gives up on it.
MAX_RESTARTS = 5
_WATCH_INTERVAL = 0.1


class _ShardProcess:
    """One shard's ``xorack serve --shard k/N`` process, its port and its log file."""

    def __init__(self, shard: Shard, argv: list[str], env: dict[str, str]) -> None:
        self.shard = shard
        self.argv = argv
        self.env = env
        self.port = 0
        self.location = ""
        self.restarts = 0
        self.gave_up = False
        self.proc: subprocess.Popen[str] | None = None
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in close()
            prefix=f"xorack-shard{shard.index}-", suffix=".log", delete=False
        )

    def spawn(self) -> None:
        argv = [*self.argv, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,  # the lifeline: EOF when this process dies
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=self.env,
            text=True,
        )

    def wait_listening(self, deadline: float) -> None:
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                line = proc.stdout.readline()
                break
            if proc.poll() is not None:
                break
        if "listening on " not in line:
            raise ServiceError(
                f"acker shard {self.shard} did not start"
                f"{' (timed out)' if proc.poll() is None else ''}: {self.tail() or line!r}"
            )
        self.location = line.split("listening on ")[1].split()[0]
        self.port = int(self.location.rsplit(":", 1)[1])

    def tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError), open(self.log.name, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
        return ""

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()  # EOF on the lifeline: a clean shutdown
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


class ShardedAcker:
    """N acker processes (``xorack serve --shard k/N`` each), started together, watched and
    stopped together; ``location`` names them all (comma-separated, in shard order).

    ``storage``: ``"memory"`` or a SQLite spec (one file per shard: ``name.shard0of2.db``).
    ``job``: the job each shard serves on that storage (others get files of their own, as with
    ``xorack serve``). ``host``/``advertise``/``port`` (shard k listens on ``port + k``; 0 = free
    ports), ``token`` (given to the shards through their environment, never their command
    line), ``tls_cert``/``tls_key`` and ``serve_args`` (more ``xorack serve`` options, e.g.
    ``["--max-attempts", "3", "--rotate-interval", "0"]``) configure every shard; ``env``
    adds to the environment they inherit (e.g. ``XORACK_JOB_TOKENS``: secrets stay off their
    command lines).

    A shard process that dies is restarted on its port with its storage (its unfinished
    records are recovered and replayed; clients retry meanwhile), up to ``MAX_RESTARTS`` times.
    Each shard's stderr goes to a temporary log file (deleted by :meth:`close`), whose last
    lines are in the error when a shard cannot start and in the warning when one dies.
    The shards never outlive this object: :meth:`close` (also at interpreter exit) stops them,
    and each shard shuts down by itself when the process that started it dies (its stdin, a
    pipe from here, reaches EOF).

    >>> with ShardedAcker(2, serve_args=["--rotate-interval", "0"]) as acker:
    ...     acker.location.count(","), len(acker.pids)
    (1, 2)
    """

    def __init__(
        self,
        count: int,
        *,
        storage: str = "memory",
        job: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        serve_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        restart: bool = True,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        shards = [Shard(k, count) for k in range(count)]  # checks count
        env = {**os.environ, **(env or {})}
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env.pop("XORACK_TOKEN", None)
        if token:
            env["XORACK_TOKEN"] = token
        self.restart = restart
        self._closed = False
        self._lock = threading.Lock()
        self._procs: list[_ShardProcess] = []
        for shard in shards:
            argv = [sys.executable, "-m", "xorack", "serve", "--shard", str(shard), "--lifeline"]
            argv += ["--storage", shard_storage(storage, shard), "--host", host]
            if job is not None:
                argv += ["--job", job]
            if advertise is not None:
                argv += ["--advertise", advertise]
            if tls_cert is not None:
                argv += ["--tls-cert", os.fspath(tls_cert), "--tls-key", os.fspath(tls_key or "")]
            argv += list(serve_args)
            p = _ShardProcess(shard, argv, env)
            p.port = port + shard.index if port else 0
            self._procs.append(p)
        _live.add(self)
        try:
            for p in self._procs:
                p.spawn()
            deadline = time.monotonic() + start_timeout
            for p in self._procs:
                p.wait_listening(deadline)
        except BaseException:
            self.close()
            raise
        self.location = join_locations([p.location for p in self._procs])
        self._watcher = threading.Thread(target=self._watch, name="xorack-shards", daemon=True)
        self._watcher.start()

    @property
    def pids(self) -> list[int]:
        """The shard processes' ids, in shard order."""
        return [p.proc.pid for p in self._procs if p.proc is not None]

    @property
    def restarts(self) -> list[int]:
        """How many times each shard process was restarted."""
        return [p.restarts for p in self._procs]

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(_WATCH_INTERVAL)
            for p in self._procs:
                with self._lock:
                    if self._closed or p.proc is None or p.proc.poll() is None:
                        continue
                    code = p.proc.returncode
                    if p.gave_up:
                        continue
                    if not self.restart or p.restarts >= MAX_RESTARTS:
                        log.error(
                            "xorack acker shard %s exited (status %s); not restarted: %s",
                            p.shard,
                            code,
                            p.tail(),
                        )
                        p.gave_up = True
                        continue
                    log.warning(
                        "xorack acker shard %s exited (status %s): restarting; its log: %s",
                        p.shard,
                        code,
                        p.tail(),
                    )
                    with contextlib.suppress(OSError, ValueError):
                        if p.proc.stdout is not None:
                            p.proc.stdout.close()
                        if p.proc.stdin is not None:
                            p.proc.stdin.close()
                    try:
                        p.spawn()
                        p.wait_listening(time.monotonic() + START_TIMEOUT)
                    except Exception as exc:  # tried again at the next look
                        log.error("xorack acker shard %s failed to restart: %s", p.shard, exc)
                    finally:  # counted once the attempt is over (its process is spawned;
                        p.restarts += 1  # a failed start is tried again at the next look)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every shard (a clean shutdown: durable storage closed), then forget them.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for p in self._procs:
            p.stop(timeout)
        for p in self._procs:
            p.close()
        _live.discard(self)

    def wait(self, stop: threading.Event) -> None:
        """Block until ``stop`` is set (``xorack serve --shards``)."""
        while not stop.wait(0.5):
            pass

    def __enter__(self) -> ShardedAcker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_live: weakref.WeakSet[ShardedAcker] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for acker in list(_live):
        with contextlib.suppress(Exception):
            acker.close(timeout=5.0)
