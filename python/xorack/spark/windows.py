"""Event time in a tracked stream: the watermark, time and session windows, and when a window
may close.

``withWatermark(column, delay)`` and ``groupBy(F.window(column, ...), *keys).agg(...)`` (or
``F.session_window``) are Spark's own declarations; what xorack adds is *when* a window is
written. Plain Spark closes a window once its end is at or below the watermark, the largest
event time seen minus the delay. Under record-level replay that is not enough: a record that
failed, or that is waiting for its timeout, will come back, and its rows must still find their
window open. So the watermark xorack acts on is **held back by the event time of every record
still pending** in the FT layer (persisted and not yet completed nor dead-lettered: in flight,
failed and waiting for replay, timed out):

    watermark = max(previous, min(max event time seen - delay, min event time pending))

Each source record's event time (its watermark column, in microseconds) is persisted with it
as a record field (``persist(event_time=...)``); ``stats()["min_event_time"]`` is the minimum
over the pending records. A pending record's rows all have event times at or above the
watermark, so they cannot fall into a window that closes; a window whose end is at or below it
holds rows of completed records only — the rows of attempts that ended without completing are
left out, a dead-lettered record's included — and is written once, final (append mode).

As in plain Spark, which computes a watermark at the end of each micro-batch and closes windows
by it in the next one, a window closes one micro-batch after the watermark passed its end (a
replay round counts as Spark's micro-batch without data: it closes them by the latest). A row is
*late*, as in plain Spark, when its window ends at or below the watermark the windows last
closed by (a session window: the row's own ``[ts, ts + gap)``): each staged row keeps that
watermark (``_ft_wm``) and the late ones are left out. A replayed record is never late: the
watermark waited for it. Without failures the windows and the late rows are plain Spark's.

>>> delay_micros("10 seconds"), delay_micros("1 minute 30 seconds"), delay_micros("2 hours")
(10000000, 90000000, 7200000000)
>>> window_of_repr("Column<'window(ts, '10 seconds', '5 seconds', '0 second')'>")
('window', 'ts')
>>> window_of_repr("Column<'session_window(`event time`, '5 seconds') AS s'>")
('session_window', 'event time')
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .barrier import Staging, remove_local
from .lineage import KEEP, SRC, kept_in_jvm, q, select_kept
from .ops import is_column

#: A staged directory's event-time bounds (JSON: [min, max] microseconds, or null), beside
#: its Parquet files (a name Spark's readers skip).
BOUNDS_FILE = "_ft_bounds.json"
#: The staged column of the watermark in force when a row was staged (timestamp).
WM = "_ft_wm"
#: A row's own window while late rows are left out.
WIN = "_ft_w"
#: The deterministic record id of an emitted window row (absorbed when written twice).
ROW_ID = "_ft_row"
#: A staged row's id (a stream-stream join's side): the hash of its staging directory's name
#: and Spark's ``monotonically_increasing_id`` within that write (unique, fixed once written).
RID_TAG = "_ft_rtag"
RID_NO = "_ft_rno"

_UNIT_MICROS = {
    "microsecond": 1,
    "millisecond": 1_000,
    "second": 1_000_000,
    "minute": 60_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
    "week": 7 * 86_400_000_000,
}
_PART = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*(?=\d|-|$)")


def delay_micros(text: str) -> int:
    """The length of a delay or duration in Spark's interval syntax (``"10 seconds"``,
    ``"1 minute 30 seconds"``, ``"interval 2 hours"``), in microseconds. Months and years,
    whose length varies, are refused (Spark refuses them in a watermark too)."""
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"a delay must be a string such as '10 seconds', got {text!r}")
    s = text.strip().lower()
    if s.startswith("interval "):
        s = s[len("interval ") :]
    pos, total = 0, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or m.end() == pos:
            raise ValueError(
                f"cannot read the delay {text!r}: give it as '<number> <unit>', units "
                f"{sorted(_UNIT_MICROS)} (months and years vary in length)"
            )
        unit = m.group(2)
        if unit not in _UNIT_MICROS:
            raise ValueError(
                f"delay {text!r}: unknown unit {unit!r}; use one of {sorted(_UNIT_MICROS)} "
                "(months and years vary in length)"
            )
        total += round(float(m.group(1)) * _UNIT_MICROS[unit])
        pos = m.end()
    if total < 0:
        raise ValueError(f"delay {text!r} is negative")
    return total


@dataclass(frozen=True)
class Watermark:
    """``withWatermark(column, delay)`` of a tracked stream (one per pipeline)."""

    column: str
    delay: str
    delay_us: int
    source: str = ""  # the source it is declared on


_WINDOW_REPR = re.compile(r"^Column<'(window|session_window)\((`(?:[^`]|``)+`|[^,()]+), ")


def window_of_repr(text: str) -> tuple[str, str] | None:
    """``(kind, time column)`` of a ``F.window``/``F.session_window`` Column's repr, else None
    (the time column given by name: ``F.window("ts", ...)`` or ``F.window(F.col("ts"), ...)``)."""
    m = _WINDOW_REPR.match(text)
    if m is None:
        return None
    name = m.group(2).strip()
    if name.startswith("`"):
        name = name[1:-1].replace("``", "`")
    return m.group(1), name


def window_of(column: Any) -> tuple[str, str] | None:
    """``(kind, time column)`` when ``column`` is a time or session window, else None."""
    from pyspark.sql import Column

    if not isinstance(column, Column):
        return None
    return window_of_repr(repr(column))


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def micros_literal(us: int) -> Any:
    """A timestamp literal ``us`` microseconds after the epoch."""
    f = _f()
    return f.timestamp_micros(f.lit(int(us)))


@dataclass(frozen=True)
class WindowSpec:
    """``groupBy(*groups).agg(*exprs)`` where ``groups[at]`` is a time window (``kind``
    ``"window"``, tumbling or sliding) or a session window over the column ``time``; the other
    groups are column names. ``names``: the output's column names (plain Spark's)."""

    groups: tuple[Any, ...]
    at: int
    kind: str
    time: str
    exprs: tuple[Any, ...]
    names: tuple[str, ...] = ()
    # the emission's JVM lists, built by the first (select_kept, _grouped); a spec made
    # anew (dataclasses.replace) starts without them
    _kept: dict[Any, Any] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )

    @property
    def keys(self) -> tuple[str, ...]:
        """The grouping columns besides the window."""
        return tuple(g for i, g in enumerate(self.groups) if i != self.at)

    @property
    def window_name(self) -> str:
        return self.names[self.at]

    def describe(self) -> str:
        groups = [str(g) if i == self.at else g for i, g in enumerate(self.groups)]
        return f"groupBy({', '.join(groups)}).agg({', '.join(map(str, self.exprs))})"

    def compute(self, inputs: Sequence[Any]) -> Any:
        """Plain Spark's aggregation over ``inputs[0]`` (every window, nothing late)."""
        return inputs[0].groupBy(*self.groups).agg(*self.exprs)

    def emit(self, rows: Any, lo_us: int, hi_us: int) -> Any:
        """The windows whose end is in ``(lo_us, hi_us]``, over the staged ``rows`` (payload
        and ``_ft_wm``), late rows left out; the output's columns are plain Spark's."""
        f = _f()
        w = self.groups[self.at]
        horizon = horizon_of(self)
        # the conditions are SQL text and the column lists are kept (select_kept, _grouped):
        # built as Column trees every emission they cost ~60 py4j round trips, on a thread
        # beside the next micro-batch
        if horizon is not None:  # only rows that can fall into a window ending in (lo, hi]
            t = f"unix_micros(CAST({q(self.time)} AS TIMESTAMP))"
            rows = rows.where(f"{t} < {int(hi_us)}L AND {t} + {int(horizon)}L > {int(lo_us)}L")
        # a sliding window copies the row per window
        own = select_kept(rows, self._kept, "own", lambda: ["*", w.alias(WIN)])
        mine = f"{q(WIN)}.`end`"
        if self.kind == "window":
            # a row's own window is its group's: the windows outside (lo, hi] are left out
            # before they are aggregated (one filter, one plan analysis less)
            live = own.where(
                f"{mine} > {q(WM)} AND {mine} > timestamp_micros({int(lo_us)}L) "
                f"AND {mine} <= timestamp_micros({int(hi_us)}L)"
            )
            return self._grouped(live)
        mine_col = f.col(f"{WIN}.end")
        # sessions merge the rows that are not late
        live = own.where(mine_col > f.col(WM))
        out = live.drop(WIN).groupBy(*self.groups).agg(*self.exprs)
        # Spark's optimizer pushes a filter on the session's end below the merging of the
        # sessions (onto each row's own [ts, ts + gap)), which would cut the sessions short:
        # the sessions are materialized before they are filtered
        out = out.localCheckpoint(eager=True).toDF(*self.names)
        end = f.col(q(self.window_name)).getField("end")
        return out.where((end > micros_literal(lo_us)) & (end <= micros_literal(hi_us)))

    def _grouped(self, live: Any) -> Any:
        """``live`` aggregated per its own window (``WIN``) and the keys, under plain Spark's
        names: ``groupBy(...).agg(*exprs).toDF(*names)`` in three py4j round trips once the
        lists are kept (the expressions are the declaration's Columns)."""
        f = _f()

        def groups() -> list[Any]:
            return [
                f.col(WIN).alias(self.window_name) if i == self.at else f.col(q(g))
                for i, g in enumerate(self.groups)
            ]

        jdf = getattr(live, "_jdf", None)
        if jdf is None or not self.exprs or not all(is_column(e) for e in self.exprs):
            return live.groupBy(*groups()).agg(*self.exprs).toDF(*self.names)
        from pyspark.sql.classic.column import _to_seq
        from pyspark.sql.classic.dataframe import DataFrame

        session = live.sparkSession
        sc = session.sparkContext
        first, *rest = self.exprs
        by, rest_jc, names = kept_in_jvm(
            self._kept,
            "grouped",
            session._jvm,
            lambda: (
                live._jcols(*groups()),
                _to_seq(sc, [e._jc for e in rest]),
                _to_seq(sc, list(self.names)),
            ),
        )
        first_jc = first._jc
        return DataFrame(jdf.groupBy(by).agg(first_jc, rest_jc).toDF(names), session)

    def session_rows(self, emitted: Any) -> Any:
        """The keys and bounds of the sessions in ``emitted`` (an :meth:`emit` of session
        windows), to take their rows out of the staging: as in Spark, a session written is
        evicted, and a row that comes later starts a session of its own."""
        f = _f()
        w = f.col(q(self.window_name))
        return emitted.select(
            *[f.col(q(k)) for k in self.keys],
            w.getField("start").alias("_ft_start"),
            w.getField("end").alias("_ft_end"),
        )


