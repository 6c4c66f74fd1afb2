"""What the barrier cascade costs: a word count whose stage after the ``groupBy`` dead-letters
the row of one word (the input lines holding it are dead-lettered with it and the run goes
again without them), against the same job where no row fails — wall times of interleaved
runs on one Spark session.

    python benchmarks/bench_cascade.py [--lines 200000] [--repeats 2]

The job: ``--lines`` generated lines (8 words each from a vocabulary of 5,000, the word
``poison`` in one line in 10,000) → ``explode(split)`` → ``groupBy(word).agg(count)`` → a
``map_in_pandas`` check after the aggregate (``--poison``: it fails the row of ``poison`` on
every attempt) → a ``ParquetSink``. Printed: each run's wall time, the cascade's
``cascaded`` records and passes, and ``with cascade / without`` (the medians).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import pandas as pd

import xorack


def make_check(poison: bool):
    def check(pdf: pd.DataFrame) -> pd.DataFrame:
        bad = (pdf["word"] == "poison").to_numpy() & poison
        if bad.any():
            raise xorack.FailRecord("poison word", rows=bad)
        return pdf

    return check


def job(spark, lines: int, poison: bool, out: str):
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline

    words = [
        F.concat(F.lit("w"), (F.abs(F.xxhash64("id", F.lit(i))) % 5000).cast("string"))
        for i in range(8)
    ]
    first = F.when(F.col("id") % 10_000 == 3, F.lit("poison")).otherwise(words[0])
    df = spark.range(lines, numPartitions=4).select(
        F.concat_ws(" ", first, *words[1:]).alias("line")
    )
    p = Pipeline(spark, max_attempts=1)
    counts = (
        p.source(df, name="lines")
        .select(F.explode(F.split("line", " ")).alias("word"))
        .groupBy("word")
        .agg(F.count("*").alias("n"))
    )
    counts.map_in_pandas(make_check(poison), counts.schema, name="check").sink(
        ParquetSink(out), name="counts"
    )
    start = time.perf_counter()
    report = p.run()
    return time.perf_counter() - start, report


def main() -> None:
    from xorack.spark.session import get_or_create_session

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    spark = get_or_create_session(app_name="bench-cascade")
    job(spark, 1000, True, tempfile.mkdtemp() + "/warm")  # JIT, Python workers
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for poison in (False, True):
            seconds, report = job(spark, args.lines, poison, tempfile.mkdtemp() + "/counts")
            times[poison].append(seconds)
            print(
                f"poison={poison}: {seconds:.2f} s, cascaded {report.cascaded} records, "
                f"{report.cascade_passes} pass(es), dead-lettered {report.dead_lettered}, "
                f"lost {report.lost}"
            )
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"with cascade / without: {ratio:.2f}")


if __name__ == "__main__":
    main()
