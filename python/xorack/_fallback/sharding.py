"""Fallback of ``cpp/sharding.hpp``: a batch of XOR events grouped by the acker shard that owns
each id (the map of ``xorack.sharding``: blocks of 2**10 ids, a 54-bit fmix64, the top 32
bits of the mix scaled to ``count`` slices), each shard's events in their input order."""

from __future__ import annotations

import numpy as np

__all__ = ["scatter_by_shard", "split_by_shard"]

_MASK = np.uint64((1 << 54) - 1)
_K1 = np.uint64(0x11AFD7ED558CCD)
_K2 = np.uint64(0xEB9FE1A85EC53)
_S27 = np.uint64(27)


def _owner(ids: np.ndarray, shift: int, count: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (ids << np.uint64(shift)) >> np.uint64(10)
        x ^= x >> _S27
        x = (x * _K1) & _MASK
        x ^= x >> _S27
        x = (x * _K2) & _MASK
        x ^= x >> _S27
        return ((x >> np.uint64(22)) * np.uint64(count)) >> np.uint64(32)


def split_by_shard(
    ids: np.ndarray, values: np.ndarray, count: int, shift: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, values, offsets)`` grouped by shard: shard k's events are rows
    ``offsets[k]:offsets[k + 1]`` (``count + 1`` offsets, int64)."""
    if len(ids) != len(values):
        raise ValueError(f"ids and values must have the same length ({len(ids)} != {len(values)})")
    if count < 1:
        raise ValueError("count must be >= 1")
    if not 0 <= shift <= 10:
        raise ValueError("shift must be in [0, 10]")
    owner = _owner(ids, shift, count)
    order = np.argsort(owner, kind="stable")
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(np.bincount(owner.astype(np.int64), minlength=count), out=offsets[1:])
    return ids[order], values[order], offsets


def scatter_by_shard(
    ids: np.ndarray,
    values: np.ndarray,
    shift: int,
    out_ids: list[np.ndarray],
    out_values: list[np.ndarray],
    fill: np.ndarray,
) -> bool:
    """Append each event to its shard's buffers (shard k's after ``fill[k]`` rows, in input
    order; ``fill`` advanced in place). False, writing nothing, when some shard's events would
    pass its buffer's length."""
    if len(ids) != len(values):
        raise ValueError(f"ids and values must have the same length ({len(ids)} != {len(values)})")
    if not 0 <= shift <= 10:
        raise ValueError("shift must be in [0, 10]")
    count = len(out_ids)
    if count < 1:
        raise ValueError("out_ids must hold one buffer per shard (1 or more)")
    if len(out_values) != count:
        raise ValueError("out_ids and out_vals must hold as many buffers")
    if not (
        isinstance(fill, np.ndarray)
        and fill.dtype == np.int64
        and fill.ndim == 1
        and len(fill) == count
        and fill.flags.writeable
        and fill.flags.c_contiguous
    ):
        raise TypeError("fill must be a writeable contiguous int64 array, one per shard")
    for name, bufs in (("out_ids", out_ids), ("out_vals", out_values)):
        for b in bufs:
            if not (isinstance(b, np.ndarray) and b.dtype == np.uint64):
                raise TypeError(f"{name} must hold uint64 arrays")
            if b.ndim != 1 or not b.flags.writeable or not b.flags.c_contiguous:
                raise TypeError(f"{name} must hold writeable contiguous 1-d arrays")
    for k in range(count):
        if len(out_ids[k]) != len(out_values[k]):
            raise ValueError("out_ids and out_vals must have the same length per shard")
        if not 0 <= fill[k] <= len(out_ids[k]):
            raise ValueError("fill must be in [0, len(buffer)] for every shard")
    written = [b for b in [*out_ids, *out_values] if len(b)] + [fill]
    for i, a in enumerate(written):
        if any(np.may_share_memory(a, b) for b in written[i + 1 :]):
            raise ValueError("out_ids, out_vals and fill must not share memory")
    for a in (ids, values):
        if len(a) and any(np.may_share_memory(a, b) for b in written):
            raise ValueError("ids and values must not share memory with the buffers")
    owner = _owner(ids, shift, count).astype(np.int64)
    counts = np.bincount(owner, minlength=count)
    if any(int(fill[k]) + int(counts[k]) > len(out_ids[k]) for k in range(count)):
        return False
    order = np.argsort(owner, kind="stable")
    start = 0
    for k in range(count):
        n = int(counts[k])
        if n:
            rows = order[start : start + n]
            f = int(fill[k])
            out_ids[k][f : f + n] = ids[rows]
            out_values[k][f : f + n] = values[rows]
            fill[k] = f + n
        start += n
    return True
