"""The TPC-H queries and PageRank of ``xorack bench --tpch`` at a tiny scale: each query's
result under FT on, with a few ``lineitem`` rows (PageRank: ranks) failing their first attempt,
equals plain Spark's (the same query function over plain DataFrames)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from xorack import bench_tpch

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

# Spark's Python workers cannot import this test module: ship its stage by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCALE = 0.002  # lineitem ~12 K rows, orders 3 K
PAGERANK_NODES = 400


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    try:
        bench_tpch.tpchgen_executable()
    except bench_tpch.DataUnavailable as exc:
        pytest.skip(f"{exc} (it is in the test extra: pip install -e '.[test]')")
    path = bench_tpch.tpch_data(SCALE, tmp_path_factory.mktemp("tpch-cache"))
    bench_tpch.pagerank_data(path, PAGERANK_NODES)
    return path


@dataclass(frozen=True)
class FailsFirstRound:
    """A ``map_in_arrow`` stage: rows whose ``column`` is ``1 mod modulus`` (a power of two)
    fail in round 0
    (the optimistic round, then the first tracked round); every row passes after that."""

    column: str
    modulus: int

    def __call__(self, batch):
        import pyarrow.compute as pc

        from xorack import FailRecord
        from xorack.spark import current_round

        if current_round() == 0:
            mask = pc.equal(pc.bit_wise_and(batch.column(self.column), self.modulus - 1), 1)
            if pc.any(mask).as_py():
                raise FailRecord("injected: fails its first round", rows=mask)
        return batch


def _failing(column: str, modulus: int):
    def wrap(frame):
        return frame.map_in_arrow(FailsFirstRound(column, modulus), frame.schema, name="fails")

    return wrap


#: In CI, three shapes under failures (a tracked join and a top-n, a global aggregate over a
#: lookup join, an iterative join + aggregate); XORACK_TPCH_QUERIES=all runs every query (the
#: bench compares every query's result with plain Spark's on each run too).
#: Q21 is left out: at this scale no supplier is in its nation, its result is empty (the bench
#: compares it with plain Spark at scale 0.1).
CHECKED = (
    tuple(q for q in bench_tpch.QUERIES if q != "q21")
    if os.environ.get("XORACK_TPCH_QUERIES") == "all"
    else ("q3", "q14", "pagerank")
)


@pytest.mark.slow
@pytest.mark.parametrize("query", CHECKED)
def test_query_under_failures_equals_plain_spark(spark, data, tmp_path, query) -> None:
    plain, tracked = str(tmp_path / "plain"), str(tmp_path / "ft-on")
    bench_tpch.run_plain(spark, data, query, plain)
    # lineitem: the lines of 1 order in 64 (TPC-H's order keys are sparse: 8 of every 32);
    # PageRank: 1 node in 64
    column, modulus = ("id", 64) if query == "pagerank" else ("l_orderkey", 256)
    report = bench_tpch.run_pipeline(
        spark, data, query, tracked, ft=True, around_lineitem=_failing(column, modulus)
    )
    assert report["failed"] > 0, "no row failed: the test would not test recovery"
    assert report["optimistic_fallbacks"], "the optimistic round did not fall back"
    assert report["lost"] == 0
    assert report["dead_lettered"] == 0
    assert bench_tpch.compare(spark, query, plain, tracked) is None
    rows = spark.read.parquet(plain).count()
    assert rows > 0, f"{query} is empty at this scale: the comparison would prove nothing"


def test_compare_reports_a_different_row(spark, tmp_path) -> None:
    """The check the bench and the test rely on does see a wrong result."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    spark.createDataFrame([(1, 2.0), (2, 3.0)], "id long, rank double").write.parquet(a)
    spark.createDataFrame([(2, 3.0), (1, 2.0)], "id long, rank double").write.parquet(b)
    assert bench_tpch.compare(spark, "pagerank", a, b) is None  # order does not matter
    shutil.rmtree(b)
    spark.createDataFrame([(1, 2.0), (2, 3.5)], "id long, rank double").write.parquet(b)
    assert "!= plain Spark's" in bench_tpch.compare(spark, "pagerank", a, b)


def test_bad_scale_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="scale must be a positive number"):
        bench_tpch.tpch_data(0, tmp_path)
