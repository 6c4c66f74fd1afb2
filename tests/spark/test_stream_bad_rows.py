"""A row on which a native expression raises in a tracked stream (Spark 4's ANSI mode: a
malformed cast, a division by zero; ``raise_error``) fails its own source record only, as in
batch runs: the stream goes on, exactly those records are dead-lettered with Spark's error
condition in the reason, and every sink equals plain Structured Streaming over the same files
minus them. The round that met the error is abandoned and run again at once, guarded (the
micro-batch is committed with every record persisted); later rounds stay guarded. An error the
stream cannot isolate stops it with one line that says where it came from.

Input: ``FILES`` JSON files of ``LINES`` rows, read one per micro-batch; file ``f`` holds the
event times ``10 f + k/2`` s; the rows in ``BAD`` carry the value that raises.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections import Counter

import pandas as pd
import pytest

import xorack
from helpers.streams import plain_rows
from xorack.spark import ParquetSink, Pipeline, SQLiteSink
from xorack.spark.row_errors import NativeRowError

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stage functions below

FILES = 4
LINES = 20
BAD = frozenset({7, 33, 52})
SCHEMA = "id long, ts timestamp, v string, b long"
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)
WAIT = 600.0


def _write_input(tmp_path, bad=BAD):
    """Per bad row: ``v`` malformed (a cast raises) and ``b`` zero (a division raises)."""
    d = tmp_path / "in"
    d.mkdir()
    for f in range(FILES):
        path = d / f"part-{f:02d}.json"
        with open(path, "w") as out:
            for k in range(LINES):
                i = f * LINES + k
                ts = T0 + dt.timedelta(seconds=10 * f + k / 2)
                v, b = (f"x{i}", 0) if i in bad else (str(3 * i), i % 4 + 1)
                out.write(json.dumps({"id": i, "ts": ts.isoformat(), "v": v, "b": b}) + "\n")
        at = time.time() - 3600 + f  # oldest first: one file per micro-batch, in order
        os.utime(path, (at, at))
    return d


def _read(spark, d):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(d))


def _rows(rows) -> Counter:
    return Counter(tuple(r) for r in rows)


def _plain(spark, frame, name) -> Counter:
    return _rows(plain_rows(spark, frame, name))


def _without(frame, bad=BAD):
    """``frame`` without the ``bad`` rows, by a filter that names the event-time column: Spark
    pushes one that does not below ``withWatermark``, where the watermark would not see them
    (xorack's does: a record's event time counts whether or not it fails)."""
    return frame.where(~(F.col("id").isin(sorted(bad)) & F.col("ts").isNotNull()))


def _cast(t):
    return t.withColumn("n", F.col("v").cast("long"))


def _divide(t):
    return t.withColumn("q", F.col("id") / F.col("b"))


def _raise(t):
    message = F.concat(F.lit("bad id "), F.col("id").cast("string"))
    return t.withColumn("x", F.when(F.col("b") == 0, F.raise_error(message)).otherwise(F.col("b")))


def _windows(t):
    return t.groupBy(F.window("ts", "10 seconds")).agg(
        F.round(F.sum("q"), 6).alias("s"), F.count("*").alias("c"), F.max("id").alias("top")
    )


def _assert_dead(p, report, condition: str, bad=BAD) -> None:
    assert report.lost == 0
    assert report.dead_lettered == len(bad)
    dead = p.dead_letters().to_pandas()
    assert sorted(dead["id"]) == sorted(bad)
    assert all(f"[{condition}]" in r for r in dead["_ft_reason"]), list(dead["_ft_reason"])


def test_a_malformed_value_fails_its_record_and_the_stream_goes_on(spark, tmp_path):
    """A malformed cast before a sink written from Python and a ParquetSink: the first
    micro-batch's round is abandoned and run again guarded, the bad rows' records are
    dead-lettered, and both sinks equal plain Structured Streaming minus them. The report
    counts what the SQLite sink holds (the abandoned job's writes included)."""
    d = _write_input(tmp_path)
    p = Pipeline(spark, max_attempts=2)
    out = _cast(p.source(_read(spark, d), name="in", partitions=2)).drop("ts")
    rows = SQLiteSink(str(tmp_path / "rows.db"), "rows")
    out.sink(rows, name="rows")
    parquet = ParquetSink(str(tmp_path / "rows.parquet"))
    out.sink(parquet, name="parquet")
    report = p.start_stream(timeout=60.0, available_now=True).wait(WAIT)
    _assert_dead(p, report, "CAST_INVALID_INPUT")
    assert report.abandoned_rounds == 1
    assert report.completed == FILES * LINES - len(BAD)
    plain = _plain(spark, _cast(_without(_read(spark, d))).drop("ts"), "bad_rows_cast")
    assert sum(plain.values()) == FILES * LINES - len(BAD)
    cols = ["id", "v", "b", "n"]
    got = rows.read()[cols].astype(object).itertuples(index=False, name=None)
    assert Counter(got) == plain
    assert _rows(parquet.read(spark).select(*cols).collect()) == plain
    assert report.sink_rows["rows"] == sum(plain.values())


def _flaky(pdf: pd.DataFrame) -> pd.DataFrame:
    """Every fifth row fails on its first attempt (a replay)."""
    from xorack.spark import current_attempt

    bad = (pdf["id"] % 5 == 2).to_numpy() & (current_attempt(pdf) == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


@pytest.mark.parametrize(("build", "condition"), [(_divide, "DIVIDE_BY_ZERO")])
def test_windows_over_rows_that_raise_equal_plain_structured_streaming(
    spark, tmp_path, build, condition
):
    """A division by zero before a windowed aggregation (append mode, a ParquetSink), with
    transient failures of a Python stage before it: each window is written once, with plain
    Spark's value over the input minus the bad rows (which Spark's watermark still saw)."""
    d = _write_input(tmp_path)
    p = Pipeline(spark, max_attempts=2)
    src = p.source(_read(spark, d), name="in", partitions=2).withWatermark("ts", "5 seconds")
    checked = src.map_in_pandas(_flaky, SCHEMA, name="flaky")
    sink = ParquetSink(str(tmp_path / "windows.parquet"))
    _windows(build(checked)).sink(sink, name="windows")
    report = p.start_stream(timeout=60.0, available_now=True).wait(WAIT)
    _assert_dead(p, report, condition)
    assert report.abandoned_rounds == 1
    assert report.replayed > len(BAD)  # the transient failures were replayed too
    lines = _read(spark, d).withWatermark("ts", "5 seconds")
    plain = _plain(spark, _windows(build(_without(lines))), "bad_rows_windows")
    assert len(plain) == FILES - 1  # the last window stays open in both
    assert _rows(sink.read(spark).collect()) == plain


def _fails_last_file_once(pdf: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last file fail on their first attempt: they reach the native
    expression only as replays."""
    from xorack.spark import current_attempt

    bad = (pdf["id"] >= (FILES - 1) * LINES).to_numpy() & (current_attempt(pdf) == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


def test_a_row_that_first_raises_in_a_replay_round(spark, tmp_path):
    """The only raising row is in the last file, whose rows all fail once before the native
    expression: it first raises in the drain's replay round (no fresh input), which is
    abandoned and run again guarded like a micro-batch's."""
    bad = frozenset({FILES * LINES - 5})
    d = _write_input(tmp_path, bad)
    p = Pipeline(spark, max_attempts=2)
    src = p.source(_read(spark, d), name="in", partitions=2)
    out = _raise(src.map_in_pandas(_fails_last_file_once, SCHEMA, name="once")).drop("ts")
    sink = SQLiteSink(str(tmp_path / "rows.db"), "rows")
    out.sink(sink, name="rows")
    report = p.start_stream(timeout=60.0, available_now=True).wait(WAIT)
    _assert_dead(p, report, "USER_RAISED_EXCEPTION", bad)
    assert report.abandoned_rounds == 1
    plain = _plain(spark, _raise(_without(_read(spark, d), bad)).drop("ts"), "bad_rows_drain")
    got = sink.read()[["id", "v", "b", "x"]].astype(object).itertuples(index=False, name=None)
    assert Counter(got) == plain
    # the abandoned job wrote the rows of the other partition: counted from the sink
    assert report.sink_rows["rows"] == sum(plain.values())


def test_an_error_in_the_source_frame_stops_the_stream_with_one_line(spark, tmp_path):
    """A cast declared on the DataFrame given to ``p.source()`` is outside the tracked
    operations: the stream stops with a NativeRowError saying so, not Spark's bare error."""
    d = _write_input(tmp_path)
    p = Pipeline(spark, max_attempts=2)
    p.source(_cast(_read(spark, d)), name="in", partitions=2).sink(
        SQLiteSink(str(tmp_path / "rows.db"), "rows"), name="rows"
    )
    run = p.start_stream(timeout=60.0, available_now=True)
    with pytest.raises(NativeRowError, match=r"CAST_INVALID_INPUT.*p\.source\(\) itself") as e:
        run.wait(WAIT)
    assert "\n" not in str(e.value)  # one line


def test_an_error_after_a_window_stops_the_stream_with_one_line(spark, tmp_path):
    """An expression over a window's output raises when the window is written (as the
    watermark passes it): xorack isolates rows before a stateful operation only, and says so
    instead of failing with Spark's bare error."""
    d = _write_input(tmp_path, frozenset())
    p = Pipeline(spark, max_attempts=2)
    src = p.source(_read(spark, d), name="in", partitions=2).withWatermark("ts", "5 seconds")
    counted = _windows(_divide(src))
    message = F.concat(F.lit("window of "), F.col("top").cast("string"))
    raising = counted.withColumn("x", F.when(F.col("top") > 30, F.raise_error(message)))
    raising.sink(ParquetSink(str(tmp_path / "w.parquet")), name="windows")
    run = p.start_stream(timeout=60.0, available_now=True)
    with pytest.raises(NativeRowError, match=r"USER_RAISED_EXCEPTION.*or after it") as e:
        run.wait(WAIT)
    assert "\n" not in str(e.value)  # one line


@pytest.fixture
def small_arrow_batches(spark):
    """Arrow batches of 8 rows into Python: a task that fails on a row has not read (nor
    persisted) most of its partition."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "8")
    yield
    spark.conf.set(key, before)


def test_the_records_a_failed_job_never_read_are_persisted_first(
    spark, tmp_path, small_arrow_batches
):
    """One file of 4,000 rows in one partition, the fourth row malformed: Spark stops the
    micro-batch's job at it, before the source's tagger has read (and persisted) most rows.
    Every one of them is persisted before the micro-batch goes on (Spark commits its offsets
    when it returns): each row but the bad one reaches the sink, none is lost."""
    n, bad = 4000, frozenset({3})
    d = tmp_path / "in"
    d.mkdir()
    with open(d / "part-00.json", "w") as out:
        for i in range(n):
            v = f"x{i}" if i in bad else str(i)
            ts = (T0 + dt.timedelta(milliseconds=i)).isoformat()
            out.write(json.dumps({"id": i, "ts": ts, "v": v, "b": 1}) + "\n")
    p = Pipeline(spark, max_attempts=2)
    out = _cast(p.source(_read(spark, d), name="in", partitions=1)).select("id", "n")
    sink = SQLiteSink(str(tmp_path / "rows.db"), "rows")
    out.sink(sink, name="rows")
    report = p.start_stream(timeout=60.0, available_now=True).wait(WAIT)
    _assert_dead(p, report, "CAST_INVALID_INPUT", bad)
    assert (report.source_records, report.completed) == (n, n - 1)
    got = sink.read()
    assert sorted(got["id"]) == [i for i in range(n) if i not in bad]
    assert (got["id"] == got["n"]).all()


def test_the_stream_goes_back_unguarded_after_a_clean_micro_batch(spark, tmp_path):
    """Bad rows in the first and the last file: micro-batch 1 replays the first one's record
    (it raises again, guarded: dead-lettered), micro-batch 2 passes with no row raising and no
    replay waiting, so the stream goes on unguarded, and the last file's bad row abandons its
    round again. The sink equals plain Structured Streaming's minus both rows."""
    bad = frozenset({7, (FILES - 1) * LINES + 5})
    d = _write_input(tmp_path, bad)
    p = Pipeline(spark, max_attempts=2)
    out = _cast(p.source(_read(spark, d), name="in", partitions=2)).drop("ts")
    sink = SQLiteSink(str(tmp_path / "rows.db"), "rows")
    out.sink(sink, name="rows")
    report = p.start_stream(timeout=60.0, available_now=True).wait(WAIT)
    _assert_dead(p, report, "CAST_INVALID_INPUT", bad)
    assert report.abandoned_rounds == 2  # guarded again only when a row raised again
    plain = _plain(spark, _cast(_without(_read(spark, d), bad)).drop("ts"), "bad_rows_again")
    got = sink.read()[["id", "v", "b", "n"]].astype(object).itertuples(index=False, name=None)
    assert Counter(got) == plain
    assert report.sink_rows["rows"] == sum(plain.values())
