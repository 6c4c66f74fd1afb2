"""What a tracked pipeline cannot guarantee is refused at declaration, in one line: row
operations that Spark rewrites with rows the lineage cannot see (time windows), non-deterministic
expressions (a replay would not reproduce them), a streaming lookup side, a streaming checkpoint
without a resumable job. And the ways around them the errors name work, under replays, equal to
plain Spark."""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections import Counter

import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, TrackedOperationError, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE = dt.datetime(2026, 1, 1)


def _events(spark, n: int = 200):
    rows = [(i, None if i % 10 == 0 else BASE + dt.timedelta(seconds=i)) for i in range(n)]
    return spark.createDataFrame(rows, "x long, ts timestamp").repartition(2)


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.mark.parametrize(
    ("declare", "words"),
    [
        (lambda t: t.select("x", F.window("ts", "20 seconds", "10 seconds")), "sliding window"),
        (lambda t: t.select("x", F.window("ts", "10 seconds").alias("w")), "F.window filters"),
        (lambda t: t.withColumn("w", F.window("ts", "10 seconds")), "F.window filters"),
        (lambda t: t.withColumn("id", F.monotonically_increasing_id()), "non-deterministic"),
        (lambda t: t.select("x", F.input_file_name().alias("f")), "non-deterministic"),
        (lambda t: t.where(F.rand(7) < 0.5), "non-deterministic"),
        (lambda t: t.withColumn("u", F.expr("uuid()")), "non-deterministic"),
    ],
)
def test_a_row_operation_a_replay_cannot_reproduce_is_refused(spark, declare, words):
    p = Pipeline(spark)
    t = p.source(_events(spark), name="events")
    with pytest.raises(TrackedOperationError, match=words):
        declare(t)


def test_with_ft_off_the_same_operations_are_plain_spark(spark, tmp_path):
    p = Pipeline(spark, ft=False)
    t = p.source(_events(spark), name="events")
    t.select("x", F.window("ts", "10 seconds").alias("w")).sink(ParquetSink(str(tmp_path / "o")))
    p.run()
    plain = _events(spark).select("x", F.window("ts", "10 seconds").alias("w"))
    assert _rows(spark.read.parquet(str(tmp_path / "o"))) == _rows(plain)


def _fail_first_round(pdf):
    """Fails every fifth row on its first attempt (a transient failure): replayed once."""
    if current_round() == 0:
        bad = (pdf["x"] % 5 == 1).to_numpy()
        if bad.any():
            raise xorack.FailRecord("transient", rows=bad)
    return pdf


def test_window_bounds_from_the_time_are_exact_under_replays(spark, tmp_path):
    """The way around F.window the error names: the bounds computed from the time."""
    start = F.timestamp_seconds(F.floor(F.unix_timestamp("ts") / 10) * 10)

    def windowed(df):
        return df.where(F.col("x") % 3 != 0).withColumn("start", start).groupBy("start").count()

    p = Pipeline(spark)
    src = p.source(_events(spark), name="events")
    staged = src.map_in_pandas(_fail_first_round, src.schema, name="flaky")
    windowed(staged).sink(ParquetSink(str(tmp_path / "o")))
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.timed_out == 0
    assert report.replayed > 0
    got = _rows(spark.read.parquet(str(tmp_path / "o")))
    assert got == _rows(windowed(_events(spark)))


def test_input_file_name_before_the_source_is_kept_through_replays(spark, tmp_path):
    """The way around input_file_name() after p.source(): on the input, where each record's
    value is persisted with it (a replay comes from the FT layer's copy, not the file)."""
    files = tmp_path / "in"
    for k in range(4):
        spark.range(k * 100, (k + 1) * 100).selectExpr("id AS x").coalesce(1).write.json(
            str(files / f"part{k}")
        )
    inp = spark.read.json(str(files / "*")).withColumn("file", F.input_file_name())
    p = Pipeline(spark)
    src = p.source(inp, name="lines")
    staged = src.map_in_pandas(_fail_first_round, src.schema, name="flaky")
    staged.groupBy("file").count().sink(ParquetSink(str(tmp_path / "o")))
    report = p.run()
    assert report.replayed > 0
    assert report.lost == 0
    got = _rows(spark.read.parquet(str(tmp_path / "o")))
    assert got == _rows(inp.groupBy("file").count())
    assert sorted(n for _, n in got) == [100, 100, 100, 100]
    assert all(os.path.basename(f).startswith("part-") for f, _ in got)


def test_a_streaming_lookup_side_is_refused(spark, tmp_path):
    stream = spark.readStream.schema("x long").json(str(tmp_path))
    p = Pipeline(spark)
    t = p.source(_events(spark), name="events")
    with pytest.raises(TrackedOperationError, match="streaming DataFrame"):
        t.join(stream, "x")


def test_a_streaming_checkpoint_that_cannot_keep_the_ft_state_is_refused(spark, tmp_path):
    """The default keeps the FT state inside a local checkpoint; a checkpoint elsewhere, or
    settings that are neither the default nor resumable, would lose pending records."""
    from xorack.spark import SQLiteSink

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    stream = spark.readStream.schema("x long").json(str(inbox))
    p = Pipeline(spark, storage=f"sqlite:///{tmp_path / 'ft.db'}")
    p.source(stream, name="s").sink(SQLiteSink(str(tmp_path / "o.db"), "o"))
    with pytest.raises(ValueError, match="resume=True"):
        p.start_stream(checkpoint_location=str(tmp_path / "checkpoint"))
    p = Pipeline(spark)
    p.source(stream, name="s").sink(SQLiteSink(str(tmp_path / "o.db"), "o"))
    with pytest.raises(ValueError, match="resume=True"):
        p.start_stream(checkpoint_location="hdfs://nowhere/checkpoint")


class _TypedSinkOfOnesOwn:
    """A sink written before capabilities: typed by its create's signature, no check_schema."""

    def create(self, columns, schema=None):
        self.created = (list(columns), schema)

    def open_writer(self, partition):
        raise NotImplementedError


def test_a_typed_sink_of_ones_own_without_check_schema_is_accepted(spark):
    p = Pipeline(spark)
    p.source(_events(spark), name="events").sink(_TypedSinkOfOnesOwn(), name="mine")
    assert "sink 'mine'" in p.explain()
