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
#: each pass costs O(entries + left) numpy work, so a record costs amortised O(log n).
_PRUNE_MIN = 65536


class PendingEventTimes:
    """Event times by source id, and their minimum.

    Entries come in runs (the ids and times of one call, appended as they are); ids that leave
    are noted as they are (one array per call, O(1)) and taken out of the entries in one
    vectorised pass when the minimum is asked for, or once they outnumber the entries. Each run
    and each array of ids that left has its *epoch* (how many arrays of leaving ids came before
    it), so an id that leaves and comes back (a deterministic source id persisted again after
    its record completed) keeps its new entry: an entry goes only with a leave of its epoch or
    later. While no record has an event time, each call is one integer test.

    Not thread-safe (the FT layer calls it under its lock).
    """

    def __init__(self) -> None:
        self._ids: list[np.ndarray] = []  # runs of entries: ids ...
        self._times: list[np.ndarray] = []  # ... their event times ...
        self._epochs: list[int] = []  # ... and the epoch each run came in
        self._left: list[np.ndarray] = []  # ids that left, one array per call (its epoch: index)
        self._entries = 0  # entries in the runs (ids that left included, until a prune)
        self._left_rows = 0
        self._min: int | None = None  # the minimum of the entries, while no id left since

    def add(self, ids: np.ndarray, times: np.ndarray) -> None:
        """Records ``ids`` (uint64) are pending with event times ``times`` (int64, row-aligned;
        ``NO_EVENT_TIME`` rows are not kept). An id is pending once: none of ``ids`` may be kept
        already (unless it left since)."""
        has = times != NO_EVENT_TIME
        if not has.all():
            ids, times = ids[has], times[has]
        if not len(ids):
            return
        self._ids.append(np.array(ids, np.uint64))
        self._times.append(np.array(times, np.int64))
        self._epochs.append(len(self._left))
        self._entries += len(ids)
        if not self._left:  # the minimum is known: keep it so
            low = int(times.min())
            self._min = low if self._min is None else min(self._min, low)

    def discard(self, ids: np.ndarray) -> None:
        """Records ``ids`` left (completed, dead-lettered, or replayed under a new id: the new
        id is added with the same time); ids not kept are ignored."""
        if not self._entries or not len(ids):
            return
        self._left.append(np.array(ids, np.uint64))
        self._left_rows += len(ids)
        if self._left_rows > max(self._entries, _PRUNE_MIN):
            self._prune()

    def min(self) -> int | None:
        """The smallest event time kept, or None when none is."""
        if self._left:
            self._prune()
        return self._min if self._entries else None

    def __len__(self) -> int:
        """The records kept (pending, with an event time)."""
        if self._left:
            self._prune()
        return self._entries

    def _prune(self) -> None:
        """Take the ids that left out of the entries (one pass: sorts and binary searches)."""
        if not self._ids:
            self._left, self._left_rows = [], 0
            return
        ids = np.concatenate(self._ids) if len(self._ids) > 1 else self._ids[0]
        times = np.concatenate(self._times) if len(self._times) > 1 else self._times[0]
        if self._left:
            left = np.concatenate(self._left)
            left_epoch = np.repeat(np.arange(len(self._left)), [len(x) for x in self._left])
            order = np.argsort(left, kind="stable")  # per id, its leaves in epoch order
            left, left_epoch = left[order], left_epoch[order]
            last = np.r_[left[1:] != left[:-1], True]  # each id's last leave
            left, left_epoch = left[last], left_epoch[last]
            epoch = np.repeat(self._epochs, [len(x) for x in self._ids])
            at = np.minimum(np.searchsorted(left, ids), len(left) - 1)
            gone = (left[at] == ids) & (left_epoch[at] >= epoch)
            if gone.any():
                ids, times = ids[~gone], times[~gone]
        self._ids, self._times = ([ids], [times]) if len(ids) else ([], [])
        self._epochs = [0] if len(ids) else []
        self._left, self._left_rows = [], 0
        self._entries = len(ids)
        self._min = int(times.min()) if len(times) else None
