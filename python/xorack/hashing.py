"""Spark-exact key hashing: ``murmur3_hash`` equals ``pyspark.sql.functions.hash(*cols)`` and
``spark_partition_ids`` equals ``spark_partition_id()`` after ``df.repartition(n, *cols)``.

Columns are decomposed into numpy views of their Arrow buffers (values, validity bitmap,
offsets + data) and handed chunk by chunk to the raw kernels of the chosen backend, which update
one int32 running hash per row in place (each column's hash seeds the next; a null passes the
running hash through). No Python runs per row.

How Arrow types map to Spark types (and so to Spark's hash):

=============================================  =============================================
Arrow                                          Spark type, hash
=============================================  =============================================
int8 / int16 / int32, date32                   Byte/Short/Integer/DateType: hashInt
int64                                          LongType: hashLong
uint8 / uint16 / uint32                        the smallest Spark type holding every value
                                               (Short / Integer / LongType): hashInt / hashLong
bool                                           BooleanType: hashInt(0 or 1)
float32 / float64                              Float/DoubleType: -0.0 -> 0, NaN canonical
string, large_string, string_view              StringType (UTF8_BINARY): hashUnsafeBytes
binary, large_binary, fixed_size_binary        BinaryType: hashUnsafeBytes
timestamp[us] (naive or with tz)               TimestampNTZType / TimestampType: hashLong(us)
timestamp[s] / [ms] / [ns]                     s, ms scaled to us; ns floored to us (PySpark)
decimal128(p, s) / decimal32 / decimal64       DecimalType(p, s): p <= 18 hashLong(unscaled),
                                               else hashUnsafeBytes(BigInteger.toByteArray)
null                                           NullType: every row passes the hash through
dictionary<..., v>                             decoded: hashed as its value type v
=============================================  =============================================

A naive timestamp hashes its stored microseconds: that is TimestampNTZType, or TimestampType
when Spark's session time zone is UTC. uint64 has no lossless Spark integral type and is
rejected (cast it to int64 or decimal128(20, 0), whichever your Spark column is). A pandas
Series goes through ``pyarrow.Array.from_pandas`` as PySpark does (float NaN becomes null).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from . import kernels
from ._checks import positive_int

__all__ = ["murmur3_hash", "route_keys", "spark_partition_ids"]

SPARK_HASH_SEED = 42  # Spark's Murmur3Hash default seed, also HashPartitioning's
_INT32_MAX = 2**31 - 1
_ROUTE_KEYS_MAX_PARTITIONS = 1 << 22
_MICROS_PER = {"s": 1_000_000, "ms": 1_000, "us": 1}


# --- public API -------------------------------------------------------------------------------


def murmur3_hash(
    columns: Any, seed: int = SPARK_HASH_SEED, backend: str | None = None
) -> np.ndarray:
    """Spark's ``hash(*columns)`` (Murmur3_x86_32, seed 42) per row, as int32.

    ``columns``: one column (pyarrow Array or ChunkedArray, 1-D numpy array, pandas Series), a
    list of columns, or a pyarrow Table / RecordBatch / pandas DataFrame (all its columns, in
    order). ``backend``: "native", "python" or None (the active one).

    >>> import pyarrow as pa, xorack
    >>> xorack.murmur3_hash(pa.array([5], pa.int64())).tolist()
    [1607884268]
    >>> xorack.murmur3_hash([pa.array(["Spark", None]), pa.array([5, 5], pa.int32())]).tolist()
    [-2009649256, 1023896466]
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not -(2**31) <= int(seed) <= _INT32_MAX:
        raise ValueError(f"seed must fit in int32 (Spark's seed is an Int), got {seed}")
    impl = kernels.get_impl(backend)
    cols = _as_columns(columns)
    length = _common_length(cols)
    hashes = np.full(length, int(seed), dtype=np.int32)
    for index, col in enumerate(cols):
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        start = 0
        for chunk in chunks:
            stop = start + len(chunk)
            if len(chunk):
                _hash_chunk(impl, index, chunk, hashes[start:stop])
            start = stop
    return hashes


