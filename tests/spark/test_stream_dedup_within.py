"""``dropDuplicatesWithinWatermark`` of a tracked stream, against plain Structured Streaming.

Events with an id (``guid``) and an event time, at-least-once: copies of an event (the same
row) in its file and in the next one, while the key's state lives (dropped); a new event with
the id of an earlier one in the next file (the key still lives: dropped) and two files later
(the key expired: written again, in Spark and here); copies of the first file's events in the
last one, behind the watermark (late: dropped). Delay 1 s; file ``f`` holds event times
``10 f + k/2`` s. Spark judges a row of micro-batch ``N`` by the watermark of micro-batch
``N - 1`` (``max event time of micro-batches <= N - 2`` minus the delay, for late rows and
for the keys' expiry alike): the times are chosen a second or more from every boundary.
The copies of one event are the same row, and a key's rows come in event-time order, so
Spark's choice of the row to write is not order dependent here: whole rows are compared.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import threading
import time

import pandas as pd
import pytest

import xorack
from helpers.streams import plain_rows
from xorack.spark import ParquetSink, Pipeline, SQLiteSink

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stage functions below

FILES = 4
EVENTS = 10  # new events per file
SCHEMA = "guid long, eventTime timestamp, value long, seq long"
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)
WAIT = 600.0
DELAY = "1 second"


def _poison(seq: int) -> bool:
    return seq % 13 == 5


def _write_input(tmp_path) -> int:
    files: list[list[dict]] = [[] for _ in range(FILES)]
    seq = 0

    def send(f: int, g: int, t: dt.datetime, value: int) -> None:
        nonlocal seq
        files[f].append({"guid": g, "eventTime": t.isoformat(), "value": value, "seq": seq})
        seq += 1

    for f in range(FILES):
        for k in range(EVENTS):
            g = f * EVENTS + k
            t = T0 + dt.timedelta(seconds=10 * f + k / 2)
            send(f, g, t, 7 * g)
            if g % 3 == 0:  # a copy in the same micro-batch
                send(f, g, t, 7 * g)
            if g % 4 == 0 and f + 1 < FILES:  # a copy in the next one (the key lives)
                send(f + 1, g, t, 7 * g)
            if k in (4, 7) and f + 1 < FILES:  # a new event of the id, the key still alive
                send(f + 1, g, t + dt.timedelta(seconds=10), 7 * g + 1)
            if k in (1, 2) and f + 2 < FILES:  # the key expired: written again
                later = t + dt.timedelta(seconds=20, milliseconds=250)
                send(f + 2, g, later, 7 * g + 2)
                if g % 2 == 0:  # and its copy dropped
                    send(f + 2, g, later, 7 * g + 2)
            if f == 0 and g % 2 == 0:  # late copies
                send(FILES - 1, g, t, 7 * g)
    d = tmp_path / "events"
    d.mkdir()
    for f, rows in enumerate(files):
        rows.sort(key=lambda r: r["eventTime"])  # a key's rows in event-time order
        path = d / f"part-{f:02d}.json"
        with open(path, "w") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
        at = time.time() - 3600 + f  # a file source reads the oldest file first
        os.utime(path, (at, at))
    return seq


def _read(spark, tmp_path):
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "events"))
    )


def _flaky(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack.spark import current_attempt

    attempt = current_attempt(pdf)
    bad = pdf["seq"].map(_poison).to_numpy(bool)
    bad |= (pdf["seq"] % 5 == 0).to_numpy() & (attempt == 1)
    # the first event fails twice: pending two micro-batches, it holds the watermark of the
    # late rows back (below the expiry of keys that plain Spark's watermark has expired)
    bad |= (pdf["seq"] == 0).to_numpy() & (attempt <= 2)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


def _audit(pdf: pd.DataFrame) -> pd.DataFrame:
    """Another branch, dead-lettering some events after their rows were staged."""
    bad = (pdf["seq"] % 11 == 3).to_numpy(bool)
    if bad.any():
        raise xorack.FailRecord("audit", rows=bad)
    return pdf


def _rows(rows) -> list:
    return sorted((int(r.guid), r.eventTime, int(r.value)) for r in rows)


def _plain_frame(spark, tmp_path, keys, dead=frozenset()):
    """Plain Structured Streaming's deduplication of the same files, minus the ``dead``
    events."""
    from pyspark.sql import functions as F

    events = _read(spark, tmp_path).where(~F.col("seq").isin(sorted(dead))).drop("seq")
    return events.withWatermark("eventTime", DELAY).dropDuplicatesWithinWatermark(keys)


def _plain(spark, tmp_path, keys, name, dead=frozenset(), mode="append") -> list:
    """The rows plain Structured Streaming writes (output ``mode``) over the same files,
    minus the ``dead`` events."""
    return _rows(plain_rows(spark, _plain_frame(spark, tmp_path, keys, dead), name, mode))


def _written_again(rows) -> set[int]:
    """The ids written more than once (their key expired in between)."""
    seen = pd.Series([g for g, _, _ in rows])
    return set(seen[seen.duplicated()].tolist())


def _tracked(spark, tmp_path, sink):
    """The query as an xorack pipeline: the events through the flaky stage, deduplicated
    within the watermark into ``sink``; returns the pipeline and the stage's output."""
    p = Pipeline(spark, max_attempts=3)
    events = p.source(_read(spark, tmp_path), name="events", partitions=2)
    events = events.withWatermark("eventTime", DELAY)
    checked = events.map_in_pandas(_flaky, SCHEMA, name="stage")
    checked.drop("seq").dropDuplicatesWithinWatermark(["guid"]).sink(sink, name="unique")
    return p, checked


