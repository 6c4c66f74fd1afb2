"""TimeoutWheel in Python: the pure-Python mirror of ``cpp/timeout_wheel.hpp``.

Each id maps to the rotation at which it expires (its deadline, kept modulo 2**16 exactly like
the native 16-bit field); ``rotate`` advances the counter and expires the ids whose deadline it
reached.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from .ack_table import check_id, check_ids, serialized

__all__ = ["TimeoutWheel"]

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF


# The rotating timeout buckets: an id added or touched while the rotation counter is r expires
# at rotation r + num_buckets unless touched again or discarded first.
class TimeoutWheel:
    def __init__(self, num_buckets: int) -> None:
        self._nb = num_buckets
        self._rotation = 0
        self._deadline: dict[int, int] = {}
        self._peak = 0  # largest len since the dict was last rebuilt
        self._lock = threading.Lock()  # serialized calls, as in the native wheel

    @property
    def rotation(self) -> int:
        """The rotation counter modulo 2**32 (0 before the first rotate)."""
        return self._rotation

    @serialized
    def add(self, ids: np.ndarray) -> None:
        """Starts (or restarts) the timeout of every id."""
        check_ids(ids, "ids")
        d = (self._rotation + self._nb) & _MASK16
        self._deadline.update(dict.fromkeys(ids.tolist(), d))
        self._peak = max(self._peak, len(self._deadline))

    @serialized
    def touch(self, ids: np.ndarray) -> None:
        """Restarts the timeout of the ids present; absent ids are ignored."""
        check_ids(ids, "ids")
        d = (self._rotation + self._nb) & _MASK16
        dl = self._deadline
        for k in ids.tolist():
            if k in dl:
                dl[k] = d

    @serialized
    def discard(self, ids: np.ndarray) -> None:
        """Forgets the ids (they never expire); absent ids are ignored."""
        check_ids(ids, "ids")
        dl = self._deadline
        for k in ids.tolist():
            dl.pop(k, None)
        self._maybe_shrink()

    @serialized
    def rotate(self) -> np.ndarray:
        """Advances one rotation; returns the ids that expire at it (any order), forgets them."""
        self._rotation = (self._rotation + 1) & _MASK32
        r = self._rotation & _MASK16
        dl = self._deadline
        expired = [k for k, d in dl.items() if d == r]
        for k in expired:
            del dl[k]
        self._maybe_shrink()
        return np.array(expired, dtype=np.uint64)

    def _maybe_shrink(self) -> None:
        # Python dicts never give memory back on deletion: rebuild once mostly empty.
        if self._peak > 64 and len(self._deadline) * 5 < self._peak:
            self._deadline = dict(self._deadline)
            self._peak = len(self._deadline)

    def __len__(self) -> int:
        return len(self._deadline)

    def contains(self, key: int) -> bool:
        """True when the id is waiting for its timeout."""
        check_id(key, "id")
        return key in self._deadline

    def nbytes(self) -> int:
        """Approximate memory held: the dict and its int objects."""
        return sys.getsizeof(self._deadline) + len(self._deadline) * 2 * 32
