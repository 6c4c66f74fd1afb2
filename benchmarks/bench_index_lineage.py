"""Lineage by the pandas index against the ``_ft_rec``-carrying form: what matching a pandas
stage's output rows to their inputs by the index costs per row, figures from one interleaved run.

    python benchmarks/bench_index_lineage.py [--rows 1000000] [--repeat 5] [--spark]

The function is the MovieLens parse every ``mapInPandas`` example writes (a new frame built from
the input's Series), in two forms: as users write it (no ``_ft_rec``: matched by the index) and
with ``"_ft_rec": pdf["_ft_rec"]`` added to the frame (matched by the column, the contract
before). Parts:

1. **matching alone**: :func:`xorack.spark.stages.output_parents` on one output frame of each
   form (10 K-row batches, Spark's default ``maxRecordsPerBatch``), ns per row.
2. **stage alone** (no Spark): ``StageRunner.process`` over ``--rows`` rows in 10 K-row batches
   with a client that drops the events (ids, matching, anchoring, the function itself).
3. with ``--spark``, **pipeline** (real Spark, FT on): source -> parse -> ParquetSink over
   ``--rows`` lines, wall time of each form.

Each form runs once per repeat, the forms interleaved; figures are medians with their min-max
(parts 1 and 2 in this thread's CPU time, part 3 in wall time).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

BATCH = 10_000


def parse(pdf: pd.DataFrame) -> pd.DataFrame:
    parts = pdf["value"].str.split("::")
    return pd.DataFrame(
        {
            "userId": parts.str[0].astype("int64"),
            "movieId": parts.str[1].astype("int64"),
            "rating": parts.str[2].astype("int64"),
            "timestamp": parts.str[3].astype("int64"),
        }
    )


def parse_carrying(pdf: pd.DataFrame) -> pd.DataFrame:
    parts = pdf["value"].str.split("::")
    return pd.DataFrame(
        {
            "userId": parts.str[0].astype("int64"),
            "movieId": parts.str[1].astype("int64"),
            "rating": parts.str[2].astype("int64"),
            "timestamp": parts.str[3].astype("int64"),
            "_ft_rec": pdf["_ft_rec"],
        }
    )


COLUMNS = ("userId", "movieId", "rating", "timestamp")
SCHEMA = "userId long, movieId long, rating long, timestamp long"
FORMS: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = {
    "index": parse,
    "_ft_rec": parse_carrying,
}


def lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    users, movies = rng.integers(0, 6040, n), rng.integers(0, 3952, n)
    ratings, stamps = rng.integers(1, 6, n), rng.integers(956703932, 1046454590, n)
    return [
        f"{u}::{m}::{r}::{t}" for u, m, r, t in zip(users, movies, ratings, stamps, strict=True)
    ]


def batches(n: int) -> list[pd.DataFrame]:
    from xorack import acker
    from xorack.spark.ids import i64

    text = lines(n)
    src = i64(np.asarray(acker.new_ids(n), dtype=np.uint64))
    rec = i64(np.asarray(acker.new_ids(n), dtype=np.uint64))
    return [
        pd.DataFrame(
            {
                "value": text[lo : lo + BATCH],
                "_ft_src": src[lo : lo + BATCH],
                "_ft_rec": rec[lo : lo + BATCH],
            }
        )
        for lo in range(0, n, BATCH)
    ]


class _NullClient:
    def xor(self, src, values) -> None:
        pass

    def fail(self, src, reason) -> None:
        pass


def _figure(times: list[float], rows: int) -> str:
    med = statistics.median(times)
    return f"{med * 1e9 / rows:8.1f} ns/row  ({med:.3f} s [{min(times):.3f}-{max(times):.3f}])"


def _interleaved(
    runs: dict[str, Callable[[], object]], repeat: int, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Each run once per repeat, interleaved; ``clock``: ``time.thread_time`` (this thread's
    CPU time, which other processes on a shared machine do not inflate) or wall time."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for k, fn in runs.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return times


def matching_alone(frames: list[pd.DataFrame], repeat: int) -> None:
    from xorack.spark.ids import i64, u64
    from xorack.spark.stages import output_parents

    work = []  # (input record ids, output of each form) per batch, computed once
    for pdf in frames:
        rec = u64(pdf["_ft_rec"])
        labelled = pdf.set_axis(pd.Index(i64(rec)))
        work.append((rec, {k: fn(labelled) for k, fn in FORMS.items()}))

    def match(form: str) -> Callable[[], None]:
        def run() -> None:
            for rec, outs in work:
                output_parents("parse", outs[form], rec)

        return run

    rows = sum(len(f) for f in frames)
    times = _interleaved({k: match(k) for k in FORMS}, repeat, time.thread_time)
    print(f"1. matching alone, {rows:,} rows in {len(frames)} batches (thread CPU time):")
    for k in FORMS:
        print(f"   by {k:8s} {_figure(times[k], rows)}")
    diff = statistics.median(times["index"]) - statistics.median(times["_ft_rec"])
    print(f"   index - _ft_rec: {diff * 1e9 / rows:+.1f} ns/row")


def stage_alone(frames: list[pd.DataFrame], repeat: int) -> None:
    from xorack.spark.stages import StageRunner

    def stage(form: str) -> Callable[[], None]:
        runner = StageRunner("parse", FORMS[form], COLUMNS, location="unused")
        client = _NullClient()

        def run() -> None:
            for pdf in frames:
                runner.process(pdf, client)

        return run

    def function_only() -> None:
        for pdf in frames:
            parse(pdf)

    rows = sum(len(f) for f in frames)
    runs = {k: stage(k) for k in FORMS}
    runs["function alone"] = function_only
    times = _interleaved(runs, repeat, time.thread_time)
    print(f"2. StageRunner.process, {rows:,} rows (thread CPU time):")
    for k in runs:
        print(f"   {k:16s} {_figure(times[k], rows)}")
    a, b = (statistics.median(times[k]) for k in FORMS)
    print(f"   index / _ft_rec: {a / b:.3f}; index - _ft_rec: {(a - b) * 1e9 / rows:+.1f} ns/row")


def pipeline(n: int, repeat: int) -> None:
    from xorack.spark import ParquetSink, Pipeline
    from xorack.spark.session import get_or_create_session

    spark = get_or_create_session(app_name="bench-index-lineage")
    df = spark.createDataFrame([(v,) for v in lines(n)], "value string").repartition(4)
    df = df.localCheckpoint(eager=True)

    def run(form: str) -> Callable[[], None]:
        def go() -> None:
            out = tempfile.mkdtemp(prefix="bench-index-")
            try:
                p = Pipeline(spark)
                staged = p.source(df, name="ratings").map_in_pandas(
                    FORMS[form], SCHEMA, name="parse"
                )
                staged.sink(ParquetSink(out + "/parsed"), name="out")
                report = p.run()
                if report.completed != n or report.lost:
                    raise RuntimeError(f"the run did not complete every line: {report.as_dict()}")
            finally:
                shutil.rmtree(out, ignore_errors=True)

        return go

    run("index")()  # warm-up, not measured: the first run starts the acker and Python workers
    times = _interleaved({k: run(k) for k in FORMS}, repeat, time.perf_counter)
    print(f"3. pipeline (source -> parse -> ParquetSink, FT on), {n:,} lines (wall time):")
    for k in FORMS:
        print(f"   by {k:8s} {_figure(times[k], n)}")
    a, b = (statistics.median(times[k]) for k in FORMS)
    print(f"   index / _ft_rec: {a / b:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--spark", action="store_true", help="also the Spark pipeline (slow)")
    args = ap.parse_args()
    frames = batches(args.rows)
    matching_alone(frames, args.repeat)
    stage_alone(frames, args.repeat)
    if args.spark:
        pipeline(args.rows, max(1, args.repeat // 2))


if __name__ == "__main__":
    main()
