"""The code that runs inside Spark tasks: tracked stages and sink acking (source tagging is
in :mod:`xorack.spark.tagging`, ids in :mod:`xorack.spark.ids`).

Each class here is a picklable callable handed to ``mapInArrow`` / ``mapInPandas``. They talk to
the acker service through :class:`xorack.service.AckerClient` (one cached connection per Python
worker process) and follow the order of "A record's life" (DESIGN.md):

* :class:`StageRunner` calls the user function on a pandas batch, bisects it when the function
  raises so that only failing rows fail (or fails the rows a ``FailRecord(rows=...)`` names),
  maps each output row to its parent (by the pandas index, whose labels are the input rows'
  record ids, or by the ``_ft_rec`` column the function kept: :func:`output_parents`),
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
from numpy.typing import ArrayLike

from .._checks import count_distinct
from ..errors import FailRecord, LineageError, XorackError
from .ids import client_of, i64, name_salt, ordinals, parents_of, u64, with_lineage
from .lineage import EV, KEEP, REC, SRC, settle
from .optimistic import keep_rows

LINEAGE_COLUMNS = (SRC, REC)  # what a stage's function sees (the pending columns are settled)
PART = "_ft_part"  # spark_partition_id() of the source's own partitioning, read by the tagger
ROUND = "_ft_round"  # the round (micro-batch) a source tagger's rows are read in, if given
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
    return client_of(location, token, tls_root_certs, job)


class DeferredEvents:
    """A task's view of its acker client: ``xor`` defers the events (``xor_deferred``: each
    acker shard's events of the task go as requests of 64 K, not one request per shard per
    Arrow batch); every other call is the client's own, which sends the deferred events first.
    Made by :func:`deferred_events`, which flushes them before the task ends."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def xor(self, src_ids: Any, values: Any, hold: bool = False, chunk_bits: int = 0) -> None:
        """Defer these events (the completions are not needed by a task)."""
        self.client.xor_deferred(src_ids, values, hold=hold, chunk_bits=chunk_bits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@contextlib.contextmanager
def deferred_events(client: Any) -> Iterator[Any]:
    """Around a task's loop over its batches: ``client`` with its events deferred
    (:class:`DeferredEvents`) and flushed when the loop ends, so every event of the task is
    applied before the task's last output reaches Spark (and when it fails, the events of
    the batches before are sent as they were before deferring; a flush error then does not
    hide the task's own). An optimistic round's accumulator (no ``xor_deferred``) is given
    as it is."""
    if not hasattr(client, "xor_deferred"):
        yield client
        return
    try:
        yield DeferredEvents(client)
    except BaseException:
        with contextlib.suppress(Exception):
            client.flush()
        raise
    client.flush()


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
    called once more on the remaining rows (no bisection), unless the exception carries the
    function's ``output`` for them (then that output is taken, and may still hold rows of the
    failing ones: the caller drops them, see :func:`without_failed`).

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
    >>> def h(df):  # one call: the output of the other rows handed over with the failure
    ...     bad = (df.x % 2 == 0).to_numpy()
    ...     raise FailRecord("even", rows=bad, output=df[~bad])
    >>> outs, failed = call_bisecting(h, pd.DataFrame({"x": [1, 2, 3, 4]}), "demo")
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
                result = fn(part)
                try:
                    outs.extend(rows.outputs(result, stage))
                except FailRecord as exc:  # raised by a generator, after what it yielded
                    if exc.output is not None:
                        raise StageSchemaError(GENERATOR_OUTPUT.format(stage=stage)) from exc
                    raise
                return raised
            except (StageSchemaError, LineageError):
                raise
            except Exception as exc:  # any user exception fails its rows
                absolute = np.arange(lo, hi, dtype=np.int64) if pos is None else pos
                named = getattr(exc, "rows", None) if isinstance(exc, FailRecord) else None
                given = exc.output if isinstance(exc, FailRecord) else None
                if given is not None and named is None:
                    raise StageSchemaError(
                        f"stage {stage!r}: FailRecord(output=...) without rows=...: name the "
                        "failing rows the output leaves out (a mask or positions)"
                    ) from exc
                if named is not None and bisect:
                    bad = _failing_positions(named, size, stage)
                    failed.append((absolute[bad], reason_of(exc)))
                    if given is not None:  # the function's output for the other rows
                        outs.extend(rows.outputs(handed_output(given, stage), stage))
                        return True
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


