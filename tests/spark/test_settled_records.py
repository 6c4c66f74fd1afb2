"""A source task that Spark runs again after its records left the pending set — completed,
or failed and waiting for their replay under a new id (a map stage recomputed for a lost
shuffle output, a speculative copy finishing last): its rows of those records are recognized
(the FT layer knows every source id the job persisted) and count nowhere; only the rows of
records still pending under their ids come out again, and ack those same records.

Spark runs the same source tasks twice over one acker (what a recomputed map stage does: the
same partitions read again by the same tagger); plain Spark is the oracle.
"""

from __future__ import annotations

import numpy as np
import pytest

from xorack.spark.ids import u64

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

N = 400
SCHEMA = "n long, _ft_src long, _ft_rec long"


def test_a_source_task_run_again_after_its_records_settled_emits_only_the_pending_ones(
    spark, service, client, ft
):
    from xorack.spark.rows import with_partition_ids
    from xorack.spark.tagging import SourceTagger

    df = spark.range(N, numPartitions=2).selectExpr("id AS n")
    tagger = SourceTagger("numbers", 0, (), service.location)
    tagged = with_partition_ids(df).mapInArrow(tagger, SCHEMA)
    first = tagged.toPandas().sort_values("n")
    assert sorted(first["n"]) == sorted(df.toPandas()["n"])  # plain Spark's rows, each once
    src, rec = u64(first["_ft_src"]), u64(first["_ft_rec"])
    done = first["n"] % 4 < 2  # their trees end in a sink: acked, complete
    failed = first["n"] % 4 == 2  # failed downstream: replayed under new ids
    client.xor(src[done], rec[done])
    client.fail(src[failed], reason="flaky")
    assert ft.pending == N // 2

    again = tagged.toPandas()  # Spark runs the source tasks again

    # only the records still pending under their first ids come out, under the same ids
    assert sorted(again["n"]) == sorted(first["n"][first["n"] % 4 == 3])
    stats = ft.stats()
    assert stats.persisted == N  # nothing persisted anew
    assert stats.repeats_settled == N * 3 // 4
    assert ft.pending == N // 2
    # every record then completes exactly once: the pending ones by the rows that came out
    # again, the failed ones by their replays
    client.xor(u64(again["_ft_src"]), u64(again["_ft_rec"]))
    for table in client.take_replays(source=0).values():
        client.xor(
            np.asarray(table.column("_ft_src"), np.uint64),
            np.asarray(table.column("_ft_rec"), np.uint64),
        )
    stats = ft.stats()
    assert (stats.completed, stats.pending, stats.dead_lettered) == (N, 0, 0)
