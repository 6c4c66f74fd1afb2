"""Windowed aggregations in a tracked stream, against plain Structured Streaming as the oracle.

Spark's ``structured_network_wordcount_windowed`` ported: lines with an event time, split into
words by a pandas stage, ``withWatermark("ts", ...)``, ``groupBy(F.window(...), "word")``,
append mode. The same files are read by plain Structured Streaming (``maxFilesPerTrigger=1``:
one file per micro-batch on both sides) with the poisoned lines removed; its windows are what
the sinks must hold — each window once, with its value, none that Spark would not close.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import sys
import threading
import time

import pandas as pd
import pytest

import xorack
from helpers.crashes import crash_after_window_write
from helpers.streams import plain_rows
from xorack.spark import ParquetSink, Pipeline, SQLiteSink

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stage functions below

FILES = 6
LINES = 20  # per file
WORDS = ["apple", "pear", "plum", "fig", "kiwi"]
SCHEMA = "id long, ts timestamp, line string"
WORD_SCHEMA = "id long, ts timestamp, word string"
T0 = dt.datetime(2026, 11, 26, 12, 0, 0)
WAIT = 600.0


def _is_poison(i: int) -> bool:
    return i % 23 == 7


def _write_input(directory, late: bool = False, behind: int = 22) -> None:
    """File f holds event times in [10 f, 10 f + 10) seconds (in order within the 5 s delay);
    with ``late``, two lines per file from the third on ``behind`` seconds behind, in a 10 s
    window plain Spark has closed."""
    directory.mkdir(parents=True)
    for f in range(FILES):
        with open(directory / f"part-{f:02d}.json", "w") as out:
            for k in range(LINES):
                i = f * LINES + k
                ts = T0 + dt.timedelta(seconds=10 * f + k * 10 / LINES)
                if late and k in (3, 11) and f >= 2:
                    ts -= dt.timedelta(seconds=behind)
                words = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 3))
                row = {"id": i, "ts": ts.isoformat(), "line": words}
                out.write(json.dumps(row) + "\n")
        _in_order(directory / f"part-{f:02d}.json", f)


def _in_order(path, f: int) -> None:
    """File f's modification time f seconds after the first's: a file source reads the files
    oldest first, one per micro-batch, and files written within the same instant would come
    in any order."""
    import os

    at = time.time() - 3600 + f
    os.utime(path, (at, at))


def _read(spark, directory):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))


def _split(pdf: pd.DataFrame) -> pd.DataFrame:
    # a poisoned line fails on every attempt; every fifth line fails on its first attempt
    from xorack.spark import current_attempt

    attempt = current_attempt(pdf)
    bad = pdf["id"].map(_is_poison).to_numpy(bool)
    bad |= (pdf["id"] % 5 == 0).to_numpy() & (attempt == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    words = pdf.assign(word=pdf["line"].str.split(" ")).explode("word")
    return words.drop(columns=["line"]).reset_index(drop=True)  # the lineage columns stay


def _split_clean(pdf: pd.DataFrame) -> pd.DataFrame:
    words = pdf.assign(word=pdf["line"].str.split(" ")).explode("word")
    return words.drop(columns=["line"]).reset_index(drop=True)  # the lineage columns stay


def _words(lines):
    from pyspark.sql import functions as F

    return lines.select("id", "ts", F.explode(F.split("line", " ")).alias("word"))


def _counted(words, window):
    from pyspark.sql import functions as F

    return words.groupBy(window(), "word").agg(F.count("*").alias("n"), F.max("id").alias("top"))


def _without_poison(lines, drop_poison: bool):
    from pyspark.sql import functions as F

    if not drop_poison:
        return lines
    return lines.where(~F.col("id").isin([i for i in range(FILES * LINES) if _is_poison(i)]))


def _plain(spark, directory, window, name, drop_poison=True):
    """Plain Structured Streaming's windows over the same files (append mode)."""
    lines = _without_poison(_read(spark, directory), drop_poison).withWatermark("ts", "5 seconds")
    rows = plain_rows(spark, _counted(_words(lines), window), name)
    return sorted(_key(r) for r in rows)


def _closed(spark, directory, window, drop_poison=True):
    """Every window the final watermark closes (the largest event time minus the 5 s delay),
    computed in batch: with no late row, what append mode writes in the end. (Plain
    Structured Streaming writes the last of them only when it runs a no-data micro-batch after
    the last file, which ``availableNow`` does or not, by timing: so its output is checked to
    be a part of this, and to equal it up to its last window.)"""
    from pyspark.sql import functions as F

    lines = spark.read.schema(SCHEMA).json(str(directory))
    top = lines.agg(F.max("ts")).collect()[0][0]
    watermark = top - dt.timedelta(seconds=5)
    counted = _counted(_words(_without_poison(lines, drop_poison)), window)
    return sorted(_key(r) for r in counted.collect() if r[0]["end"] <= watermark)


def _check_against_spark(got, plain, closed) -> None:
    assert plain  # Spark closed windows
    assert got == closed  # every window the watermark closes, once, with its value
    last = max(r[1] for r in plain)
    assert [r for r in got if r[1] <= last] == plain  # what plain Spark wrote, the same


def _key(r) -> tuple:
    w = r[0]
    return (w["start"], w["end"], r[1], int(r[2]), int(r[3]))


def _tracked(spark, directory, window, sink, fn=_split, max_attempts=3, branch=None, partitions=2):
    from pyspark.sql import functions as F

    p = Pipeline(spark, max_attempts=max_attempts)
    lines = p.source(_read(spark, directory), name="lines", partitions=partitions)
    if branch is not None:  # another branch of the source lines
        branch(lines)
    words = lines.withWatermark("ts", "5 seconds").map_in_pandas(fn, WORD_SCHEMA, name="split")
    counts = words.groupBy(window(), "word").agg(F.count("*").alias("n"), F.max("id").alias("top"))
    counts.sink(sink, name="windows")
    return p


def _restartable(spark, directory, out, checkpoint, fn):
    """A start of the tumbling-window query into the ``ParquetSink`` at ``out``, on
    ``checkpoint`` (call it again to restart it); returns the report."""

    def start():
        p = _tracked(spark, directory, _tumbling, ParquetSink(out), fn=fn)
        run = p.start_stream(timeout=60.0, available_now=True, checkpoint_location=checkpoint)
        return run.wait(timeout=WAIT)

    return start


def _tumbling():
    from pyspark.sql import functions as F

    return F.window("ts", "10 seconds")


def _sliding():
    from pyspark.sql import functions as F

    return F.window("ts", "10 seconds", "5 seconds")


def _session():
    from pyspark.sql import functions as F

    return F.session_window("ts", "3 seconds")


