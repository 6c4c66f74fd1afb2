"""``xorack demo``: the reference pipeline on local Spark with the embedded acker.

sentences → words (a pandas stage, fan-out) → stop-word filter (a native ``where``: the rows
it removes are acked as dropped) → ``groupBy("word").agg(count)`` (an exactly-once aggregation
inside the pipeline) → an idempotent SQLite sink, with failures injected deterministically per
(sentence, attempt):

* ``--fail-rate``: share of sentences whose splitting raises on the first attempt only;
* ``--poison-rate``: share of sentences that raise on every attempt (→ dead letters);
* ``--drop-rate``: share of sentences that silently lose about half of their words in transit
  on the first attempt (→ timeout → replay; the words that got through belong to an attempt
  that did not complete, so the aggregation leaves them out).

At the end it prints the account of every source record (lost must be 0) and whether the word
counts equal a failure-free reference computed in plain Python (poisoned sentences excluded).

``--stream`` runs the same word count as a live Structured Streaming query instead
(:mod:`xorack.demo_stream`): ``--files`` JSON files of sentences with event times, fed one by one
(every ``--interval`` seconds) into a directory that a file source watches, counted per 10 s
event-time window behind a 5 s watermark (``groupBy(F.window("ts", "10 seconds"), "word")``),
with the same failures injected by each row's attempt; one progress line per micro-batch, then
the same account and the windows checked against a failure-free reference.

>>> main(["--records", "2000", "--json"])  # doctest: +SKIP
0
>>> main(["--stream", "--files", "4", "--records", "400", "--json"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

# the generated input and the failure draws, shared with ``demo --stream``; every name stays
# importable from here (the batch demo loses words in the JVM: _DROP is not used here)
from .demo_data import DROP as _DROP  # noqa: F401
from .demo_data import FAIL as _FAIL
from .demo_data import POISON as _POISON
from .demo_data import STOP_WORDS, VOCABULARY, chosen, make_sentences  # noqa: F401

DEFAULT_RECORDS = 20_000
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
ARROW_BATCH_ROWS = 65_536  # the demo's Arrow batches when the session leaves it unset (10 000)


@dataclass(frozen=True)
class DemoConfig:
    """The demo's options (see ``xorack demo --help``)."""

    records: int = DEFAULT_RECORDS
    partitions: int = 4
    fail_rate: float = 0.02
    poison_rate: float = 0.002
    drop_rate: float = 0.01
    storage: str = "memory"
    ft: bool = True
    seed: int = 7
    max_attempts: int = 4
    plain_failures: bool = False  # raise plain FailRecord (bisected) instead of rows=...
    master: str | None = None  # Spark master URL; None: the embedded local session
    ackers: int = 1  # acker processes (shards); 1: the acker is a thread of the driver
    combine: str = "auto"  # the count's partial aggregates per chunk: "on", "off", "auto"
    optimistic: str = "auto"  # each phase first in an optimistic round: "on", "off", "auto"
    workdir: str | None = None  # a resumable job's directory (sink, FT storage, staged rows)
    verbose: bool = False  # Spark's own logs of the task failures a run expects, left on

    @property
    def combines(self) -> bool:
        """Whether the count stages partial aggregates per chunk of 1024 sentences (see
        ``Pipeline(combine=)``). "auto": when fewer than one sentence per chunk is expected to
        fail its first attempt (otherwise nearly every chunk would be replayed as collateral)."""
        if self.combine != "auto":
            return self.combine == "on"
        first_round = self.fail_rate + self.poison_rate + self.drop_rate
        from .protocol import CHUNK_BITS  # the records of a chunk (Pipeline's default)

        return first_round * (1 << CHUNK_BITS) < 1

    @property
    def optimistic_rounds(self) -> bool:
        """Whether each phase first runs an optimistic round (``Pipeline(optimistic=)``): one
        failed sentence anywhere sends the round back to tracked rounds, its work lost. "auto":
        when fewer than one sentence of the whole input is expected to fail its first attempt
        (with the default rates, off)."""
        if self.optimistic != "auto":
            return self.optimistic == "on"
        first_round = self.fail_rate + self.poison_rate + self.drop_rate
        return first_round * self.records < 1


# ---- the pipeline's functions (picklable: module-level or frozen dataclasses) ------------------


@dataclass(frozen=True)
class GenerateSentences:
    seed: int

    def __call__(self, batches):
        for pdf in batches:
            ids = pdf["id"].to_numpy()
            yield pd.DataFrame({"sid": ids, "text": make_sentences(ids, self.seed)})


