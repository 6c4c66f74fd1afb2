"""The code that runs inside Spark tasks: source tagging, tracked stages, sink acking.

Each class here is a picklable callable handed to ``mapInArrow`` / ``mapInPandas``. They talk to
the acker service through :class:`xorack.service.AckerClient` (one cached connection per Python
worker process) and follow the order of "A record's life" (DESIGN.md):

* :class:`SourceTagger` draws ``_ft_rec`` ids, hashes the key columns exactly as Spark does,
  persists the batch (payload + births) and only then yields it downstream;
* :class:`StageRunner` calls the user function on a pandas batch, bisects it when the function
  raises so that only failing rows fail (or fails the rows a ``FailRecord(rows=...)`` names),
  maps each output row to its parent through ``_ft_rec``,
  anchors the outputs and sends one combined event per input row before yielding;
* :class:`SinkRunner` writes a batch through a :class:`~xorack.spark.sinks.Sink`, and acks the
  rows it consumed once the write is durable.

Ids are ``uint64`` inside xorack and ``bigint`` (the same 64 bits) in Spark.

>>> from xorack.spark.stages import LINEAGE_COLUMNS
>>> LINEAGE_COLUMNS
('_ft_src', '_ft_rec')
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import ArrayLike

from .._checks import count_distinct
from ..errors import FailRecord, LineageError, XorackError
from .lineage import EV, KEEP, REC, SRC, settle

LINEAGE_COLUMNS = (SRC, REC)  # what a stage's function sees (the pending columns are settled)
PART = "_ft_part"  # spark_partition_id() of the source's own partitioning, read by the tagger
BRANCH = "_ft_branch"  # which consumer of a branch point a tee'd copy belongs to
ROUND_PROPERTY = "xorack.round"  # Spark local property: the batch round (0 = first attempt)
# Spark local property set in streaming: "s:" + the replays of the running micro-batch (their
# _ft_src ids, sorted, and attempts), base64; absent in batch runs (attempt = round + 1)
ATTEMPTS_PROPERTY = "xorack.attempts"

UserFunction = Callable[[pd.DataFrame], "pd.DataFrame | Iterable[pd.DataFrame]"]


class StageSchemaError(XorackError, ValueError):
    """A stage's input or output does not have the columns its declaration promises."""


