"""The wordcount of ``xorack bench`` part 6 (``xorack.bench_jobs``) at a tiny size, every
variant: each result equals plain Spark's, and the retried-task variants really retried a task
(plain Spark's and xorack's), the optimistic round standing."""

from __future__ import annotations

import pytest

from xorack import bench_jobs

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

pytestmark = pytest.mark.spark


def test_every_wordcount_variant_equals_plain_spark(spark):
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        r = bench_jobs.run_wordcount(spark, 2000, repeat=1, warmup=0, fallback=True)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert r["results_match"] is True
    assert set(r["variants"]) == {*bench_jobs.VARIANTS, *bench_jobs.FALLBACK_VARIANTS}
    assert r["retried_over_plain_retried"] > 0
    text = bench_jobs.format_wordcount(r)
    assert "a task retried in both" in text


def test_the_retried_variant_retries_a_task_and_keeps_the_round(spark, tmp_path):
    inp, marker = str(tmp_path / "in"), str(tmp_path / "died")
    bench_jobs.make_input(spark, 1000, inp, partitions=2)
    report = bench_jobs.wordcount_tracked(
        spark, inp, str(tmp_path / "ft"), ft=True, dies_once=marker
    )
    assert (tmp_path / "died").exists(), "the worker did not die: nothing was retried"
    assert report["retried_tasks"] == 1
    assert report["optimistic_fallbacks"] == []
    plain = str(tmp_path / "plain")
    bench_jobs.wordcount_plain_stage(spark, inp, plain, str(tmp_path / "died-plain"))
    assert (tmp_path / "died-plain").exists()
    got = sorted(spark.read.parquet(str(tmp_path / "ft")).collect())
    assert got == sorted(spark.read.parquet(plain).collect())