@dataclass
class WindowStaging(Staging):
    """The staged rows of a windowed aggregation: each with the watermark in force when it was
    staged (``watermark_us``, set by the streaming run before each round; None in a batch
    run, which has no late rows)."""

    watermark_us: int | None = None
    time: str = ""  # the event-time column (compaction keeps the rows of open windows)
    ids: bool = False  # each row gets an id of its own (a stream-stream join's side)
    #: the schema of the staged files, once this run wrote one: they are read with it, so
    #: Spark lists them without a job reading their footers (None: inferred, as after a restart)
    files: Any = None
    #: the event times (microseconds, min and max) of the rows each directory staged, or None
    #: where it staged none that can fall into a window: an emission reads only the
    #: directories that can hold rows of the windows it writes (a directory not in here is
    #: always read; a compaction's are those of the directories it rewrote, where known). Kept
    #: in the directory too (``BOUNDS_FILE``): a restart adopts them with it
    bounds: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    #: directories an emission left unread, so far (their rows could not fall into its windows)
    pruned: int = 0
    #: directories deleted whole, so far: every window their rows fall into had closed
    dropped: int = 0

    def read(self, spark: Any, paths: Sequence[str]) -> Any:
        """The staged files at ``paths`` (all of one schema), ghosts included."""
        reader = spark.read if self.files is None else spark.read.schema(self.files)
        return reader.parquet(*paths)

    def write(self, df: Any, tag: str) -> str:
        f = _f()
        path = os.path.join(self.root, tag)
        wm = micros_literal(self.watermark_us or 0)
        cols = [*map(q, self.payload), SRC, _staged_event(), KEEP]
        out = df.selectExpr(*cols).withColumn(WM, wm)
        if self.ids:  # unique and fixed once written: the write's name, the row's number
            out = out.withColumn(RID_TAG, f.xxhash64(f.lit(tag))).withColumn(
                RID_NO, f.monotonically_increasing_id()
            )
        seen = None
        self.bounds.pop(path, None)
        if self.time and self.time in self.payload:  # the event times it stages (no job more)
            from pyspark.sql import Observation

            seen = Observation()
            t = f.when(f.col(KEEP), f.unix_micros(f.col(q(self.time)).cast("timestamp")))
            out = out.observe(seen, f.min(t).alias("lo"), f.max(t).alias("hi"))
        out.write.mode("overwrite").parquet(path)
        if seen is not None:
            got = seen.get
            lo, hi = got.get("lo"), got.get("hi")
            self._keep_bounds(path, None if lo is None or hi is None else (int(lo), int(hi)))
        if self.files is None:
            self.files = out.schema
        self.paths.append(path)
        return path

    def _keep_bounds(self, path: str, bounds: tuple[int, int] | None) -> None:
        """Know ``bounds`` of the directory ``path``, and keep them in it (written once its
        rows are: a directory without the file is always read)."""
        self.bounds[path] = bounds
        with open(os.path.join(path, BOUNDS_FILE), "w") as out:
            json.dump(None if bounds is None else list(bounds), out)

    def adopt(self, path: str) -> None:
        """A directory a run before a restart staged, with its bounds where it kept them."""
        super().adopt(path)
        try:
            with open(os.path.join(path, BOUNDS_FILE)) as f:
                got = json.load(f)
        except (OSError, ValueError):  # none (or cut short): always read
            return
        if got is None:
            self.bounds[path] = None
        elif isinstance(got, list) and len(got) == 2 and all(isinstance(v, int) for v in got):
            self.bounds[path] = (got[0], got[1])

    def may_hold(self, path: str, lo_us: int, hi_us: int, horizon_us: int) -> bool:
        """Whether the directory ``path`` can hold a row of a window ending in ``(lo_us,
        hi_us]`` (windows of ``horizon_us``): a row at ``t`` falls into windows ending in
        ``(t, t + horizon_us]``. Unknown directories can."""
        if path not in self.bounds:
            return True
        bounds = self.bounds[path]
        return bounds is not None and bounds[0] < hi_us and bounds[1] + horizon_us > lo_us

    def closed(self, path: str, watermark_us: int, horizon_us: int) -> bool:
        """Whether every window a row of the directory ``path`` falls into has closed (its
        latest event time + ``horizon_us`` at or below the watermark: the rows a
        :meth:`compact` leaves out). Unknown directories are not."""
        if path not in self.bounds:
            return False
        bounds = self.bounds[path]
        return bounds is None or bounds[1] + horizon_us <= watermark_us

    def spent(self, path: str, watermark_us: int, horizon_us: int) -> bool:
        """Whether the directory ``path`` may hold rows whose windows have all closed (its
        earliest event time + ``horizon_us`` at or below the watermark: rows a
        :meth:`compact` removes). Unknown directories may."""
        if path not in self.bounds:
            return True
        bounds = self.bounds[path]
        return bounds is not None and bounds[0] + horizon_us <= watermark_us

    def open_paths(self, watermark_us: int, horizon_us: int | None) -> list[str]:
        """The directories not :meth:`closed` (all of them for windows without a horizon)."""
        if not horizon_us:
            return list(self.paths)
        return [p for p in self.paths if not self.closed(p, watermark_us, horizon_us)]

    def due(
        self, paths: list[str], watermark_us: int, horizon_us: int | None, spent: int, files: int
    ) -> bool:
        """Whether a rewrite of ``paths`` is due: ``spent`` of them hold rows of closed windows
        (:meth:`spent`: what the rewrite removes), or there are ``files`` of them (what an
        emission lists and reads). Never for windows without a horizon (sessions)."""
        if horizon_us is None:
            return False
        held = sum(self.spent(p, watermark_us, horizon_us) for p in paths)
        return held >= spent or len(paths) >= files

    def drop_closed(self, watermark_us: int, horizon_us: int) -> None:
        """Delete the directories whose windows have all closed (no rewrite: nothing of them
        is read again; an in-order stream's old directories all are)."""
        self.dropped += self._delete(
            [p for p in self.paths if self.closed(p, watermark_us, horizon_us)]
        )

    def _delete(self, gone: list[str]) -> int:
        """Delete the staged directories ``gone`` (and what is known of them); their count."""
        self.paths = [p for p in self.paths if p not in gone]
        for p in gone:
            self.bounds.pop(p, None)
            remove_local(p)
        return len(gone)

    def compact(
        self,
        spark: Any,
        ended: Any,
        watermark_us: int,
        horizon_us: int,
        tag: str,
        paths: Sequence[str] | None = None,
    ) -> str:
        """Write the staged rows (of ``paths``: every directory by default) as one directory
        ``tag`` without the rows every window of which has closed (event time +
        ``horizon_us``, the window's duration, at or below the watermark), the ghosts and the
        rows of attempts in ``ended``; returns its path (the old directories stay until
        :meth:`drop_before`). The events of the rows were sent when they were first staged:
        they are not sent again."""
        f = _f()
        time = f.unix_micros(f.col(q(self.time)).cast("timestamp"))
        keep = time + f.lit(int(horizon_us)) > f.lit(int(watermark_us))
        return self.rewrite(spark, ended, keep, tag, paths)

    def rewrite(
        self, spark: Any, ended: Any, keep: Any, tag: str, paths: Sequence[str] | None = None
    ) -> str:
        """Write the staged rows (of ``paths``: every directory by default) for which ``keep``
        holds as one hidden directory ``tag``, without the ghosts and the rows of attempts in
        ``ended``; returns its path (the old directories stay until :meth:`commit` and
        :meth:`drop_before`)."""
        f = _f()
        path = os.path.join(self.root, "_" + tag)  # hidden from a restart until committed
        rows = self.read(spark, self.paths if paths is None else paths).where(f.col(KEEP))
        if ended is not None:
            rows = rows.join(ended, SRC, "left_anti")
        rows.where(keep).write.mode("overwrite").parquet(path)
        return path

    def commit(self, hidden: str, read: Sequence[str] | None = None) -> str:
        """Give a compaction written by :meth:`compact` its name (once its mark is noted):
        from then on a restart adopts it; returns its path. Its rows are some of those of the
        directories it ``read``: their bounds are its own where all are known (else it is
        always read), written into it before the rename (which gives it both at once)."""
        path = os.path.join(os.path.dirname(hidden), os.path.basename(hidden)[1:])
        self.bounds.pop(path, None)
        if not os.path.isdir(hidden):
            return path
        if read is not None and all(p in self.bounds for p in read):
            live = [b for p in read if (b := self.bounds[p]) is not None]
            self._keep_bounds(
                hidden, (min(b[0] for b in live), max(b[1] for b in live)) if live else None
            )
            self.bounds[path] = self.bounds.pop(hidden)
        os.replace(hidden, path)
        return path

    def recover(self, last: str | None) -> None:
        """A restart: the rewrite named ``last`` (the latest one marked) holds the rows of the
        directories before it, which go (it is committed here if a crash cut its commit
        short, with the bounds of the directories before it, where all are known: its rows
        are some of theirs); a rewrite never marked is deleted (its directories stay)."""
        if last and os.path.isdir(hidden := os.path.join(self.root, "_" + last)):
            # its commit never began: the directories before it are all still here
            path = self.commit(hidden, [p for p in self.paths if os.path.basename(p) < last])
            self.paths = sorted([*self.paths, path], key=os.path.basename)
        kept = [p for p in self.paths if os.path.basename(p) == last]
        if kept:
            self.drop_before(kept[0])
        if os.path.isdir(self.root):
            for name in os.listdir(self.root):
                if name.startswith("_") and os.path.isdir(os.path.join(self.root, name)):
                    remove_local(os.path.join(self.root, name))

    def drop_before(self, path: str) -> None:
        """Delete the directories staged before ``path`` (a compaction holding their rows)."""
        name = os.path.basename(path)
        self._delete([p for p in self.paths if os.path.basename(p) < name])
        if path not in self.paths:
            self.paths.append(path)

    def evict(self, spark: Any, ended: Any, sessions: Any, keys: Sequence[str], tag: str) -> str:
        """Write the staged rows as one hidden directory ``tag`` without the rows of the
        ``sessions`` written (:meth:`WindowSpec.session_rows`), the late rows, the ghosts and
        the rows of attempts in ``ended``; returns its path (:meth:`commit` names it)."""
        f = _f()
        path = os.path.join(self.root, "_" + tag)
        rows = self.read(spark, self.paths).where(f.col(KEEP))
        if ended is not None:
            rows = rows.join(ended, SRC, "left_anti")
        s = sessions.alias("s")
        r = rows.alias("r")
        cond = [f.col(f"r.{q(k)}").eqNullSafe(f.col(f"s.{q(k)}")) for k in keys]
        t = f.col(f"r.{q(self.time)}")
        cond += [t >= f.col("s._ft_start"), t < f.col("s._ft_end")]
        kept = r.join(s, cond, "left_anti")
        kept.write.mode("overwrite").parquet(path)
        return path

    def readable(
        self, within: tuple[int, int, int] | None, paths: list[str] | None = None
    ) -> list[str]:
        """The directories of ``paths`` (all staged ones by default) that can hold rows of the
        windows ending in ``(lo_us, hi_us]``, ``within = (lo_us, hi_us, horizon_us)``
        (:meth:`may_hold`; all of them without ``within``); those left out are counted in
        :attr:`pruned`."""
        paths = list(self.paths if paths is None else paths)
        if within is None:
            return paths
        kept = [p for p in paths if self.may_hold(p, *within)]
        self.pruned += len(paths) - len(kept)
        return kept

    def staged(
        self,
        spark: Any,
        ended: Any,
        ids: bool = False,
        paths: list[str] | None = None,
    ) -> Any:
        """The staged rows of attempts not in ``ended`` with their ``_ft_wm`` (and their ids:
        ``ids``), ghosts left out; those of ``paths`` only, if given (an emission picks them
        with :meth:`readable`)."""
        from .schema import empty_frame

        extra = []
        if ids:
            extra = [RID_TAG, RID_NO]
        paths = list(self.paths if paths is None else paths)
        if not paths:
            f = _f()
            df = empty_frame(spark, self.schema).withColumn(WM, micros_literal(0))
            for c in extra:
                df = df.withColumn(c, f.lit(0).cast("long"))
            return df.where(f.lit(False))
        df = self.read(spark, paths).where(_f().col(KEEP))
        if ended is not None:
            df = df.join(ended, SRC, "left_anti")
        return df.selectExpr(*map(q, self.payload), WM, *extra)