@dataclass(frozen=True)
class SplitWords:
    """sentences → words; fails the injected failures' rows with ``FailRecord(rows=...)`` (the
    wrapper fails exactly those and re-runs the function on the others: no bisection).
    ``vectorized=False`` raises a plain ``FailRecord`` instead (the wrapper bisects the batch)."""

    seed: int
    fail_rate: float
    poison_rate: float
    vectorized: bool = True

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        from xorack import FailRecord
        from xorack.spark import current_round

        sid = pdf["sid"].to_numpy()
        poison = chosen(sid, self.poison_rate, self.seed, _POISON)
        bad = poison.copy()
        if current_round() == 0:
            bad |= chosen(sid, self.fail_rate, self.seed, _FAIL)
        if bad.any():
            if not self.vectorized:
                raise FailRecord(f"injected failure in sentence {int(sid[np.argmax(bad)])}")
            if poison.any():  # two reasons: the poisoned rows first, the others on the re-run
                raise FailRecord("injected failure: poisoned sentence", rows=poison)
            raise FailRecord("injected failure on the first attempt", rows=bad)
        out = pdf.assign(word=pdf["text"].str.split()).explode("word", ignore_index=True)
        return out[out["word"].notna()]


def poisoned(cfg: DemoConfig) -> set[int]:
    """The sentence ids that raise on every attempt."""
    ids = np.arange(cfg.records, dtype=np.int64)
    return set(ids[chosen(ids, cfg.poison_rate, cfg.seed, _POISON)].tolist())


def reference_counts(cfg: DemoConfig, exclude: set[int] | None = None) -> Counter:
    """Word counts computed without Spark or xorack over every sentence but ``exclude``
    (default: the poisoned ones).

    >>> sum(reference_counts(DemoConfig(records=10, poison_rate=0.0)).values()) > 0
    True
    """
    ids = np.arange(cfg.records, dtype=np.int64)
    excluded = poisoned(cfg) if exclude is None else exclude
    keep = ~np.isin(ids, np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
    counts: Counter = Counter()
    for text in make_sentences(ids[keep], cfg.seed):
        counts.update(w for w in text.split() if w not in STOP_WORDS)
    return counts


# ---- running -------------------------------------------------------------------------------------


def declare_job(p: Any, sentences: Any, sink: Any, cfg: DemoConfig, fixed: bool = False) -> None:
    """The demo's job on pipeline ``p``: sentences → split → stop words out → count per word →
    ``sink``. ``fixed``: the split stage without its bug (no poisoned sentence raises; what
    ``xorack repair`` runs the dead letters through)."""
    from pyspark.sql import functions as F

    poison_rate = 0.0 if fixed else cfg.poison_rate
    words = p.source(sentences, name="sentences").map_in_pandas(
        SplitWords(cfg.seed, cfg.fail_rate, poison_rate, vectorized=not cfg.plain_failures),
        "sid long, word string",
        name="split",
    )
    content = words.where(~F.col("word").isin(sorted(STOP_WORDS)))
    if cfg.drop_rate > 0:
        threshold = int(cfg.drop_rate * 1_000_000)
        seed = cfg.seed

        def lose_in_transit(df: Any) -> Any:
            # the chosen sentences lose about half of their words (the other half reaches
            # the aggregation, staged under an attempt that will not complete: left out)
            if p.round > 0 or fixed:  # fixed: the same plan (a repair's), no loss
                return df
            chosen_sentence = (
                F.pmod(F.hash(F.col("sid"), F.lit(seed)), F.lit(1_000_000)) < threshold
            )
            lost_word = F.pmod(F.hash(F.col("word"), F.col("sid")), F.lit(2)) == 0
            return df.where(~(chosen_sentence & lost_word))

        content = content.transform(lose_in_transit, name="lossy-network")
    counted = content.groupBy("word").agg(F.count("*").alias("n"))
    counted.sink(sink, name="counts")


def run_demo(cfg: DemoConfig, spark: Any = None, progress: bool = True) -> dict[str, Any]:
    """Run the demo pipeline; return the report as a dict (the ``--json`` object).

    >>> report = run_demo(DemoConfig(records=2000), progress=False)  # doctest: +SKIP
    >>> report["lost"], report["results_match"]                       # doctest: +SKIP
    (0, True)
    """
    from xorack.spark import Pipeline, SQLiteSink
    from xorack.spark.session import get_or_create_session

    if spark is None:
        master: dict[str, Any] = {"master": cfg.master} if cfg.master else {}
        spark = get_or_create_session(
            **master,
            app_name="xorack-demo",
            shuffle_partitions=cfg.partitions,
        )
        if cfg.verbose:  # Spark's default level (the session's is ERROR)
            spark.sparkContext.setLogLevel("WARN")
    resumable = cfg.workdir is not None and cfg.ft
    if cfg.workdir is not None:  # kept: a second run with the same arguments resumes the job
        workdir = os.path.abspath(cfg.workdir)
        os.makedirs(workdir, exist_ok=True)
    else:
        workdir = tempfile.mkdtemp(prefix="xorack-demo-")
    storage = cfg.storage
    if resumable and storage == "memory":
        storage = "sqlite:///" + os.path.join(workdir, "ft.db")
    bar = None
    # larger Arrow batches: fewer acker round trips and sink commits (ON and OFF alike); a
    # value the caller set is kept, and an unset one is unset again afterwards
    batch_conf_unset = spark.conf.get(ARROW_BATCH_CONF, None) is None
    if batch_conf_unset:
        spark.conf.set(ARROW_BATCH_CONF, str(ARROW_BATCH_ROWS))
    try:
        sink = SQLiteSink(os.path.join(workdir, "counts.db"), "words")
        sentences = spark.range(cfg.records, numPartitions=cfg.partitions).mapInPandas(
            GenerateSentences(cfg.seed), "sid long, text string"
        )
        p = Pipeline(
            spark,
            ft=cfg.ft,
            storage=storage,
            max_attempts=cfg.max_attempts,
            ackers=cfg.ackers,
            combine=cfg.combines,
            optimistic=cfg.optimistic_rounds,
            resume=resumable,
            workdir=os.path.join(workdir, "work") if resumable else None,
            verbose=cfg.verbose,
        )
        declare_job(p, sentences, sink, cfg)

        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=cfg.records,
                unit="rec",
                desc="xorack demo: starting",
                # counts, no percentage: a rounded 99.9 % reads as 100 % with records pending
                bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} settled [{elapsed}{postfix}]",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        stop = threading.Event()
        poller = None
        if bar is not None and cfg.ft:
            poller = threading.Thread(
                target=_poll, args=(p, bar, stop, PhaseProgress(cfg.records)), daemon=True
            )
            poller.start()
        elif bar is not None:
            bar.set_description_str("xorack demo: plain Spark (FT off), one job")

        def on_round(info: Any) -> None:
            if bar is not None:
                bar.set_postfix(replays=info.replays, refresh=False)

        report = p.run(on_round=on_round)
        peak = peak_rss_mb()  # before the reference below (its sentences are the driver's)
        jvm_peak = _jvm_peak_rss_mb(spark)
        stop.set()
        if poller is not None:
            poller.join()
        # the reference: every sentence but the dead-lettered ones, counted without xorack
        # (a dead-lettered sentence contributes nothing: all or nothing per source record)
        stored = sink.read()
        dead: set[int] = set()
        letters = p.dead_letters() if cfg.ft else None
        if letters is not None and letters.num_rows and "sid" in letters.schema.names:
            dead = {v for v in letters.column("sid").to_pylist() if v is not None}
        poison = poisoned(cfg)
        counts = Counter(dict(zip(stored["word"], stored["n"].astype(int), strict=True)))
        report.results_match = (
            len(stored) == len(counts)
            and counts == reference_counts(cfg, exclude=dead)
            and poison <= dead
        )
        if bar is not None:  # the source records: every one settled but the lost ones
            if cfg.ft:
                bar.set_description_str("xorack demo: done, source records", refresh=False)
            bar.total = cfg.records
            bar.n = cfg.records - (report.lost or 0)
            bar.refresh()
        out = report.as_dict()
        out["records_generated"] = cfg.records
        out["ackers"] = cfg.ackers
        out["combine"] = cfg.combines
        out["optimistic"] = cfg.optimistic_rounds
        out["poisoned"] = len(poison)
        out["dead_lettered_not_poisoned"] = len(dead - poison)
        out["distinct_words"] = len(counts)
        out["word_occurrences"] = sum(counts.values())
        out["driver_peak_rss_mb"] = peak
        out["driver_jvm_peak_rss_mb"] = jvm_peak
        return out
    finally:
        if batch_conf_unset:
            spark.conf.unset(ARROW_BATCH_CONF)
        if bar is not None:
            bar.close()
        if cfg.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


