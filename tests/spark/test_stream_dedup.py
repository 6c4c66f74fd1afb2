"""``dropDuplicates`` of a tracked stream, against plain Structured Streaming as the oracle.

Spark's own example from its streaming guide, ported: events with a unique id (``guid``) and an
event time, deduplicated on ``(guid, eventTime)`` after ``withWatermark("eventTime", ...)``.
An at-least-once producer sends events again: copies in the same file, in the next file, and
copies of the first file's events in the last one, behind the watermark (late: Spark drops
them). A pandas stage fails some copies once and others (poison) on every attempt; the
poisoned copies are removed from plain Spark's input.
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

FILES = 5
EVENTS = 12  # new events per file
SCHEMA = "guid long, eventTime timestamp, value long, seq long"
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)
WAIT = 600.0


def _poison(seq: int) -> bool:
    return seq % 13 == 5


def _write_input(tmp_path) -> int:
    """Event g of file f at 10 f + k/2 s, value 7 g; every third event sent twice in its file,
    every fourth again in the next file, and the first file's even events again in the last
    file (40 s behind: late)."""
    files: list[list[dict]] = [[] for _ in range(FILES)]
    seq = 0

    def send(f: int, g: int, t: dt.datetime) -> None:
        nonlocal seq
        files[f].append({"guid": g, "eventTime": t.isoformat(), "value": 7 * g, "seq": seq})
        seq += 1

    for f in range(FILES):
        for k in range(EVENTS):
            g = f * EVENTS + k
            t = T0 + dt.timedelta(seconds=10 * f + k / 2)
            send(f, g, t)
            if g % 3 == 0:
                send(f, g, t)
            if g % 4 == 0 and f + 1 < FILES:
                send(f + 1, g, t)
            if f == 0 and g % 2 == 0:
                send(FILES - 1, g, t)
    d = tmp_path / "events"
    d.mkdir()
    for f, rows in enumerate(files):
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
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


def _audit(pdf: pd.DataFrame) -> pd.DataFrame:
    """Another branch of the events, failing some of them on every attempt: their records are
    dead-lettered, so their copies may not count in the deduplication either."""
    bad = (pdf["seq"] % 11 == 3).to_numpy(bool)
    if bad.any():
        raise xorack.FailRecord("audit", rows=bad)
    return pdf


def _plain(spark, tmp_path, keys, watermark, name, dead=None, after=lambda df: df):
    """Plain Spark's query over the events but the poisoned ones (``dead``: those)."""
    from pyspark.sql import functions as F

    events = _read(spark, tmp_path)
    if dead is None:
        events = events.where(~(F.col("seq") % 13 == 5))
    else:
        events = events.where(~F.col("seq").isin(sorted(dead)))
    events = events.drop("seq")
    if watermark:
        events = events.withWatermark("eventTime", "10 seconds")
    rows = plain_rows(spark, after(events.dropDuplicates(keys)), name)
    return sorted((int(r.guid), r.eventTime, int(r.value)) for r in rows)


def _tracked(spark, tmp_path, keys, watermark, sink, audit=False, after=lambda df: df):
    p = Pipeline(spark, max_attempts=3)
    events = p.source(_read(spark, tmp_path), name="events", partitions=2)
    if watermark:
        events = events.withWatermark("eventTime", "10 seconds")
    checked = events.map_in_pandas(_flaky, SCHEMA, name="stage")
    after(checked.drop("seq").dropDuplicates(keys)).sink(sink, name="unique")
    if audit:
        out = str(tmp_path / "audit.parquet")
        audited = checked.map_in_pandas(_audit, SCHEMA, name="audit")
        # a transform that loses rows: their records time out (pending meanwhile), then die
        lossy = audited.transform(lambda df: df.where(df.seq % 17 != 8), name="lossy")
        lossy.sink(ParquetSink(out), name="audited")
    return p


def _dead(p) -> set[int]:
    return set(p.dead_letters().column("seq").to_pylist()) - {None}


def test_drop_duplicates_with_watermark_equals_plain_structured_streaming(
    spark, tmp_path, monkeypatch
):
    """Each (guid, eventTime) once, the late copies dropped as Spark drops them, the poisoned
    copies dead-lettered (their events still written from another copy) — also those that
    another branch of the pipeline dead-letters after their row was staged; the state
    compacted after every other emission."""
    from xorack.spark import stream_state

    monkeypatch.setattr(stream_state, "COMPACT_AFTER", 2)
    sent = _write_input(tmp_path)
    keys = ["guid", "eventTime"]
    out = str(tmp_path / "unique.parquet")
    p = _tracked(spark, tmp_path, keys, True, ParquetSink(out), audit=True)
    run = p.start_stream(timeout=6.0, available_now=True)
    report = run.wait(timeout=WAIT)

    dead = _dead(p)
    lost = {s for s in range(sent) if s % 17 == 8}
    # (a loaded machine can time out a record that is fine, up to max_attempts: then it is
    # dead-lettered too, and plain Spark's input leaves it out as well)
    assert dead >= {s for s in range(sent) if _poison(s) or s % 11 == 3} | lost
    want = _plain(spark, tmp_path, keys, True, "plain_dedup", dead=dead)
    assert len(want) > FILES * EVENTS // 2
    rows = spark.read.parquet(out).collect()
    got = sorted((int(r.guid), r.eventTime, int(r.value)) for r in rows)
    assert got == want
    assert report.lost == 0
    assert report.replayed > 0
    assert run.windows.compactions > 0


