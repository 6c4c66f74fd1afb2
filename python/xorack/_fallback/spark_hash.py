"""Spark-exact Murmur3 column kernels in numpy (mirror of ``cpp/spark_hash.hpp``).

Every kernel updates a running int32 hash per row in place: valid rows are hashed with their
current hash as the seed, null rows keep it. Arithmetic is done on uint32 views, where numpy's
wrapping multiply is exactly Java's int multiply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "hash_bytes",
    "hash_decimal128",
    "hash_float32",
    "hash_float64",
    "hash_int32",
    "hash_int64",
]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_FIVE = np.uint32(5)


# --- Murmur3 pieces over uint32 arrays -------------------------------------------------------


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


# Murmur3's per-word scramble.
def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


# Murmur3's state update with one scrambled word.
def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _FIVE + _N


# Murmur3's finalizer with the input length in bytes (scalar or per row).
def _fmix(h1: np.ndarray, length: Any) -> np.ndarray:
    h1 = h1 ^ np.asarray(length).astype(np.uint32)
    h1 ^= h1 >> np.uint32(16)
    h1 *= _F1
    h1 ^= h1 >> np.uint32(13)
    h1 *= _F2
    h1 ^= h1 >> np.uint32(16)
    return h1


# Spark hashInt over uint32 words and seeds.
def _hash_int(words: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seeds, _mix_k1(words)), 4)


# Spark hashLong over uint64 values and uint32 seeds: low word, then high word.
def _hash_long(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    lo = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (values >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seeds, _mix_k1(lo)), _mix_k1(hi)), 8)


# Spark hashUnsafeBytes of data[starts[i] : starts[i] + lengths[i]] seeded with seeds[i].
# Vectorized over rows: round k mixes word k of every row that has one (rows sorted by length so
# that the active rows are a prefix), then the up to 3 signed tail bytes, then fmix(length).
def _hash_spans(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    order = np.argsort(-lengths, kind="stable")
    st = starts[order].astype(np.int64)
    ln = lengths[order].astype(np.int64)
    h = seeds[order].astype(np.uint32)
    words = ln >> 2
    # counts[k] = number of rows with more than k words: a prefix, since rows are sorted.
    max_words = int(words[0]) if len(words) else 0
    counts = len(words) - np.searchsorted(words[::-1], np.arange(max_words), side="right")
    d32 = data.astype(np.uint32) if len(data) else np.zeros(1, dtype=np.uint32)
    for k in range(max_words):
        m = int(counts[k])
        pos = st[:m] + 4 * k
        w = d32[pos] | (d32[pos + 1] << np.uint32(8)) | (d32[pos + 2] << np.uint32(16))
        w |= d32[pos + 3] << np.uint32(24)
        h[:m] = _mix_h1(h[:m], _mix_k1(w))
    aligned = words << 2
    tail = ln - aligned
    for j in range(3):
        sel = np.flatnonzero(tail > j)
        if not len(sel):
            break
        b = data[st[sel] + aligned[sel] + j].view(np.int8).astype(np.int32).view(np.uint32)
        h[sel] = _mix_h1(h[sel], _mix_k1(b))
    h = _fmix(h, ln)
    out = np.empty_like(h)
    out[order] = h
    return out


# --- argument checks (the same errors as the native bindings) --------------------------------


# ``obj`` as a 1-D C-contiguous array of exactly ``dtype``, else TypeError/ValueError.
def _exact(obj: Any, name: str, dtype: Any, expected: str, writable: bool = False) -> np.ndarray:
    if not isinstance(obj, np.ndarray):
        raise TypeError(f"{name} must be a numpy {expected} array, got {type(obj).__name__}")
    if obj.dtype != np.dtype(dtype) or not obj.dtype.isnative:
        raise TypeError(f"{name} must be {expected}, got {obj.dtype}")
    if obj.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {obj.ndim} dimensions")
    if not obj.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not obj.flags.writeable:
        raise ValueError(f"{name} must be writable (it is updated in place)")
    return obj


# The running-hash array after checking its length against ``n`` rows.
def _hashes(hashes: Any, n: int, what: str) -> np.ndarray:
    h = _exact(hashes, "hashes", np.int32, "int32", writable=True)
    if len(h) != n:
        raise ValueError(f"length mismatch: {what} has {n} rows, hashes has {len(h)}")
    return h


# Boolean validity per row from an Arrow bitmap (None = all valid) at a bit offset.
def _valid_rows(valid: Any, valid_offset: int, n: int) -> np.ndarray | None:
    valid_offset = int(valid_offset)
    if valid_offset < 0:
        raise ValueError(f"valid_offset must be >= 0, got {valid_offset}")
    if valid is None:
        return None
    bits = _exact(valid, "valid", np.uint8, "uint8 (an Arrow validity bitmap)")
    need = (valid_offset + n + 7) // 8
    if len(bits) < need:
        raise ValueError(
            f"valid has {len(bits)} bytes, expected >= {need} for {n} rows "
            f"at bit offset {valid_offset}"
        )
    unpacked = np.unpackbits(bits[:need], bitorder="little")
    return unpacked[valid_offset : valid_offset + n].astype(bool)


# Write ``new`` (uint32 hashes of the rows ``rows``, or of all rows) back as int32.
def _store(h: np.ndarray, new: np.ndarray, rows: np.ndarray | None) -> None:
    if rows is None:
        h[:] = new.view(np.int32)
    else:
        h[rows] = new.view(np.int32)


# Apply ``fn(values, seeds) -> uint32`` to the valid rows of ``values``.
def _apply(fn: Any, values: np.ndarray, valid: Any, valid_offset: int, h: np.ndarray) -> None:
    ok = _valid_rows(valid, valid_offset, len(values))
    rows = None if ok is None else np.flatnonzero(ok)
    v = values if rows is None else values[rows]
    seeds = (h if rows is None else h[rows]).view(np.uint32)
    _store(h, fn(v, seeds), rows)


# --- column kernels (raw API, same names as the native module) -------------------------------


def hash_int32(values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray) -> None:
    """hashes[i] = Spark hashInt(values[i], hashes[i]) where valid.

    >>> import numpy as np
    >>> h = np.full(2, 42, np.int32)
    >>> hash_int32(np.array([5, 5], np.int32), np.array([1], np.uint8), 0, h)  # row 1 is null
    >>> h.tolist()
    [1023896466, 42]
    """
    v = _exact(values, "values", np.int32, "int32")
    h = _hashes(hashes, len(v), "values")
    _apply(lambda x, s: _hash_int(x.view(np.uint32), s), v, valid, valid_offset, h)


def hash_int64(values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray) -> None:
    """hashes[i] = Spark hashLong(values[i], hashes[i]) where valid.

    >>> import numpy as np
    >>> h = np.full(1, 42, np.int32)
    >>> hash_int64(np.array([5], np.int64), None, 0, h)
    >>> h.tolist()
    [1607884268]
    """
    v = _exact(values, "values", np.int64, "int64")
    h = _hashes(hashes, len(v), "values")
    _apply(lambda x, s: _hash_long(x.view(np.uint64), s), v, valid, valid_offset, h)


# Spark's float key: floatToIntBits with -0.0 -> 0 and NaN -> 0x7fc00000.
def _float_key(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32).copy()
    bits[x == 0] = 0
    bits[np.isnan(x)] = 0x7FC00000
    return bits


# Spark's double key: doubleToLongBits with -0.0 -> 0 and NaN -> 0x7ff8000000000000.
def _double_key(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint64).copy()
    bits[x == 0] = 0
    bits[np.isnan(x)] = 0x7FF8000000000000
    return bits


def hash_float32(values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray) -> None:
    """hashes[i] = Spark's FloatType hash of values[i] (-0.0 -> 0, NaN canonical).

    >>> import numpy as np
    >>> h = np.full(2, 42, np.int32)
    >>> hash_float32(np.array([0.0, -0.0], np.float32), None, 0, h)
    >>> h.tolist()
    [933211791, 933211791]
    """
    v = _exact(values, "values", np.float32, "float32")
    h = _hashes(hashes, len(v), "values")
    _apply(lambda x, s: _hash_int(_float_key(x), s), v, valid, valid_offset, h)


def hash_float64(values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray) -> None:
    """hashes[i] = Spark's DoubleType hash of values[i] (-0.0 -> 0, NaN canonical).

    >>> import numpy as np
    >>> h = np.full(1, 42, np.int32)
    >>> hash_float64(np.array([-0.0]), None, 0, h)
    >>> h.tolist()
    [-1670924195]
    """
    v = _exact(values, "values", np.float64, "float64")
    h = _hashes(hashes, len(v), "values")
    _apply(lambda x, s: _hash_long(_double_key(x), s), v, valid, valid_offset, h)


def hash_bytes(
    offsets: np.ndarray, data: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray
) -> None:
    """hashes[i] = Spark hashUnsafeBytes(data[offsets[i]:offsets[i+1]], hashes[i]) where valid.

    >>> import numpy as np
    >>> h = np.full(1, 42, np.int32)
    >>> hash_bytes(np.array([0, 5], np.int32), np.frombuffer(b"Spark", np.uint8), None, 0, h)
    >>> h.tolist()
    [228093765]
    """
    if not isinstance(offsets, np.ndarray):
        raise TypeError(
            f"offsets must be a numpy int32 or int64 array, got {type(offsets).__name__}"
        )
    if offsets.dtype == np.int64 and offsets.dtype.isnative:
        off = _exact(offsets, "offsets", np.int64, "int64")
    else:
        off = _exact(offsets, "offsets", np.int32, "int32 or int64")
    d = _exact(data, "data", np.uint8, "uint8")
    if len(off) < 1:
        raise ValueError("offsets must hold n + 1 >= 1 entries, got 0")
    n = len(off) - 1
    h = _hashes(hashes, n, "offsets (minus one)")
    ok = _valid_rows(valid, valid_offset, n)
    off64 = off.astype(np.int64)
    bad = np.flatnonzero((off64[1:] < off64[:-1]) | (off64[1:] > len(d)))
    if off64[0] < 0 or len(bad):
        row = 0 if off64[0] < 0 else int(bad[0])
        raise ValueError(
            f"offsets are not a valid slice of data at row {row} "
            f"(need 0 <= offsets[i] <= offsets[i+1] <= {len(d)})"
        )
    rows = np.arange(n) if ok is None else np.flatnonzero(ok)
    starts = off64[:-1][rows]
    lengths = off64[1:][rows] - starts
    _store(h, _hash_spans(d, starts, lengths, h[rows].view(np.uint32)), rows)


# BigInteger.toByteArray of each 128-bit value as (big-endian bytes [n, 16], first byte index):
# leading bytes that only repeat the sign are dropped, keeping the sign bit in the next byte.
def _min_twos_complement(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    le = np.empty((len(lo), 2), dtype=np.uint64)
    le[:, 0] = lo.view(np.uint64)
    le[:, 1] = hi.view(np.uint64)
    be = le.view(np.uint8).reshape(len(lo), 16)[:, ::-1]
    sign = np.where(hi < 0, np.uint8(0xFF), np.uint8(0))
    skip = np.zeros(len(lo), dtype=np.int64)
    redundant = np.ones(len(lo), dtype=bool)
    for k in range(15):
        redundant &= (be[:, k] == sign) & (((be[:, k + 1] ^ sign) & 0x80) == 0)
        skip += redundant
    return np.ascontiguousarray(be), skip


def hash_decimal128(
    words: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray, as_long: bool
) -> None:
    """Spark's DecimalType hash of decimal128 values stored as (low, high) int64 pairs:
    as_long (precision <= 18) hashLong of the unscaled value, else hashUnsafeBytes of
    BigInteger.toByteArray.

    >>> import numpy as np
    >>> h = np.full(1, 42, np.int32)
    >>> hash_decimal128(np.array([5, 0], np.int64), None, 0, h, True)  # unscaled 5
    >>> h.tolist()
    [1607884268]
    """
    w = _exact(words, "words", np.int64, "int64 (decimal128 as lo/hi pairs)")
    if len(w) % 2:
        raise ValueError(f"words must hold 2 int64 per row, got an odd length {len(w)}")
    n = len(w) // 2
    h = _hashes(hashes, n, "words (pairs)")
    ok = _valid_rows(valid, valid_offset, n)
    rows = np.arange(n) if ok is None else np.flatnonzero(ok)
    lo, hi = w[0::2][rows], w[1::2][rows]
    seeds = h[rows].view(np.uint32)
    if as_long:
        _store(h, _hash_long(lo.view(np.uint64), seeds), rows)
        return
    be, skip = _min_twos_complement(lo, hi)
    starts = np.arange(len(rows), dtype=np.int64) * 16 + skip
    _store(h, _hash_spans(be.reshape(-1), starts, 16 - skip, seeds), rows)
