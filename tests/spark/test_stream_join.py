"""Stream-stream joins of two tracked streams, against plain Structured Streaming (and Spark's
batch join of the same rows) as the oracle.

Spark's ad-monetization example of its streaming guide, ported: impressions and clicks, each a
file stream with a watermark, joined on the ad and a time range (a click within 20 s of its
impression), inner and left outer. Each side has a pandas stage that fails some rows once and
others (poison) on every attempt; the poisoned records are removed from plain Spark's input.
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
ADS = 16  # impressions per file
IMP_SCHEMA = "adId long, impressionTime timestamp"
CLICK_SCHEMA = "clickAdId long, clickTime timestamp, cid long"
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)
WAIT = 600.0
CONDITION = (
    "clickAdId = adId AND clickTime >= impressionTime AND "
    "clickTime <= impressionTime + interval 20 seconds"
)


def _poison_ad(i: int) -> bool:
    return i % 23 == 7


def _poison_click(c: int) -> bool:
    return c % 19 == 4


def _write(directory, rows_of_file) -> None:
    directory.mkdir(parents=True)
    for f, rows in enumerate(rows_of_file):
        path = directory / f"part-{f:02d}.json"
        with open(path, "w") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
        at = time.time() - 3600 + f  # a file source reads the oldest file first
        os.utime(path, (at, at))


def _write_input(tmp_path):
    """Impression i (file f) at 10 f + k/2 s; most ads get a click 0 to 24 s later (those after
    20 s do not match), written in the file of its time (the last file at the latest)."""
    imps: list[list[dict]] = [[] for _ in range(FILES)]
    clicks: list[list[dict]] = [[] for _ in range(FILES)]
    for f in range(FILES):
        for k in range(ADS):
            i = f * ADS + k
            t = T0 + dt.timedelta(seconds=10 * f + k / 2)
            imps[f].append({"adId": i, "impressionTime": t.isoformat()})
            if i % 3 == 0:
                continue  # no click
            delay = (i % 7) * 4
            ct = t + dt.timedelta(seconds=delay)
            cf = min(int((ct - T0).total_seconds() // 10), FILES - 1)
            clicks[cf].append({"clickAdId": i, "clickTime": ct.isoformat(), "cid": 1000 + i})
    for rows in clicks:
        rows.sort(key=lambda r: r["clickTime"])
    _write(tmp_path / "imps", imps)
    _write(tmp_path / "clicks", clicks)


def _read(spark, directory, schema):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(directory))


def _flaky(column: str, poison):
    def fn(pdf: pd.DataFrame) -> pd.DataFrame:
        from xorack.spark import current_attempt

        attempt = current_attempt(pdf)
        bad = pdf[column].map(poison).to_numpy(bool)
        bad |= (pdf[column] % 5 == 0).to_numpy() & (attempt == 1)
        if bad.any():
            raise xorack.FailRecord("injected", rows=bad)
        return pdf

    return fn


def _clean(imps, clicks):
    from pyspark.sql import functions as F

    bad_ads = [i for i in range(FILES * ADS) if _poison_ad(i)]
    bad_clicks = [1000 + i for i in range(FILES * ADS) if _poison_click(1000 + i)]
    return imps.where(~F.col("adId").isin(bad_ads)), clicks.where(~F.col("cid").isin(bad_clicks))


def _plain(spark, tmp_path, how, name, after=None):
    from pyspark.sql import functions as F

    imps, clicks = _clean(
        _read(spark, tmp_path / "imps", IMP_SCHEMA), _read(spark, tmp_path / "clicks", CLICK_SCHEMA)
    )
    joined = imps.withWatermark("impressionTime", "10 seconds").join(
        clicks.withWatermark("clickTime", "5 seconds"), F.expr(CONDITION), how
    )
    if after is not None:
        joined = after(joined)
    rows = plain_rows(spark, joined, name)
    return rows if after is not None else sorted(map(_key, rows))


def _batch(spark, tmp_path, how):
    from pyspark.sql import functions as F

    imps, clicks = _clean(
        spark.read.schema(IMP_SCHEMA).json(str(tmp_path / "imps")),
        spark.read.schema(CLICK_SCHEMA).json(str(tmp_path / "clicks")),
    )
    return sorted(map(_key, imps.join(clicks, F.expr(CONDITION), how).collect()))


NONE = -1  # a left row without a match: its click columns are null
NEVER = dt.datetime(1970, 1, 1)


def _key(r) -> tuple:
    def n(v):
        return NONE if v is None else int(v)

    return (int(r[0]), r[1], n(r[2]), NEVER if r[3] is None else r[3], n(r[4]))


def _rows(frame) -> list:
    """A SQLite sink's rows as :func:`_key` tuples."""

    def stamp(v):
        return None if pd.isna(v) else pd.Timestamp(v).to_pydatetime()

    def num(v):
        return None if pd.isna(v) else int(v)

    return [
        _key((r.adId, stamp(r.impressionTime), num(r.clickAdId), stamp(r.clickTime), num(r.cid)))
        for r in frame.itertuples(index=False)
    ]


