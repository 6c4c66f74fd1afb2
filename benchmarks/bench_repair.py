"""Repairing 0.1 % of a job (``Pipeline.repair``) against rerunning the whole job with the fixed
stage, wall times from one run on the same Spark session.

    python benchmarks/bench_repair.py [--lines 1000000] [--every 1000]

The job (a resumable one: SQLite storage and a work directory): ``--lines`` generated lines →
a pandas stage that splits them into words and has a bug on every ``--every``-th line (it
fails those rows, ``FailRecord(rows=...)``, on every attempt) → the words into a ParquetSink,
and a word count (``groupBy(word).agg(count, sum)``) into another. The run dead-letters the
buggy lines; then, with the stage fixed:

* **repair**: ``repair()`` of that job — only the dead-lettered lines run, their words are
  added to the words sink and their counts merged into the stored groups;
* **rerun**: the whole job again, fixed, into a new storage, work directory and sinks.

Both end with the same sinks (checked: the same word counts). Printed: each wall time and
``repair / rerun`` (target <= 0.2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import pandas as pd

import xorack


def make_split(fixed: bool, every: int):
    def split(pdf: pd.DataFrame) -> pd.DataFrame:
        if not fixed:
            bad = (pdf["id"] % every == 7).to_numpy()
            if bad.any():
                raise xorack.FailRecord("a bug", rows=bad)
        out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
        return out[out["word"].notna()]

    return split


def job(spark, where: str, fixed: bool, lines: int, every: int):
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline

    p = Pipeline(
        spark,
        storage=f"sqlite:///{where}/ft.db",
        workdir=f"{where}/work",
        resume=True,
        max_attempts=1,
    )
    df = spark.range(lines, numPartitions=4).select(
        F.col("id"),
        F.concat_ws(
            " ",
            *[
                F.concat(F.lit("w"), ((F.col("id") * (7 + k)) % 5003).cast("string"))
                for k in range(5)
            ],
        ).alias("line"),
    )
    words = p.source(df, name="lines").map_in_pandas(
        make_split(fixed, every), "id long, word string, line string", name="split"
    )
    words.select("id", "word").sink(ParquetSink(f"{where}/words"), name="words")
    words.groupBy("word").agg(F.count("*").alias("n"), F.sum("id").alias("ids")).sink(
        ParquetSink(f"{where}/counts"), name="counts"
    )
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=1000, help="one line in EVERY has the bug")
    args = ap.parse_args()
    from xorack.spark.session import get_or_create_session

    spark = get_or_create_session(app_name="xorack-bench-repair")
    root = tempfile.mkdtemp(prefix="xorack-bench-repair-")
    try:
        first = os.path.join(root, "job")
        t0 = time.perf_counter()
        report = job(spark, first, False, args.lines, args.every).run()
        t_run = time.perf_counter() - t0
        print(f"first run (buggy stage): {t_run:.1f} s, dead-lettered {report.dead_lettered}")

        t0 = time.perf_counter()
        repaired = job(spark, first, True, args.lines, args.every).repair()
        t_repair = time.perf_counter() - t0

        again = os.path.join(root, "rerun")
        t0 = time.perf_counter()
        job(spark, again, True, args.lines, args.every).run()
        t_rerun = time.perf_counter() - t0

        a = spark.read.parquet(f"{first}/counts").toPandas().sort_values("word")
        b = spark.read.parquet(f"{again}/counts").toPandas().sort_values("word")
        same = np.array_equal(a.to_numpy(), b.to_numpy())
        words = spark.read.parquet(f"{first}/words").count()
        words_b = spark.read.parquet(f"{again}/words").count()
        print(
            f"repair of {repaired.repaired} records ({repaired.repaired / args.lines:.2%}): "
            f"{t_repair:.1f} s; groups changed {repaired.sinks['counts']['groups_changed']}"
        )
        print(f"rerun of the whole job: {t_rerun:.1f} s")
        print(f"repair / rerun = {t_repair / t_rerun:.3f} (target <= 0.2)")
        print(f"same sinks: counts {same}, words {words == words_b} ({words})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
