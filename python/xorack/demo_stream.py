"""``xorack demo --stream``: the demo's word count as a live Structured Streaming query.

N JSON files of generated sentences, each sentence with an event time (file f spans
[10 f, 10 f + 10) seconds after :data:`START`), are fed one by one into a directory that a Spark
file source watches (one file per micro-batch, a processing-time trigger). The pipeline:
sentences → words (a pandas stage; the batch demo's failures injected per (sentence, attempt):
``--fail-rate`` raises on the first attempt, ``--poison-rate`` on every attempt, ``--drop-rate``
loses about half of a sentence's words in transit on its first attempt) → stop-word filter →
``groupBy(F.window("ts", "10 seconds"), "word").count()`` after ``withWatermark("ts",
"5 seconds")`` → a SQLite sink, where each window is written once, final, when the watermark
passes its end and every record that can fall into it has settled.

It prints one progress line per micro-batch (and per replay round run while no micro-batch
came), stops once every file was read and no record is pending, and prints the account of every
source record and whether the windows written equal a failure-free reference computed in plain
Python (dead-lettered sentences excluded; the windows ending at or below the final watermark,
the last event time - 5 s: the last window stays open, as in Spark).

>>> cfg = StreamConfig(files=3, records=30)
>>> [len(ids) for ids in file_ids(cfg)]
[10, 10, 10]
>>> int(event_offsets_ms(cfg)[10])  # the first sentence of the second file: 10 s after START
10000
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import pandas as pd

from .demo_data import DROP, FAIL, POISON, STOP_WORDS, chosen, make_sentences

DEFAULT_FILES = 8
DEFAULT_RECORDS = 4_000  # over all files
#: the event time of the first sentence (local time of the Spark session, as Spark reads it)
START = dt.datetime(2026, 1, 1, 12, 0, 0)
FILE_SPAN_MS = 10_000  # each file's event times: [10 f, 10 f + 10) s after START
WINDOW = "10 seconds"
DELAY_MS = 5_000
DELAY = "5 seconds"  # the watermark's delay
SCHEMA = "sid long, ts timestamp, text string"
WORD_SCHEMA = "sid long, ts timestamp, word string, lossy boolean"
SINK_NAME = "windows"


@dataclass(frozen=True)
class StreamConfig:
    """The options of ``xorack demo --stream`` (see ``xorack demo --help``)."""

    files: int = DEFAULT_FILES
    records: int = DEFAULT_RECORDS  # sentences over all files (file f: the f-th share of ids)
    partitions: int = 4
    fail_rate: float = 0.02
    poison_rate: float = 0.002
    drop_rate: float = 0.01
    storage: str = "memory"
    seed: int = 7
    max_attempts: int = 4
    plain_failures: bool = False
    master: str | None = None
    interval: float = 1.0  # seconds between two files fed into the watched directory
    trigger: float = 1.0  # the query's processing-time trigger, seconds
    timeout: float = 10.0  # a record not completed this long after its attempt began: replayed
    deadline: float = 600.0  # the stream is stopped (and the run reported) after this long


def file_ids(cfg: StreamConfig) -> list[np.ndarray]:
    """The sentence ids of each file: consecutive, as even as ``records`` allows."""
    return np.array_split(np.arange(cfg.records, dtype=np.int64), cfg.files)


def event_offsets_ms(cfg: StreamConfig) -> np.ndarray:
    """Each sentence's event time in milliseconds after :data:`START` (by id): file f's
    sentences evenly over [10 f, 10 f + 10) seconds, in id order."""
    out = np.empty(cfg.records, dtype=np.int64)
    for f, ids in enumerate(file_ids(cfg)):
        out[ids] = f * FILE_SPAN_MS + (np.arange(len(ids)) * FILE_SPAN_MS) // max(len(ids), 1)
    return out


def write_files(cfg: StreamConfig, directory: str) -> list[str]:
    """Write the input files into ``directory`` (JSON lines: ``sid``, ``ts``, ``text``); return
    their paths, file 0 first."""
    offsets = event_offsets_ms(cfg)
    paths = []
    for f, ids in enumerate(file_ids(cfg)):
        path = os.path.join(directory, f"sentences-{f:04d}.json")
        with open(path, "w") as out:
            for sid, text in zip(ids.tolist(), make_sentences(ids, cfg.seed), strict=True):
                ts = (START + dt.timedelta(milliseconds=int(offsets[sid]))).isoformat(
                    timespec="milliseconds"
                )
                out.write(json.dumps({"sid": sid, "ts": ts, "text": text}) + "\n")
        paths.append(path)
    return paths


# ---- the pipeline's functions (picklable: module-level or frozen dataclasses) ------------------


@dataclass(frozen=True)
class SplitTimedWords:
    """sentences → words, each word with its sentence's event time; fails the injected failures'
    rows with ``FailRecord(rows=...)`` by each row's attempt (a micro-batch mixes fresh
    sentences and replays). ``lossy`` marks the words that the network will lose: every other
    word of the sentences chosen by ``drop_rate``, on their first attempt."""

    seed: int
    fail_rate: float
    poison_rate: float
    drop_rate: float
    vectorized: bool = True

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        from xorack import FailRecord
        from xorack.spark import current_attempt

        sid = pdf["sid"].to_numpy()
        first = current_attempt(pdf) == 1
        poison = chosen(sid, self.poison_rate, self.seed, POISON)
        bad = poison | (first & chosen(sid, self.fail_rate, self.seed, FAIL))
        if bad.any():
            if not self.vectorized:
                raise FailRecord(f"injected failure in sentence {int(sid[np.argmax(bad)])}")
            if poison.any():  # two reasons: the poisoned rows first, the others on the re-run
                raise FailRecord("injected failure: poisoned sentence", rows=poison)
            raise FailRecord("injected failure on the first attempt", rows=bad)
        dropping = first & chosen(sid, self.drop_rate, self.seed, DROP)
        # explode the input frame itself: the event time and the lineage columns stay
        words = pdf.assign(word=pdf["text"].str.split(), lossy=dropping).explode("word")
        words = words[words["word"].notna()]
        every_other = words.groupby(level=0).cumcount().to_numpy() % 2 == 0
        words = words.assign(lossy=words["lossy"].to_numpy(bool) & every_other)
        return words.drop(columns=["text"]).reset_index(drop=True)


def lose_in_transit(df: Any) -> Any:
    """The lossy network (an untracked transform): the words marked ``lossy`` vanish, their
    records time out and are replayed. (The rows a filter removed before travel on as ghosts,
    their payload null, to carry their acks: they get through.)"""
    from pyspark.sql import functions as F

    return df.where(~F.coalesce(F.col("lossy"), F.lit(False)))


# ---- the reference -------------------------------------------------------------------------------


def final_watermark(cfg: StreamConfig) -> dt.datetime:
    """The watermark at the end of the stream: the last event time minus the delay."""
    last = int(event_offsets_ms(cfg).max())
    return START + dt.timedelta(milliseconds=last - DELAY_MS)


def reference_windows(cfg: StreamConfig, exclude: set[int]) -> Counter:
    """``(window start, window end, word) -> count`` computed without Spark or xorack over every
    sentence but ``exclude``, for the windows that end at or below :func:`final_watermark`.

    >>> ref = reference_windows(StreamConfig(files=3, records=30), exclude=set())
    >>> sorted({(s.second, e.second) for s, e, _ in ref})  # the last window stays open
    [(0, 10), (10, 20)]
    """
    offsets = event_offsets_ms(cfg)
    watermark = final_watermark(cfg)
    ids = np.arange(cfg.records, dtype=np.int64)
    keep = ids[~np.isin(ids, np.fromiter(exclude, dtype=np.int64, count=len(exclude)))]
    span = dt.timedelta(milliseconds=FILE_SPAN_MS)
    counts: Counter = Counter()
    for sid, text in zip(keep.tolist(), make_sentences(keep, cfg.seed), strict=True):
        start = START + dt.timedelta(milliseconds=int(offsets[sid]) // FILE_SPAN_MS * FILE_SPAN_MS)
        if start + span > watermark:
            continue
        counts.update((start, start + span, w) for w in text.split() if w not in STOP_WORDS)
    return counts


def written_windows(frame: pd.DataFrame) -> Counter:
    """The sink's rows as ``(window start, window end, word) -> count``."""
    out: Counter = Counter()
    for w, word, n in zip(frame["window"], frame["word"], frame["count"], strict=True):
        start, end = (w["start"], w["end"]) if isinstance(w, dict) else (w.start, w.end)
        key = (pd.Timestamp(start).to_pydatetime(), pd.Timestamp(end).to_pydatetime(), word)
        out[key] += int(n)
    return out


