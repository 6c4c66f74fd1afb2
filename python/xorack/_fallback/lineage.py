"""Ids and lineage in Python: the pure-Python mirror of ``cpp/lineage.hpp``.

``new_ids`` draws random ids (not reproducible, so not compared across backends); every other
function here is deterministic and gives exactly the native results.
"""

from __future__ import annotations

import os
import secrets

import numpy as np

__all__ = [
    "anchor",
    "derive_ids",
    "new_ids",
    "parent_index",
    "xor_reduce",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_MASK64 = (1 << 64) - 1


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, a bijection of uint64 (element-wise, wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def _mix_int(x: int) -> int:
    return int(mix64(np.array([x & _MASK64], dtype=np.uint64))[0])


# --- new_ids: one random generator per process, reseeded in every forked child -----------------
class _IdSource:
    pid = -1
    gen: np.random.Generator | None = None

    @classmethod
    def reseed(cls) -> None:
        cls.pid = os.getpid()
        cls.gen = np.random.Generator(np.random.PCG64(secrets.randbits(128) ^ cls.pid))

    @classmethod
    def generator(cls) -> np.random.Generator:
        if cls.pid != os.getpid() or cls.gen is None:  # forked without the hook (or first use)
            cls.reseed()
        assert cls.gen is not None
        return cls.gen


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IdSource.reseed)


def new_ids(n: int) -> np.ndarray:
    """``n`` random nonzero uint64 ids."""
    bits = _IdSource.generator().bit_generator
    out = bits.random_raw(n).astype(np.uint64, copy=False)
    zeros = np.flatnonzero(out == 0)
    while zeros.size:  # probability 2**-64 per id
        out[zeros] = bits.random_raw(zeros.size)
        zeros = zeros[out[zeros] == 0]
    return out


# --- reductions ---------------------------------------------------------------------------------
def xor_reduce(src: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``src`` in order of first appearance and the XOR of each one's ``values``."""
    n = src.size
    if n == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    uniq, first, inv = np.unique(src, return_index=True, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    counts = np.bincount(inv, minlength=uniq.size)
    starts = np.zeros(uniq.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    xors = np.bitwise_xor.reduceat(values[order], starts)
    by_first = np.argsort(first, kind="stable")
    return uniq[by_first], xors[by_first]


def anchor(
    in_src: np.ndarray, in_rec: np.ndarray, parent_index: np.ndarray, out_rec: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(out_src, out_rec, ev_src, ev_xor): outputs inherit their parent's source id; one event
    per input (its id XOR its children's ids), reduced per source id."""
    out_src = in_src[parent_index]
    if out_rec is None:
        out_rec = new_ids(parent_index.size)
    ev = in_rec.copy()
    np.bitwise_xor.at(ev, parent_index, out_rec)
    ev_src, ev_xor = xor_reduce(in_src, ev)
    return out_src, out_rec, ev_src, ev_xor


def parent_index(in_rec: np.ndarray, out_lineage: np.ndarray) -> np.ndarray:
    """Position of each ``out_lineage`` id in ``in_rec`` (int64), -1 where absent or 0.

    Raises ValueError when ``in_rec`` repeats an id (naming the first repeating position)."""
    order = np.argsort(in_rec, kind="stable")
    s = in_rec[order]
    if s.size > 1:
        dup = np.flatnonzero(s[1:] == s[:-1])
        if dup.size:
            j = int(order[dup + 1].min())
            raise ValueError(
                f"in_rec must be unique within a batch: the id at position {j} repeats an "
                "earlier one"
            )
    if s.size == 0:
        return np.full(out_lineage.size, -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(s, out_lineage), s.size - 1)
    found = (s[pos] == out_lineage) & (out_lineage != 0)
    return np.where(found, order[pos], -1).astype(np.int64, copy=False)


def derive_ids(
    origin: np.ndarray, parent: np.ndarray, ordinal: np.ndarray, salt: int
) -> np.ndarray:
    """Deterministic nonzero ids from (origin, parent, ordinal, salt): chained SplitMix64 mixes."""
    h0 = np.uint64(_mix_int(salt + int(_GOLDEN)))
    h = mix64(origin ^ h0)
    h = mix64(h + parent)
    h = mix64(h ^ ordinal)
    h[h == 0] = _GOLDEN
    return h
