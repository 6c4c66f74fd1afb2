"""XOR events a client holds back so that each request to an acker (or acker shard) is large.

An acker pays a fixed cost per request (a Flight stream, the handler, the FT layer's lock:
~0.5 ms of its CPU, measured by ``benchmarks/bench_shards.py``) besides its cost per event
(~30 ns). A client of N shards splits every batch of events into N requests, so with small
batches or many shards the fixed cost dominates: the acker's CPU per event grows with N. An
``EventBuffer`` keeps the events of *deferred* xor calls per shard and sends a shard's events
as one request once it holds ``rows`` of them; :meth:`EventBuffer.flush` sends the rest.

The guarantees of a plain ``xor`` stay: every deferred event is sent exactly once (a request
id per request, as any xor), no later than the first of: the shard's buffer reaching ``rows``,
the next deferred call after ``max_delay`` seconds, :meth:`flush`, and any other call of the
client that owns the buffer (a persist, fail, touch, release, plain xor, driver operation:
the client flushes first, so the acker sees one process's calls in the order they were made).
The events of one buffer share one kind (``hold``, ``chunk_bits``): a deferred xor of another
kind sends the buffer first. Events are XORed into the acker's table like any batch (within a
request the events of a key combine first; XOR is associative, so coalescing calls changes no
record's final value and can complete no record early). A send that fails raises in the call
that triggered it, and its events are dropped, as a failing ``xor`` call's are.
:meth:`flush` returns once every event deferred before it has been applied (a concurrent
flush waits for a send in progress), with the source ids those sends completed.

With ``background=True`` (``client.deferred.background = True``; off by default: on 16 cores
it gained 7 % at 8 shards with 16 clients and lost 10 % with 8, see
``benchmarks/results/shards_device_16core_background.md``) a send that a full buffer triggers runs
in a thread of the buffer while the caller goes on (a Spark task keeps computing its next
batches while the acker applies the last ones): at most one such send is in flight, the next
one waits for it (so sends keep their order and the memory held stays bounded), and
:meth:`flush` waits for it. Such a send's error is raised once, by the first call of the
buffer that finds it ended (``add``; :meth:`flush` and :meth:`settle` wait for it), its events
dropped as a failing ``xor`` call's are; the events of the call that raises are not taken. A
call of the client made from inside ``send`` (on that thread) does not flush again.

>>> import numpy as np
>>> sent = []
>>> buf = EventBuffer(2, lambda parts, kind: sent.append(parts) or np.empty(0, np.uint64), rows=4)
>>> buf.add([(0, np.array([1, 2], np.uint64), np.array([5, 6], np.uint64))], (False, 0))
>>> buf.add([(0, np.array([3, 4], np.uint64), np.array([7, 8], np.uint64))], (False, 0))
>>> [(k, s.tolist()) for k, s, _ in sent[0]]  # shard 0 reached 4 rows: one request
[(0, [1, 2, 3, 4])]
>>> buf.add([(1, np.array([9], np.uint64), np.array([1], np.uint64))], (False, 0))
>>> buf.rows, len(buf.flush()), buf.rows
(1, 0, 0)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["COALESCE_ROWS", "MAX_DELAY", "EventBuffer", "Kind", "Part"]

#: Events a client holds for one shard before sending them as one request: from 64 K events on
#: a request costs the acker about what larger ones do per event (bench_shards.py).
COALESCE_ROWS = 1 << 16

#: Seconds a deferred event may wait for its shard's buffer to fill, checked at the next
#: deferred call (a Spark task flushes at its end anyway; this bounds a long task's delay,
#: far below any acker timeout).
MAX_DELAY = 1.0

#: A buffer's kind of events: (hold, chunk_bits), as ``xor(..., hold=, chunk_bits=)``.
Kind = tuple[bool, int]
#: One shard's part of a batch: (shard, source ids, values).
Part = tuple[int, np.ndarray, np.ndarray]

_EMPTY = np.empty(0, dtype=np.uint64)


class EventBuffer:
    """Deferred XOR events per shard (``shards`` of them), sent through ``send(parts, kind)``
    (one request per part, the parts in parallel; returns the source ids completed) when a
    shard holds ``rows`` events, at the next deferred call after ``max_delay`` seconds, and
    on :meth:`flush`. Thread-safe; a send happens under the buffer's (re-entrant) lock, so
    a call of the same client made while sending (from ``send`` itself) does not flush again.
    """

    def __init__(
        self,
        shards: int,
        send: Callable[[list[Part], Kind], np.ndarray],
        rows: int = COALESCE_ROWS,
        max_delay: float = MAX_DELAY,
        clock: Callable[[], float] = time.monotonic,
        background: bool = False,
    ) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        if not max_delay >= 0:
            raise ValueError(f"max_delay must be >= 0 seconds, got {max_delay!r}")
        if not isinstance(background, bool):
            raise TypeError(f"background must be True or False, got {background!r}")
        self.shards = int(shards)
        self.limit = rows
        self.max_delay = float(max_delay)
        self._send = send
        self._clock = clock
        self._lock = threading.RLock()
        self._sender: int | None = None  # the thread inside send() now, if any
        #: Whether a full shard's send runs in the buffer's thread (see the module).
        self.background = background
        self._thread: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._in_flight: Future[np.ndarray] | None = None
        self._kind: Kind = (False, 0)
        self._src: list[list[np.ndarray]] = [[] for _ in range(self.shards)]
        self._val: list[list[np.ndarray]] = [[] for _ in range(self.shards)]
        self._held = [0] * self.shards
        self._since = 0.0  # when the oldest buffered event arrived
        self._completed: list[np.ndarray] = []
        self.rows = 0  # events buffered now (all shards)
        self.requests = 0  # requests sent so far (a failed one included)

    def waiting(self) -> bool:
        """Whether a call of the owning client must :meth:`flush` first: events are buffered,
        or a send is in progress (another thread's call then waits for it in ``flush``)."""
        return bool(self.rows) or self._sender is not None or self._in_flight is not None

    def _inside_send(self) -> bool:
        return self._sender == threading.get_ident()

    def add(self, parts: Sequence[Part], kind: Kind) -> None:
        """Buffer the events of one deferred xor, already split by shard (each part's arrays
        owned by the buffer from now on: pass copies); send what is due."""
        if self._inside_send():
            raise RuntimeError("a deferred xor from inside the buffer's own send")
        with self._lock:
            self._forked()
            if self._in_flight is not None and self._in_flight.done():
                self._settle_locked()  # its error raises here, before these events are taken
            if self.rows and kind != self._kind:
                self._flush_locked()
            if not self.rows:
                self._kind = kind
                self._since = self._clock()
            full = []
            for shard, src, val in parts:
                if not len(src):
                    continue
                self._src[shard].append(src)
                self._val[shard].append(val)
                self._held[shard] += len(src)
                self.rows += len(src)
                if self._held[shard] >= self.limit:
                    full.append(shard)
            if self.rows and self._clock() - self._since >= self.max_delay:
                self._flush_locked()
            elif full:
                self._send_locked(full, wait=False)

    def flush(self) -> np.ndarray:
        """Send every buffered event; the source ids completed (held, for a ``hold`` kind) by
        the sends since the previous flush. Returns once they are all applied."""
        if self._inside_send():  # a call made by send() itself: its events are on their way
            return _EMPTY
        with self._lock:
            self._forked()
            self._flush_locked()
            done = self._completed
            self._completed = []
        if not done:
            return _EMPTY.copy()
        return done[0] if len(done) == 1 else np.concatenate(done)

    def settle(self) -> None:
        """Wait for the send in flight (``background``), if any; raise its error."""
        if self._inside_send():
            return
        with self._lock:
            self._forked()
            self._settle_locked()

    def close(self) -> None:
        """Stop the buffer's send thread (after a :meth:`flush`: what is buffered stays)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            thread.shutdown(wait=True)

    def discard(self) -> int:
        """Drop the buffered events unsent (a forked child's inherited copy); how many."""
        with self._lock:
            n = self.rows
            self._take(range(self.shards))
            return n

    def _forked(self) -> None:
        """In a forked child the parent's send thread and its send in flight are not there:
        the child starts without them (what the parent buffered is the parent's to send)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread, self._in_flight, self._sender = None, None, None

    def _settle_locked(self) -> None:
        future, self._in_flight = self._in_flight, None
        if future is not None:
            done = future.result()  # its error raises here, its events dropped
            if len(done):
                self._completed.append(done)

    def _flush_locked(self) -> None:
        self._send_locked([k for k in range(self.shards) if self._held[k]], wait=True)

    def _take(self, shards: Sequence[int]) -> list[Part]:
        parts = []
        for k in shards:
            src, val = self._src[k], self._val[k]
            if src:
                parts.append(
                    (
                        k,
                        src[0] if len(src) == 1 else np.concatenate(src),
                        val[0] if len(val) == 1 else np.concatenate(val),
                    )
                )
            self.rows -= self._held[k]
            self._src[k], self._val[k], self._held[k] = [], [], 0
        if self.rows:
            self._since = self._clock()  # the rest waits from now (an upper bound is enough)
        return parts

    def _send_locked(self, shards: Sequence[int], wait: bool) -> None:
        """Send these shards' events: at once in this thread (``wait``, or not
        ``background``), else in the buffer's thread once the send in flight has ended."""
        self._settle_locked()  # one send in flight at most, in order; its error raises here
        parts = self._take(shards)  # taken first: a failed send drops them (see the module)
        if not parts:
            return
        self.requests += len(parts)
        if wait or not self.background:
            done = self._run_send(parts, self._kind)
            if len(done):
                self._completed.append(done)
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="xorack-events")
        self._in_flight = self._thread.submit(self._run_send, parts, self._kind)

    def _run_send(self, parts: list[Part], kind: Kind) -> np.ndarray:
        self._sender = threading.get_ident()
        try:
            return self._send(parts, kind)
        finally:
            self._sender = None
