"""Spark's ``structured_network_wordcount_windowed.py`` as an xorack streaming pipeline.

Spark's version reads timestamped lines from a socket and counts the words per sliding window
of event time. Here the lines come from JSON files (``{"ts": ..., "line": ...}``, one file per
micro-batch) and the counts go to Parquet in append mode, with a watermark: a window is written
once, final, when the watermark has passed its end *and* every record that can fall into it has
settled (completed or dead-lettered)::

    python examples/windowed_wordcount.py                 # three small files of its own
    python examples/windowed_wordcount.py DIR --out OUT   # JSON files in DIR; counts to OUT

The query runs with Spark's ``availableNow`` trigger: it reads what the directory holds, drains
what is pending and stops. As in Spark, the windows that end above the final watermark (the
last event time minus the delay) stay open and are not written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from xorack.spark import ParquetSink, Pipeline, RunReport

LINES = ["to be or not to be", "that is the question", "whether tis nobler in the mind"]


def write_sample(inbox: str, files: int = 3, lines_per_file: int = 6) -> None:
    """``files`` JSON files of timestamped lines; file f spans event times [10 f, 10 f + 10) s."""
    os.makedirs(inbox, exist_ok=True)
    for f in range(files):
        path = os.path.join(inbox, f"lines-{f}.json")
        with open(path, "w") as out:
            for k in range(lines_per_file):
                second = 10 * f + k * 10 // lines_per_file
                ts = f"2026-11-26T12:00:{second:02d}"
                out.write(json.dumps({"ts": ts, "line": LINES[(f + k) % len(LINES)]}) + "\n")
        os.utime(path, (f, f))  # a file source reads the oldest file first


def read_lines(spark: SparkSession, inbox: str) -> DataFrame:
    """The stream of timestamped lines: one file per micro-batch."""
    reader = spark.readStream.schema("ts timestamp, line string").option("maxFilesPerTrigger", 1)
    return reader.json(inbox)


def windowed_counts(
    spark: SparkSession,
    lines: DataFrame,
    out: str,
    window: str = "10 seconds",
    slide: str = "5 seconds",
    watermark: str = "5 seconds",
) -> RunReport:
    """Count the words of the stream ``lines`` per sliding window into a Parquet directory."""
    p = Pipeline(spark)
    tracked = p.source(lines, name="lines").withWatermark("ts", watermark)
    words = tracked.select("ts", F.explode(F.split("line", " ")).alias("word"))
    counts = words.groupBy(F.window("ts", window, slide), "word").count()
    counts.sink(ParquetSink(out), name="counts")
    return p.start_stream(available_now=True).wait()


def main(argv: list[str] | None = None) -> int:
    """Run the windowed word count; exit status 0 when no line was lost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inbox", nargs="?", help="a directory of JSON files (default: a sample)")
    parser.add_argument("--out", help="where the counts go (default: a temporary directory)")
    parser.add_argument("--window", default="10 seconds")
    parser.add_argument("--slide", default="5 seconds")
    parser.add_argument("--watermark", default="5 seconds")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="xorack-windowed-") if None in (args.inbox, args.out) else ""
    inbox = args.inbox
    if inbox is None:
        inbox = os.path.join(work, "in")
        write_sample(inbox)
    out = args.out or os.path.join(work, "counts")

    spark = SparkSession.builder.appName("StructuredNetworkWordCountWindowed").getOrCreate()
    lines = read_lines(spark, inbox)
    report = windowed_counts(spark, lines, out, args.window, args.slide, args.watermark)
    rows = spark.read.parquet(out).orderBy("window", "word").collect()
    for row in rows:
        print(
            f"[{row.window.start:%H:%M:%S}, {row.window.end:%H:%M:%S}) {row.word}: {row['count']}"
        )
    print(
        f"lines: {report.source_records}, completed {report.completed}, "
        f"dead-lettered {report.dead_lettered}, lost {report.lost}; counts in {out}"
    )
    return 0 if report.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
