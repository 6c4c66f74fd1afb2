"""Benchmarks of whole Spark jobs written with tracked native operations, against plain Spark.

The job is Spark's ``wordcount.py`` over generated sentences (the demo's vocabulary): read
Parquet → ``select(explode(split(line)))`` → ``where(word != '')`` →
``groupBy("word").agg(count)`` → write Parquet. Three variants run back to back in one session,
each ``repeat`` times, interleaved so that drift on a noisy machine hits them alike:

* ``plain``: the job in plain PySpark;
* ``ft off``: the same operations through ``Pipeline(ft=False)`` (must cost nothing);
* ``ft on``: ``Pipeline(ft=True)`` with a ``ParquetSink``: nothing fails, so the job completes
  in one optimistic round (ids drawn in the JVM, the round acked as one XOR tree, the counts
  published by a rename; :mod:`xorack.spark.optimistic`);

and, with ``fallback=True`` (what the other paths cost, for the record):

* ``ft on, tracked``: ``Pipeline(ft=True, optimistic=False)``: tracked rounds only (every line
  persisted to the embedded acker, the count staged per chunk, acks computed from what was
  staged, the counts merged);
* ``ft on, 1 line fails``: one line of the input (and its twins) fails its first attempt in a
  ``map_in_arrow`` stage that reads the source: the optimistic round keeps its work, and the
  failed lines are replayed alone in a replay round (:mod:`xorack.spark.kept`);
* ``plain, a task retried`` and ``ft on, a task retried``: a ``mapInArrow`` / ``map_in_arrow``
  stage reads the source, and its Python worker dies once, in the first attempt of partition
  0's task: Spark retries that task (the optimistic round stands, :mod:`xorack.spark.tasks`).

Ratios are of medians from the same run. ``python -m xorack.bench_jobs --lines 1000000``.

>>> WordcountResult("plain", [2.0, 1.0, 3.0]).median
2.0
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class WordcountResult:
    variant: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def make_input(spark: Any, lines: int, path: str, partitions: int = 8, seed: int = 7) -> None:
    """``lines`` generated sentences (3-12 words) written as Parquet at ``path``."""
    from .demo import GenerateSentences

    df = spark.range(lines, numPartitions=partitions).mapInPandas(
        GenerateSentences(seed), "sid long, text string"
    )
    df.select("text").write.mode("overwrite").parquet(path)


def wordcount_plain(spark: Any, inp: str, out: str) -> None:
    from pyspark.sql import functions as F

    words = spark.read.parquet(inp).select(F.explode(F.split("text", " ")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    counts.write.mode("overwrite").parquet(out)


@dataclass(frozen=True)
class FailsOnce:
    """A ``map_in_arrow`` stage function: the lines equal to ``text`` fail their first attempt
    (``FailRecord``); every other line passes unchanged."""

    text: str

    def __call__(self, batch: Any) -> Any:
        import pyarrow.compute as pc

        from . import FailRecord
        from .spark import current_round

        if current_round() == 0:
            mask = pc.equal(batch.column("text"), self.text)
            if pc.any(mask).as_py():
                raise FailRecord("injected: fails once", rows=mask)
        return batch


@dataclass(frozen=True)
class DiesOnce:
    """A ``map_in_arrow`` stage function: the Python worker running partition 0's first task
    attempt dies, once per ``marker`` file (created first); Spark retries that task. Every line
    passes unchanged; an empty ``marker`` never dies."""

    marker: str

    def __call__(self, batch: Any) -> Any:
        import os

        from pyspark import TaskContext

        ctx = TaskContext.get()
        first = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        if first and self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(13)  # the worker dies mid-task
        return batch


def wordcount_plain_stage(
    spark: Any, inp: str, out: str, marker: str, fn: Callable[[Any], Any] | None = None
) -> None:
    """Plain PySpark's wordcount with a ``mapInArrow`` stage over the lines: ``fn`` per batch
    (default :class:`DiesOnce` with ``marker``)."""
    from pyspark.sql import functions as F

    fn = DiesOnce(marker) if fn is None else fn
    df = spark.read.parquet(inp)
    lines = df.mapInArrow(lambda batches: (fn(b) for b in batches), df.schema)
    words = lines.select(F.explode(F.split("text", " ")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    counts.write.mode("overwrite").parquet(out)


def wordcount_tracked(
    spark: Any,
    inp: str,
    out: str,
    ft: bool,
    optimistic: bool = True,
    fail_once: str | None = None,
    dies_once: str = "",
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from .spark import ParquetSink, Pipeline

    p = Pipeline(spark, ft=ft, optimistic=optimistic)
    lines = p.source(spark.read.parquet(inp), name="lines")
    if fail_once is not None:  # the lines equal to it fail their first attempt
        lines = lines.map_in_arrow(FailsOnce(fail_once), lines.schema, name="fails-once")
    if dies_once:  # its worker dies once (a marker file): a retried Spark task
        lines = lines.map_in_arrow(DiesOnce(dies_once), lines.schema, name="dies-once")
    words = lines.select(F.explode(F.split("text", " ")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    counts.sink(ParquetSink(out), name="counts")
    report = p.run()
    if ft and report.lost != 0:
        raise RuntimeError(f"wordcount lost {report.lost} records")
    return report.as_dict()


VARIANTS = ("plain", "ft off", "ft on")
FALLBACK_VARIANTS = (
    "ft on, tracked",
    "ft on, 1 line fails",
    "plain, a task retried",
    "ft on, a task retried",
)
RETRIED = "a task retried"


def _run_variant(spark: Any, variant: str, inp: str, out: str, failing: str, marker: str) -> None:
    if variant == "plain":
        wordcount_plain(spark, inp, out)
        return
    if variant == f"plain, {RETRIED}":
        wordcount_plain_stage(spark, inp, out, marker)
        return
    report = wordcount_tracked(
        spark,
        inp,
        out,
        ft=variant != "ft off",
        optimistic=variant != "ft on, tracked",
        fail_once=failing if variant == "ft on, 1 line fails" else None,
        dies_once=marker if variant == f"ft on, {RETRIED}" else "",
    )
    if variant == "ft on" and report["optimistic_fallbacks"]:
        raise RuntimeError(f"wordcount: the optimistic round fell back: {report}")
    if variant == f"ft on, {RETRIED}" and report["retried_tasks"] != 1:
        raise RuntimeError(f"wordcount: the retried task did not keep the round: {report}")


def run_wordcount(
    spark: Any,
    lines: int,
    repeat: int = 3,
    check: bool = True,
    warmup: int = 1,
    fallback: bool = False,
) -> dict[str, Any]:
    """The variants (the three above; with ``fallback`` also the tracked ones), ``repeat``
    times each, interleaved, after ``warmup`` untimed rounds (the first runs of a session pay
    for the JVM's JIT and the Python workers' start, and would tilt the ratios towards
    whichever variant ran first); medians, spreads, ratios."""
    work = tempfile.mkdtemp(prefix="xorack-wordcount-")
    try:
        inp = f"{work}/input"
        make_input(spark, lines, inp)
        failing = spark.read.parquet(inp).first()["text"]  # a line (and its twins) fails once
        names = VARIANTS + (FALLBACK_VARIANTS if fallback else ())
        results = {v: WordcountResult(v, []) for v in names}
        for i in range(warmup + repeat):
            for variant in results:
                slug = variant.replace(" ", "-").replace(",", "")
                out = f"{work}/out-{slug}"
                marker = f"{work}/died-{i}-{slug}"  # a worker of a retried variant dies once
                t0 = time.perf_counter()
                _run_variant(spark, variant, inp, out, failing, marker)
                if i >= warmup:
                    results[variant].seconds.append(time.perf_counter() - t0)
        match = None
        if check:
            read = [
                sorted(
                    spark.read.parquet(
                        f"{work}/out-{v.replace(' ', '-').replace(',', '')}"
                    ).collect()
                )
                for v in results
            ]
            match = all(r == read[0] for r in read)
        plain = results["plain"].median
        retried = {v: results[f"{v}, {RETRIED}"].median for v in ("plain", "ft on") if fallback}
        return {
            "lines": lines,
            "repeat": repeat,
            "warmup": warmup,
            "variants": {v: asdict(r) | {"median": r.median} for v, r in results.items()},
            "ft_on_over_plain": results["ft on"].median / plain,
            "ft_off_over_plain": results["ft off"].median / plain,
            # FT on with a retried task ÷ plain Spark with the same stage and retry
            "retried_over_plain_retried": (
                retried["ft on"] / retried["plain"] if retried else None
            ),
            "results_match": match,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def format_wordcount(r: dict[str, Any]) -> str:
    lines = [f"wordcount, {r['lines']:,} lines, median of {r['repeat']} (min-max):"]
    for v, d in r["variants"].items():
        lines.append(
            f"  {v:7s} {d['median']:7.2f} s  ({min(d['seconds']):.2f}-{max(d['seconds']):.2f})"
        )
    lines.append(f"  FT on / plain  {r['ft_on_over_plain']:.2f}   (target <= 1.5)")
    lines.append(f"  FT off / plain {r['ft_off_over_plain']:.2f}   (target <= 1.05)")
    plain = r["variants"]["plain"]["median"]
    for v in FALLBACK_VARIANTS:
        if v in r["variants"]:
            lines.append(f"  {v} / plain  {r['variants'][v]['median'] / plain:.2f}")
    if r.get("retried_over_plain_retried") is not None:
        x = r["retried_over_plain_retried"]
        lines.append(f"  ft on ÷ plain, a task retried in both  {x:.2f}   (target <= 1.5)")
    lines.append(f"  results match  {r['results_match']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xorack.bench_jobs", description=__doc__)
    ap.add_argument("--lines", type=int, default=1_000_000, help="input lines (default 1M)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument(
        "--fallback",
        action="store_true",
        help="also time FT on with tracked rounds only, with one line failing (its records "
        "replayed alone), and plain and FT on with a task retried",
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.lines < 1 or args.repeat < 1 or args.warmup < 0:
        print("xorack bench_jobs: --lines, --repeat must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    from .spark.session import get_or_create_session

    spark = get_or_create_session(app_name="xorack-bench-jobs", shuffle_partitions=8)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
    r = run_wordcount(spark, args.lines, args.repeat, warmup=args.warmup, fallback=args.fallback)
    print(json.dumps(r, indent=1) if args.json else format_wordcount(r))
    return 0 if r["results_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