def _tracked(spark, tmp_path, how, sink, after=lambda df: df):
    from pyspark.sql import functions as F

    p = Pipeline(spark, max_attempts=3)
    imps = p.source(_read(spark, tmp_path / "imps", IMP_SCHEMA), name="imps", partitions=2)
    clicks = p.source(_read(spark, tmp_path / "clicks", CLICK_SCHEMA), name="clicks", partitions=2)
    imps = imps.withWatermark("impressionTime", "10 seconds").map_in_pandas(
        _flaky("adId", _poison_ad), IMP_SCHEMA, name="imp_stage"
    )
    clicks = clicks.withWatermark("clickTime", "5 seconds").map_in_pandas(
        _flaky("cid", _poison_click), CLICK_SCHEMA, name="click_stage"
    )
    after(imps.join(clicks, F.expr(CONDITION), how)).sink(sink, name="joined")
    return p


def test_inner_join_equals_plain_structured_streaming_under_failures(spark, tmp_path, monkeypatch):
    """Also with the join's state compacted after every other emission (the rows no row that
    can still come could meet leave)."""
    from xorack.spark import stream_state

    monkeypatch.setattr(stream_state, "COMPACT_AFTER", 2)
    _write_input(tmp_path)
    plain = _plain(spark, tmp_path, "inner", "plain_inner_join")
    want = _batch(spark, tmp_path, "inner")
    assert plain == want  # no late row: plain Spark writes every match
    out = str(tmp_path / "joined.parquet")
    p = _tracked(spark, tmp_path, "inner", ParquetSink(out))
    run = p.start_stream(timeout=60.0, available_now=True)
    report = run.wait(timeout=WAIT)

    got = sorted(map(_key, spark.read.parquet(out).collect()))
    assert got == want  # every pair once
    assert report.lost == 0
    assert report.replayed > 0
    dead_ads = set(p.dead_letters().column("adId").to_pylist()) - {None}
    dead_clicks = set(p.dead_letters().column("cid").to_pylist()) - {None}
    assert dead_ads == {i for i in range(FILES * ADS) if _poison_ad(i)}
    assert dead_clicks == {
        1000 + i for i in range(FILES * ADS) if i % 3 and _poison_click(1000 + i)
    }
    assert run.windows.compactions > 0