@pytest.mark.parametrize(
    "window", [_tumbling, _sliding, _session], ids=["tumbling", "sliding", "session"]
)
def test_windows_equal_plain_structured_streaming_under_failures(
    spark, tmp_path, window, monkeypatch
):
    """Also with the staged rows compacted once two directories are staged (rows of closed
    windows go)."""
    from xorack.spark import stream_state

    monkeypatch.setattr(stream_state, "COMPACT_AFTER", 2)
    monkeypatch.setattr(stream_state, "COMPACT_FILES", 2)
    directory = tmp_path / "in"
    _write_input(directory)
    plain = _plain(spark, directory, window, f"plain_{window.__name__[1:]}")
    want = _closed(spark, directory, window)
    out = str(tmp_path / "windows.parquet")
    p = _tracked(spark, directory, window, ParquetSink(out))
    run = p.start_stream(timeout=60.0, available_now=True)
    report = run.wait(timeout=WAIT)

    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, want)
    dead = set(p.dead_letters().column("id").to_pylist())
    assert dead == {i for i in range(FILES * LINES) if _is_poison(i)}
    assert report.lost == 0
    assert report.replayed > 0
    assert report.sink_rows["windows"] == len(want)
    assert run.windows.compactions > 0  # a session's rows leave once it is written
    # a time window's write into a native sink runs beside the next micro-batch (a session
    # window's is waited for: the sessions it writes leave the staged rows)
    assert (run.windows.beside.started > 0) == (window is not _session)
    # the source's tagger is the same every round (its round read from the rows, its event
    # time accumulator the query's): its mapInArrow was built once, in the first round
    (source,) = [s for s in p.plan().sources if s.name == "lines"]
    assert len(source._taggers) == 1


@pytest.mark.parametrize("window", [_tumbling, _sliding], ids=["tumbling", "sliding"])
def test_an_emission_reads_only_the_staged_directories_that_can_hold_its_windows(
    spark, tmp_path, window, monkeypatch
):
    """Each staged micro-batch's event times are known (observed as it is written): an
    emission leaves the directories whose rows cannot fall into the windows it writes unread
    (replays included: a replayed record is staged with its own event time, in a later
    directory) and still writes what plain Structured Streaming writes; once every window of
    a directory has closed, it is deleted whole (no rewrite)."""
    directory = tmp_path / "in"
    _write_input(directory)
    plain = _plain(spark, directory, window, f"plain_pruned_{window.__name__[1:]}")
    want = _closed(spark, directory, window)
    from xorack.spark.windows import WindowStaging

    stagings = {}
    write = WindowStaging.write
    readable = WindowStaging.readable
    read = []  # per emission: each directory read, with the bounds known of it then

    def noted(self, df, tag):
        stagings[id(self)] = self
        return write(self, df, tag)

    def reading(self, within, paths=None):
        got = readable(self, within, paths)
        read.extend((within, self.bounds.get(p, "unknown")) for p in got)
        return got

    monkeypatch.setattr(WindowStaging, "write", noted)
    monkeypatch.setattr(WindowStaging, "readable", reading)
    out = str(tmp_path / "windows.parquet")
    p = _tracked(spark, directory, window, ParquetSink(out))
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, want)
    assert report.lost == 0
    assert report.replayed > 0
    (staging,) = stagings.values()
    assert staging.bounds  # the micro-batches' event times, observed
    # no emission read a directory whose rows' windows had all ended before the ones it
    # writes: in this in-order input they are deleted once closed (else left unread); each
    # directory read had its bounds known (only a restart adopts directories without them)
    assert read
    for (lo, _, horizon), bounds in read:
        assert bounds != "unknown"
        assert bounds is not None
        assert bounds[1] + horizon > lo
    assert staging.dropped > 0


@contextlib.contextmanager
def _conf(spark, **values):
    """Spark SQL settings for the duration of a block (their old values back after)."""
    old = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def test_a_stream_without_partitions_reads_its_micro_batches_without_a_shuffle(
    spark, tmp_path, monkeypatch
):
    """A streaming source declared without keys or a partition count keeps the partitions
    each micro-batch is read in (no round-robin shuffle, as plain Spark reads it), coalesced
    to at most ``spark.sql.shuffle.partitions`` (1 here) when it is read in more (each file
    split in several here): a replay goes back to the partition its record was read on, which
    a round always has. Under poison rows and transient failures, the windows equal plain
    Structured Streaming's."""
    from xorack.spark.windows import WindowStaging

    directory = tmp_path / "in"
    _write_input(directory)
    plans = []
    write = WindowStaging.write

    def noted(self, df, tag):
        plans.append(str(df._jdf.queryExecution().executedPlan().toString()))
        return write(self, df, tag)

    monkeypatch.setattr(WindowStaging, "write", noted)
    split = {"spark.sql.files.maxPartitionBytes": "256", "spark.sql.files.openCostInBytes": "0"}
    with _conf(spark, **split):
        plain = _plain(spark, directory, _tumbling, "plain_narrow")
        want = _closed(spark, directory, _tumbling)
        one_file = spark.read.schema(SCHEMA).json(str(directory / "part-00.json"))
        assert one_file.rdd.getNumPartitions() > 1  # a micro-batch is read in several
        out = str(tmp_path / "narrow.parquet")
        with _conf(spark, **{"spark.sql.shuffle.partitions": "1"}):
            p = _tracked(spark, directory, _tumbling, ParquetSink(out), partitions=None)
        report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, want)
    assert report.lost == 0
    assert report.replayed > 0
    assert report.dead_lettered == sum(_is_poison(i) for i in range(FILES * LINES))
    # the first micro-batch has no replay to route: its rows are read, tagged and staged
    # without a shuffle (a micro-batch with replays places both by one on their route key)
    assert "Exchange" not in plans[0]
    assert any("Exchange" in plan for plan in plans)


@pytest.mark.parametrize("fails", ["after its files", "before its files"])
@pytest.mark.parametrize("overlap", [True, False], ids=["beside", "waited"])
def test_a_failed_emission_beside_the_next_micro_batch_stops_the_stream_and_is_written_again(
    spark, tmp_path, monkeypatch, overlap, fails
):
    """An emission's write runs beside the next micro-batch (or is waited for: ``waited``):
    when it fails (once its files are in the sink, or before), the error stops the stream
    (raised by ``wait``, not lost), its files are taken back and the watermark with them, and
    ``stop()``'s drain writes those windows again: the sink holds each window once, with its
    value."""
    from xorack.spark import stream_state

    monkeypatch.setattr(stream_state, "OVERLAP", overlap)
    directory = tmp_path / "in"
    _write_input(directory)
    want = set(_closed(spark, directory, _tumbling, drop_poison=False))  # no line fails
    real = stream_state.write_emitted
    calls = []

    def flaky(node, out, name, chain=()):
        calls.append(name)
        if len(calls) == 2 and fails == "before its files":
            raise RuntimeError("injected: the emission's write failed")
        written = real(node, out, name=name, chain=chain)
        if len(calls) == 2:  # its files are in the sink: taken back
            raise RuntimeError("injected: the emission's write failed")
        return written

    monkeypatch.setattr(stream_state, "write_emitted", flaky)
    out = str(tmp_path / "flaky.parquet")
    p = _tracked(spark, directory, _tumbling, ParquetSink(out), fn=_split_clean)
    run = p.start_stream(timeout=60.0, available_now=True)
    with pytest.raises(RuntimeError, match="injected: the emission's write failed"):
        run.wait(timeout=WAIT)
    assert (run.windows.beside.started >= 2) if overlap else not run.windows.beside.started
    got = [_key(r) for r in spark.read.parquet(out).collect()]
    assert len(got) == len(set(got))  # no window written twice
    assert set(got) <= want  # each with its final value
    assert len(calls) >= 3  # the drain wrote the failed emission's windows again
    assert {r[:3] for r in got} >= {r[:3] for r in want if r[1] <= T0 + dt.timedelta(seconds=20)}


def _slowly(seconds):
    """A ``mapInPandas`` function passing its batches on after ``seconds``."""

    def run(frames):
        for frame in frames:
            time.sleep(seconds)
            yield frame

    return run


def _until(condition, seconds=200.0):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.2)
    assert condition()


