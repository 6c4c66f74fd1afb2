"""The sink of a tracked round, run in the executors: :class:`SinkRunner` writes a task's rows
into a Python sink in chunks, acks each chunk once it is durable, and reports what it wrote.

>>> SUMMARY_SCHEMA
'sink string, partition int, rows long, duplicates long'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import LineageError
from .ids import u64
from .lineage import EV, KEEP, REC, SRC, settle
from .stages import LINEAGE_COLUMNS, StageSchemaError, _count, acker_of

__all__ = ["SUMMARY_SCHEMA", "SinkRunner"]


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
    # an accumulator of the attempt ids whose rows were written (a cascade retracts them all
    # should the run be voided: xorack.spark.cascade), or None
    written: Any = None

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
        if self.written is not None:
            self.written.add(np.unique(src[keep]))
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
