"""Streaming: xorack against plain Structured Streaming on the same query and input, in one
run (interleaved repeats), on the micro-batch time Spark itself reports.

The query is Spark's ``structured_network_wordcount_windowed`` over a file source: lines with an
event time, split into words, ``withWatermark("ts", "5 seconds")``,
``groupBy(F.window("ts", "10 seconds"), "word").count()``, append mode, one file per
micro-batch (``maxFilesPerTrigger=1``), ``trigger(availableNow=True)``:

- **plain**: plain Structured Streaming, the split a native ``explode(split(...))``, windows to a
  Parquet sink (Spark's file sink);
- **xorack**: the same declaration on a tracked stream (FT on, the embedded acker), windows to a
  ``ParquetSink``; no failure injected (``--pandas``: the split in a pandas stage instead).

Per run: the median of Spark's ``triggerExecution`` per data micro-batch (the first is left
out: it warms the Python workers up), the wall time of the whole query, and the sustained input
rate (input rows over the summed micro-batch times). For xorack the micro-batch time is that of
its own ``foreachBatch`` query (tagging, persisting, staging, acking, closing windows); the
write of the windows a micro-batch closes runs beside the next micro-batch
(``stream_state.OVERLAP``), so it counts in the whole query's time and in a window's latency,
and in the micro-batch time only as far as the two slow each other down (the last one is
waited for at the end of the query). Also the bytes the windowed aggregation staged per input
row (its state on disk while windows are open).

A/B variants, in the same interleaved run: ``--sync`` (each micro-batch waits for its windows'
write), ``--settle`` (each micro-batch waits at its end for a window write still running
beside it, ``stream_state.DEFER`` off) and ``--spread`` (each micro-batch spread round-robin
over the shuffle partitions, as a source declared with ``partitions`` is; a shuffle before
the tagging).

``--rate N`` runs a rate source instead (``rowsPerSecond`` N, a micro-batch each second for
``--seconds``): ``value % 100`` counted per 10 s window with a 5 s watermark, the same two
queries; per run the rows it took in, the micro-batch times, how many took longer than the 1 s
trigger (the source's rows then wait: the next micro-batch is larger) and the rows processed
per second of micro-batch time. The windows are not compared: each run reads
other rows (a rate source's rows follow the wall clock). ``--settle`` adds xorack with each
micro-batch waiting at its end for a window write still running beside it
(``stream_state.DEFER`` off: how it ran before).

    python benchmarks/bench_streaming.py [--files 12] [--lines 20000] [--repeat 3] [--json F]
        [--sync] [--spread] [--settle] [--pandas] [--rate 100000 [--seconds 30]]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

DEFAULT_DEFER = True  # the xorack runs leave a running window write beside the stream
PANDAS = False  # --pandas: xorack splits in a pandas stage (plain Spark: natively)
PARTITIONS: int | None = None  # the tracked source's partitions (--spread sets them)
WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "sloe", "yuzu", "nut"]
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)


def write_input(directory: str, files: int, lines: int) -> None:
    """File f: ``lines`` lines with event times spread over [10 f, 10 f + 10) seconds."""
    import numpy as np
    import pandas as pd

    os.makedirs(directory)
    rng = np.random.default_rng(0)
    for f in range(files):
        k = np.arange(lines)
        ts = [T0 + dt.timedelta(seconds=10 * f + 10 * j / lines) for j in k]
        words = rng.integers(0, len(WORDS), size=(lines, 4))
        text = [" ".join(WORDS[w] for w in row[: 1 + i % 4]) for i, row in enumerate(words)]
        frame = pd.DataFrame({"id": f * lines + k, "ts": ts, "line": text})
        path = f"{directory}/part-{f:03d}.json"
        frame.to_json(path, orient="records", lines=True, date_format="iso")
        at = time.time() - 3600 + f  # a file source reads the oldest first: in file order
        os.utime(path, (at, at))


def _split(pdf: Any) -> Any:
    words = pdf.assign(word=pdf["line"].str.split(" ")).explode("word")
    return words.drop(columns=["line"]).reset_index(drop=True)


def _times(progress: list[dict[str, Any]]) -> tuple[list[float], int]:
    """Seconds of each data micro-batch (triggerExecution) and the input rows."""
    data = [p for p in progress if p.get("numInputRows", 0) > 0]
    return [p["durationMs"]["triggerExecution"] / 1000 for p in data], sum(
        int(p["numInputRows"]) for p in data
    )


def _latencies(spark: Any, out: str, progress: list[dict[str, Any]]) -> list[float]:
    """Seconds from the end of the micro-batch that read a window's last input file to the
    write of its row in the sink (the newest Parquet file holding a row of it), per window.
    File ``f`` holds the event times of window ``[10 f, 10 f + 10)`` and is read by the
    ``f``-th data micro-batch (``maxFilesPerTrigger=1``)."""
    from pyspark.sql import functions as F

    data = sorted((p for p in progress if p.get("numInputRows", 0) > 0), key=lambda p: p["batchId"])
    ends = []
    for p in data:
        start = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        ends.append(start + p["durationMs"]["triggerExecution"] / 1000)
    rows = (
        spark.read.parquet(out)
        .select(F.col("window.start").alias("start"), F.input_file_name().alias("path"))
        .distinct()
        .collect()
    )
    written: dict[int, float] = {}
    for r in rows:
        f = round((r.start - T0).total_seconds() / 10)
        at = os.path.getmtime(r.path.removeprefix("file://").removeprefix("file:"))
        written[f] = max(written.get(f, 0.0), at)
    return [at - ends[f] for f, at in sorted(written.items()) if f < len(ends)]


def _to_parquet(counts: Any, out: str, **trigger: Any) -> Any:
    """Plain Structured Streaming: ``counts`` appended to Spark's Parquet sink at ``out``."""
    writer = counts.writeStream.outputMode("append").format("parquet").option("path", out)
    return writer.option("checkpointLocation", out + ".ckpt").trigger(**trigger).start()


