"""Pipeline options from Spark configuration (``spark.xorack.*``, :mod:`xorack.spark.conf`) on
the shared session, set for the test and unset after: a run follows them (its dead letters
used the configured attempts, its sink equals plain Spark over the input minus them), an
explicit argument wins, and an unknown key or a bad value is a one-line error naming the key."""

from __future__ import annotations

import contextlib
import inspect
import sys

import pandas as pd
import pytest

from xorack.spark import Pipeline, SQLiteSink
from xorack.spark.conf import PARSERS, conf_key

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BAD = 13  # the record that fails on every attempt


@contextlib.contextmanager
def xorack_conf(spark, entries: dict[str, str]):
    """``entries`` set on the session's configuration for the block, unset after."""
    for key, value in entries.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in entries:
            spark.conf.unset(key)


def test_every_pipeline_option_has_a_configuration_key():
    options = [name for name in inspect.signature(Pipeline).parameters if name != "spark"]
    assert sorted(options) == sorted(PARSERS)
    assert conf_key("max_attempts") == "spark.xorack.maxAttempts"
    assert conf_key("runaway_share") == "spark.xorack.runawayShare"


def fail_one(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack import FailRecord

    bad = (pdf["id"] == BAD).to_numpy()
    if bad.any():
        raise FailRecord("always fails", rows=bad)
    return pdf.assign(y=pdf["id"] * 2)


def test_a_run_follows_the_configuration_and_arguments_win(spark, tmp_path):
    entries = {
        "spark.xorack.maxAttempts": "2",
        "spark.xorack.optimistic": "false",
        "spark.xorack.runawayShare": "none",
    }
    with xorack_conf(spark, entries):
        assert Pipeline(spark, max_attempts=4, optimistic=True).max_attempts == 4
        p = Pipeline(spark)
        assert (p.max_attempts, p.optimistic, p.config.runaway_share) == (2, False, None)
        rows = spark.range(30, numPartitions=2)
        sink = SQLiteSink(str(tmp_path / "out.db"), "t")
        p.source(rows, name="ids").map_in_pandas(fail_one, "id long, y long", name="f").sink(
            sink, name="out"
        )
        report = p.run()
    assert report.lost == 0
    dead = p.dead_letters().to_pandas()
    assert dead["id"].tolist() == [BAD]
    assert dead["_ft_attempts"].tolist() == [2]  # the configured attempts
    plain = rows.where(F.col("id") != BAD).select("id", (F.col("id") * 2).alias("y"))
    expected = sorted(tuple(r) for r in plain.collect())
    stored = sink.read()
    assert sorted(zip(stored["id"], stored["y"], strict=True)) == expected


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            {"spark.xorack.maxAtempts": "3"},
            "unknown Spark configuration key spark.xorack.maxAtempts for xorack "
            "(did you mean spark.xorack.maxAttempts?)",
        ),
        (
            {"spark.xorack.maxAttempts": "three"},
            "Spark configuration spark.xorack.maxAttempts='three': expected an integer, "
            "got 'three'",
        ),
        (
            {"spark.xorack.resume": "yes"},
            "Spark configuration spark.xorack.resume='yes': expected true or false, got 'yes'",
        ),
        (
            {"spark.xorack.maxAttempts": "0", "spark.xorack.idSalt": "3"},
            "max_attempts must be >= 1, got 0 (from Spark configuration "
            "spark.xorack.maxAttempts='0')",
        ),
        (
            {"spark.xorack.chunkRecords": "100"},
            "chunk_records must be a power of two from 1 to 1024, got 100 (from Spark "
            "configuration spark.xorack.chunkRecords='100')",
        ),
    ],
)
def test_an_unknown_key_or_a_bad_value_names_the_key(spark, entries, message):
    with xorack_conf(spark, entries), pytest.raises(ValueError) as caught:
        Pipeline(spark)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_an_explicit_argument_is_not_checked_against_the_configuration(spark):
    """A value the constructor was given wins, even where the configuration's is bad."""
    with xorack_conf(spark, {"spark.xorack.maxAttempts": "zero"}):
        assert Pipeline(spark, max_attempts=3).max_attempts == 3
