"""``xorack bench``: xorack against the alternatives a user would pick, measured in one run.

Five comparisons on the same generated workload (``xorack._workload``: record trees with
fan-out, events shuffled across batches of 64 K):

1. completion tracking, events/s: native ``AckTable``, the Python fallback, a plain ``dict``
   acker, Spark's own ``groupBy(src).agg(bit_xor(value))``, and the Storm/Heron rotating-bucket
   design in C++ (``xorack._baselines.RotatingAcker``); ratios against native;
2. memory per pending source record for each;
3. partition assignment: ``spark_partition_ids`` vs Spark's ``repartition(n, col)`` +
   ``spark_partition_id()``, keys/s;
4. the demo pipeline with FT ON vs OFF, wall-time ratio, at two sizes;
5. recovery under failures: xorack's record replay vs rerunning the whole job vs plain Spark's
   task retries (and job failure when the fault is deterministic);
6. Spark's wordcount written with tracked native operations, against plain Spark;
7. TPC-H queries and PageRank as pipelines, against plain Spark (``xorack.bench_tpch``;
   ``--tpch`` runs this part alone).

Every figure is a median over ``--repeat`` runs with its min-max spread. The report (Markdown
table + PNG plot) states the machine. A part whose dependency is missing says "not available"
instead of failing the whole report.

    xorack bench --quick --out /tmp/xorack-bench      # < 2 min
    xorack bench --out bench-report                   # default sizes, < ~15 min on 2 cores
    xorack bench --tpch --scale 0.1 --out DIR         # TPC-H and PageRank only
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
import traceback
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ._workload import Workload, generate_workload, run_acker
from .spark.pipeline import REPORT_KEYS as DEMO_KEYS  # the demo --json contract (no pyspark import)

NOT_AVAILABLE = "not available"

# ----------------------------------------------------------------------------------------------
# Configuration and results
# ----------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """What to run and how big. ``quick`` shrinks every size so the report takes < 2 min."""

    sizes: list[int] = field(default_factory=lambda: [1_000_000, 10_000_000])
    repeat: int = 3
    out: Path = Path("bench-report")
    quick: bool = False
    parts: tuple[int, ...] = (1, 2, 3, 4, 5, 6)  # TPC-H (7) with --tpch or --parts
    slow_max: int = 1_000_000  # largest size for the fallback and the dict acker
    spark_max: int = 1_000_000  # largest size for Spark's groupBy/bit_xor (events = ~6.5x this)
    memory_size: int = 1_000_000  # pending source records for the memory comparison
    partition_keys: int = 2_000_000
    num_partitions: int = 200
    demo_sizes: list[int] = field(default_factory=lambda: [100_000, 1_000_000, 10_000_000])
    # demo runs of at least this many records each run in a process of their own, on 8
    # partitions (`xorack demo --partitions 8`): the report gets each run's peak driver RSS
    demo_process_from: int = 1_000_000
    recovery_records: int = 100_000
    wordcount_lines: int = 1_000_000  # part 6: the wordcount job with native operations
    fail_rates: list[float] = field(default_factory=lambda: [0.001, 0.01])
    run_budget_s: float = 90.0  # stop repeating a measurement once it has used this much time
    seed: int = 0
    tpch_scale: float = 0.1  # part 7: the TPC-H scale factor (PageRank: 200,000 nodes per unit)
    tpch_cache: str | None = None  # where the generated data is kept (None: ~/.cache/xorack/tpch)
    verbose: bool = False  # Spark's logs of the task failures part 5 causes on purpose, left on

    @classmethod
    def quick_config(cls, out: Path) -> BenchConfig:
        """Tiny sizes: the whole report in under two minutes."""
        return cls(
            sizes=[65_536],
            repeat=3,
            out=out,
            quick=True,
            slow_max=65_536,
            spark_max=65_536,
            memory_size=65_536,
            partition_keys=200_000,
            demo_sizes=[2_000, 10_000],
            recovery_records=10_000,
            wordcount_lines=50_000,
            run_budget_s=20.0,
            tpch_scale=0.01,
        )


@dataclass
class Stat:
    """Median of several runs and its spread (min-max)."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        """Summary of ``values`` (at least one)."""
        return cls(statistics.median(values), min(values), max(values), len(values))

    def scaled(self, factor: float) -> Stat:
        """The same statistic for ``factor * x`` (factor > 0)."""
        return Stat(self.median * factor, self.low * factor, self.high * factor, self.runs)

    def inverse(self, numerator: float) -> Stat:
        """The statistic of ``numerator / x`` (rates from times: the bounds swap)."""
        return Stat(numerator / self.median, numerator / self.high, numerator / self.low, self.runs)

    def fmt(self, unit: float = 1.0, digits: int = 3) -> str:
        """``median (low-high)`` in units of ``unit``."""
        m, lo, hi = self.median / unit, self.low / unit, self.high / unit
        if lo == hi:
            return f"{_g(m, digits)} (n={self.runs})"
        return f"{_g(m, digits)} ({_g(lo, digits)}-{_g(hi, digits)}, n={self.runs})"


@dataclass
class TrackingResult:
    """Part 1: one acker at one size."""

    name: str
    sources: int
    events: int  # births + events
    seconds: Stat | None
    events_per_s: Stat | None
    ratio_vs_native: float | None = None
    note: str = ""


@dataclass
class ChurnResult:
    """Part 1b: the AckTable's steady state (churn) of one backend, with its yardstick."""

    backend: str
    pending: int
    batch: int
    events_per_s: Stat | None
    read_rate: float | None  # random 64-byte reads/s over the table's size, same run (best)
    wheel_ids_per_s: Stat | None  # TimeoutWheel discard + add on the same churn
    bytes_per_pending: float | None  # table + wheel, after the rounds
    note: str = ""
    wheel_rotate_ids_per_s: Stat | None = None  # TimeoutWheel add + rotate, its steady state


@dataclass
class MemoryResult:
    """Part 2: memory per pending source record."""

    name: str
    sources: int
    bytes_per_source: float | None
    method: str


@dataclass
class PartitionResult:
    """Part 3: partition ids for ``keys`` keys of one type."""

    key_type: str
    keys: int
    xorack_keys_per_s: Stat | None
    spark_keys_per_s: Stat | None
    ids_match: bool | None
    note: str = ""
    mean_key_bytes: float = 8.0


@dataclass
class DemoResult:
    """Part 4: demo pipeline wall time with FT ON and OFF at one size."""

    records: int
    ft_on_s: Stat | None
    ft_off_s: Stat | None
    ratio: Stat | None  # per-pair ON/OFF ratios
    lost: int | None
    results_match: bool | None
    note: str = ""
    # a run in a process of its own: the largest peak RSS of the driver's Python process (the
    # embedded acker and its storage live there) over the FT OFF / FT ON runs, MiB
    rss_off_mb: float | None = None
    rss_on_mb: float | None = None


@dataclass
class RecoveryResult:
    """Part 5: one way of recovering from ``fail_rate`` of records failing once."""

    strategy: str
    fail_rate: float
    records: int
    records_redone: Stat | None
    wall_s: Stat | None
    extra_wall_s: Stat | None
    outcome: str


