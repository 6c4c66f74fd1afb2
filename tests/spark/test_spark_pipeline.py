"""The Spark pipeline API on real local Spark: FT ON/OFF, failures, poison, bad input, a dying
Python worker. One shared session (the ``spark`` fixture), small data, few partitions."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pandas as pd
import pytest

import xorack
from xorack.spark import Pipeline, SQLiteSink, StageSchemaError, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 120


def _lines(spark, n: int = N):
    rows = [(i, " ".join(f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4))) for i in range(n)]
    return spark.createDataFrame(rows, "id long, line string").repartition(2)


def _split(pdf: pd.DataFrame) -> pd.DataFrame:
    out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
    return out[out["word"].notna()]


def _no_w0(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf[pdf["word"] != "w0"]


def _expected(n: int = N, exclude: frozenset[int] = frozenset()) -> Counter:
    c: Counter = Counter()
    for i in range(n):
        if i in exclude:
            continue
        c.update(w for w in (f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4)) if w != "w0")
    return c


def _word_pipeline(spark, tmp_path, split=_split, ft=True, **kw):
    sink = SQLiteSink(str(tmp_path / f"out-{ft}.db"), "words")
    p = Pipeline(spark, ft=ft, **kw)
    words = p.source(_lines(spark), name="lines", keys=["id"], partitions=2)
    words = words.map_in_pandas(split, "id long, word string", name="split")
    words.map_in_pandas(_no_w0, "id long, word string", name="filter").repartition(2, "word").sink(
        sink, name="words"
    )
    return p, sink


def _counts(sink: SQLiteSink) -> Counter:
    return Counter(sink.read()["word"].tolist())


def test_ft_on_and_off_give_the_same_results_without_failures(spark, tmp_path):
    p_on, sink_on = _word_pipeline(spark, tmp_path, ft=True, deterministic_ids=False)
    report = p_on.run()
    p_off, sink_off = _word_pipeline(spark, tmp_path, ft=False)
    report_off = p_off.run()

    assert _counts(sink_on) == _counts(sink_off) == _expected()
    assert report.source_records == N
    assert report.completed == N
    assert report.lost == 0
    assert report.dead_lettered == 0
    # no record completed before its last event: a late event would have become an orphan
    assert report.orphans == 0
    assert report.timed_out == 0
    assert report.failed == 0
    assert report.rounds == 1
    assert report_off.completed is None
    assert report_off.lost is None
    assert report_off.sink_rows == report.sink_rows


def _fail_on_first_attempt(pdf: pd.DataFrame) -> pd.DataFrame:
    if current_round() == 0 and (pdf["id"] % 10 == 3).any():
        raise xorack.FailRecord("injected: id % 10 == 3")
    return _split(pdf)


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_failing_rows_are_bisected_and_replayed_exactly_once(spark, tmp_path):
    p, sink = _word_pipeline(spark, tmp_path, split=_fail_on_first_attempt)
    report = p.run()
    failing = sum(1 for i in range(N) if i % 10 == 3)
    assert report.failed == failing  # only the failing rows, not their whole batches
    assert report.replayed >= failing
    assert report.lost == 0
    assert report.completed == N
    assert report.dead_lettered == 0
    assert report.rounds == 2
    # deterministic ids + the idempotent sink: exactly-once word counts
    assert _counts(sink) == _expected()


def _fail_rows_on_first_attempt(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = (pdf["id"] % 10 == 3).to_numpy()
    if current_round() == 0 and bad.any():
        # the rows that raise, as a mask on even ids' batches and as positions otherwise
        rows = bad if int(pdf["id"].iloc[0]) % 2 == 0 else bad.nonzero()[0].tolist()
        raise xorack.FailRecord("injected rows: id % 10 == 3", rows=rows)
    return _split(pdf)


def test_fail_record_rows_fail_exactly_those_rows_without_bisection(spark, tmp_path):
    p, sink = _word_pipeline(spark, tmp_path, split=_fail_rows_on_first_attempt)
    report = p.run()
    failing = sum(1 for i in range(N) if i % 10 == 3)
    assert report.failed == failing
    assert report.lost == 0
    assert report.completed == N
    assert report.dead_lettered == 0
    assert report.rounds == 2
    assert _counts(sink) == _expected()


def _fail_rows_badly(pdf: pd.DataFrame) -> pd.DataFrame:
    raise xorack.FailRecord("bad rows", rows=[True, False])  # a mask of the wrong length


def test_a_bad_fail_record_rows_value_is_a_clear_error_naming_the_stage(spark, tmp_path):
    p, _ = _word_pipeline(spark, tmp_path, split=_fail_rows_badly)
    with pytest.raises(Exception, match=r"stage 'split': FailRecord\(rows=\.\.\.\) is a boolean"):
        p.run()


def _poison(pdf: pd.DataFrame) -> pd.DataFrame:
    if (pdf["id"] % 25 == 0).any():
        raise ValueError("poison record")
    return _split(pdf)


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_poison_records_end_in_dead_letters(spark, tmp_path):
    p, sink = _word_pipeline(spark, tmp_path, split=_poison, max_attempts=3)
    report = p.run()
    poison = frozenset(i for i in range(N) if i % 25 == 0)
    assert report.dead_lettered == len(poison)
    assert report.completed == N - len(poison)
    assert report.lost == 0
    assert report.rounds == 3
    dead = p.dead_letters()
    assert dead is not None
    assert dead.num_rows == len(poison)
    assert sorted(dead.column("id").to_pylist()) == sorted(poison)
    assert _counts(sink) == _expected(exclude=poison)


def _drop_lineage(pdf: pd.DataFrame) -> pd.DataFrame:
    return _split(pdf).drop(columns=["_ft_rec"])


def _wrong_schema(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.rename(columns={"line": "text"})


def test_missing_lineage_column_is_a_clear_error_naming_the_stage(spark, tmp_path):
    p, _ = _word_pipeline(spark, tmp_path, split=_drop_lineage)
    with pytest.raises(Exception, match=r"stage 'split'.*_ft_rec"):
        p.run()


def test_wrong_output_schema_is_a_clear_error_naming_the_stage(spark, tmp_path):
    p, _ = _word_pipeline(spark, tmp_path, split=_wrong_schema)
    with pytest.raises(Exception, match=r"stage 'split'.*lacks declared column\(s\) \['word'\]"):
        p.run()


def test_bad_declarations_fail_before_running(spark, tmp_path):
    p = Pipeline(spark)
    with pytest.raises(ValueError, match=r"source 'lines'.*\['nope'\]"):
        p.source(_lines(spark), name="lines", keys=["nope"])
    src = p.source(_lines(spark), name="lines")
    with pytest.raises(ValueError, match="lineage columns added by xorack"):
        src.map_in_pandas(_split, "_ft_rec long, word string")
    with pytest.raises(ValueError, match="no sink declared"):
        p.run()


def test_unreachable_service_is_a_clear_error(spark, tmp_path):
    location = "grpc://127.0.0.1:9"  # the discard port: nothing listens there
    p, _ = _word_pipeline(spark, tmp_path, service=location)
    with pytest.raises(xorack.ServiceError, match=r"pipeline: the acker service at .* cannot"):
        p.run()


def _dies_once(marker: str):
    def split(pdf: pd.DataFrame) -> pd.DataFrame:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if current_round() == 0 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            open(marker, "w").close()
            os._exit(13)  # the Python worker dies mid-task; Spark retries the task
        return _split(pdf)

    return split


def test_a_python_worker_dying_once_loses_nothing(spark, tmp_path):
    marker = tmp_path / "died"
    p, sink = _word_pipeline(spark, tmp_path, split=_dies_once(str(marker)))
    report = p.run()
    assert marker.exists(), "the worker did not die: nothing was retried"
    assert report.lost == 0
    assert report.dead_lettered == 0
    # the retried task persisted its source rows again under the source ids the dead attempt
    # used (derived from the rows): one record each, acked by the retried task's rows, so
    # nothing waited for the dead attempt's rows to time out
    assert report.completed == report.source_records == N
    assert report.repeats > 0
    assert report.timed_out == 0
    assert _counts(sink) == _expected()


EARLY = 2  # micro-batches 0..EARLY inject failures and losses


def _flaky_in_early_batches(pdf: pd.DataFrame) -> pd.DataFrame:
    # streaming: current_round() is the micro-batch id. Multiples of 7 fail in the first
    # micro-batches (their replays succeed in later ones), 50k + 1 fail always (dead letters).
    if (pdf["value"] % 50 == 1).any():
        raise xorack.FailRecord("poison")
    if current_round() <= EARLY and (pdf["value"] % 7 == 0).any():
        raise xorack.FailRecord("flaky")
    return pdf.assign(double=pdf["value"] * 2)


def test_streaming_replays_join_later_micro_batches(spark, tmp_path):
    import time

    from pyspark.sql import functions as F

    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 40)
        .option("numPartitions", 2)
        .load()
        .select("value")
    )
    sink = SQLiteSink(str(tmp_path / "stream.db"), "out")
    p = Pipeline(spark, max_attempts=EARLY + 3)
    out = p.source(stream, name="rate", partitions=2).map_in_pandas(
        _flaky_in_early_batches, "value long, double long", name="flaky"
    )

    def lossy(df):  # lost in transit in early micro-batches: wall-clock timeout → replay
        return df.where(F.col("value") % 11 != 5) if p.round <= EARLY else df

    out.transform(lossy, name="lossy").sink(sink, name="out")
    run = p.start_stream(timeout=1.5, trigger_seconds=0.5)
    deadline = time.monotonic() + 90
    while run.batches < EARLY + 4 and time.monotonic() < deadline:  # a micro-batch takes ~1 s here
        time.sleep(0.2)
    report = run.stop()

    n = report.source_records
    assert n >= 40
    poison = {v for v in range(n) if v % 50 == 1}
    # on a loaded machine a micro-batch can outlast the 1.5 s timeout several times over, so
    # a few clean records may use up their attempts too: the guarantee is the input minus the
    # dead letters, exactly once, and every poisoned record among the dead letters
    dead = set(p.dead_letters().column("value").to_pylist())
    assert poison <= dead
    assert len(dead) == report.dead_lettered
    got = sink.read()
    assert sorted(got["value"]) == [v for v in range(n) if v not in dead]  # exactly once
    assert (got["double"] == got["value"] * 2).all()
    assert report.lost == 0
    assert report.failed > 0
    assert report.timed_out > 0  # the lost rows came back through wall-clock timeouts
    assert report.completed == n - len(dead)


def _slow_split(pdf: pd.DataFrame) -> pd.DataFrame:
    import time

    time.sleep(0.15)
    return _split(pdf)


def test_standalone_sqlite_service_restarted_mid_run_loses_nothing(spark, tmp_path):
    import threading
    import time

    from xorack import FTLayer
    from xorack.service import AckerClient, AckerService

    db = f"sqlite:///{tmp_path / 'ft.db'}"
    job = "restarted-acker-test"  # a one-layer service serves one job: the pipeline's
    svc = AckerService(FTLayer(db), job=job).start()
    port, location = svc.port, svc.location
    services = [svc]

    def crash_and_restart_mid_run() -> None:
        client = AckerClient.get(location, job=job)
        deadline = time.monotonic() + 60
        while client.stats()["persisted"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        old = services[0]
        old.shutdown()
        old.ft.close()  # no completion is recorded any more: as if the acker process died
        services.append(AckerService(FTLayer(db), port=port, job=job).start())  # same file+port

    restarter = threading.Thread(target=crash_and_restart_mid_run)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        restarter.start()
        p, sink = _word_pipeline(spark, tmp_path, split=_slow_split, service=location, job=job)
        report = p.run()
        restarter.join()
        stats = services[-1].ft.stats()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        for s in services:
            s.shutdown()
    assert len(services) == 2
    assert stats.recovered > 0  # the restarted acker found unfinished records in its storage
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert _counts(sink) == _expected()  # all words, each once


class _FlakyWriter:
    def __init__(self, inner) -> None:
        self.inner = inner

    def write(self, rows, rec):
        if current_round() == 0 and (rows["word"] == "w5").any():
            raise OSError("disk hiccup")
        return self.inner.write(rows, rec)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


class _FlakySink(SQLiteSink):
    def open_writer(self, partition: int):
        return _FlakyWriter(super().open_writer(partition))


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_a_failing_sink_write_replays_its_records(spark, tmp_path):
    sink = _FlakySink(str(tmp_path / "flaky.db"), "words")
    p = Pipeline(spark)
    words = p.source(_lines(spark), name="lines", keys=["id"], partitions=2)
    words = words.map_in_pandas(_split, "id long, word string", name="split")
    words.map_in_pandas(_no_w0, "id long, word string", name="filter").sink(sink, name="words")
    report = p.run()
    assert report.failed > 0  # every source record of a failed write batch
    assert report.lost == 0
    assert report.completed == N
    assert _counts(sink) == _expected()


def test_an_empty_source_completes_with_nothing_to_account(spark, tmp_path):
    sink = SQLiteSink(str(tmp_path / "empty.db"), "words")
    p = Pipeline(spark)
    empty = spark.createDataFrame([], "id long, line string")
    p.source(empty, name="lines").map_in_pandas(_split, "id long, word string").sink(sink)
    report = p.run()
    assert report.source_records == 0
    assert report.lost == 0
    assert sink.count() == 0


def _distinct_words(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.drop_duplicates("word")  # each kept row keeps its own _ft_rec


def _distinct_words_failing_once(pdf: pd.DataFrame) -> pd.DataFrame:
    if current_round() == 0 and (pdf["id"] % 10 == 7).any():
        raise ValueError("a failing group")
    return _distinct_words(pdf)


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
@pytest.mark.parametrize("ft", [True, False])
def test_grouped_stage_fails_whole_groups_and_replays_them(spark, tmp_path, ft):
    sink = SQLiteSink(str(tmp_path / f"grouped-{ft}.db"), "words")
    p = Pipeline(spark, ft=ft)
    words = p.source(_lines(spark), name="lines", keys=["id"], partitions=2)
    words = words.map_in_pandas(_split, "id long, word string", name="split")
    # without the acker a failing group fails the job: FT off runs without failures
    fn = _distinct_words_failing_once if ft else _distinct_words
    distinct = words.apply_in_pandas(["id"], fn, "id long, word string", name="distinct")
    distinct.sink(sink, name="words")
    if not ft:
        distinct_rows = p.run().sink_rows["words"]
    else:
        report = p.run()
        assert report.failed == sum(1 for i in range(N) if i % 10 == 7)  # whole groups
        assert report.lost == 0
        assert report.completed == N
        distinct_rows = report.sink_rows["words"]
    expected = sorted(
        (i, w) for i in range(N) for w in {f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4)}
    )
    got = sink.read()
    assert sorted(zip(got["id"], got["word"], strict=True)) == expected
    assert distinct_rows == len(expected)  # rows stored (duplicates absorbed counted apart)


# ---- call_bisecting without Spark: FailRecord(rows=...) vs plain exceptions ------------------


def _counting(fn):
    calls = []

    def wrapped(df):
        calls.append(len(df))
        return fn(df)

    return wrapped, calls


def _fail_multiples_of_7(as_positions: bool):
    def fn(df: pd.DataFrame) -> pd.DataFrame:
        bad = (df["x"] % 7 == 0).to_numpy()
        if bad.any():
            raise xorack.FailRecord("sevens", rows=bad.nonzero()[0] if as_positions else bad)
        return df

    return fn


@pytest.mark.parametrize("as_positions", [False, True])
def test_fail_record_rows_fail_those_rows_and_rerun_the_others_once(as_positions):
    from xorack.spark.stages import call_bisecting

    pdf = pd.DataFrame({"x": range(1, 1001)})
    fn, calls = _counting(_fail_multiples_of_7(as_positions))
    outs, failed = call_bisecting(fn, pdf, "s")
    assert calls == [1000, 1000 - 142]  # no bisection: the batch, then the rest once
    assert [r for _, r in failed] == ["sevens"]
    assert (pdf["x"].to_numpy()[failed[0][0]] % 7 == 0).all()
    assert len(failed[0][0]) == 142
    assert sorted(pd.concat(outs)["x"]) == [x for x in range(1, 1001) if x % 7]


def test_fail_record_rows_are_positions_in_the_frame_the_function_got():
    from xorack.spark.stages import call_bisecting

    def fn(df: pd.DataFrame) -> pd.DataFrame:
        if (df["x"] == 500).any():
            raise ValueError("plain: bisected")  # the rows around 500 are called in halves
        if (df["x"] % 100 == 1).any():
            raise xorack.FailRecord(
                "ones", rows=[int(i) for i in (df["x"] % 100 == 1).to_numpy().nonzero()[0]]
            )
        return df

    pdf = pd.DataFrame({"x": range(1000)})
    outs, failed = call_bisecting(fn, pdf, "s")
    got: dict[str, list[int]] = {}
    for p, r in failed:  # one entry per call that failed rows
        got[r] = sorted(got.get(r, []) + pdf["x"].to_numpy()[p].tolist())
    assert sorted(got) == ["ValueError: plain: bisected", "ones"]
    assert got["ValueError: plain: bisected"] == [500]
    assert got["ones"] == list(range(1, 1000, 100))
    kept = sorted(pd.concat(outs)["x"])
    assert kept == [x for x in range(1000) if x != 500 and x % 100 != 1]


def test_plain_exceptions_are_still_bisected():
    from xorack.spark.stages import call_bisecting

    def fn(df: pd.DataFrame) -> pd.DataFrame:
        if (df["x"] % 100 == 7).any():
            raise xorack.FailRecord("no rows given")
        return df

    fn, calls = _counting(fn)
    pdf = pd.DataFrame({"x": range(1000)})
    outs, failed = call_bisecting(fn, pdf, "s")
    assert sorted(int(p[0]) for p, _ in failed) == list(range(7, 1000, 100))
    assert all(len(p) == 1 for p, _ in failed)
    assert len(calls) > 2 * 10  # halves down to single rows
    assert len(pd.concat(outs)) == 990


def test_grouped_stages_fail_the_whole_group_even_with_rows():
    from xorack.spark.stages import call_bisecting

    outs, failed = call_bisecting(
        _fail_multiples_of_7(False), pd.DataFrame({"x": range(1, 15)}), "g", bisect=False
    )
    assert outs == []
    assert [p.tolist() for p, _ in failed] == [list(range(14))]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([True, False], "is a boolean mask of length 2"),
        ([0, 10], r"has position\(s\) outside \[0, 10\)"),
        ([-1], r"has position\(s\) outside"),
        ([0.5], "has dtype float64"),
        (pd.Index([1, 2]), "got a pandas Index"),
        ([False] * 10, "selects no row"),
        ([], "selects no row"),
        ([[0], [1]], "must be one-dimensional"),
        ("abc", "must be one-dimensional|has dtype"),
        (pd.Series([1, None, 3], dtype="Int64"), "is not a usable array"),
    ],
)
def test_bad_fail_record_rows_are_a_clear_error_naming_the_stage(rows, message):
    from xorack.spark.stages import StageSchemaError, call_bisecting

    def fn(df: pd.DataFrame) -> pd.DataFrame:
        raise xorack.FailRecord("bad", rows=rows)

    with pytest.raises(
        StageSchemaError, match=rf"stage 'my-stage': FailRecord\(rows=\.\.\.\) ({message})"
    ):
        call_bisecting(fn, pd.DataFrame({"x": range(10)}), "my-stage")


def test_fail_record_rows_accept_nullable_masks_and_series():
    from xorack.spark.stages import _failing_positions

    mask = pd.Series([True, None, False, True], dtype="boolean")  # NA: not failing
    assert _failing_positions(mask, 4, "s").tolist() == [0, 3]
    assert _failing_positions(pd.Series([3, 1, 3]), 4, "s").tolist() == [1, 3]
    assert _failing_positions(pd.array([2], dtype="Int64"), 4, "s").tolist() == [2]


def test_fail_record_keeps_rows_when_pickled():
    import pickle

    e = pickle.loads(pickle.dumps(xorack.FailRecord("why", rows=[1, 2])))
    assert (str(e), e.rows) == ("why", [1, 2])
    assert xorack.FailRecord("why").rows is None


def test_union_with_itself_or_another_pipeline_is_a_clear_error(spark):
    p = Pipeline(spark)
    src = p.source(spark.createDataFrame([("a",)], "line string"), name="lines")
    with pytest.raises(StageSchemaError, match="cannot be unioned with itself"):
        src.union(src)
    other = Pipeline(spark).source(spark.createDataFrame([("b",)], "line string"), name="x")
    with pytest.raises(StageSchemaError, match="same Pipeline"):
        src.union(other)


def test_a_name_used_twice_is_an_error_and_default_names_are_made_unique(spark):
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    scored = lines.map_in_pandas(_split, "id long, word string", name="scored")
    with pytest.raises(StageSchemaError, match="'scored' is already used"):
        scored.sink(SQLiteSink("/nonexistent/never-opened.db", "t"), name="scored")
    with pytest.raises(StageSchemaError, match="'lines' is already used"):
        p.source(_lines(spark), name="lines")
    a = scored.map_in_pandas(_no_w0, "id long, word string")
    b = scored.map_in_pandas(_no_w0, "id long, word string")
    assert a._node.name == "_no_w0"
    assert b._node.name == "_no_w0_2"


def _flaky_word(pdf: pd.DataFrame) -> pd.DataFrame:
    """Words w3 fail on their first attempt (transient)."""
    bad = (pdf["word"] == "w3") & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("transient", rows=bad.to_numpy())
    return pdf


def test_two_concurrent_jobs_on_one_standalone_acker_keep_their_own_records(spark, tmp_path):
    """Issue 11, defect 1: every run is a job of its own on a shared acker (sources, rounds,
    replays, dead letters, stats), so two pipelines running at once (threads of one Spark
    application, both with failures) and a third one after them each get exact results and a
    report of their own records only."""
    import threading

    from xorack import FTLayer
    from xorack.service import AckerService

    svc = AckerService(None, ft_factory=lambda job: FTLayer(max_attempts=3)).start()
    results: dict[str, object] = {}

    def run(tag: str, n: int) -> None:
        try:
            sink = SQLiteSink(str(tmp_path / f"{tag}.db"), "words")
            p = Pipeline(spark, service=svc.location)
            src = p.source(_lines(spark, n), name="lines", keys=["id"], partitions=2)
            words = src.map_in_pandas(_split, "id long, word string", name="split")
            words.map_in_pandas(_flaky_word, "id long, word string", name="flaky").sink(sink)
            results[tag] = (p.run(), _counts(sink))
        except BaseException as exc:  # reported by the assertions below
            results[tag] = exc

    try:
        threads = [threading.Thread(target=run, args=(t, n)) for t, n in (("a", 60), ("b", 90))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        run("c", 100)  # after them, on the same acker
    finally:
        svc.shutdown()
    for tag, n in (("a", 60), ("b", 90), ("c", 100)):
        assert not isinstance(results[tag], BaseException), results[tag]
        report, counts = results[tag]
        assert report.source_records == n  # its own records only
        assert report.completed == n
        assert report.lost == 0
        assert report.failed > 0  # the transient failures were its own, and replayed
        expected = Counter()
        for i in range(n):
            expected.update(w for w in (f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4)))
        assert counts == expected
