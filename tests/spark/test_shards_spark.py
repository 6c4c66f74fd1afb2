"""``Pipeline(..., ackers=N)`` on real local Spark: the sink of one acker with two, a shard
process SIGKILLed mid-run losing nothing, and no shard process left after a run that fails."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter

import pandas as pd
import pytest

import xorack
from helpers.processes import alive, wait_gone
from xorack.spark import Pipeline, SQLiteSink, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 200


def _lines(spark):
    rows = [(i, " ".join(f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4))) for i in range(N)]
    return spark.createDataFrame(rows, "id long, line string").repartition(2)


def _expected(exclude: frozenset[int] = frozenset()) -> Counter:
    return Counter(
        f"w{(i * 7 + j) % 13}" for i in range(N) if i not in exclude for j in range(1 + i % 4)
    )


def _split(pdf: pd.DataFrame) -> pd.DataFrame:
    if current_round() == 0 and (pdf["id"] % 10 == 3).any():
        bad = (pdf["id"] % 10 == 3).to_numpy()
        raise xorack.FailRecord("injected: id % 10 == 3", rows=bad)
    if (pdf["id"] == 77).any():
        raise xorack.FailRecord("poison", rows=(pdf["id"] == 77).to_numpy())
    out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
    return out[out["word"].notna()].drop(columns=["line"])


def _slow_split(pdf: pd.DataFrame) -> pd.DataFrame:
    time.sleep(0.1)
    return _split(pdf)


def _pipeline(spark, path, split=_split, **kw):
    sink = SQLiteSink(str(path), "words")
    p = Pipeline(spark, max_attempts=3, **kw)
    words = p.source(_lines(spark), name="lines", keys=["id"], partitions=2)
    words.map_in_pandas(split, "id long, word string", name="split").repartition(2, "word").sink(
        sink, name="words"
    )
    return p, sink


def _rows(sink: SQLiteSink) -> list[tuple]:
    return sorted(map(tuple, sink.read()[["id", "word"]].itertuples(index=False)))


def test_two_ackers_write_the_sink_of_one(spark, tmp_path):
    results = {}
    for ackers in (1, 2):
        p, sink = _pipeline(spark, tmp_path / f"out{ackers}.db", ackers=ackers)
        report = p.run()
        results[ackers] = (report, _rows(sink), p.dead_letters().column("id").to_pylist())
    (one, rows1, dead1), (two, rows2, dead2) = results[1], results[2]
    assert rows2 == rows1
    assert Counter(w for _, w in rows2) == _expected(frozenset([77]))
    assert dead2 == dead1 == [77]
    for key in ("source_records", "completed", "failed", "dead_lettered", "lost", "rounds"):
        assert getattr(two, key) == getattr(one, key), key
    assert two.lost == 0
    assert two.completed + two.dead_lettered == N


def test_a_shard_killed_mid_run_loses_nothing(spark, tmp_path):
    p, sink = _pipeline(
        spark,
        tmp_path / "out.db",
        split=_slow_split,
        ackers=2,
        storage=f"sqlite:///{tmp_path / 'ft.db'}",
    )
    seen: dict = {}

    def kill_shard_1_once_it_holds_records() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ctx = p.run_context
            shards = ctx.shards if ctx is not None else None
            if shards is not None:
                try:
                    if p.client.shards[1].stats()["pending"] > 0:
                        seen["pid"] = shards.pids[1]
                        os.kill(seen["pid"], signal.SIGKILL)
                        seen["shards"] = shards
                        return
                except Exception:
                    pass
            time.sleep(0.02)

    killer = threading.Thread(target=kill_shard_1_once_it_holds_records)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        killer.start()
        report = p.run()
        killer.join()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert "pid" in seen, "the shard was not killed during the run"
    assert seen["shards"].restarts == [0, 1]
    assert report.lost == 0
    assert p.dead_letters().column("id").to_pylist() == [77]
    assert Counter(w for _, w in _rows(sink)) == _expected(frozenset([77]))
    assert not wait_gone(seen["shards"].pids)


def test_a_failing_run_leaves_no_shard_process(spark, tmp_path):
    p, _sink = _pipeline(spark, tmp_path / "out.db", ackers=2)
    pids: list[int] = []

    def stop_after_first_round(info) -> None:
        pids.extend(p.run_context.shards.pids)
        assert all(alive(pid) for pid in pids)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        p.run(on_round=stop_after_first_round)
    assert len(pids) == 2
    assert not wait_gone(pids, timeout=0.5)  # stopped by run() itself, not later


def test_a_stream_on_two_ackers_is_exactly_once(spark, tmp_path):
    from test_streaming import FLAKY_OUT, WAIT, _poison_and_flaky, _stream

    n = 100  # test_streaming's input: 4 files of 25 rows
    sink = SQLiteSink(str(tmp_path / "out.db"), "out")
    p = Pipeline(spark, max_attempts=3, ackers=2)
    src = p.source(_stream(spark, tmp_path / "in"), name="files", partitions=2)
    src.map_in_pandas(_poison_and_flaky, FLAKY_OUT, name="double").sink(sink, name="out")
    report = p.start_stream(timeout=300.0, available_now=True).wait(timeout=WAIT)
    dead = set(p.dead_letters().column("value").to_pylist())
    assert {v for v in range(n) if v % 50 == 1} <= dead
    assert sorted(sink.read()["value"]) == [v for v in range(n) if v not in dead]
    assert report.lost == 0
    assert report.source_records == n
    assert report.completed == n - len(dead)


def test_a_pipeline_on_a_standalone_sharded_acker(spark, tmp_path):
    from helpers.acker import start_serve

    proc, location = start_serve("--shards", "2", "--rotate-interval", "0", "--max-attempts", "3")
    try:
        assert location.count(",") == 1
        p, sink = _pipeline(spark, tmp_path / "out.db", service=location)
        report = p.run()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert report.lost == 0
    assert p.dead_letters().column("id").to_pylist() == [77]
    assert Counter(w for _, w in _rows(sink)) == _expected(frozenset([77]))


def test_bad_ackers_arguments_are_refused_before_running(spark):
    from xorack.storage import MemoryStorage

    with pytest.raises(ValueError, match=r"ackers must be an int in \[1, 1024\], got 0"):
        Pipeline(spark, ackers=0)
    with pytest.raises(ValueError, match="give one or the other"):
        Pipeline(spark, ackers=2, service="grpc://127.0.0.1:1,grpc://127.0.0.1:2")
    with pytest.raises(ValueError, match="not a MemoryStorage object"):
        Pipeline(spark, ackers=2, storage=MemoryStorage())


def _split_poison_only(pdf: pd.DataFrame) -> pd.DataFrame:
    if (pdf["id"] == 77).any():
        raise xorack.FailRecord("poison", rows=(pdf["id"] == 77).to_numpy())
    out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
    return out[out["word"].notna()].drop(columns=["line"])


def test_a_task_sends_each_shard_its_events_in_few_requests(spark, tmp_path):
    """A tracked stage defers its events and flushes them at the end of its task (and before
    a fail): with Arrow batches of 10 rows, each of the two shards gets a few requests per
    task, not one per batch; the result is plain Spark's (the poison record 77 dead-lettered).
    """
    p, sink = _pipeline(
        spark, tmp_path / "out.db", split=_split_poison_only, ackers=2, optimistic=False
    )
    calls: list[int] = []

    def count_xor_requests(info) -> None:
        shards = p.client.stats()["service"]["shards"]
        calls.append(sum(s["calls"].get("xor", 0) for s in shards))

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        report = p.run(on_round=count_xor_requests)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    plain = (
        _lines(spark).where("id != 77").selectExpr("id", "explode(split(line, ' ')) as word")
    ).collect()
    assert _rows(sink) == sorted((r.id, r.word) for r in plain)
    assert report.lost == 0
    # the stage saw 20 batches in the first round: a request per batch and shard would be 40+
    assert calls, "no round reported"
    assert calls[0] < 20, calls