@dataclass
class Report:
    """Everything ``xorack bench`` measured, plus the machine it ran on."""

    machine: dict[str, str]
    config: dict[str, Any]
    tracking: list[TrackingResult] = field(default_factory=list)
    memory: list[MemoryResult] = field(default_factory=list)
    churn: list[ChurnResult] = field(default_factory=list)
    partitions: list[PartitionResult] = field(default_factory=list)
    demo: list[DemoResult] = field(default_factory=list)
    recovery: list[RecoveryResult] = field(default_factory=list)
    jobs: dict[str, Any] = field(default_factory=dict)  # part 6: bench_jobs.run_wordcount
    tpch: dict[str, Any] = field(default_factory=dict)  # part 7: bench_tpch.run_queries
    notes: list[str] = field(default_factory=list)
    total_seconds: float = 0.0


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def _g(x: float, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, thousands separated when large."""
    if x == 0 or not np.isfinite(x):
        return str(x)
    if abs(x) >= 10**digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# fn: Callable[..., ...] rather than [[], ...]: the callers' lambdas bind loop variables as default
# arguments, which mypy cannot type against a no-argument Callable.
def _timed_runs(fn: Callable[..., Any], repeat: int, budget_s: float) -> tuple[list[float], Any]:
    """Runs ``fn`` up to ``repeat`` times (at least once; fewer when over ``budget_s``).

    Returns the wall times and the last result. A GC pass before each run keeps a previous
    run's garbage out of the timing.
    """
    times: list[float] = []
    result = None
    spent = 0.0
    for _ in range(max(1, repeat)):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > budget_s:
            break
    return times, result


def machine_info() -> dict[str, str]:
    """Cores, memory, CPU model, load, and the versions that matter."""
    info: dict[str, str] = {
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory"] = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    with contextlib.suppress(OSError):
        info["load average (start)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for mod in ("pyarrow", "pyspark", "pandas"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = NOT_AVAILABLE
    import xorack

    info["xorack"] = xorack.__version__
    info["xorack backend"] = xorack.backend
    return info


# ----------------------------------------------------------------------------------------------
# Ackers behind one shape: register(src, births), xor(src, values) -> completed ids
# ----------------------------------------------------------------------------------------------


def acker_factories() -> dict[str, Callable[[], Any] | str]:
    """Name -> factory of a fresh acker, or the reason it is not available."""
    import xorack
    from xorack import kernels

    out: dict[str, Callable[[], Any] | str] = {}
    try:
        ack_table = xorack.AckTable
    except (ImportError, AttributeError) as exc:
        ack_table = None
        reason = f"{NOT_AVAILABLE}: xorack.AckTable ({exc})"
    if ack_table is None:
        out["xorack native"] = reason
        out["xorack fallback"] = reason
    else:
        if kernels.native_available():
            out["xorack native"] = lambda: ack_table(backend="native")
        else:
            out["xorack native"] = f"{NOT_AVAILABLE}: native extension not built"
        out["xorack fallback"] = lambda: ack_table(backend="python")
    try:
        from xorack._baselines import RotatingAcker

        out["C++ rotating buckets (Storm/Heron)"] = lambda: RotatingAcker(3)
    except ImportError as exc:
        out["C++ rotating buckets (Storm/Heron)"] = f"{NOT_AVAILABLE}: xorack._baselines ({exc})"
    from xorack._dict_acker import DictAcker

    out["Python dict"] = DictAcker
    for name, factory in out.items():  # probe once: a half-built backend is "not available"
        if not isinstance(factory, str):
            try:
                factory().register(np.array([1], np.uint64), np.array([1], np.uint64))
            except Exception as exc:
                out[name] = f"{NOT_AVAILABLE}: {_err(exc).removeprefix('error: ')}"
    return out


SLOW_ACKERS = ("xorack fallback", "Python dict")
NATIVE = "xorack native"
SPARK_XOR = "Spark groupBy + bit_xor"


# ----------------------------------------------------------------------------------------------
# Spark
# ----------------------------------------------------------------------------------------------

_SPARK_MASTER = "local[2,2]"  # 2 cores; 2 = task attempts (local mode ignores task.maxFailures)


def get_spark():
    """The bench's local Spark session (created on first use, re-created if someone stopped it)."""
    from xorack.spark.session import get_or_create_session

    return get_or_create_session(
        master=_SPARK_MASTER,
        app_name="xorack-bench",
        shuffle_partitions=4,
        extra_conf={
            "spark.sql.adaptive.enabled": "false",  # exact partition counts, stable plans
            "spark.driver.memory": "4g",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        },
    )


def _events_table(w: Workload):
    """Births + events as an Arrow table (src, value) of int64 (Spark has no uint64)."""
    import pyarrow as pa

    src = np.concatenate([w.src_ids, w.event_src]).view(np.int64)
    val = np.concatenate([w.births, w.event_xor]).view(np.int64)
    return pa.table({"src": src, "value": val})


def spark_xor_runs(w: Workload, repeat: int, budget_s: float) -> tuple[Stat, Stat, int]:
    """Spark's way: groupBy(src).agg(bit_xor(value)), zero = complete.

    Returns (end-to-end seconds incl. building the DataFrame from Arrow, aggregation-only
    seconds on a cached DataFrame, completed count).
    """
    from pyspark.sql import functions as F

    spark = get_spark()
    table = _events_table(w)

    def query(df) -> int:
        agg = df.groupBy("src").agg(F.bit_xor("value").alias("x"))
        return agg.filter(F.col("x") == 0).count()

    def end_to_end() -> int:
        return query(spark.createDataFrame(table))

    query(spark.createDataFrame(table.slice(0, 10_000)))  # warm-up: JIT, Python workers

    e2e, done = _timed_runs(end_to_end, repeat, budget_s)
    cached = spark.createDataFrame(table).cache()
    cached.count()
    agg_only, done2 = _timed_runs(lambda: query(cached), repeat, budget_s)
    cached.unpersist()
    if done != done2:
        raise RuntimeError(f"Spark bit_xor runs disagree: {done} vs {done2}")
    return Stat.of(e2e), Stat.of(agg_only), int(done)


# ----------------------------------------------------------------------------------------------
# Part 1 and 2: completion tracking and memory
# ----------------------------------------------------------------------------------------------


def part_tracking(cfg: BenchConfig, report: Report, workloads: dict[int, Workload]) -> None:
    """Events/s of every acker on the same workloads; ratios against native, size by size."""
    factories = acker_factories()
    for n in cfg.sizes:
        w = workloads[n]
        total_events = w.num_sources + w.num_events
        rows: list[TrackingResult] = []
        for name, factory in factories.items():
            if isinstance(factory, str):
                rows.append(TrackingResult(name, n, total_events, None, None, note=factory))
                continue
            if name in SLOW_ACKERS and n > cfg.slow_max:
                note = f"skipped above {cfg.slow_max:,} sources (too slow to repeat)"
                rows.append(TrackingResult(name, n, total_events, None, None, note=note))
                continue
            _progress(f"part 1: {name}, {n:,} sources, {total_events:,} events")
            try:
                times, done = _timed_runs(
                    lambda f=factory, w=w: run_acker(f(), w), cfg.repeat, cfg.run_budget_s
                )
            except Exception as exc:  # a broken acker is a line in the report, not a crash
                rows.append(TrackingResult(name, n, total_events, None, None, note=_err(exc)))
                continue
            secs = Stat.of(times)
            note = "" if done == n else f"WRONG: {done:,} of {n:,} completed"
            rows.append(
                TrackingResult(name, n, total_events, secs, secs.inverse(total_events), note=note)
            )
            assert rows[-1].events_per_s is not None  # just measured
            _progress(f"        {rows[-1].events_per_s.median / 1e6:.2f} M events/s")
        rows.extend(_spark_tracking(cfg, w))
        native = next((r for r in rows if r.name == NATIVE and r.events_per_s), None)
        for r in rows:
            if native and r.events_per_s:
                assert native.events_per_s is not None  # picked for having one
                r.ratio_vs_native = r.events_per_s.median / native.events_per_s.median
        report.tracking.extend(rows)


def part_churn(cfg: BenchConfig, report: Report) -> None:
    """The acker's steady state: ``memory_size`` ids pending, rounds of 64 K final acks + 64 K
    registrations (``xorack._churn``), native and fallback, with the random-read yardstick."""
    from ._churn import run_churn
    from .kernels import native_available

    n = cfg.memory_size
    batch = min(1 << 16, max(n // 4, 1))
    for backend, rounds, wheel_rounds in (("native", 20, 6), ("python", 3, 2)):
        if backend == "native" and not native_available():
            report.churn.append(
                ChurnResult(backend, n, batch, None, None, None, None, "native not built")
            )
            continue
        _progress(f"part 1b: churn, {backend}, {n:,} pending, {rounds} rounds of 2 x {batch:,}")
        try:
            run = run_churn(backend, n, batch, rounds, seed=cfg.seed, wheel_rounds=wheel_rounds)
        except Exception as exc:
            report.churn.append(ChurnResult(backend, n, batch, None, None, None, None, _err(exc)))
            continue
        report.churn.append(
            ChurnResult(
                backend,
                n,
                batch,
                Stat.of(run.rates()),
                run.read_rate(),
                Stat.of([batch / s for s in run.wheel_seconds]) if batch else None,
                run.bytes_per_pending(),
                wheel_rotate_ids_per_s=Stat.of(run.wheel_rotate_rates()),
            )
        )


def _spark_tracking(cfg: BenchConfig, w: Workload) -> list[TrackingResult]:
    n = w.num_sources
    total = n + w.num_events
    if n > cfg.spark_max:
        note = f"skipped above {cfg.spark_max:,} sources (see the smaller size)"
        return [TrackingResult(SPARK_XOR, n, total, None, None, note=note)]
    _progress(f"part 1: {SPARK_XOR}, {n:,} sources, {total:,} events")
    try:
        e2e, agg_only, done = spark_xor_runs(w, cfg.repeat, cfg.run_budget_s * 2)
    except Exception as exc:
        return [TrackingResult(SPARK_XOR, n, total, None, None, note=_err(exc))]
    note = "" if done == n else f"WRONG: {done:,} of {n:,} completed"
    return [
        TrackingResult(
            SPARK_XOR + " (from Arrow, end to end)", n, total, e2e, e2e.inverse(total), note=note
        ),
        TrackingResult(
            SPARK_XOR + " (cached DataFrame)",
            n,
            total,
            agg_only,
            agg_only.inverse(total),
            note=note,
        ),
    ]


def part_memory(cfg: BenchConfig, report: Report) -> None:
    """Bytes per pending source record, each structure holding ``memory_size`` registered ids."""
    import xorack

    n = cfg.memory_size
    w = generate_workload(n, seed=cfg.seed + 1)
    factories = acker_factories()
    _progress(f"part 2: memory with {n:,} pending source records")

    for name in (NATIVE, "xorack fallback"):
        factory = factories[name]
        if isinstance(factory, str):
            report.memory.append(MemoryResult(name, n, None, factory))
            continue
        backend = "native" if name == NATIVE else "python"
        try:
            table = factory()
            for src, births in w.birth_batches():
                table.register(src, births)
            wheel = _timeout_wheel(xorack, backend)
            wheel.add(w.src_ids)
            per = (table.nbytes + wheel.nbytes) / n
            method = "AckTable.nbytes + TimeoutWheel(3).nbytes"
        except Exception as exc:
            per, method = None, _err(exc)
        report.memory.append(MemoryResult(name, n, per, method))

    factory = factories["C++ rotating buckets (Storm/Heron)"]
    if isinstance(factory, str):
        report.memory.append(MemoryResult("C++ rotating buckets (Storm/Heron)", n, None, factory))
    else:
        acker = factory()
        for src, births in w.birth_batches():
            acker.register(src, births)
        report.memory.append(
            MemoryResult(
                "C++ rotating buckets (Storm/Heron)",
                n,
                acker.nbytes / n,
                "counting allocator, glibc chunk sizes (requested bytes: "
                f"{acker.nbytes_requested / n:.1f}/record); holds the timeout too",
            )
        )
        del acker

    from xorack._dict_acker import DictAcker

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    acker = DictAcker()
    for src, births in w.birth_batches():
        acker.register(src, births)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    report.memory.append(
        MemoryResult(
            "Python dict",
            n,
            (after - before) / n,
            "tracemalloc (dict + int objects); no timeout structure "
            f"(sys.getsizeof estimate: {acker.nbytes / n:.1f}/record)",
        )
    )
    del acker
    report.memory.append(
        MemoryResult(
            SPARK_XOR,
            n,
            None,
            "n/a: no state between jobs; every event is shuffled (and spilled) per aggregation",
        )
    )


def _timeout_wheel(xorack: Any, backend: str) -> Any:
    try:
        return xorack.TimeoutWheel(3, backend=backend)
    except TypeError:
        return xorack.TimeoutWheel(3)


# ----------------------------------------------------------------------------------------------
# Part 3: partition assignment
# ----------------------------------------------------------------------------------------------


def _partition_keys(kind: str, n: int, seed: int):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    if kind == "int64":
        return pa.array(rng.integers(-(2**62), 2**62, size=n, dtype=np.int64))
    # short strings, 6-14 bytes, as word keys
    nums = rng.integers(0, 10**9, size=n)
    return pa.array([f"w{x}" for x in nums.tolist()], type=pa.string())


def part_partitions(cfg: BenchConfig, report: Report) -> None:
    """keys/s of ``spark_partition_ids`` and of Spark's repartition + spark_partition_id()."""
    import pyarrow.compute as pc

    import xorack

    n, parts = cfg.partition_keys, cfg.num_partitions
    for kind in ("int64", "string"):
        _progress(f"part 3: partition ids, {n:,} {kind} keys, {parts} partitions")
        keys = _partition_keys(kind, n, cfg.seed + 2)
        try:
            spark_partition_ids = xorack.spark_partition_ids
            ids = spark_partition_ids([keys], parts)
            times, _ = _timed_runs(
                lambda sp=spark_partition_ids, k=keys: sp([k], parts), max(cfg.repeat, 5), 30.0
            )
            ours: Stat | None = Stat.of(times).inverse(n)
            note = ""
        except Exception as exc:
            ids, ours, note = None, None, _err(exc)
        try:
            theirs, hist = _spark_partition_runs(keys, parts, cfg)
        except Exception as exc:
            theirs, hist, note = None, None, (note + " " + _err(exc)).strip()
        match = None
        if ids is not None and hist is not None:
            match = bool(np.array_equal(np.bincount(np.asarray(ids), minlength=parts), hist))
        mean_bytes = 8.0 if kind == "int64" else float(np.mean(pc.binary_length(keys)))
        report.partitions.append(
            PartitionResult(kind, n, ours, theirs, match, note, float(mean_bytes))
        )


def _spark_partition_runs(keys, parts: int, cfg: BenchConfig) -> tuple[Stat, np.ndarray]:
    """Spark computing the same ids on a cached DataFrame; also the per-partition counts."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    spark = get_spark()
    df = spark.createDataFrame(pa.table({"k": keys})).cache()
    df.count()
    with_ids = df.repartition(parts, "k").select(F.spark_partition_id().alias("p"))

    def run() -> None:
        with_ids.write.format("noop").mode("overwrite").save()

    times, _ = _timed_runs(run, cfg.repeat, cfg.run_budget_s)
    hist = np.zeros(parts, dtype=np.int64)
    for row in with_ids.groupBy("p").count().collect():
        hist[row["p"]] = row["count"]
    df.unpersist()
    return Stat.of(times).inverse(len(keys)), hist


# ----------------------------------------------------------------------------------------------
# Parts 4 and 5: the demo pipeline (through a small adapter) and recovery
# ----------------------------------------------------------------------------------------------


class DemoUnavailable(RuntimeError):
    """The demo job cannot be run from here (not written yet, or it failed)."""


def run_demo(
    records: int, ft: bool, fail_rate: float = 0.0, seed: int = 0, verbose: bool = False
) -> dict[str, Any]:
    """Runs the demo pipeline once in this process; returns its ``--json`` report.

    Adapter: ``xorack.demo.run_demo(DemoConfig(...), spark, progress=False)`` on the bench's
    Spark session when the demo offers it, else ``xorack.demo.main([... "--json"])`` with its
    stdout parsed. ``wall_seconds`` is the pipeline's own wall time (Spark start excluded).
    """
    try:
        from xorack import demo
    except ImportError as exc:
        raise DemoUnavailable(f"xorack.demo is missing ({exc})") from exc
    run_fn = getattr(demo, "run_demo", None)
    config = getattr(demo, "DemoConfig", None)
    t0 = time.perf_counter()
    if run_fn is not None and config is not None:
        wanted = {
            "records": records, "ft": ft, "fail_rate": fail_rate, "seed": seed,
            "poison_rate": 0.0, "drop_rate": 0.0,  # only the failures this part injects
            "verbose": verbose,
        }  # fmt: skip
        known = {f.name for f in dataclasses.fields(config)}
        cfg = config(**{k: v for k, v in wanted.items() if k in known})
        out = dict(run_fn(cfg, spark=get_spark(), progress=False))
    else:
        out = _demo_via_main(demo, records, ft, fail_rate, seed)
    missing = [k for k in DEMO_KEYS if k not in out]
    if missing:
        raise DemoUnavailable(f"the demo report lacks {', '.join(missing)}")
    if out.get("wall_seconds") in (None, 0, 0.0):
        out["wall_seconds"] = time.perf_counter() - t0
    return out


def run_demo_process(records: int, ft: bool, seed: int = 0, partitions: int = 8) -> dict[str, Any]:
    """Runs ``xorack demo`` in a process of its own (no failures injected); returns its
    ``--json`` report, whose ``driver_peak_rss_mb`` is then that run's own peak and whose
    ``wall_seconds`` leaves out Spark's start."""
    import subprocess

    argv = [
        sys.executable, "-m", "xorack", "demo",
        "--records", str(records),
        "--partitions", str(partitions),
        "--ft", "on" if ft else "off",
        "--fail-rate", "0", "--poison-rate", "0", "--drop-rate", "0",
        "--seed", str(seed),
        "--json", "--no-progress",
    ]  # fmt: skip
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    out = _last_json(proc.stdout)
    if out is None:
        raise RuntimeError(
            f"xorack demo --records {records} printed no JSON (exit {proc.returncode}): "
            f"{proc.stderr.strip().splitlines()[-1:]}"
        )
    return out


def _demo_via_main(demo: Any, records: int, ft: bool, fail_rate: float, seed: int) -> dict:
    main = getattr(demo, "main", None)
    if main is None:
        raise DemoUnavailable("xorack.demo has neither run_demo(cfg) nor main(argv)")
    argv = [
        "--records", str(records),
        "--ft", "on" if ft else "off",
        "--fail-rate", str(fail_rate),
        "--poison-rate", "0",
        "--drop-rate", "0",
        "--seed", str(seed),
        "--json",
    ]  # fmt: skip
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out = _last_json(buf.getvalue())
    if out is None:
        raise DemoUnavailable(f"xorack demo {' '.join(argv)} printed no JSON (exit {rc})")
    return out


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    with contextlib.suppress(json.JSONDecodeError):  # a pretty-printed object
        start = text.index("{") if "{" in text else -1
        if start >= 0:
            return json.loads(text[start:])
    return None


def part_demo(cfg: BenchConfig, report: Report) -> dict[tuple[int, bool], list[float]]:
    """FT ON vs OFF wall time at each demo size (runs alternate ON/OFF to share noise)."""
    walls: dict[tuple[int, bool], list[float]] = {}
    for n in cfg.demo_sizes:
        _progress(f"part 4: demo, {n:,} records, FT on/off x {cfg.repeat}")
        on: list[float] = []
        off: list[float] = []
        lost = 0
        match = True
        alone = n >= cfg.demo_process_from
        rss: dict[bool, list[float]] = {False: [], True: []}
        try:
            if not alone:
                run_demo(min(n, 1000), ft=True, seed=cfg.seed)  # warm-up: JVM, workers, imports
            spent = 0.0
            for i in range(max(1, cfg.repeat)):
                if alone:
                    r_off = run_demo_process(n, ft=False, seed=cfg.seed + i)
                    r_on = run_demo_process(n, ft=True, seed=cfg.seed + i)
                    for ft, r in ((False, r_off), (True, r_on)):
                        if r.get("driver_peak_rss_mb") is not None:
                            rss[ft].append(float(r["driver_peak_rss_mb"]))
                else:
                    r_off = run_demo(n, ft=False, seed=cfg.seed + i)
                    r_on = run_demo(n, ft=True, seed=cfg.seed + i)
                off.append(float(r_off["wall_seconds"]))
                on.append(float(r_on["wall_seconds"]))
                lost += int(r_on["lost"])
                match = match and bool(r_on["results_match"])
                spent += off[-1] + on[-1]
                if spent > cfg.run_budget_s * 2:
                    break
        except DemoUnavailable as exc:
            report.demo.append(
                DemoResult(n, None, None, None, None, None, f"{NOT_AVAILABLE}: {exc}")
            )
            return walls
        except Exception as exc:
            report.demo.append(DemoResult(n, None, None, None, None, None, _err(exc)))
            continue
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        result = DemoResult(n, Stat.of(on), Stat.of(off), Stat.of(ratios), lost, match)
        if alone:
            result.note = "a process per run, 8 partitions"
            result.rss_off_mb = max(rss[False]) if rss[False] else None
            result.rss_on_mb = max(rss[True]) if rss[True] else None
        report.demo.append(result)
        walls[(n, True)] = on
        walls[(n, False)] = off
    return walls


def part_recovery(
    cfg: BenchConfig, report: Report, walls: dict[tuple[int, bool], list[float]]
) -> None:
    """Work redone when a share of records fails once, three ways:

    - xorack (demo, FT on): only the failed source records are replayed, in a second round;
    - plain Spark with the same faulty function (demo, FT off): the failure is deterministic in
      the first round, so Spark's task retry fails again and the job fails; the user reruns the
      whole job (assuming the cause was transient): a wasted run + a full run;
    - plain Spark with a transient fault (fails on a task's first attempt only, a synthetic
      fan-out job of the same size): Spark's task retry reruns every task holding a failure.
    """
    n = cfg.recovery_records
    base_on = walls.get((n, True))
    base_off = walls.get((n, False))
    try:
        if base_on is None or base_off is None:
            _progress(f"part 5: failure-free demo runs, {n:,} records")
            base_on = [run_demo(n, True, seed=cfg.seed)["wall_seconds"] for _ in range(cfg.repeat)]
            base_off = [
                run_demo(n, False, seed=cfg.seed)["wall_seconds"] for _ in range(cfg.repeat)
            ]
    except DemoUnavailable as exc:
        report.recovery.append(
            RecoveryResult(
                "xorack record replay", 0.0, n, None, None, None, f"{NOT_AVAILABLE}: {exc}"
            )
        )
        base_on = base_off = None
    except Exception as exc:
        report.recovery.append(
            RecoveryResult("xorack record replay", 0.0, n, None, None, None, _err(exc))
        )
        base_on = base_off = None
    clean_synthetic: list[float] | None = None
    for rate in cfg.fail_rates:
        if base_on is not None and base_off is not None:
            _safe_rows(
                report,
                "xorack record replay",
                rate,
                n,
                lambda r=rate: _xorack_replay_rows(cfg, n, r, base_on, base_off),
            )
        if clean_synthetic is None:
            _progress(f"part 5: plain Spark synthetic job without faults, {n:,} records")
            _plain_spark_job(min(n, 10_000), 0.0, "none")  # warm-up: Python workers, JIT
            clean_synthetic, _ = _timed_runs(
                lambda: _plain_spark_job(n, 0.0, "none"), cfg.repeat, cfg.run_budget_s
            )
        _safe_rows(
            report,
            "plain Spark, task retry",
            rate,
            n,
            lambda r=rate, c=clean_synthetic: [_task_retry_row(cfg, n, r, c)],
        )


def _safe_rows(
    report: Report, strategy: str, rate: float, n: int, fn: Callable[..., list[RecoveryResult]]
) -> None:
    try:
        report.recovery.extend(fn())
    except DemoUnavailable as exc:
        report.recovery.append(
            RecoveryResult(strategy, rate, n, None, None, None, f"{NOT_AVAILABLE}: {exc}")
        )
    except Exception as exc:
        report.recovery.append(RecoveryResult(strategy, rate, n, None, None, None, _err(exc)))


def _xorack_replay_rows(
    cfg: BenchConfig, n: int, rate: float, base_on: list[float], base_off: list[float]
) -> list[RecoveryResult]:
    """xorack's replay vs plain Spark with the same faulty function (job failure, rerun)."""
    _progress(f"part 5: xorack replay, {n:,} records, fail rate {rate:.2%}")
    runs = [
        run_demo(n, True, rate, seed=cfg.seed + i, verbose=cfg.verbose) for i in range(cfg.repeat)
    ]
    on_med = statistics.median(base_on)
    walls = [float(r["wall_seconds"]) for r in runs]
    lost = sum(int(r["lost"] or 0) for r in runs)
    ok = all(bool(r["results_match"]) for r in runs)
    rounds = max(int(r.get("rounds") or 0) for r in runs)
    rows = [
        RecoveryResult(
            "xorack record replay (demo, FT on)",
            rate,
            n,
            Stat.of([float(r["replayed"]) for r in runs]),
            Stat.of(walls),
            Stat.of([w - on_med for w in walls]),
            f"job succeeds in {rounds} rounds; lost={lost}, results match={ok}",
        )
    ]

    _progress(f"part 5: plain Spark, same faulty function, {n:,} records, {rate:.2%}")

    def failing_run() -> str:
        try:
            run_demo(n, False, rate, seed=cfg.seed, verbose=cfg.verbose)
        except DemoUnavailable:
            raise
        except Exception as exc:
            return type(exc).__name__
        return ""

    fail_times, error = _timed_runs(failing_run, cfg.repeat, cfg.run_budget_s)
    verdict = f"JOB FAILED ({error}) after 2 task attempts" if error else "job succeeded (?)"
    rows.append(
        RecoveryResult(
            "plain Spark, same faulty function (demo, FT off)",
            rate,
            n,
            None,
            Stat.of(fail_times),
            None,
            f"{verdict}; no output, no account of records",
        )
    )
    off_med = statistics.median(base_off)
    rows.append(
        RecoveryResult(
            "plain Spark, then rerun the whole job",
            rate,
            n,
            Stat(n, n, n, 1),
            Stat.of([t + off_med for t in fail_times]),
            Stat.of(fail_times),
            "the failed run + a full FT-off run (if the fault was transient)",
        )
    )
    return rows


def _task_retry_row(cfg: BenchConfig, n: int, rate: float, clean: list[float]) -> RecoveryResult:
    _progress(f"part 5: plain Spark task retry (transient fault), {n:,} records, {rate:.2%}")
    retry, _ = _timed_runs(
        lambda: _plain_spark_job(n, rate, "first-attempt"), cfg.repeat, cfg.run_budget_s
    )
    redone = float(_records_in_failing_partitions(n, rate))
    clean_med = statistics.median(clean)
    return RecoveryResult(
        "plain Spark, task retry (transient fault, synthetic job)",
        rate,
        n,
        Stat(redone, redone, redone, 1),
        Stat.of(retry),
        Stat.of([t - clean_med for t in retry]),
        f"job succeeds; every task holding a failure reruns whole "
        f"({_PLAIN_PARTITIONS} tasks of {n // _PLAIN_PARTITIONS:,} records; "
        f"failure-free run {clean_med:.2f} s)",
    )


# The synthetic plain-Spark job: ids -> 3 words each (fan-out) -> count per word.
_PLAIN_PARTITIONS = 4


def _failing_mask(ids: np.ndarray, rate: float) -> np.ndarray:
    """Deterministic choice of the failing records: a splitmix64 hash of the id below rate."""
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z % np.uint64(1_000_000)) < np.uint64(round(rate * 1_000_000))


def _plain_spark_job(n: int, rate: float, mode: str) -> None:
    """Runs the job; ``mode``: "none" or "first-attempt" (a transient fault: only a task's
    first attempt raises when its batch holds a failing record)."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    spark = get_spark()

    def words(batches):
        import pandas as pd

        for pdf in batches:
            ids = pdf["id"].to_numpy()
            if mode != "none" and _failing_mask(ids, rate).any():
                ctx = TaskContext.get()
                assert ctx is not None  # in a Spark task
                attempt = ctx.attemptNumber()
                if attempt == 0:
                    raise RuntimeError(f"transient fault in this batch (task attempt {attempt})")
            yield pd.DataFrame({"word": np.concatenate([ids % 1000, ids % 7919, ids % 104729])})

    df = spark.range(0, n, numPartitions=_PLAIN_PARTITIONS)
    out = df.mapInPandas(words, "word long").groupBy("word").agg(F.count("*").alias("c"))
    out.write.format("noop").mode("overwrite").save()


def _records_in_failing_partitions(n: int, rate: float) -> int:
    """Records of the Spark tasks that contain at least one failing record (spark.range split)."""
    redone = 0
    for p in range(_PLAIN_PARTITIONS):
        lo, hi = p * n // _PLAIN_PARTITIONS, (p + 1) * n // _PLAIN_PARTITIONS
        if _failing_mask(np.arange(lo, hi, dtype=np.uint64), rate).any():
            redone += hi - lo
    return redone


# ----------------------------------------------------------------------------------------------
# Rendering: Markdown and PNG
# ----------------------------------------------------------------------------------------------


def _err(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"error: {type(exc).__name__}: {first[:160]}"


def part_jobs(cfg: BenchConfig, report: Report) -> None:
    """Part 6: Spark's wordcount written with tracked native operations, against plain Spark
    (``xorack.bench_jobs``): plain, FT off and FT on, interleaved, ratios from one run."""
    from .bench_jobs import run_wordcount

    _progress(f"part 6: wordcount job, {cfg.wordcount_lines:,} lines, plain / FT off / FT on")
    spark = get_spark()
    report.jobs = run_wordcount(spark, cfg.wordcount_lines, repeat=cfg.repeat, fallback=True)


def part_tpch(cfg: BenchConfig, report: Report) -> None:
    """Part 7: TPC-H queries and PageRank written once with the DataFrame API, plain / FT off /
    FT on, interleaved (``xorack.bench_tpch``). A result that differs from plain Spark's is
    recorded, then raised (the report says which)."""
    from . import bench_tpch

    cache = Path(cfg.tpch_cache) if cfg.tpch_cache else None
    _progress(f"part 7: TPC-H data at scale factor {cfg.tpch_scale:g} (generated once, cached)")
    data = bench_tpch.tpch_data(cfg.tpch_scale, cache)
    nodes = max(2, int(bench_tpch.PAGERANK_NODES_PER_SCALE * cfg.tpch_scale))
    bench_tpch.pagerank_data(data, nodes)
    _progress(f"part 7: {', '.join(bench_tpch.QUERIES)}, plain / FT off / FT on")
    spark = get_spark()
    r = bench_tpch.run_queries(spark, data, repeat=cfg.repeat, progress=_progress)
    report.tpch = {"scale": cfg.tpch_scale, "data": str(data), "pagerank_nodes": nodes, **r}
    if r["mismatches"]:
        raise bench_tpch.ResultMismatch("; ".join(r["mismatches"].values()))


def check_targets(report: Report) -> list[tuple[str, str, bool]]:
    """The DESIGN.md targets this report can judge: (target, measured, met)."""
    out: list[tuple[str, str, bool]] = []
    if report.tpch:
        scale = f"SF {report.tpch['scale']:g}"
        for q, d in report.tpch["queries"].items():
            on, off = d["ft_on_over_plain"], d["ft_off_over_plain"]
            limit = 1.3 if q == "pagerank" else 1.15
            out.append((f"{q} ({scale}), FT ON ÷ plain Spark ≤ {limit}", f"{on:.2f}", on <= limit))
            out.append((f"{q} ({scale}), FT OFF ÷ plain Spark ≤ 1.03", f"{off:.2f}", off <= 1.03))
    if report.jobs:
        j = report.jobs
        lines = f"{j['lines']:,} lines"
        on, off = j["ft_on_over_plain"], j["ft_off_over_plain"]
        target = f"wordcount (native ops), FT ON ÷ plain Spark ≤ 1.5 ({lines})"
        out.append((target, f"{on:.2f}", on <= 1.5))
        out.append((f"wordcount, FT OFF ÷ plain Spark ≤ 1.05 ({lines})", f"{off:.2f}", off <= 1.05))
        retried = j.get("retried_over_plain_retried")
        if retried is not None:
            target = f"wordcount, a task retried: FT ON ÷ plain Spark with the same ≤ 1.5 ({lines})"
            out.append((target, f"{retried:.2f}", retried <= 1.5))
    by_size: dict[int, dict[str, TrackingResult]] = {}
    for r in report.tracking:
        if r.events_per_s:
            by_size.setdefault(r.sources, {})[r.name] = r
    for n, rows in sorted(by_size.items()):
        native, fallback = rows.get(NATIVE), rows.get("xorack fallback")
        if native and fallback:
            assert native.events_per_s is not None  # by_size holds rows with a rate
            assert fallback.events_per_s is not None
            x = native.events_per_s.median / fallback.events_per_s.median
            out.append((f"AckTable native >= 30x fallback ({n:,} sources)", f"{x:.1f}x", x >= 30))
        base = rows.get("C++ rotating buckets (Storm/Heron)")
        if native and base:
            assert native.events_per_s is not None
            assert base.events_per_s is not None
            x = native.events_per_s.median / base.events_per_s.median
            out.append((f"native faster than the rotating buckets ({n:,})", f"{x:.2f}x", x > 1))
        if native:
            assert native.events_per_s is not None
            per_core = native.events_per_s.median / 1e6
            out.append(
                (
                    f"AckTable >= 40 M events/s per core ({n:,} sources; register + xor)",
                    f"{per_core:.1f} M/s",
                    per_core >= 40,
                )
            )
    churn = {c.backend: c for c in report.churn if c.events_per_s}
    if "native" in churn:
        c = churn["native"]
        assert c.events_per_s is not None  # churn holds rows with a rate
        if c.read_rate:
            x = c.events_per_s.median / c.read_rate
            out.append(("AckTable churn >= 0.35 x random-read rate", f"{x:.2f}", x >= 0.35))
        if c.wheel_rotate_ids_per_s is not None:
            x = c.wheel_rotate_ids_per_s.median / 1e6
            out.append(("TimeoutWheel add+rotate >= 50 M ids/s", f"{x:.1f} M/s", x >= 50))
        if "python" in churn:
            python_rate = churn["python"].events_per_s
            assert python_rate is not None
            x = c.events_per_s.median / python_rate.median
            out.append(("AckTable churn >= 10x fallback", f"{x:.1f}x", x >= 10))
        if c.bytes_per_pending is not None:
            ok = c.bytes_per_pending <= 32
            out.append(
                (
                    "<= 32 bytes per pending id at churn (table + wheel)",
                    f"{c.bytes_per_pending:.1f}",
                    ok,
                )
            )
    for m in report.memory:
        if m.name == NATIVE and m.bytes_per_source is not None:
            ok = m.bytes_per_source <= 32
            out.append(
                ("<= 32 bytes per pending source (table + wheel)", f"{m.bytes_per_source:.1f}", ok)
            )
    for p in report.partitions:
        if p.xorack_keys_per_s and p.key_type == "int64":
            rate = p.xorack_keys_per_s.median / 1e6
            out.append(
                ("spark_partition_ids >= 300 M int64 keys/s", f"{rate:.0f} M/s", rate >= 300)
            )
        if p.xorack_keys_per_s and p.key_type == "string":
            gbs = p.xorack_keys_per_s.median * p.mean_key_bytes / 1e9
            out.append(
                (
                    f"spark_partition_ids >= 1 GB/s of short strings ({p.mean_key_bytes:.1f} B)",
                    f"{gbs:.2f} GB/s",
                    gbs >= 1,
                )
            )
    for d in report.demo:
        if d.ratio:
            ok = d.ratio.median <= 1.15
            out.append(
                (f"demo FT ON / OFF <= 1.15 ({d.records:,} records)", f"{d.ratio.median:.2f}", ok)
            )
    return out


def render_markdown(report: Report) -> str:
    """The report as Markdown: machine, then one table per part."""
    cfg = report.config
    lines = ["# xorack benchmark report", ""]
    lines += [
        f"Command: `xorack bench {cfg['argv']}` — {'quick mode, ' if cfg['quick'] else ''}"
        f"medians of up to {cfg['repeat']} runs, spread = min-max (n = runs); "
        f"total {report.total_seconds / 60:.1f} min.",
        "",
        "| machine | |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in report.machine.items()]
    lines.append("")

    if report.tracking:
        lines += [
            "## 1. Completion tracking (events/s, births + events, batches of 64 K)",
            "",
            "Workload: record trees (fan-out 1-4, 20 % dropped, sink acks), "
            f"{cfg['events_per_source']:.2f} events per source record, births first, then the "
            "events shuffled over the whole run. Ratio = events/s ÷ native's, same size, same run.",
            "",
            "| acker | source records | events | M events/s | x native | note |",
            "| --- | ---: | ---: | --- | ---: | --- |",
        ]
        for r in report.tracking:
            rate = r.events_per_s.fmt(1e6) if r.events_per_s else "—"
            ratio = f"{r.ratio_vs_native:.3g}" if r.ratio_vs_native is not None else "—"
            lines.append(
                f"| {r.name} | {r.sources:,} | {r.events:,} | {rate} | {ratio} | {r.note} |"
            )
        lines.append("")
    if report.churn:
        lines += [
            "## 1b. AckTable steady state (churn)",
            "",
            "Pending ids stay constant; each round = one `xor` of 64 K final acks (completing the "
            "oldest ids) + one `register` of 64 K new ids (batches of pending / 4 below 256 K "
            "pending). Read rate = random 64-byte reads/s "
            "over an array the size of the table, same run (best of 4). Wheel = "
            "`TimeoutWheel(3)` discard + add on the same churn (ids/s of each); wheel add+rotate "
            "= a `TimeoutWheel(3)` in its own steady state (pending ids at the peak, pending / 3 "
            "added and expired per rotation). `python -m xorack._churn --repeat 3` measures the "
            "same in wall and CPU time.",
            "",
            "| backend | pending | M events/s | ÷ read rate | x fallback | wheel M ids/s | "
            "wheel add+rotate M ids/s | bytes / pending (table + wheel) | note |",
            "| --- | ---: | --- | --- | ---: | --- | --- | ---: | --- |",
        ]
        fallback = next((c for c in report.churn if c.backend == "python"), None)
        for c in report.churn:
            rate = c.events_per_s.fmt(1e6) if c.events_per_s else "—"
            per_read = (
                c.events_per_s.scaled(1 / c.read_rate).fmt(digits=2)
                if c.events_per_s and c.read_rate
                else "—"
            )
            vs = (
                f"{c.events_per_s.median / fallback.events_per_s.median:.1f}"
                if c.events_per_s and fallback and fallback.events_per_s
                else "—"
            )
            wheel = c.wheel_ids_per_s.fmt(1e6) if c.wheel_ids_per_s else "—"
            rot = c.wheel_rotate_ids_per_s.fmt(1e6) if c.wheel_rotate_ids_per_s else "—"
            per = f"{c.bytes_per_pending:.1f}" if c.bytes_per_pending is not None else "—"
            lines.append(
                f"| {c.backend} | {c.pending:,} | {rate} | {per_read} | {vs} | {wheel} | {rot} "
                f"| {per} | {c.note} |"
            )
        lines.append("")
    if report.memory:
        lines += [
            "## 2. Memory per pending source record",
            "",
            "| structure | pending records | bytes / record | how measured |",
            "| --- | ---: | ---: | --- |",
        ]
        for m in report.memory:
            per = f"{m.bytes_per_source:.1f}" if m.bytes_per_source is not None else "—"
            lines.append(f"| {m.name} | {m.sources:,} | {per} | {m.method} |")
        lines.append("")
    if report.partitions:
        lines += [
            "## 3. Partition assignment (keys/s)",
            "",
            f"{cfg['num_partitions']} partitions. Spark: `repartition(n, k)` + "
            "`spark_partition_id()` on a cached DataFrame (noop sink). "
            "Match = same per-partition counts.",
            "",
            "| key type | keys | xorack M keys/s | Spark M keys/s | ratio | match | note |",
            "| --- | ---: | --- | --- | ---: | --- | --- |",
        ]
        for p in report.partitions:
            ours = p.xorack_keys_per_s.fmt(1e6) if p.xorack_keys_per_s else "—"
            theirs = p.spark_keys_per_s.fmt(1e6) if p.spark_keys_per_s else "—"
            ratio = (
                f"{p.xorack_keys_per_s.median / p.spark_keys_per_s.median:,.0f}"
                if p.xorack_keys_per_s and p.spark_keys_per_s
                else "—"
            )
            lines.append(
                f"| {p.key_type} | {p.keys:,} | {ours} | {theirs} | {ratio} | "
                f"{p.ids_match if p.ids_match is not None else '—'} | {p.note} |"
            )
        lines.append("")
    if report.demo:
        lines += [
            "## 4. Demo pipeline, FT ON vs OFF (target ratio ≤ 1.15)",
            "",
            "| records | FT off s | FT on s | ON ÷ OFF | driver RSS off / on MiB | lost "
            "| results match | note |",
            "| ---: | --- | --- | --- | --- | ---: | --- | --- |",
        ]

        def mib(v: float | None) -> str:
            return "—" if v is None else f"{v:.0f}"

        for d in report.demo:
            lines.append(
                f"| {d.records:,} | {d.ft_off_s.fmt() if d.ft_off_s else '—'} | "
                f"{d.ft_on_s.fmt() if d.ft_on_s else '—'} | "
                f"{d.ratio.fmt() if d.ratio else '—'} | "
                f"{mib(d.rss_off_mb)} / {mib(d.rss_on_mb)} | "
                f"{d.lost if d.lost is not None else '—'} | "
                f"{d.results_match if d.results_match is not None else '—'} | {d.note} |"
            )
        lines.append("")
    if report.recovery:
        lines += [
            "## 5. Recovery when records fail once",
            "",
            "| strategy | fail rate | records | records redone | wall s | extra wall s | outcome |",
            "| --- | ---: | ---: | --- | --- | --- | --- |",
        ]
        for rec in report.recovery:
            lines.append(
                f"| {rec.strategy} | {rec.fail_rate:.1%} | {rec.records:,} | "
                f"{rec.records_redone.fmt() if rec.records_redone else '—'} | "
                f"{rec.wall_s.fmt() if rec.wall_s else '—'} | "
                f"{rec.extra_wall_s.fmt() if rec.extra_wall_s else '—'} | {rec.outcome} |"
            )
        lines.append("")
    if report.jobs:
        j = report.jobs
        lines += [
            "## 6. A job written with native operations: wordcount vs plain Spark",
            "",
            f"Spark's `wordcount.py` over {j['lines']:,} generated sentences (read from Parquet, "
            "counts written to Parquet); the three variants interleaved, median of "
            f"{j['repeat']}; ratios from this run. Results identical: {j['results_match']}.",
            "",
            "| variant | wall s (min-max) | ÷ plain |",
            "| --- | --- | ---: |",
        ]
        plain = j["variants"]["plain"]["median"]
        for name, v in j["variants"].items():
            lines.append(
                f"| {name} | {v['median']:.2f} ({min(v['seconds']):.2f}-{max(v['seconds']):.2f}) "
                f"| {v['median'] / plain:.2f} |"
            )
        lines.append("")
        if j.get("retried_over_plain_retried") is not None:
            lines += [
                "A task retried: a `mapInArrow` stage over the lines whose Python worker dies "
                "once, in the first attempt of partition 0's task, in plain Spark and with FT "
                "on (the optimistic round stands): FT on ÷ plain Spark, both with the stage "
                f"and the retry, **{j['retried_over_plain_retried']:.2f}**.",
                "",
            ]
    if report.tpch:
        lines += _tpch_markdown(report.tpch)
    targets = check_targets(report)
    if targets:
        lines += [
            "## Design targets measured here",
            "",
            "| target | measured | met |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {t} | {m} | {'yes' if ok else 'NO'} |" for t, m, ok in targets]
        lines.append("")
    if report.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(lines)


def _tpch_markdown(t: dict[str, Any]) -> list[str]:
    """Part 7's section: one row per query."""
    mismatches = t["mismatches"]
    lines = [
        f"## 7. TPC-H (scale factor {t['scale']:g}) and PageRank vs plain Spark",
        "",
        "Each query written once with the DataFrame API (`xorack.bench_tpch`): plain Spark, "
        "`Pipeline(ft=False)` and `Pipeline(ft=True)` (tracked sources `lineitem`, and `orders` "
        "where the query joins it; the dimensions as lookup joins) into Parquet, interleaved "
        f"after {t['warmup']} warm-up round(s), median of {t['repeat']}; ratios from this run. "
        f"PageRank: {t['pagerank_nodes']:,} nodes, 5 iterations (a lookup join of the tracked "
        "ranks with the links and a sum per node each). Targets (issue 27): FT on ÷ plain ≤ 1.15 "
        "on this 2-core machine (≤ 1.3 for PageRank), FT off ÷ plain ≤ 1.03. "
        + (
            "Every result equals plain Spark's."
            if not mismatches
            else f"**RESULTS DIFFER: {'; '.join(mismatches.values())}**"
        ),
        "",
        "| query | plain s | FT off s | FT on s | FT off ÷ plain | FT on ÷ plain | equal | "
        "phases not optimistic |",
        "| --- | --- | --- | --- | ---: | ---: | --- | --- |",
    ]

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for q, d in t["queries"].items():
        s = d["seconds"]
        lines.append(
            f"| {q} | {spread(s['plain'])} | {spread(s['ft off'])} | {spread(s['ft on'])} | "
            f"{d['ft_off_over_plain']:.2f} | **{d['ft_on_over_plain']:.2f}** | "
            f"{'yes' if d['matches'] else 'NO'} | {'; '.join(d['not_optimistic']) or '—'} |"
        )
    lines.append("")
    return lines


def render_plot(report: Report, path: Path) -> bool:
    """A 2x4 PNG: events/s, bytes/record, partition keys/s, demo and recovery wall times, the
    demo's FT ON ÷ OFF per size, the wordcount's variants ÷ plain Spark (with targets), and
    the TPC-H queries' and PageRank's FT off / FT on ÷ plain Spark and wall times."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if report.tpch and not (
        report.tracking or report.memory or report.partitions or report.demo or report.jobs
    ):  # part 7 alone (`--tpch`): its two panels only
        fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
        _plot_tpch(report.tpch, left, right)
        machine = report.machine
        fig.suptitle(
            f"xorack bench --tpch - {machine.get('cpu', '')}, {machine.get('cores')} cores"
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return True
    fig, axes = plt.subplots(2, 4, figsize=(26, 10))
    ax = axes[0][0]
    rows = [r for r in report.tracking if r.events_per_s]
    if rows:
        labels = [f"{r.name}\n{r.sources:,}" for r in rows]
        rates = [cast(Stat, r.events_per_s) for r in rows]  # rows are those with a rate
        med = np.array([s.median for s in rates]) / 1e6
        err = (
            np.array(
                [
                    [s.median - s.low for s in rates],
                    [s.high - s.median for s in rates],
                ]
            )
            / 1e6
        )
        sizes = sorted({r.sources for r in rows})
        palette = ["tab:blue", "tab:purple", "tab:cyan", "tab:gray"]
        colors = [palette[sizes.index(r.sources) % len(palette)] for r in rows]
        ax.barh(range(len(rows)), med, xerr=err, color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()  # same order as the table
        ax.set_xscale("log")
        ax.set_xlabel("M events/s (log), error bar = min-max")
    ax.set_title("1. Completion tracking")
    ax = axes[0][1]
    mem = [m for m in report.memory if m.bytes_per_source is not None]
    if mem:
        ax.barh(range(len(mem)), [m.bytes_per_source for m in mem], color="tab:orange")
        ax.set_yticks(range(len(mem)), [m.name for m in mem], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(32, color="k", ls="--", lw=1, label="target ≤ 32")
        ax.legend()
        ax.set_xlabel("bytes per pending source record")
    ax.set_title("2. Memory")
    ax = axes[1][0]
    parts = [p for p in report.partitions if p.xorack_keys_per_s or p.spark_keys_per_s]
    if parts:
        x = np.arange(len(parts))
        ours = [p.xorack_keys_per_s.median / 1e6 if p.xorack_keys_per_s else 0 for p in parts]
        theirs = [p.spark_keys_per_s.median / 1e6 if p.spark_keys_per_s else 0 for p in parts]
        ax.bar(x - 0.2, ours, 0.4, label="xorack.spark_partition_ids")
        ax.bar(x + 0.2, theirs, 0.4, label="Spark repartition + spark_partition_id()")
        ax.set_xticks(x, [p.key_type for p in parts])
        ax.set_yscale("log")
        ax.set_ylabel("M keys/s (log)")
        ax.legend(fontsize=8)
    ax.set_title("3. Partition assignment")
    ax = axes[1][1]
    demo = [d for d in report.demo if d.ft_on_s and d.ft_off_s]
    rec = [r for r in report.recovery if r.wall_s]
    labels, values = [], []
    for d in demo:
        assert d.ft_off_s is not None  # demo holds rows with both
        assert d.ft_on_s is not None
        labels += [f"demo {d.records:,} FT off", f"demo {d.records:,} FT on"]
        values += [d.ft_off_s.median, d.ft_on_s.median]
    for r in rec:
        labels.append(f"{r.strategy.split(' (')[0]} @{r.fail_rate:.1%}")
        values.append(cast(Stat, r.wall_s).median)  # rec holds rows with a wall time
    if values:
        ax.barh(range(len(values)), values, color="tab:green")
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("wall seconds")
    else:
        ax.text(0.5, 0.5, "demo pipeline not available", ha="center", va="center")
    ax.set_title("4-5. Demo FT on/off, recovery")
    ax = axes[0][2]
    ratios = [d for d in report.demo if d.ratio is not None]
    if ratios:
        y = range(len(ratios))
        spread = [cast(Stat, d.ratio) for d in ratios]  # ratios holds rows with a ratio
        mid = [r.median for r in spread]
        bars = [[r.median - r.low for r in spread], [r.high - r.median for r in spread]]
        ax.barh(y, mid, xerr=bars, color="tab:green")
        ax.set_yticks(y, [f"{d.records:,} records" for d in ratios], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.15, color="k", ls="--", lw=1, label="target ≤ 1.15")
        ax.axvline(1.0, color="gray", lw=0.5)
        ax.legend(fontsize=8)
        ax.set_xlabel("demo wall time, FT ON ÷ OFF (error bar = min-max)")
    ax.set_title("4. Demo: the cost of FT on")
    ax = axes[1][2]
    if report.jobs:
        variants = report.jobs["variants"]
        plain = variants["plain"]["median"]
        names = list(variants)
        ax.barh(range(len(names)), [variants[v]["median"] / plain for v in names], color="tab:red")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.5, color="k", ls="--", lw=1, label="FT on target ≤ 1.5")
        ax.axvline(1.0, color="gray", lw=0.5)
        ax.legend(fontsize=8)
        ax.set_xlabel(f"wordcount ({report.jobs['lines']:,} lines) wall time ÷ plain Spark")
    else:
        ax.text(0.5, 0.5, "part 6 not run", ha="center", va="center")
    ax.set_title("6. A job with native operations vs plain Spark")
    _plot_tpch(report.tpch, axes[0][3], axes[1][3])
    machine = report.machine
    fig.suptitle(f"xorack bench - {machine.get('cpu', '')}, {machine.get('cores')} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_tpch(t: dict[str, Any], ratios: Any, walls: Any) -> None:
    """Part 7's two panels: FT off and FT on ÷ plain per query, and the three wall times."""
    ratios.set_title("7. TPC-H and PageRank: ÷ plain Spark")
    walls.set_title("7. TPC-H and PageRank: wall time")
    if not t:
        for ax in (ratios, walls):
            ax.text(0.5, 0.5, "part 7 not run", ha="center", va="center")
        return
    names = list(t["queries"])
    x = np.arange(len(names))
    off = [t["queries"][q]["ft_off_over_plain"] for q in names]
    on = [t["queries"][q]["ft_on_over_plain"] for q in names]
    ratios.bar(x - 0.2, off, 0.4, label="FT off ÷ plain", color="tab:gray")
    ratios.bar(x + 0.2, on, 0.4, label="FT on ÷ plain", color="tab:red")
    ratios.axhline(1.15, color="k", ls="--", lw=1, label="FT on target ≤ 1.15 (2 cores)")
    ratios.axhline(1.0, color="gray", lw=0.5)
    ratios.set_xticks(x, names)
    ratios.set_ylabel(f"wall time ÷ plain Spark (SF {t['scale']:g}, median of {t['repeat']})")
    ratios.legend(fontsize=8)
    for i, v in enumerate(("plain", "ft off", "ft on")):
        med = [t["queries"][q]["median"][v] for q in names]
        walls.bar(x + (i - 1) * 0.27, med, 0.27, label=v)
    walls.set_xticks(x, names)
    walls.set_ylabel("wall seconds (median)")
    walls.legend(fontsize=8)


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"sizes must look like 1e6,1e7, got {text!r}") from exc
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


ALL_PARTS = (1, 2, 3, 4, 5, 6, 7)
TPCH_PART = 7
#: What runs without --parts: all but TPC-H (its data needs tpchgen-cli; --tpch adds it)
DEFAULT_PARTS = (1, 2, 3, 4, 5, 6)


def _parse_parts(text: str) -> tuple[int, ...]:
    try:
        parts = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected part numbers like 1,2,3 (from {ALL_PARTS}), got {text!r}"
        ) from None
    unknown = sorted(parts - set(ALL_PARTS))
    if not parts or unknown:
        raise argparse.ArgumentTypeError(
            f"the parts are {', '.join(map(str, ALL_PARTS))}; got {text!r}"
            + (f" (no part {', '.join(map(str, unknown))})" if unknown else "")
        )
    return tuple(sorted(parts))