def spark_partition_ids(columns: Any, n: int, backend: str | None = None) -> np.ndarray:
    """The partition ``df.repartition(n, *columns)`` sends each row to: pmod(hash, n), int32.

    Equals ``spark_partition_id()`` after the repartition (give Spark the explicit ``n``).
    ``columns`` as for :func:`murmur3_hash`.

    >>> import pyarrow as pa, xorack
    >>> xorack.spark_partition_ids(pa.array([5, 6, None], pa.int64()), 4).tolist()
    [0, 1, 2]
    """
    n = _partition_count(n)
    hashes = murmur3_hash(columns, backend=backend)
    return kernels.get_impl(backend).pmod_partition(hashes, n, True)


def route_keys(n: int, backend: str | None = None) -> np.ndarray:
    """Routing values for placing rows on chosen partitions with a plain repartition.

    ``route_keys(n)[p]`` is the smallest non-negative int32 ``v`` with
    ``pmod(hash(int32 v), n) == p``. A column ``_ft_route = route_keys(n)[target]`` **of Spark
    type IntegerType** makes ``df.repartition(n, F.col("_ft_route"))`` put every row on its
    ``target`` partition.

    >>> import pyarrow as pa, xorack
    >>> from xorack.hashing import route_keys
    >>> keys = route_keys(4)
    >>> keys.tolist()
    [12, 6, 2, 0]
    >>> xorack.spark_partition_ids(pa.array(keys), 4).tolist()
    [0, 1, 2, 3]
    """
    n = _partition_count(n)
    if n > _ROUTE_KEYS_MAX_PARTITIONS:
        raise ValueError(f"n must be <= {_ROUTE_KEYS_MAX_PARTITIONS} for route_keys, got {n}")
    return _route_keys(n, kernels.get_impl(backend)).copy()


# Routing values of n partitions: hash candidates 0, 1, 2, ... block by block until every
# partition has its first (smallest) candidate. Cached: the Spark layer asks for the same n often.
@functools.lru_cache(maxsize=64)
def _route_keys(n: int, impl: ModuleType) -> np.ndarray:
    found = np.full(n, -1, dtype=np.int64)
    missing = n
    block = max(1 << 16, 4 * n)
    base = 0
    while missing:
        if base > _INT32_MAX:  # pragma: no cover - needs ~2^31 candidates, impossible for n <= 2^22
            raise ValueError(f"no int32 routing value found for some partition of {n}")
        cand = np.arange(base, min(base + block, _INT32_MAX + 1), dtype=np.int32)
        h = np.full(len(cand), SPARK_HASH_SEED, dtype=np.int32)
        impl.hash_int32(cand, None, 0, h)
        parts = impl.pmod_partition(h, n, True)
        uniq, first = np.unique(parts, return_index=True)
        new = found[uniq] < 0
        found[uniq[new]] = cand[first[new]]
        missing = int(np.count_nonzero(found < 0))
        base += len(cand)
    out = found.astype(np.int32)
    out.flags.writeable = False
    return out


def _partition_count(n: Any) -> int:
    n = positive_int(n, "n")
    if n > _INT32_MAX:
        raise ValueError(f"n must be <= {_INT32_MAX} (Spark's partition count is an Int), got {n}")
    return n


# --- column decomposition ---------------------------------------------------------------------


# The list of Arrow columns (Array or ChunkedArray) that ``columns`` designates.
def _as_columns(columns: Any) -> list[pa.Array | pa.ChunkedArray]:
    if isinstance(columns, (pa.Table, pa.RecordBatch)):
        cols = list(columns.columns)
    elif _is_pandas(columns, "DataFrame"):
        cols = [_as_column(columns[c], f"column {c!r}") for c in columns.columns]
    elif isinstance(columns, (list, tuple)):
        cols = [_as_column(c, f"columns[{i}]") for i, c in enumerate(columns)]
    else:
        cols = [_as_column(columns, "columns")]
    if not cols:
        raise ValueError("columns must hold at least one column (Spark's hash() needs one)")
    return cols


