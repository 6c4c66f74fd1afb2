"""Replay partitioning kernels in numpy (mirror of ``cpp/partitioners.hpp``)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "broadcast_partition",
    "pmod_partition",
    "round_robin_partition",
    "shuffle_partition",
]

_INT32_MAX = 2**31 - 1
_U64_MASK = 2**64 - 1


# A partition count as a Python int in [1, 2^31) (the native binding's check).
def _partitions(n: Any) -> int:
    n = _int_arg(n, "n")
    if n <= 0 or n > _INT32_MAX:
        raise ValueError(f"n must be in [1, {_INT32_MAX}], got {n}")
    return n


# ``x`` as a Python int (bools and floats rejected, like pybind11's int64 conversion).
def _int_arg(x: Any, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


def _count(count: Any) -> int:
    count = _int_arg(count, "count")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return count


def pmod_partition(hashes: np.ndarray, n: int, inplace: bool = False) -> np.ndarray:
    """pmod(hashes, n) in [0, n): Spark HashPartitioning's partition id (``inplace``: written
    into ``hashes``, which is returned).

    >>> import numpy as np
    >>> pmod_partition(np.array([-3, 8], np.int32), 4).tolist()
    [1, 0]
    """
    from .spark_hash import _exact

    n = _partitions(n)
    h = _exact(hashes, "hashes", np.int32, "int32", writable=inplace)
    out = np.mod(h, np.int32(n))  # numpy's mod of a positive divisor is Java's pmod
    if inplace:
        h[:] = out
        return h
    return out


def round_robin_partition(count: int, n: int, start: int) -> np.ndarray:
    """(start + i) mod n for i < count.

    >>> round_robin_partition(4, 3, 2).tolist()
    [2, 0, 1, 2]
    """
    n = _partitions(n)
    start = _int_arg(start, "start")
    if not 0 <= start < n:
        raise ValueError(f"start must be in [0, {n}), got {start}")
    count = _count(count)
    return ((np.arange(count, dtype=np.int64) + start) % n).astype(np.int32)


# SplitMix64's output for stream positions ``counters`` of the stream seeded with ``seed``.
def _shuffle_mix(seed: int, counters: np.ndarray) -> np.ndarray:
    z = np.uint64(seed) + (counters + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def shuffle_partition(count: int, n: int, seed: int, counter: int) -> np.ndarray:
    """Seeded pseudo-random partitions of stream positions counter .. counter + count - 1.

    >>> a = shuffle_partition(6, 4, seed=7, counter=0)
    >>> bool((a[3:] == shuffle_partition(3, 4, seed=7, counter=3)).all())
    True
    """
    n = _partitions(n)
    count = _count(count)
    seed = _int_arg(seed, "seed")
    counter = _int_arg(counter, "counter")
    for name, value in (("seed", seed), ("counter", counter)):
        if not 0 <= value <= _U64_MASK:
            raise TypeError(f"{name} must be an unsigned 64-bit int, got {value}")
    counters = np.uint64(counter) + np.arange(count, dtype=np.uint64)
    hi = _shuffle_mix(seed, counters) >> np.uint64(32)
    return ((hi * np.uint64(n)) >> np.uint64(32)).astype(np.int32)


def broadcast_partition(count: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, parts): every row to every partition, row-major.

    >>> [a.tolist() for a in broadcast_partition(2, 2)]
    [[0, 0, 1, 1], [0, 1, 0, 1]]
    """
    n = _partitions(n)
    count = _count(count)
    rows = np.repeat(np.arange(count, dtype=np.int64), n)
    parts = np.tile(np.arange(n, dtype=np.int32), count)
    return rows, parts