def _duration_of(column: Any) -> int | None:
    """The duration of a time window Column (``F.window(ts, duration, ...)``) in
    microseconds, else None (a session window, or a repr this cannot read)."""
    m = re.match(r"^Column<'window\((?:`(?:[^`]|``)+`|[^,()]+), '([^']+)'", repr(column))
    if m is None:
        return None
    try:
        return delay_micros(m.group(1))
    except ValueError:
        return None


_WINDOW_ARGS = re.compile(
    r"^Column<'window\((?:`(?:[^`]|``)+`|[^,()]+), '([^']+)', '([^']+)', '([^']+)'\)"
)


def _signed_micros(text: str) -> int:
    """:func:`delay_micros` of a duration that may be negative (a window's start offset)."""
    s = text.strip()
    return -delay_micros(s[1:]) if s.startswith("-") else delay_micros(s)


def window_ends(spec: WindowSpec) -> tuple[int, int] | None:
    """``(slide, offset)`` in microseconds such that the windows of a time window ``spec``
    end exactly at the instants ``offset + k * slide`` (Spark's windows start at
    ``startTime + k * slide`` and last their duration), or None (a session window, or a
    window Column this cannot read: every range may then hold an end)."""
    if spec.kind != "window":
        return None
    m = _WINDOW_ARGS.match(repr(spec.groups[spec.at]))
    if m is None:
        return None
    try:
        duration, slide, start = (_signed_micros(x) for x in m.groups())
    except ValueError:
        return None
    if slide <= 0 or duration <= 0:
        return None
    return slide, (start + duration) % slide