def _is_pandas(obj: Any, name: str) -> bool:
    pd = sys.modules.get("pandas")  # only loaded if the caller uses pandas
    return pd is not None and isinstance(obj, getattr(pd, name))


# One column as a pyarrow Array / ChunkedArray.
def _as_column(obj: Any, what: str) -> pa.Array | pa.ChunkedArray:
    if isinstance(obj, (pa.Array, pa.ChunkedArray)):
        return obj
    if _is_pandas(obj, "Series"):
        return pa.Array.from_pandas(obj)
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1:
            raise ValueError(f"{what} must be a 1-D array, got shape {obj.shape}")
        try:
            return pa.array(obj)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise TypeError(f"{what}: numpy dtype {obj.dtype} has no Arrow type: {exc}") from exc
    raise TypeError(
        f"{what} must be a pyarrow Array/ChunkedArray, a 1-D numpy array or a pandas Series "
        f"(or columns a list of them, a pyarrow Table/RecordBatch or a pandas DataFrame), "
        f"got {type(obj).__name__}"
    )


def _common_length(cols: Sequence[pa.Array | pa.ChunkedArray]) -> int:
    lengths = [len(c) for c in cols]
    if len(set(lengths)) > 1:
        desc = ", ".join(f"column {i} has {n}" for i, n in enumerate(lengths))
        raise ValueError(f"columns must have the same number of rows: {desc}")
    return lengths[0]


# numpy view of buffer ``buf`` as ``dtype``, rows [offset, offset + length).
def _values(buf: pa.Buffer, dtype: Any, offset: int, length: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=dtype)[offset : offset + length]


# (validity bitmap as uint8 or None, its bit offset) of an Arrow array.
def _validity(arr: pa.Array) -> tuple[np.ndarray | None, int]:
    buf = arr.buffers()[0]
    if arr.null_count == 0 or buf is None:
        return None, 0
    return np.frombuffer(buf, dtype=np.uint8), arr.offset


def _unsupported(index: int, arr: pa.Array, hint: str = "") -> TypeError:
    return TypeError(
        f"column {index} has Arrow type {arr.type}, which xorack cannot hash as Spark does"
        + (f": {hint}" if hint else "")
        + " (supported: int8/16/32/64, uint8/16/32, bool, float32/64, string, binary, date32, "
        "timestamp, decimal128, null, dictionaries of these)"
    )


