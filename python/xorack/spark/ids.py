"""Record ids and the acker connection of the code that runs inside Spark tasks: the uint64 /
bigint views of id columns, the salts and ranks that derive child ids, content and position ids
of source rows, chunked source ids, and each worker's cached acker client.

>>> u64(np.array([-1], dtype=np.int64)).tolist()
[18446744073709551615]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from .lineage import REC, SRC


def client_of(
    location: str, token: str | None, tls_root_certs: bytes | None = None, job: str | None = None
) -> Any:
    """The acker client of this worker process (cached per location, token, job)."""
    from ..service import AckerClient

    return AckerClient.get(location, token=token, job=job, tls_root_certs=tls_root_certs)


def u64(values: Any) -> np.ndarray:
    """The uint64 view of a Spark ``bigint`` id column (pandas Series, numpy or Arrow array)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = values.to_numpy(zero_copy_only=False)
    arr = np.asarray(values)
    if arr.dtype == np.uint64:
        return arr
    if arr.dtype.kind != "i":
        raise TypeError(f"id column must be bigint, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64).view(np.uint64)


def i64(values: np.ndarray) -> np.ndarray:
    """The int64 (Spark ``bigint``) view of uint64 ids."""
    return np.ascontiguousarray(values, dtype=np.uint64).view(np.int64)


def name_salt(name: str) -> int:
    """A stable 63-bit salt for a stage name (Python's hash() is randomized per process)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def ordinals(parent: np.ndarray) -> np.ndarray:
    """For each output row, its rank among the outputs of the same parent (in output order).

    Outputs in input order (a filter, an explode: ``parent`` non-decreasing, the common case)
    are ranked in one pass; any other order is sorted first (stably: the same ranks).

    >>> ordinals(np.array([0, 0, 2, 2, 2])).tolist(), ordinals(np.array([1, 0, 1])).tolist()
    ([0, 1, 0, 1, 2], [0, 0, 1])
    >>> ordinals(np.array([0, 3, 4])).tolist()  # strictly increasing: each the first
    [0, 0, 0]
    """
    parent = np.asarray(parent, dtype=np.int64)  # positions (a uint64 difference would wrap)
    n = len(parent)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    step = np.subtract(parent[1:], parent[:-1])
    if bool((step > 0).all()):  # one output per parent at most (a map, a filter): all first
        return np.zeros(n, dtype=np.uint64)
    in_order = bool((step >= 0).all())
    order = None if in_order else np.argsort(parent, kind="stable")
    sp = parent if order is None else parent[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(sp[1:], sp[:-1], out=starts[1:])
    at = np.arange(n, dtype=np.int64)
    group_start = np.maximum.accumulate(np.where(starts, at, 0))
    ranks = (at - group_start).astype(np.uint64)
    if order is None:
        return ranks
    out = np.empty(n, dtype=np.uint64)
    out[order] = ranks
    return out


def parents_of(in_rec: np.ndarray, out_rec: np.ndarray, fresh: bool = False) -> np.ndarray:
    """The input position (int64) of each output row from its ``_ft_rec`` (uint64 ids), by
    :func:`xorack.acker.parent_index`, which checks the ids (0, unknown, or an input repeating
    one: errors; a repeated input id is an upstream that duplicated rows unseen). ``fresh``:
    the input's ids were drawn for this batch (an optimistic round's untagged source rows),
    distinct by construction, so an output that carries them as they came (a stage that
    returns its batch, or maps it row for row) takes positions 0..n-1 at once.

    >>> rec = np.array([7, 9], np.uint64)
    >>> parents_of(rec, rec, fresh=True).tolist(), parents_of(rec, rec[[1, 1]]).tolist()
    ([0, 1], [1, 1])
    """
    from .. import acker

    if fresh and len(out_rec) == len(in_rec) and np.array_equal(in_rec, out_rec) and in_rec.all():
        return np.arange(len(in_rec), dtype=np.int64)
    return np.asarray(acker.parent_index(in_rec, out_rec), dtype=np.int64)


def with_lineage(
    frame: pd.DataFrame, columns: Sequence[str], src: np.ndarray | None, rec: np.ndarray
) -> pd.DataFrame:
    """A new frame: the ``columns`` of ``frame`` (sharing its arrays: no copy of the payload)
    followed by ``_ft_src`` (unless ``src`` is None) and ``_ft_rec`` (``uint64`` ids as Spark
    ``bigint``), with a fresh 0..n-1 index whatever ``frame``'s index is.

    >>> f = pd.DataFrame({"w": ["a", "b"], "x": [1, 2]}, index=[7, 9])
    >>> with_lineage(f, ["w"], np.array([5, 5], np.uint64), np.array([1, 2], np.uint64))
       w  _ft_src  _ft_rec
    0  a        5        1
    1  b        5        2
    """
    data: dict[str, Any] = {}
    for c in columns:
        col = frame[c]  # numpy columns as ndarrays (an object NumpyExtensionArray is re-checked)
        extension = isinstance(col.dtype, pd.api.extensions.ExtensionDtype)
        data[c] = col.array if extension else col.to_numpy(copy=False)
    if src is not None:
        data[SRC] = i64(src)
    data[REC] = i64(rec)
    return pd.DataFrame(data, copy=False)


# --------------------------------------------------------------------------------------------
# source ids


_CONTENT_SEED_HI = 42
_CONTENT_SEED_LO = 0x3C6EF372  # a second, independent Murmur3 seed: 64 bits of content hash


def content_hash(batch: pa.RecordBatch) -> np.ndarray:
    """A 64-bit hash of each row's payload (two Murmur3 passes over every column).

    Columns of a type the Spark-exact hash does not take (lists, structs, maps) are hashed
    through their text form (a Python loop over those columns only).
    """
    from .. import hashing

    cols = []
    for col in batch.columns:
        try:
            hashing.murmur3_hash([col.slice(0, 1)])  # the type check needs a row
        except TypeError:
            col = pa.array([repr(v) for v in col.to_pylist()], pa.string())
        cols.append(col)
    if not cols:
        return np.zeros(batch.num_rows, dtype=np.uint64)
    hi = hashing.murmur3_hash(cols, seed=_CONTENT_SEED_HI).view(np.uint32).astype(np.uint64)
    lo = hashing.murmur3_hash(cols, seed=_CONTENT_SEED_LO).view(np.uint32).astype(np.uint64)
    return (hi << np.uint64(32)) | lo


class ContentRanks:
    """Per task: for each row, how many earlier rows of the task had the same content hash.

    Identical rows are told apart by their rank among themselves, which does not depend on where
    they are in the partition; rows reordered by a task retry keep their ids.
    """

    def __init__(self) -> None:
        self._hashes = np.empty(0, dtype=np.uint64)  # sorted
        self._counts = np.empty(0, dtype=np.int64)

    def __call__(self, h: np.ndarray) -> np.ndarray:
        n = len(h)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        order = np.argsort(h, kind="stable")  # one sort: equal hashes keep their input order
        s = h[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        uniq = s[starts]
        counts = np.diff(np.append(starts, n))
        # rows of each hash in earlier batches of the task
        base = np.zeros(len(uniq), dtype=np.int64)
        found = np.zeros(len(uniq), dtype=bool)
        if len(self._hashes):
            at = np.minimum(np.searchsorted(self._hashes, uniq), len(self._hashes) - 1)
            found = self._hashes[at] == uniq
            base[found] = self._counts[at[found]]
            self._counts[at[found]] += counts[found]
        run = np.cumsum(first) - 1
        ranks = np.empty(n, dtype=np.int64)
        ranks[order] = base[run] + (np.arange(n) - starts[run])
        if not found.all():  # new hashes (sorted): inserted into the sorted ones, no re-sort
            add, more = uniq[~found], counts[~found]
            at = np.searchsorted(self._hashes, add) + np.arange(len(add))  # their new places
            old = np.ones(len(self._hashes) + len(add), dtype=bool)
            old[at] = False
            hashes = np.empty(len(old), dtype=np.uint64)
            total = np.empty(len(old), dtype=np.int64)
            hashes[at], hashes[old] = add, self._hashes
            total[at], total[old] = more, self._counts
            self._hashes, self._counts = hashes, total
        return ranks


def content_ids(
    batch: pa.RecordBatch,
    ranks: ContentRanks,
    micro_batch: int,
    source: int,
    partition: int,
    salt: int,
) -> np.ndarray:
    """Deterministic record ids of source rows: (micro-batch, source, partition, the row's
    content, its rank among identical rows of the task). A Spark task retry that reads the same
    rows in another order re-creates the same id for each row; different rows never share one.
    ``partition`` -1: a source whose identical rows are always in one partition (hash
    partitioned by its keys), whose ids do not depend on the partition.
    """
    from .. import acker

    n = batch.num_rows
    where = acker.derive_ids([micro_batch + 1], [source + 1], [partition + 1], salt)[0]
    content = content_hash(batch) | np.uint64(1)  # derive_ids takes nonzero parents
    return acker.derive_ids(np.full(n, where, dtype=np.uint64), content, ranks(content), salt)


#: The ordinal of position-derived record ids: a rank no content id reaches, so the two kinds
#: of id are derived from disjoint inputs.
_POSITION_ORDINAL = 1 << 63


def position_record_ids(
    start: int, n: int, micro_batch: int, source: int, partition: int, salt: int
) -> np.ndarray:
    """Deterministic record ids of the rows at positions ``[start, start + n)`` of their
    partition: (micro-batch, source, partition, position). Used where a retried task reads the
    partition in the same order (a combined aggregation's round orders a shuffled source by
    content first): there they are as stable as :func:`content_ids` and need no hashing of
    the payload nor ranking of equal rows (two thirds of the tagger's time in the wordcount).

    >>> a = position_record_ids(3, 2, 0, 0, 1, salt=7)
    >>> bool((a == position_record_ids(3, 2, 0, 0, 1, salt=7)).all()), a[0] != a[1]
    (True, np.True_)
    """
    from .. import acker

    where = acker.derive_ids([micro_batch + 1], [source + 1], [partition + 1], salt)[0]
    pos = np.arange(start + 1, start + n + 1, dtype=np.uint64)
    return acker.derive_ids(
        np.full(n, where, np.uint64), pos, np.full(n, _POSITION_ORDINAL, np.uint64), salt
    )


def chunked_ids(n: int, bits: int) -> np.ndarray:
    """``n`` fresh source ids in aligned blocks of ``2**bits``: block ``b`` holds the ids
    ``(prefix_b << bits) | j`` with a random nonzero prefix, so ``id >> bits`` names the block
    (the *chunk* a barrier combines rows by).

    >>> ids = chunked_ids(5, 2)
    >>> len(set((ids >> 2).tolist())), (ids & 3).tolist()
    (2, [0, 1, 2, 3, 0])
    """
    from .. import acker

    width = 1 << bits
    blocks = -(-n // width)
    prefix = acker.new_ids(blocks) >> np.uint64(bits)
    prefix[prefix == 0] = 1
    j = np.arange(n, dtype=np.uint64)
    return (np.repeat(prefix, width)[:n] << np.uint64(bits)) | (j & np.uint64(width - 1))


#: Salts of the source ids a deterministic tagger derives (kept apart from the record ids').
_SRC_SALT = 0x5EED_0F_50_12CE_1D5
_CHUNK_SALT = 0x5EED_0F_C4_D0C_B10C


def record_src_ids(rec: np.ndarray, salt: int) -> np.ndarray:
    """The source ids of a deterministic source's rows: derived from their record ids, so a
    retried Spark task persists each row under the id its first attempt used (the FT layer
    keeps the one record: ``persist(..., idempotent=True)``) instead of a second copy.

    >>> rec = np.array([5, 6], dtype=np.uint64)
    >>> bool((record_src_ids(rec, 1) == record_src_ids(rec, 1)).all())
    True
    """
    from .. import acker

    n = len(rec)
    return acker.derive_ids(rec, np.full(n, _SRC_SALT, np.uint64), np.zeros(n, np.uint64), salt)


def position_chunk_ids(
    start: int, n: int, bits: int, micro_batch: int, source: int, partition: int, salt: int
) -> np.ndarray:
    """Source ids in aligned blocks of ``2**bits`` (as :func:`chunked_ids`) derived from the
    rows' positions ``[start, start + n)`` in their partition: block ``p >> bits`` of the
    partition gets a prefix hashed from (micro-batch, source, partition, block), row ``p`` the
    low bits ``p & (2**bits - 1)``. A retried task that reads the partition in the same order
    re-creates every id (read in another order, a row's id names another row's record: its
    chunk's event then misses and the chunk is replayed, from what was persisted first).

    >>> a = position_chunk_ids(1022, 4, 10, 0, 0, 3, salt=7)
    >>> (a & 1023).tolist(), len(set((a >> 10).tolist()))
    ([1022, 1023, 0, 1], 2)
    """
    from .. import acker

    if n == 0:
        return np.empty(0, np.uint64)
    width = np.uint64(bits)
    first, last = start >> bits, (start + n - 1) >> bits
    blocks = np.arange(first, last + 1, dtype=np.uint64) + np.uint64(1)
    where = acker.derive_ids([micro_batch + 1], [source + 1], [partition + 1], _CHUNK_SALT)[0]
    k = len(blocks)
    prefix = acker.derive_ids(np.full(k, where), blocks, np.zeros(k, np.uint64), salt) >> width
    prefix[prefix == 0] = 1
    pos = np.arange(start, start + n, dtype=np.uint64)
    low = pos & np.uint64((1 << bits) - 1)
    return (prefix[(pos >> width) - np.uint64(first)] << width) | low