#: When this process started, as a perf_counter() value (see :func:`command_seconds`).
_STARTED = time.perf_counter()


def command_seconds() -> float:
    """Seconds since this process started (the command's own wall time: Python's and
    Spark's start included), from /proc where there is one, else since xorack.demo was
    imported.

    >>> command_seconds() > 0
    True
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        if age > 0:
            return age
    except (OSError, ValueError, IndexError):
        pass
    return time.perf_counter() - _STARTED


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """Peak resident memory of a process in MiB (``VmHWM``; ``ru_maxrss`` for this process
    where /proc is missing), None when unknown. The demo reports it for the driver's Python
    process right after the run (the embedded acker and its storage live there).

    >>> (peak_rss_mb() or 1.0) > 0
    True
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    if pid != "self":
        return None
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return round(kib / 1024, 1)


def _jvm_peak_rss_mb(spark: Any) -> float | None:
    """Peak resident memory of the driver's JVM (local mode: it runs the executors too)."""
    try:
        pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # not a local JVM we can look into
        return None
    return peak_rss_mb(pid)


@dataclass
class PhaseProgress:
    """What the demo's progress bar shows: the records of the running phase (the sentences in
    phase 1; the rows of the count's barrier in phase 2) settled — completed or dead-lettered —
    out of the phase's records, with the phase and its round named. While a record of the
    phase is pending the bar stays below 100 %.

    >>> pp = PhaseProgress(100)
    >>> pp.update(0, 2, 0, {"completed": 99, "dead_lettered": 0, "pending": 1, "persisted": 100})
    ('phase 1/2, round 1', 99, 100)
    >>> pp.update(0, 2, 1, {"completed": 100, "dead_lettered": 0, "pending": 1, "persisted": 100})
    ('phase 1/2, round 2', 99, 100)
    >>> pp.update(0, 2, 2, {"completed": 99, "dead_lettered": 1, "pending": 0, "persisted": 100})
    ('phase 1/2, round 3', 100, 100)
    >>> pp.update(1, 2, 0, {"completed": 99, "dead_lettered": 1, "pending": 0, "persisted": 100})
    ('phase 2/2, round 1', 0, None)
    >>> pp.update(1, 2, 0, {"completed": 109, "dead_lettered": 1, "pending": 10, "persisted": 120})
    ('phase 2/2, round 1', 10, 20)
    >>> pp.update(1, 2, 1, {"completed": 118, "dead_lettered": 1, "pending": 1, "persisted": 120})
    ('phase 2/2, round 2', 19, 20)
    >>> pp.update(1, 2, 0, {"completed": 119, "dead_lettered": 1, "pending": 0, "persisted": 120})
    ('phase 2/2, round 1', 20, 20)
    """

    records: int  # the source records (phase 1's total)
    phase: int = -1
    base_settled: int = 0  # records settled before the phase began
    last: int = 0  # records persisted, as last seen

    def update(
        self, phase: int, phases: int, round_no: int, stats: dict[str, Any], share: float = -1
    ) -> tuple[str, int, int | None]:
        """(description, settled, total) from the acker's counts ``stats`` in ``phase`` (or the
        ``share`` of the Spark tasks done in an optimistic round, when one runs); the total is
        None while none of a later phase's records has been seen."""
        settled = int(stats.get("completed", 0)) + int(stats.get("dead_lettered", 0))
        if phase != self.phase:  # a new phase: every record persisted before it had settled
            if self.phase >= 0:  # (a phase begins when the one before has nothing pending)
                self.base_settled = self.last
            self.phase = phase
        if share < 0:
            self.last = int(stats.get("persisted", 0)) + int(stats.get("recovered", 0))
        done = settled - self.base_settled
        pending = int(stats.get("pending", 0))  # the records of this phase not settled yet
        total = self.records if phase == 0 else done + pending
        if not total:  # none of the phase's records seen yet: how many is unknown
            return what_of(phase, phases, round_no, share), 0, None
        what = what_of(phase, phases, round_no, share)
        if share >= 0:  # an optimistic round completes its records all at once, at its end
            done = int(share * total)
            return what, min(done, total - 1), total
        if pending > 0:
            done = min(done, total - 1)
        return what, max(0, min(done, total)), total


