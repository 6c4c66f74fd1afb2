"""Kept rounds (:mod:`xorack.spark.kept`), on real local Spark: an optimistic round whose stage
fails a few source rows keeps what it computed for the others and replays the failed records
alone, in rounds of their own, merged into its outputs. Plain Spark over the same input (minus
the dead-lettered records) is the oracle; a shape that cannot merge falls back as before."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, Reason, current_round
from xorack.spark import kept as kept_mod

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 1200
BAD = 97  # rows whose id % BAD == 5 fail (13 of N)


def _lines(spark):
    rows = [(i, f"w{i % 7} w{i % 11} x{i % 5}", i % 4) for i in range(N)]
    return spark.createDataFrame(rows, "id long, text string, k int").repartition(3)


def _orders(spark):
    rows = [(k, f"pri{k % 3}") for k in range(4)]
    return spark.createDataFrame(rows, "k int, priority string").repartition(2)


def _bad(ids):
    return pa.array(ids.to_numpy(zero_copy_only=False) % BAD == 5)


def _failing(rounds: int):
    """A ``map_in_arrow`` function failing the rows with ``id % 97 == 5`` in its first
    ``rounds`` rounds (a large number: always)."""

    def fn(batch):
        if current_round() < rounds:
            mask = _bad(batch.column("id"))
            if pc.any(mask).as_py():
                raise xorack.FailRecord("injected", rows=mask)
        return batch

    return fn


def _failing_pandas(pdf):
    bad = (pdf["id"] % BAD == 5) & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad.to_numpy())
    return pdf


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _wordcount(frame):
    words = frame.select(F.explode(F.split("text", " ")).alias("word"))
    return words.groupBy("word").agg(
        F.count(F.lit(1)).alias("n"), F.max(F.length("word")).alias("m")
    )


def _good(spark):
    return _lines(spark).where(F.col("id") % BAD != 5)


def _failing_ids() -> list[int]:
    return [i for i in range(N) if i % BAD == 5]


def _run_wordcount(spark, tmp_path, fn, **options):
    p = Pipeline(spark, **options)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(fn, lines.schema, name="flaky")
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(staged).sink(sink, name="counts")
    return p, sink


def test_rows_failing_once_are_replayed_alone_and_the_round_kept(spark, tmp_path):
    p, sink = _run_wordcount(spark, tmp_path, _failing(1))
    assert "rows the stage 'flaky' fails are replayed alone" in p.explain()
    report = p.run()
    failed = len(_failing_ids())
    assert report.optimistic_rounds == 1, report.optimistic_fallbacks
    assert report.phase_reasons == {}
    assert report.kept_rounds == 1
    assert report.kept_records == failed
    assert report.failed == report.replayed == failed
    assert report.source_records == report.completed == N
    assert report.lost == report.dead_lettered == 0
    assert report.rounds == 2
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_poison_rows_are_dead_lettered_alone_with_their_error(spark, tmp_path):
    p, sink = _run_wordcount(spark, tmp_path, _failing(1000), max_attempts=3)
    report = p.run()
    bad = _failing_ids()
    assert report.phase_reasons == {}, report.optimistic_fallbacks
    assert report.kept_rounds == 2  # attempts 2 and 3
    assert report.dead_lettered == len(bad)
    assert report.completed == N - len(bad)
    assert report.source_records == N
    assert report.failed == 3 * len(bad)
    assert report.lost == 0
    dead = p.dead_letters()
    assert sorted(dead.column("id").to_pylist()) == bad
    assert set(dead.column("_ft_reason").to_pylist()) == {"stage flaky: injected"}
    assert set(dead.column("_ft_attempts").to_pylist()) == {3}
    texts = dict(zip(dead.column("id").to_pylist(), dead.column("text").to_pylist(), strict=True))
    assert texts[5] == "w5 w5 x0"
    assert _rows(sink.read(spark)) == _rows(_wordcount(_good(spark)))


def test_a_join_and_an_aggregate_fused_keep_their_round(spark, tmp_path):
    """A pandas stage on the source, a tracked join, a sum and a count by key: the first
    round (the join's phase and the aggregate's, one Spark job) keeps its work; the replay
    round joins the failed rows with every order again, and its groups merge by key."""

    def build(p):
        lines = p.source(_lines(spark), name="lines")
        lines = lines.map_in_pandas(_failing_pandas, lines.schema, name="flaky")
        orders = p.source(_orders(spark), name="orders")
        joined = lines.join(orders, "k", "inner")
        return joined.groupBy("priority").agg(
            F.sum("id").alias("total"), F.count(F.lit(1)).alias("n"), F.min("id").alias("lo")
        )

    p = Pipeline(spark)
    sink = ParquetSink(str(tmp_path / "out"))
    build(p).sink(sink, name="totals")
    assert "replayed alone" in p.explain()
    report = p.run()
    assert report.phase_reasons == {}, report.optimistic_fallbacks
    assert report.fused_phases == 1
    assert report.kept_rounds == 1
    assert report.kept_records == len(_failing_ids())
    assert report.lost == report.dead_lettered == 0
    plain = (
        _lines(spark)
        .join(_orders(spark), "k", "inner")
        .groupBy("priority")
        .agg(F.sum("id").alias("total"), F.count(F.lit(1)).alias("n"), F.min("id").alias("lo"))
    )
    assert _rows(sink.read(spark)) == _rows(plain)


def test_rows_written_straight_to_a_sink_are_added(spark, tmp_path):
    """No aggregate: the replay round's rows are moved into the first round's output."""
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(1), lines.schema, name="flaky")
    sink = ParquetSink(str(tmp_path / "out"))
    staged.where(F.col("k") != 3).withColumn("len", F.length("text")).sink(sink, name="rows")
    report = p.run()
    assert report.kept_rounds == 1, report.optimistic_fallbacks
    assert report.sink_rows["rows"] == N - N // 4
    plain = _lines(spark).where(F.col("k") != 3).withColumn("len", F.length("text"))
    assert _rows(sink.read(spark)) == _rows(plain)


@pytest.mark.parametrize("premerge", [True, False])
def test_replay_rounds_write_the_aggregate_merged_in_their_own_job(
    spark, tmp_path, monkeypatch, premerge
):
    """Each replay round writes the aggregate merged with the rows before it (the first
    round's, then the previous replay round's), and the keeper only moves the last one in
    place: no merge job of its own. Two replay rounds (rows failing twice), the sink's row
    count and rows equal to plain Spark's, either way (``PREMERGE`` off: the keeper's merge
    job, as before)."""
    monkeypatch.setattr(kept_mod, "PREMERGE", premerge)
    merges, premerged = [], []
    own_merge, chained = kept_mod.Keeper._merge_groups, kept_mod.premerge

    def merge_groups(self, job, extra):
        merges.append(job.name)
        return own_merge(self, job, extra)

    def premerge_(spark_, outputs, merge):
        premerged.append(dict(merge))
        return chained(spark_, outputs, merge)

    monkeypatch.setattr(kept_mod.Keeper, "_merge_groups", merge_groups)
    monkeypatch.setattr(kept_mod, "premerge", premerge_)
    p, sink = _run_wordcount(spark, tmp_path, _failing(2), max_attempts=4)
    report = p.run()
    assert report.phase_reasons == {}, report.optimistic_fallbacks
    assert report.kept_rounds == 2
    assert report.failed == report.replayed == 2 * len(_failing_ids())
    assert report.lost == report.dead_lettered == 0
    plain = _rows(_wordcount(_lines(spark)))
    assert _rows(sink.read(spark)) == plain
    assert report.sink_rows["counts"] == len(plain)
    if premerge:  # the second replay round merges into the first replay round's output
        assert merges == []
        assert [list(m) for m in premerged] == [["aggregate"], ["aggregate"]]
        first, second = (m["aggregate"] for m in premerged)
        assert first.endswith("optimistic")
        assert second == first + "-replay1"
    else:
        assert merges == ["aggregate"]
        assert premerged == []


@pytest.mark.parametrize(
    ("api", "optimistic"), [("arrow", True), ("arrow", False), ("pandas", True)]
)
def test_a_fail_record_handing_over_its_output_is_called_once_per_batch(
    spark, tmp_path, api, optimistic
):
    """``FailRecord(rows=..., output=...)`` with the whole batch as its output (the failing
    rows' included): the function is called once per batch, the failing rows' outputs are
    dropped (in a kept round they are not failed there, only kept: nothing else would drop
    them), their records replayed, and the counts equal plain Spark's."""
    sc = spark.sparkContext
    rows_seen = sc.accumulator(0)

    def fn(batch):
        if current_round() == 0:
            rows_seen.add(batch.num_rows)
            mask = _bad(batch.column("id"))
            if pc.any(mask).as_py():
                raise xorack.FailRecord("injected", rows=mask, output=batch)
        return batch

    def fn_pandas(pdf):
        if current_round() == 0:
            rows_seen.add(len(pdf))
            mask = (pdf["id"] % BAD == 5).to_numpy()
            if mask.any():
                raise xorack.FailRecord("injected", rows=mask, output=pdf)
        return pdf

    if api == "arrow":
        p, sink = _run_wordcount(spark, tmp_path, fn, optimistic=optimistic)
    else:
        p = Pipeline(spark, optimistic=optimistic)
        lines = p.source(_lines(spark), name="lines")
        staged = lines.map_in_pandas(fn_pandas, lines.schema, name="flaky")
        sink = ParquetSink(str(tmp_path / "out"))
        _wordcount(staged).sink(sink, name="counts")
    report = p.run()
    assert rows_seen.value == N  # each row once in round 0: no second call on the rest
    assert report.kept_rounds == (1 if optimistic else 0), report.optimistic_fallbacks
    assert report.failed == len(_failing_ids())
    if optimistic:  # tracked rounds replay the failed records' chunks (collateral replays)
        assert report.replayed == len(_failing_ids())
    assert report.lost == report.dead_lettered == 0
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_a_global_aggregate_merges_its_one_row(spark, tmp_path):
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(1), lines.schema, name="flaky")
    sink = ParquetSink(str(tmp_path / "out"))
    staged.groupBy().agg(F.sum("id").alias("s"), F.count(F.lit(1)).alias("n")).sink(sink, name="g")
    report = p.run()
    assert report.kept_rounds == 1, report.optimistic_fallbacks
    assert _rows(sink.read(spark)) == Counter({(N * (N - 1) // 2, N): 1})


def test_an_average_cannot_merge_so_the_round_falls_back_as_before(spark, tmp_path):
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(1), lines.schema, name="flaky")
    sink = ParquetSink(str(tmp_path / "out"))
    staged.groupBy("k").agg(F.avg("id").alias("a")).sink(sink, name="avg")
    assert "replayed alone" not in p.explain()
    report = p.run()
    assert report.kept_rounds == 0
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert report.lost == 0
    plain = _lines(spark).groupBy("k").agg(F.avg("id").alias("a"))
    assert _rows(sink.read(spark)) == _rows(plain)


def _fails_in_replay(at: int):
    """A second stage: fails a row while replay round ``at`` runs, never in round 0."""

    def fn(pdf):
        bad = (pdf["id"] == 5) & (current_round() == at)
        if bad.any():
            raise xorack.FailRecord("only on replay", rows=bad.to_numpy())
        return pdf

    return fn


@pytest.mark.parametrize("at", [1, 2])
def test_a_replay_round_that_falls_back_sends_the_phase_to_tracked_rounds(spark, tmp_path, at):
    """The replay round fails a row in a stage that does not keep (it reads no source): the
    keeping is abandoned, the first round's outputs deleted, and the phase runs tracked rounds,
    exactly. ``at`` 2: the first replay round kept rows again and wrote its merged aggregate;
    the second falls back, and that output goes too."""
    p = Pipeline(spark, max_attempts=4)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(at), lines.schema, name="flaky")
    staged = staged.map_in_pandas(_fails_in_replay(at), staged.schema, name="second")
    sink = ParquetSink(str(tmp_path / "out"))
    _wordcount(staged).sink(sink, name="counts")
    report = p.run()
    assert report.kept_rounds == at
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert "their replay round fell back" in report.optimistic_fallbacks[0]
    assert report.lost == report.dead_lettered == 0
    assert report.source_records == report.completed == N
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_a_stage_failing_too_many_rows_loses_the_round_at_once(spark, tmp_path, monkeypatch):
    """Beyond the share a round keeps (a bug rather than bad records), the round is cancelled
    at the first batch over it, as before."""
    monkeypatch.setattr(kept_mod, "SHARE", 0.001)
    monkeypatch.setattr(kept_mod, "SLACK", 0)
    p, sink = _run_wordcount(spark, tmp_path, _failing(1))
    report = p.run()
    assert report.kept_rounds == 0
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert "the round was cancelled" in report.optimistic_fallbacks[0]
    assert report.lost == 0
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_kept_rows_the_driver_cannot_read_send_the_phase_back(spark, tmp_path, monkeypatch):
    """Should the executors' files not reach the driver (a cluster without a shared work
    directory), the count of kept rows does not match and the phase falls back: nothing is
    lost."""
    monkeypatch.setattr(kept_mod, "_read_kept", lambda path, dead: None)
    p, sink = _run_wordcount(spark, tmp_path, _failing(1))
    report = p.run()
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert "the driver read 0 of them" in report.optimistic_fallbacks[0]
    assert report.lost == 0
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_keep_off_falls_back_as_before(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(kept_mod, "KEEP", False)
    p, sink = _run_wordcount(spark, tmp_path, _failing(1))
    assert "replayed alone" not in p.explain()
    report = p.run()
    assert report.kept_rounds == 0
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


@pytest.mark.parametrize(
    "shape",
    ["other_sink", "union_other", "right_join", "stage_on_derived", "stage_on_other"],
)
def test_shapes_a_replay_could_not_merge_are_not_kept(spark, tmp_path, shape):
    """Outputs the failed records' rows do not reach (a replay would write them again), a
    union with another source's rows, the source on the right of a left join, a Python stage
    on the other side of a join (a replay round would run it again): no keeping."""
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(1), lines.schema, name="flaky")
    other = p.source(_lines(spark), name="other")
    if shape == "other_sink":
        staged.sink(ParquetSink(str(tmp_path / "a")), name="a")
        other.sink(ParquetSink(str(tmp_path / "b")), name="b")
    elif shape == "union_other":
        staged.union(other).sink(ParquetSink(str(tmp_path / "a")), name="a")
    elif shape == "right_join":
        other.select("id").join(staged, "id", "left").sink(
            ParquetSink(str(tmp_path / "a")), name="a"
        )
    elif shape == "stage_on_other":  # a replay round would run it again, as round 1
        other = other.map_in_arrow(lambda b: b, other.schema, name="other-stage")
        staged.join(other.select("id", F.col("k").alias("k2")), "id", "inner").sink(
            ParquetSink(str(tmp_path / "a")), name="a"
        )
    else:  # the stage reads no source: its rows are not records
        counted = other.groupBy("k").agg(F.count(F.lit(1)).alias("n"))
        counted.map_in_arrow(lambda b: b, counted.schema, name="after").sink(
            ParquetSink(str(tmp_path / "a")), name="a"
        )
        staged.sink(ParquetSink(str(tmp_path / "b")), name="b")
    assert "replayed alone" not in p.explain()


def test_round_xor_keeps_within_its_share():
    """A task keeps failed rows while they stay within the share of its rows (and the slack);
    beyond, and for another stage, it does not."""
    from xorack.spark.optimistic import RoundToken, RoundXor

    class Acc:
        value = 0

        def add(self, v):
            self.value += v

    schema = pa.schema([("id", pa.int64()), ("_ft_src", pa.int64())])
    token = RoundToken(Acc(), None, kept_mod.KeptRows("s", "/nonexistent", schema, Acc(), 0.1))
    r = RoundXor(token)
    rows = pa.table({"id": np.arange(10), "_ft_src": np.zeros(10, np.int64)})
    r.saw(1000)
    assert r.keep("s", rows, ["x"] * 10)
    assert not r.keep("t", rows, ["x"] * 10)
    assert r.keep("s", rows.slice(0, 6), ["x"] * 6)  # 16: the slack
    assert r.keep("s", rows, ["x"] * 10)  # 26 of 1000: within 10 %
    big = pa.table({"id": np.arange(80), "_ft_src": np.zeros(80, np.int64)})
    assert not r.keep("s", big, ["x"] * 80)  # 106 > 100
    assert token.kept.count.value == 26


from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _fails_by_round(modulus: int, residue: int, rounds: dict[int, int]):
    """Fails the rows with ``id % modulus == residue`` while ``current_round()`` is below the
    number of rounds ``rounds`` gives their ``id % 3`` (0: never fails)."""

    def fn(batch):
        ids = batch.column("id").to_numpy(zero_copy_only=False)
        limit = np.asarray([rounds[i % 3] for i in ids], dtype=np.int64)
        mask = (ids % modulus == residue) & (current_round() < limit)
        if mask.any():
            raise xorack.FailRecord("random", rows=pa.array(mask))
        return batch

    return fn


def _shape(frame, orders, shape: str):
    if shape == "rows":
        return frame.where(F.col("k") != 1).withColumn("t", F.upper("text"))
    if shape == "join":
        joined = frame.join(orders, "k", "inner")
        return joined.groupBy("priority").agg(F.sum("id").alias("s"), F.max("text").alias("m"))
    return _wordcount(frame)


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # a Spark run per example: no shrinking
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    modulus=st.integers(20, 200),
    residue=st.integers(0, 19),
    rounds=st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)),
    attempts=st.integers(1, 4),
    shape=st.sampled_from(["rows", "join", "wordcount"]),
)
@example(modulus=50, residue=3, rounds=(1, 2, 4), attempts=3, shape="join")
@example(modulus=30, residue=7, rounds=(0, 4, 1), attempts=1, shape="wordcount")
def test_random_failures_keep_their_rounds_and_equal_plain_spark_minus_dead_letters(
    spark, tmp_path_factory, modulus, residue, rounds, attempts, shape
):
    """Rows failing for a random number of rounds (0 to 4, by id), a random ``max_attempts``:
    the records failing ``max_attempts`` times are dead-lettered, the others completed, and the
    sink equals plain Spark's over the input without the dead-lettered records."""
    tmp = tmp_path_factory.mktemp("kept")
    limits = dict(enumerate(rounds))
    p = Pipeline(spark, max_attempts=attempts)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_fails_by_round(modulus, residue, limits), lines.schema, name="f")
    sink = ParquetSink(str(tmp / "out"))
    orders = p.source(_orders(spark), name="orders") if shape == "join" else None
    _shape(staged, orders, shape).sink(sink, name="out")
    report = p.run()
    failing = [i for i in range(N) if i % modulus == residue and limits[i % 3] > 0]
    dead = sorted(i for i in failing if limits[i % 3] >= attempts)
    assert report.phase_reasons == {}, report.optimistic_fallbacks
    assert report.kept_records == len(failing)
    assert report.lost == 0
    assert report.dead_lettered == len(dead)
    letters = p.dead_letters()
    assert (sorted(letters.column("id").to_pylist()) if letters.num_rows else []) == dead
    assert report.failed == sum(min(limits[i % 3], attempts) for i in failing)
    kept = _lines(spark).where(~F.col("id").isin(dead)) if dead else _lines(spark)
    assert _rows(sink.read(spark)) == _rows(_shape(kept, _orders(spark), shape))


