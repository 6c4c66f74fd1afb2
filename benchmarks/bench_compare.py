"""pytest-benchmark versions of the ``xorack bench`` comparisons (parts 1 and 3).

    PYTHONPATH=python python -m pytest benchmarks/bench_compare.py --benchmark-enable \
        -p no:cacheprovider [-m "not spark"]

Sizes: ``XORACK_BENCH_SOURCES`` source records (default 1,000,000; ~6.5 events each) and
``XORACK_BENCH_KEYS`` partition keys (default 2,000,000). Each acker run starts from an empty
table: births first, then the shuffled events, in batches of 64 K.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import xorack
from workload import Workload, generate_workload, run_acker  # pytest puts benchmarks/ on sys.path
from xorack import bench

SOURCES = int(float(os.environ.get("XORACK_BENCH_SOURCES", "1e6")))
KEYS = int(float(os.environ.get("XORACK_BENCH_KEYS", "2e6")))
PARTITIONS = 200


@pytest.fixture(scope="module")
def workload() -> Workload:
    return generate_workload(SOURCES, seed=0)


def _factories() -> list:
    params = []
    for name, factory in bench.acker_factories().items():
        marks = [pytest.mark.skip(reason=factory)] if isinstance(factory, str) else []
        params.append(pytest.param(factory, id=name.split(" (")[0].replace(" ", "-"), marks=marks))
    return params


@pytest.mark.parametrize("factory", _factories())
def test_completion_tracking(benchmark, workload: Workload, factory) -> None:
    """Events/s of one acker over the whole workload (``extra_info['events_per_s']``)."""
    events = workload.num_sources + workload.num_events
    done = benchmark.pedantic(
        lambda acker: run_acker(acker, workload),
        setup=lambda: ((factory(),), {}),
        rounds=3,
        iterations=1,
    )
    assert done == workload.num_sources
    benchmark.extra_info["events"] = events
    benchmark.extra_info["events_per_s"] = events / benchmark.stats.stats.median


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    return bench.get_spark()


@pytest.mark.spark
def test_completion_tracking_spark_bit_xor(benchmark, workload: Workload, spark) -> None:
    """Spark's groupBy(src).agg(bit_xor(value)) on a cached DataFrame of the same events."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(bench._events_table(workload)).cache()
    df.count()

    def completed() -> int:
        agg = df.groupBy("src").agg(F.bit_xor("value").alias("x"))
        return agg.filter(F.col("x") == 0).count()

    done = benchmark.pedantic(completed, rounds=3, iterations=1, warmup_rounds=1)
    df.unpersist()
    assert done == workload.num_sources
    events = workload.num_sources + workload.num_events
    benchmark.extra_info["events_per_s"] = events / benchmark.stats.stats.median


@pytest.fixture(scope="module", params=["int64", "string"])
def keys(request):
    return bench._partition_keys(request.param, KEYS, seed=2)


def test_partition_ids_xorack(benchmark, keys) -> None:
    ids = benchmark(xorack.spark_partition_ids, [keys], PARTITIONS)
    assert len(ids) == len(keys)
    assert int(np.min(ids)) >= 0
    assert int(np.max(ids)) < PARTITIONS
    benchmark.extra_info["keys_per_s"] = len(keys) / benchmark.stats.stats.median


@pytest.mark.spark
def test_partition_ids_spark(benchmark, keys, spark) -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F

    df = spark.createDataFrame(pa.table({"k": keys})).cache()
    df.count()
    with_ids = df.repartition(PARTITIONS, "k").select(F.spark_partition_id().alias("p"))
    benchmark.pedantic(
        lambda: with_ids.write.format("noop").mode("overwrite").save(),
        rounds=3,
        iterations=1,
        warmup_rounds=1,
    )
    df.unpersist()
    benchmark.extra_info["keys_per_s"] = len(keys) / benchmark.stats.stats.median
