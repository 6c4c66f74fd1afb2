"""The event times of the FT layer's pending records: what holds a streaming watermark back.

A record may be persisted with an event time (int64, an ordering key: in practice microseconds
since the epoch; ``NO_EVENT_TIME`` = none). The FT layer keeps the event times of its pending
records here, by current source id, and reads their minimum once per micro-batch
(``FTStats.min_event_time``): a window may not close before it, since a record still pending may
yet be replayed into it.

>>> import numpy as np
>>> t = PendingEventTimes()
>>> t.add(np.array([1, 2, 3], np.uint64), np.array([30, NO_EVENT_TIME, 10]))
>>> t.min()
10
>>> t.discard(np.array([3], np.uint64))   # completed, or replayed under a new id
>>> t.min(), PendingEventTimes().min()
(30, None)
"""

from __future__ import annotations

import numpy as np

from .protocol import NO_EVENT_TIME

__all__ = ["NO_EVENT_TIME", "PendingEventTimes"]

#: Ids that left are taken out of the entries once they outnumber them (and are this many):
#: a pass costs O(entries) numpy work, so a record costs amortised O(1) passes.
_PRUNE_MIN = 65536
_EMPTY_IDS = np.empty(0, np.uint64)
_EMPTY_TIMES = np.empty(0, np.int64)


class PendingEventTimes:
    """Event times by source id, and their minimum.

    The entries are a base sorted by id plus the runs added since (the ids and times of one
    call each, appended as they come); ids that leave are noted as they come (one array per
    call), and taken out in one pass — a binary search of them in the base, of the runs in
    them, then one merge — when the minimum is asked for after a record holding it left, or
    once they outnumber the entries. The minimum and ids holding it are kept (some of them, on
    a tie: when the minimum changes, one of them has left), so that a minimum held by records
    still pending (stragglers holding the watermark back) is read without a pass. Each run and
    each array of leaving ids has its *epoch* (how many arrays of leaving ids came before it):
    an id that leaves and comes back (a deterministic source id persisted again after its
    record completed) keeps its new entry. While no record has an event time, each call is one
    integer test. Memory: 16 bytes per entry.

    Not thread-safe (the FT layer calls it under its lock).

    >>> t = PendingEventTimes()
    >>> t.add(np.array([7, 8], np.uint64), np.array([42, 41])); t.discard(np.array([8], np.uint64))
    >>> t.min(), len(t)
    (42, 1)
    """

    def __init__(self) -> None:
        self._ids = _EMPTY_IDS  # the base, sorted by id ...
        self._times = _EMPTY_TIMES  # ... and its event times
        self._runs: list[tuple[np.ndarray, np.ndarray, int]] = []  # (ids, times, epoch) since
        self._left: list[np.ndarray] = []  # ids that left, one array per call (its epoch: index)
        self._entries = 0  # base + runs (ids that left included, until a pass)
        self._left_rows = 0
        self._min: int | None = None  # the minimum of the entries, unless stale ...
        self._holders = _EMPTY_IDS  # ... and the ids (sorted) that hold it
        self._stale = False  # a holder of the minimum left since: a pass finds the new one

    def add(self, ids: np.ndarray, times: np.ndarray) -> None:
        """Records ``ids`` (uint64) are pending with event times ``times`` (int64, row-aligned;
        ``NO_EVENT_TIME`` rows are not kept). An id is pending once: none of ``ids`` may be kept
        already (unless it left since)."""
        has = times != NO_EVENT_TIME
        if not has.all():
            ids, times = ids[has], times[has]
        if not len(ids):
            return
        ids, times = np.array(ids, np.uint64), np.array(times, np.int64)  # ours, not the caller's
        self._runs.append((ids, times, len(self._left)))
        self._entries += len(ids)
        if self._stale:
            return
        low = int(times.min())
        if self._min is None or low < self._min:  # (a tie: the holders known still hold it)
            self._min, self._holders = low, np.sort(ids[times == low])

    def discard(self, ids: np.ndarray) -> None:
        """Records ``ids`` left (completed, dead-lettered, or replayed under a new id: the new
        id is added with the same time); ids not kept are ignored."""
        if not self._entries or not len(ids):
            return
        self._left.append(np.array(ids, np.uint64))
        self._left_rows += len(ids)
        if not self._stale and len(self._holders):
            at = np.minimum(np.searchsorted(self._holders, ids), len(self._holders) - 1)
            self._stale = bool((self._holders[at] == ids).any())
        if self._left_rows > max(self._entries, _PRUNE_MIN):
            self._prune()

    def min(self) -> int | None:
        """The smallest event time kept, or None when none is."""
        if self._stale:
            self._prune()
        return self._min if self._entries else None

    def __len__(self) -> int:
        """The records kept (pending, with an event time)."""
        if self._left:
            self._prune()
        return self._entries

    def _prune(self) -> None:
        """Take the ids that left out of the entries, and merge the runs into the base."""
        ids, times = self._ids, self._times
        left, last = _last_leaves(self._left)
        if len(left) and len(ids):  # any leave takes a base entry out: the base is older
            at = np.searchsorted(ids, left)
            inside = at < len(ids)
            hit = at[inside][ids[at[inside]] == left[inside]]
            if len(hit):
                keep = np.ones(len(ids), bool)
                keep[hit] = False
                ids, times = ids[keep], times[keep]
        if self._runs:
            run_ids = np.concatenate([r[0] for r in self._runs])
            run_times = np.concatenate([r[1] for r in self._runs])
            if len(left):  # a leave of the run's epoch or later takes its entry out
                epoch = np.repeat([r[2] for r in self._runs], [len(r[0]) for r in self._runs])
                at = np.minimum(np.searchsorted(left, run_ids), len(left) - 1)
                kept = (left[at] != run_ids) | (last[at] < epoch)
                run_ids, run_times = run_ids[kept], run_times[kept]
            ids, times = np.concatenate([ids, run_ids]), np.concatenate([times, run_times])
            order = np.argsort(ids, kind="stable")  # (a sorted base + the runs: timsort merges)
            ids, times = ids[order], times[order]
        self._ids, self._times, self._runs = ids, times, []
        self._left, self._left_rows = [], 0
        self._entries = len(ids)
        self._min = int(times.min()) if len(times) else None
        self._holders = ids[times == self._min] if len(times) else _EMPTY_IDS
        self._stale = False


def _last_leaves(left: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids that left, sorted; the epoch of each one's last leave)."""
    if not left:
        return _EMPTY_IDS, np.empty(0, np.int64)
    ids = np.concatenate(left)
    epochs = np.repeat(np.arange(len(left)), [len(x) for x in left])
    order = np.argsort(ids, kind="stable")  # per id, its leaves in epoch order
    ids, epochs = ids[order], epochs[order]
    last = np.r_[ids[1:] != ids[:-1], True]
    return ids[last], epochs[last]
