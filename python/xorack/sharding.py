"""Which acker shard owns a source id, and the names a sharded acker uses.

A sharded acker is N acker processes. Source ids are routed by *block*: ``id >> CHUNK_BITS``
(1024 consecutive ids, the widest chunk a Spark barrier combines rows by: a chunk's records, and
so its chunk event, live on one shard). Shard ``k`` of ``N`` owns the blocks whose mixed value
falls in the ``k``-th of N equal slices. The mixer is MurmurHash3's ``fmix64`` recast on the
54 bits of a block number (xor-shifts by 27, multiplications by odd constants mod 2**54): a
bijection with full avalanche, fixed (no per-process seed) because every client and every
shard must agree on it. Ids are random already; mixing keeps the split even when they come from
elsewhere (sequential blocks, blocks with low bits in common), where ``block % N`` would not.

A shard draws the ids of its own replays (and of persists whose caller drew none) inside its
own slice, exactly, with no rejection: a random mixed value inside the slice, the inverse
mixer, then a random offset in the block. So every event about a record, first attempt or
replay, goes to the shard that holds it.

>>> import numpy as np
>>> ids = draw_ids(1000, Shard(1, 4))
>>> bool((shard_of(ids, 4) == 1).all()), bool(ids.all())
(True, True)
>>> split_locations("grpc://127.0.0.1:8815, grpc://127.0.0.1:8816")
['grpc://127.0.0.1:8815', 'grpc://127.0.0.1:8816']
>>> shard_storage("sqlite:///data/ft.db", Shard(0, 2)), shard_storage("memory", Shard(0, 2))
('sqlite:///data/ft.shard0of2.db', 'memory')
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kernels
from ._checks import as_u64, same_length
from .acker import new_ids
from .protocol import CHUNK_BITS

__all__ = [
    "BLOCK_BITS",
    "MAX_SHARDS",
    "Shard",
    "block_of",
    "draw_ids",
    "join_locations",
    "mix54",
    "scatter_by_shard",
    "shard_of",
    "shard_storage",
    "split_by_shard",
    "split_locations",
    "unmix54",
]

#: Most shards of one acker (far more than any machine has cores; keeps the slice math in
#: 64 bits: a slice index is (top 32 bits of the mix) * N >> 32).
MAX_SHARDS = 1024

#: Ids route by block, ``id >> BLOCK_BITS``: the widest chunk (``protocol.CHUNK_BITS``).
BLOCK_BITS = CHUNK_BITS
_W = 64 - BLOCK_BITS  # bits of a block number (54)
_MASK = np.uint64((1 << _W) - 1)
_K1 = np.uint64(0x11AFD7ED558CCD)  # fmix64's constants mod 2**54 (odd) ...
_K2 = np.uint64(0xEB9FE1A85EC53)
_K1_INV = np.uint64(0x34430C22A54005)  # ... and their inverses mod 2**54
_K2_INV = np.uint64(0x34B2F8129337DB)
_SHIFT = np.uint64(_W // 2)  # x ^= x >> 27 is its own inverse on 54 bits
_TOP = np.uint64(_W - 32)  # the mixed value's top 32 bits pick the slice
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFF_FFFF)
_BLOCK = np.uint64(BLOCK_BITS)


def block_of(ids: Any) -> np.ndarray:
    """The block number of each id (``id >> BLOCK_BITS``, uint64).

    >>> block_of([1023, 1024]).tolist()
    [0, 1]
    """
    return np.asarray(ids, dtype=np.uint64) >> _BLOCK


def mix54(blocks: Any) -> np.ndarray:
    """The mixed value of each block number (54-bit in, 54-bit out; a bijection, 0 -> 0).

    >>> int(unmix54(mix54([12345]))[0])
    12345
    """
    x = np.array(blocks, dtype=np.uint64)  # a copy: mixed in place
    _mix_in_place(x, np.empty_like(x))
    return x


def _mix_in_place(x: np.ndarray, t: np.ndarray) -> None:
    """``x = mix54(x)`` (``x`` < 2**54), ``t`` a scratch array of the same length."""
    with np.errstate(over="ignore"):
        np.right_shift(x, _SHIFT, out=t)
        x ^= t
        x *= _K1
        x &= _MASK
        np.right_shift(x, _SHIFT, out=t)
        x ^= t
        x *= _K2
        x &= _MASK
        np.right_shift(x, _SHIFT, out=t)
        x ^= t


def unmix54(mixed: Any) -> np.ndarray:
    """The inverse of :func:`mix54`."""
    x = np.array(mixed, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> _SHIFT
        x *= _K2_INV
        x &= _MASK
        x ^= x >> _SHIFT
        x *= _K1_INV
        x &= _MASK
        x ^= x >> _SHIFT
    return x


def _count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"the shard count must be an int, got {type(count).__name__}")
    if not 1 <= int(count) <= MAX_SHARDS:
        raise ValueError(f"the shard count must be in [1, {MAX_SHARDS}], got {count}")
    return int(count)


#: Ids mixed at a time by ``shard_of``: small scratch arrays, reused (a fresh 512 KB array per
#: call costs page faults that measured ~1 ms per 64 K ids on a busy VM; this costs ~0.15 ms).
_CHUNK = 8192


def shard_of(ids: Any, count: int) -> np.ndarray:
    """The shard (0 .. count-1, int16) that owns each source id (by its block).

    >>> shard_of([1, 2, 3], 1).tolist()
    [0, 0, 0]
    """
    count = _count(count)
    ids = np.asarray(ids, dtype=np.uint64)
    out = np.zeros(len(ids), np.int16)
    if count == 1 or not len(ids):
        return out
    x = np.empty(min(len(ids), _CHUNK), np.uint64)
    t = np.empty_like(x)
    n_shards = np.uint64(count)
    for start in range(0, len(ids), _CHUNK):
        stop = min(start + _CHUNK, len(ids))
        xs, ts = x[: stop - start], t[: stop - start]
        np.right_shift(ids[start:stop], _BLOCK, out=xs)  # the block
        _mix_in_place(xs, ts)
        with np.errstate(over="ignore"):
            xs >>= _TOP  # the top 32 bits of the mix ...
            xs *= n_shards
            xs >>= _S32  # ... scaled to [0, count): the slice they fall in
        out[start:stop] = xs
    return out


def split_by_shard(
    ids: Any, values: Any, count: int, chunk_bits: int = 0, backend: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """XOR events ``(ids, values)`` grouped by the shard that owns each id (each shard's in
    their input order): ``(ids, values, offsets)``, shard ``k``'s events at rows
    ``offsets[k]:offsets[k + 1]``. With ``chunk_bits`` the ids are chunk numbers, routed by
    an id of their chunk (``id << chunk_bits``). One pass to count, one to place (native), where
    ``shard_of`` and a gather per shard cost a pass per shard.

    >>> s, v, off = split_by_shard([5, 6, 7], [1, 2, 3], 1)
    >>> s.tolist(), off.tolist()
    ([5, 6, 7], [0, 3])
    """
    count = _count(count)
    src = as_u64(ids, "ids")
    val = as_u64(values, "values")
    same_length(ids=src, values=val)
    if isinstance(chunk_bits, bool) or not isinstance(chunk_bits, (int, np.integer)):
        raise TypeError(f"chunk_bits must be an int, got {type(chunk_bits).__name__}")
    if not 0 <= int(chunk_bits) <= BLOCK_BITS:
        raise ValueError(f"chunk_bits must be in [0, {BLOCK_BITS}], got {chunk_bits}")
    return kernels.get_impl(backend).split_by_shard(src, val, count, int(chunk_bits))


def scatter_by_shard(
    ids: Any,
    values: Any,
    out_ids: list[np.ndarray],
    out_values: list[np.ndarray],
    fill: np.ndarray,
    chunk_bits: int = 0,
    backend: str | None = None,
) -> bool:
    """Append XOR events ``(ids, values)`` to the buffers of the shard that owns each id
    (``len(out_ids)`` shards): shard ``k``'s go, in their input order, to ``out_ids[k]`` and
    ``out_values[k]`` from row ``fill[k]`` on, and ``fill[k]`` advances (``fill``: int64, one
    per shard, updated in place). Returns False, writing nothing, when some shard's events
    would pass its buffers' length. What ``split_by_shard`` and a join of each shard's parts
    do, in one pass: a coalescing client's buffers fed straight from its batches.

    >>> out = [np.zeros(4, np.uint64) for _ in range(2)]
    >>> vals = [np.zeros(4, np.uint64) for _ in range(2)]
    >>> fill = np.zeros(2, np.int64)
    >>> scatter_by_shard([5, 6, 7], [1, 2, 3], out, vals, fill), fill.tolist()
    (True, [3, 0])
    >>> scatter_by_shard([5, 6], [1, 2], out, vals, fill), fill.tolist()  # 5 > 4 rows: refused
    (False, [3, 0])
    """
    src = as_u64(ids, "ids")
    val = as_u64(values, "values")
    same_length(ids=src, values=val)
    if not isinstance(out_ids, list) or not isinstance(out_values, list):
        raise TypeError("out_ids and out_values must be lists of uint64 arrays, one per shard")
    _count(len(out_ids))
    if isinstance(chunk_bits, bool) or not isinstance(chunk_bits, (int, np.integer)):
        raise TypeError(f"chunk_bits must be an int, got {type(chunk_bits).__name__}")
    if not 0 <= int(chunk_bits) <= BLOCK_BITS:
        raise ValueError(f"chunk_bits must be in [0, {BLOCK_BITS}], got {chunk_bits}")
    impl = kernels.get_impl(backend)
    return bool(impl.scatter_by_shard(src, val, int(chunk_bits), out_ids, out_values, fill))


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``Shard.parse("1/4")`` from the command line's ``K/N``).

    >>> Shard.parse("1/4"), Shard(1, 4).owns([5, 6]).dtype.name
    (Shard(index=1, count=4), 'bool')
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        _count(self.count)
        if isinstance(self.index, bool) or not isinstance(self.index, (int, np.integer)):
            raise TypeError(f"the shard index must be an int, got {type(self.index).__name__}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"the shard index must be in [0, {self.count}), got {self.index}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"K/N"`` -> ``Shard(K, N)``; ``ValueError`` saying the form otherwise."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise ValueError(f"expected K/N (shard K of N, K from 0), got {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def owns(self, ids: Any) -> np.ndarray:
        """True for each id this shard owns."""
        return shard_of(ids, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def draw_ids(n: int, shard: Shard | None = None, backend: str | None = None) -> np.ndarray:
    """``n`` random nonzero uint64 ids owned by ``shard`` (any id when None), uniform over the
    shard's slice: a random mixed value inside the slice, then the inverse mixer."""
    ids = new_ids(n, backend=backend)
    if shard is None or shard.count == 1 or n == 0:
        return ids
    lo = -(-(shard.index << 32) // shard.count)  # ceil(k * 2**32 / N)
    hi = -(-((shard.index + 1) << 32) // shard.count)
    low = np.uint64((1 << int(_TOP)) - 1)
    while True:
        with np.errstate(over="ignore"):
            top = np.uint64(lo) + (((ids >> _S32) * np.uint64(hi - lo)) >> _S32)
            block = unmix54((top << _TOP) | (ids & low))  # 32 random bits used so far
            offset = (ids >> _TOP) & np.uint64((1 << BLOCK_BITS) - 1)  # the next 10
            out = (block << _BLOCK) | offset
        zero = out == 0
        if not zero.any():
            return out
        ids[zero] = new_ids(int(zero.sum()), backend=backend)


def split_locations(location: str) -> list[str]:
    """The shard locations of an acker location: ``"grpc://h:p1,grpc://h:p2"`` -> one per shard,
    in shard order (a single location is one shard). ``ValueError`` for an empty part or a part
    without a scheme."""
    if not isinstance(location, str):
        raise TypeError(f"location must be a string, got {type(location).__name__}")
    parts = [p.strip() for p in location.split(",")]
    bad = [p for p in parts if "://" not in p]
    if bad:
        raise ValueError(
            f"location must be grpc://host:port, or one per shard joined by commas "
            f"(grpc://h:p1,grpc://h:p2), got {location!r}"
        )
    if len(parts) > MAX_SHARDS:
        raise ValueError(f"at most {MAX_SHARDS} shards, got {len(parts)} locations")
    return parts


def join_locations(locations: list[str]) -> str:
    """One location string naming every shard, in shard order (what executors are given)."""
    return ",".join(locations)


_SQLITE_URL = "sqlite:///"
_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def shard_storage(spec: Any, shard: Shard) -> Any:
    """The storage spec of one shard: a SQLite file gets a file per shard
    (``name.shard0of2.db`` next to ``name.db``); ``"memory"`` stays memory; one shard of one
    is the spec itself."""
    if shard.count == 1 or spec == "memory":
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            "a sharded acker opens one storage per shard process: give a storage spec "
            f"('memory' or a SQLite path), not a {type(spec).__name__} object"
        )
    spec = os.fspath(spec)
    prefix = _SQLITE_URL if spec.startswith(_SQLITE_URL) else ""
    path = spec[len(prefix) :]
    root, ext = os.path.splitext(path)
    if ext.lower() not in _SUFFIXES:
        root, ext = path, ""
    return f"{prefix}{root}.shard{shard.index}of{shard.count}{ext}"
