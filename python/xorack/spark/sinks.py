"""Sinks: where tracked records end. A sink writes inside the executor task and the runner acks
the rows only after :meth:`SinkWriter.write` returned (the write is durable).

:class:`SQLiteSink` is idempotent: rows are upserted by their record id (``_ft_rec``), so a
record delivered twice (a replay of a source record whose other outputs were already written)
is stored once and counted as a *duplicate absorbed*. With deterministic ids a replayed source
record re-creates the same output ids, which makes the sink's content exactly-once for
deterministic functions.

>>> import tempfile, os, numpy as np, pandas as pd
>>> path = os.path.join(tempfile.mkdtemp(), "out.db")
>>> sink = SQLiteSink(path, "words")
>>> sink.create(["word"])
>>> w = sink.open_writer(0)
>>> w.write(pd.DataFrame({"word": ["a", "b"]}), np.array([1, 2], dtype=np.uint64))
0
>>> w.write(pd.DataFrame({"word": ["a"]}), np.array([1], dtype=np.uint64))
1
>>> w.close(); sink.read()["word"].tolist()
['a', 'b']
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from . import sink_types

REC_COLUMN = "_rec"
KINDS_TABLE = "_xorack_columns"  # (table, column, kind): how each sink column is stored


class SinkWriter(Protocol):
    def write(self, rows: pd.DataFrame, rec: np.ndarray | None) -> int:
        """Store ``rows`` durably (keyed by ``rec`` when given); return the duplicates absorbed.
        On an exception nothing of ``rows`` is stored (the records are failed and replayed)."""
        ...

    def reset(self) -> None:
        """Drop the connection after a failed write (the next write reconnects)."""
        ...

    def close(self) -> None: ...


class Sink(Protocol):
    """What a pipeline sink needs: created once on the driver, opened once per task."""

    def create(self, columns: list[str]) -> None: ...

    def open_writer(self, partition: int) -> SinkWriter: ...


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class SQLiteSink:
    """An idempotent SQLite table keyed by record id (``INTEGER PRIMARY KEY``, the rowid).

    Without record ids (FT OFF) rows are appended with fresh rowids. WAL mode and a generous
    busy timeout let concurrent executor tasks write to one file.

    Column types (timestamps, dates, decimals, booleans, binary, arrays/maps/structs) are stored
    so that :meth:`read` gives back the pandas types Spark hands a stage (see
    :mod:`xorack.spark.sink_types`). ``schema`` (a payload ``StructType``, also accepted by
    :meth:`create`) declares them up front and rejects unsupported types at once; without it
    each column's kind is taken from the first batch written.
    """

    path: str
    table: str = "sink"
    timeout: float = 120.0
    schema: Any = None

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA cache_size=-65536")  # 64 MiB: keyed upserts touch random pages
        return con

    def create(self, columns: list[str], schema: Any = None) -> None:
        """Create the table (if absent) with the record-id key and the payload columns.
        ``schema`` (a payload ``StructType``, default the sink's own) fixes the column types;
        an unsupported type raises :class:`~xorack.spark.sink_types.UnsupportedSinkType`."""
        schema = schema if schema is not None else self.schema
        kinds = sink_types.check_sink_schema(schema) if schema is not None else {}
        cols = ", ".join(
            _quote(c) + (f" {sink_types.sql_type(kinds[c])}" if c in kinds else "") for c in columns
        )
        con = self._connect()
        try:
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {_quote(self.table)} "
                f"({REC_COLUMN} INTEGER PRIMARY KEY, {cols})"
            )
            _record_kinds(con, self.table, {c: k for c, k in kinds.items() if c in columns})
        finally:
            con.close()

    def open_writer(self, partition: int) -> _SQLiteWriter:
        return _SQLiteWriter(self)

    def read(self) -> pd.DataFrame:
        """The table's payload columns (without the record id), in rowid order."""
        con = self._connect()
        try:
            df = pd.read_sql_query(f"SELECT * FROM {_quote(self.table)} ORDER BY rowid", con)
            kinds = _load_kinds(con, self.table)
        finally:
            con.close()
        return sink_types.decode_frame(df.drop(columns=[REC_COLUMN]), kinds)

    def count(self) -> int:
        con = self._connect()
        try:
            return int(con.execute(f"SELECT COUNT(*) FROM {_quote(self.table)}").fetchone()[0])
        finally:
            con.close()


def _record_kinds(con: sqlite3.Connection, table: str, kinds: dict[str, str]) -> None:
    """Remember how each column is stored (the first kind recorded for a column stays)."""
    con.execute(
        f"CREATE TABLE IF NOT EXISTS {KINDS_TABLE} "
        "(tbl TEXT, col TEXT, kind TEXT, PRIMARY KEY (tbl, col))"
    )
    if kinds:
        con.executemany(
            f"INSERT OR IGNORE INTO {KINDS_TABLE} VALUES (?, ?, ?)",
            [(table, c, k) for c, k in kinds.items()],
        )


def _load_kinds(con: sqlite3.Connection, table: str) -> dict[str, str]:
    try:
        rows = con.execute(f"SELECT col, kind FROM {KINDS_TABLE} WHERE tbl = ?", (table,))
        return dict(rows.fetchall())
    except sqlite3.OperationalError:  # a file written before kinds were recorded
        return {}


class _SQLiteWriter:
    def __init__(self, sink: SQLiteSink) -> None:
        self._sink = sink
        self._con: sqlite3.Connection | None = None
        self._kinds: dict[str, str] = {}

    def _kinds_of(self, rows: pd.DataFrame) -> dict[str, str]:
        """The kind of every column of ``rows``: recorded ones first, new ones inferred from
        this batch and recorded."""
        assert self._con is not None
        missing = [c for c in rows.columns if c not in self._kinds]
        if missing:
            self._kinds = _load_kinds(self._con, self._sink.table)
            new = {c: sink_types.infer_kind(rows[c]) for c in missing if c not in self._kinds}
            if new:
                _record_kinds(self._con, self._sink.table, new)
                self._kinds = _load_kinds(self._con, self._sink.table)
        return self._kinds

    def write(self, rows: pd.DataFrame, rec: np.ndarray | None) -> int:
        if not len(rows):
            return 0
        if self._con is None:
            self._con = self._sink._connect()
        kinds = self._kinds_of(rows)
        cols = [REC_COLUMN, *rows.columns]
        sql = (
            f"INSERT OR IGNORE INTO {_quote(self._sink.table)} "
            f"({', '.join(_quote(c) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
        )
        if rec is None:
            keys: list = [None] * len(rows)
        else:  # in key order: the B-tree inserts then walk its pages in order (~25% faster)
            signed = np.ascontiguousarray(rec, dtype=np.uint64).view(np.int64)
            order = np.argsort(signed, kind="stable")
            keys = signed[order].tolist()
            rows = rows.iloc[order]
        values = [sink_types.encode_column(rows[c], kinds[c]) for c in rows.columns]
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            before = con.total_changes
            con.executemany(sql, zip(keys, *values, strict=True))
            inserted = con.total_changes - before
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return len(rows) - inserted

    def reset(self) -> None:
        self.close()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