def _odd_values(df):
    return df.where("value % 2 = 1").withColumnRenamed("value", "v")


def test_drop_duplicates_then_a_filter_equals_plain_structured_streaming(spark, tmp_path):
    """``dropDuplicates`` followed by ``where`` and ``withColumnRenamed`` before the sink: the
    same rows as plain Structured Streaming's query minus the dead-lettered copies; each row
    keeps its key's id in the (idempotent) SQLite sink."""
    from pyspark.sql import functions as F

    sent = _write_input(tmp_path)
    keys = ["guid", "eventTime"]
    sink = SQLiteSink(str(tmp_path / "odd.db"), "odd")
    p = _tracked(spark, tmp_path, keys, True, sink, after=_odd_values)
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)

    dead = _dead(p)
    assert dead >= {s for s in range(sent) if _poison(s)}
    events = _read(spark, tmp_path).where(~F.col("seq").isin(sorted(dead))).drop("seq")
    odd = _odd_values(events.withWatermark("eventTime", "10 seconds").dropDuplicates(keys))
    want = sorted((int(r.guid), r.eventTime, int(r.v)) for r in plain_rows(spark, odd, "dedup_odd"))
    assert want
    assert all(v % 2 == 1 for _, _, v in want)
    frame = sink.read()
    got = sorted(
        (int(r.guid), pd.Timestamp(r.eventTime).to_pydatetime(), int(r.v))
        for r in frame.itertuples(index=False)
    )
    assert got == want
    assert report.lost == 0
    assert report.replayed > 0