def run_plain(spark: Any, inbox: str, out: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    lines = spark.readStream.schema("id long, ts timestamp, line string")
    lines = lines.option("maxFilesPerTrigger", 1).json(inbox).withWatermark("ts", "5 seconds")
    words = lines.select("id", "ts", F.explode(F.split("line", " ")).alias("word"))
    counts = words.groupBy(F.window("ts", "10 seconds"), "word").count()
    start = time.perf_counter()
    q = _to_parquet(counts, out, availableNow=True)
    q.awaitTermination()
    wall = time.perf_counter() - start
    times, rows = _times(q.recentProgress)
    return {
        "wall": wall,
        "batches": times,
        "rows": rows,
        "windows": spark.read.parquet(out).count(),
        "latency": _latencies(spark, out, q.recentProgress),
    }


def run_xorack_sync(spark: Any, inbox: str, out: str) -> dict[str, Any]:
    """xorack with each micro-batch waiting for its closed windows' write (``--sync``: the
    emission not overlapped with the next micro-batch, as before ``stream_state.OVERLAP``)."""
    from xorack.spark import stream_state

    stream_state.OVERLAP = False
    try:
        return run_xorack(spark, inbox, out)
    finally:
        stream_state.OVERLAP = True


def run_xorack_settled(spark: Any, inbox: str, out: str) -> dict[str, Any]:
    """xorack with each micro-batch waiting at its end for a window write still running beside
    it (``--settle``: ``stream_state.DEFER`` off)."""
    from xorack.spark import stream_state

    stream_state.DEFER = False
    try:
        return run_xorack(spark, inbox, out)
    finally:
        stream_state.DEFER = DEFAULT_DEFER


def run_xorack_spread(spark: Any, inbox: str, out: str) -> dict[str, Any]:
    """xorack with each micro-batch spread round-robin over ``spark.sql.shuffle.partitions``
    (``--spread``: ``p.source(stream, partitions=n)``, a shuffle before the tagging; a source
    without ``partitions`` keeps the micro-batch's own partitions)."""
    global PARTITIONS
    PARTITIONS = int(spark.conf.get("spark.sql.shuffle.partitions"))
    try:
        return run_xorack(spark, inbox, out)
    finally:
        PARTITIONS = None


def run_xorack(spark: Any, inbox: str, out: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline

    p = Pipeline(spark)
    stream = spark.readStream.schema("id long, ts timestamp, line string")
    lines = p.source(
        stream.option("maxFilesPerTrigger", 1).json(inbox), name="lines", partitions=PARTITIONS
    )
    lines = lines.withWatermark("ts", "5 seconds")
    if PANDAS:
        words = lines.map_in_pandas(_split, "id long, ts timestamp, word string", name="split")
    else:  # the same native split as plain Spark's
        words = lines.select("id", "ts", F.explode(F.split("line", " ")).alias("word"))
    counts = words.groupBy(F.window("ts", "10 seconds"), "word").count()
    counts.sink(ParquetSink(out), name="windows")
    start = time.perf_counter()
    run = p.start_stream(timeout=300.0, available_now=True)
    staged_bytes = 0

    def staged() -> int:
        ctx = run.ctx
        root = ctx.workdir
        total = 0
        if root and os.path.isdir(root):
            for d, _, files in os.walk(root):
                total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
        return total

    while run.query.isActive:  # the state on disk is largest just before the drain
        staged_bytes = max(staged_bytes, staged())
        time.sleep(0.2)
    report = run.wait()
    wall = time.perf_counter() - start
    times, rows = _times(run.query.recentProgress)
    assert report.lost == 0
    return {
        "wall": wall,
        "batches": times,
        "rows": rows,
        "windows": spark.read.parquet(out).count(),
        "staged_bytes": staged_bytes,
        "latency": _latencies(spark, out, run.query.recentProgress),
    }


def _rate_query(stream: Any, select: Any) -> Any:
    """The rate query on a streaming frame (plain) or a tracked source (xorack)."""
    from pyspark.sql import functions as F

    keyed = select(stream.withWatermark("timestamp", "5 seconds"))
    return keyed.groupBy(F.window("timestamp", "10 seconds"), "key").count()


def _rate_stream(spark: Any, rate: int) -> Any:
    return spark.readStream.format("rate").option("rowsPerSecond", rate).load()


def _rate_select(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select("timestamp", (F.col("value") % 100).alias("key"))


def _rate_figures(progress: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    times, rows = _times(progress)
    return {"wall": wall, "batches": times, "rows": rows}


def run_plain_rate(spark: Any, rate: int, seconds: float, out: str) -> dict[str, Any]:
    counts = _rate_query(_rate_stream(spark, rate), _rate_select)
    start = time.perf_counter()
    q = _to_parquet(counts, out, processingTime="1 second")
    time.sleep(seconds)
    until = time.monotonic() + 5.0  # between micro-batches (stopping one logs its abort)
    while q.status["isTriggerActive"] and time.monotonic() < until:
        time.sleep(0.01)
    q.stop()
    return _rate_figures(q.recentProgress, time.perf_counter() - start)


def run_xorack_rate(spark: Any, rate: int, seconds: float, out: str) -> dict[str, Any]:
    from xorack.spark import ParquetSink, Pipeline

    p = Pipeline(spark)
    counts = _rate_query(p.source(_rate_stream(spark, rate), name="rate"), _rate_select)
    counts.sink(ParquetSink(out), name="windows")
    start = time.perf_counter()
    run = p.start_stream(timeout=300.0, trigger_seconds=1.0)
    time.sleep(seconds)
    report = run.stop()
    assert report.lost == 0
    assert report.dead_lettered == 0
    return _rate_figures(run.query.recentProgress, time.perf_counter() - start)


def run_xorack_rate_settled(spark: Any, rate: int, seconds: float, out: str) -> dict[str, Any]:
    """``--settle``: each micro-batch waits at its end for a window write still running."""
    from xorack.spark import stream_state

    stream_state.DEFER = False
    try:
        return run_xorack_rate(spark, rate, seconds, out)
    finally:
        stream_state.DEFER = DEFAULT_DEFER


def rate_main(spark: Any, args: argparse.Namespace, work: str) -> None:
    runs = [("plain", run_plain_rate), ("xorack", run_xorack_rate)]
    if args.settle:
        runs.append(("xorack settled", run_xorack_rate_settled))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in runs}
    for r in range(args.repeat + 1):  # run 0 warms both up and is left out
        for name, fn in runs:
            got = fn(spark, args.rate, args.seconds, os.path.join(work, f"rate-{name}-{r}"))
            if r:
                results[name].append(got)
            print(
                f"run {r} {name}: {got['rows']:,} rows in {len(got['batches'])} micro-batches",
                file=sys.stderr,
            )
    lines = [
        f"rate source, {args.rate:,} rows/s, a micro-batch per second for {args.seconds:.0f} s, "
        f"{args.repeat} interleaved runs (medians; the first micro-batch left out)",
        "",
        "| query | rows in | micro-batch | slowest | over the 1 s trigger | processed |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    med = {}
    for name, got in results.items():
        batch = statistics.median(statistics.median(x["batches"][1:] or [0.0]) for x in got)
        slow = statistics.median(max(x["batches"][1:], default=0.0) for x in got)
        rows = statistics.median(x["rows"] for x in got)
        done = statistics.median(x["rows"] / sum(x["batches"]) for x in got)
        over = statistics.median(sum(b > 1.0 for b in x["batches"][1:]) for x in got)
        med[name] = batch
        lines.append(
            f"| {name} | {rows:,.0f} | {batch:.3f} s | {slow:.3f} s | {over:g} of "
            f"{len(got[0]['batches']) - 1} | {done:,.0f} rows/s |"
        )
    lines += [""] + [
        f"{name} / plain: micro-batch {med[name] / med['plain']:.2f}"
        for name in med
        if name != "plain"
    ]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=12, help="input files (micro-batches)")
    ap.add_argument("--lines", type=int, default=20_000, help="lines per file")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--pandas", action="store_true", help="xorack splits in a pandas stage")
    ap.add_argument(
        "--sync",
        action="store_true",
        help="also run xorack with each micro-batch waiting for its windows' write",
    )
    ap.add_argument(
        "--spread",
        action="store_true",
        help="also run xorack with each micro-batch spread round-robin (a shuffle)",
    )
    ap.add_argument("--rate", type=int, help="a rate source of this many rows/s instead")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long a --rate run lasts")
    ap.add_argument(
        "--settle",
        action="store_true",
        help="also run xorack with each micro-batch waiting for a window write beside it",
    )
    args = ap.parse_args(argv)
    global PANDAS
    PANDAS = args.pandas
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from xorack.spark import stream_state
    from xorack.spark.session import get_or_create_session

    stream_state.DEFER = DEFAULT_DEFER
    spark = get_or_create_session(app_name="xorack-bench-streaming", shuffle_partitions=4)
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="xorack-bench-stream-")
    try:
        if args.rate:
            rate_main(spark, args, work)
            return 0
        inbox = os.path.join(work, "in")
        write_input(inbox, args.files, args.lines)
        runs = [("plain", run_plain), ("xorack", run_xorack)]
        if args.sync:
            runs.append(("xorack sync", run_xorack_sync))
        if args.spread:
            runs.append(("xorack spread", run_xorack_spread))
        if args.settle:
            runs.append(("xorack settled", run_xorack_settled))
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in runs}
        for r in range(args.repeat + 1):  # run 0 warms both up and is left out
            for name, fn in runs:
                out = os.path.join(work, f"{name.replace(' ', '-')}-{r}")
                got = fn(spark, inbox, out)
                if r:
                    results[name].append(got)
                print(
                    f"run {r} {name}: {got['wall']:.1f} s, {len(got['batches'])} batches",
                    file=sys.stderr,
                )
        assert {x["windows"] for v in results.values() for x in v} == {
            results["plain"][0]["windows"]
        }, "xorack and plain Spark closed different windows"
        table = summarize(results, args)
        print(table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return 0


def summarize(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    def per_batch(x: dict[str, Any]) -> float:
        return statistics.median(x["batches"][1:] or x["batches"])

    rows = []
    med: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        batch = statistics.median(per_batch(x) for x in runs)
        wall = statistics.median(x["wall"] for x in runs)
        rate = statistics.median(x["rows"] / sum(x["batches"]) for x in runs)
        med[name] = {"batch": batch, "wall": wall, "rate": rate}
        rows.append(f"| {name} | {batch:.3f} s | {rate:,.0f} rows/s | {wall:.1f} s |")
    ratio = med["xorack"]["batch"] / med["plain"]["batch"]
    wall_ratio = med["xorack"]["wall"] / med["plain"]["wall"]
    staged = statistics.median(x["staged_bytes"] for x in results["xorack"])
    late = {  # a window's latency: median over windows, then over runs
        name: statistics.median(statistics.median(x["latency"]) for x in runs if x["latency"])
        for name, runs in results.items()
    }
    worst = {name: max(max(x["latency"]) for x in runs) for name, runs in results.items()}
    rows_in = results["xorack"][0]["rows"]
    return "\n".join(
        [
            f"{args.files} files x {args.lines} lines, {args.repeat} interleaved runs (medians)",
            "",
            "| query | micro-batch | sustained input | whole query |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"xorack / plain: micro-batch {ratio:.2f}, whole query {wall_ratio:.2f}",
            *(
                f"{name} / plain: micro-batch {m['batch'] / med['plain']['batch']:.2f}, "
                f"whole query {m['wall'] / med['plain']['wall']:.2f}"
                for name, m in med.items()
                if name not in ("plain", "xorack")
            ),
            f"windowed aggregation staged at most {staged / rows_in:.1f} bytes per input line",
            "a window's latency (end of the micro-batch of its last input to its row written): "
            f"plain {late['plain']:.2f} s (max {worst['plain']:.2f}), xorack "
            f"{late['xorack']:.2f} s (max {worst['xorack']:.2f}), "
            f"extra {late['xorack'] - late['plain']:.2f} s",
            *(
                f"{name}: a window's latency {late[name]:.2f} s (max {worst[name]:.2f}), "
                f"extra {late[name] - late['plain']:.2f} s"
                for name in late
                if name not in ("plain", "xorack")
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