def test_within_watermark_under_failures_equals_plain_structured_streaming(
    spark, tmp_path, monkeypatch
):
    """Transient failures (replays), poison rows and another branch that dead-letters staged
    rows: the sink holds plain Spark's rows over the input minus the dead letters — each key
    once per expiry, the expired ones written again."""
    from xorack.spark import stream_state

    monkeypatch.setattr(stream_state, "COMPACT_AFTER", 3)
    sent = _write_input(tmp_path)
    out = str(tmp_path / "unique.parquet")
    p, checked = _tracked(spark, tmp_path, ParquetSink(out))
    audited = checked.map_in_pandas(_audit, SCHEMA, name="audit")
    audited.sink(ParquetSink(str(tmp_path / "audit.parquet")), name="audited")
    run = p.start_stream(timeout=60.0, available_now=True)
    report = run.wait(timeout=WAIT)

    dead = set(p.dead_letters().column("seq").to_pylist()) - {None}
    must = {s for s in range(sent) if _poison(s) or s % 11 == 3}
    assert dead >= must  # (a loaded machine may time out more: left out of Spark's input too)
    want = _plain(spark, tmp_path, ["guid"], "plain_within", dead=dead)
    got = _rows(spark.read.parquet(out).collect())
    assert got == want
    assert _written_again(want)  # keys that expired and came back, written twice
    assert report.lost == 0
    assert report.replayed > 0
    assert run.windows.compactions > 0