def _tied(monkeypatch, spark):
    """Window writes that carry the job group, tags and SQL execution of the thread that
    started them (as an ``InheritableThread`` would): only the wait before the query stops
    keeps ``stop()`` from cancelling them."""
    from xorack.spark import stream_emission

    sc = spark.sparkContext
    keys = stream_emission._Emission.UNTIED
    start = stream_emission.BesideWrites.start

    def tied_start(self, work, done, undo):
        props = {k: sc.getLocalProperty(k) for k in keys}
        assert props["spark.jobGroup.id"], "a micro-batch's thread has the query's job group"

        def tied_work():
            for key, value in props.items():
                sc.setLocalProperty(key, value)
            return work()

        start(self, tied_work, done, undo)

    monkeypatch.setattr(stream_emission._Emission, "UNTIED", ())
    monkeypatch.setattr(stream_emission.BesideWrites, "start", tied_start)


def test_a_window_write_beside_a_micro_batch_carries_none_of_its_job_properties(spark, monkeypatch):
    """The thread of a write beside the next micro-batch clears the job group, tags and SQL
    execution its JVM thread could inherit: stopping the query (which cancels its job group)
    cannot cancel it. Its thread made an ``InheritableThread`` here, which copies them from
    the thread that starts it (a plain thread's JVM thread may still hold them when py4j
    gives it one that served another thread)."""
    import types

    from pyspark import InheritableThread

    from xorack.spark import stream_emission
    from xorack.spark.stream_emission import BesideWrites

    monkeypatch.setattr(
        stream_emission, "threading", types.SimpleNamespace(Thread=InheritableThread)
    )

    sc = spark.sparkContext
    keys = ("spark.jobGroup.id", "spark.job.tags", "spark.sql.execution.id")
    seen = {}

    def work():
        seen.update({k: sc.getLocalProperty(k) for k in keys})
        return [(None, spark.range(5).count())]

    def started_from_a_query_thread():
        for key in keys:
            sc.setLocalProperty(key, "query-" + key)
        writes = BesideWrites(spark, enabled=True)
        done = []
        writes.start(work, done.append, lambda: None)
        writes.settle()
        seen["written"] = done
        for key in keys:
            sc.setLocalProperty(key, None)

    thread = threading.Thread(target=started_from_a_query_thread)
    thread.start()
    thread.join()
    assert seen == {**dict.fromkeys(keys), "written": [[(None, 5)]]}


@pytest.mark.parametrize("thread", ["untied", "tied"])
def test_stopping_a_stream_waits_for_the_window_write_beside_it(
    spark, tmp_path, monkeypatch, thread
):
    """The last micro-batch's window write is still running beside an idle stream when
    ``stop()`` comes: it is waited for before the query stops (stopping the query cancels its
    jobs, and the write belongs to none of them), and the sink holds every window. ``tied``:
    the write carries the query's job group, so the wait alone keeps it from being cancelled."""
    from xorack.spark import stream_state

    if thread == "tied":
        _tied(monkeypatch, spark)
    directory = tmp_path / "in"
    _write_input(directory)
    want = _closed(spark, directory, _tumbling, drop_poison=False)
    real = stream_state.write_emitted
    state = {"run": None, "slow": 0}

    def slow(node, out, name, chain=()):
        if state["run"].batches >= FILES - 1:  # the last micro-batch's write: 4 s a task
            state["slow"] += 1
            out = out.mapInPandas(_slowly(4.0), out.schema)
        return real(node, out, name=name, chain=chain)

    monkeypatch.setattr(stream_state, "write_emitted", slow)
    out = str(tmp_path / "stopped.parquet")
    p = _tracked(spark, directory, _tumbling, ParquetSink(out), fn=_split_clean)
    run = state["run"] = p.start_stream(timeout=60.0, trigger_seconds=1)
    _until(lambda: run.batches >= FILES and state["slow"] > 0)
    time.sleep(2)  # its job is running
    report = run.stop()
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    assert got == want
    assert report.lost == 0


@pytest.mark.parametrize("when", ["last micro-batch", "drain"])
def test_a_failed_last_window_write_is_raised_and_written_again_by_the_drain(
    spark, tmp_path, monkeypatch, when
):
    """The window write of the last micro-batch (running beside an idle stream), or the
    drain's own at ``stop()``, fails: ``stop()`` raises its error, never returns a clean
    report over a sink that lacks windows; a write of the last micro-batch that failed is done
    again by the drain, so the sink holds every window once."""
    from xorack.spark import stream_state

    directory = tmp_path / "in"
    _write_input(directory)
    want = _closed(spark, directory, _tumbling, drop_poison=False)
    real = stream_state.write_emitted
    state = {"run": None, "failed": 0, "stopping": False}
    # the last micro-batch's write: by the watermark it closes windows by (its files' name):
    # the micro-batch before's (as Spark's), its file's largest event time (10 f + 9.5 s) less
    # the 5 s delay
    epoch = dt.datetime(1970, 1, 1)
    at = T0 + dt.timedelta(seconds=10 * (FILES - 2) + 9.5 - 5)
    last = f"w{(at - epoch) // dt.timedelta(microseconds=1)}"

    def flaky(node, out, name, chain=()):
        fails = state["stopping"] if when == "drain" else name == last
        if fails and not state["failed"]:
            state["failed"] += 1
            raise RuntimeError(f"injected: the {when}'s window write failed")
        return real(node, out, name=name, chain=chain)

    monkeypatch.setattr(stream_state, "write_emitted", flaky)
    out = str(tmp_path / "last.parquet")
    p = _tracked(spark, directory, _tumbling, ParquetSink(out), fn=_split_clean)
    run = state["run"] = p.start_stream(timeout=60.0, trigger_seconds=1)
    _until(lambda: run.batches >= FILES)
    if when == "last micro-batch":
        _until(lambda: state["failed"] == 1)
    time.sleep(2)  # no micro-batch comes (no new file)
    state["stopping"] = True
    with pytest.raises(RuntimeError, match=f"injected: the {when}'s window write failed"):
        run.stop()
    assert state["failed"] == 1
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    if when == "last micro-batch":
        assert got == want  # written again by the drain
    else:  # the drain's write failed: nothing of it in the sink, every earlier window once
        assert got
        assert len(got) == len(set(got))
        assert set(got) <= set(want)


def _crash_in(monkeypatch, when, dead: list, at: str = "before_batch") -> None:
    """The driver dies at the start of the micro-batch ``when(round)`` names (``dead`` gets
    the round), in ``StreamState.at``: ``before_batch`` (after the micro-batch's watermark
    state was noted) or ``begin_batch`` (before: as a crash between two micro-batches leaves
    it); from then on it notes nothing, takes nothing back and drains nothing."""
    from xorack.spark import stream_state, streaming

    real_at, real_note = getattr(stream_state.StreamState, at), stream_state.StreamState._note
    real_remove = ParquetSink.remove_named

    def crash(self, *args):
        if when(self.ctx.round):
            dead.append(self.ctx.round)
            raise RuntimeError(f"simulated driver crash in micro-batch {self.ctx.round}")
        return real_at(self, *args)

    def dead_too(real):
        def call(*args, **kwargs):
            if dead:  # a dead driver notes nothing, takes nothing back
                raise RuntimeError("simulated driver crash (dead)")
            return real(*args, **kwargs)

        return call

    def finish(self, drain):
        raise RuntimeError("simulated driver crash (dead: no drain)")

    monkeypatch.setattr(stream_state.StreamState, at, crash)
    monkeypatch.setattr(stream_state.StreamState, "_note", dead_too(real_note))
    monkeypatch.setattr(ParquetSink, "remove_named", dead_too(real_remove))
    monkeypatch.setattr(streaming.StreamingRun, "_finish", finish)


