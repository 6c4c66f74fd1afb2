"""Barriers: operators whose output depends on many source records (an aggregate, a join of two
tracked DataFrames) and native sinks, all built on one mechanism, the *staging* of rows.

Exactly-once under record-level replay means the result equals plain Spark on the input minus
the dead-lettered records, whichever records were replayed. A barrier gets there by waiting:

1. in every round, the rows reaching a barrier (or a native sink) are written durably by Spark
   itself (Parquet, Spark's commit protocol: a retried task leaves one copy), with each row's
   source attempt id and the XOR event it owes (its pending event and its ack);
2. the acks are computed from what was written: the staged rows' (source id, event) columns
   are read back by a ``mapInArrow`` that reduces them per source id and sends them (Python
   sees two int64 columns, no payload, no shuffle);
3. an attempt that ends without completing (failed, timed out, dead-lettered) is reported by
   the FT layer (``take_ended``); its staged rows are left out;
4. once every record upstream is completed or dead-lettered, the barrier computes its output
   with Spark's own operator over the staged rows of completed attempts only — every record
   counted once, a replayed record meeting the rows that went through before it. The output
   rows are the source records of the next *phase*: persisted, tracked and replayed like any
   source's. A native sink publishes its staged rows the same way when the run is over.

The staged rows cost their Parquet size on disk per round (payload + two 8-byte ids + a flag)
until the barrier has computed its output.

>>> AggregateSpec(("word",), ()).describe()
'groupBy(word).agg()'
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa

from .lineage import EVT, KEEP, SRC, staged_event


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class AggregateSpec:
    """``groupBy(*keys).agg(*exprs)`` over the staged rows of completed attempts."""

    keys: tuple[str, ...]
    exprs: tuple[Any, ...]

    def describe(self) -> str:
        return f"groupBy({', '.join(self.keys)}).agg({', '.join(map(str, self.exprs))})"

    def compute(self, inputs: Sequence[Any]) -> Any:
        return inputs[0].groupBy(*self.keys).agg(*self.exprs)


@dataclass(frozen=True)
class JoinSpec:
    """``left.join(right, on, how)`` of two tracked DataFrames over their staged rows."""

    on: tuple[str, ...]
    how: str

    def describe(self) -> str:
        return f"join({list(self.on)}, {self.how!r})"

    def compute(self, inputs: Sequence[Any]) -> Any:
        return inputs[0].join(inputs[1], on=list(self.on), how=self.how)


@dataclass
class Staging:
    """The staged rows of one input of a barrier, or of a native sink, over a run's rounds."""

    root: str
    schema: Any  # payload StructType
    paths: list[str] = field(default_factory=list)

    @property
    def payload(self) -> list[str]:
        return list(self.schema.fieldNames())

    def write(self, df: Any, tag: str) -> str:
        """Stage ``df`` (payload + lineage) for round ``tag``; returns the directory."""
        path = os.path.join(self.root, tag)
        df.select(*self.payload, SRC, staged_event(), KEEP).write.mode("overwrite").parquet(path)
        self.paths.append(path)
        return path

    def rows(self, spark: Any, ended: Any) -> Any:
        """The staged payload rows of the attempts not in ``ended`` (a DataFrame of ``_ft_src``
        or None), ghosts left out."""
        if not self.paths:
            return spark.createDataFrame([], self.schema)
        df = spark.read.parquet(*self.paths).where(_f().col(KEEP))
        if ended is not None:
            df = df.join(ended, SRC, "left_anti")
        return df.select(*self.payload)

    def remove(self) -> None:
        """Delete the staged rows (local or ``file:`` paths; elsewhere they are left)."""
        root = self.root[len("file:") :] if self.root.startswith("file:") else self.root
        if "://" not in root and os.path.isdir(root):
            shutil.rmtree(root, ignore_errors=True)
        self.paths.clear()


@dataclass(frozen=True)
class EventSender:
    """``mapInArrow`` function over staged (source id, event) rows: reduces them per source id
    and sends them to the acker, in calls of up to ``chunk`` rows (the events of one source id
    may be split between calls and tasks: XOR is associative). Yields one count per task."""

    location: str
    token: str | None = None
    tls_root_certs: bytes | None = None
    job: str | None = None  # the pipeline run's namespace on the acker
    chunk: int = 1 << 20

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .lineage import settle
        from .stages import _client, u64

        client = _client(self.location, self.token, self.tls_root_certs, self.job)
        sent, buffered = 0, 0
        src: list[np.ndarray] = []
        val: list[np.ndarray] = []

        def flush() -> int:
            if not buffered:
                return 0
            s, v = np.concatenate(src), np.concatenate(val)
            ev_src, ev_val = settle(s, s, v, np.zeros(len(s), dtype=bool), ack_kept=False)
            if len(ev_src):
                client.xor(ev_src, ev_val)
            return len(ev_src)

        for batch in batches:
            if batch.num_rows:
                src.append(u64(batch.column(0)))
                val.append(u64(batch.column(1)))
                buffered += batch.num_rows
            if buffered >= self.chunk:
                sent += flush()
                src, val, buffered = [], [], 0
        sent += flush()
        yield pa.record_batch([pa.array([sent], pa.int64())], names=["n"])


def send_staged_events(
    spark: Any,
    paths: Sequence[str],
    location: str,
    token: str | None,
    tls_root_certs: bytes | None = None,
    job: str | None = None,
) -> int:
    """Send the events of the rows staged at ``paths`` (read back from what was durably
    written: an ack never precedes its write). Python sees two int64 columns; no shuffle.
    Returns the number of (reduced) events sent."""
    if not paths:
        return 0
    f = _f()
    parts = [spark.read.parquet(p).select(SRC, EVT) for p in paths]
    staged = reduce(lambda a, b: a.unionByName(b), parts).where(f.col(EVT) != 0)
    sender = EventSender(location, token, tls_root_certs, job=job)
    sent = staged.mapInArrow(sender, "n long").agg(f.sum("n")).collect()
    return int(sent[0][0] or 0)


def ids_frame(spark: Any, ids: np.ndarray) -> Any:
    """A one-column DataFrame (``_ft_src`` bigint) of uint64 ids, or None when there are none."""
    if not len(ids):
        return None
    values = np.unique(np.ascontiguousarray(ids, dtype=np.uint64)).view(np.int64)
    return spark.createDataFrame(pa.table({SRC: pa.array(values, pa.int64())}))


__all__ = ["AggregateSpec", "EventSender", "JoinSpec", "Staging", "ids_frame", "send_staged_events"]