def what_of(phase: int, phases: int, round_no: int, share: float = -1) -> str:
    """The phase and round, as the progress bar names them."""
    if share >= 0:
        return f"phase {phase + 1}/{phases}, optimistic round"
    return f"phase {phase + 1}/{phases}, round {round_no + 1}"


def _poll(p: Any, bar: Any, stop: threading.Event, progress: PhaseProgress) -> None:
    while not stop.wait(0.5):
        ctx = p.run_context
        if ctx is None:
            continue
        share = p.optimistic_progress()  # an optimistic round: its Spark tasks done
        try:
            stats = p.client.stats() if share is None else {}
        except Exception:  # the service is not up yet or already down
            continue
        what, done, total = progress.update(
            ctx.phase, ctx.plan.phase_count(), ctx.round, stats, -1 if share is None else share
        )
        bar.set_description_str(f"xorack demo: {what}", refresh=False)
        bar.total, bar.n = total, done
        bar.refresh()


def format_report(r: dict[str, Any]) -> str:
    """The human-readable report (with FT off: no acker, so no account of the records)."""

    def show(v: Any) -> str:
        return "n/a (FT off)" if v is None else str(v)

    if not r["ft"]:
        return "\n".join(
            [
                "xorack demo report",
                f"  FT                     off  ({r['rounds']} round(s): the plain Spark plan, "
                "no acker, no failures injected)",
                f"  results match          {'yes' if r['results_match'] else 'NO'}"
                "  (word counts == a reference computed without Spark or xorack)",
                f"  words                  {r['distinct_words']} distinct, "
                f"{r['word_occurrences']} occurrences",
                _wall_line(r),
                *_rss_lines(r),
            ]
        )

    shards = r.get("ackers", 1)
    ackers = f", {shards} acker processes" if shards > 1 else ""
    if r.get("combine") and r["ft"]:
        ackers += ", count combined per chunk"
    optimistic = ""
    if r["ft"] and r.get("optimistic_rounds"):
        optimistic = f", {r['optimistic_rounds']} phase(s) done in an optimistic round"
    for why in r.get("optimistic_fallbacks") or []:
        optimistic += f"; an optimistic round fell back ({why})"
    if r["ft"] and r.get("optimistic_rounds"):  # (with none, every phase ran tracked rounds)
        for why in r.get("tracked_phases") or []:
            optimistic += f"; tracked rounds in {why}"
    lines = [
        "xorack demo report",
        f"  FT                     {'on' if r['ft'] else 'off'}  "
        f"({r['rounds']} round(s){ackers}{optimistic})",
        f"  source records         {show(r['source_records'])}"
        + ("  (a resumed job: counts over all of its runs)" if r.get("resumed") else ""),
        *_resumed_lines(r),
        f"  completed              {show(r['completed'])}",
        f"  failed (explicit)      {show(r['failed'])}",
        f"  timed out              {show(r['timed_out'])}",
        f"  replayed               {show(r['replayed'])}"
        + (
            f"  ({r['collateral_replays']} as collateral: a chunk-mate failed before the count)"
            if r.get("collateral_replays")
            else ""
        ),
        f"  dead-lettered          {show(r['dead_lettered'])}",
        f"  LOST                   {show(r['lost'])}   (must be 0)",
        f"  duplicates absorbed    {r['duplicates_absorbed']}",
        f"  results match          {'yes' if r['results_match'] else 'NO'}"
        "  (word counts == a failure-free reference computed without xorack,",
        "                         dead-lettered sentences excluded; every poisoned sentence",
        f"                         dead-lettered, none counted: {r['poisoned']} poisoned)",
        f"  words                  {r['distinct_words']} distinct, "
        f"{r['word_occurrences']} occurrences",
        _wall_line(r),
        *_rss_lines(r),
    ]

    def after(label: str) -> int:  # the index after the line of ``label``
        return 1 + next(i for i, line in enumerate(lines) if line.startswith(f"  {label} "))

    for name, rows in (r.get("vanished_rows") or {}).items():
        lines.insert(
            after("timed out"),
            f"                         ({rows} rows vanished in the untracked transform "
            f"{name!r}: their records timed out or failed their chunk)",
        )
    if r.get("dead_lettered_not_poisoned"):
        lines.insert(
            after("dead-lettered"),
            f"                         ({r['dead_lettered_not_poisoned']} not poisoned: out of "
            "attempts)",
        )
    return "\n".join(lines)


