"""XOR events a client holds back so that each request to an acker (or acker shard) is large.

An acker pays a fixed cost per request (a Flight stream, the handler, the FT layer's lock:
~0.5 ms of its CPU, measured by ``benchmarks/bench_shards.py``) besides its cost per event
(~30 ns). A client of N shards splits every batch of events into N requests, so with small
batches or many shards the fixed cost dominates: the acker's CPU per event grows with N. An
``EventBuffer`` keeps the events of *deferred* xor calls per shard and sends a shard's events
as one request once it holds ``rows`` of them; :meth:`EventBuffer.flush` sends the rest.
Each shard's events are copied into a buffer of its own as they are deferred (a sharded
client's batch scattered by shard straight into them: ``sharding.scatter_by_shard``, one
pass), and a request sends the filled part of that buffer: no split copy, no join of parts.
``send`` gets views of those buffers, lent until it returns (the buffer reuses them after).

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
buffer (``add``, :meth:`flush` and :meth:`settle` wait for it), its events dropped as a
failing ``xor`` call's are: an ``add`` that raises it takes none of its events, a ``flush``
that raises it drops the rest of the buffer too (as a failing flush's send does). A call of
the client made from inside ``send`` (on that thread) does not flush again.

>>> import numpy as np
>>> sent = []
>>> def send(parts, kind):  # the parts' arrays are lent until send returns: copied to keep
...     sent.append([(k, s.copy(), v.copy()) for k, s, v in parts])
...     return np.empty(0, np.uint64)
>>> buf = EventBuffer(2, send, rows=4)
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from .sharding import scatter_by_shard, shard_of

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
#: A shard's buffers: (source ids, values).
Pair = tuple[np.ndarray, np.ndarray]

_EMPTY = np.empty(0, dtype=np.uint64)
#: Rows a shard's buffer starts with, the first time it is filled (it doubles from there).
_FIRST_ROOM = 1024


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
        # each shard's events in a buffer of its own (ids, values), filled up to _fill[k] rows;
        # a send lends the filled part of the buffers it takes, which come back (to _spare)
        # once the send has returned: no allocation, no page faults in the steady state
        self._src: list[np.ndarray] = [_EMPTY] * self.shards
        self._val: list[np.ndarray] = [_EMPTY] * self.shards
        self._fill = np.zeros(self.shards, np.int64)
        self._spare: list[Pair] = []
        self._lent: list[Pair] = []  # by the send in flight
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
        """Buffer the events of one deferred xor, already split by shard (copied into the
        buffer: the caller may reuse its arrays); send what is due."""
        with self._adding(kind):
            for shard, src, val in parts:
                n = len(src)
                if not n:
                    continue
                f = int(self._fill[shard])
                self._room(shard, f + n)
                self._src[shard][f : f + n] = src
                self._val[shard][f : f + n] = val
                self._fill[shard] = f + n
                self.rows += n

    def add_split(self, src: np.ndarray, val: np.ndarray, shift: int, kind: Kind) -> None:
        """Buffer the events of one deferred xor, each on the shard that owns its source id
        (``id << shift``: see ``sharding.split_by_shard``), scattered straight into the
        shards' buffers in one pass (``sharding.scatter_by_shard``); send what is due. Checked
        uint64 arrays of one length; copied, so the caller may reuse them."""
        with self._adding(kind):
            n = len(src)
            if not n:
                return
            if not scatter_by_shard(src, val, self._src, self._val, self._fill, shift):
                with np.errstate(over="ignore"):  # room for each shard's events, then again
                    owner = shard_of(src << np.uint64(shift), self.shards)
                counts = np.bincount(owner.astype(np.int64), minlength=self.shards)
                for k in np.flatnonzero(counts).tolist():
                    self._room(k, int(self._fill[k]) + int(counts[k]))
                if not scatter_by_shard(src, val, self._src, self._val, self._fill, shift):
                    raise AssertionError("scatter_by_shard refused buffers with room for all")
            self.rows += n

    @contextmanager
    def _adding(self, kind: Kind) -> Iterator[None]:
        """Around the buffering of one deferred xor: the checks and the kind before it, what
        is due sent after it."""
        if self._inside_send():
            raise RuntimeError("a deferred xor from inside the buffer's own send")
        with self._lock:
            self._forked()
            # the send in flight ends first: its error raises here, before these events are
            # taken (the send that comes due after them waits for it anyway)
            self._settle_locked()
            if self.rows and kind != self._kind:
                self._flush_locked()
            if not self.rows:
                self._kind = kind
                self._since = self._clock()
            yield
            if self.rows and self._clock() - self._since >= self.max_delay:
                self._flush_locked()
            else:
                full = np.flatnonzero(self._fill >= self.limit).tolist()
                if full:
                    self._send_locked(full, wait=False)

    def _room(self, shard: int, rows: int) -> None:
        """Shard ``shard``'s buffers hold at least ``rows`` rows (their events kept)."""
        cap = len(self._src[shard])
        if cap >= rows:
            return
        cap = max(rows, 2 * cap, _FIRST_ROOM)
        f = int(self._fill[shard])
        src, val = np.empty(cap, np.uint64), np.empty(cap, np.uint64)
        src[:f] = self._src[shard][:f]
        val[:f] = self._val[shard][:f]
        self._src[shard], self._val[shard] = src, val

    def flush(self) -> np.ndarray:
        """Send every buffered event; the source ids completed (held, for a ``hold`` kind) by
        the sends since the previous flush. Returns once they are all applied."""
        if self._inside_send():  # a call made by send() itself: its events are on their way
            return _EMPTY
        with self._lock:
            self._forked()
            try:
                self._settle_locked()
            except BaseException:
                # a flush that raises leaves nothing buffered, as a failed send's events are
                # dropped: the rest goes with it (the caller's work failed; sent later, its
                # events would meet those of the work done again)
                self._give_back(self._take(range(self.shards))[1])
                raise
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
            self._give_back(self._take(range(self.shards))[1])
            return n

    def _forked(self) -> None:
        """In a forked child the parent's send thread and its send in flight are not there:
        the child starts without them (what the parent buffered is the parent's to send)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread, self._in_flight, self._sender = None, None, None
            self._lent = []  # (the parent's send's: never given back here)

    def _settle_locked(self) -> None:
        future, self._in_flight = self._in_flight, None
        lent, self._lent = self._lent, []
        if future is not None:
            done = future.result()  # its error raises here, its events dropped
            self._give_back(lent)
            if len(done):
                self._completed.append(done)

    def _flush_locked(self) -> None:
        self._send_locked(np.flatnonzero(self._fill).tolist(), wait=True)

    def _take(self, shards: Sequence[int]) -> tuple[list[Part], list[Pair]]:
        """These shards' events (views of their buffers, lent to the send) and the buffers
        lent; each shard gets a spare pair (or none: it grows again when filled)."""
        parts, lent = [], []
        for k in shards:
            n = int(self._fill[k])
            if not n:
                continue
            src, val = self._src[k], self._val[k]
            parts.append((k, src[:n], val[:n]))
            lent.append((src, val))
            self._src[k], self._val[k] = self._spare.pop() if self._spare else (_EMPTY, _EMPTY)
            self._fill[k] = 0
            self.rows -= n
        if self.rows:
            self._since = self._clock()  # the rest waits from now (an upper bound is enough)
        return parts, lent

    def _give_back(self, lent: list[Pair]) -> None:
        """The buffers of a send that returned: spares again (a few: one pair per shard)."""
        room = self.shards - len(self._spare)
        self._spare.extend((src, val) for src, val in lent[: max(room, 0)])

    def _send_locked(self, shards: Sequence[int], wait: bool) -> None:
        """Send these shards' events: at once in this thread (``wait``, or not
        ``background``), else in the buffer's thread once the send in flight has ended."""
        self._settle_locked()  # one send in flight at most, in order; its error raises here
        parts, lent = self._take(shards)  # taken first: a failed send drops them (see module)
        if not parts:
            return
        self.requests += len(parts)
        if wait or not self.background:
            done = self._run_send(parts, self._kind)
            self._give_back(lent)
            if len(done):
                self._completed.append(done)
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="xorack-events")
        self._lent = lent
        self._in_flight = self._thread.submit(self._run_send, parts, self._kind)

    def _run_send(self, parts: list[Part], kind: Kind) -> np.ndarray:
        self._sender = threading.get_ident()
        try:
            return self._send(parts, kind)
        finally:
            self._sender = None