def closes_any(spec: WindowSpec, lo_us: int, hi_us: int) -> bool:
    """Whether a window of ``spec`` can end in ``(lo_us, hi_us]`` (what :meth:`WindowSpec.emit`
    writes): False only when no window of a time window's grid ends there, so that a
    micro-batch that moves the watermark without passing a window's end runs no job."""
    ends = window_ends(spec)
    if ends is None:
        return hi_us > lo_us
    slide, offset = ends
    return (hi_us - offset) // slide > (lo_us - offset) // slide


def horizon_of(spec: WindowSpec) -> int | None:
    """How long after its event time a row can still fall into an open window of ``spec``
    (a time window's duration), or None: a session can grow for as long as rows come."""
    if spec.kind != "window":
        return None
    return _duration_of(spec.groups[spec.at])


def _staged_event() -> str:
    from .lineage import staged_event

    return staged_event()


@dataclass(frozen=True)
class EmitWriter:
    """``mapInPandas`` function writing emitted window rows into a sink written from Python,
    each keyed by ``_ft_row`` (a hash of its window and keys): a window written again (a
    micro-batch re-run after a crash) is absorbed by an idempotent sink."""

    sink: Any
    columns: tuple[str, ...]

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        writer = self.sink.open_writer(ctx.partitionId() if ctx is not None else 0)
        rows = dups = 0
        try:
            for pdf in frames:
                if not len(pdf):
                    continue
                ids = pdf[ROW_ID].to_numpy(np.int64).view(np.uint64)
                ids = np.where(ids == 0, np.uint64(1), ids)
                payload = pdf[list(self.columns)]
                payload.columns = list(self.columns)
                dups += int(writer.write(payload.reset_index(drop=True), ids) or 0)
                rows += len(pdf)
        finally:
            writer.close()
        yield pd.DataFrame({"rows": [rows], "dups": [dups]})