# ---- running -------------------------------------------------------------------------------------


class _ProgressLines:
    """One line per micro-batch, and per replay round run while no micro-batch came: the
    micro-batch id, the sentences it read, the acker's counters (replays created so far, those
    waiting for a round, records pending), the watermark windows close by, and the windows
    closed and (window, word) rows written so far."""

    HEADER = (
        f"{'batch':>7} {'input':>6} {'replayed':>9} {'waiting':>8} {'pending':>8} "
        f"{'watermark':>12} {'windows':>8} {'rows':>6}"
    )

    def __init__(
        self, run: Any, client: Any, cfg: StreamConfig, tz: str, out: TextIO | None
    ) -> None:
        self.run, self.client, self.cfg, self.tz, self.out = run, client, cfg, tz, out
        self.sizes = [len(ids) for ids in file_ids(cfg)]
        self.files_read = 0
        self._seen: set[int] = set()
        self._idle = 0

    def watermark(self) -> dt.datetime | None:
        """The watermark windows close by, in the Spark session's local time (as the event
        times are written); None before the first."""
        us = self.run.windows.watermark_us
        if not us:
            return None
        at = pd.Timestamp(us, unit="us", tz="UTC").tz_convert(self.tz).tz_localize(None)
        return at.to_pydatetime()

    def windows_closed(self) -> int:
        """The files' windows (file f: [10 f, 10 f + 10) s) that the watermark has passed."""
        wm = self.watermark()
        if wm is None:
            return 0
        passed = (wm - START) // dt.timedelta(milliseconds=FILE_SPAN_MS)
        return max(0, min(self.cfg.files, passed))

    def line(self, batch: str, rows: str, stats: dict[str, Any]) -> None:
        if self.out is None:
            return
        rows_written = self.run.report.sink_rows.get(SINK_NAME, 0)
        print(
            f"{batch:>7} {rows:>6} {stats.get('replayed', 0):>9} "
            f"{stats.get('replays_waiting', 0):>8} {stats.get('pending', 0):>8} "
            f"{_clock(self.watermark()):>12} {self.windows_closed():>8} {rows_written:>6}",
            file=self.out,
            flush=True,
        )

    def poll(self, stats: dict[str, Any] | None = None) -> None:
        """Print the micro-batches and replay rounds done since the last call (``stats``: the
        acker's counters to show, else asked now). A micro-batch's input is the sentences of
        the files it read (its file source's log offsets count files): Spark's own
        ``numInputRows`` counts every read of the batch, and xorack reads it twice (the rows,
        then their largest event time)."""
        done = []
        for prog in self.run.query.recentProgress:
            bid = int(prog["batchId"])
            if bid in self._seen or not prog["numInputRows"]:  # (an idle trigger: no rows)
                continue
            self._seen.add(bid)
            source = prog["sources"][0]
            first = _log_offset(source["startOffset"]) + 1
            last = _log_offset(source["endOffset"])
            self.files_read = max(self.files_read, last + 1)
            done.append((str(bid), str(sum(self.sizes[first : last + 1]))))
        while self._idle < self.run.idle_rounds:
            self._idle += 1
            done.append(("replay", "-"))
        if done and self.out is not None:
            now = self.client.stats() if stats is None else stats
            for batch, rows in done:
                self.line(batch, rows, now)