# Hash one Arrow chunk (non-empty) of column ``index`` into ``hashes`` (its rows' slice).
def _hash_chunk(impl: ModuleType, index: int, arr: pa.Array, hashes: np.ndarray) -> None:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.dictionary_decode(), t.value_type
    if pa.types.is_null(t):
        return
    valid, voff = _validity(arr)
    bufs = arr.buffers()
    off, n = arr.offset, len(arr)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        impl.hash_bytes(_values(bufs[1], np.int32, off, n + 1), _data(bufs[2]), valid, voff, hashes)
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        impl.hash_bytes(_values(bufs[1], np.int64, off, n + 1), _data(bufs[2]), valid, voff, hashes)
    elif pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        target = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        _hash_chunk(impl, index, arr.cast(target), hashes)
    elif pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        width = t.byte_width
        offsets = np.arange(off, off + n + 1, dtype=np.int64) * width
        impl.hash_bytes(offsets, _data(bufs[1]), valid, voff, hashes)
    elif pa.types.is_boolean(t):
        bits = np.unpackbits(np.frombuffer(bufs[1], np.uint8), count=off + n, bitorder="little")
        impl.hash_int32(bits[off:].astype(np.int32), valid, voff, hashes)
    elif t in (pa.int32(), pa.date32()):
        impl.hash_int32(_values(bufs[1], np.int32, off, n), valid, voff, hashes)
    elif t in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()):
        v = _values(bufs[1], t.to_pandas_dtype(), off, n).astype(np.int32)
        impl.hash_int32(v, valid, voff, hashes)
    elif t == pa.int64():
        impl.hash_int64(_values(bufs[1], np.int64, off, n), valid, voff, hashes)
    elif t == pa.uint32():
        impl.hash_int64(_values(bufs[1], np.uint32, off, n).astype(np.int64), valid, voff, hashes)
    elif t == pa.float32():
        impl.hash_float32(_values(bufs[1], np.float32, off, n), valid, voff, hashes)
    elif t == pa.float64():
        impl.hash_float64(_values(bufs[1], np.float64, off, n), valid, voff, hashes)
    elif pa.types.is_timestamp(t):
        micros = _timestamp_micros(index, arr, _values(bufs[1], np.int64, off, n))
        impl.hash_int64(micros, valid, voff, hashes)
    elif pa.types.is_decimal(t):
        _hash_decimal(impl, index, arr, valid, voff, hashes)
    elif t == pa.uint64():
        raise _unsupported(
            index,
            arr,
            "Spark has no unsigned 64-bit type; cast to int64 (LongType) or "
            "decimal128(20, 0), whichever your Spark column is",
        )
    elif pa.types.is_date64(t):
        raise _unsupported(index, arr, "Spark's DateType is date32 (days); cast to date32")
    else:
        raise _unsupported(index, arr)


# The data buffer of a string/binary array (an empty one when Arrow left it out).
def _data(buf: pa.Buffer | None) -> np.ndarray:
    return np.empty(0, np.uint8) if buf is None else np.frombuffer(buf, dtype=np.uint8)


# Timestamps as Spark's microseconds: s/ms scaled exactly (overflow checked); ns floored to us,
# as PySpark does when it hands nanosecond timestamps to Spark (checked against Spark).
def _timestamp_micros(index: int, arr: pa.Array, raw: np.ndarray) -> np.ndarray:
    unit = arr.type.unit
    if unit == "ns":
        return raw // 1000
    scale = _MICROS_PER[unit]
    if scale == 1:
        return raw
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    checked = raw if valid is None else raw[valid]
    limit = np.iinfo(np.int64).max // scale
    if checked.size and (checked.max() > limit or checked.min() < -limit):
        raise ValueError(f"column {index} ({arr.type}) overflows int64 microseconds")
    return raw * scale


# Decimals as Spark's DecimalType(p, s): hashLong of the unscaled value for p <= 18, else the
# bytes of BigInteger.toByteArray.
def _hash_decimal(
    impl: ModuleType,
    index: int,
    arr: pa.Array,
    valid: np.ndarray | None,
    voff: int,
    hashes: np.ndarray,
) -> None:
    t = arr.type
    off, n = arr.offset, len(arr)
    buf = arr.buffers()[1]
    if t.byte_width in (4, 8):  # decimal32 / decimal64: precision <= 18 by construction
        raw = _values(buf, np.int32 if t.byte_width == 4 else np.int64, off, n)
        impl.hash_int64(raw.astype(np.int64), valid, voff, hashes)
        return
    if t.byte_width != 16 or t.precision > 38:
        raise _unsupported(index, arr, "Spark decimals have precision <= 38; use decimal128")
    words = np.frombuffer(buf, dtype=np.int64)[2 * off : 2 * (off + n)]
    as_long = t.precision <= 18
    if as_long:
        lo, hi = words[0::2], words[1::2]
        bad = hi != (lo >> 63)
        if valid is not None:
            bad &= arr.is_valid().to_numpy(zero_copy_only=False)
        if np.any(bad):
            raise ValueError(
                f"column {index} ({t}) holds a value outside its precision (row "
                f"{int(np.flatnonzero(bad)[0])}); Spark could not store it in DecimalType"
                f"({t.precision}, {t.scale})"
            )
    impl.hash_decimal128(words, valid, voff, hashes, as_long)
