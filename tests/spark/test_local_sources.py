"""Sources whose rows Spark holds on the driver (a local relation: ``createDataFrame`` of an
Arrow table or a pandas frame, ``VALUES``), on real local Spark: Spark's optimizer folds a
projection over such a relation into it on the driver, where ``spark_partition_id()`` is 0 for
every row, while the scan still reads the rows in several tasks. Every row must keep an id of
its own (a shared id once dropped rows silently with ``lost == 0``): each job equals plain
Spark, with nothing lost or repeated."""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest

from xorack.spark import ParquetSink, Pipeline

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LINES = [f"l{i % 5}" for i in range(11)]  # repeated lines: the counts show a dropped row


def _arrow(spark):
    return spark.createDataFrame(pa.table({"line": LINES}), "line string")


SOURCES = {
    "arrow": _arrow,
    "pandas": lambda spark: spark.createDataFrame(pd.DataFrame({"line": LINES}), "line string"),
    "values": lambda spark: spark.sql(
        "SELECT * FROM VALUES " + ", ".join(f"('{x}')" for x in LINES) + " AS t(line)"
    ),
    "arrow-filtered": lambda spark: _arrow(spark).where(F.col("line") != "none"),
}


@pytest.mark.parametrize("construction", sorted(SOURCES))
def test_local_source_rows_keep_ids_of_their_own(spark, tmp_path, construction):
    df = SOURCES[construction](spark)
    assert df.rdd.getNumPartitions() >= 2  # the rows are read in several tasks
    p = Pipeline(spark, optimistic=False)  # tracked rounds draw position ids
    counted = p.source(df, name="lines").groupBy("line").agg(F.count("*").alias("n"))
    counted.sink(ParquetSink(str(tmp_path / "out")), name="out")
    report = p.run()

    expected = Counter(tuple(r) for r in df.groupBy("line").agg(F.count("*").alias("n")).collect())
    got = Counter(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == expected
    rows = df.count()
    assert report.lost == 0
    assert report.repeats == 0
    assert report.source_records == rows
    assert report.completed == rows
