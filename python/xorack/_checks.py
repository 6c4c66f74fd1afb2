"""Input validation shared by the public kernel API (both backends see only clean arrays).

Every check names the argument and what was expected, e.g.
``TypeError: src_ids must be uint64, got float64``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_UINT_LIKE = ("u", "i")


def as_u64(x: Any, name: str, *, nonzero: bool = False) -> np.ndarray:
    """A C-contiguous 1-D uint64 array from ``x`` (array, list, or scalar-free iterable).

    Unsigned and non-negative signed integer input is converted; floats, bools, objects and
    negative values are rejected. With ``nonzero``, 0 is rejected (0 is never a valid id).
    """
    arr = np.asarray(exact_ints(x, name))
    if arr.ndim != 1:
        if arr.ndim == 0:
            raise TypeError(f"{name} must be a 1-D array of uint64, got a scalar")
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.uint64:
        if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64
            arr = np.empty(0, dtype=np.uint64)
        elif arr.dtype.kind in _UINT_LIKE and arr.dtype != np.bool_:
            if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
                raise ValueError(f"{name} must be non-negative (uint64), got a negative value")
            arr = arr.astype(np.uint64)
        else:
            raise TypeError(f"{name} must be uint64, got {arr.dtype}")
    arr = np.ascontiguousarray(arr)
    if nonzero and arr.size and not arr.all():
        idx = int(np.flatnonzero(arr == 0)[0])
        raise ValueError(f"{name} contains id 0 at position {idx}: 0 is never a valid id")
    return arr


def as_index(x: Any, name: str, *, upper: int) -> np.ndarray:
    """A C-contiguous 1-D int64 array of indices in [0, upper)."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in _UINT_LIKE or arr.dtype == np.bool_:
        raise TypeError(f"{name} must be an integer array, got {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= upper:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must be in [0, {upper}), got {bad}")
    return arr


def same_length(**arrays: np.ndarray) -> int:
    """Check that all arrays have one length; return it."""
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ValueError(f"length mismatch: {desc}")
    return next(iter(lengths.values()), 0)


def count_distinct(a: np.ndarray) -> int:
    """How many distinct values a 1-D array holds, by one sort. (numpy 2's ``np.unique`` of
    a plain array takes a hash-based path that measured 12-13 ms per 64 K uint64 ids here,
    where a stable sort takes 3 ms, and 0.2 ms on ids drawn in sequential blocks.)

    >>> count_distinct(np.array([3, 1, 3, 2], np.uint64)), count_distinct(np.array([], np.int64))
    (3, 0)
    """
    if len(a) < 2:
        return len(a)
    s = np.sort(a, kind="stable")
    return int(np.count_nonzero(s[1:] != s[:-1])) + 1


def sorted_distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array, ascending (``np.unique(a)`` by one stable sort; see
    :func:`count_distinct`).

    >>> sorted_distinct(np.array([3, 1, 3, 2], np.uint64)).tolist()
    [1, 2, 3]
    """
    s = np.sort(a, kind="stable")
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def positive_int(x: Any, name: str) -> int:
    """``x`` as a Python int > 0 (bools and floats rejected)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return int(x)


def as_i32(x: Any, name: str, *, minimum: int = -(2**31)) -> np.ndarray:
    """A C-contiguous 1-D int32 array from ``x`` (integer array or list), values >= ``minimum``.

    Other integer dtypes are converted when every value fits in int32; floats, bools and
    objects are rejected.
    """
    arr = np.asarray(x)
    if arr.ndim != 1:
        if arr.ndim == 0:
            raise TypeError(f"{name} must be a 1-D array of int32, got a scalar")
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in _UINT_LIKE or arr.dtype == np.bool_:
        raise TypeError(f"{name} must be int32, got {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < minimum or hi > 2**31 - 1:
        bad = lo if lo < minimum else hi
        raise ValueError(f"{name} must be in [{minimum}, {2**31 - 1}], got {bad}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def exact_ints(x: Any, name: str) -> Any:
    """``x`` itself, except that a list/tuple of Python ints holding a value >= 2**63 becomes an
    exact uint64 array (``np.asarray`` would turn it into float64 and lose the low bits).

    >>> exact_ints([1, 2**64 - 1], "ids").dtype.name
    'uint64'
    """
    if not isinstance(x, (list, tuple)) or not x:
        return x
    if not all(type(v) is int for v in x):
        # numpy integer scalars among Python ints (``[src[0], 999]``): np.asarray would make
        # float64 of a uint64 scalar mixed with an int; take them as the ints they are
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in x):
            return x
        x = [int(v) for v in x]
    hi = max(x)
    if hi < 1 << 63:
        return x
    lo = min(x)
    if lo < 0:
        raise ValueError(f"{name} must be non-negative (uint64), got a negative value")
    if hi >= 1 << 64:
        raise ValueError(f"{name} must be < 2**64 (uint64), got {hi}")
    return np.array(x, dtype=np.uint64)