def _wall_line(r: dict[str, Any]) -> str:
    """The command's wall time (from its start to the report), with the pipeline's run."""
    run = f"{r['wall_seconds']:.2f} s"
    if r.get("total_seconds") is None:
        return f"  wall time              {run}  (the pipeline's run)"
    return (
        f"  wall time              {r['total_seconds']:.2f} s  (the command, from its start to "
        f"this report; the pipeline's run {run})"
    )


def _resumed_lines(r: dict[str, Any]) -> list[str]:
    """What the earlier runs of a resumed job had done (the counts below are the job's, the
    failures and replays this run's)."""
    if not r.get("resumed"):
        return []
    if r.get("finished_before"):
        return [
            "                         (the job had finished in an earlier run: its report "
            "again, nothing run now)"
        ]
    e = r.get("earlier") or {}
    if not e:
        return []
    return [
        f"  resumed                the earlier run(s) had read {e.get('source_records', 0)} "
        f"source records: completed {e.get('completed', 0)}, dead-lettered "
        f"{e.get('dead_lettered', 0)},",
        f"                         {e.get('pending', 0)} left pending (replayed by this run); "
        "failed, timed out and replayed below count this run's",
    ]


def _rss_lines(r: dict[str, Any]) -> list[str]:
    if r.get("driver_peak_rss_mb") is None:
        return []
    jvm = r.get("driver_jvm_peak_rss_mb")
    return [
        f"  driver peak RSS        {r['driver_peak_rss_mb']:.0f} MiB (Python, after the run)"
        + (f", JVM {jvm:.0f} MiB" if jvm is not None else "")
    ]


#: --seed is mixed into 64-bit draws as seed << 8: keep it in range.
MAX_SEED = (1 << 55) - 1