def test_a_join_that_computes_the_stage_twice_runs_tracked_rounds(spark, tmp_path):
    """A non-equi join without a broadcast is a cartesian product: Spark computes each
    partition of the stage's side once per partition of the other side, so its kept rows would
    be copies (and its counts the records' again). The round is not built: the phase runs
    tracked rounds, exactly. (Should it run, the keeper's count of the source sends it back:
    the stage would have seen more rows than the source holds.)"""
    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    staged = lines.map_in_arrow(_failing(1), lines.schema, name="flaky")
    orders = p.source(_orders(spark).withColumnRenamed("k", "ok"), name="orders")
    joined = staged.join(orders, staged["k"] < orders["ok"], "inner")
    sink = ParquetSink(str(tmp_path / "out"))
    joined.groupBy("priority").agg(F.count(F.lit(1)).alias("n")).sink(sink, name="n")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        report = p.run()
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
    assert report.phase_reasons == {0: Reason.CARTESIAN}, report.optimistic_fallbacks
    assert report.source_records == report.completed == N + 4
    assert report.lost == 0
    lo, od = _lines(spark), _orders(spark).withColumnRenamed("k", "ok")
    plain = (
        lo.join(od, lo["k"] < od["ok"], "inner")
        .groupBy("priority")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    assert _rows(sink.read(spark)) == _rows(plain)


def test_a_stage_that_saw_other_than_the_sources_rows_sends_the_phase_back(
    spark, tmp_path, monkeypatch
):
    """The keeper counts the source in a job of its own: when the count differs from the rows
    the stage saw (a plan that computed the stage's input twice), nothing is replayed alone
    and the phase runs tracked rounds, exactly."""
    own = kept_mod.Keeper._replay

    def replay(self, report, expected):
        counted = self.ctx.source_input
        self.ctx.source_input = lambda s: counted(s).union(counted(s).limit(1))
        try:
            return own(self, report, expected)
        finally:
            del self.ctx.source_input

    monkeypatch.setattr(kept_mod.Keeper, "_replay", replay)
    p, sink = _run_wordcount(spark, tmp_path, _failing(1))
    report = p.run()
    assert report.phase_reasons == {0: Reason.ROW_FAILED}
    assert f"the stage saw {N} rows of {N + 1} records" in report.optimistic_fallbacks[0]
    assert report.lost == report.dead_lettered == 0
    assert report.source_records == report.completed == N
    assert _rows(sink.read(spark)) == _rows(_wordcount(_lines(spark)))


def test_a_small_input_failing_whole_is_not_kept_and_the_runaway_guard_stops_it(spark, tmp_path):
    """Every row of a task failing is a bug's sign, not a few bad records: the round is lost
    and the tracked rounds' runaway guard stops the run (as without keeping)."""
    from xorack.spark import RunawayFailure

    def broken(batch):
        raise KeyError("vlaue")

    p = Pipeline(spark)
    small = spark.createDataFrame([(i, "x", 0) for i in range(8)], "id long, text string, k int")
    lines = p.source(small.coalesce(1), name="lines")
    staged = lines.map_in_arrow(broken, lines.schema, name="typo")
    staged.sink(ParquetSink(str(tmp_path / "out")), name="rows")
    with pytest.raises(RunawayFailure):
        p.run()
