"""Spark's ``examples/src/main/python/wordcount.py`` as an xorack pipeline.

Spark's version reads a text file, splits each line on spaces, counts each word with
``reduceByKey`` and prints the counts. Here the same plan is a tracked pipeline: every line is a
source record, the counts are computed exactly once (a barrier) and written to Parquet, and the
run's report accounts for every line::

    python examples/wordcount.py                  # a small text of its own
    python examples/wordcount.py FILE --out DIR   # any text file; the counts go to DIR

A line on which a stage fails would be replayed alone and, after ``--max-attempts``,
dead-lettered; the counts would then be plain Spark's over the other lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from xorack.spark import ParquetSink, Pipeline, RunReport

SAMPLE = """\
It was the best of times it was the worst of times
it was the age of wisdom it was the age of foolishness
it was the epoch of belief it was the epoch of incredulity
"""


def word_counts(spark: SparkSession, lines: DataFrame, out: str, max_attempts: int) -> RunReport:
    """Count the words of ``lines`` (one string column, ``value``) into a Parquet directory."""
    p = Pipeline(spark, max_attempts=max_attempts)
    words = p.source(lines, name="lines").select(F.explode(F.split("value", " ")).alias("word"))
    counts = words.groupBy("word").count()  # a barrier: aggregated once, over settled records
    counts.sink(ParquetSink(out), name="counts")
    return p.run()


def main(argv: list[str] | None = None) -> int:
    """Run the word count; exit status 0 when no line was lost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", help="a text file (default: a small sample)")
    parser.add_argument("--out", help="where the counts go (default: a temporary directory)")
    parser.add_argument("--max-attempts", type=int, default=3)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="xorack-wordcount-") if None in (args.file, args.out) else ""
    path = args.file
    if path is None:
        path = os.path.join(work, "sample.txt")
        with open(path, "w") as f:
            f.write(SAMPLE)
    out = args.out or os.path.join(work, "counts")

    spark = SparkSession.builder.appName("PythonWordCount").getOrCreate()
    report = word_counts(spark, spark.read.text(path), out, args.max_attempts)
    for word, count in sorted(spark.read.parquet(out).collect()):
        print(f"{word}: {count}")
    print(
        f"lines: {report.source_records}, completed {report.completed}, "
        f"dead-lettered {report.dead_lettered}, lost {report.lost}; counts in {out}"
    )
    return 0 if report.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