def test_a_restart_after_a_crash_beside_a_window_write_drops_late_rows_as_spark(
    spark, tmp_path, monkeypatch
):
    """The driver dies early in micro-batch 3, while the window write of micro-batch 2 may
    still run beside it and before its watermark is noted (Spark committed micro-batch 2). The
    restart runs micro-batch 3 again and judges its late rows by the watermark its first run
    used, not by the older one noted: the windows equal plain Structured Streaming's (its late
    rows dropped, none counted twice)."""

    directory = tmp_path / "in"
    _write_input(directory, late=True)
    plain = _plain(spark, directory, _tumbling, "plain_late_restart", drop_poison=False)
    out = str(tmp_path / "late_restart.parquet")
    start = _restartable(spark, directory, out, str(tmp_path / "checkpoint"), _split_clean)

    dead: list[int] = []  # the driver dies before micro-batch 3 persisted anything
    _crash_in(monkeypatch, lambda r: r == 3, dead)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.undo()
    assert dead
    report = start()
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    last = max(r[1] for r in plain)
    assert len(got) == len(set(got))
    assert [r for r in got if r[1] <= last] == plain
    assert report.lost == 0


def _twenty():
    from pyspark.sql import functions as F

    return F.window("ts", "20 seconds")


def _held_write(spark, monkeypatch, release, seconds=120.0):
    """The second window write (the first closes no window: a stream's first emission writes
    its sinks once, empty) waits before its job until ``release(state)`` holds, at most
    ``seconds``; returns the state: the run (set it), the round the write began in, and
    whether it was released (False: it timed out)."""
    from xorack.spark import stream_emission, stream_state

    monkeypatch.setattr(stream_state, "DEFER", True)
    real = stream_state.write_emitted
    state = {"run": None, "began": None, "released": None, "writes": 0, "starts": []}
    start = stream_emission.BesideWrites.start

    def noted_start(self, work, done, undo):  # the round, read in the stream's own thread
        state["starts"].append(state["run"].ctx.round)
        start(self, work, done, undo)

    monkeypatch.setattr(stream_emission.BesideWrites, "start", noted_start)

    def held(node, out, name, chain=()):
        state["writes"] += 1
        if state["writes"] == 2:
            state["began"] = state["starts"][-1]
            deadline = time.time() + seconds
            while not release(state) and time.time() < deadline:
                time.sleep(0.05)
            state["released"] = release(state)
        return real(node, out, name=name, chain=chain)

    monkeypatch.setattr(stream_state, "write_emitted", held)
    return state


def _die_beside_held_write(spark, monkeypatch, start, after: int, at: str = "before_batch"):
    """``start()`` the query with its second window write held until the driver dies (in
    ``StreamState.at``, see :func:`_crash_in`) ``after`` micro-batches after the write began;
    returns the dead run (the patches undone)."""
    dead: list[int] = []
    state = _held_write(spark, monkeypatch, lambda st: bool(dead))
    _crash_in(
        monkeypatch,
        lambda r: state["began"] is not None and r == state["began"] + after,
        dead,
        at=at,
    )
    run = state["run"] = start()
    with pytest.raises(Exception, match="simulated"):
        run.wait(timeout=WAIT)
    monkeypatch.undo()
    assert dead
    assert state["released"] is True
    assert run.windows.skipped_emits > 0  # a micro-batch before closed no window
    return run


def test_a_window_write_runs_beside_micro_batches_that_close_no_window(
    spark, tmp_path, monkeypatch
):
    """20 s windows over files of 10 s: a micro-batch closes a window every other one. The
    first window write runs beside the micro-batches after it until one closes a window
    again: the micro-batch that closes none does not wait for it (the write here waits until
    the next micro-batch after that one began: a stream that waited for it in every
    micro-batch would never get there), the one that closes the next window does; the sink
    equals plain Structured Streaming's. In this in-order stream no staged directory is
    rewritten (compacted), even at two directories holding rows of closed windows: at most
    one does at a time, the others are deleted whole once their windows have closed."""
    from xorack.spark import stream_state
    from xorack.spark.windows import WindowStaging

    monkeypatch.setattr(stream_state, "COMPACT_AFTER", 2)
    stagings = {}
    write = WindowStaging.write

    def noted(self, df, tag):
        stagings[id(self)] = self
        return write(self, df, tag)

    monkeypatch.setattr(WindowStaging, "write", noted)
    directory = tmp_path / "in"
    _write_input(directory)
    plain = _plain(spark, directory, _twenty, "plain_twenty", drop_poison=False)
    want = _closed(spark, directory, _twenty, drop_poison=False)
    state = _held_write(spark, monkeypatch, lambda st: st["run"].ctx.round >= st["began"] + 2)
    out = str(tmp_path / "twenty.parquet")
    p = _tracked(spark, directory, _twenty, ParquetSink(out), fn=_split_clean)
    run = state["run"] = p.start_stream(timeout=60.0, available_now=True)
    report = run.wait(timeout=WAIT)
    assert state["released"] is True  # two micro-batches began while it ran
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, want)
    assert len({r[:2] for r in want}) >= 2  # a second window closed after the held write
    assert run.windows.skipped_emits > 0
    assert run.windows.compactions == 0
    (staging,) = stagings.values()
    assert staging.dropped > 0
    assert report.lost == 0


def test_a_restart_after_a_crash_while_a_window_write_ran_beside_two_micro_batches(
    spark, tmp_path, monkeypatch
):
    """The first window write (20 s windows) still runs when the micro-batch after it moves
    the watermark past no window's end, and when the driver dies in the next one: the
    watermark that micro-batch reached is not noted before the write is (a restart would
    otherwise resume past the windows it takes back). The restart writes those windows
    again: the sink equals plain Structured Streaming's, each window once. The directories
    it adopts keep their event-time bounds: those whose windows have all closed are deleted
    whole, as the first run's would be."""
    from xorack.spark.windows import WindowStaging

    directory = tmp_path / "in"
    _write_input(directory)
    plain = _plain(spark, directory, _twenty, "plain_twenty_restart", drop_poison=False)
    want = _closed(spark, directory, _twenty, drop_poison=False)
    out = str(tmp_path / "twenty_restart.parquet")
    checkpoint = str(tmp_path / "checkpoint")

    def start():
        p = _tracked(spark, directory, _twenty, ParquetSink(out), fn=_split_clean)
        run = p.start_stream(timeout=60.0, available_now=True, checkpoint_location=checkpoint)
        return run

    # the driver dies two micro-batches after the held write began
    _die_beside_held_write(spark, monkeypatch, start, after=2)
    first = [_key(r) for r in spark.read.parquet(out).collect()]
    assert first  # the held write's windows reached the sink before the driver died
    assert len(first) < len(want)
    adopted = {}  # the directories the restart adopts: their staging, and bounds known
    adopt = WindowStaging.adopt

    def noted(self, path):
        adopt(self, path)
        adopted[path] = (self, path in self.bounds)

    monkeypatch.setattr(WindowStaging, "adopt", noted)
    report = start().wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, want)
    assert report.lost == 0
    # each kept its event-time bounds: the restart deleted those whose windows closed whole
    assert adopted
    assert all(known for _, known in adopted.values())
    (staging,) = {id(st): st for st, _ in adopted.values()}.values()
    assert staging.dropped > 0
    assert set(adopted) - set(staging.paths)