def current_round() -> int:
    """The batch round the running Spark task belongs to (0 on the first attempt of every source
    record, r on the r-th replay round); 0 outside xorack-run tasks.

    In batch runs every record processed in round r is on its attempt r + 1, so a function can
    inject failures "on the first attempt only" deterministically (in streaming, where a
    micro-batch mixes attempts, use :func:`current_attempt` ``(pdf)``):

    >>> current_round()
    0
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return int(os.environ.get("XORACK_ROUND", "0"))
    value = ctx.getLocalProperty(ROUND_PROPERTY)
    return int(value) if value else 0


def encode_attempts(src: ArrayLike, attempt: ArrayLike) -> str:
    """The value of :data:`ATTEMPTS_PROPERTY` for a micro-batch whose replays have source ids
    ``src`` on attempts ``attempt`` (the other rows are on their first attempt)."""
    import base64

    src = np.asarray(src, dtype=np.uint64)
    order = np.argsort(src, kind="stable")
    att = np.asarray(attempt, dtype=np.int64)[order].astype(np.uint16)
    raw = np.ascontiguousarray(src[order]).tobytes() + np.ascontiguousarray(att).tobytes()
    return "s:" + base64.b64encode(raw).decode("ascii")


_decoded: tuple[str, np.ndarray, np.ndarray] | None = None  # the last property decoded (per worker)


def _decode_attempts(value: str) -> tuple[np.ndarray, np.ndarray]:
    global _decoded
    cached = _decoded
    if cached is not None and cached[0] == value:
        return cached[1], cached[2]
    import base64

    raw = base64.b64decode(value[2:])
    n = len(raw) // 10
    src = np.frombuffer(raw[: 8 * n], dtype=np.uint64)
    att = np.frombuffer(raw[8 * n :], dtype=np.uint16).astype(np.int64)
    _decoded = (value, src, att)
    return src, att


def _local_property(key: str) -> str | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else ctx.getLocalProperty(key)


def current_attempt(pdf: pd.DataFrame | None = None) -> Any:
    """Which attempt the records a stage function is processing are on (1 = first).

    * Batch runs (:meth:`~xorack.spark.Pipeline.run`): every record of round r of a phase is
      on attempt r + 1, so ``current_attempt()`` is ``current_round() + 1`` (an ``int``) and
      ``current_attempt(pdf)`` that number for each row (a numpy ``int64`` array).
    * Streaming (:meth:`~xorack.spark.Pipeline.start_stream`): a micro-batch mixes fresh
      records (attempt 1) and replays of earlier micro-batches (attempt >= 2), so pass the
      function's input frame: ``current_attempt(pdf)`` is each row's attempt, looked up by its
      ``_ft_src`` among the replays the micro-batch was given (rows a stage derived from a
      source record are on that record's attempt). The drain rounds of ``stop()`` / ``wait()``
      are answered the same way. Without ``pdf`` it raises ``ValueError`` in streaming.
    * Outside a xorack task (a function called directly): ``current_round() + 1``, 1 by default.

    ``pdf`` must carry the lineage column ``_ft_src`` when FT is on (a stage's input does);
    with FT off every record is on its first attempt. In streaming the micro-batch's replays
    (source id and attempt, about 13 characters each) travel to every task as a Spark local
    property, decoded once per Python worker and micro-batch.

    >>> import pandas as pd
    >>> current_attempt(), current_attempt(pd.DataFrame({"x": [7, 8]})).tolist()
    (1, [1, 1])
    >>> def flaky(pdf):  # fails each record's first attempt, in batch and in streaming
    ...     first = current_attempt(pdf) == 1
    ...     if first.any():
    ...         raise FailRecord("first attempt", rows=first)
    ...     return pdf
    """
    value = _local_property(ATTEMPTS_PROPERTY)
    if value is None or not value.startswith("s:"):
        attempt = current_round() + 1
        return attempt if pdf is None else np.full(len(pdf), attempt, dtype=np.int64)
    if pdf is None:
        raise ValueError(
            "current_attempt(): in streaming a micro-batch mixes fresh records (attempt 1) and "
            "replays; pass the stage's input frame, current_attempt(pdf), for each row's attempt"
        )
    src, att = _decode_attempts(value)
    out = np.ones(len(pdf), dtype=np.int64)
    if not len(src) or not len(pdf):  # no replay in this micro-batch (or FT off)
        return out
    if SRC not in pdf.columns:
        raise LineageError(
            f"current_attempt(pdf): the frame has no lineage column {SRC!r} (columns "
            f"{list(pdf.columns)}); pass the frame the stage function was called on"
        )
    ids = u64(pdf[SRC].to_numpy())
    at = np.minimum(np.searchsorted(src, ids), len(src) - 1)
    found = src[at] == ids
    out[found] = att[at[found]]
    return out


def _client(
    location: str, token: str | None, tls_root_certs: bytes | None = None, job: str | None = None
):
    from ..service import AckerClient

    return AckerClient.get(location, token=token, job=job, tls_root_certs=tls_root_certs)


def acker_of(
    round_xor: Any,
    location: str | None,
    token: str | None,
    tls_root_certs: bytes | None = None,
    job: str | None = None,
) -> Any:
    """What a runner sends its events and failures to: an optimistic round's accumulator
    (``round_xor``, a :class:`~xorack.spark.optimistic.RoundToken`, read through a
    :class:`~xorack.spark.optimistic.RoundXor`) when given, else the acker service."""
    if round_xor is not None:
        from .optimistic import RoundXor

        return RoundXor(round_xor)
    if location is None:
        raise ValueError("a tracked runner needs the acker's location or a round accumulator")
    return _client(location, token, tls_root_certs, job)


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


def _salt(name: str) -> int:
    """A stable 63-bit salt for a stage name (Python's hash() is randomized per process)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def _ordinals(parent: np.ndarray) -> np.ndarray:
    """For each output row, its rank among the outputs of the same parent (in output order).

    Outputs in input order (a filter, an explode: ``parent`` non-decreasing, the common case)
    are ranked in one pass; any other order is sorted first (stably: the same ranks).

    >>> _ordinals(np.array([0, 0, 2, 2, 2])).tolist(), _ordinals(np.array([1, 0, 1])).tolist()
    ([0, 1, 0, 1, 2], [0, 0, 1])
    """
    n = len(parent)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    in_order = bool((parent[1:] >= parent[:-1]).all())
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
# source


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


@dataclass(frozen=True)
class SourceTagger:
    """``mapInArrow`` function of a tracked source: tag, hash keys, persist, then emit.

    Yields the input columns followed by ``_ft_src`` and ``_ft_rec``. A resumed job
    (``progress``) notes with every persist where the batch ends in its partition, and skips
    the first ``skip[partition]`` rows of a partition: an earlier run persisted them (their ids
    are still drawn, so that the ids of the rows after them are those of the earlier run).
    """

    name: str
    source: int
    keys: tuple[str, ...]
    location: str
    token: str | None = None
    deterministic: bool = True
    id_salt: int = 0
    batch: int = 0  # the micro-batch id in streaming (0 in batch runs): part of every id
    tls_root_certs: bytes | None = None  # PEM the executors trust for a grpc+tls:// acker
    job: str | None = None  # the pipeline run's namespace on the acker
    chunk_bits: int = 0  # > 0: source ids drawn in aligned blocks (chunks) of 2**chunk_bits
    ordered: bool = True  # a retried task reads each partition in the same order
    progress: bool = False  # note each persist's end row in its partition (a resumable job)
    skip: tuple[tuple[int, int], ...] = ()  # ((batch << 16) | partition, rows persisted before)
    # the input columns' real names when they cross mapInArrow under others (PySpark reads a
    # name with a dot as a struct field); empty: as they come
    names: tuple[str, ...] = ()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .. import acker, hashing

        client = _client(self.location, self.token, self.tls_root_certs, self.job)
        ranks = ContentRanks()
        skip = dict(self.skip)
        offset = 0  # rows of the partition read so far (this task reads one partition)
        salt = source_salt(self.name, self.id_salt)
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            # TaskContext.partitionId() is the index in the *task's* RDD (offset inside a
            # union); spark_partition_id() is the partition of the source's own partitioning
            i = batch.schema.get_field_index(PART)
            partition = int(batch.column(i)[0].as_py())
            batch = batch.remove_column(i)
            if self.names:
                batch = pa.RecordBatch.from_arrays(batch.columns, names=list(self.names))
            missing = [k for k in self.keys if k not in batch.schema.names]
            if missing:
                raise StageSchemaError(
                    f"source {self.name!r}: key column(s) {missing} not in the input columns "
                    f"{batch.schema.names}"
                )
            if self.deterministic and self.chunk_bits and self.ordered:  # a stable order
                rec = position_record_ids(offset, n, self.batch, self.source, partition, salt)
            elif self.deterministic:
                # a keyed source's identical rows share a partition (hash partitioning by the
                # keys, coalesced or not by adaptive execution: never split), so its ids leave
                # the partition out: they do not depend on how many partitions the source
                # goes on in (a barrier's output is coalesced when small)
                where = -1 if self.keys else partition
                rec = content_ids(batch, ranks, self.batch, self.source, where, salt)
            else:
                rec = acker.new_ids(n)
            offset += n
            # a resumed job's progress is kept per (micro-batch, partition): batch runs read
            # their input in micro-batch 0
            key = (self.batch << 16) | partition
            if self.progress and partition >= 1 << 16:
                raise StageSchemaError(
                    f"source {self.name!r}: a resumable job (resume=True) reads at most 65536 "
                    f"partitions per source, got partition {partition}: repartition it"
                )
            done = min(n, max(0, skip.get(key, 0) - (offset - n)))
            if done:  # persisted by an earlier run of the job
                if done == n:
                    continue
                batch, rec, n = batch.slice(done), rec[done:], n - done
            key_hash = None
            if self.keys:
                key_hash = hashing.murmur3_hash([batch.column(k) for k in self.keys])
            # a deterministic source derives its source ids too (a retried task re-creates
            # them: the acker keeps one record instead of a copy it would replay)
            src_ids = None
            if self.deterministic and self.chunk_bits and self.ordered:
                src_ids = position_chunk_ids(
                    offset - n, n, self.chunk_bits, self.batch, self.source, partition, salt
                )
            elif self.chunk_bits:
                src_ids = chunked_ids(n, self.chunk_bits)
            elif self.deterministic:
                src_ids = record_src_ids(rec, salt)
            # the FT layer keeps each record's first id (its birth) and partition: a replay
            # gets them back as _ft_origin_rec / _ft_origin_partition
            src = client.persist(
                batch,
                key_hash=key_hash,
                source=self.source,
                partition=partition,
                births=rec,
                src_ids=src_ids,
                **({"progress": (key, offset)} if self.progress else {}),
                **({"idempotent": True} if self.deterministic and self.ordered else {}),
            )
            src = np.asarray(src, dtype=np.uint64)
            yield batch.append_column(SRC, pa.array(i64(src), pa.int64())).append_column(
                REC, pa.array(i64(rec), pa.int64())
            )


#: The column of an optimistic aggregate's groups holding the XOR of their rows' events.
GROUP_XOR = "_ft_x"


def source_salt(name: str, id_salt: int = 0) -> int:
    """The salt of a source's record ids (its name and the pipeline's ``id_salt``)."""
    return (_salt(f"source:{name}") ^ id_salt) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class DerivedTagger:
    """``mapInArrow`` function of an optimistic round that writes an aggregate's output
    straight into the one Python sink reading it (the next phase folded into this round): each
    row gets the record id the output's tracked tagger would give it (a keyed source's content
    id, so that a second run into the sink absorbs the rows whichever path it takes) and the
    round's own attempt id ``src`` (the sink retracts the round's rows if the round falls
    back). The ids' XOR goes into the round's accumulator as their births; the sink's acks
    cancel it. Nothing is persisted: the round's records are its sources'.
    """

    name: str
    source: int
    src: int
    round_xor: Any  # xorack.spark.optimistic.RoundToken
    deterministic: bool = True
    id_salt: int = 0

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .. import acker
        from .optimistic import RoundXor

        client = RoundXor(self.round_xor)
        ranks = ContentRanks()
        salt = source_salt(self.name, self.id_salt)
        for batch in batches:
            names = batch.schema.names
            if GROUP_XOR in names:  # the groups' events; ghost groups leave no row
                client.xor(None, u64(batch.column(GROUP_XOR)))
                keep = batch.column(KEEP)
                batch = batch.drop_columns([KEEP, GROUP_XOR])
                if keep.null_count or not pc.all(keep).as_py():
                    batch = batch.filter(pc.fill_null(keep, False))
            n = batch.num_rows
            if n == 0:
                continue
            if self.deterministic:  # a keyed source's ids (batch 0, no partition)
                rec = content_ids(batch, ranks, 0, self.source, -1, salt)
            else:
                rec = np.asarray(acker.new_ids(n), dtype=np.uint64)
            client.xor(None, rec)
            src = np.full(n, self.src, dtype=np.uint64)
            yield batch.append_column(SRC, pa.array(i64(src), pa.int64())).append_column(
                REC, pa.array(i64(rec), pa.int64())
            )


# --------------------------------------------------------------------------------------------
# tracked stages


def _as_frames(result: Any, stage: str) -> list[pd.DataFrame]:
    if result is None:
        return []
    if isinstance(result, pd.DataFrame):
        return [result]
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes, pd.Series)):
        frames = list(result)
        for f in frames:
            if not isinstance(f, pd.DataFrame):
                raise StageSchemaError(
                    f"stage {stage!r}: the function must return pandas DataFrames, "
                    f"got {type(f).__name__}"
                )
        return frames
    raise StageSchemaError(
        f"stage {stage!r}: the function must return a pandas DataFrame (or an iterable of them), "
        f"got {type(result).__name__}"
    )


def _failing_positions(rows: Any, n: int, stage: str) -> np.ndarray:
    """The positions (sorted, unique, in ``[0, n)``) that ``FailRecord(rows=...)`` names in a
    frame of ``n`` rows: a boolean mask of length ``n`` or 0-based integer positions."""

    def bad(why: str) -> StageSchemaError:
        return StageSchemaError(
            f"stage {stage!r}: FailRecord(rows=...) {why}; pass a boolean mask with one entry "
            f"per row of the frame the function was called on ({n} rows) or 0-based positions "
            f"(df.iloc positions, not index labels)"
        )

    if isinstance(rows, pd.Index):
        raise bad("got a pandas Index (labels are ambiguous)")
    if isinstance(rows, pd.DataFrame):
        raise bad("got a DataFrame")
    try:
        if isinstance(rows, (pa.Array, pa.ChunkedArray)):  # an Arrow stage's mask/positions
            if pa.types.is_boolean(rows.type):  # e.g. from pyarrow.compute: null = not failing
                rows = rows.fill_null(False)
            rows = rows.to_numpy(zero_copy_only=False)
        elif isinstance(rows, (pd.Series, pd.api.extensions.ExtensionArray)):
            # nullable booleans (e.g. from string-dtype .str ops): NA counts as not failing
            if pd.api.types.is_bool_dtype(rows.dtype):
                rows = rows.to_numpy(dtype=bool, na_value=False)
            elif pd.api.types.is_integer_dtype(rows.dtype):
                rows = rows.to_numpy(dtype=np.int64)
            else:
                rows = rows.to_numpy()
        arr = np.asarray(rows)
    except Exception as exc:  # ragged or exotic objects, missing positions
        raise bad(f"is not a usable array ({type(rows).__name__}: {exc})") from None
    if arr.ndim != 1:
        raise bad(f"must be one-dimensional, got shape {arr.shape}")
    if len(arr) == 0:
        raise bad("selects no row (raise it only when some row fails)")
    if arr.dtype == bool:
        if len(arr) != n:
            raise bad(f"is a boolean mask of length {len(arr)}")
        pos = np.flatnonzero(arr)
    elif arr.dtype.kind in "iu":
        pos = np.unique(arr.astype(np.int64))
        if len(pos) and (pos[0] < 0 or pos[-1] >= n):
            raise bad(f"has position(s) outside [0, {n})")
    else:
        raise bad(f"has dtype {arr.dtype}")
    if not len(pos):
        raise bad("selects no row (raise it only when some row fails)")
    return pos.astype(np.int64)


@dataclass(frozen=True)
class Rows:
    """How :func:`call_bisecting` cuts a batch and reads a function's result: the batch's
    length, a contiguous slice ``[lo, hi)``, a take by positions, and the result as a list of
    batches (``outputs(result, stage)``). :data:`PANDAS_ROWS` for pandas frames; the Arrow stage
    has its own (:data:`xorack.spark.arrow_stage.ARROW_ROWS`).

    >>> import pandas as pd
    >>> PANDAS_ROWS.take(pd.DataFrame({"x": [5, 6, 7]}), np.array([0, 2])).x.tolist()
    [5, 7]
    """

    length: Callable[[Any], int]
    slice: Callable[[Any, int, int], Any]
    take: Callable[[Any, np.ndarray], Any]
    outputs: Callable[[Any, str], list[Any]]


def _pandas_slice(pdf: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    return pdf.iloc[lo:hi]


def _pandas_take(pdf: pd.DataFrame, pos: np.ndarray) -> pd.DataFrame:
    return pdf.iloc[pos]


PANDAS_ROWS = Rows(len, _pandas_slice, _pandas_take, _as_frames)


def call_bisecting(
    fn: Callable[[Any], Any],
    pdf: Any,
    stage: str,
    bisect: bool = True,
    rows: Rows = PANDAS_ROWS,
) -> tuple[list[Any], list[tuple[np.ndarray, str]]]:
    """Call ``fn`` on ``pdf``; when it raises, call it on the two halves, recursively, so that
    only the rows whose own processing raises are failed.

    When it raises ``FailRecord(reason, rows=...)`` the named rows fail at once and ``fn`` is
    called once more on the remaining rows (no bisection).

    Returns (output batches of the rows that succeeded, [(failing row positions, reason)]).
    With ``bisect=False`` (grouped stages: a group is one unit) the whole batch fails.
    :class:`StageSchemaError` and :class:`LineageError` are programming errors, never bisected.
    ``rows`` says how to cut the batch (pandas frames by default; any batch type with a
    :class:`Rows`).

    >>> import pandas as pd
    >>> def f(df):
    ...     if (df.x == 3).any():
    ...         raise ValueError("three")
    ...     return df
    >>> outs, failed = call_bisecting(f, pd.DataFrame({"x": [1, 2, 3, 4]}), "demo")
    >>> sorted(pd.concat(outs).x), [(p.tolist(), r) for p, r in failed]
    ([1, 2, 4], [([2], 'ValueError: three')])
    >>> def g(df):
    ...     bad = (df.x % 2 == 0).to_numpy()
    ...     if bad.any():
    ...         raise FailRecord("even", rows=bad)
    ...     return df
    >>> outs, failed = call_bisecting(g, pd.DataFrame({"x": [1, 2, 3, 4]}), "demo")
    >>> sorted(pd.concat(outs).x), [(p.tolist(), r) for p, r in failed]
    ([1, 3], [([1, 3], 'even')])
    """
    outs: list[Any] = []
    failed: list[tuple[np.ndarray, str]] = []

    def reason_of(exc: Exception) -> str:
        return (str(exc) if isinstance(exc, FailRecord) else f"{type(exc).__name__}: {exc}")[:500]

    def run(pos: np.ndarray | None, lo: int, hi: int, must_fail: bool = False) -> bool:
        # the rows [lo, hi) of the batch (pos is None) or the rows at pos (after a
        # FailRecord(rows=...)); True when the part raised. must_fail: its parent raised and its
        # sibling did not, so calling it whole would raise again: split it at once (one call
        # saved per level). A FailRecord naming rows loops on the rest (no recursion: it may
        # name one row a call).
        raised = False
        while True:
            size = hi - lo if pos is None else len(pos)
            if must_fail and size > 1 and bisect:
                break
            part = rows.slice(pdf, lo, hi) if pos is None else rows.take(pdf, pos)
            try:
                outs.extend(rows.outputs(fn(part), stage))
                return raised
            except (StageSchemaError, LineageError):
                raise
            except Exception as exc:  # any user exception fails its rows
                absolute = np.arange(lo, hi, dtype=np.int64) if pos is None else pos
                named = getattr(exc, "rows", None) if isinstance(exc, FailRecord) else None
                if named is not None and bisect:
                    bad = _failing_positions(named, size, stage)
                    failed.append((absolute[bad], reason_of(exc)))
                    rest = np.delete(absolute, bad)
                    if not len(rest):
                        return True
                    pos, lo, hi, raised = rest, 0, len(rest), True
                    continue
                if size == 1 or not bisect:
                    failed.append((absolute, reason_of(exc)))
                    return True
                break
        if pos is None:
            mid = (lo + hi) // 2
            left_raised = run(None, lo, mid)
            run(None, mid, hi, must_fail=not left_raised)
        else:
            mid = len(pos) // 2
            left_raised = run(pos[:mid], 0, mid)
            run(pos[mid:], 0, len(pos) - mid, must_fail=not left_raised)
        return True

    n = rows.length(pdf)
    if n:
        run(None, 0, n)
    return outs, failed


def _count(
    tally: Any, where: str, src: np.ndarray, failures: Sequence[tuple[np.ndarray, str]]
) -> None:
    """Add a batch's source records seen and failed per error to the runaway guard's tally."""
    if tally is None:
        return
    from .guard import SEEN, reason_key

    counts = {(where, SEEN): count_distinct(src)}
    for pos, reason in failures:
        key = (where, reason_key(reason))
        counts[key] = counts.get(key, 0) + count_distinct(src[pos])
    tally.add(counts)


def settle_frame(pdf: pd.DataFrame, client: Any, ack_kept: bool) -> pd.DataFrame:
    """At a Python boundary: send the events native operators left pending (``_ft_ev``; with
    ``ack_kept`` also the ack of every live row), drop the ghost rows (``_ft_keep`` false: rows
    a native filter, join or generator removed) and the two pending columns."""
    if EV not in pdf.columns:
        return pdf
    keep = pdf[KEEP].to_numpy(dtype=bool)
    ev_src, ev_val = settle(u64(pdf[SRC]), u64(pdf[REC]), u64(pdf[EV]), keep, ack_kept)
    if len(ev_src):
        client.xor(ev_src, ev_val)
    out = pdf.drop(columns=[EV, KEEP])
    return out if keep.all() else out[keep]


def born_ids(n: int, born: tuple[Any, int], client: Any) -> tuple[np.ndarray, np.ndarray]:
    """Lineage for ``n`` source rows that reach an optimistic round's Python stage untagged:
    random record ids (their XOR goes into the round's accumulator as their births, which the
    stage's events then cancel), the round's attempt id, and the count of the source's rows
    (``born``: (accumulator, attempt id))."""
    from .. import acker

    count, src = born
    rec = np.asarray(acker.new_ids(n), dtype=np.uint64) if n else np.empty(0, np.uint64)
    if n:
        count.add(n)
        client.xor(None, rec)
    return np.full(n, src, dtype=np.uint64), rec


def anchor_outputs(
    stage: str,
    in_src: np.ndarray,
    in_rec: np.ndarray,
    parent: np.ndarray,
    failures: Sequence[tuple[np.ndarray, str]],
    client: Any,
    deterministic: bool,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """A stage's lineage step for one batch (pandas or Arrow alike): fail the source records of
    the failing rows (one ``fail`` call per reason), drop the outputs of every failed record,
    draw the outputs' ids (deterministic: derived from the parent's id and the output's rank
    among its siblings) and send one combined event per kept input row (``anchor``, one
    ``xor`` call). ``parent[i]`` is the input position of output ``i``.

    Returns (positions of the outputs kept, or None when all are; their ``_ft_src``; their
    ``_ft_rec``).
    """
    from .. import acker

    kept = None
    if failures:
        by_reason: dict[str, list[np.ndarray]] = {}
        for pos, reason in failures:
            by_reason.setdefault(reason, []).append(pos)
        failed_all: list[np.ndarray] = []
        for reason, parts in by_reason.items():
            srcs = np.unique(in_src[np.concatenate(parts)])
            failed_all.append(srcs)
            client.fail(srcs, reason=f"stage {stage}: {reason}")
        failed_src = np.unique(np.concatenate(failed_all))
        keep_in = ~np.isin(in_src, failed_src)
        keep_out = keep_in[parent] if len(parent) else np.ones(0, dtype=bool)
        # re-index parents into the kept inputs
        new_pos = np.cumsum(keep_in) - 1
        kept = np.flatnonzero(keep_out)
        parent = new_pos[parent[keep_out]]
        in_src, in_rec = in_src[keep_in], in_rec[keep_in]

    out_rec = None
    if deterministic and len(parent):
        salt = _salt(f"stage:{stage}")
        out_rec = acker.derive_ids(in_rec[parent], in_rec[parent], _ordinals(parent), salt)
    out_src, out_rec, ev_src, ev_xor = acker.anchor(in_src, in_rec, parent, out_rec)
    if len(ev_src):
        client.xor(ev_src, ev_xor)
    return kept, np.asarray(out_src, dtype=np.uint64), np.asarray(out_rec, dtype=np.uint64)


@dataclass(frozen=True)
class StageRunner:
    """``mapInPandas`` function of a tracked stage.

    ``columns`` are the payload columns the stage declares (its output schema without the
    lineage columns); the output carries them followed by ``_ft_src``, ``_ft_rec``. With
    ``ft=False`` the runner only calls the function and selects the declared columns.
    """

    name: str
    fn: UserFunction
    columns: tuple[str, ...]
    location: str | None = None
    token: str | None = None
    ft: bool = True
    deterministic: bool = True
    bisect: bool = True
    single_record_groups: bool = False  # apply_in_pandas: a group must hold one source record
    tally: Any = None  # the round's failure accumulator (the runaway guard), or None
    tls_root_certs: bytes | None = None  # PEM the executors trust for a grpc+tls:// acker
    job: str | None = None  # the pipeline run's namespace on the acker
    # an optimistic round's accumulator (xorack.spark.optimistic): events and failures go
    # there instead of to the acker service, and a failing batch is not bisected
    round_xor: Any = None
    # an optimistic round whose source rows come in untagged: (the accumulator counting them,
    # their attempt id); the runner draws their ids (see born_ids)
    born: Any = None

    def __call__(self, pdfs: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        if not self.ft:
            for pdf in pdfs:
                for out in _as_frames(self.fn(pdf), self.name):
                    yield self._select(out, lineage=False)
            return
        client = acker_of(self.round_xor, self.location, self.token, self.tls_root_certs, self.job)
        for pdf in pdfs:
            if getattr(client, "failed", False):
                continue  # an optimistic round that failed a row is lost: skip its work
            if self.born is not None:
                src, rec = born_ids(len(pdf), self.born, client)
                pdf[SRC], pdf[REC] = i64(src), i64(rec)
            done = self.process(pdf, client)
            if done is not None:
                yield done

    def _check_columns(self, out: pd.DataFrame) -> None:
        missing = [c for c in self.columns if c not in out.columns]
        if missing:
            raise StageSchemaError(
                f"stage {self.name!r}: the function's output lacks declared column(s) {missing} "
                f"(it returned {list(out.columns)})"
            )

    def _select(self, out: pd.DataFrame, lineage: bool) -> pd.DataFrame:
        self._check_columns(out)
        cols = list(self.columns) + ([SRC, REC] if lineage else [])
        return out[cols] if list(out.columns) != cols else out

    def process(self, pdf: pd.DataFrame, client: Any) -> pd.DataFrame | None:
        """Run the function on one input batch; send the failures and events; return the output."""
        from .. import acker

        for c in LINEAGE_COLUMNS:
            if c not in pdf.columns:
                raise LineageError(
                    f"stage {self.name!r}: its input has no lineage column {c!r} (columns "
                    f"{list(pdf.columns)}); a tracked stage must read a tracked DataFrame"
                )
        pdf = settle_frame(pdf, client, ack_kept=False)
        if len(pdf) == 0:
            return None
        pdf = pdf.reset_index(drop=True)
        in_src = u64(pdf[SRC])
        in_rec = u64(pdf[REC])
        if self.single_record_groups and count_distinct(in_src) > 1:
            raise StageSchemaError(
                f"apply_in_pandas {self.name!r}: a group holds rows of "
                f"{len(np.unique(in_src))} source records; a grouped function over several "
                "records is not exact under record-level replay (a replayed record would be "
                "grouped without the others, e.g. a partial average). Use "
                "groupBy(...).agg(...) for aggregates (exactly-once), or group by a key that "
                "stays within one source record"
            )
        bisect = self.bisect and self.round_xor is None
        frames, failures = call_bisecting(self.fn, pdf, self.name, bisect)
        _count(self.tally, f"stage {self.name!r}", in_src, failures)
        frames = [f for f in frames if len(f.columns)]
        # one frame (the usual case) is used as it is: rows are taken by position below
        if len(frames) > 1:
            out = pd.concat(frames, ignore_index=True)
        else:
            out = frames[0] if frames else pdf.iloc[0:0]
        if REC not in out.columns:
            raise LineageError(
                f"stage {self.name!r}: the function's output has no {REC!r} column: output rows "
                f"must keep the {REC} of the input row they come from (filter / explode / merge "
                f"on the input frame keep it)"
            )
        if len(out):
            self._check_columns(out)
        try:
            parent = np.asarray(acker.parent_index(in_rec, u64(out[REC])), dtype=np.int64)
        except (TypeError, ValueError) as exc:  # LineageError included; TypeError: bad dtype
            raise LineageError(f"stage {self.name!r}: {exc}") from exc

        kept, out_src, out_rec = anchor_outputs(
            self.name, in_src, in_rec, parent, failures, client, self.deterministic
        )
        if kept is not None:
            out = out.iloc[kept]
        if not len(out):
            return None
        # an optimistic round's rows carry no attempt id out (the pipeline adds a constant)
        return with_lineage(out, self.columns, out_src if self.round_xor is None else None, out_rec)


@dataclass(frozen=True)
class GroupStageRunner:
    """``applyInPandas`` function of a tracked grouped stage: :class:`StageRunner` on one
    group (never bisected: a group is one unit, so an exception fails all its records)."""

    runner: StageRunner

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        r = self.runner
        cols = [*r.columns, *LINEAGE_COLUMNS] if r.ft else list(r.columns)
        if not r.ft:
            frames = _as_frames(r.fn(pdf), r.name)
            if not frames:
                return pd.DataFrame(columns=cols)
            return r._select(pd.concat(frames, ignore_index=True), lineage=False)
        assert r.location is not None
        out = r.process(pdf, _client(r.location, r.token, r.tls_root_certs, r.job))
        return pd.DataFrame(columns=cols) if out is None else out


def as_function(runner: GroupStageRunner) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """A plain one-argument function around ``runner`` (Spark's driver and worker count the
    parameters of a callable object differently)."""

    def apply(pdf: pd.DataFrame) -> pd.DataFrame:
        return runner(pdf)

    return apply


@dataclass(frozen=True)
class Tee:
    """The user function of a branch point's tee stage: each input row ``k`` times, the copy
    for consumer ``j`` marked ``_ft_branch = j``. Run by a :class:`StageRunner`, every copy is
    a child record with its own id (Storm's emit to several consumers), so each branch acks its
    own copy and the source record completes only when all branches are done."""

    copies: int

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        n = len(pdf)
        out = pdf.iloc[np.tile(np.arange(n), self.copies)].reset_index(drop=True)
        out[BRANCH] = np.repeat(np.arange(self.copies, dtype=np.int32), n)
        return out


# --------------------------------------------------------------------------------------------
# sinks

SUMMARY_SCHEMA = "sink string, partition int, rows long, duplicates long"


@dataclass(frozen=True)
class SinkRunner:
    """``mapInPandas`` function of a sink: write the task's rows in chunks of up to
    ``write_rows`` rows (the Arrow batches are gathered: one commit per chunk), ack each chunk
    once durable, and yield one summary row per task (sink, partition, rows, duplicates
    absorbed). Keyed upserts of random 64-bit ids touch pages all over the table, so a commit
    per 10 K-row Arrow batch rewrites most of the table each time; larger chunks cost about
    what appends do. FT ON and OFF write the same chunks."""

    name: str
    sink: Any  # xorack.spark.sinks.Sink
    columns: tuple[str, ...]
    location: str | None = None
    token: str | None = None
    ft: bool = True
    write_rows: int = 100_000
    tally: Any = None  # the round's failure accumulator (the runaway guard), or None
    tls_root_certs: bytes | None = None  # PEM the executors trust for a grpc+tls:// acker
    job: str | None = None  # the pipeline run's namespace on the acker
    # an optimistic round's accumulator (xorack.spark.optimistic): acks and failures go there,
    # rows already in the sink keep their attempt (the round's rows alone can be retracted),
    # and nothing more is written once a task of the round failed a row
    round_xor: Any = None

    def __call__(self, pdfs: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        client = (  # with FT on the pipeline always gives the acker's location
            acker_of(self.round_xor, self.location, self.token, self.tls_root_certs, self.job)
            if self.ft
            else None
        )
        rows = dups = 0
        pending: list[pd.DataFrame] = []
        buffered = 0
        writer = self.sink.open_writer(partition)
        try:
            for pdf in pdfs:
                if not len(pdf):
                    continue
                missing = [c for c in self.columns if c not in pdf.columns]
                if missing:
                    raise StageSchemaError(f"sink {self.name!r}: input lacks column(s) {missing}")
                if self.ft:
                    for c in LINEAGE_COLUMNS:
                        if c not in pdf.columns:
                            raise LineageError(
                                f"sink {self.name!r}: its input has no lineage column {c!r}"
                            )
                pending.append(pdf)
                buffered += len(pdf)
                if buffered >= self.write_rows:
                    r, d = self._write(writer, client, pending)
                    rows, dups, buffered = rows + r, dups + d, 0
                    pending = []
            if pending:
                r, d = self._write(writer, client, pending)
                rows, dups = rows + r, dups + d
        finally:
            writer.close()
        yield pd.DataFrame(
            {"sink": [self.name], "partition": [partition], "rows": [rows], "duplicates": [dups]}
        ).astype({"partition": "int32", "rows": "int64", "duplicates": "int64"})

    def _write(self, writer: Any, client: Any, frames: list[pd.DataFrame]) -> tuple[int, int]:
        """Write (and with FT ack) one chunk; returns (rows consumed, duplicates absorbed)."""
        pdf = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        if not self.ft:
            return len(pdf), writer.write(pdf[list(self.columns)], None)
        if EV in pdf.columns:  # ghosts (rows native operators removed) only send their event
            keep = pdf[KEEP].to_numpy(dtype=bool)
            ev = u64(pdf[EV])
        else:
            keep = np.ones(len(pdf), dtype=bool)
            ev = np.zeros(len(pdf), dtype=np.uint64)
        src, rec = u64(pdf[SRC]), u64(pdf[REC])
        live = pdf[keep] if not keep.all() else pdf
        if self.round_xor is not None and _round_lost(client):
            return 0, 0  # the round falls back: what it writes now would only be retracted
        try:
            if self.round_xor is not None:
                if not _takes(writer, "reown"):
                    raise StageSchemaError(
                        "its writer's write() takes no reown= (the sink says round_writes, "
                        "which an optimistic round needs it for): accept reown=, or set "
                        "round_writes = False on the sink's class"
                    )
                dups = writer.write(live[list(self.columns)], rec[keep], src=src[keep], reown=False)
            else:
                dups = _write_rows(writer, live[list(self.columns)], rec[keep], src[keep])
        except Exception as exc:  # the write rolled back: replay these records
            reason = f"sink {self.name}: {type(exc).__name__}: {exc}"[:500]
            failed = np.unique(src[keep])
            everything = np.arange(int(keep.sum()))
            _count(self.tally, f"sink {self.name!r}", src[keep], [(everything, reason)])
            client.fail(failed, reason=reason)
            writer.reset()
            others = ~np.isin(src, failed)
            ev_src, ev_val = settle(src[others], rec[others], ev[others], keep[others], False)
            if len(ev_src):
                client.xor(ev_src, ev_val)
            return 0, 0
        _count(self.tally, f"sink {self.name!r}", src[keep], [])
        ev_src, ev_val = settle(src, rec, ev, keep, ack_kept=True)
        if len(ev_src):
            client.xor(ev_src, ev_val)
        return int(keep.sum()), dups


def _round_lost(client: Any) -> bool:
    """Whether an optimistic round is lost: a row of this task failed, or another task said so
    in the round's abort file."""
    path = getattr(client, "abort_path", None)
    return bool(client.failed) or (path is not None and os.path.exists(path))


def _takes(writer: Any, argument: str) -> bool:
    """Whether ``writer.write`` takes the keyword ``argument`` (looked up once per writer: one
    per task)."""
    known = getattr(writer, "_xorack_takes", None)
    if known is None:
        known = {}
        with contextlib.suppress(AttributeError):
            writer._xorack_takes = known
    if argument not in known:
        import inspect

        try:
            known[argument] = argument in inspect.signature(writer.write).parameters
        except (TypeError, ValueError):
            known[argument] = False
    return bool(known[argument])


def _write_rows(writer: Any, rows: pd.DataFrame, rec: np.ndarray, src: np.ndarray) -> int:
    """``writer.write`` (durable on return), with the rows' attempt ids for writers that keep
    them (so that rows of attempts that did not complete can be retracted after the run)."""
    if _takes(writer, "src"):
        return writer.write(rows, rec, src=src)
    return writer.write(rows, rec)


def check_columns(name: str, have: Sequence[str], need: Sequence[str], what: str) -> None:
    """Raise a :class:`StageSchemaError` naming ``name`` when a column of ``need`` is missing."""
    missing = [c for c in need if c not in have]
    if missing:
        raise StageSchemaError(f"{what} {name!r}: missing column(s) {missing} (has {list(have)})")
