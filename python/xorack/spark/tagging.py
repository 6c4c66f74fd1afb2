"""Source tagging inside Spark tasks: :class:`SourceTagger` draws a batch's record ids, hashes
its key columns exactly as Spark does, persists it with the acker and only then emits it;
:class:`DerivedTagger` tags an aggregate's output that an optimistic round writes straight into
its Python sink.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .ids import (
    ContentRanks,
    chunked_ids,
    client_of,
    content_ids,
    i64,
    name_salt,
    position_chunk_ids,
    position_record_ids,
    record_src_ids,
    u64,
)
from .lineage import KEEP, REC, SRC
from .stages import PART, ROUND, StageSchemaError


@dataclass(frozen=True)
class SourceTagger:
    """``mapInArrow`` function of a tracked source: tag, hash keys, persist, then emit.

    Yields the input columns followed by ``_ft_src`` and ``_ft_rec``. The input's ``_ft_part``
    column is the partition, its ``_ft_round`` column (if any) the micro-batch id (else
    ``batch``): a tagger reading its round from the rows is the same object every round, and
    its ``mapInArrow`` is built once (:func:`~xorack.spark.lineage.map_in_arrow_kept`).

    A resumed job (``progress``) notes with every persist where the batch ends in its
    partition, and skips the first ``skip[partition]`` rows of a partition: an earlier run
    persisted them (their ids are still drawn, so that the ids of the rows after them are
    those of the earlier run).
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
    progress: bool = False  # note each persist's end row in its partition (a resumable job)
    skip: tuple[tuple[int, int], ...] = ()  # ((batch << 16) | partition, rows persisted before)
    # the input columns' real names when they cross mapInArrow under others (PySpark reads a
    # name with a dot as a struct field); empty: as they come
    names: tuple[str, ...] = ()
    # the watermark's column: each record's event time (microseconds) is persisted with it,
    # so that the FT layer can hold the watermark back by the records still pending
    event_time: str | None = None
    # with event_time: an accumulator of the largest event time read (max_param), which plain
    # Spark's watermark follows (no second pass over the micro-batch)
    event_max: Any = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .. import acker, hashing

        client = client_of(self.location, self.token, self.tls_root_certs, self.job)
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
            epoch = self.batch
            i = batch.schema.get_field_index(ROUND)
            if i >= 0:
                epoch = int(batch.column(i)[0].as_py())
                batch = batch.remove_column(i)
            if self.names:
                batch = pa.RecordBatch.from_arrays(batch.columns, names=list(self.names))
            missing = [k for k in self.keys if k not in batch.schema.names]
            if missing:
                raise StageSchemaError(
                    f"source {self.name!r}: key column(s) {missing} not in the input columns "
                    f"{batch.schema.names}"
                )
            if self.deterministic and self.chunk_bits:  # a stable order (content-sorted)
                rec = position_record_ids(offset, n, epoch, self.source, partition, salt)
            elif self.deterministic:
                # a keyed source's identical rows share a partition (hash partitioning by the
                # keys, coalesced or not by adaptive execution: never split), so its ids leave
                # the partition out: they do not depend on how many partitions the source
                # goes on in (a barrier's output is coalesced when small)
                where = -1 if self.keys else partition
                rec = content_ids(batch, ranks, epoch, self.source, where, salt)
            else:
                rec = acker.new_ids(n)
            offset += n
            # a resumed job's progress is kept per (micro-batch, partition): batch runs read
            # their input in micro-batch 0
            key = (epoch << 16) | partition
            if self.progress and partition >= 1 << 16:
                raise StageSchemaError(
                    f"source {self.name!r}: a resumable job (resume=True) reads at most 65536 "
                    f"partitions per source, got partition {partition}: repartition it"
                )
            # the largest event time counts every row Spark reads, those persisted by an
            # earlier run included (a micro-batch run again after a crash: as Spark's own)
            times = event_micros(batch, self.event_time) if self.event_time else None
            if times is not None and self.event_max is not None:
                known = times[times != NO_EVENT_TIME]
                if len(known):
                    self.event_max.add(int(known.max()))
            done = min(n, max(0, skip.get(key, 0) - (offset - n)))
            if done:  # persisted by an earlier run of the job
                if done == n:
                    continue
                batch, rec, n = batch.slice(done), rec[done:], n - done
                times = times[done:] if times is not None else None
            key_hash = None
            if self.keys:
                key_hash = hashing.murmur3_hash([batch.column(k) for k in self.keys])
            # a deterministic source derives its source ids too (a retried task re-creates
            # them: the acker keeps one record instead of a copy it would replay)
            src_ids = None
            if self.deterministic and self.chunk_bits:
                src_ids = position_chunk_ids(
                    offset - n, n, self.chunk_bits, epoch, self.source, partition, salt
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
                **({"idempotent": True, "epoch": epoch} if self.deterministic else {}),
                **({"event_time": times} if times is not None else {}),
            )
            src = np.asarray(src, dtype=np.uint64)
            settled = src == 0  # records that already completed or left: Spark ran the task
            if settled.any():  # again (a recomputed map stage, a speculative copy): drop them
                keep = ~settled
                if not keep.any():
                    continue
                batch, src, rec = batch.filter(pa.array(keep)), src[keep], rec[keep]
            yield batch.append_column(SRC, pa.array(i64(src), pa.int64())).append_column(
                REC, pa.array(i64(rec), pa.int64())
            )


NO_EVENT_TIME = -(2**63)  # a record without an event time (the FT layer's "none")


def max_param() -> Any:
    """A Spark ``AccumulatorParam`` keeping the largest int (``NO_EVENT_TIME`` when none)."""
    from pyspark.accumulators import AccumulatorParam

    class _Max(AccumulatorParam):
        def zero(self, value: int) -> int:
            return NO_EVENT_TIME

        def addInPlace(self, a: int, b: int) -> int:
            return max(a, b)

    return _Max()


def event_micros(batch: pa.RecordBatch, column: str) -> np.ndarray:
    """The event time of each row of ``batch`` (its timestamp ``column``) in microseconds since
    the epoch; a null as the smallest int64, "none" to the FT layer (a row without a time
    falls in no window)."""
    col = batch.column(column)
    us = pc.cast(col, pa.timestamp("us", tz=getattr(col.type, "tz", None))).cast(pa.int64())
    return us.fill_null(NO_EVENT_TIME).to_numpy(zero_copy_only=False).astype(np.int64)


#: The column of an optimistic aggregate's groups holding the XOR of their rows' events.
GROUP_XOR = "_ft_x"


def source_salt(name: str, id_salt: int = 0) -> int:
    """The salt of a source's record ids (its name and the pipeline's ``id_salt``)."""
    return (name_salt(f"source:{name}") ^ id_salt) & 0x7FFF_FFFF_FFFF_FFFF


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


__all__ = [
    "GROUP_XOR",
    "NO_EVENT_TIME",
    "DerivedTagger",
    "SourceTagger",
    "event_micros",
    "max_param",
    "source_salt",
]
