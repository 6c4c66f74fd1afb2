"""The stream-static join of Spark's Structured Streaming guide as an xorack pipeline.

Spark's guide joins a streaming DataFrame with a static one (``streamingDf.join(staticDf,
"type")``). Here a stream of ad clicks (JSON files, one per micro-batch) is joined with a static
table of ads: an inner join keeps the clicks of known ads (a click of an unknown ad is acked as
dropped, never left to time out), and the enriched clicks go to Parquet. Each click is a source
record; the Parquet directory only ever shows rows of records that completed::

    python examples/stream_static_join.py                        # a small sample of its own
    python examples/stream_static_join.py DIR --out OUT --how left_outer

The static side is read again by each round, as Spark reads it: it must be deterministic (a
file, a table, ``createDataFrame``).
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

ADS = [(1, "winter sale"), (2, "new phone"), (3, "books")]


def write_sample(inbox: str, files: int = 3, clicks_per_file: int = 5) -> None:
    """``files`` JSON files of clicks; ad 4 is not in the static table."""
    os.makedirs(inbox, exist_ok=True)
    for f in range(files):
        path = os.path.join(inbox, f"clicks-{f}.json")
        with open(path, "w") as out:
            for k in range(clicks_per_file):
                click = {
                    "ts": f"2026-11-26T12:00:{10 * f + k:02d}",
                    "ad_id": 1 + (f + k) % 4,
                    "user": f"u{(3 * f + k) % 7}",
                }
                out.write(json.dumps(click) + "\n")
        os.utime(path, (f, f))  # a file source reads the oldest file first


def read_clicks(spark: SparkSession, inbox: str) -> DataFrame:
    """The stream of clicks: one file per micro-batch."""
    reader = spark.readStream.schema("ts timestamp, ad_id long, user string")
    return reader.option("maxFilesPerTrigger", 1).json(inbox)


def static_ads(spark: SparkSession) -> DataFrame:
    """The static side: the ads and their campaigns."""
    return spark.createDataFrame(ADS, "ad_id long, campaign string")


def enriched_clicks(
    spark: SparkSession, clicks: DataFrame, ads: DataFrame, out: str, how: str = "inner"
) -> RunReport:
    """Join the stream ``clicks`` with the static ``ads`` on ``ad_id`` into a Parquet directory."""
    p = Pipeline(spark)
    tracked = p.source(clicks, name="clicks")
    joined = tracked.join(ads, "ad_id", how)  # a lookup join: each match is a child of its click
    joined = joined.withColumn("campaign", F.upper("campaign"))
    joined.sink(ParquetSink(out), name="enriched")
    return p.start_stream(available_now=True).wait()


def main(argv: list[str] | None = None) -> int:
    """Run the join; exit status 0 when no click was lost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inbox", nargs="?", help="a directory of JSON files (default: a sample)")
    parser.add_argument("--out", help="where the joined clicks go (default: a temporary directory)")
    parser.add_argument("--how", default="inner", choices=["inner", "left", "left_outer"])
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="xorack-join-") if None in (args.inbox, args.out) else ""
    inbox = args.inbox
    if inbox is None:
        inbox = os.path.join(work, "in")
        write_sample(inbox)
    out = args.out or os.path.join(work, "enriched")

    spark = SparkSession.builder.appName("StreamStaticJoin").getOrCreate()
    report = enriched_clicks(spark, read_clicks(spark, inbox), static_ads(spark), out, args.how)
    for row in spark.read.parquet(out).orderBy("ts").collect():
        print(f"{row.ts:%H:%M:%S} {row.user} ad {row.ad_id}: {row.campaign}")
    print(
        f"clicks: {report.source_records}, completed {report.completed}, "
        f"dead-lettered {report.dead_lettered}, lost {report.lost}; joined clicks in {out}"
    )
    return 0 if report.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
