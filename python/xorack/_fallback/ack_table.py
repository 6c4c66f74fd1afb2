"""AckTable in Python: the pure-Python mirror of ``cpp/ack_table.hpp`` (same raw API and results).

Raw API: arguments are already-validated C-contiguous numpy arrays (``uint64`` ids, nonzero).
Registered entries live in one dict, entries whose events arrived before ``register`` ("early")
in another, exactly like the native table's main and early tables.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = ["AckTable"]

_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_F = TypeVar("_F", bound=Callable[..., Any])


def serialized(method: _F) -> _F:
    """Runs the method under ``self._lock`` (one batch at a time, as the native objects do)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> Any:
        with self._lock:
            return method(self, *args)

    return wrapper  # type: ignore[return-value]


def check_ids(ids: np.ndarray, name: str) -> None:
    """ValueError naming the first id 0 in ``ids`` (0 is never a valid id), as the native
    module does."""
    if ids.size and not ids.all():
        i = int(np.flatnonzero(ids == 0)[0])
        raise ValueError(f"{name} contains id 0 at position {i} (ids are nonzero)")


def check_id(key: int, name: str) -> None:
    """ValueError for the single id 0, as the native module does."""
    if key == 0:
        raise ValueError(f"{name} must be a nonzero id, got 0")


def combine_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[int]]:
    """The distinct keys in order of their last occurrence and the XOR of each key's values."""
    n = keys.size
    if n == 0:
        return [], []
    uniq, first_rev, inv = np.unique(keys[::-1], return_index=True, return_inverse=True)
    if uniq.size == n:  # no key repeats: nothing to combine
        return keys.tolist(), values.tolist()
    order = np.argsort(inv, kind="stable")
    counts = np.bincount(inv, minlength=uniq.size)
    starts = np.zeros(uniq.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    xors = np.bitwise_xor.reduceat(values[::-1][order], starts)
    by_last = np.argsort(-first_rev, kind="stable")  # last occurrence = n - 1 - first_rev
    return uniq[by_last].tolist(), xors[by_last].tolist()


# The XOR acker table: source id -> 64-bit ack value, plus whether the id is registered.
# Events of a key within one call are combined first; registered ids reaching 0 complete.
class AckTable:
    def __init__(self) -> None:
        self._main: dict[int, int] = {}  # registered ids
        self._early: dict[int, int] = {}  # ids with events but no register yet (value != 0)
        self._old: dict[int, int] = {}  # such ids already there at the last expire_unregistered
        self._peak = 0  # largest len(self._main) since the dict was last rebuilt
        # Calls are serialized like the native table's: a batch is never interleaved with
        # another thread's (the GIL alone would let two batches mix their updates).
        self._lock = threading.Lock()

    @serialized
    def register(self, keys: np.ndarray, births: np.ndarray) -> np.ndarray:
        """Registers ids with their births, pair after pair as if each were its own call;
        returns the ids completed (in completion order)."""
        check_ids(keys, "src_ids")
        done: list[int] = []
        main, early, old = self._main, self._early, self._old
        for k, b in zip(keys.tolist(), births.tolist(), strict=True):
            v = main.get(k)
            if v is None:
                e = early.pop(k, None)
                if e is None:
                    e = old.pop(k, None)
                if e is None:  # fresh: waits for its events even when the birth is 0
                    main[k] = b
                    continue
                v = e
            v ^= b
            if v == 0:
                main.pop(k, None)
                done.append(k)
            else:
                main[k] = v
        self._peak = max(self._peak, len(main))
        self._maybe_shrink()
        return np.array(done, dtype=np.uint64) if done else _EMPTY_U64.copy()

    @serialized
    def xor(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """XORs events in; returns registered ids whose value is 0 after the call (in order of
        their last occurrence)."""
        check_ids(keys, "src_ids")
        done: list[int] = []
        main, early = self._main, self._early
        for k, x in zip(*combine_by_key(keys, values), strict=True):
            v = main.get(k)
            if v is not None:
                v ^= x
                if v == 0:
                    del main[k]
                    done.append(k)
                else:
                    main[k] = v
            else:
                # an unregistered entry, young or old; back at 0 it is dropped silently
                d = self._old if k in self._old else early
                e = d.get(k, 0) ^ x
                if e == 0:
                    d.pop(k, None)
                else:
                    d[k] = e
        self._maybe_shrink()
        return np.array(done, dtype=np.uint64) if done else _EMPTY_U64.copy()

    @serialized
    def fail(self, keys: np.ndarray) -> np.ndarray:
        """True where the id was present before the call; removes those entries."""
        check_ids(keys, "src_ids")
        main, early, old = self._main, self._early, self._old
        ks = keys.tolist()
        present = np.array([k in main or k in early or k in old for k in ks], dtype=np.bool_)
        for k in ks:
            main.pop(k, None)
            early.pop(k, None)
            old.pop(k, None)
        self._maybe_shrink()
        return present

    @serialized
    def expire_unregistered(self) -> int:
        """Drops the unregistered entries already there at the previous call; ages the others."""
        dropped = len(self._old)
        self._old, self._early = self._early, {}
        return dropped

    def _maybe_shrink(self) -> None:
        # Python dicts never give memory back on deletion: rebuild once mostly empty.
        if self._peak > 64 and len(self._main) * 5 < self._peak:
            self._main = dict(self._main)
            self._early = dict(self._early)
            self._old = dict(self._old)
            self._peak = len(self._main)

    def __len__(self) -> int:
        return len(self._main) + len(self._early) + len(self._old)

    def contains(self, key: int) -> bool:
        """True when the id has an entry (registered or not)."""
        check_id(key, "src")
        return key in self._main or key in self._early or key in self._old

    def get(self, key: int) -> int | None:
        """The id's current ack value, or None when absent."""
        check_id(key, "src")
        for d in (self._main, self._early, self._old):
            v = d.get(key)
            if v is not None:
                return v
        return None

    @serialized
    def gather(self, keys: np.ndarray) -> np.ndarray:
        """The current value of each id, 0 where it has no entry."""
        check_ids(keys, "src_ids")
        main, early, old = self._main, self._early, self._old
        out = [main.get(k) or early.get(k) or old.get(k, 0) for k in keys.tolist()]
        return np.array(out, dtype=np.uint64)

    @serialized
    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, values, registered) of every entry, sorted by key."""
        unreg = {**self._early, **self._old}
        keys = np.array(list(self._main) + list(unreg), dtype=np.uint64)
        values = np.array(list(self._main.values()) + list(unreg.values()), dtype=np.uint64)
        registered = np.zeros(keys.size, dtype=np.bool_)
        registered[: len(self._main)] = True
        order = np.argsort(keys, kind="stable")
        return keys[order], values[order], registered[order]

    @staticmethod
    def restore(keys: np.ndarray, values: np.ndarray, registered: np.ndarray) -> AckTable:
        """A table of exactly these entries (unique nonzero keys; the caller checked)."""
        t = AckTable()
        reg = registered.tolist()
        for k, v, r in zip(keys.tolist(), values.tolist(), reg, strict=True):
            (t._main if r else t._early)[k] = v
        t._peak = len(t._main)
        return t

    def nbytes(self) -> int:
        """Approximate memory held: the dicts and their int objects."""
        dicts = (self._main, self._early, self._old)
        return sum(sys.getsizeof(d) for d in dicts) + len(self) * 2 * 36
