"""A tracked stage on ``mapInArrow``: the user function gets and returns ``pyarrow.RecordBatch``es,
the lineage columns stay Arrow/numpy (no pandas conversion anywhere on the way).

:class:`ArrowStageRunner` follows :class:`~xorack.spark.stages.StageRunner` step for step:
settle the events native operators left pending (:func:`settle_batch`), call the function
(bisecting on an exception, failing exactly the rows a ``FailRecord(rows=...)`` names), map each
output row to its parent through ``_ft_rec`` (or through ``_ft_row``, its input row's position,
for a batch built anew: :func:`rows_to_records`), anchor the outputs and send one combined event
per input row before yielding.

>>> import pyarrow as pa
>>> b = pa.record_batch({"x": [1, 2, 3]})
>>> ARROW_ROWS.take(b, np.array([0, 2])).column("x").to_pylist()
[1, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import FailRecord, LineageError
from .lineage import EV, KEEP, REC, SRC, settle
from .optimistic import keep_rows
from .stages import (
    GENERATOR_OUTPUT,
    LINEAGE_COLUMNS,
    Rows,
    StageSchemaError,
    _count,
    acker_of,
    anchor_outputs,
    born_ids,
    call_bisecting,
    deferred_events,
    handed_output,
    i64,
    parents_of,
    u64,
    without_failed,
)

ArrowFunction = Callable[[pa.RecordBatch], "pa.RecordBatch | Iterable[pa.RecordBatch]"]

#: An output column an Arrow stage's function may return instead of ``_ft_rec``: for each output
#: row, the position of its input row in the batch the function was called on (what
#: ``pyarrow.compute.list_parent_indices`` or the indices given to ``take`` are).
ROW = "_ft_row"


def _as_batches(result: Any, stage: str) -> list[pa.RecordBatch]:
    """The function's result as a list of record batches (a Table counts as its batches)."""

    def one(x: Any) -> list[pa.RecordBatch]:
        if isinstance(x, pa.RecordBatch):
            return [x]
        if isinstance(x, pa.Table):
            return x.to_batches()
        raise StageSchemaError(
            f"stage {stage!r}: the function must return pyarrow RecordBatches (or an iterable "
            f"of them), got {type(x).__name__}"
        )

    if result is None:
        return []
    if isinstance(result, (pa.RecordBatch, pa.Table)):
        return one(result)
    if isinstance(result, (list, tuple, Iterator)):  # not any iterable: a DataFrame is one
        return [b for x in result for b in one(x)]
    return one(result)


def _slice(batch: pa.RecordBatch, lo: int, hi: int) -> pa.RecordBatch:
    return batch.slice(lo, hi - lo)


def _take(batch: pa.RecordBatch, pos: np.ndarray) -> pa.RecordBatch:
    return batch.take(pa.array(pos, pa.int64()))


def _length(batch: pa.RecordBatch) -> int:
    return batch.num_rows


ARROW_ROWS = Rows(_length, _slice, _take, _as_batches)


