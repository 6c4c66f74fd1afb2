"""The Arrow tracked stage (``map_in_arrow``) against the pandas one (``map_in_pandas``) on the
same split-words function, figures and ratios from one run.

    python benchmarks/bench_arrow_stage.py [--lines 200000] [--repeat 3] [--no-spark]

Two parts:

1. **stage alone** (no Spark): ``runner.process`` on 10 K-line batches with a client that drops
   the events; the pandas side includes the Arrow → pandas → Arrow conversion ``mapInPandas``
   does around it. Lines/s of each and the ratio.
2. **pipeline** (real Spark, ``local[2,2]``): source → split → ParquetSink with FT on, and the
   Arrow stage with FT off; wall time of each run, the ratios between them.

Every figure is the median of ``--repeat`` runs with its min-max spread.
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
import pyarrow as pa
import pyarrow.compute as pc


def split_arrow(b: pa.RecordBatch) -> pa.RecordBatch:
    words = pc.split_pattern(b.column("line"), " ")
    return b.take(pc.list_parent_indices(words)).append_column("word", pc.list_flatten(words))


def split_pandas(pdf: pd.DataFrame) -> pd.DataFrame:
    out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
    return out[out["word"].notna()]


def lines(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(5000)])
    counts = rng.integers(1, 9, n)
    words = vocab[rng.integers(0, len(vocab), int(counts.sum()))]
    cuts = np.cumsum(counts)[:-1]
    text = [" ".join(ws) for ws in np.split(words, cuts)]
    return pa.table({"id": pa.array(np.arange(n), pa.int64()), "line": pa.array(text)})


class _NullClient:
    def xor(self, src, values) -> None:
        pass

    def fail(self, src, reason) -> None:
        pass


def _figure(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} s [{min(times):.3f}-{max(times):.3f}]"


def _median(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def stage_alone(n: int, repeat: int) -> None:
    from xorack import acker
    from xorack.spark.arrow_stage import ArrowStageRunner
    from xorack.spark.ids import i64
    from xorack.spark.stages import StageRunner

    table = lines(n)
    rng_ids = acker.new_ids(2 * n)
    table = table.append_column("_ft_src", pa.array(i64(rng_ids[:n]))).append_column(
        "_ft_rec", pa.array(i64(rng_ids[n:]))
    )
    batches = table.to_batches(max_chunksize=10_000)
    schema = pa.schema([("id", pa.int64()), ("word", pa.string())])
    arrow = ArrowStageRunner("split", split_arrow, schema, location="-")
    pandas = StageRunner("split", split_pandas, ("id", "word"), location="-")
    client = _NullClient()

    def run_arrow() -> None:
        for b in batches:
            arrow.process(b, client)

    def run_pandas() -> None:
        for b in batches:  # what mapInPandas adds around the function: Arrow <-> pandas
            out = pandas.process(b.to_pandas(), client)
            pa.RecordBatch.from_pandas(out, preserve_index=False)

    t_arrow, t_pandas = _median(run_arrow, repeat), _median(run_pandas, repeat)
    ma, mp = statistics.median(t_arrow), statistics.median(t_pandas)
    print(f"stage alone, {n:,} lines in 10 K batches (FT on, events dropped):")
    print(f"  arrow   {_figure(t_arrow)}  {n / ma / 1e6:.2f} M lines/s")
    print(f"  pandas  {_figure(t_pandas)}  {n / mp / 1e6:.2f} M lines/s")
    print(f"  pandas / arrow time: {mp / ma:.2f}")


def pipeline(n: int, repeat: int) -> None:
    from xorack.spark import ParquetSink, Pipeline
    from xorack.spark.session import get_or_create_session

    spark = get_or_create_session(app_name="bench-arrow-stage")
    df = spark.createDataFrame(lines(n).to_pandas()).repartition(2).cache()
    df.count()
    tmp = tempfile.mkdtemp(prefix="xorack-bench-arrow-")

    def run(kind: str, ft: bool) -> Callable[[], object]:
        def go() -> None:
            p = Pipeline(spark, ft=ft)
            src = p.source(df, name="lines", partitions=2)
            if kind == "arrow":
                words = src.map_in_arrow(split_arrow, "id long, word string", name="split")
            else:
                words = src.map_in_pandas(split_pandas, "id long, word string", name="split")
            words.sink(ParquetSink(f"{tmp}/{kind}-{ft}"), name="out")
            report = p.run()
            assert not ft or report.lost == 0

        return go

    cases = {
        "arrow FT on": run("arrow", True),
        "pandas FT on": run("pandas", True),
        "arrow FT off": run("arrow", False),
        "pandas FT off": run("pandas", False),
    }
    run("arrow", True)()  # warm-up: Python workers, the acker service's first start
    times = {name: [] for name in cases}
    for _ in range(repeat):  # interleaved, so a slow moment of the machine hits every case
        for name, go in cases.items():
            t0 = time.perf_counter()
            go()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"pipeline source -> split -> ParquetSink, {n:,} lines, local[2,2]:")
    for name, t in times.items():
        print(f"  {name:14s} {_figure(t)}")
    print(f"  pandas / arrow, FT on : {med['pandas FT on'] / med['arrow FT on']:.2f}")
    print(f"  pandas / arrow, FT off: {med['pandas FT off'] / med['arrow FT off']:.2f}")
    print(f"  arrow FT on / off     : {med['arrow FT on'] / med['arrow FT off']:.2f}")
    print(f"  pandas FT on / off    : {med['pandas FT on'] / med['pandas FT off']:.2f}")
    shutil.rmtree(tmp, ignore_errors=True)
    spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=float, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true", help="only the stage-alone part")
    args = ap.parse_args()
    n = int(args.lines)
    stage_alone(n, args.repeat)
    if not args.no_spark:
        pipeline(n, args.repeat)


if __name__ == "__main__":
    main()