@pytest.mark.parametrize("after", [1, 2], ids=["after-the-closing-one", "after-one-closing-none"])
def test_a_restart_between_two_micro_batches_judges_late_rows_as_before_the_crash(
    spark, tmp_path, monkeypatch, after
):
    """As above, with lines 32 s behind, and the driver dying between two micro-batches (before
    the next one noted anything), ``after`` micro-batches after the one whose window write is
    held: the micro-batches since judged late rows by the watermark they reached (the closing
    one's, or that of one that closed no window while the write ran), which is not noted as
    the watermark (the restart takes the write back and writes its windows again). The
    restart judges the late rows of the micro-batch it runs again by that one too (the cut
    write's ``MARK_EMIT``, ``MARK_LATE``), not by the watermark noted before the write: it
    drops the late rows plain Spark drops (lines 32 s behind: the rerun file's fall into the
    window [0, 20), which the noted watermark has not passed)."""
    from xorack.spark import stream_state

    directory = tmp_path / "in"
    _write_input(directory, late=True, behind=32)
    plain = _plain(spark, directory, _twenty, "plain_twenty_late", drop_poison=False)
    every = _closed(spark, directory, _twenty, drop_poison=False)  # late rows counted
    out = str(tmp_path / "twenty_late.parquet")
    checkpoint = str(tmp_path / "checkpoint")
    floors = []
    restore = stream_state.StreamState._restore

    def noted(self):
        restore(self)
        floors.append((self.watermark_us, self._late_floor))

    def start():
        p = _tracked(spark, directory, _twenty, ParquetSink(out), fn=_split_clean)
        return p.start_stream(timeout=60.0, available_now=True, checkpoint_location=checkpoint)

    _die_beside_held_write(spark, monkeypatch, start, after=after, at="begin_batch")
    monkeypatch.setattr(stream_state.StreamState, "_restore", noted)
    report = start().wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    last = max(r[1] for r in plain)
    assert len(got) == len(set(got))
    assert [r for r in got if r[1] <= last] == plain
    assert [r for r in got if r[1] <= last] != [r for r in every if r[1] <= last]  # some late
    assert report.lost == 0
    ((watermark, floor),) = floors
    assert floor > watermark  # the watermark the late rows were judged by was ahead


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("[5, 9]", (5, 9)),
        ("null", None),
        ("[5, 9", "unknown"),
        ('["a", 9]', "unknown"),
        ("", "unknown"),
    ],
    ids=["bounds", "no-row-in-a-window", "cut-short", "not-ints", "empty"],
)
def test_an_adopted_directory_keeps_its_bounds_file_or_is_always_read(tmp_path, text, want):
    """A restart adopts a staged directory with the bounds its file gives; a file cut short or
    not of the form (and no file) leaves the directory's bounds unknown: always read, never
    deleted whole."""
    from xorack.spark.windows import BOUNDS_FILE, WindowStaging

    path = tmp_path / "root" / "0000001-b0000000"
    path.mkdir(parents=True)
    (path / BOUNDS_FILE).write_text(text)
    staging = WindowStaging(str(tmp_path / "root"), None, time="ts")
    staging.adopt(str(path))
    assert staging.paths == [str(path)]
    assert staging.bounds.get(str(path), "unknown") == want
    assert staging.closed(str(path), 10**12, 1) is (want != "unknown")


@pytest.mark.parametrize(
    ("files", "want"),
    [(["[5, 9]", "[7, 20]"], (5, 20)), (["[5, 9]", "null"], (5, 9)), (["[5, 9]", None], "unknown")],
    ids=["union", "one-without-rows", "one-unknown"],
)
def test_a_compaction_a_restart_commits_gets_the_bounds_of_the_directories_it_replaces(
    tmp_path, monkeypatch, files, want
):
    """A crash after a compaction's mark, before its rename: the restart commits it with the
    union of the bounds of the directories before it (its rows are some of theirs; one of
    them unknown, it is always read), then deletes them. Its bounds file is in it before the
    rename, so no crash leaves it named without one."""
    import os

    from xorack.spark.windows import BOUNDS_FILE, WindowStaging

    root = tmp_path / "root"
    before = []
    for i, text in enumerate(files):
        path = root / f"000000{i}-b"
        path.mkdir(parents=True)
        if text is not None:
            (path / BOUNDS_FILE).write_text(text)
        before.append(str(path))
    (root / "0000009-b").mkdir()  # staged after it: stays, always read
    hidden = root / "_0000005-compacted"
    hidden.mkdir()
    staging = WindowStaging(str(root), None, time="ts")
    for path in sorted(os.listdir(root)):
        if not path.startswith("_"):
            staging.adopt(str(root / path))
    renamed = []
    rename = os.replace

    def seen(src, dst):
        renamed.append(os.path.exists(os.path.join(src, BOUNDS_FILE)))
        rename(src, dst)

    monkeypatch.setattr(os, "replace", seen)
    staging.recover("0000005-compacted")
    path = str(root / "0000005-compacted")
    assert staging.paths == [path, str(root / "0000009-b")]
    assert not any(os.path.exists(p) for p in before)
    assert not hidden.exists()
    assert staging.bounds.get(path, "unknown") == want
    assert renamed == [want != "unknown"]  # the file first, then the name
    fresh = WindowStaging(str(root), None, time="ts")  # a second restart reads the same
    fresh.adopt(path)
    assert fresh.bounds.get(path, "unknown") == want


def test_late_rows_are_dropped_as_plain_spark_drops_them(spark, tmp_path):
    """Lines 22 s behind, in windows the watermark has passed: plain Spark drops them, and so
    does xorack (no failure: its watermark is plain Spark's)."""
    directory = tmp_path / "in"
    _write_input(directory, late=True)
    plain = _plain(spark, directory, _tumbling, "plain_late", drop_poison=False)
    every = _closed(spark, directory, _tumbling, drop_poison=False)  # late rows counted
    out = str(tmp_path / "late.parquet")
    p = _tracked(spark, directory, _tumbling, ParquetSink(out), fn=_split_clean)
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    last = max(r[1] for r in plain)
    assert [r for r in got if r[1] <= last] == plain
    assert [r for r in got if r[1] <= last] != [r for r in every if r[1] <= last]  # some late
    assert {(r[0], r[2]) for r in got} <= {(r[0], r[2]) for r in every}
    assert report.lost == 0
    assert report.dead_lettered == 0


def test_a_reader_sees_only_final_windows_while_the_stream_runs(spark, tmp_path):
    """Read the SQLite sink over and over while the stream runs: every row ever seen is a row
    of the final result (a window is written once its records have settled, never partial)."""
    directory = tmp_path / "in"
    _write_input(directory)
    plain = _plain(spark, directory, _tumbling, "plain_live")
    want = _closed(spark, directory, _tumbling)
    sink = SQLiteSink(str(tmp_path / "live.db"), "windows")
    p = _tracked(spark, directory, _tumbling, sink)
    seen: set = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                frame = sink.read()
            except Exception:  # the table is created by start_stream
                frame = None
            if frame is not None:
                for r in frame.itertuples(index=False):
                    seen.add(_row(r))
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)
    finally:
        stop.set()
        t.join()
    final = {_row(r) for r in sink.read().itertuples(index=False)}
    _check_against_spark(sorted(final), plain, want)
    assert seen <= final  # nothing partial, nothing retracted, was ever visible
    assert report.lost == 0


