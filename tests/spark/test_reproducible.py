"""What a replay cannot reproduce — an expression that reads the row's file, partition or
position, draws at random or reads the time of the query — is refused at declaration wherever a
tracked pipeline evaluates it (row operations, transforms, aggregates), in one line that says to
compute it on the input before ``p.source(...)``; and computed there it is exact: a replayed
record reads its persisted value, in optimistic and tracked rounds, equal to plain Spark.
``spark.speculation=true`` is refused at the start of a run."""

from __future__ import annotations

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


def _events(spark, n: int = 60):
    rows = [(i, i % 4) for i in range(n)]
    return spark.createDataFrame(rows, "x long, k long").withColumn(
        "ts", F.timestamp_seconds(F.col("x"))
    )


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.mark.parametrize(
    ("declare", "words"),
    [
        # the time of the query (deterministic to Spark, a constant per query: per round here)
        (lambda t: t.withColumn("at", F.current_timestamp()), "current_timestamp.*time of the"),
        (lambda t: t.where(F.col("ts") < F.date_add(F.current_date(), 1)), "current_date"),
        # a transform's own expressions (applied to each round's frames)
        (
            lambda t: t.transform(lambda df: df.withColumn("x", F.monotonically_increasing_id())),
            "transform.*monotonically_increasing_id",
        ),
        (lambda t: t.transform(lambda df: df.where(F.rand(3) < 0.5)), "transform.*rand"),
        (
            lambda t: t.transform(lambda df: df.withColumn("k", F.spark_partition_id() + 0)),
            "SPARK_PARTITION_ID",
        ),
        # an aggregate's expressions (Spark itself refuses a random argument of an aggregate)
        (
            lambda t: t.groupBy("k").agg(F.sum(F.when(F.col("ts") < F.current_timestamp(), 1))),
            "groupBy.*current_timestamp",
        ),
        (lambda t: t.groupBy("k").agg((F.max("x") + F.rand(1)).alias("r")), "groupBy.*rand"),
        (
            lambda t: t.groupBy().agg((F.max("x") + F.length(F.input_file_name())).alias("r")),
            "input_file_name",
        ),
    ],
)
def test_what_a_replay_cannot_reproduce_is_refused_in_one_line(spark, declare, words):
    p = Pipeline(spark)
    t = p.source(_events(spark), name="events")
    with pytest.raises(TrackedOperationError, match=words) as caught:
        declare(t)
    message = str(caught.value)
    assert "\n" not in message
    assert "before p.source(...)" in message


def test_current_user_and_deterministic_expressions_are_accepted(spark):
    p = Pipeline(spark)
    t = p.source(_events(spark), name="events")
    t.withColumn("who", F.expr("current_user()")).where(F.col("x") > 1).groupBy("k").agg(
        F.first("x").alias("x"), F.collect_list("x").alias("xs")
    )
    t.transform(lambda df: df.repartition(2, "k"))


def _fail_first_round(pdf):
    """Fails every fifth row on its first attempt (a transient failure): replayed."""
    if current_round() == 0 and "_ft_src" in pdf.columns:
        bad = (pdf["x"] % 5 == 1).to_numpy()
        if bad.any():
            raise xorack.FailRecord("transient", rows=bad)
    return pdf


def _input(spark, tmp_path):
    """Four files of 40 rows; the file and a row id computed on the input DataFrame."""
    files = tmp_path / "in"
    files.mkdir()
    for k in range(4):
        lines = [f'{{"x": {x}}}' for x in range(k * 40, (k + 1) * 40)]
        (files / f"part{k}.json").write_text("\n".join(lines) + "\n")
    return (
        spark.read.schema("x long")
        .json(str(files))
        .withColumn("file", F.input_file_name())
        .withColumn("row_id", F.monotonically_increasing_id())
    )


@pytest.mark.parametrize("mode", ["optimistic", "fallback", "tracked"])
def test_file_names_and_row_ids_computed_before_the_source_are_exact_under_replays(
    spark, tmp_path, mode
):
    """Computed on the input, ``input_file_name()`` and ``monotonically_increasing_id()`` are
    part of each record's persisted payload: a replay reads them from the FT layer, not the file
    (after a tracked source the file reads ''), and keeps its first id (after one, a replay
    would draw an id of another row). In an optimistic round with nothing failed, one that
    falls back, and tracked rounds only: every row once, with plain Spark's values."""
    inp = _input(spark, tmp_path)
    p = Pipeline(spark, optimistic=mode != "tracked")
    src = p.source(inp, name="lines")
    rows = src if mode == "optimistic" else src.map_in_pandas(_fail_first_round, src.schema)
    rows.sink(ParquetSink(str(tmp_path / "rows")), name="rows")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 0
    if mode == "optimistic":
        assert report.optimistic_rounds > 0
        assert report.replayed == 0
    else:
        assert report.replayed > 0
    got = spark.read.parquet(str(tmp_path / "rows")).select("x", "file", "row_id")
    assert _rows(got) == _rows(inp.select("x", "file", "row_id"))
    assert got.select("row_id").distinct().count() == 160
    by_file = Counter(f for _, f, _ in _rows(got).elements())
    assert sorted(by_file.values()) == [40] * 4
    assert all(f.endswith(".json") for f in by_file)


def test_speculation_is_refused_at_the_start_of_a_run(spark, tmp_path):
    """A speculative copy of a task running beside it sends the events of its rows twice
    (and an optimistic round's checks do not cover it): refused, before any Spark job."""
    conf = spark.sparkContext._conf  # the live SparkConf the scheduler reads
    before = conf.get("spark.speculation")
    p = Pipeline(spark)
    p.source(_events(spark), name="events").groupBy("k").count().sink(
        ParquetSink(str(tmp_path / "o"))
    )
    conf.set("spark.speculation", "true")
    try:
        with pytest.raises(ValueError, match=r"spark\.speculation=true is not supported") as e:
            p.run()
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=r"spark\.speculation"):
            p.start_stream()
    finally:
        if before is None:
            conf._jconf.remove("spark.speculation")
        else:
            conf.set("spark.speculation", before)
    assert not (tmp_path / "o").exists()
