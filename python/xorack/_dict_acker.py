"""A plain Python ``dict`` acker: what a user writes without xorack (benchmark baseline).

Same batch API and completion semantics as ``xorack.AckTable`` on protocol-ordered input: only
registered ids complete; events that arrive before their birth wait in a second dict; an
unregistered entry returning to zero is dropped silently. Events are applied one by one.

>>> a = DictAcker()
>>> a.register([7], [5]).tolist()
[]
>>> a.xor([7], [5]).tolist()
[7]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

ArrayLike = np.ndarray | Sequence[int]


class DictAcker:
    """Source id -> XOR value in a Python dict (plus a dict of early, unregistered events)."""

    def __init__(self) -> None:
        self._pending: dict[int, int] = {}
        self._early: dict[int, int] = {}

    def register(self, src_ids: ArrayLike, births: ArrayLike) -> np.ndarray:
        """Registers births; returns the ids already complete (their events arrived early)."""
        pending, early = self._pending, self._early
        done: list[int] = []
        for key, birth in zip(_as_list(src_ids), _as_list(births), strict=True):
            if key in pending:
                value = pending[key] ^ birth
                if value:
                    pending[key] = value
                else:
                    del pending[key]
                    done.append(key)
                continue
            value = birth ^ early.pop(key, 0)
            if value:
                pending[key] = value
            else:
                done.append(key)
        return np.array(done, dtype=np.uint64)

    def xor(self, src_ids: ArrayLike, values: ArrayLike) -> np.ndarray:
        """Applies events in order; returns the registered ids that reached zero (removed)."""
        pending, early = self._pending, self._early
        done: list[int] = []
        for key, event in zip(_as_list(src_ids), _as_list(values), strict=True):
            value = pending.get(key)
            if value is not None:
                value ^= event
                if value:
                    pending[key] = value
                else:
                    del pending[key]
                    done.append(key)
                continue
            value = early.get(key, 0) ^ event
            if value:
                early[key] = value
            else:
                early.pop(key, None)
        return np.array(done, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, src: int) -> bool:
        return int(src) in self._pending

    @property
    def nbytes(self) -> int:
        """Estimate: the dicts' tables plus one int object per distinct key and value.

        Large random 64-bit ints take 36 bytes each (no small-int cache applies); the benchmark
        cross-checks this estimate with tracemalloc.
        """
        total = sys.getsizeof(self._pending) + sys.getsizeof(self._early)
        for d in (self._pending, self._early):
            for key, value in d.items():
                total += sys.getsizeof(key) + sys.getsizeof(value)
        return total


def _as_list(values: ArrayLike) -> list[int]:
    """Python ints from a numpy array (fast path) or any sequence of ints."""
    if isinstance(values, np.ndarray):
        return values.tolist()
    return [int(v) for v in values]