def _row(r) -> tuple:
    w = r.window
    start, end = (w["start"], w["end"]) if isinstance(w, dict) else (w.start, w.end)
    return (
        pd.Timestamp(start).to_pydatetime(),
        pd.Timestamp(end).to_pydatetime(),
        r.word,
        int(r.n),
        int(r.top),
    )


def test_a_stream_refuses_what_it_cannot_carry(spark, tmp_path):
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    sink = SQLiteSink(str(tmp_path / "r.db"), "r")

    p = Pipeline(spark)
    words = p.source(_read(spark, directory), name="lines", partitions=2)
    words.groupBy(F.window("ts", "10 seconds"), "line").count().sink(sink)
    with pytest.raises(ValueError, match="no watermark"):
        p.start_stream(available_now=True)

    p = Pipeline(spark)
    words = p.source(_read(spark, directory), name="lines", partitions=2)
    with pytest.raises(xorack.spark.ops.TrackedOperationError, match="not a timestamp"):
        words.withWatermark("line", "5 seconds")
    with pytest.raises(ValueError, match="unknown unit"):
        words.withWatermark("ts", "5 parsecs")
    w = words.withWatermark("ts", "5 seconds")
    with pytest.raises(xorack.spark.ops.TrackedOperationError, match="one watermark"):
        words.withWatermark("ts", "6 seconds")
    counts = w.groupBy(F.window("ts", "10 seconds"), "line").count()
    with pytest.raises(xorack.spark.ops.TrackedOperationError, match="limit: not supported"):
        counts.limit(3)

    for after, mode, error in (  # a second aggregation, a pandas stage, a generator, a filter
        (lambda c: c.groupBy("line").count(), "append", "write no final row"),
        (lambda c: c.groupBy("line").count(), "complete", r"'aggregate' \(aggregate\) after"),
        (
            lambda c: c.map_in_pandas(lambda it: it, "line string, count long", name="late"),
            "append",
            r"'late' \(a pandas/Arrow stage\) after 'window_aggregate' \(aggregates\) is not",
        ),
        (
            lambda c: c.select("line", F.explode(F.array("count")).alias("x")),
            "append",
            "a generator",
        ),
        (lambda c: c.where("count > 1"), "complete", "in complete mode are not supported"),
    ):
        p = Pipeline(spark)
        lines = p.source(_read(spark, directory), name="lines", partitions=2)
        counts = lines.withWatermark("ts", "5 seconds").groupBy(
            F.window("ts", "10 seconds"), "line"
        )
        after(counts.count().select("line", "count")).sink(sink)
        with pytest.raises(ValueError, match=error):
            p.start_stream(available_now=True, output_mode=mode)


def _selected(counts):
    """Operations after the window, as a user writes them before the sink."""
    from pyspark.sql import functions as F

    return (
        counts.select(F.col("window.start").alias("start"), "word", "n")
        .where("n > 7")
        .withColumn("twice", F.col("n") * 2)
        .drop("twice")
        .withColumnRenamed("n", "count")
    )


def test_window_then_select_where_equals_plain_structured_streaming(spark, tmp_path):
    """A windowed count followed by select/where/withColumn/drop/withColumnRenamed before an
    idempotent sink, records failing in the stage before the window: the rows plain
    Structured Streaming writes for the same query over the input minus the poison."""
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    lines = _without_poison(_read(spark, directory), True).withWatermark("ts", "5 seconds")
    selected = _selected(_counted(_words(lines), _tumbling))
    plain = sorted(
        (r.start, r.word, int(r["count"])) for r in plain_rows(spark, selected, "plain_selected")
    )
    want = sorted((r[0], r[2], r[3]) for r in _closed(spark, directory, _tumbling) if r[3] > 7)
    assert plain
    assert len(want) < len(_closed(spark, directory, _tumbling))  # the filter removes some

    sink = SQLiteSink(str(tmp_path / "selected.db"), "selected")
    p = Pipeline(spark, max_attempts=3)
    src = p.source(_read(spark, directory), name="lines", partitions=2)
    words = src.withWatermark("ts", "5 seconds").map_in_pandas(_split, WORD_SCHEMA, name="split")
    counts = words.groupBy(F.window("ts", "10 seconds"), "word").agg(
        F.count("*").alias("n"), F.max("id").alias("top")
    )
    _selected(counts).sink(sink, name="selected")
    report = p.start_stream(timeout=60.0, available_now=True).wait(timeout=WAIT)

    got = sorted(
        (pd.Timestamp(r.start).to_pydatetime(), r.word, int(r.count))
        for r in sink.read().itertuples(index=False)
    )
    assert got == want  # every closed window passing the filter, once
    last = max(r[0] for r in plain)
    assert [r for r in got if r[0] <= last] == plain  # what plain Spark wrote, the same
    dead = set(p.dead_letters().column("id").to_pylist())
    assert dead == {i for i in range(FILES * LINES) if _is_poison(i)}
    assert report.lost == 0
    assert report.replayed > 0
    assert report.sink_rows["selected"] == len(want)


@pytest.mark.parametrize("window", [_sliding, _session], ids=["sliding", "session"])
def test_windows_in_a_batch_run_equal_plain_spark(spark, tmp_path, window):
    """The same declaration in ``p.run()``: every window (a batch has no late rows)."""
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    lines = spark.read.schema(SCHEMA).json(str(directory))
    poison = [i for i in range(FILES * LINES) if _is_poison(i)]
    words = lines.where(~F.col("id").isin(poison)).select(
        "id", "ts", F.explode(F.split("line", " ")).alias("word")
    )
    plain = words.groupBy(window(), "word").agg(F.count("*").alias("n"), F.max("id").alias("top"))
    want = sorted(_key(r) for r in plain.collect())
    out = str(tmp_path / "batch.parquet")
    p = Pipeline(spark, max_attempts=3)
    src = p.source(lines, name="lines").withWatermark("ts", "5 seconds")
    counted = src.map_in_pandas(_split, WORD_SCHEMA, name="split").groupBy(window(), "word")
    counted.agg(F.count("*").alias("n"), F.max("id").alias("top")).sink(ParquetSink(out))
    report = p.run()
    assert sorted(_key(r) for r in spark.read.parquet(out).collect()) == want
    assert report.lost == 0
    assert report.dead_lettered == len(poison)


def test_complete_mode_word_count_equals_plain_structured_streaming(spark, tmp_path):
    """``structured_network_wordcount`` ported (complete mode, no window): the sink holds the
    whole result over the completed records, replaced at once whenever every record has
    settled; a reader never sees a count fall, nor one above the final."""
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    poison = [i for i in range(FILES * LINES) if _is_poison(i)]
    lines = _read(spark, directory).where(~F.col("id").isin(poison))
    plain = lines.select(F.explode(F.split("line", " ")).alias("word")).groupBy("word").count()
    rows = plain_rows(spark, plain, "plain_complete", mode="complete")
    want = sorted((r["word"], int(r["count"])) for r in rows)

    sink = SQLiteSink(str(tmp_path / "counts.db"), "counts")
    p = Pipeline(spark, max_attempts=3)
    words = p.source(_read(spark, directory), name="lines", partitions=2).map_in_pandas(
        _split, WORD_SCHEMA, name="split"
    )
    words.groupBy("word").count().sink(sink, name="counts")
    with pytest.raises(ValueError, match="without a time window"):
        p.start_stream(available_now=True)  # append mode: no final row to write
    snapshots: list = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the table is created by start_stream
                frame = sink.read()
                snapshots.append(dict(zip(frame["word"], frame["count"], strict=True)))
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        run = p.start_stream(timeout=60.0, available_now=True, output_mode="complete")
        report = run.wait(timeout=WAIT)
    finally:
        stop.set()
        t.join()
    got = sorted((r.word, int(r.count)) for r in sink.read().itertuples(index=False))
    assert got == want
    assert report.lost == 0
    assert report.dead_lettered == len(poison)
    final = dict(want)
    for before, after in itertools.pairwise(snapshots):
        assert all(after.get(w, 0) >= n for w, n in before.items())  # never falls
    assert all(n <= final[w] for snap in snapshots for w, n in snap.items())
    assert run.windows.replaces >= 1


