"""The seed's FaultToleranceWithTopologyTest, on real local Spark.

Two sources, branches with filter / map / merge into two sinks, failures injected on the first
occurrence of some records (explicit failures and records lost in transit):

    A (keys k, 3 partitions) ─► filterA (even v; fails v % 6 == 0 once) ─┬─► sink "evens"
                                                                          └─► mapA ──┐
    B (2 partitions) ─► mapB (v * 10; fails v % 5 == 0 once) ─► lossy ─────────────┴─► union
    union ─► repartition(v) ─► sink "merged"

Checks: every value reaches its sink (exactly once, with deterministic ids and idempotent
sinks); replays go to the partition Spark itself assigns to the same key; a source record
completes only on its last event (no early completion, no orphan event); the distinct source
ids seen equal records + replays.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass

import pandas as pd
import pytest

import xorack
from xorack.spark import Pipeline, SQLiteSink, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NA, NB, PARTS_A = 60, 40, 3


@dataclass(frozen=True)
class SeenSources:
    """Records every input ``_ft_src`` in a side table (idempotent: bisection may re-call)."""

    path: str

    def __call__(self, pdf: pd.DataFrame) -> None:
        con = sqlite3.connect(self.path, timeout=60)
        with con:
            con.execute("CREATE TABLE IF NOT EXISTS seen (src INTEGER PRIMARY KEY)")
            con.executemany(
                "INSERT OR IGNORE INTO seen VALUES (?)", [(int(s),) for s in pdf["_ft_src"]]
            )
        con.close()


@dataclass(frozen=True)
class FilterA:
    seen: SeenSources

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        from pyspark import TaskContext

        self.seen(pdf)
        if current_round() == 0 and (pdf["v"] % 6 == 0).any():
            raise xorack.FailRecord("first occurrence of a multiple of 6")
        out = pdf[pdf["v"] % 2 == 0]
        return out.assign(part=TaskContext.get().partitionId(), rnd=current_round())


def map_a(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(origin="A")


@dataclass(frozen=True)
class MapB:
    seen: SeenSources

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        self.seen(pdf)
        if current_round() == 0 and (pdf["v"] % 5 == 0).any():
            raise xorack.FailRecord("first occurrence of a multiple of 5")
        return pdf.assign(v=pdf["v"] * 10, origin="B")


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_fault_tolerance_with_topology(spark, tmp_path):
    from pyspark.sql import functions as F

    seen = SeenSources(str(tmp_path / "seen.db"))
    evens = SQLiteSink(str(tmp_path / "evens.db"), "evens")
    merged = SQLiteSink(str(tmp_path / "merged.db"), "merged")

    a_df = spark.createDataFrame([(v % 9, v) for v in range(NA)], "k int, v long")
    b_df = spark.createDataFrame([(v,) for v in range(NB)], "v long")

    p = Pipeline(spark, max_attempts=3)
    a = p.source(a_df, name="A", keys=["k"], partitions=PARTS_A)
    b = p.source(b_df, name="B", partitions=2)
    kept = a.map_in_pandas(FilterA(seen), "k int, v long, part int, rnd int", name="filterA")
    kept.sink(evens, name="evens")
    from_a = kept.map_in_pandas(map_a, "v long, origin string", name="mapA")
    from_b = b.map_in_pandas(MapB(seen), "v long, origin string", name="mapB")

    def lossy(df):  # v % 7 == 3 lost in transit on the first attempt → timeout → replay
        return df.where(F.col("v") % 70 != 30) if p.round == 0 else df

    from_b = from_b.transform(lossy, name="lossy")
    from_a.union(from_b).repartition(2, "v").sink(merged, name="merged")

    report = p.run()

    # every value reached its sink, exactly once (deterministic ids + idempotent sinks)
    ev = evens.read()
    assert sorted(ev["v"]) == [v for v in range(NA) if v % 2 == 0]
    mg = merged.read()
    expected = {("A", v) for v in range(0, NA, 2)} | {("B", 10 * v) for v in range(NB)}
    assert sorted(zip(mg["origin"], mg["v"], strict=True)) == sorted(expected)

    # replays went to the partition Spark itself assigns to the same key
    spark_part = {
        r.k: r.p
        for r in spark.createDataFrame([(k,) for k in range(9)], "k int")
        .repartition(PARTS_A, "k")
        .select("k", F.spark_partition_id().alias("p"))
        .collect()
    }
    replayed_rows = ev[ev["rnd"] > 0]
    assert len(replayed_rows) == len([v for v in range(NA) if v % 6 == 0])
    for k, part in zip(ev["k"], ev["part"], strict=True):
        assert part == spark_part[k]

    failed = len([v for v in range(NA) if v % 6 == 0]) + len([v for v in range(NB) if v % 5 == 0])
    lost_in_transit = len([v for v in range(NB) if v % 7 == 3 and v % 5 != 0])
    assert report.failed == failed
    assert report.timed_out == lost_in_transit
    assert report.replayed == failed + lost_in_transit
    # a source record completes only on its last event: an early completion would leave the
    # later events without a record (orphans), and a missing one would time out again
    assert report.completed == report.source_records == NA + NB
    assert report.orphans == 0
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.rounds == 2

    # distinct source ids == records + replays
    con = sqlite3.connect(seen.path)
    distinct = con.execute("SELECT COUNT(*) FROM seen").fetchone()[0]
    con.close()
    assert distinct == NA + NB + report.replayed
