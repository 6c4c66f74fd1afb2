"""The tracked rounds after an optimistic round that failed rows (issue 27, item 4), on real
local Spark: the first tracked round combines its partial aggregates over small chunks, so a
few failed records replay few innocent ones, and the result equals plain Spark over the records
that were not dead-lettered."""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, Reason, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 2000
FLAKY = (7, 1507)  # fail their first attempt
POISON = (1203,)  # fail every attempt


def _lines(spark):
    rows = [(i, " ".join(f"w{(i * 7 + j) % 13}" for j in range(1 + i % 5))) for i in range(N)]
    return spark.createDataFrame(rows, "id long, line string").repartition(2)


def _faulty(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = pdf["id"].isin(POISON) | (pdf["id"].isin(FLAKY) & (current_round() == 0))
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad.to_numpy())
    return pdf


def _counts(lines):
    words = lines.select("id", F.explode(F.split("line", " ")).alias("word"))
    return words.groupBy("word").agg(
        F.count("*").alias("n"), F.sum("id").alias("ids"), F.max("id").alias("top")
    )


def test_a_few_failed_rows_replay_few_innocent_records(spark, tmp_path):
    p = Pipeline(spark)  # chunk_records=1024: a failed record once tainted up to 1023 others
    sink = ParquetSink(str(tmp_path / "out"))
    src = p.source(_lines(spark), name="lines")
    faulty = src.map_in_pandas(_faulty, src.schema, name="faulty")
    _counts(faulty).sink(sink, name="counts")
    report = p.run()

    assert report.optimistic_rounds == 0
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert report.lost == 0
    assert report.source_records == N
    assert report.dead_lettered == len(POISON)
    # the failed records and their chunk-mates: at most 32 records per chunk holding a failure
    chunks = len(FLAKY) + len(POISON)
    assert 0 < report.replayed <= chunks * 32 + len(POISON) * report.rounds, report.as_dict()
    kept = _lines(spark).where(~F.col("id").isin(list(POISON)))
    got = Counter(tuple(r) for r in sink.read(spark).collect())
    assert got == Counter(tuple(r) for r in _counts(kept).collect())