def test_drop_duplicates_without_watermark_writes_each_key_once_while_running(spark, tmp_path):
    """No event time: a key is written once nothing is pending; a reader never sees a row taken
    back, and the late copies count (Spark has no watermark to drop them by)."""
    _write_input(tmp_path)
    want = _plain(spark, tmp_path, ["guid"], False, "plain_dedup_nowm")
    db = str(tmp_path / "unique.db")
    sink = SQLiteSink(db, "unique")
    p = _tracked(spark, tmp_path, ["guid"], False, sink)
    seen: list = []
    stop = threading.Event()

    def key(frame) -> list:
        return [(int(r.guid), int(r.value)) for r in frame.itertuples(index=False)]

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the table is created by start_stream
                seen.extend(key(sink.read()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = p.start_stream(timeout=60.0, available_now=True)
        report = run.wait(timeout=WAIT)
    finally:
        stop.set()
        watcher.join()
    got = key(sink.read())
    assert sorted(got) == sorted((g, v) for g, _, v in want)
    assert len(got) == len(set(got))  # each key once
    assert set(seen) <= set(got)
    assert report.lost == 0
    assert run.windows.deduped > 0


def test_stream_drop_duplicates_declarations_refused_in_one_line(spark, tmp_path):
    from pyspark.sql import functions as F

    from xorack.spark.stages import StageSchemaError

    _write_input(tmp_path)
    p = Pipeline(spark, ft=False)
    events = p.source(_read(spark, tmp_path), name="events")
    events.dropDuplicates(["guid"]).sink(SQLiteSink(str(tmp_path / "a.db"), "t"), name="out")
    with pytest.raises(ValueError, match="runs no stateful operation"):
        p.start_stream(available_now=True)

    p = Pipeline(spark)
    events = p.source(_read(spark, tmp_path), name="events")
    unique = events.dropDuplicates(["guid"])
    unique.withColumn("v2", F.col("value") * 2).map_in_pandas(
        _audit, SCHEMA + ", v2 long", name="late"
    ).sink(SQLiteSink(str(tmp_path / "b.db"), "t"), name="out")
    with pytest.raises(ValueError, match=r"'late' \(a pandas/Arrow stage\) after .* not supp"):
        p.start_stream(available_now=True)

    p = Pipeline(spark)
    events = p.source(_read(spark, tmp_path), name="events")
    unique = events.dropDuplicates(["guid"])
    unique.select("guid", F.explode(F.array("value", "seq")).alias("x")).sink(
        SQLiteSink(str(tmp_path / "c.db"), "t"), name="out"
    )
    with pytest.raises(ValueError, match="a generator"):
        p.start_stream(available_now=True)
    p = Pipeline(spark)
    events = p.source(_read(spark, tmp_path), name="events")
    events.dropDuplicates(["guid"]).where("value > 0").sink(
        SQLiteSink(str(tmp_path / "d.db"), "t"), name="out"
    )
    with pytest.raises(ValueError, match="in update mode are not supported"):
        p.start_stream(available_now=True, output_mode="update")

    p = Pipeline(spark)
    events = p.source(_read(spark, tmp_path), name="events")
    with pytest.raises(StageSchemaError, match=r"missing column\(s\) \['nope'\]"):
        events.dropDuplicates(["nope"])


def test_drop_duplicates_restarted_after_a_crash_mid_emission_writes_each_key_once(
    spark, tmp_path, monkeypatch
):
    """A driver crash after an emission wrote its rows into the sink and before it kept their
    keys: the restarted query (same checkpoint, more files since) takes the write back and
    does it again; the keys written before stay written, each key once."""

    _write_input(tmp_path)
    events = tmp_path / "events"
    later = tmp_path / "later"
    later.mkdir()
    for f in range(3, FILES):  # the last files come after the restart
        name = f"part-{f:02d}.json"
        os.replace(events / name, later / name)
    keys = ["guid", "eventTime"]
    checkpoint = str(tmp_path / "checkpoint")
    out = str(tmp_path / "unique.parquet")

    def start():
        p = Pipeline(spark, max_attempts=3)
        src = p.source(_read(spark, tmp_path), name="events", partitions=2)
        src = src.withWatermark("eventTime", "10 seconds")
        checked = src.map_in_pandas(_flaky, SCHEMA, name="stage").drop("seq")
        checked.dropDuplicates(keys).sink(ParquetSink(out), name="unique")
        run = p.start_stream(timeout=60.0, available_now=True, checkpoint_location=checkpoint)
        return run.wait(timeout=WAIT)

    from helpers.crashes import crash_after_dedup_write

    records = crash_after_dedup_write(monkeypatch)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.undo()
    assert len(records) >= 2
    for f in range(3, FILES):
        name = f"part-{f:02d}.json"
        os.replace(later / name, events / name)
    report = start()

    want = _plain(spark, tmp_path, keys, True, "plain_dedup_restart")
    rows = spark.read.parquet(out).collect()
    got = sorted((int(r.guid), r.eventTime, int(r.value)) for r in rows)
    assert got == want
    assert report.lost == 0


@pytest.mark.parametrize("seed", [7])
def test_drop_duplicates_under_a_random_split_into_micro_batches_equals_plain_spark(
    spark, tmp_path, seed
):
    """Property: the events (copies, late copies, poison, fail-once rows) cut at random into
    files of 1 to 20 events, one micro-batch each: the keys written equal plain Structured
    Streaming's over the same files, whatever the split."""
    from helpers.splits import resplit

    sent = _write_input(tmp_path)
    sizes = resplit(tmp_path / "events", seed, most=20)
    assert len(set(sizes)) > 1, sizes
    keys = ["guid", "eventTime"]
    want = _plain(spark, tmp_path, keys, True, "plain_split_dedup")
    out = str(tmp_path / "unique.parquet")
    p = _tracked(spark, tmp_path, keys, True, ParquetSink(out))
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    rows = spark.read.parquet(out).collect()
    assert sorted((int(r.guid), r.eventTime, int(r.value)) for r in rows) == want
    assert report.lost == 0
    assert _dead(p) == {s for s in range(sent) if _poison(s)}


def _fails_thrice(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack.spark import current_attempt

    bad = (pdf["guid"] == 1).to_numpy() & (current_attempt(pdf) <= 3)
    if bad.any():
        raise xorack.FailRecord("injected thrice", rows=bad)
    return pdf


def test_a_record_held_pending_past_spark_watermark_is_not_late(spark, tmp_path):
    """A record failing three times while later files move Spark's watermark far past its
    event time holds the watermark back at its own event time; its fourth attempt is on time
    (Spark read it on time) and its key is written, as plain Structured Streaming writes it."""
    from pyspark.sql import functions as F

    d = tmp_path / "events"
    d.mkdir()
    for f in range(6):
        rows = [{"guid": 2 * f + 1, "eventTime": (T0 + dt.timedelta(seconds=60 * f)).isoformat()}]
        rows.append(
            {"guid": 2 * f + 2, "eventTime": (T0 + dt.timedelta(seconds=60 * f + 1)).isoformat()}
        )
        path = d / f"part-{f:02d}.json"
        path.write_text("".join(json.dumps({**r, "value": 7, "seq": 0}) + "\n" for r in rows))
        at = time.time() - 3600 + f
        os.utime(path, (at, at))
    keys = ["guid", "eventTime"]
    plain = (
        _read(spark, tmp_path)
        .drop("seq")
        .withWatermark("eventTime", "10 seconds")
        .dropDuplicates(keys)
    )
    want = sorted(int(r.guid) for r in plain_rows(spark, plain, "plain_dedup_held"))
    assert 1 in want

    out = str(tmp_path / "held.parquet")
    p = Pipeline(spark, max_attempts=5)
    events = p.source(_read(spark, tmp_path), name="events", partitions=2)
    events = events.withWatermark("eventTime", "10 seconds")
    checked = events.map_in_pandas(_fails_thrice, SCHEMA, name="stage")
    checked.drop("seq").dropDuplicates(keys).sink(ParquetSink(out), name="unique")
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    got = sorted(int(r.guid) for r in spark.read.parquet(out).select(F.col("guid")).collect())
    assert report.dead_lettered == 0
    assert report.replayed >= 3
    assert got == want