def test_within_watermark_restarted_after_a_crash_mid_emission_equals_plain_spark(
    spark, tmp_path, monkeypatch
):
    """A driver crash after an emission wrote its rows into the sink and before it kept their
    keys and expiries: the restarted query (same checkpoint, the last file written since)
    takes the write back and does it again; the sink holds what plain Spark writes over the
    input minus the poison when it too is stopped before the last file and restarted on its
    checkpoint (its ``availableNow`` query ends with a micro-batch without data that moves the
    watermark: keys that a single run would keep alive for the last file expire there)."""

    from helpers.crashes import crash_after_dedup_write

    sent = _write_input(tmp_path)
    poison = {s for s in range(sent) if _poison(s)}
    events_dir, later = tmp_path / "events", tmp_path / "later"
    later.mkdir()

    def move(src, dst) -> None:  # the last file, out of the source directory or back
        for f in range(3, FILES):
            os.replace(src / f"part-{f:02d}.json", dst / f"part-{f:02d}.json")

    checkpoint = str(tmp_path / "checkpoint")
    out = str(tmp_path / "unique.parquet")

    def start():
        p, _ = _tracked(spark, tmp_path, ParquetSink(out))
        run = p.start_stream(timeout=60.0, available_now=True, checkpoint_location=checkpoint)
        return run.wait(timeout=WAIT)

    def plain() -> None:
        q = (
            _plain_frame(spark, tmp_path, ["guid"], poison)
            .writeStream.outputMode("append")
            .format("parquet")
            .option("path", str(tmp_path / "plain.parquet"))
            .option("checkpointLocation", str(tmp_path / "plain-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(WAIT)

    move(events_dir, later)
    plain()
    records = crash_after_dedup_write(monkeypatch)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.undo()
    assert len(records) == 2
    move(later, events_dir)
    plain()
    report = start()

    want = _rows(spark.read.parquet(str(tmp_path / "plain.parquet")).collect())
    got = _rows(spark.read.parquet(out).collect())
    assert got == want
    assert _written_again(want)  # keys that expired and came back, written twice
    assert report.lost == 0


def test_within_watermark_in_update_mode_equals_plain_structured_streaming(spark, tmp_path):
    """``output_mode="update"`` (a deduplication writes each new row once, as in append mode)
    into a SQLite sink, under failures: plain Structured Streaming's update-mode rows over
    the input minus the poison."""

    sent = _write_input(tmp_path)
    poison = {s for s in range(sent) if _poison(s)}
    want = _plain(spark, tmp_path, ["guid"], "plain_within_update", dead=poison, mode="update")

    sink = SQLiteSink(str(tmp_path / "unique.db"), "unique")
    p, _ = _tracked(spark, tmp_path, sink)
    report = p.start_stream(timeout=60.0, available_now=True, output_mode="update").wait(
        timeout=WAIT
    )
    got = sorted(
        (int(r.guid), pd.Timestamp(r.eventTime).to_pydatetime(), int(r.value))
        for r in sink.read().itertuples(index=False)
    )
    assert got == want
    assert _written_again(want)  # keys that expired and came back, written twice
    assert report.lost == 0
    assert report.replayed > 0
    assert set(p.dead_letters().column("seq").to_pylist()) == poison


def test_within_watermark_keyed_without_event_time_is_final_while_running(spark, tmp_path):
    """No failures, the key (``value % 11``) without the event time, an idempotent sink read
    while the stream runs: no row is ever taken back, and the end equals plain Spark."""
    from pyspark.sql import functions as F

    _write_input(tmp_path)
    db = str(tmp_path / "unique.db")
    sink = SQLiteSink(db, "unique")
    p = Pipeline(spark)
    events = p.source(_read(spark, tmp_path), name="events").withWatermark("eventTime", DELAY)
    keyed = events.withColumn("bucket", F.col("guid") % 11).drop("seq")
    keyed.dropDuplicatesWithinWatermark("bucket").sink(sink, name="unique")
    seen: list = []
    stop = threading.Event()

    def rows(frame) -> list:
        return [
            (int(r.guid), pd.Timestamp(r.eventTime).to_pydatetime(), int(r.value))
            for r in frame.itertuples(index=False)
        ]

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the table is created by start_stream
                seen.extend(rows(sink.read()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    finally:
        stop.set()
        watcher.join()
    events = _read(spark, tmp_path).withColumn("bucket", F.col("guid") % 11).drop("seq")
    plain = events.withWatermark("eventTime", DELAY).dropDuplicatesWithinWatermark(["bucket"])
    want = _rows(plain_rows(spark, plain, "plain_within_bucket"))
    got = sorted(rows(sink.read()))
    assert got == want
    buckets = [g % 11 for g, _, _ in got]
    assert len(buckets) > len(set(buckets)) > 1  # written again once expired
    assert set(seen) <= set(got)
    assert report.lost == 0


def test_within_watermark_declarations_refused_in_one_line(spark, tmp_path):
    """Refused where Spark refuses it, each in one line: no watermark, the event-time column
    gone, complete mode, a batch frame; and bad arguments."""
    from xorack.spark.ops import TrackedOperationError
    from xorack.spark.stages import StageSchemaError

    _write_input(tmp_path)

    def stream():
        p = Pipeline(spark)
        return p, p.source(_read(spark, tmp_path), name="events")

    _, events = stream()
    with pytest.raises(TrackedOperationError, match="has no watermark") as e:
        events.dropDuplicatesWithinWatermark(["guid"])
    assert "\n" not in str(e.value)
    plain = _read(spark, tmp_path).dropDuplicatesWithinWatermark(["guid"])
    with pytest.raises(Exception, match="without watermark"):
        plain.writeStream.format("memory").queryName("nowm").start()
    _, events = stream()
    events = events.withWatermark("eventTime", DELAY)
    with pytest.raises(TrackedOperationError, match="'eventTime' of the watermark no longer"):
        events.select("guid", "value").dropDuplicatesWithinWatermark(["guid"])
    for bad in ([1], ["guid", None], []):
        with pytest.raises(TypeError, match="subset must be column names"):
            events.dropDuplicatesWithinWatermark(bad)
    for args, kwargs in ((({"guid"},), {}), ((), {"subset": "guid"}), (("guid",), {"subset": []})):
        with pytest.raises(TypeError, match="subset must be column names"):
            events.dropDuplicatesWithinWatermark(*args, **kwargs)
    assert events.dropDuplicatesWithinWatermark(subset=("guid",)).columns == events.columns
    with pytest.raises(StageSchemaError, match=r"missing column\(s\) \['nope'\]"):
        events.dropDuplicatesWithinWatermark("guid", "nope")

    p, events = stream()
    events = events.withWatermark("eventTime", DELAY)
    events.dropDuplicatesWithinWatermark().sink(SQLiteSink(str(tmp_path / "a.db"), "t"), "o")
    with pytest.raises(ValueError, match="append or update mode"):
        p.start_stream(available_now=True, output_mode="complete")

    batch = spark.createDataFrame([(1, T0)], "guid long, eventTime timestamp")
    with pytest.raises(Exception, match="not supported with batch"):
        batch.dropDuplicatesWithinWatermark(["guid"]).collect()  # plain Spark refuses it
    p = Pipeline(spark)
    with pytest.raises(TrackedOperationError, match="not supported on a batch frame"):
        p.source(batch, name="rows").dropDuplicatesWithinWatermark(["guid"])
