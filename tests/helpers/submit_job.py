"""A user's xorack job as ``spark-submit`` runs it (tests/end_to_end/test_spark_submit.py).

    spark-submit --master local[1] --conf spark.xorack.maxAttempts=2 submit_job.py OUT_DIR

A plain ``SparkSession`` (Spark's own log settings: WARN), ``Pipeline(spark)`` with no argument
(its options come from the ``spark.xorack.*`` configuration), and a native expression that
raises on some rows (ANSI division by zero): each such row fails a Spark task, which xorack
narrows down to the row and dead-letters. The job runs twice: as configured, then with
``verbose=True``, with a line ``=== verbose run ===`` on stderr between the two. It prints one
JSON line: per run the pipeline's max attempts, the dead-lettered ids and their attempts, and
whether the sink equals plain Spark over the input minus the dead-lettered rows.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from xorack.spark import Pipeline, SQLiteSink


def main(out_dir: str) -> None:
    spark = SparkSession.builder.appName("xorack-submit-test").getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    rows = spark.range(12, numPartitions=1).select("id", (F.col("id") % 7).alias("b"))

    def job(df):
        return df.select("id", (F.col("id") * 10 / F.col("b")).alias("x"))

    expected = sorted(tuple(r) for r in job(rows.where(F.col("b") != 0)).collect())
    p = Pipeline(spark)
    sink = SQLiteSink(os.path.join(out_dir, "out.db"), "t")
    job(p.source(rows, name="numbers")).sink(sink, name="out")
    report = p.run()
    dead = p.dead_letters().to_pandas()
    stored = sink.read()
    result = {
        "max_attempts": p.max_attempts,
        "optimistic": p.optimistic,
        "dead": sorted(int(i) for i in dead["id"]),
        "attempts": sorted({int(a) for a in dead["_ft_attempts"]}),
        "lost": report.lost,
        "matches_plain_spark": sorted(
            (int(i), float(x)) for i, x in zip(stored["id"], stored["x"], strict=True)
        )
        == expected,
    }
    print(json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
