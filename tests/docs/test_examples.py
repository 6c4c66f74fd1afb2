"""The scripts of examples/ (Spark's own examples ported to xorack pipelines) run, and their
output is plain Spark's: the same job written in plain PySpark (batch) or plain Structured
Streaming (same source, same trigger, append mode) is the oracle. Each script's ``main`` runs on
the shared session (its ``SparkSession.builder.getOrCreate()`` finds it): argument parsing, the
sample input and the printed account included (a process of its own per script would cost a
Spark JVM start each)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pyspark.sql import functions as F

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name):
    spec = importlib.util.spec_from_file_location(f"xorack_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(df):
    return sorted(tuple(row) for row in df.collect())


def _plain_stream(df, out, checkpoint):
    """Run a plain Structured Streaming query into Parquet, as the examples' pipelines do."""
    query = (
        df.writeStream.format("parquet")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(out)
    )
    query.awaitTermination()


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == [
        "stream_static_join",
        "windowed_wordcount",
        "wordcount",
    ]


def test_wordcount(spark, tmp_path, capsys):
    wordcount = _example("wordcount")
    text = tmp_path / "in.txt"
    text.write_text(wordcount.SAMPLE + "\nto be or not to be\n")
    out = str(tmp_path / "counts")
    assert wordcount.main([str(text), "--out", out]) == 0
    plain = spark.read.text(str(text)).select(F.explode(F.split("value", " ")).alias("word"))
    expected = _rows(plain.groupBy("word").count())
    assert _rows(spark.read.parquet(out)) == expected
    assert ("was", 6) in expected
    assert "lost 0" in capsys.readouterr().out


def test_windowed_wordcount(spark, tmp_path):
    windowed = _example("windowed_wordcount")
    inbox = str(tmp_path / "in")
    windowed.write_sample(inbox)
    out = str(tmp_path / "counts")
    assert windowed.main([inbox, "--out", out]) == 0

    lines = windowed.read_lines(spark, inbox).withWatermark("ts", "5 seconds")
    words = lines.select("ts", F.explode(F.split("line", " ")).alias("word"))
    counts = words.groupBy(F.window("ts", "10 seconds", "5 seconds"), "word").count()
    _plain_stream(counts, str(tmp_path / "plain"), str(tmp_path / "checkpoint"))
    expected = _rows(spark.read.parquet(str(tmp_path / "plain")))
    assert expected, "plain Spark closed no window: the sample is too small to compare"
    assert _rows(spark.read.parquet(out)) == expected


@pytest.mark.parametrize("how", ["inner", "left_outer"])
def test_stream_static_join(spark, tmp_path, how):
    join = _example("stream_static_join")
    inbox = str(tmp_path / "in")
    join.write_sample(inbox)
    out = str(tmp_path / "enriched")
    assert join.main([inbox, "--out", out, "--how", how]) == 0

    clicks = join.read_clicks(spark, inbox)
    plain = clicks.join(join.static_ads(spark), "ad_id", how)
    plain = plain.withColumn("campaign", F.upper("campaign"))
    _plain_stream(plain, str(tmp_path / "plain"), str(tmp_path / "checkpoint"))
    expected = _rows(spark.read.parquet(str(tmp_path / "plain")))
    assert len(expected) == (12 if how == "inner" else 15)  # ad 4 is not in the table
    assert _rows(spark.read.parquet(out)) == expected