def _seed(text: str) -> int:
    from .cli import non_negative_int

    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_SEED}, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``xorack demo`` command line: every option is checked here, before Spark starts.

    >>> build_parser().parse_args(["--records", "10"]).records
    10
    """
    from .cli import (
        STORAGE_FORMS,
        CommandParser,
        positive_float,
        positive_int,
        rate,
        spark_master,
        storage_spec,
    )
    from .demo_stream import StreamConfig

    d = DemoConfig()
    ap = CommandParser(
        prog="xorack demo",
        description="Word count over generated sentences on local Spark, with failures injected; "
        "every source record is tracked by the XOR acker and accounted for (--stream: the same "
        "per event-time window as a live Structured Streaming query). Exit status: 0 when no "
        "record is lost and the results match the reference, 1 otherwise, 2 for a bad option.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--records",
        type=positive_int,
        default=argparse.SUPPRESS,
        help=f"source sentences; with --stream {StreamConfig.records} by default, over all "
        f"files (default: {d.records})",
    )
    ap.add_argument(
        "--partitions", type=positive_int, default=d.partitions, help="Spark partitions"
    )
    # the failure rates default to d.* with --ft on and to 0 with --ft off (see FT_ONLY)
    ap.add_argument(
        "--fail-rate",
        type=rate,
        default=argparse.SUPPRESS,
        help="share of sentences that raise on their first attempt "
        f"(default: {d.fail_rate}; 0 with --ft off)",
    )
    ap.add_argument(
        "--poison-rate",
        type=rate,
        default=argparse.SUPPRESS,
        help="share of sentences that raise on every attempt (dead letters) "
        f"(default: {d.poison_rate}; 0 with --ft off)",
    )
    ap.add_argument(
        "--drop-rate",
        type=rate,
        default=argparse.SUPPRESS,
        help="share of sentences losing words in transit on the first attempt (timeouts) "
        f"(default: {d.drop_rate}; 0 with --ft off)",
    )
    ap.add_argument(
        "--storage",
        type=storage_spec,
        default=d.storage,
        help=f"where the FT layer keeps source records: 'memory' or a SQLite file, {STORAGE_FORMS}",
    )
    ap.add_argument(
        "--max-attempts",
        type=positive_int,
        default=d.max_attempts,
        help="attempts per sentence before it is dead-lettered",
    )
    ap.add_argument(
        "--ft",
        choices=("on", "off"),
        default="on",
        help="fault tolerance on/off; off runs the same Spark plan without xorack, with no "
        "failures injected (an injected failure would fail the Spark job): the failure and "
        "acker options are refused with it",
    )
    ap.add_argument(
        "--seed",
        type=_seed,
        default=d.seed,
        help="seed of the generated sentences and of the injected failures",
    )
    ap.add_argument(
        "--plain-failures",
        action="store_true",
        help="inject failures as a plain exception (the stage bisects the batch) instead of "
        "FailRecord(rows=...)",
    )
    ap.add_argument(
        "--master",
        type=spark_master,
        default=None,
        help="Spark master URL, e.g. local-cluster[2,1,1024] (two executor JVMs on this "
        "machine) or spark://host:7077; default: the embedded local session",
    )
    ap.add_argument(
        "--ackers",
        type=positive_int,
        default=d.ackers,
        help="acker processes: 1 = the acker is a thread of the driver; N > 1 = N shard "
        "processes, each owning the source ids that hash to it (a SQLite --storage becomes "
        "one file per shard)",
    )
    ap.add_argument(
        "--combine",
        choices=("auto", "on", "off"),
        default=d.combine,
        help="the count stages partial aggregates per chunk of 1024 sentences (on) or every "
        "word (off); auto: on when fewer than one sentence per chunk fails its first attempt "
        "(with the default rates, off: a failure replays its chunk-mates)",
    )
    ap.add_argument(
        "--optimistic",
        choices=("auto", "on", "off"),
        default=d.optimistic,
        help="each phase first runs as plain Spark would and is acked as one XOR tree, "
        "falling back to tracked rounds when anything in it failed (on); off: tracked rounds "
        "only; auto: on when fewer than one sentence is expected to fail its first attempt "
        "(with the default rates, off: the optimistic round would only cost)",
    )
    ap.add_argument(
        "--workdir",
        type=_workdir,
        default=None,
        metavar="DIR",
        help="a resumable job in DIR (the word-count sink, the staged rows and, unless "
        "--storage names another SQLite file, the FT storage DIR/ft.db): a run killed midway "
        "and started again with the same arguments finishes the job exactly once; a finished "
        "job prints its report again. Default: a temporary directory, removed at the end",
    )
    stream = ap.add_argument_group(
        "streaming (--stream)",
        "the word count per event-time window as a live Structured Streaming query over "
        "generated files fed one by one",
    )
    stream.add_argument(
        "--stream",
        action="store_true",
        help="run the streaming demo: one progress line per micro-batch, then the report",
    )
    sd = StreamConfig()
    stream.add_argument(
        "--files",
        type=positive_int,
        default=argparse.SUPPRESS,
        help=f"input files, one per micro-batch; file f spans [10 f, 10 f + 10) s of event time "
        f"(default: {sd.files})",
    )
    stream.add_argument(
        "--interval",
        type=positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"seconds between two files fed into the watched directory (default: {sd.interval:g})",
    )
    stream.add_argument(
        "--trigger",
        type=positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"the query's processing-time trigger (default: {sd.trigger:g})",
    )
    stream.add_argument(
        "--timeout",
        type=positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="a record not completed this long after its attempt began is replayed "
        f"(default: {sd.timeout:g})",
    )
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own logs (WARN and up) with the ERROR lines and stack traces of "
        "the task failures a run expects (off by default: the report says what failed)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--no-progress", action="store_true", help="no progress bar (--stream: no progress lines)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``xorack demo``; returns the exit code (0 = lost 0 and results match).
    A bad option exits with status 2 and one line on stderr, before Spark starts."""
    from .cli import check_storage_opens

    parser = build_parser()
    args = parser.parse_args(argv)
    given = vars(args)
    if args.stream:
        return _main_stream(parser, args)
    stream_only = [f"--{k}" for k in STREAM_OPTIONS if k in given]
    if stream_only:
        parser.error(f"{', '.join(stream_only)} needs --stream (the streaming demo)")
    if args.workdir is not None:
        if args.ft != "on":
            parser.error("--workdir makes a resumable job: it needs --ft on")
        if args.ackers != 1:
            parser.error("--workdir (a resumable job) needs --ackers 1")
        if os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
            parser.error(f"--workdir {args.workdir!r} is a file, not a directory")
    ft = args.ft == "on"
    if not ft:
        refused = [option for option, given in _ft_only(args).items() if given]
        if refused:
            parser.error(
                f"{', '.join(refused)}: not with --ft off (without the acker an injected "
                "failure fails the Spark job, and nothing is stored or retried); drop "
                f"{'it' if len(refused) == 1 else 'them'} or use --ft on"
            )
    if args.workdir is not None:  # created now: a directory that cannot be is an option error
        _make_workdir(parser, args.workdir)
    if args.storage != "memory" and ft:
        from .sharding import Shard, shard_storage

        for k in range(args.ackers):  # each acker process opens its own file
            spec = shard_storage(args.storage, Shard(k, args.ackers))
            check_storage_opens(parser, "--storage", spec)
    cfg = _config(args)
    report = run_demo(cfg, progress=not args.no_progress)
    report["total_seconds"] = round(command_seconds(), 3)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_report(report))
    ok = (report["lost"] in (0, None)) and bool(report["results_match"])
    return 0 if ok else 1


