"""Fallback of ``cpp/sharding.hpp``: a batch of XOR events grouped by the acker shard that owns
each id (the map of ``xorack.sharding``: blocks of 2**10 ids, a 54-bit fmix64, the top 32
bits of the mix scaled to ``count`` slices), each shard's events in their input order."""

from __future__ import annotations

import numpy as np

__all__ = ["split_by_shard"]

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
