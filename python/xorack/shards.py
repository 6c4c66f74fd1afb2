"""A sharded acker: N acker processes, each owning the source ids that hash to it
(:mod:`xorack.sharding`), with its own storage. The client that routes to them,
``ShardedAckerClient``, lives in :mod:`xorack.client` (re-exported here).

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
>>> from xorack.client import AckerClient
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
from collections.abc import Sequence

from .client import ShardedAckerClient, merge_stats  # re-exported (their home before)
from .errors import ServiceError
from .sharding import Shard, join_locations, shard_storage

__all__ = ["ShardedAcker", "ShardedAckerClient", "merge_stats"]

log = logging.getLogger(__name__)


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