def _config(args: argparse.Namespace) -> DemoConfig:
    """The demo's configuration from its checked command line (the failure rates default to
    the demo's with --ft on, to 0 with --ft off)."""
    given = vars(args)
    ft = args.ft == "on"
    d = DemoConfig()
    rates = (
        given.get("fail_rate", d.fail_rate if ft else 0.0),
        given.get("poison_rate", d.poison_rate if ft else 0.0),
        given.get("drop_rate", d.drop_rate if ft else 0.0),
    )
    return DemoConfig(
        records=given.get("records", DEFAULT_RECORDS),
        partitions=args.partitions,
        fail_rate=rates[0],
        poison_rate=rates[1],
        drop_rate=rates[2],
        storage=args.storage,
        ft=ft,
        seed=args.seed,
        max_attempts=args.max_attempts,
        plain_failures=args.plain_failures,
        master=args.master,
        ackers=args.ackers,
        combine=args.combine,
        optimistic=args.optimistic,
        workdir=args.workdir,
        verbose=args.verbose,
    )


def repair_demo(cfg: DemoConfig, spark: Any = None) -> dict[str, Any]:
    """``xorack repair``: the resumable demo job in ``cfg.workdir`` (run to the end by ``xorack
    demo --workdir``) with its split stage fixed — no sentence is poisoned any more — repairs
    its dead letters (:meth:`Pipeline.repair`): only they run, their words are counted into the
    stored counts. Returns the repair report, with ``results_match``: the counts equal a count
    of every sentence but those still dead-lettered."""
    from xorack.spark import Pipeline, SQLiteSink
    from xorack.spark.session import get_or_create_session

    assert cfg.workdir is not None
    workdir = os.path.abspath(cfg.workdir)
    if spark is None:
        master: dict[str, Any] = {"master": cfg.master} if cfg.master else {}
        spark = get_or_create_session(
            **master, app_name="xorack-repair", shuffle_partitions=cfg.partitions
        )
    storage = cfg.storage
    if storage == "memory":
        storage = "sqlite:///" + os.path.join(workdir, "ft.db")
    sink = SQLiteSink(os.path.join(workdir, "counts.db"), "words")
    sentences = spark.range(cfg.records, numPartitions=cfg.partitions).mapInPandas(
        GenerateSentences(cfg.seed), "sid long, text string"
    )
    p = Pipeline(
        spark,
        storage=storage,
        max_attempts=cfg.max_attempts,
        combine=cfg.combines,
        optimistic=cfg.optimistic_rounds,
        resume=True,
        workdir=os.path.join(workdir, "work"),
    )
    # the fixed job; no failure injected in transit (a repair is a run of its own)
    # (the transform that loses words in transit stays declared, losing none: a repair's plan
    # must be the job's, xorack.spark.fingerprint)
    declare_job(p, sentences, sink, replace(cfg, fail_rate=0.0), fixed=True)
    report = p.repair()
    view = p.dead_letters(view=True)
    dead = set(view.loc[view["status"] == "dead", "sid"].dropna().astype(int).tolist())
    stored = sink.read()
    counts = Counter(dict(zip(stored["word"], stored["n"].astype(int), strict=True)))
    out = report.as_dict()
    out["results_match"] = counts == reference_counts(cfg, exclude=dead)
    return out


