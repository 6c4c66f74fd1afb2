"""A resumed run's report says what the earlier run had done (``RunReport.earlier``): a
resumable job whose first run stops in its second phase (the driver interrupted after the
first round of the count's phase) is run again; its report gives the first run's source
records, completed and dead-lettered (the poisoned ones) and the records it left pending, and
the sink equals plain Spark over the input minus the dead-lettered records."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from xorack.spark import Pipeline, SQLiteSink

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 40
POISON = {5, 17}


def poison(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack import FailRecord

    bad = pdf["id"].isin(POISON).to_numpy()
    if bad.any():
        raise FailRecord("poisoned", rows=bad)
    return pdf


def label(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(label=pdf.k.astype(str))


class Interrupted(Exception):
    """The driver stopped (a Ctrl-C, a lost driver host)."""


def _job(spark, tmp_path) -> tuple[Pipeline, SQLiteSink]:
    p = Pipeline(
        spark,
        resume=True,
        storage="sqlite:///" + str(tmp_path / "ft.db"),
        workdir=str(tmp_path / "work"),
        max_attempts=2,
    )
    rows = spark.range(N, numPartitions=2).select("id", (F.col("id") % 4).alias("k"))
    sink = SQLiteSink(str(tmp_path / "out.db"), "t")
    counted = (
        p.source(rows, name="ids")
        .map_in_pandas(poison, "id long, k long", name="poison")
        .groupBy("k")
        .agg(F.count("*").alias("n"))
    )
    counted.map_in_pandas(label, "k long, n long, label string", name="label").sink(sink)
    return p, sink


def test_a_resumed_run_reports_what_the_first_run_did(spark, tmp_path):
    p, _ = _job(spark, tmp_path)

    def stop_in_the_second_phase(info):
        if p.run_context.phase == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        p.run(on_round=stop_in_the_second_phase)
    p, sink = _job(spark, tmp_path)
    report = p.run()
    assert report.resumed
    assert not report.finished_before
    assert report.earlier["source_records"] == N
    assert report.earlier["dead_lettered"] == len(POISON)
    assert report.earlier["completed"] == N - len(POISON)
    assert report.earlier["pending"] == 0
    assert (report.lost, report.dead_lettered, report.source_records) == (0, len(POISON), N)
    plain = (
        spark.range(N)
        .where(~F.col("id").isin(sorted(POISON)))
        .groupBy((F.col("id") % 4).alias("k"))
        .agg(F.count("*").alias("n"))
    )
    expected = sorted((int(k), int(n), str(k)) for k, n in plain.collect())
    stored = sink.read()
    got = sorted(zip(stored["k"], stored["n"], stored["label"], strict=True))
    assert [(int(k), int(n), str(s)) for k, n, s in got] == expected
    again = p.run()  # the job is finished: its report again, and it says so
    assert again.finished_before
