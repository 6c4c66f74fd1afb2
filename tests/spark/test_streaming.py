"""Streaming conveniences: ``available_now`` runs to the end of the input, ``ft=False``
streaming for comparison, and ``current_attempt`` per row.

The tests read a file source written here (a few small JSON files, one per micro-batch) with
``trigger(availableNow=True)``, so the query ends by itself. Timeouts are wall-clock based:
they are generous and the assertions are on the guarantee (the sink holds exactly the input
minus the dead letters), not on how many records timed out.
"""

from __future__ import annotations

import json
import sys
import time

import pandas as pd
import pytest

import xorack
from xorack.spark import Pipeline, SQLiteSink

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stage functions below

FILES = 4
ROWS = 25  # per file
N = FILES * ROWS
SCHEMA = "value long, word string"
WAIT = 600.0  # seconds: generous on a loaded 2-core machine; a healthy run takes ~20 s


def _write_input(directory) -> None:
    directory.mkdir(parents=True)
    for f in range(FILES):
        with open(directory / f"part-{f}.json", "w") as out:
            for v in range(f * ROWS, (f + 1) * ROWS):
                out.write(json.dumps({"value": v, "word": f"w{v % 5}"}) + "\n")


def _stream(spark, tmp_path):
    directory = tmp_path / "in"
    _write_input(directory)
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))