def write_dir(df: Any, root: str, name: str) -> str:
    """Write ``df`` as the Parquet directory ``root/name``, hidden (``_name``) until complete:
    a restart never reads a directory cut short. Returns its path."""
    hidden = os.path.join(root, "_" + name)
    df.write.mode("overwrite").parquet(hidden)
    path = os.path.join(root, name)
    os.replace(hidden, path)
    return path


def kept_dirs(root: str, cut: str | None) -> list[str]:
    """The directories under ``root`` a restarted query keeps (in name order): all but the
    hidden ones (cut short while written) and ``cut`` (a write a crash cut short after it:
    done again), which go."""
    kept: list[str] = []
    if not os.path.isdir(root):
        return kept
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith("_") or name == cut:
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.isdir(path):
            kept.append(path)
    return kept


#: The operations that can run on a streaming barrier's emitted rows (1 → 0..1 each, their
#: expressions deterministic, checked at declaration): each row keeps its barrier's row id.
AFTER_BARRIER = ("Select", "WithColumns", "Renamed", "Renames", "Drop", "Filter", "FillNull")


def after_barrier_refusal(op: Any) -> str | None:
    """Why the native operation ``op`` cannot run on a streaming barrier's emitted rows, or
    None when it can (:data:`AFTER_BARRIER`; a generator would give several rows one id)."""
    from .ops import Qualified, Select, WithColumns, _generator_of

    inner = op.op if isinstance(op, Qualified) else op
    kind = type(inner).__name__
    if kind not in AFTER_BARRIER:
        return f"{op.describe()} (one of select, withColumn(s), filter/where, drop, fillna, "
    if isinstance(inner, Select) and any(_generator_of(c) for c in inner.cols):
        return f"{op.describe()} (a generator: explode & co. "
    if isinstance(inner, WithColumns) and any(_generator_of(c) for _, c in inner.mapping):
        return f"{op.describe()} (a generator: explode & co. "
    return None