def repair_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``xorack repair`` (the options of ``xorack demo``, ``--workdir`` required:
    give the job's own); returns 0 when the repaired counts match the reference."""
    parser = build_parser()
    parser.prog = "xorack repair"
    parser.description = (
        "Repair the dead letters of a resumable demo job (xorack demo --workdir DIR, run to the "
        "end) with its split stage fixed: only they run, merged into the stored counts once. "
        "Give the job's own options."
    )
    args = parser.parse_args(argv)
    if args.workdir is None or args.stream or args.ft != "on":
        parser.error("give the job's --workdir (a batch demo job run with FT on)")
    report = repair_demo(_config(args))
    if args.json:
        print(json.dumps(report, default=str))
    else:
        for key in ("repair", "repaired", "failed_again", "still_dead", "resumed"):
            print(f"{key:>14}: {report[key]}")
        for name, what in report["sinks"].items():
            print(f"{'sink ' + name:>14}: {what}")
        print(f"{'results_match':>14}: {report['results_match']}")
    return 0 if report["results_match"] else 1


#: The options of the streaming demo only.
STREAM_OPTIONS = ("files", "interval", "trigger", "timeout")


def _ft_only(args: argparse.Namespace) -> dict[str, bool]:
    """The options that mean something only with --ft on, and whether each was given (a rate
    of 0 and a value equal to its default are harmless)."""
    d, given = DemoConfig(), vars(args)
    out = {
        f"--{name.replace('_', '-')} {given[name]:g}": bool(given.get(name))
        for name in ("fail_rate", "poison_rate", "drop_rate")
        if name in given
    }
    out.update(
        {
            f"--storage {args.storage}": args.storage != d.storage,
            f"--max-attempts {args.max_attempts}": args.max_attempts != d.max_attempts,
            f"--ackers {args.ackers}": args.ackers != d.ackers,
            "--plain-failures": args.plain_failures,
            f"--combine {args.combine}": args.combine != d.combine,
            f"--optimistic {args.optimistic}": args.optimistic != d.optimistic,
        }
    )
    return out


def _workdir(text: str) -> str:
    """``--workdir``: a directory name (checked and created in :func:`main`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the directory is empty (e.g. --workdir /tmp/wc)")
    return text


def _make_workdir(parser: argparse.ArgumentParser, workdir: str) -> None:
    """Create ``--workdir`` (kept: a second run resumes the job) and check that files can be
    written there, or exit with an option error."""
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        parser.error(f"argument --workdir: cannot create or write {workdir!r}: {reason}")


def _main_stream(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``xorack demo --stream``: the options checked, the streaming demo run and reported."""
    from .cli import check_storage_opens
    from .demo_stream import StreamConfig, format_stream_report, run_stream_demo

    batch_only = {
        "--ft off": args.ft != "on",
        "--workdir": args.workdir is not None,
        f"--ackers {args.ackers}": args.ackers != 1,
        f"--combine {args.combine}": args.combine != "auto",
        f"--optimistic {args.optimistic}": args.optimistic != "auto",
    }
    refused = [name for name, bad in batch_only.items() if bad]
    if refused:
        parser.error(
            f"{', '.join(refused)}: not with --stream (the streaming demo tracks every record "
            "with the embedded acker, in a temporary directory)"
        )
    given = vars(args)
    d = StreamConfig()
    cfg = StreamConfig(
        files=given.get("files", d.files),
        records=given.get("records", d.records),
        partitions=args.partitions,
        fail_rate=given.get("fail_rate", d.fail_rate),
        poison_rate=given.get("poison_rate", d.poison_rate),
        drop_rate=given.get("drop_rate", d.drop_rate),
        storage=args.storage,
        seed=args.seed,
        max_attempts=args.max_attempts,
        plain_failures=args.plain_failures,
        master=args.master,
        interval=given.get("interval", d.interval),
        trigger=given.get("trigger", d.trigger),
        timeout=given.get("timeout", d.timeout),
    )
    if cfg.files < 2:
        parser.error(
            f"--files {cfg.files}: the streaming demo needs 2 files at least (the watermark "
            "closes a file's window once a later file is read)"
        )
    if cfg.records < cfg.files:
        parser.error(
            f"--records {cfg.records} is fewer than --files {cfg.files}: every file needs a "
            "sentence at least"
        )
    if args.storage != "memory":
        check_storage_opens(parser, "--storage", args.storage)
    t0 = time.perf_counter()
    report = run_stream_demo(cfg, out=None if args.no_progress else sys.stderr)
    report["total_seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(report) if args.json else format_stream_report(report))
    ok = report["lost"] == 0 and bool(report["results_match"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