def _check_out_dir(parser: argparse.ArgumentParser, out: Path) -> None:
    """--out must be a directory: created now (the report goes there at the end), so that a
    path that cannot hold it fails before anything runs."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".xorack-bench-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        parser.error(f"argument --out: cannot write the report into {str(out)!r}: {exc}")


def build_parser() -> argparse.ArgumentParser:
    """The ``xorack bench`` command line: every option is checked here, before anything runs.

    >>> build_parser().parse_args(["--parts", "3,1"]).parts
    (1, 3)
    """
    from .cli import CommandParser, non_negative_int, positive_float, positive_int

    p = CommandParser(
        prog="xorack bench",
        description="Compare xorack with the alternatives; writes DIR/report.md and report.png. "
        "Parts: 1 completion tracking, 2 memory per pending record, 3 partition assignment, "
        "4 the demo with FT on and off, 5 recovery under failures, 6 wordcount against plain "
        "Spark, 7 TPC-H queries and PageRank against plain Spark. Unset sizes take the "
        "defaults of the full report (or of --quick).",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, < 2 min")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-report"),
        help="output directory (default: bench-report)",
    )
    p.add_argument(
        "--sizes",
        type=_parse_sizes,
        help="source records for part 1 (default 1e6,1e7; --quick 65536)",
    )
    p.add_argument(
        "--repeat", type=positive_int, help="runs per figure, median + spread (default 3)"
    )
    p.add_argument(
        "--parts",
        type=_parse_parts,
        help="which parts to run, e.g. 1,2,3 (default: 1-6; 7 is TPC-H, also --tpch)",
    )
    p.add_argument(
        "--tpch",
        action="store_true",
        help="run part 7 alone (with --parts: add it): TPC-H Q1, Q3, Q5, Q6, Q10, Q12, Q14 and "
        "PageRank, plain Spark / FT off / FT on; needs tpchgen-cli (pip install xorack[bench])",
    )
    p.add_argument(
        "--scale",
        type=positive_float,
        help="TPC-H scale factor for part 7 (default 0.1; --quick 0.01)",
    )
    p.add_argument(
        "--tpch-cache",
        type=Path,
        help="where the generated TPC-H data is kept, one directory per scale factor "
        "(default: ~/.cache/xorack/tpch)",
    )
    p.add_argument(
        "--demo-sizes",
        type=_parse_sizes,
        help="demo records for part 4 (default 100000,1000000,10000000; --quick 2000,10000); "
        "sizes from 1000000 run each demo in a process of its own (8 partitions), which gives "
        "the driver's peak RSS per run",
    )
    p.add_argument(
        "--recovery-records",
        type=positive_int,
        help="demo records for part 5 (default: the largest demo size, at most 100000)",
    )
    p.add_argument(
        "--spark-max",
        type=non_negative_int,
        help="largest part-1 size given to Spark, 0 = leave Spark out (default 1000000)",
    )
    p.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed of the workload (default 0)"
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own logs of the task failures part 5 causes on purpose (the "
        "ERROR lines and stack traces of the job that fails; off by default)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """A BenchConfig from parsed arguments (quick defaults first, then explicit overrides)."""
    cfg = BenchConfig.quick_config(args.out) if args.quick else BenchConfig(out=args.out)
    if args.sizes:
        cfg.sizes = args.sizes
    if args.repeat:
        cfg.repeat = max(1, args.repeat)
    if args.demo_sizes:
        cfg.demo_sizes = args.demo_sizes
    if args.recovery_records:
        cfg.recovery_records = args.recovery_records
    if args.spark_max is not None:
        cfg.spark_max = args.spark_max
    if not args.quick and args.recovery_records is None and cfg.demo_sizes:
        cfg.recovery_records = min(cfg.demo_sizes[-1], cfg.recovery_records)
    parts = set(args.parts or ())
    if args.tpch:
        parts.add(TPCH_PART)
    cfg.parts = tuple(sorted(parts)) if parts else DEFAULT_PARTS
    if args.scale is not None:
        cfg.tpch_scale = args.scale
    if args.tpch_cache is not None:
        cfg.tpch_cache = str(args.tpch_cache)
    cfg.seed = args.seed
    cfg.verbose = args.verbose
    return cfg


def run(cfg: BenchConfig, argv_text: str = "") -> Report:
    """Runs the selected parts and returns the report (nothing written)."""
    start = time.perf_counter()
    report = Report(machine=machine_info(), config={**asdict(cfg), "argv": argv_text})
    report.config["out"] = str(cfg.out)
    workloads: dict[int, Workload] = {}
    if 1 in cfg.parts:
        for n in cfg.sizes:
            _progress(f"generating workload: {n:,} source records")
            workloads[n] = generate_workload(n, seed=cfg.seed)
        w0 = workloads[cfg.sizes[0]]
        report.config["events_per_source"] = w0.events_per_source
    else:
        report.config["events_per_source"] = float("nan")

    steps: list[tuple[int, str, Callable[[], Any]]] = [
        (1, "completion tracking", lambda: part_tracking(cfg, report, workloads)),
        (1, "acker churn", lambda: part_churn(cfg, report)),
        (2, "memory", lambda: part_memory(cfg, report)),
        (3, "partition assignment", lambda: part_partitions(cfg, report)),
    ]
    walls: dict[tuple[int, bool], list[float]] = {}
    for part, title, fn in steps:
        if part in cfg.parts:
            _safely(report, title, fn)
    workloads.clear()
    if 4 in cfg.parts:
        _safely(report, "demo", lambda: walls.update(part_demo(cfg, report)))
    if 5 in cfg.parts:  # its failing jobs fail Spark tasks on purpose: their logs are noise
        from xorack.spark.quiet import quiet_spark_logs

        with quiet_spark_logs(get_spark(), cfg.verbose):
            _safely(report, "recovery", lambda: part_recovery(cfg, report, walls))
    if 6 in cfg.parts:
        _safely(report, "wordcount job", lambda: part_jobs(cfg, report))
    if TPCH_PART in cfg.parts:
        _safely(report, "TPC-H and PageRank", lambda: part_tpch(cfg, report))
    report.total_seconds = time.perf_counter() - start
    with contextlib.suppress(OSError):
        report.machine["load average (end)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if 1 in cfg.parts:
        report.notes += [
            f"Part 1 sizes: {', '.join(f'{n:,}' for n in cfg.sizes)} source records; the fallback "
            f"and the dict acker run up to {cfg.slow_max:,}, Spark up to {cfg.spark_max:,} "
            "(each run repeats the whole workload; larger sizes take minutes per run).",
            "The C++ rotating-bucket baseline follows Heron's rotating map (3 buckets, lookups "
            "scan them, std::unordered_map, no tuning); the dict acker is a plain Python loop.",
        ]
    report.notes += [
        f"Spark: {_SPARK_MASTER} (2 cores, 2 task attempts), adaptive execution off, "
        "DataFrames built from Arrow tables; timings exclude the JVM start.",
        "Spark has no way to compute spark_partition_id() without the shuffle: its keys/s "
        "include the repartition (200 partitions) on the cached DataFrame.",
    ]
    return report


def _safely(report: Report, title: str, fn: Callable[[], Any]) -> None:
    """Runs one part; an unexpected error becomes a note, and the other parts still run."""
    try:
        fn()
    except Exception as exc:
        report.notes.append(f"{title}: {_err(exc)}")
        traceback.print_exc(file=sys.stderr)


def write_report(report: Report, out: Path) -> tuple[Path, Path | None]:
    """Writes report.md, report.json and report.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(render_markdown(report))
    (out / "report.json").write_text(json.dumps(asdict(report), indent=1, default=str))
    png = out / "report.png"
    return md, (png if render_plot(report, png) else None)


def main(argv: Sequence[str] | None = None) -> int:
    """``xorack bench``: run the comparison, print the table, write DIR/report.md and .png."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_out_dir(parser, args.out)
    cfg = config_from_args(args)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    report = run(cfg, argv_text)
    md, png = write_report(report, cfg.out)
    print(render_markdown(report))
    print(f"wrote {md}" + (f" and {png}" if png else " (no plot: matplotlib missing)"))
    if report.tpch.get("mismatches"):
        print("xorack bench: a TPC-H/PageRank result differs from plain Spark's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