GENERATOR_OUTPUT = (
    "stage {stage!r}: FailRecord(output=...) raised by a generator: the batches it yielded "
    "before would be lost; return the output (a list of batches) instead of yielding it"
)


def handed_output(given: Any, stage: str) -> Any:
    """A ``FailRecord``'s ``output``, checked: a frame or batch, or a list or tuple of them (not
    an iterator, whose errors would pass for the rows' own)."""
    if isinstance(given, Iterator):
        raise StageSchemaError(
            f"stage {stage!r}: FailRecord(output=...) got an iterator "
            f"({type(given).__name__}); pass a frame or batch, or a list of them"
        )
    return given


def without_failed(
    parent: np.ndarray, failures: Sequence[tuple[np.ndarray, str]]
) -> np.ndarray | None:
    """The positions of the outputs to keep when some come from failing input rows (a
    ``FailRecord(output=...)`` may hold them), else None (all kept). ``parent[i]`` is the input
    position of output ``i``; ``failures`` as :func:`call_bisecting` returns them.

    >>> without_failed(np.array([0, 1, 1, 2]), [(np.array([1]), "bad")]).tolist()
    [0, 3]
    >>> without_failed(np.array([0, 2]), [(np.array([1]), "bad")]) is None
    True
    """
    if not failures or not len(parent):
        return None
    keep = ~np.isin(parent, np.concatenate([pos for pos, _ in failures]))
    return None if keep.all() else np.flatnonzero(keep)


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