def test_left_outer_join_writes_unmatched_rows_once_no_click_can_come(spark, tmp_path):
    """The matched pairs are Spark's; an impression without a click is written (with nulls)
    once the watermark tells that no click can still match it — by Spark's own reasoning on
    the time range — and the ones plain Spark wrote are among them."""
    _write_input(tmp_path)
    plain = _plain(spark, tmp_path, "left_outer", "plain_outer_join")
    every = _batch(spark, tmp_path, "left_outer")
    db = str(tmp_path / "joined.db")
    sink = SQLiteSink(db, "joined")
    p = _tracked(spark, tmp_path, "left_outer", sink)
    seen: list = []  # every row a reader saw while the stream ran
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the table is created by start_stream
                seen.extend(_rows(sink.read()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = p.start_stream(timeout=60.0, available_now=True)
        report = run.wait(timeout=WAIT)
    finally:
        stop.set()
        watcher.join()

    got = sorted(_rows(sink.read()))
    assert seen  # the reader saw rows while the stream ran
    assert set(seen) <= set(got)  # and only final ones: none taken back later
    matched = [r for r in every if r[2] != NONE]
    assert [r for r in got if r[2] != NONE] == matched
    lonely = [r for r in got if r[2] == NONE]
    # left rows at or below the left state watermark (the watermark - 20 s - 1 ms) can meet
    # no click that can still come
    bound = run.windows.watermark - dt.timedelta(seconds=20, milliseconds=1)
    assert lonely == [r for r in every if r[2] == NONE and r[1] <= bound]
    assert lonely  # some were written
    assert {r for r in plain if r[2] == NONE} <= set(lonely)  # what plain Spark wrote
    assert [r for r in plain if r[2] != NONE] == matched
    assert report.lost == 0


def _latency(joined):
    """A user's operations after the join: the click's latency, in seconds."""
    from pyspark.sql import functions as F

    seconds = F.unix_timestamp("clickTime") - F.unix_timestamp("impressionTime")
    return joined.withColumn("latency", seconds).drop("clickAdId")


def test_inner_join_then_with_column_equals_plain_structured_streaming(spark, tmp_path):
    """A stream-stream join followed by ``withColumn`` (and ``drop``) before an idempotent
    sink, under failures: plain Structured Streaming's rows for the input minus the poison,
    each pair once."""
    _write_input(tmp_path)
    rows = _plain(spark, tmp_path, "inner", "plain_latency", after=_latency)
    want = sorted((int(r.adId), int(r.cid), int(r.latency)) for r in rows)
    assert want
    assert any(w[2] for w in want)
    sink = SQLiteSink(str(tmp_path / "latency.db"), "latency")
    p = _tracked(spark, tmp_path, "inner", sink, after=_latency)
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)

    frame = sink.read()
    assert list(frame.columns) == ["adId", "impressionTime", "clickTime", "cid", "latency"]
    got = sorted((int(r.adId), int(r.cid), int(r.latency)) for r in frame.itertuples(index=False))
    assert got == want  # every pair once, with its latency
    assert report.lost == 0
    assert report.replayed > 0


def test_stream_join_declarations_refused_in_one_line(spark, tmp_path):
    from pyspark.sql import functions as F

    from xorack.spark import TrackedOperationError

    _write_input(tmp_path)

    def sides(wm_imps=True, wm_clicks=True):
        p = Pipeline(spark)
        imps = p.source(_read(spark, tmp_path / "imps", IMP_SCHEMA), name="imps")
        clicks = p.source(_read(spark, tmp_path / "clicks", CLICK_SCHEMA), name="clicks")
        if wm_imps:
            imps = imps.withWatermark("impressionTime", "10 seconds")
        if wm_clicks:
            clicks = clicks.withWatermark("clickTime", "5 seconds")
        return imps, clicks

    imps, clicks = sides(wm_clicks=False)
    with pytest.raises(TrackedOperationError, match="has no watermark"):
        imps.join(clicks, F.expr(CONDITION))
    imps, clicks = sides()
    with pytest.raises(TrackedOperationError, match="time-range condition"):
        imps.join(clicks, F.expr("clickAdId = adId"), "left_outer")
    with pytest.raises(TrackedOperationError, match="inner or left"):
        imps.join(clicks, F.expr(CONDITION), "left_anti")
    with pytest.raises(TrackedOperationError, match="watermark"):
        imps.groupBy(F.window("impressionTime", "10 seconds")).count()


def test_inner_join_of_two_sources_over_the_same_rows(spark, tmp_path):
    """Both sides read the same rows of one directory (the clicks are the impressions seen
    3 s later): the pairs equal Spark's batch join."""
    from pyspark.sql import functions as F

    _write_input(tmp_path)

    def sides(reader):
        imps = reader(tmp_path / "imps")
        clicks = reader(tmp_path / "imps").selectExpr(
            "adId AS clickAdId",
            "impressionTime + INTERVAL 3 SECONDS AS clickTime",
            "adId + 1000 AS cid",
        )
        return _clean(imps, clicks)

    imps, clicks = sides(lambda d: spark.read.schema(IMP_SCHEMA).json(str(d)))
    want = sorted(map(_key, imps.join(clicks, F.expr(CONDITION)).collect()))
    assert want
    p = Pipeline(spark, max_attempts=3)
    imps, clicks = sides(lambda d: _read(spark, d, IMP_SCHEMA))
    imps = p.source(imps, name="imps").withWatermark("impressionTime", "10 seconds")
    clicks = p.source(clicks, name="clicks").withWatermark("clickTime", "5 seconds")
    imps = imps.map_in_pandas(_flaky("adId", _poison_ad), IMP_SCHEMA, name="imp_stage")
    clicks = clicks.map_in_pandas(_flaky("cid", _poison_click), CLICK_SCHEMA, name="click_stage")
    out = str(tmp_path / "joined.parquet")
    imps.join(clicks, F.expr(CONDITION), "inner").sink(ParquetSink(out), name="joined")
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    got = sorted(map(_key, spark.read.parquet(out).collect()))
    assert got == want
    assert report.lost == 0
