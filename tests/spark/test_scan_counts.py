"""A phase of Spark's own operations only counts a source of files apart from its optimistic
round (xorack.spark.optimistic.ScanCount): from local Parquet footers, else by a count job
beside the round. The round's plan then holds no observed metric between the files and the
query's filter, so Spark pushes the filter into the scan as plain Spark does; the report's
record count equals Spark's own count of the input."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from xorack.spark import ParquetSink, Pipeline, optimistic
from xorack.spark.optimistic import RoundAccount, ScanCount, file_scan, footer_rows, observed

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 5000


@pytest.fixture(scope="module")
def files(spark, tmp_path_factory):
    """The same rows as Parquet (3 files), CSV and ORC."""
    root = tmp_path_factory.mktemp("scan")
    df = spark.range(N).select(
        F.col("id"), (F.col("id") % 7).alias("k"), (F.col("id") * 3).alias("v")
    )
    df.repartition(3).write.parquet(str(root / "pq"))
    df.coalesce(1).write.option("header", True).csv(str(root / "csv"))
    df.repartition(2).write.orc(str(root / "orc"))
    return root


def test_how_each_kind_of_source_is_counted(spark, files):
    pq = spark.read.parquet(str(files / "pq"))
    csv = spark.read.option("header", True).csv(str(files / "csv"))
    assert file_scan(pq) == "footers"
    assert file_scan(pq.select("id", (F.col("v") + 1).alias("w")).alias("t")) == "footers"
    # a filter in the source's own plan: observed (a count would evaluate it on every row)
    assert file_scan(pq.where("k > 2")) is None
    # a CSV reader dropping malformed lines drops them by the columns it parses: not apart
    assert file_scan(csv) is None
    orc = spark.read.orc(str(files / "orc"))
    assert file_scan(orc) == "job"
    twice = spark.read.parquet(str(files / "pq"), str(files / "pq"))  # Spark reads it twice
    assert file_scan(twice) == "job"
    assert ScanCount(twice, "job").get == {"n": 2 * N}
    assert file_scan(pq.where(F.rand() > 0.5)) is None  # drawn at random: read twice, differs
    assert file_scan(spark.createDataFrame([(1,)], "a int")) is None
    assert file_scan(pq.groupBy("k").count()) is None
    assert footer_rows(pq) == N
    for df in (pq, orc):
        how = file_scan(df)
        assert ScanCount(df, how).get == {"n": df.count()}


def test_a_count_that_fails_is_a_metric_spark_did_not_report():
    class Broken:
        def count(self) -> int:
            raise OSError("file vanished")

    counted = ScanCount(Broken())  # nothing runs before the round starts it (or asks)
    assert counted._thread is None
    assert observed(counted) is None
    account = RoundAccount()

    from types import SimpleNamespace

    node = SimpleNamespace(name="in")
    builder = SimpleNamespace(
        births=[(node, counted)], stage_births=[], joins=[], tees=[], outputs=[], inner=[]
    )
    account.add_phase(builder)
    assert account.missing == ["source 'in'"]


def _scan_plans(spark, run) -> list[str]:
    """The physical plans of the SQL executions ``run`` made that scan Parquet (by execution
    id: the store keeps the last ``spark.sql.ui.retainedExecutions`` only)."""
    store = spark._jsparkSession.sharedState().statusStore()

    def executions():
        done = store.executionsList()
        return [done.apply(i) for i in range(done.size())]

    before = max((e.executionId() for e in executions()), default=-1)
    run()
    plans = [e.physicalPlanDescription() for e in executions() if e.executionId() > before]
    return [p for p in plans if "Scan parquet" in p]


def _doubled(pdf):
    return pdf.assign(v=pdf["v"] * 2)


def _each_doubled(batches):
    for pdf in batches:
        yield _doubled(pdf)


@pytest.mark.parametrize("count_scans", [True, False])
@pytest.mark.parametrize("stage", [False, True])
@pytest.mark.parametrize("select_first", [False, True])
def test_the_query_filter_reaches_the_scan(
    spark, files, tmp_path, count_scans, stage, select_first, monkeypatch
):
    """With the count apart, the round's scan carries the query's filter (Spark's
    ``PushedFilters``) as plain Spark's does; observed, it does not (the switch shows the
    test can tell). With a pandas stage after the filter the round draws record ids (after
    the filter, through a select of the source's columns by name: the rows it removes are
    only counted). Either way the sink equals plain Spark and the report counts every row."""
    monkeypatch.setattr(optimistic, "COUNT_SCANS", count_scans)
    path = str(files / "pq")

    def query(df):
        if select_first:  # the filter still reads the source's rows alone
            df = df.select("k", "v")
        df = df.where(F.col("v") < 600)
        if stage and hasattr(df, "mapInPandas"):  # plain Spark
            df = df.mapInPandas(_each_doubled, df.schema)
        elif stage:
            df = df.map_in_pandas(_doubled, df.schema, name="doubled")
        return df.groupBy("k").agg(F.sum("v").alias("s"))

    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    query(p.source(spark.read.parquet(path), name="in")).sink(sink, name="out")
    report = {}
    plans = _scan_plans(spark, lambda: report.setdefault("r", p.run()))
    r = report["r"]
    assert (r.source_records, r.completed, r.lost, r.optimistic_rounds) == (N, N, 0, 1)
    plain = query(spark.read.parquet(path))
    assert Counter(map(tuple, sink.read(spark).collect())) == Counter(map(tuple, plain.collect()))
    writes = [p for p in plans if "InsertIntoHadoopFsRelationCommand" in p]
    assert writes, plans
    pushed = all("LessThan(v,600)" in p for p in writes)
    assert pushed == count_scans, writes[0]