def apply_after(op: Any, df: Any) -> Any:
    """The native operation ``op`` (one :func:`after_barrier_refusal` accepts) on a streaming
    barrier's emitted rows ``df``, as plain Spark runs it; a row keeps its ``ROW_ID`` column
    when ``df`` has one."""
    from .ops import Qualified, Select

    if isinstance(op, Qualified):
        return apply_after(op.op, df.alias(op.qualifier))
    if ROW_ID in df.columns and isinstance(op, Select):
        cols, _ = op._columns([c for c in df.columns if c != ROW_ID])
        return df.select(*cols, ROW_ID)
    return op.apply(df, False)


def write_emitted(node: Any, out: Any, name: str, chain: Sequence[Any] = ()) -> int:
    """Write the emitted window rows ``out`` into the sink ``node`` (a sink node after a
    windowed aggregation; a native one gets files named after the write, ``name``), through
    the native operations ``chain`` declared between the barrier and the sink (each row keeps
    its barrier's id); returns the rows written (absorbed duplicates not counted)."""
    f = _f()
    if chain:
        if not node.caps.native and ROW_ID not in out.columns:
            keys = [f.col(q(c)) for c in _key_columns(node)]
            out = out.withColumn(ROW_ID, f.xxhash64(*keys))
        for op_node in chain:
            out = apply_after(op_node.op, out)
    cols = list(node.columns)
    df = out.selectExpr(*map(q, cols))
    if node.caps.native:
        return int(node.sink.append(df, name=name) or 0)
    if ROW_ID in out.columns:  # the rows' own ids (a stream-stream join's pairs)
        keyed = out.selectExpr(*map(q, cols), ROW_ID)
    else:
        keyed = df.withColumn(ROW_ID, f.xxhash64(*[f.col(q(c)) for c in _key_columns(node)]))
    res = keyed.mapInPandas(EmitWriter(node.sink, tuple(cols)), "rows long, dups long").agg(
        f.sum("rows"), f.sum("dups")
    )
    got = res.collect()[0]
    return int(got[0] or 0) - int(got[1] or 0)


def _key_columns(node: Any) -> list[str]:
    """The columns that identify an emitted row: its aggregation's window and keys."""
    par = node.parents[0]
    while getattr(par, "derived", None) is None:  # through the operations after it
        par = par.parents[0]
    agg = par.derived
    spec = agg.spec
    return [spec.names[i] for i in range(len(spec.groups))]


__all__ = [
    "AFTER_BARRIER",
    "RID_NO",
    "RID_TAG",
    "ROW_ID",
    "WIN",
    "WM",
    "EmitWriter",
    "Watermark",
    "WindowSpec",
    "WindowStaging",
    "after_barrier_refusal",
    "apply_after",
    "closes_any",
    "delay_micros",
    "horizon_of",
    "kept_dirs",
    "micros_literal",
    "window_ends",
    "window_of",
    "window_of_repr",
    "write_dir",
    "write_emitted",
]