def born_ids(
    n: int, born: tuple[Any, int], client: Any, given: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Lineage for ``n`` source rows that reach an optimistic round's Python stage untagged:
    random record ids (their XOR goes into the round's accumulator as their births, which the
    stage's events then cancel), the round's attempt id (or the ids ``given`` with the rows:
    a replay round's, :mod:`xorack.spark.kept`), and the count of the source's rows
    (``born``: (accumulator, attempt id))."""
    from .. import acker

    count, src = born
    rec = np.asarray(acker.new_ids(n), dtype=np.uint64) if n else np.empty(0, np.uint64)
    if n:
        count.add(n)
        client.xor(None, rec)
        saw = getattr(client, "saw", None)  # a keeping round's share is of these rows
        if saw is not None:
            saw(n)
    if given is not None:
        return np.asarray(given, dtype=np.uint64), rec
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
        share = getattr(client, "failure_share", None)  # an optimistic round's estimate
        if share is not None:  # (its rows share one source id: count rows)
            share(len(np.unique(np.concatenate([pos for pos, _ in failures]))), len(in_src))
        keep_in = ~np.isin(in_src, failed_src)
        keep_out = keep_in[parent] if len(parent) else np.ones(0, dtype=bool)
        # re-index parents into the kept inputs
        new_pos = np.cumsum(keep_in) - 1
        kept = np.flatnonzero(keep_out)
        parent = new_pos[parent[keep_out]]
        in_src, in_rec = in_src[keep_in], in_rec[keep_in]

    out_rec = None
    if deterministic and len(parent):
        salt = name_salt(f"stage:{stage}")
        out_rec = acker.derive_ids(in_rec[parent], in_rec[parent], ordinals(parent), salt)
    out_src, out_rec, ev_src, ev_xor = acker.anchor(in_src, in_rec, parent, out_rec)
    if len(ev_src):
        client.xor(ev_src, ev_xor)
    return kept, np.asarray(out_src, dtype=np.uint64), np.asarray(out_rec, dtype=np.uint64)


@dataclass(frozen=True)
class StageRunner:
    """``mapInPandas`` function of a tracked stage.

    ``columns`` are the payload columns the stage declares (its output schema without the
    lineage columns); the output carries them followed by ``_ft_src``, ``_ft_rec``. The
    function's input carries the lineage columns after the payload and is labelled by its
    rows' record ids; its output need not carry them (see :func:`output_parents`). With
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
    # there instead of to the acker service (the task skips its batches after a failure)
    round_xor: Any = None
    # an optimistic round whose source rows come in untagged: (the accumulator counting them,
    # their attempt id); the runner draws their ids (see born_ids)
    born: Any = None
    # a stream's watermark column: each output row must keep its input row's value (the FT
    # layer holds the watermark back by the source records' own event times)
    event_time: str | None = None

    def __call__(self, pdfs: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        if not self.ft:
            for pdf in pdfs:
                for out in _as_frames(self.fn(pdf), self.name):
                    yield self._select(out, lineage=False)
            return
        acker = acker_of(self.round_xor, self.location, self.token, self.tls_root_certs, self.job)
        with deferred_events(acker) as client:
            for pdf in pdfs:
                if getattr(client, "failed", False):
                    continue  # an optimistic round that failed a row is lost: skip its work
                if self.born is not None:
                    given = u64(pdf[SRC]) if SRC in pdf.columns else None
                    src, rec = born_ids(len(pdf), self.born, client, given)
                    pdf[SRC], pdf[REC] = i64(src), i64(rec)
                done = self.process(pdf, client)
                if done is not None:
                    yield done
            finish = getattr(client, "finish", None)  # a keeping round's kept rows
            if finish is not None:
                finish()

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
        for c in LINEAGE_COLUMNS:
            if c not in pdf.columns:
                raise LineageError(
                    f"stage {self.name!r}: its input has no lineage column {c!r} (columns "
                    f"{list(pdf.columns)}); a tracked stage must read a tracked DataFrame"
                )
        pdf = settle_frame(pdf, client, ack_kept=False)
        if len(pdf) == 0:
            return None
        in_src = u64(pdf[SRC])
        in_rec = u64(pdf[REC])
        # the rows' labels are their record ids (never 0, never 0..n-1): an output that keeps
        # the index is matched to its inputs by them; a renumbered one cannot pass for it
        pdf = pdf.copy(deep=False)  # a new frame over the same columns
        pdf.index = pd.Index(i64(in_rec), copy=False)
        if self.single_record_groups and count_distinct(in_src) > 1:
            raise StageSchemaError(
                f"apply_in_pandas {self.name!r}: a group holds rows of "
                f"{len(np.unique(in_src))} source records; a grouped function over several "
                "records is not exact under record-level replay (a replayed record would be "
                "grouped without the others, e.g. a partial average). Use "
                "groupBy(...).agg(...) for aggregates (exactly-once), or group by a key that "
                "stays within one source record"
            )
        # an optimistic round bisects too: it is lost anyway, but the rows that failed tell
        # the driver how often records fail (the chunks of its first tracked round)
        frames, failures = call_bisecting(self.fn, pdf, self.name, self.bisect)
        frames = [f for f in frames if len(f.columns)]
        fresh = self.born is not None  # its ids drawn for this batch (see parents_of)
        parents = [output_parents(self.name, f, in_rec, fresh) for f in frames]
        if len(frames) > 1:
            out = pd.concat(frames, ignore_index=True)
            parent = np.concatenate(parents)
        elif frames:  # one frame (the usual case) is used as it is: rows are taken by position
            out, parent = frames[0], parents[0]
        else:
            out, parent = pdf.iloc[0:0], np.empty(0, np.int64)
        keep = without_failed(parent, failures)  # a FailRecord's output may hold them
        if keep is not None:
            out, parent = out.iloc[keep], parent[keep]
        if failures and self.born is not None and keep_rows(client, self.name, pdf, failures):
            failures = []  # kept for a replay round: dropped here, acked as dropped
        _count(self.tally, f"stage {self.name!r}", in_src, failures)
        if len(out):
            self._check_columns(out)

        if self.event_time is not None:
            check_event_time(self.name, self.event_time, pdf, out, parent)
        kept, out_src, out_rec = anchor_outputs(
            self.name, in_src, in_rec, parent, failures, client, self.deterministic
        )
        if kept is not None:
            out = out.iloc[kept]
        if not len(out):
            return None
        # an optimistic round's rows carry no attempt id out (the pipeline adds a constant)
        return with_lineage(out, self.columns, out_src if self.round_xor is None else None, out_rec)


RENUMBERED = (
    "reset_index, ignore_index=True, a merge, a groupby and a frame built from arrays or lists "
    "renumber the rows"
)


def output_parents(
    stage: str, out: pd.DataFrame, in_rec: np.ndarray, fresh: bool = False
) -> np.ndarray:
    """The input position (int64) of each row of one output frame of a pandas stage.

    An output that carries ``_ft_rec`` is matched by it. Otherwise by its index: the input
    frame's labels are its rows' record ids (random, never 0, so never ``0 .. n-1``), which
    pandas keeps through a filter, an ``explode``, ``assign`` and a frame built from the input's
    Series; a renumbered index (``0, 1, ...``) or labels of its own are refused, never taken for
    other rows.

    >>> rec = np.array([7, 9, 11], np.uint64)
    >>> out = pd.DataFrame({"w": ["a", "b", "c"]}, index=[11, 7, 7])
    >>> output_parents("demo", out, rec).tolist()
    [2, 0, 0]
    >>> try:
    ...     output_parents("demo", out.reset_index(drop=True), rec)
    ... except LineageError as e:
    ...     print(str(e)[:73], "...", "its index was renumbered (0, 1, 2, ...)" in str(e))
    stage 'demo': the function's output has no '_ft_rec' column and its index ... True
    """

    if not len(out):  # nothing to match (an empty frame's index may have any dtype)
        return np.empty(0, np.int64)
    if REC in out.columns:
        try:
            return parents_of(in_rec, u64(out[REC]), fresh)
        except (TypeError, ValueError) as exc:  # LineageError included; TypeError: bad dtype
            raise LineageError(f"stage {stage!r}: {exc}") from exc
    index = out.index
    labels = np.asarray(index) if index.dtype.kind in "iu" and index.nlevels == 1 else None
    parent = None
    if labels is not None:
        try:
            parent = parents_of(in_rec, u64(labels), fresh)
        except LineageError:
            pass  # described below
        except ValueError as exc:  # the input's record ids repeat (a bad upstream)
            raise LineageError(f"stage {stage!r}: {exc}") from exc
    if parent is not None:
        return parent
    if labels is None:
        what = (
            "a MultiIndex" if index.nlevels > 1 else f"an index of dtype {index.dtype}"
        ) + ", not the input frame's labels"
    elif len(labels) and labels[0] == 0 and (np.diff(labels) == 1).all():
        what = "its index was renumbered (0, 1, 2, ...)"
    else:
        unknown = int((~np.isin(u64(labels), in_rec)).sum())
        what = f"{unknown} of its {len(labels)} index labels are not labels of the input frame"
    raise LineageError(
        f"stage {stage!r}: the function's output has no {REC!r} column and {what}, so its rows "
        f"cannot be matched to the input rows they come from ({RENUMBERED}). Keep the input "
        "frame's index (filter, explode without ignore_index, assign, and new frames built from "
        "the input's Series keep it; pass index=pdf.index to a frame built from arrays), or "
        f"keep the input's {REC!r} column on every output row"
    )


def check_event_time(
    name: str, column: str, pdf: pd.DataFrame, out: pd.DataFrame, parent: np.ndarray
) -> None:
    """A stage before a windowed aggregation must hand each output row its input row's event
    time: the watermark is held back by the source records' own times, so a changed time could
    put a pending record's rows into a window that closes without them."""
    if column not in pdf.columns or column not in out.columns or not len(out):
        return
    before = pd.Series(pdf[column].to_numpy()[parent])
    after = pd.Series(out[column].to_numpy())
    same = (before == after) | (before.isna() & after.isna())
    if not bool(same.all()):
        raise StageSchemaError(
            f"stage {name!r} changed the event-time column {column!r} of {int((~same).sum())} "
            "row(s): a windowed aggregation after a watermark needs every row's own event time "
            "(its source record's); compute a new time under another name"
        )


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
        out = r.process(pdf, client_of(r.location, r.token, r.tls_root_certs, r.job))
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


def check_columns(name: str, have: Sequence[str], need: Sequence[str], what: str) -> None:
    """Raise a :class:`StageSchemaError` naming ``name`` when a column of ``need`` is missing."""
    missing = [c for c in need if c not in have]
    if missing:
        raise StageSchemaError(f"{what} {name!r}: missing column(s) {missing} (has {list(have)})")