def _lost(i: int) -> bool:
    return i % 17 == 8 and i >= (FILES - 2) * LINES


def test_update_mode_windows_equal_plain_structured_streaming(spark, tmp_path):
    """``structured_network_wordcount_windowed`` in update mode, late lines included: each
    changed window's row replaces its row in the sink (by window and word) once every record
    has settled; in the end the sink holds the row plain Structured Streaming last wrote for
    each window (its updates applied by key, late lines dropped as Spark drops them); a reader
    never sees a count fall, nor one above the final. A second branch loses some lines of the
    last files (their records time out while their words are staged, then die): they never
    count. (Lines lost earlier would hold the watermark back below the late lines' times for
    their timeouts: those would then count, unlike in Spark — see the README.)"""
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory, late=True)
    last: dict = {}  # plain Spark's update-mode output applied by key

    def upsert(batch, _epoch) -> None:
        for r in batch.collect():
            last[(r[0]["start"], r[0]["end"], r[1])] = (int(r[2]), int(r[3]))

    lost = [i for i in range(FILES * LINES) if _lost(i)]
    lines = _without_poison(_read(spark, directory), True).where(~F.col("id").isin(lost))
    lines = lines.withWatermark("ts", "5 seconds")
    q = (
        _counted(_words(lines), _tumbling)
        .writeStream.outputMode("update")
        .foreachBatch(upsert)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(WAIT)
    want = sorted((*k, *v) for k, v in last.items())

    sink = SQLiteSink(str(tmp_path / "update.db"), "windows")

    def lossy(lines) -> None:
        lines.transform(lambda df: df.where(~df.id.isin(lost)), name="lossy").sink(
            ParquetSink(str(tmp_path / "audit")), name="audited"
        )

    p = _tracked(spark, directory, _tumbling, sink, branch=lossy)
    snapshots: list = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the table is created by start_stream
                rows = [_row(r) for r in sink.read().itertuples(index=False)]
                snapshots.append({r[:3]: r[3] for r in rows})
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        run = p.start_stream(timeout=6.0, available_now=True, output_mode="update")
        report = run.wait(timeout=WAIT)
    finally:
        stop.set()
        t.join()
    got = sorted(_row(r) for r in sink.read().itertuples(index=False))
    assert got == want
    assert report.lost == 0
    assert report.replayed > 0
    assert run.windows.updates.writes >= 2  # updated along the way, not once at the end
    final = {r[:3]: r[3] for r in got}
    for before, after in itertools.pairwise(snapshots):
        assert all(after.get(w, 0) >= n for w, n in before.items())  # never falls
    assert all(n <= final[w] for snap in snapshots for w, n in snap.items())
    assert len(set(final)) == len(got)  # one row per window and word


def test_update_mode_global_aggregate_equals_plain_structured_streaming(spark, tmp_path):
    """``agg(...)`` without groupBy in update mode: the sink holds the one row plain
    Structured Streaming last wrote (a reviewer found it failing mid-stream: no key)."""
    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    last: dict = {}

    def keep(batch, _epoch) -> None:
        for r in batch.collect():
            last["row"] = (int(r.n), int(r.top))

    q = (
        _read(spark, directory)
        .agg(F.count("*").alias("n"), F.max("id").alias("top"))
        .writeStream.outputMode("update")
        .foreachBatch(keep)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(WAIT)
    p = Pipeline(spark)
    sink = SQLiteSink(str(tmp_path / "g.db"), "g")
    lines = p.source(_read(spark, directory), name="lines")
    lines.agg(F.count("*").alias("n"), F.max("id").alias("top")).sink(sink, name="total")
    report = p.start_stream(available_now=True, output_mode="update").wait(timeout=WAIT)
    got = [(int(r.n), int(r.top)) for r in sink.read().itertuples(index=False)]
    assert got == [last["row"]]
    assert report.lost == 0


def test_update_mode_restarted_after_a_crash_equals_plain_structured_streaming(
    spark, tmp_path, monkeypatch
):
    """A driver crash mid-stream in update mode (its FT state durable in the checkpoint), then
    a restart on the same checkpoint with the files written since: the SQLite sink holds the
    last row plain Structured Streaming wrote for each window, and nothing is lost."""
    import os

    from xorack.spark import stream_state

    directory = tmp_path / "in"
    _write_input(directory, late=True)
    last: dict = {}

    def upsert(batch, _epoch) -> None:
        for r in batch.collect():
            last[(r[0]["start"], r[0]["end"], r[1])] = (int(r[2]), int(r[3]))

    lines = _without_poison(_read(spark, directory), True).withWatermark("ts", "5 seconds")
    q = (
        _counted(_words(lines), _tumbling)
        .writeStream.outputMode("update")
        .foreachBatch(upsert)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(WAIT)
    want = sorted((*k, *v) for k, v in last.items())

    later = tmp_path / "later"
    later.mkdir()
    for f in range(3, FILES):  # the last files come after the restart
        os.replace(directory / f"part-{f:02d}.json", later / f"part-{f:02d}.json")
    checkpoint = str(tmp_path / "checkpoint")
    sink = SQLiteSink(str(tmp_path / "update.db"), "windows")

    def start():
        p = _tracked(spark, directory, _tumbling, sink)
        run = p.start_stream(
            timeout=6.0, available_now=True, output_mode="update", checkpoint_location=checkpoint
        )
        return run.wait(timeout=WAIT)

    real_update, real_note = stream_state.StreamState.update, stream_state.StreamState._note
    calls: list = []

    def update(self, stats):
        calls.append(1)
        if len(calls) >= 3:  # mid-stream, after two updates
            raise RuntimeError("simulated driver crash")
        return real_update(self, stats)

    def note(self, marks):
        if len(calls) >= 3:  # dead from the crash on: nothing noted
            raise RuntimeError("simulated driver crash (dead)")
        return real_note(self, marks)

    monkeypatch.setattr(stream_state.StreamState, "update", update)
    monkeypatch.setattr(stream_state.StreamState, "_note", note)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.setattr(stream_state.StreamState, "update", real_update)
    monkeypatch.setattr(stream_state.StreamState, "_note", real_note)
    assert len(calls) >= 3
    for f in range(3, FILES):
        os.replace(later / f"part-{f:02d}.json", directory / f"part-{f:02d}.json")
    report = start()
    got = sorted(_row(r) for r in sink.read().itertuples(index=False))
    assert got == want
    assert report.lost == 0


def test_window_then_select_where_restarted_after_a_crash_mid_emission_writes_each_row_once(
    spark, tmp_path, monkeypatch
):
    """Operations after the window (select, where, withColumn, drop, withColumnRenamed) into a
    ParquetSink, and a driver crash in ``stop()``'s last emission (the windows Spark's own
    watermark closed), after its rows were written and before its watermark was noted. The
    restarted query (same checkpoint, the last files written since) writes those windows
    again through the same operations (a write's name is its watermark: its files replace the
    cut write's, or the restart takes them back when the watermark moved on): every closed
    window passing the filter is in the sink once, with its value."""
    import os

    from pyspark.sql import functions as F

    directory = tmp_path / "in"
    _write_input(directory)
    want = sorted((r[0], r[2], r[3]) for r in _closed(spark, directory, _tumbling) if r[3] > 7)
    later = tmp_path / "later"
    later.mkdir()
    for f in range(3, FILES):  # the last files come after the restart
        os.replace(directory / f"part-{f:02d}.json", later / f"part-{f:02d}.json")
    checkpoint = str(tmp_path / "checkpoint")
    out = str(tmp_path / "selected.parquet")

    def start():
        p = Pipeline(spark, max_attempts=3)
        src = p.source(_read(spark, directory), name="lines", partitions=2)
        words = src.withWatermark("ts", "5 seconds").map_in_pandas(
            _split, WORD_SCHEMA, name="split"
        )
        counts = words.groupBy(F.window("ts", "10 seconds"), "word").agg(
            F.count("*").alias("n"), F.max("id").alias("top")
        )
        _selected(counts).sink(ParquetSink(out), name="selected")
        run = p.start_stream(timeout=6.0, available_now=True, checkpoint_location=checkpoint)
        return run.wait(timeout=WAIT)

    written = crash_after_window_write(monkeypatch, in_stop=True)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.undo()
    ((_, rows),) = written
    assert rows > 0  # the crash came after rows were written
    for f in range(3, FILES):
        os.replace(later / f"part-{f:02d}.json", directory / f"part-{f:02d}.json")
    report = start()
    rows = spark.read.parquet(out).collect()
    got = sorted((r.start, r.word, int(r["count"])) for r in rows)
    assert got == want  # each closed window passing the filter once, with its value
    assert report.lost == 0


@pytest.mark.parametrize("seed", [23])
def test_windows_under_a_random_split_into_micro_batches_equal_plain_spark(spark, tmp_path, seed):
    """Property: the input cut at random into files of 1 to 24 lines (one micro-batch each),
    with poison and fail-once lines: the closed windows equal plain Structured Streaming's over
    the same files, whatever the split."""
    from helpers.splits import resplit

    directory = tmp_path / "in"
    _write_input(directory)
    sizes = resplit(directory, seed, most=24)
    assert len(set(sizes)) > 1, sizes
    plain = _plain(spark, directory, _tumbling, "plain_split_windows")
    closed = _closed(spark, directory, _tumbling)
    out = str(tmp_path / "windows.parquet")
    p = _tracked(spark, directory, _tumbling, ParquetSink(out))
    run = p.start_stream(timeout=60.0, available_now=True)
    report = run.wait(timeout=WAIT)
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    _check_against_spark(got, plain, closed)
    assert report.lost == 0
    assert report.dead_lettered == sum(_is_poison(i) for i in range(FILES * LINES))
    # micro-batches of a few seconds of event time: some moved the watermark past no window's
    # end, and wrote nothing (no job), with the same windows as plain Spark
    assert run.windows.skipped_emits > 0
    assert run.windows.emits > 0


@pytest.mark.parametrize(
    "args",
    [
        ("10 seconds",),
        ("10 seconds", "5 seconds"),
        ("1 minute 30 seconds", "30 seconds", "-5 seconds"),
        ("7 seconds", "3 seconds", "1 second"),
    ],
    ids=["tumbling", "sliding", "sliding-negative-offset", "uneven-offset"],
)
def test_a_window_closes_in_a_range_exactly_when_spark_has_a_window_ending_there(spark, args):
    """The check that lets a micro-batch skip the emission (no window of the grid ends in
    (watermark, new watermark]) against Spark's own windows: rows one microsecond before each
    whole second cover every window end of the range (ends fall on whole seconds here)."""
    import random

    from pyspark.sql import functions as F

    from xorack.spark.windows import WindowSpec, closes_any, window_ends

    base = 1_795_694_400_000_000  # 2026-11-26 12:00:00 UTC, in microseconds
    second = 1_000_000
    ts = [base + s * second - 1 for s in range(-200, 201)]
    column = F.window("ts", *args)
    rows = spark.createDataFrame([(t,) for t in ts], "us long").select(
        F.timestamp_micros("us").alias("ts")
    )
    ends = {r[0] for r in rows.select(F.unix_micros(column.getField("end"))).distinct().collect()}
    spec = WindowSpec(groups=(column, "word"), at=0, kind="window", time="ts", exprs=())
    assert window_ends(spec) is not None
    rng = random.Random(23)
    for _ in range(400):
        lo = base + rng.randrange(-100 * second, 100 * second, rng.choice([1, 1000, second]))
        hi = lo + rng.choice([0, 1, 999, second, 3 * second, rng.randrange(0, 40 * second)])
        want = any(lo < e <= hi for e in ends)
        assert closes_any(spec, lo, hi) == want, (args, lo - base, hi - base)


HELD = LINES + 4  # a line of file 1, event time 12 s: in flight past micro-batch 2


def _held_back(pdf: pd.DataFrame) -> pd.DataFrame:
    """Line ``HELD`` fails its first two attempts; every line is split into its words."""
    from xorack.spark import current_attempt

    bad = (pdf["id"] == HELD).to_numpy() & (current_attempt(pdf) <= 2)
    if bad.any():
        raise xorack.FailRecord("held back", rows=bad)
    return _split_clean(pdf)


def test_a_restart_whose_first_emission_comes_at_another_watermark_takes_the_cut_write_back(
    spark, tmp_path, monkeypatch
):
    """Micro-batch 2's emission is held back by a pending record (line ``HELD``, event time
    12 s, failed twice): it closes the window [0, 10) at 12 s - 1 µs instead of at Spark's
    watermark, 14.5 s. The driver dies after that write, before its watermark is noted. On
    the restart the record's third attempt completes in the micro-batch Spark runs again, so
    the window is written at 14.5 s, under another name: the cut write must be taken back, or
    the window would be in the sink twice."""
    import os

    directory = tmp_path / "in"
    _write_input(directory)
    want = _closed(spark, directory, _tumbling, drop_poison=False)
    out = str(tmp_path / "windows.parquet")
    start = _restartable(spark, directory, out, str(tmp_path / "checkpoint"), _held_back)

    written = crash_after_window_write(monkeypatch, in_stop=False)
    with pytest.raises(Exception, match="simulated"):
        start()
    monkeypatch.undo()
    ((cut, _),) = written
    held = T0 + dt.timedelta(seconds=12) - dt.timedelta(microseconds=1)
    epoch = dt.datetime(1970, 1, 1)
    assert cut == f"w{(held - epoch) // dt.timedelta(microseconds=1)}"  # held back
    assert any(f.startswith(f"{cut}-") for f in os.listdir(out))  # the cut write's files
    report = start()
    got = sorted(_key(r) for r in spark.read.parquet(out).collect())
    assert got == want  # every window the watermark closes, once, with its value
    assert not any(f.startswith(f"{cut}-") for f in os.listdir(out))  # taken back
    assert report.lost == 0
    assert report.dead_lettered == 0
