"""The failure path of an optimistic round (issue 27, item 4): the wordcount of
:mod:`xorack.bench_jobs` with a share of its lines failing their first attempt in a
``map_in_arrow`` stage, against plain Spark, interleaved in one session.

    python benchmarks/bench_failure_path.py --lines 200000 --rate 0.001 --repeat 3

Variants: ``plain`` (plain PySpark), ``ft on clean`` (nothing fails), ``ft on fails`` (the
optimistic round sees the failures and falls back), ``ft on tracked fails``
(``optimistic=False``: tracked rounds only).
``--variants`` picks some (comma-separated); ``--chunk-records`` is passed to the pipelines
(a variant's word ``c32`` sets ``chunk_records=32`` for it alone; ``unchunked``: its first
tracked round after a fall back keeps the configured chunks, as before issue 27 item 4;
``always32``: it draws 32-record chunks whatever the failure rate, item 4's first cut;
``unkept``: a failed row loses the optimistic round, as before kept rounds; ``unmerged``: the
keeper merges a replay round's aggregate in a Spark job of its own, as before; ``handed``: the
failing stage hands its batch over with the failure (``FailRecord(output=...)``: one call per
batch instead of a second call on the other rows); ``dies``: instead
of failing rows, the stage's Python worker dies once, in the first attempt of the task of
partition 0: a single retried Spark task (``strict``: a retried task makes the round fall
back, as before issue 27's retried tasks); ``plain dies`` is plain PySpark with the same
``mapInArrow`` stage dying the same way, ``plain stage`` with it not dying; ``plain hash`` with
a stage hashing every line as the failing stage's first round does, failing none). The
failing lines are chosen by a hash of their text (twins fail together), the same in every run.
Prints medians and the ratios to plain, the load average, and checks that every variant's
counts equal plain Spark's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FailsOnceByHash:
    """A ``map_in_arrow`` stage function: a line fails its first attempt when a hash of its
    text falls below ``rate`` (``FailRecord`` on those rows); every other line passes."""

    rate: float
    handed: bool = False  # the batch handed over with the failure (FailRecord(output=...))

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        from xorack import FailRecord
        from xorack.spark import current_round

        if current_round() == 0:
            mask = self.mask(batch)
            if any(mask):
                output = batch if self.handed else None
                raise FailRecord("injected: fails once", rows=pa.array(mask), output=output)
        return batch

    def mask(self, batch: Any) -> list[bool]:
        """Whether each line of ``batch`` fails (a CRC-32 of its text under ``rate``)."""
        import zlib

        cut = int(self.rate * (1 << 32))
        return [zlib.crc32(t.encode()) < cut for t in batch.column("text").to_pylist()]


@dataclass(frozen=True)
class HashesOnly:
    """The per-line work of :class:`FailsOnceByHash`'s first round (the hash of every line),
    failing none: plain Spark's stage for ``plain hash``, the same user code without the
    failures plain Spark cannot survive."""

    rate: float

    def __call__(self, batch: Any) -> Any:
        FailsOnceByHash(self.rate).mask(batch)
        return batch


def wordcount_ft(
    spark: Any, inp: str, out: str, rate: float, optimistic: bool, marker: str = "",
    handed: bool = False, **options: Any,
) -> dict:  # fmt: skip
    from pyspark.sql import functions as F

    from xorack.bench_jobs import DiesOnce
    from xorack.spark import ParquetSink, Pipeline

    p = Pipeline(spark, ft=True, optimistic=optimistic, **options)
    lines = p.source(spark.read.parquet(inp), name="lines")
    stage = DiesOnce(marker) if marker else FailsOnceByHash(rate, handed)
    lines = lines.map_in_arrow(stage, lines.schema, name="fails-once")
    words = lines.select(F.explode(F.split("text", " ")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    counts.sink(ParquetSink(out), name="counts")
    report = p.run()
    if report.lost != 0:
        raise RuntimeError(f"wordcount lost {report.lost} records")
    return report.as_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=0.001)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--variants", default="plain,ft on fails,ft on tracked fails")
    ap.add_argument("--chunk-records", type=int, default=None, help="Pipeline(chunk_records=)")
    args = ap.parse_args(argv)
    from xorack.bench_jobs import make_input, wordcount_plain, wordcount_plain_stage
    from xorack.spark import kept, tasks, tracked_rounds
    from xorack.spark.session import get_or_create_session

    bits = tracked_rounds.FAILED_CHUNK_BITS
    chooser = tracked_rounds.failed_chunk_bits
    spark = get_or_create_session(app_name="xorack-bench-failure-path", shuffle_partitions=8)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
    work = tempfile.mkdtemp(prefix="xorack-failpath-")
    variants = [v.strip() for v in args.variants.split(",")]
    times: dict[str, list[float]] = {v: [] for v in variants}
    reports: dict[str, dict] = {}
    try:
        inp = f"{work}/input"
        make_input(spark, args.lines, inp)
        load0 = os.getloadavg()
        for i in range(args.warmup + args.repeat):
            for v in variants:
                out = f"{work}/out-{v.replace(' ', '-')}"
                t0 = time.perf_counter()
                marker = f"{work}/died-{i}-{v.replace(' ', '-')}" if "dies" in v else ""
                if v == "plain":
                    wordcount_plain(spark, inp, out)
                elif v == "plain hash":
                    wordcount_plain_stage(spark, inp, out, "", HashesOnly(args.rate))
                elif v.startswith("plain "):  # "plain stage", "plain dies"
                    wordcount_plain_stage(spark, inp, out, marker)
                else:
                    options = (
                        {} if args.chunk_records is None else {"chunk_records": args.chunk_records}
                    )
                    for word in v.split():  # "c32": chunk_records=32 for this variant
                        if word[0] == "c" and word[1:].isdigit():
                            options = {"chunk_records": int(word[1:])}
                    rate = 0.0 if "clean" in v else args.rate
                    # "unkept": a failed row loses the optimistic round (before kept rounds)
                    kept.KEEP = "unkept" not in v
                    # "unmerged": the keeper merges a replay round's aggregate in a job of its
                    # own (before replay rounds wrote it merged)
                    kept.PREMERGE = "unmerged" not in v
                    tasks.TRUST_RETRIES = "strict" not in v
                    # "unchunked": the first tracked round after a fall back keeps the
                    # configured chunks (what ran before issue 27 item 4), for an A/B run
                    tracked_rounds.FAILED_CHUNK_BITS = 64 if "unchunked" in v else bits
                    # "always32": 32-record chunks whatever the rate (the first cut of item 4)
                    tracked_rounds.failed_chunk_bits = (
                        (lambda b, rate: min(b, bits)) if "always32" in v else chooser
                    )
                    reports[v] = wordcount_ft(
                        spark, inp, out, rate, "tracked" not in v, marker, "handed" in v,
                        **options,
                    )  # fmt: skip
                if i >= args.warmup:
                    times[v].append(time.perf_counter() - t0)
        load1 = os.getloadavg()
        read = {
            v: sorted(spark.read.parquet(f"{work}/out-{v.replace(' ', '-')}").collect())
            for v in variants
        }
        first = next(iter(read.values()))
        match = all(r == first for r in read.values())
        plain = statistics.median(times["plain"]) if "plain" in times else None
        print(
            f"wordcount, {args.lines:,} lines, {args.rate:.2%} failing once, median of "
            f"{args.repeat}; load average {load0[0]:.2f} -> {load1[0]:.2f}"
        )
        bases = [b for b in ("plain stage", "plain hash", "plain dies") if b in times]
        others = {b: statistics.median(times[b]) for b in bases}
        for v, ts in times.items():
            med = statistics.median(ts)
            ratio = f"  ÷ plain {med / plain:.2f}" if plain else ""
            ratio += "".join(f"  ÷ {b} {med / t:.2f}" for b, t in others.items())
            print(f"  {v:22s} {med:7.2f} s ({min(ts):.2f}-{max(ts):.2f}){ratio}")
        for v, r in reports.items():
            keys = (
                "rounds", "optimistic_rounds", "kept_rounds", "retried_tasks",
                "optimistic_fallbacks", "replayed", "lost",
            )  # fmt: skip
            print(f"  {v}: " + ", ".join(f"{k}={r.get(k)!r}"[:160] for k in keys if k in r))
        print(f"  results match plain: {match}")
        return 0 if match else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