def rows_to_records(stage: str, out: pa.RecordBatch, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``out`` with its ``_ft_row`` column (positions in ``batch``) replaced by the ``_ft_rec``
    of those rows of ``batch``; ``out`` as it is when it carries ``_ft_rec`` or no ``_ft_row``.

    >>> b = pa.record_batch({"line": ["a b", "c"], "_ft_rec": [70, 90]})
    >>> o = pa.record_batch({"word": ["a", "b", "c"], "_ft_row": [0, 0, 1]})
    >>> rows_to_records("split", o, b).column("_ft_rec").to_pylist()
    [70, 70, 90]
    """
    names = out.schema.names
    if REC in names or ROW not in names:
        return out
    rows = out.column(ROW)
    n = batch.num_rows
    if not pa.types.is_integer(rows.type):
        why = f"has type {rows.type}"
    elif rows.null_count:
        why = f"has {rows.null_count} null(s)"
    else:
        pos = rows.to_numpy().astype(np.int64, copy=False)
        outside = int(((pos < 0) | (pos >= n)).sum())
        if not outside:
            rec = batch.column(REC).take(pa.array(pos, pa.int64()))
            return out.set_column(names.index(ROW), REC, rec)
        why = f"has {outside} position(s) outside [0, {n})"
    raise LineageError(
        f"stage {stage!r}: the function's output column {ROW!r} {why}; it must hold, for each "
        f"output row, the position (0-based) of its input row in the batch the function was "
        "called on (e.g. pyarrow.compute.list_parent_indices, or the indices given to take)"
    )


def settle_batch(batch: pa.RecordBatch, client: Any, ack_kept: bool) -> pa.RecordBatch:
    """:func:`~xorack.spark.stages.settle_frame` on a record batch: send the events native
    operators left pending (``_ft_ev``; with ``ack_kept`` also the ack of every live row), drop
    the ghost rows (``_ft_keep`` false) and the two pending columns."""
    names = batch.schema.names
    if EV not in names:
        return batch
    keep = batch.column(KEEP).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    src, rec, ev = (u64(batch.column(c)) for c in (SRC, REC, EV))
    ev_src, ev_val = settle(src, rec, ev, keep, ack_kept)
    if len(ev_src):
        client.xor(ev_src, ev_val)
    out = batch.select([c for c in names if c not in (EV, KEEP)])
    return out if keep.all() else out.filter(pa.array(keep))


def declared_arrow_schema(struct: Any, large_types: bool = False) -> pa.Schema:
    """The Arrow schema ``mapInArrow`` exchanges for a Spark ``StructType`` (timestamps in UTC,
    as Spark sends them; ``large_types``: Spark's ``arrow.useLargeVarTypes``).

    >>> from pyspark.sql.types import LongType, StructField, StructType, TimestampType
    >>> declared_arrow_schema(StructType([StructField("t", TimestampType())])).field("t").type
    TimestampType(timestamp[us, tz=UTC])
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    try:  # PySpark >= 4.1 takes the time zone
        return to_arrow_schema(struct, prefers_large_types=large_types, timezone="UTC")
    except TypeError:  # PySpark 4.0: UTC timestamps by default
        return to_arrow_schema(struct, prefers_large_types=large_types)


@dataclass(frozen=True)
class ArrowStageRunner:
    """``mapInArrow`` function of a tracked Arrow stage (:meth:`Tracked.map_in_arrow`).

    ``schema`` is the declared payload as an Arrow schema: the output carries its columns (cast
    to the declared types when the function returned another type that converts safely),
    followed by ``_ft_src``, ``_ft_rec``. With ``ft=False`` the runner only calls the function
    and selects the declared columns.

    >>> import pyarrow as pa
    >>> r = ArrowStageRunner("twice", lambda b: b, pa.schema([("x", pa.int64())]), ft=False)
    >>> [b.column("x").to_pylist() for b in r(iter([pa.record_batch({"x": [1, 2]})]))]
    [[1, 2]]
    """

    name: str
    fn: ArrowFunction
    schema: pa.Schema
    location: str | None = None
    token: str | None = None
    ft: bool = True
    deterministic: bool = True
    tally: Any = None  # the round's failure accumulator (the runaway guard), or None
    tls_root_certs: bytes | None = None  # PEM the executors trust for a grpc+tls:// acker
    job: str | None = None  # the pipeline run's namespace on the acker
    round_xor: Any = None  # an optimistic round's accumulator (see StageRunner)
    born: Any = None  # an optimistic round's untagged source rows (see StageRunner)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if not self.ft:
            for batch in batches:
                for out in _as_batches(self.fn(batch), self.name):
                    if out.num_rows:
                        yield self._select(out, lineage=False)
            return
        acker = acker_of(self.round_xor, self.location, self.token, self.tls_root_certs, self.job)
        with deferred_events(acker) as client:  # flushed before the task's end
            for batch in batches:
                if getattr(client, "failed", False):
                    continue  # an optimistic round that failed a row is lost: skip its work
                if self.born is not None:
                    given = u64(batch.column(SRC)) if SRC in batch.schema.names else None
                    src, rec = born_ids(batch.num_rows, self.born, client, given)
                    if given is None:
                        batch = batch.append_column(SRC, pa.array(i64(src), pa.int64()))
                    batch = batch.append_column(REC, pa.array(i64(rec), pa.int64()))
                yield from self.process(batch, client)
            finish = getattr(client, "finish", None)  # a keeping round's kept rows
            if finish is not None:
                finish()

    def _select(self, out: pa.RecordBatch, lineage: bool) -> pa.RecordBatch:
        """The declared columns of one output batch, in order and of the declared types (plus
        ``_ft_rec`` when ``lineage``)."""
        names = out.schema.names
        missing = [f.name for f in self.schema if f.name not in names]
        if missing:
            raise StageSchemaError(
                f"stage {self.name!r}: the function's output lacks declared column(s) {missing} "
                f"(it returned {names})"
            )
        arrays = []
        for f in self.schema:
            col = out.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise StageSchemaError(
                        f"stage {self.name!r}: output column {f.name!r} has type {col.type}, "
                        f"declared {f.type}, and does not convert ({exc}); return the declared "
                        "type or change the declared schema"
                    ) from None
            arrays.append(col)
        fields = list(self.schema)
        if lineage:
            rec = out.column(REC)
            if not (pa.types.is_int64(rec.type) or pa.types.is_uint64(rec.type)):
                raise LineageError(
                    f"stage {self.name!r}: the function's output column {REC!r} has type "
                    f"{rec.type}; it must be the int64 {REC} of the input row each output row "
                    "comes from (take or filter the input column, do not rebuild it)"
                )
            arrays.append(rec.view(pa.int64()) if pa.types.is_uint64(rec.type) else rec)
            fields.append(pa.field(REC, pa.int64()))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def process(self, batch: pa.RecordBatch, client: Any) -> list[pa.RecordBatch]:
        """Run the function on one input batch; send the failures and events; return the
        output batches (none when every row was dropped or failed)."""
        for c in LINEAGE_COLUMNS:
            if c not in batch.schema.names:
                raise LineageError(
                    f"stage {self.name!r}: its input has no lineage column {c!r} (columns "
                    f"{batch.schema.names}); a tracked stage must read a tracked DataFrame"
                )
        batch = settle_batch(batch, client, ack_kept=False)
        if batch.num_rows == 0:
            return []
        in_src = u64(batch.column(SRC))
        in_rec = u64(batch.column(REC))

        def traced(part: pa.RecordBatch) -> list[pa.RecordBatch]:
            # _ft_row is a position in the part this call got (bisection calls parts)
            try:
                result = self.fn(part)
            except FailRecord as exc:  # its output's _ft_row too
                if exc.output is not None:
                    given = _as_batches(handed_output(exc.output, self.name), self.name)
                    exc.output = [rows_to_records(self.name, o, part) for o in given]
                raise
            try:
                outs = _as_batches(result, self.name)
            except FailRecord as exc:  # raised by a generator, after what it yielded
                if exc.output is not None:
                    raise StageSchemaError(GENERATOR_OUTPUT.format(stage=self.name)) from exc
                raise
            return [rows_to_records(self.name, o, part) for o in outs]

        # an optimistic round bisects too (see StageRunner.process)
        outs, failures = call_bisecting(traced, batch, self.name, True, ARROW_ROWS)
        raised = failures  # a FailRecord's output may hold their rows: dropped below
        if failures and self.born is not None and keep_rows(client, self.name, batch, failures):
            failures = []  # kept for a replay round (see StageRunner.process)
        _count(self.tally, f"stage {self.name!r}", in_src, failures)
        outs = [o for o in outs if o.num_rows]
        for o in outs:
            if REC not in o.schema.names:
                raise LineageError(
                    f"stage {self.name!r}: the function's output has no {REC!r} column: output "
                    f"rows must keep the {REC} of the input row they come from (take or filter "
                    f"the input batch's columns keep it), or a batch built anew must say where "
                    f"each row comes from in a {ROW!r} column (its input row's position)"
                )
        if not outs:  # every input acked as dropped (or failed)
            none = np.empty(0, np.int64)
            anchor_outputs(self.name, in_src, in_rec, none, failures, client, self.deterministic)
            return []
        selected = [self._select(o, lineage=True) for o in outs]
        out = pa.Table.from_batches(selected).combine_chunks()
        try:
            parent = parents_of(in_rec, u64(out.column(REC)), fresh=self.born is not None)
        except (TypeError, ValueError) as exc:  # LineageError included; TypeError: bad dtype
            raise LineageError(f"stage {self.name!r}: {exc}") from exc
        keep = without_failed(parent, raised)
        if keep is not None:
            out, parent = out.take(pa.array(keep, pa.int64())), parent[keep]
        kept, out_src, out_rec = anchor_outputs(
            self.name, in_src, in_rec, parent, failures, client, self.deterministic
        )
        if kept is not None:
            out = out.take(pa.array(kept, pa.int64()))
        if out.num_rows == 0:
            return []
        k = len(self.schema)
        if self.round_xor is None:
            arrays = [*out.columns[:k], pa.array(i64(out_src)), pa.array(i64(out_rec))]
            names = [*self.schema.names, SRC, REC]
        else:  # an optimistic round's rows carry no attempt id out (see StageRunner)
            arrays, names = [*out.columns[:k], pa.array(i64(out_rec))], [*self.schema.names, REC]
        return pa.Table.from_arrays(arrays, names=names).combine_chunks().to_batches()


__all__ = [
    "ARROW_ROWS",
    "ROW",
    "ArrowFunction",
    "ArrowStageRunner",
    "declared_arrow_schema",
    "rows_to_records",
    "settle_batch",
]