def _log_offset(offset: Any) -> int:
    """A file source's offset: the micro-batches of files it has read, from 0 (-1: none)."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    return -1 if offset is None else int(offset["logOffset"])


def _clock(at: dt.datetime | None) -> str:
    return "-" if at is None else at.strftime("%H:%M:%S.%f")[:-3]


def run_stream_demo(
    cfg: StreamConfig, spark: Any = None, out: TextIO | None = sys.stderr
) -> dict[str, Any]:
    """Run the streaming demo; return the report as a dict (the ``--json`` object). Progress
    lines go to ``out`` (None: none).

    >>> report = run_stream_demo(StreamConfig(files=3, records=300), out=None)  # doctest: +SKIP
    >>> report["lost"], report["results_match"]                                # doctest: +SKIP
    (0, True)
    """
    from pyspark.sql import functions as F

    from xorack.spark import Pipeline, SQLiteSink
    from xorack.spark.session import get_or_create_session

    if spark is None:
        master: dict[str, Any] = {"master": cfg.master} if cfg.master else {}
        spark = get_or_create_session(
            **master, app_name="xorack-demo-stream", shuffle_partitions=cfg.partitions
        )
    workdir = tempfile.mkdtemp(prefix="xorack-demo-stream-")
    try:
        aside, inbox = os.path.join(workdir, "aside"), os.path.join(workdir, "in")
        os.makedirs(aside)
        os.makedirs(inbox)
        files = write_files(cfg, aside)
        sink = SQLiteSink(os.path.join(workdir, "windows.db"), "windows")

        p = Pipeline(spark, storage=cfg.storage, max_attempts=cfg.max_attempts)
        reader = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
        sentences = p.source(reader.json(inbox), name="sentences", partitions=cfg.partitions)
        split = SplitTimedWords(
            cfg.seed,
            cfg.fail_rate,
            cfg.poison_rate,
            cfg.drop_rate,
            vectorized=not cfg.plain_failures,
        )
        words = sentences.withWatermark("ts", DELAY).map_in_pandas(split, WORD_SCHEMA, name="split")
        content = words.where(~F.col("word").isin(sorted(STOP_WORDS)))
        if cfg.drop_rate > 0:
            content = content.transform(lose_in_transit, name="lossy-network")
        counted = content.groupBy(F.window("ts", WINDOW), "word").count()
        counted.sink(sink, name=SINK_NAME)

        if out is not None:
            print(
                f"xorack demo --stream: {cfg.records} sentences in {cfg.files} files, fed one "
                f"every {cfg.interval:g} s; trigger {cfg.trigger:g} s, windows of {WINDOW}, "
                f"watermark {DELAY} behind the largest event time",
                file=out,
                flush=True,
            )
            print(_ProgressLines.HEADER, file=out, flush=True)
        tz = spark.conf.get("spark.sql.session.timeZone")
        run = p.start_stream(timeout=cfg.timeout, trigger_seconds=cfg.trigger)
        t0 = time.monotonic()
        fed, next_file = 0, t0
        mtime = int(time.time()) - 3600  # file f's: an hour ago + f seconds (distinct, in order)
        deadline_reached = False
        try:
            lines = _ProgressLines(run, p.client, cfg, tz, out)
            while run.query.isActive:
                if fed < len(files) and time.monotonic() >= next_file:
                    feed(files[fed], inbox, mtime + fed)
                    fed += 1
                    next_file += cfg.interval
                lines.poll()
                if lines.files_read == len(files) and not p.client.stats().get("pending", 0):
                    break
                if time.monotonic() - t0 > cfg.deadline:
                    deadline_reached = True
                    break
                time.sleep(0.1)
        finally:
            report = run.stop()  # (raises the error of a micro-batch that failed)
        # the rounds that ended as the loop did, and the windows the final watermark closed
        left = {"replayed": report.replayed, "replays_waiting": 0, "pending": report.lost}
        lines.poll(left)
        lines.line("stop", "-", left)

        stored = sink.read()
        got = written_windows(stored)
        dead: set[int] = set()
        letters = p.dead_letters()
        if letters is not None and letters.num_rows and "sid" in letters.schema.names:
            dead = {v for v in letters.column("sid").to_pylist() if v is not None}
        poison = _poisoned(cfg)
        want = reference_windows(cfg, exclude=dead)
        report.results_match = len(stored) == len(got) and got == want and poison <= dead
        r = report.as_dict()
        r["records_generated"] = cfg.records
        r["files"] = cfg.files
        r["files_read"] = lines.files_read
        r["deadline_reached"] = deadline_reached
        r["micro_batches"] = run.batches
        r["idle_replay_rounds"] = run.idle_rounds
        r["poisoned"] = len(poison)
        r["dead_lettered_not_poisoned"] = len(dead - poison)
        r["windows_written"] = len({(start, end) for start, end, _ in got})
        r["window_rows_written"] = len(stored)
        r["windows_expected"] = len({(start, end) for start, end, _ in want})
        r["final_watermark"] = _clock(lines.watermark())
        r["expected_watermark"] = _clock(final_watermark(cfg))
        return r
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def feed(path: str, inbox: str, mtime: float) -> str:
    """Move a written file into the watched directory by a rename (Spark never sees half a
    file), with the modification time ``mtime``: a file source reads the oldest file first, and
    files of the same instant would come in any order, so each file gets a later one."""
    os.utime(path, (mtime, mtime))
    target = os.path.join(inbox, os.path.basename(path))
    os.replace(path, target)
    return target


def _poisoned(cfg: StreamConfig) -> set[int]:
    ids = np.arange(cfg.records, dtype=np.int64)
    return set(ids[chosen(ids, cfg.poison_rate, cfg.seed, POISON)].tolist())


def format_stream_report(r: dict[str, Any]) -> str:
    """The human-readable report of ``xorack demo --stream`` (the batch demo's layout)."""
    rounds = f"{r['micro_batches']} micro-batch(es)"
    if r.get("idle_replay_rounds"):
        rounds += f", {r['idle_replay_rounds']} replay round(s) while no micro-batch came"
    lines = [
        "xorack demo --stream report",
        f"  FT                     on  ({rounds})",
        f"  files                  {r['files_read']} of {r['files']} read; windows of {WINDOW}, "
        f"watermark {DELAY} behind",
        f"  source records         {r['source_records']}",
        f"  completed              {r['completed']}",
        f"  failed (explicit)      {r['failed']}",
        f"  timed out              {r['timed_out']}",
        f"  replayed               {r['replayed']}",
        f"  dead-lettered          {r['dead_lettered']}",
        f"  LOST                   {r['lost']}   (must be 0)",
        f"  duplicates absorbed    {r['duplicates_absorbed']}",
        f"  windows written        {r['windows_written']} of {r['windows_expected']} expected "
        f"({r['window_rows_written']} (window, word) rows); watermark {r['final_watermark']}",
        f"  results match          {'yes' if r['results_match'] else 'NO'}"
        "  (windows == a failure-free reference computed without xorack,",
        "                         dead-lettered sentences excluded, every window ending at or",
        f"                         below the last event time - 5 s = {r['expected_watermark']};",
        "                         every poisoned sentence dead-lettered, none counted: "
        f"{r['poisoned']} poisoned)",
        f"  wall time              {r['wall_seconds']:.2f} s",
    ]
    if r.get("dead_lettered_not_poisoned"):
        lines.insert(
            9,
            f"                         ({r['dead_lettered_not_poisoned']} not poisoned: out of "
            "attempts)",
        )
    if r.get("deadline_reached"):
        lines.insert(3, "  stopped                at the deadline, before every record settled")
    return "\n".join(lines)