def _double(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(double=pdf["value"] * 2)


def _poison_and_flaky(pdf: pd.DataFrame) -> pd.DataFrame:
    # value % 50 == 1 fails on every attempt (dead letters); value % 7 == 0 fails on its
    # first attempt only (replayed in a later micro-batch or in the drain, then completes).
    # The output records the attempt each row completed on.
    from xorack.spark import current_attempt

    attempt = current_attempt(pdf)
    bad = (pdf["value"] % 50 == 1).to_numpy()
    bad |= (pdf["value"] % 7 == 0).to_numpy() & (attempt == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    try:
        current_attempt()  # a micro-batch mixes attempts: streaming needs the frame
        whole = 0
    except ValueError:
        whole = -1
    return _double(pdf).assign(attempt=attempt, whole=whole)


OUT = "value long, word string, double long"
FLAKY_OUT = OUT + ", attempt long, whole long"


def _pipeline(spark, tmp_path, fn, ft=True, name="out", schema=OUT):
    sink = SQLiteSink(str(tmp_path / f"{name}.db"), "out")
    p = Pipeline(spark, ft=ft, max_attempts=3)
    src = p.source(_stream(spark, tmp_path / name), name="files", partitions=2)
    src.map_in_pandas(fn, schema, name="double").sink(sink, name="out")
    return p, sink


def _payload_never_on_the_driver(monkeypatch):
    """The driver's acker client (executors are other processes) may route replays and read
    their source ids and attempts, never take or fetch their rows."""
    from xorack.client import AckerClient

    fetch = AckerClient.fetch_replays

    def take_on_driver(self, *args, **kwargs):
        raise AssertionError("the driver took the replays (collect + createDataFrame)")

    def fetch_ids_only(self, source, tag, partition, columns=None):
        assert columns is not None, "the driver fetched replay rows"
        assert set(columns) <= {"_ft_src", "_ft_attempt"}
        return fetch(self, source, tag, partition, columns)

    monkeypatch.setattr(AckerClient, "take_replays", take_on_driver)
    monkeypatch.setattr(AckerClient, "fetch_replays", fetch_ids_only)


def test_available_now_runs_to_the_end_of_the_input(spark, tmp_path, monkeypatch):
    """``available_now`` runs to the end of the input, failures included; the replays are
    served in the executors: no replay row passes through the driver."""
    _payload_never_on_the_driver(monkeypatch)
    p, sink = _pipeline(spark, tmp_path, _poison_and_flaky, schema=FLAKY_OUT)
    # a timeout far beyond a micro-batch's duration: only the injected failures replay
    run = p.start_stream(timeout=300.0, available_now=True)
    report = run.wait(timeout=WAIT)

    assert not run.query.isActive
    assert run.batches >= 1
    dead = set(p.dead_letters().column("value").to_pylist())
    poison = {v for v in range(N) if v % 50 == 1}
    assert poison <= dead  # the poisoned records used up their attempts
    assert len(dead) == report.dead_lettered
    got = sink.read()
    assert sorted(got["value"]) == [v for v in range(N) if v not in dead]  # exactly once
    assert (got["double"] == got["value"] * 2).all()
    assert report.source_records == N
    assert report.lost == 0
    assert report.completed == N - len(dead)
    assert report.failed >= len(poison) * 3  # every attempt of a poisoned record failed
    assert report.replayed > 0
    assert report.sink_rows["out"] == N - len(dead)
    # current_attempt(pdf) per row: fresh records of every micro-batch on attempt 1, the
    # replays (in later micro-batches or the drain rounds) on attempt 2
    flaky = got["value"] % 7 == 0
    assert flaky.sum() > 0
    assert (got.loc[flaky, "attempt"] == 2).all()
    assert (got.loc[~flaky, "attempt"] == 1).all()
    assert (got["whole"] == -1).all()  # current_attempt() without the frame: ValueError


def _double_and_attempt(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack.spark import current_attempt

    return _double(pdf).assign(attempt=current_attempt(pdf))


def test_streaming_with_ft_off_equals_ft_on_on_failure_free_input(spark, tmp_path):
    schema = OUT + ", attempt long"
    p_on, sink_on = _pipeline(spark, tmp_path, _double_and_attempt, name="on", schema=schema)
    on = p_on.start_stream(available_now=True).wait(timeout=WAIT)
    p_off, sink_off = _pipeline(
        spark, tmp_path, _double_and_attempt, ft=False, name="off", schema=schema
    )
    off = p_off.start_stream(available_now=True).wait(timeout=WAIT)

    assert on.lost == 0
    assert on.completed == N
    assert on.dead_lettered == 0
    assert off.ft is False
    for k in ("source_records", "completed", "failed", "timed_out", "replayed", "lost"):
        assert getattr(off, k) is None, k
    assert off.sink_rows == {"out": N} == on.sink_rows
    key = ["value", "word", "double", "attempt"]
    a = sink_on.read().sort_values("value").reset_index(drop=True)[key]
    b = sink_off.read().sort_values("value").reset_index(drop=True)[key]
    pd.testing.assert_frame_equal(a, b)
    assert sorted(b["value"]) == list(range(N))
    assert (b["attempt"] == 1).all()  # FT off: every record on its first (only) attempt


def test_available_now_takes_no_trigger_seconds(spark, tmp_path):
    p, _ = _pipeline(spark, tmp_path, _double)
    with pytest.raises(ValueError, match=r"available_now=True .* no trigger_seconds"):
        p.start_stream(trigger_seconds=1.0, available_now=True)


def test_wait_on_an_endless_query_times_out_then_stop_drains(spark, tmp_path):
    stream = spark.readStream.format("rate").option("rowsPerSecond", 5).load().select("value")
    sink = SQLiteSink(str(tmp_path / "rate.db"), "out")
    p = Pipeline(spark)
    p.source(stream, name="rate", partitions=2).map_in_pandas(
        lambda df: df, "value long", name="same"
    ).sink(sink, name="out")
    run = p.start_stream(timeout=60.0, trigger_seconds=0.5)
    with pytest.raises(TimeoutError, match=r"still running .* stop"):
        run.wait(timeout=2.0)
    report = run.stop()
    assert run.stop() is report  # stopped once
    assert report.lost == 0
    assert sorted(sink.read()["value"]) == list(range(report.source_records))


def _batch_attempts(pdf: pd.DataFrame) -> pd.DataFrame:
    from xorack.spark import current_attempt, current_round

    attempt = current_attempt(pdf)
    bad = (pdf["value"] % 50 == 1).to_numpy()
    bad |= (pdf["value"] % 7 == 0).to_numpy() & (attempt == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return _double(pdf).assign(
        attempt=attempt, whole=current_attempt(), round_plus_one=current_round() + 1
    )


def test_current_attempt_in_batch_runs_is_round_plus_one(spark, tmp_path):
    rows = [(v, f"w{v % 5}") for v in range(N)]
    df = spark.createDataFrame(rows, SCHEMA).repartition(2)
    sink = SQLiteSink(str(tmp_path / "batch.db"), "out")
    p = Pipeline(spark, max_attempts=3)
    p.source(df, name="rows").map_in_pandas(
        _batch_attempts, FLAKY_OUT + ", round_plus_one long", name="double"
    ).sink(sink, name="out")
    report = p.run()

    assert report.lost == 0
    poison = {v for v in range(N) if v % 50 == 1}
    assert set(p.dead_letters().column("value").to_pylist()) == poison
    got = sink.read()
    assert sorted(got["value"]) == [v for v in range(N) if v not in poison]
    flaky = got["value"] % 7 == 0
    assert (got.loc[flaky, "attempt"] == 2).all()  # failed in round 0, completed in round 1
    assert (got.loc[~flaky, "attempt"] == 1).all()
    assert (got["whole"] == got["attempt"]).all()  # in batch the whole round is on one attempt
    assert (got["round_plus_one"] == got["attempt"]).all()


def test_current_attempt_looks_rows_up_among_the_micro_batch_replays(monkeypatch):
    import numpy as np

    from xorack.errors import LineageError
    from xorack.spark import current_attempt, stages

    replays = np.array([2**63 + 5, 7, 2**40], dtype=np.uint64)  # ids above 2**63 included
    value = stages.encode_attempts(replays, [3, 2, 4])
    monkeypatch.setattr(stages, "_local_property", lambda key: value)
    src = np.array([7, 8, 2**63 + 5, 2**40, 0], dtype=np.uint64).view(np.int64)
    pdf = pd.DataFrame({"x": range(5), "_ft_src": src})
    assert current_attempt(pdf).tolist() == [2, 1, 3, 4, 1]
    assert current_attempt(pdf.iloc[0:0]).tolist() == []
    with pytest.raises(ValueError, match=r"current_attempt\(pdf\)"):
        current_attempt()
    with pytest.raises(LineageError, match="no lineage column '_ft_src'"):
        current_attempt(pdf.drop(columns="_ft_src"))
    # a micro-batch without replays (or streaming with FT off): every row on attempt 1
    monkeypatch.setattr(stages, "_local_property", lambda key: stages.encode_attempts([], []))
    assert current_attempt(pd.DataFrame({"x": [1, 2]})).tolist() == [1, 1]
    # outside streaming: the round's attempt
    monkeypatch.setattr(stages, "_local_property", lambda key: None)
    monkeypatch.setenv("XORACK_ROUND", "2")
    assert current_attempt() == 3
    assert current_attempt(pd.DataFrame({"x": [1]})).tolist() == [3]


@pytest.mark.parametrize("ft", [True, False])
def test_streaming_refuses_barriers_with_ft_on_and_off(spark, tmp_path, ft):
    from pyspark.sql import functions as F

    p = Pipeline(spark, ft=ft)
    words = p.source(_stream(spark, tmp_path), name="files", partitions=2)
    counts = words.groupBy("word").agg(F.count("*").alias("n"))
    counts.sink(SQLiteSink(str(tmp_path / "counts.db"), "counts"), name="counts")
    with pytest.raises(ValueError, match=r"without a time window \(\['aggregate'\]\)"):
        p.start_stream(available_now=True)


def _fail_second_half(pdf: pd.DataFrame) -> pd.DataFrame:
    # a poisoned record's second row fails on every attempt (its first row went to the other
    # sink); value % 7 == 0 fails on its first attempt only
    from xorack.spark import current_attempt

    attempt = current_attempt(pdf)
    bad = (pdf["value"] % 50 == 1).to_numpy()
    bad |= (pdf["value"] % 7 == 0).to_numpy() & (attempt == 1)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad)
    return pdf


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_replays_and_dead_letters_settle_while_the_stream_runs(spark, tmp_path):
    """Without stop(): an idle stream replays its failed records (no next micro-batch is
    needed), and the rows of records that end dead-lettered leave the sinks as soon as they do:
    the sinks are exact while the query runs, not only after stop()."""
    from pyspark.sql import functions as F

    first = SQLiteSink(str(tmp_path / "first.db"), "out")
    second = SQLiteSink(str(tmp_path / "second.db"), "out")
    p = Pipeline(spark, max_attempts=3)
    src = p.source(_stream(spark, tmp_path / "in"), name="files", partitions=2)
    halves = src.select("value", F.explode(F.array(F.lit(0), F.lit(1))).alias("half"))
    halves.where(F.col("half") == 0).sink(first, name="first")
    failing = halves.where(F.col("half") == 1)
    failing.map_in_pandas(_fail_second_half, failing.schema, name="fails").sink(second)
    poison = {v for v in range(N) if v % 50 == 1}
    want = [v for v in range(N) if v not in poison]

    def exact() -> bool:
        return sorted(first.read()["value"]) == sorted(second.read()["value"]) == want

    run = p.start_stream(timeout=10.0)  # a micro-batch of 25 rows takes far less
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if run.batches >= FILES and not p.client.stats().get("pending") and exact():
                break
            time.sleep(0.5)
        assert exact()  # while the query still runs
        assert run.query.isActive
        assert run.idle_rounds > 0  # the replays did not wait for a micro-batch
        assert p.client.stats()["dead_lettered"] == len(poison)
        # the ids the acker keeps to recognize a re-run source task: those of the micro-batches
        # Spark's checkpoint has not committed (the last one), not every one the stream read
        assert 0 < p.client.stats()["known_keys"] <= 2 * ROWS
        # the poisoned records' first halves, and the flaky ones' of their first attempt
        assert run.report.retracted_rows >= len(poison)
    finally:
        report = run.stop()
    assert report.lost == 0
    assert report.dead_lettered == len(poison)
    assert exact()


def test_two_streaming_sources_in_one_query(spark, tmp_path):
    """Two file streams of different columns: one unioned with a third stream of its columns,
    each into its own sink, failures and poison rows included; each record exactly once."""
    from pyspark.sql import functions as F

    a = _stream(spark, tmp_path / "a")
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    for f in range(FILES):
        with open(b_dir / f"part-{f}.json", "w") as out:
            for v in range(f * ROWS, (f + 1) * ROWS):
                out.write(json.dumps({"value": 1000 + v, "word": f"b{v}"}) + "\n")
    b = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(b_dir))
    c_dir = tmp_path / "c"
    c_dir.mkdir()
    with open(c_dir / "part-0.json", "w") as out:
        for v in range(N):
            out.write(json.dumps({"key": f"k{v}", "score": v / 2}) + "\n")
    c = spark.readStream.schema("key string, score double").json(str(c_dir))
    ab_sink = SQLiteSink(str(tmp_path / "ab.db"), "out")
    c_sink = SQLiteSink(str(tmp_path / "c.db"), "out")
    p = Pipeline(spark, max_attempts=3)
    ab = p.source(a, name="a", partitions=2).union(p.source(b, name="b", partitions=2))
    ab.map_in_pandas(_fail_second_half, ab.schema, name="fails").sink(ab_sink, name="ab")
    p.source(c, name="c", partitions=2).where(F.col("score") >= 1).sink(c_sink, name="c_out")
    report = p.start_stream(timeout=300.0, available_now=True).wait(timeout=WAIT)

    values = [*range(N), *range(1000, 1000 + N)]
    poison = {v for v in values if v % 50 == 1}
    got = sorted(ab_sink.read()["value"])
    assert got == [v for v in values if v not in poison]
    assert sorted(c_sink.read()["key"]) == sorted(f"k{v}" for v in range(2, N))
    assert report.lost == 0
    assert report.source_records == 3 * N
    assert report.dead_lettered == len(poison)


@pytest.mark.parametrize("ft", [True, False])
def test_a_parquet_sink_of_a_stream_holds_each_row_once(spark, tmp_path, ft):
    """A ParquetSink of the stream's rows: each micro-batch's settled rows appended once (with
    FT off, each micro-batch's rows); ``spark.read.parquet`` gives exactly the input minus the
    dead letters."""
    from xorack.spark import ParquetSink

    out = str(tmp_path / "out.parquet")
    p = Pipeline(spark, ft=ft, max_attempts=3)
    src = p.source(_stream(spark, tmp_path / "in"), name="files", partitions=2)
    fn = _fail_second_half if ft else _double
    schema = src.schema if ft else OUT
    src.map_in_pandas(fn, schema, name="stage").sink(ParquetSink(out), name="parquet")
    report = p.start_stream(timeout=300.0, available_now=True).wait(timeout=WAIT)
    got = sorted(r["value"] for r in spark.read.parquet(out).collect())
    poison = {v for v in range(N) if v % 50 == 1} if ft else set()
    assert got == [v for v in range(N) if v not in poison]
    assert report.sink_rows["parquet"] == N - len(poison)
    if ft:
        assert report.lost == 0
        assert report.dead_lettered == len(poison)


def test_a_checkpoint_keeps_the_ft_state_and_is_checked_at_every_start(spark, tmp_path):
    """With a Spark checkpoint and the default settings the FT state lives inside it: a second
    start goes on where the first ended (the report counts the whole query); a start whose FT
    state does not belong to the checkpoint is refused, never run short."""
    import shutil

    inbox = tmp_path / "in"
    _write_input(inbox)
    checkpoint = tmp_path / "checkpoint"
    sink = SQLiteSink(str(tmp_path / "out.db"), "out")

    def pipeline(**settings):
        p = Pipeline(spark, max_attempts=3, **settings)
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(inbox))
        src = p.source(stream, name="files", partitions=2)
        src.map_in_pandas(_fail_second_half, src.schema, name="fails").sink(sink, name="out")
        return p

    def start(p, where=checkpoint):
        run = p.start_stream(timeout=300.0, checkpoint_location=str(where), available_now=True)
        return run.wait(timeout=WAIT)

    first = start(pipeline())
    assert (checkpoint / "xorack" / "ft.db").exists()
    assert first.source_records == N
    for f in range(FILES, FILES + 2):  # two more files: the next start reads only them
        with open(inbox / f"part-{f}.json", "w") as out:
            for v in range(f * ROWS, (f + 1) * ROWS):
                out.write(json.dumps({"value": v, "word": f"w{v % 5}"}) + "\n")
    total = (FILES + 2) * ROWS
    second = start(pipeline())
    poison = {v for v in range(total) if v % 50 == 1}
    assert sorted(sink.read()["value"]) == [v for v in range(total) if v not in poison]
    assert second.resumed
    assert second.source_records == total  # the whole query, both starts
    assert second.dead_lettered == len(poison)
    assert second.lost == 0

    kept = tmp_path / "kept"
    shutil.copytree(checkpoint / "xorack", kept)
    shutil.rmtree(checkpoint / "xorack")  # the FT state deleted: refused
    with pytest.raises(ValueError, match="has none of its query"):
        start(pipeline())
    other = tmp_path / "other-checkpoint"  # another query's checkpoint with this FT state
    settings = {
        "resume": True,
        "storage": f"sqlite:///{kept / 'ft.db'}",
        "workdir": str(kept / "w"),
    }
    with pytest.raises(ValueError, match="belongs to query"):
        start(pipeline(**settings), where=other)
