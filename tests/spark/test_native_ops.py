"""Tracked native operations, lookup and tracked joins, exactly-once aggregations — on real local
Spark, compared with plain Spark running the same operations on the input minus the
dead-lettered source records. Failures are injected by tracked pandas stages: transient ones
(first attempt only), poison records (every attempt), and failures after an aggregation."""

from __future__ import annotations

import glob
import os
import sys
from collections import Counter
from dataclasses import dataclass

import pandas as pd
import pytest

import xorack
from xorack.spark import Pipeline, SQLiteSink, current_round
from xorack.spark.guard import RunawayFailure
from xorack.spark.ops import TrackedOperationError
from xorack.spark.sinks import ParquetSink

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PYSPARK_DIR = os.path.dirname(__import__("pyspark").__file__)


def _rows(df) -> Counter:
    """A DataFrame's rows as a multiset (floats rounded: sums may add in another order)."""

    def norm(v):
        return round(v, 9) if isinstance(v, float) else v

    return Counter(tuple(norm(v) for v in r) for r in df.collect())


def _pd_rows(pdf: pd.DataFrame, cols) -> Counter:
    return Counter(tuple(r) for r in pdf[list(cols)].itertuples(index=False, name=None))


# ---- failure injection (tracked pandas stages) ---------------------------------------------


def _flaky_ids(pdf: pd.DataFrame) -> pd.DataFrame:
    """ids % 5 == 1 fail on their first attempt; ids % 23 == 0 on every attempt (poison). FT
    on only: the reference pipeline (FT off, poison removed from its input) runs it too."""
    if "_ft_src" not in pdf.columns:
        return pdf
    bad = (pdf["id"] % 23 == 0) | ((pdf["id"] % 5 == 1) & (current_round() == 0))
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad.to_numpy())
    return pdf


POISON = frozenset(i for i in range(200) if i % 23 == 0)


def _events(spark, n: int = 200):
    rows = [
        (i, " ".join(f"w{(i * 7 + j) % 11}" for j in range(i % 5)), i % 7, float(i) / 4)
        for i in range(n)
    ]
    return spark.createDataFrame(rows, "id long, line string, k int, x double").repartition(3)


def _lookup(spark):
    # duplicate keys (k = 1 twice), a key with no tracked match (k = 9), no row for k = 0
    rows = [(1, "one"), (1, "uno"), (2, "two"), (3, "three"), (4, "four"), (5, "five"), (9, "x")]
    return spark.createDataFrame(rows, "k int, label string")


def _run_both(spark, tmp_path, build, exclude=POISON, require_rows=True, combine=True, lossy=False):
    """Run ``build(p, src)`` with FT on (failures injected) and compare each sink with plain
    Spark on the input minus the dead-lettered ids (the same ``build`` over a plain source).
    ``lossy``: rows are lost on purpose (they time out or taint their chunk)."""
    p = Pipeline(spark, combine=combine)
    src = p.source(_events(spark), name="events")
    flaky = src.map_in_pandas(_flaky_ids, src.schema, name="flaky")
    out = build(flaky)
    sink = ParquetSink(str(tmp_path / "out"))
    out.sink(sink, name="out")
    report = p.run()
    assert report.lost == 0
    assert report.source_records == 200
    assert report.dead_lettered == len(exclude)
    assert report.completed == 200 - len(exclude)
    if not lossy:
        assert report.timed_out == 0, "rows removed on purpose must be acked, never timed out"

    plain = Pipeline(spark, ft=False)
    kept = _events(spark).where(~F.col("id").isin(sorted(exclude)))
    build(plain.source(kept, name="events")).sink(ParquetSink(str(tmp_path / "plain")), "out")
    plain.run()
    got, want = _rows(sink.read(spark)), _rows(spark.read.parquet(str(tmp_path / "plain")))
    assert got == want
    assert report.sink_rows["out"] == sum(got.values())  # counted while written
    assert sum(want.values()) > 0 or not require_rows
    return report


# ---- each operation, with failures before it ------------------------------------------------


def test_filter_select_withcolumn_drop_rename(spark, tmp_path):
    def build(t):
        t = t.filter(F.col("k") != 3).where("x < 40")
        t = t.withColumn("y", F.col("x") * 2).withColumns({"z": F.lit(1), "k2": F.col("k") + 1})
        return t.select("id", "y", "k2", "line").drop("line").withColumnRenamed("k2", "kk")

    _run_both(spark, tmp_path, build)


@pytest.mark.parametrize(
    "gen",
    [
        lambda t: t.select("id", F.explode(F.split("line", " ")).alias("word")),
        lambda t: t.withColumn("word", F.explode_outer(F.split(F.col("line"), " "))),
        lambda t: t.select(F.posexplode(F.split("line", " ")).alias("p", "w"), "id"),
        lambda t: t.select(
            "id",
            F.inline(F.array(F.struct(F.col("k").alias("a")), F.struct(F.lit(0).alias("a")))),
        ),
        lambda t: t.select("id", F.explode(F.create_map(F.col("k"), F.col("x"))).alias("a", "b")),
    ],
    ids=["explode", "explode_outer", "posexplode", "inline", "explode_map"],
)
def test_generators(spark, tmp_path, gen):
    # lines with no words make empty arrays after the filter below: acked, not timed out
    def build(t):
        words = gen(t.withColumn("line", F.when(F.col("id") % 3 == 0, None).otherwise("line")))
        return words

    _run_both(spark, tmp_path, build)


@pytest.mark.parametrize("how", ["inner", "left", "left_semi", "left_anti"])
def test_lookup_joins(spark, tmp_path, how):
    lookup = _lookup(spark)

    def build(t):
        return t.select("id", "k").join(F.broadcast(lookup) if how == "inner" else lookup, "k", how)

    _run_both(spark, tmp_path, build)


def _word_aggregate(t, last):
    """Words per (k, word) with every combining function, then ``last``."""
    words = t.select("id", "k", "x", F.explode(F.split("line", " ")).alias("word"))
    return words.groupBy("k", "word").agg(
        F.count("*").alias("n"),
        F.count("x").alias("nx"),
        F.sum("id").alias("s"),
        F.min("x").alias("lo"),
        F.max("id").alias("hi"),
        F.avg("x").alias("mean"),
        last,
    )


def test_aggregate_after_failures_counts_every_record_once(spark, tmp_path):
    def build(t):  # a holistic function among them: rows are staged, not partial aggregates
        return _word_aggregate(t, F.percentile_approx("id", 0.5).alias("median"))

    report = _run_both(spark, tmp_path, build)
    assert report.derived_records == 0  # read only by a native sink: written as computed


def _combining_aggregate(t):
    return _word_aggregate(t, F.mean("id"))  # unaliased: Spark's own name for it


@pytest.mark.parametrize("events", ["driver", "spark"])
@pytest.mark.parametrize("combine", [True, False])
def test_combined_aggregate_equals_plain_spark_under_failures(
    spark, tmp_path, monkeypatch, combine, events
):
    """Partial aggregates per chunk (combine=True) or staged rows: the same exact result. With
    failures in the first round every chunk holding a failed record is tainted: its other
    records come back as collateral replays (no attempt used up, so nothing more is
    dead-lettered than with staged rows). The staged events are reduced by the driver (few
    rows, local staging) or, above ``DRIVER_EVENT_ROWS``, sent by a Spark job."""
    from xorack.spark import barrier

    read = barrier._local_events
    used = []

    def spy(*args):
        out = read(*args)
        used.append("spark" if out is None else "driver" if len(out[0]) else "none staged")
        return out

    monkeypatch.setattr(barrier, "_local_events", spy)
    if events == "spark":
        monkeypatch.setattr(barrier, "DRIVER_EVENT_ROWS", 0)
    report = _run_both(spark, tmp_path, _combining_aggregate, combine=combine)
    assert events in used
    assert set(used) <= {events, "none staged"}
    if combine:
        assert report.collateral_replays > 0
    else:
        assert report.collateral_replays == 0


def _dies_once(marker: str):
    """A stage whose Python worker (partition 0) dies on the first attempt of round 0, after
    creating ``marker``: Spark retries the whole task, tagger included, so the task's source
    rows are persisted a second time."""

    def stage(pdf: pd.DataFrame) -> pd.DataFrame:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        first = current_round() == 0 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        if first and "_ft_src" in pdf.columns:
            open(marker, "w").close()
            os._exit(13)
        return pdf

    return stage


@pytest.mark.parametrize("combine", [True, False])
def test_a_retried_source_task_counts_each_record_once_in_an_aggregate(spark, tmp_path, combine):
    """The retried task persists its rows again, under the source ids its dead attempt used
    (derived from the rows): the acker keeps one record each, the retried task's rows ack it.
    (With a second copy per record, the dead attempt's copies timed out and were replayed
    while the retried task's completed: the aggregate counted those records twice.) Tracked
    rounds only: an optimistic round counts a retried task once without persisting anything
    (tests/spark/test_task_accounting.py)."""
    p = Pipeline(spark, combine=combine, optimistic=False)
    src = p.source(_events(spark), name="events")
    marker = tmp_path / "died"
    dying = src.map_in_pandas(_dies_once(str(marker)), src.schema, name="die")
    sink = ParquetSink(str(tmp_path / "out"))
    _combining_aggregate(dying).sink(sink, name="out")
    report = p.run()
    assert marker.exists(), "the worker did not die: nothing was retried"
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.source_records == report.completed == 200
    assert report.repeats > 0  # the retried task's rows, kept once
    assert report.timed_out == 0  # nothing was left waiting for the dead attempt's rows
    assert _rows(sink.read(spark)) == _rows(_combining_aggregate(_events(spark)))


def _with_map(df):
    """``df`` with a map column (Spark cannot hash a map: its entries are sorted first)."""
    return df.withColumn("m", F.create_map(F.lit("id"), F.col("id"), F.lit("k"), F.col("k")))


def test_a_retried_map_column_source_task_counts_each_record_once_in_an_aggregate(spark, tmp_path):
    """A map column in a shuffled source of a combined aggregation: the rows are ordered by
    their content (the map as its entries sorted by key) like any other, so the retried task
    persists each row under its dead attempt's ids. (With random chunk ids the retried task made
    copies, and the aggregate counted those records twice.) Tracked rounds only, as above."""
    p = Pipeline(spark, combine=True, optimistic=False)
    src = p.source(_with_map(_events(spark)), name="events")
    marker = tmp_path / "died"
    dying = src.map_in_pandas(_dies_once(str(marker)), src.schema, name="die")
    sink = ParquetSink(str(tmp_path / "out"))
    _combining_aggregate(dying).sink(sink, name="out")
    report = p.run()
    assert marker.exists(), "the worker did not die: nothing was retried"
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.source_records == report.completed == 200
    assert report.repeats > 0  # the retried task's rows, kept once
    assert _rows(sink.read(spark)) == _rows(_combining_aggregate(_events(spark)))


def test_a_shuffled_source_is_ordered_by_content_before_chunked_ids_are_drawn(spark):
    """Chunked source ids follow the rows' positions in their partition; after a shuffle a
    retried task may read the partition in another order (remote blocks come in any order), so
    the source is sorted by a content hash first. A scan keeps its order: no sort; a column
    Spark cannot hash (a map) keeps random ids instead."""
    from xorack.spark.build import RoundBuilder, hashable
    from xorack.spark.context import RunContext

    def plan(df, chunk_bits):
        p = Pipeline(spark)
        p.source(df, name="events").sink(SQLiteSink("/nonexistent/never.db"))
        ctx = RunContext(p.config, p.plan())
        ctx.location, ctx.chunk_bits = "grpc://127.0.0.1:9", chunk_bits  # planned, never run
        (node,) = ctx.plan.sources
        tagged = RoundBuilder(ctx, {node.index: df}, replays_wanted=False).source(node)
        return tagged._jdf.queryExecution().analyzed().toString()

    shuffled = _events(spark)
    assert "xxhash64" in plan(shuffled, 10)
    assert "xxhash64" not in plan(shuffled, 0)  # no chunks: ids derived from the records
    assert "xxhash64" not in plan(spark.range(10).withColumn("k", F.lit(1)), 10)
    maps = spark.range(3).select(F.create_map(F.lit("a"), F.col("id")).alias("m"))
    assert not hashable(maps.schema)
    assert hashable(shuffled.schema)
    # a map is hashed as its entries sorted by key (Spark cannot hash a map itself)
    assert "map_entries" in plan(_with_map(shuffled), 10)
    nested = _with_map(shuffled).select("id", F.struct(F.array(F.col("m")).alias("ms")).alias("s"))
    assert "map_entries" in plan(nested, 10)


def _lose_first_round(frames):
    """Untracked ``mapInPandas``: drops the words of ids % 7 == 3 on their first round (rows
    lost, never acked)."""
    for pdf in frames:
        tracked = "_ft_src" in pdf.columns  # the plain reference loses nothing
        yield pdf[~((pdf["id"] % 7 == 3) & (current_round() == 0) & tracked)]


@pytest.mark.parametrize("combine", [True, False])
def test_rows_lost_before_a_combined_aggregate_fail_their_chunk(spark, tmp_path, combine):
    """A lost row makes its chunk's event miss: the chunk's records are replayed, each on its
    own afterwards, and the result is still exact (staging rows: the record times out)."""

    def build(t):
        words = t.select("id", "k", "x", F.explode(F.split("line", " ")).alias("word"))
        lossy = words.transform(lambda df: df.mapInPandas(_lose_first_round, df.schema))
        return lossy.groupBy("k").agg(F.count("*").alias("n"), F.max("x").alias("hi"))

    report = _run_both(spark, tmp_path, build, lossy=True, combine=combine)
    assert (report.collateral_replays > 0) == combine
    assert (report.timed_out > 0) != combine
    assert report.vanished_rows


def _fail_after(pdf: pd.DataFrame) -> pd.DataFrame:
    """After an aggregation: the groups with k == 2 fail on their first attempt (FT on only:
    the same stage runs in the plain reference pipeline)."""
    bad = (pdf["k"] == 2) & (current_round() == 0) & ("_ft_src" in pdf.columns)
    if bad.any():
        raise xorack.FailRecord("after the aggregate", rows=bad.to_numpy())
    return pdf


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
def test_failures_after_an_aggregate_are_replayed(spark, tmp_path):
    def build(t):
        counts = t.groupBy("k").agg(F.count("*").alias("n"), F.sum("x").alias("sx"))
        return counts.map_in_pandas(_fail_after, counts.schema, name="after")

    report = _run_both(spark, tmp_path, build)
    assert report.derived_records == 7
    assert report.derived_dead_lettered == 0
    assert report.replayed > 0


def test_tracked_join_of_two_sources_then_aggregate(spark, tmp_path):
    p = Pipeline(spark)
    events = p.source(_events(spark), name="events").map_in_pandas(
        _flaky_ids, _events(spark).schema, name="flaky"
    )
    kinds = spark.createDataFrame(
        [(k, f"kind{k % 3}", k) for k in range(8)], "k int, kind string, id long"
    )
    other = p.source(kinds, name="kinds").map_in_pandas(_flaky_ids, kinds.schema, name="flaky2")
    joined = events.select("id", "k", "x").join(other.withColumnRenamed("id", "kid"), "k", "inner")
    out = joined.groupBy("kind").agg(F.sum("x").alias("sx"), F.count("*").alias("n"))
    sink = ParquetSink(str(tmp_path / "out"))
    out.sink(sink, name="out")
    report = p.run()
    assert report.lost == 0
    assert report.source_records == 208
    dead_kinds = {k for k in range(8) if k % 23 == 0}  # kid 0 is poison on the other side
    assert report.dead_lettered == len(POISON) + len(dead_kinds)

    ev = _events(spark).where(~F.col("id").isin(sorted(POISON))).select("id", "k", "x")
    kd = kinds.where(~F.col("id").isin(sorted(dead_kinds))).withColumnRenamed("id", "kid")
    want = ev.join(kd, "k").groupBy("kind").agg(F.sum("x").alias("sx"), F.count("*").alias("n"))
    assert _rows(sink.read(spark)) == _rows(want)


# ---- all-or-nothing, SQLite sink, guards ----------------------------------------------------


def _poison_word(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = pdf["word"] == "w4"
    if bad.any():
        raise xorack.FailRecord("poison word", rows=bad.to_numpy())
    return pdf


def test_a_dead_lettered_record_leaves_nothing_in_any_sink(spark, tmp_path):
    # the poisoned word is reached after a repartition: the line's other words were written
    # by other tasks before it failed (attempt after attempt); they must all be retracted
    p = Pipeline(spark, max_attempts=2)
    src = p.source(_events(spark), name="lines")
    words = src.select("id", F.explode(F.split("line", " ")).alias("word"))
    words = words.where(F.col("word") != "").repartition(3, "word")
    checked = words.map_in_pandas(_poison_word, "id long, word string", name="check")
    sink = SQLiteSink(str(tmp_path / "words.db"), "words")
    checked.sink(sink, name="words")
    report = p.run()
    poisoned = {i for i in range(200) if "w4" in {f"w{(i * 7 + j) % 11}" for j in range(i % 5)}}
    got = sink.read()
    letters = p.dead_letters()
    dead = set(letters.column("id").to_pylist()) if letters is not None else set()
    # (seen twice, under load only, in ~10 full runs: 16 poisoned lines completed on their
    # replay instead of failing; the message says which, and whether the sink has their rows)
    assert report.dead_lettered == len(poisoned) > 0, (
        report,
        sorted(poisoned - dead),
        sorted(set(got["id"]) & (poisoned - dead)),
    )
    assert report.lost == 0
    assert not set(got["id"]) & poisoned
    want = Counter(
        (i, f"w{(i * 7 + j) % 11}") for i in range(200) if i not in poisoned for j in range(i % 5)
    )
    assert _pd_rows(got, ["id", "word"]) == want


def _typo(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(n=pdf.lines.str.len())  # 'lines': the column is 'line'


def test_a_systematic_error_stops_the_run_by_the_second_attempt(spark, tmp_path):
    p = Pipeline(spark)
    src = p.source(_events(spark), name="lines")
    src.map_in_pandas(_typo, "id long, n long", name="count_chars").sink(
        SQLiteSink(str(tmp_path / "t.db"), "t")
    )
    with pytest.raises(RunawayFailure) as err:
        p.run()
    message = str(err.value)
    assert "stage 'count_chars'" in message
    assert "AttributeError" in message
    assert "lines" in message
    assert "200 of 200" in message


def _avg_per_k(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.head(1).assign(x=pdf["x"].mean())


def test_apply_in_pandas_over_several_records_is_rejected(spark, tmp_path):
    p = Pipeline(spark)
    src = p.source(_events(spark), name="lines")
    src.apply_in_pandas(["k"], _avg_per_k, src.schema, name="avg").sink(
        SQLiteSink(str(tmp_path / "t.db"), "t")
    )
    with pytest.raises(Exception, match="groupBy"):
        p.run()


def test_bad_native_declarations_fail_where_they_are_written(spark):
    p = Pipeline(spark)
    src = p.source(_events(spark), name="lines")
    with pytest.raises(TrackedOperationError, match="filter"):
        src.filter("no_such_column > 1")
    with pytest.raises(TrackedOperationError, match="one generator"):
        src.select(F.explode(F.split("line", " ")), F.explode(F.split("line", ",")))
    with pytest.raises(TrackedOperationError, match="reserved"):
        src.withColumn("_ft_mine", F.lit(1))
    with pytest.raises(TrackedOperationError, match="how="):
        src.join(_lookup(spark), "k", "full_outer")
    with pytest.raises(TrackedOperationError, match="`on`"):
        src.join(_lookup(spark), F.col("k") == F.col("k"))
    with pytest.raises(TypeError, match="Columns"):
        src.groupBy("k").agg({"x": "sum"})
    for bad in (0, 3, 2048, True, 4.0):
        with pytest.raises(ValueError, match="chunk_records must be a power of two"):
            Pipeline(spark, chunk_records=bad)


def test_which_aggregations_combine(spark):
    """Functions whose partial results merge exactly combine; anything else stages rows."""
    from xorack.spark.barrier import AggregateSpec, combining_plan

    schema = _events(spark).withColumn("d", F.col("x").cast("decimal(10,2)")).schema

    def plan(*exprs):
        spec = AggregateSpec(("k",), exprs)
        out = spark.createDataFrame([], schema).groupBy("k").agg(*exprs).schema
        got = combining_plan(spec, schema, out)
        return None if got is None else [p.function for p in got]

    combining = (F.count("*"), F.sum("x"), F.min("line"), F.max("d"), F.mean("id"), F.avg("x"))
    assert plan(*combining) == ["count", "sum", "min", "max", "avg", "avg"]
    assert plan(F.sum("d").alias("sd")) == ["sum"]
    for other in (
        F.countDistinct("x"),
        F.avg("d"),  # a decimal average rounds its own way
        F.percentile_approx("x", 0.5),
        F.expr("sum(x)"),
        (F.sum("x") + 1).alias("s1"),
        F.collect_list("x"),
    ):
        assert plan(F.count("*"), other) is None, other


# ---- Spark's own example jobs and data ------------------------------------------------------


def _example_lines(spark):
    files = sorted(glob.glob(os.path.join(PYSPARK_DIR, "examples/src/main/python/*.py")))
    assert files, "pyspark's bundled examples are missing"
    return spark.read.text(files).repartition(4)


def _flaky_lines(pdf: pd.DataFrame) -> pd.DataFrame:
    """Spark's license header lines are poison; one line in 7 fails its first attempt."""
    v = pdf["value"]
    bad = v.str.contains("Licensed") | ((v.str.len() % 7 == 3) & (current_round() == 0))
    if bad.any():
        raise xorack.FailRecord("injected", rows=bad.to_numpy())
    return pdf


def _fail_s_words(pdf: pd.DataFrame) -> pd.DataFrame:
    bad = pdf["word"].str.startswith("s") & (current_round() == 0)
    if bad.any():
        raise xorack.FailRecord("after the count", rows=bad.to_numpy())
    return pdf


def _optimized(df) -> str:
    """A DataFrame's optimized logical plan, expression ids left out."""
    import re

    return re.sub(r"#\d+L?", "", df._jdf.queryExecution().optimizedPlan().toString())


def test_with_ft_off_a_pipeline_writes_plain_sparks_plan(spark, tmp_path):
    """FT off costs nothing in the job: the frame handed to the sink is the plan plain Spark
    builds for the same operations (no lineage columns, no repartition of the aggregate's
    output, no extra projection), also when the declaration is reused for the run."""
    seen = []

    @dataclass(frozen=True)
    class Recording(ParquetSink):
        def write(self, df):
            seen.append(df)
            return super().write(df)

    path = str(tmp_path / "in")
    spark.range(300).select(F.concat_ws(" ", "id", F.col("id") % 7).alias("text")).write.parquet(
        path
    )
    p = Pipeline(spark, ft=False)
    words = p.source(spark.read.parquet(path), name="lines").select(
        F.explode(F.split("text", " ")).alias("word")
    )
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    counts.sink(Recording(str(tmp_path / "out")), name="counts")
    report = p.run()
    plain = spark.read.parquet(path).select(F.explode(F.split("text", " ")).alias("word"))
    plain = plain.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    assert len(seen) == 1
    assert _optimized(seen[0]) == _optimized(plain)
    assert "Repartition" not in _optimized(seen[0])
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == _rows(plain)
    assert report.sink_rows["counts"] == plain.count() == 300  # "0".."6" are ids too


def test_spark_example_wordcount(spark, tmp_path):
    """``examples/src/main/python/wordcount.py`` over Spark's own example sources."""
    lines = _example_lines(spark)
    p = Pipeline(spark)
    src = p.source(lines, name="lines").map_in_pandas(_flaky_lines, "value string", name="flaky")
    words = src.select(F.explode(F.split("value", " ")).alias("word")).where(F.col("word") != "")
    counts = words.groupBy("word").count()
    out = counts.map_in_pandas(_fail_s_words, counts.schema, name="after")
    sink = ParquetSink(str(tmp_path / "counts"))
    out.sink(sink, name="counts")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == lines.where(F.col("value").contains("Licensed")).count() > 0
    plain = lines.where(~F.col("value").contains("Licensed"))
    plain = plain.select(F.explode(F.split("value", " ")).alias("word")).where("word != ''")
    assert _rows(sink.read(spark)) == _rows(plain.groupBy("word").count())


def test_spark_example_word_sentiment_join(spark, tmp_path):
    """``network_wordjoinsentiments.py``: word counts joined with AFINN-111, happiness =
    sentiment x count, in batch."""
    afinn_path = os.path.join(PYSPARK_DIR, "data/streaming/AFINN-111.txt")
    afinn = spark.read.csv(afinn_path, sep="\t", schema="word string, sentiment int")
    lines = _example_lines(spark)

    def build(words):
        counts = words.groupBy("word").count()
        joined = counts.join(F.broadcast(afinn), "word", "inner")
        return joined.withColumn("happiness", F.col("sentiment") * F.col("count"))

    p = Pipeline(spark)
    src = p.source(lines, name="lines").map_in_pandas(_flaky_lines, "value string", name="flaky")
    words = src.select(F.explode(F.split(F.lower("value"), "[^a-z]+")).alias("word"))
    out = build(words.where(F.col("word") != ""))
    out = out.map_in_pandas(_fail_s_words, out.schema, name="after")
    sink = ParquetSink(str(tmp_path / "happy"))
    out.sink(sink, name="happy")
    report = p.run()
    assert report.lost == 0

    plain = lines.where(~F.col("value").contains("Licensed"))
    plain = plain.select(F.explode(F.split(F.lower("value"), "[^a-z]+")).alias("word"))
    want = build(plain.where(F.col("word") != ""))
    got = _rows(sink.read(spark))
    assert got == _rows(want)
    assert len(got) > 10


def _parse_ratings(pdf: pd.DataFrame) -> pd.DataFrame:
    parts = pdf["value"].str.split("::")
    ok = parts.str.len() == 4
    if not ok.all():
        raise xorack.FailRecord("malformed line", rows=(~ok).to_numpy())
    return pd.DataFrame(
        {
            "user": parts.str[0].astype("int64"),
            "movie": parts.str[1].astype("int64"),
            "rating": parts.str[2].astype("float64"),
            "_ft_src": pdf["_ft_src"],
            "_ft_rec": pdf["_ft_rec"],
        }
    )


def test_spark_example_movielens_averages_with_malformed_lines(spark, tmp_path):
    path = os.path.join(PYSPARK_DIR, "data/mllib/als/sample_movielens_ratings.txt")
    good = spark.read.text(path)
    bad = spark.createDataFrame([("garbage",), ("1::2",), ("x::y::z",)], "value string")
    lines = good.unionByName(bad).repartition(3)
    p = Pipeline(spark)
    ratings = p.source(lines, name="ratings").map_in_pandas(
        _parse_ratings, "user long, movie long, rating double", name="parse"
    )
    avg = ratings.groupBy("movie").agg(F.avg("rating").alias("avg"), F.count("*").alias("n"))
    sink = ParquetSink(str(tmp_path / "avg"))
    avg.sink(sink, name="avg")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 3
    parts = F.split("value", "::")
    plain = good.select(
        parts[1].cast("long").alias("movie"), parts[2].cast("double").alias("rating")
    )
    want = plain.groupBy("movie").agg(F.avg("rating").alias("avg"), F.count("*").alias("n"))
    got = _rows(sink.read(spark))
    assert got == _rows(want)
    assert len(got) == 100


# ---- property-style: random pipelines on random data with random failures --------------------

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.pipelines import random_pipeline  # noqa: E402

#: OPS of the shared generator; "pandas" is a flaky stage (``_flaky_ids``): after the one that
#: ``_run_both`` puts right after the source, another one later.
_OPS = ("filter", "explode", "inner", "left", "semi", "anti", "with", "pandas")


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # a Spark run per example: no shrinking
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(st.sampled_from(_OPS), min_size=1, max_size=5),
    agg=st.integers(0, 2),
)
def test_random_pipelines_equal_plain_spark(spark, tmp_path_factory, ops, agg):
    tmp = tmp_path_factory.mktemp("random")
    lookup = _lookup(spark)
    build = lambda t: random_pipeline(  # noqa: E731
        t,
        ops,
        agg,
        lookup,
        shift=lambda i: ("x", F.col("x") + F.lit(i)),
        total="x",
        pandas=_flaky_ids,
    )
    report = _run_both(spark, tmp, build, require_rows=False)  # semi then anti: may be empty
    assert report.lost == 0


# ---- the XOR tree's invariant through 1→n operators ------------------------------------------


@pytest.mark.parametrize("how", ["explode", "posexplode_outer", "lookup"])
def test_a_record_cannot_complete_while_one_of_its_rows_is_on_its_way(spark, how):
    """A parent's ack and its children's ids reach the acker in one event (child 0 carries
    them): whatever subset of a parent's children has been processed (its event and its ack
    sent), the record's checksum is not zero until every child is. Each child carrying its own
    id let the checksum reach zero when every child but one was processed: a record completed
    while its last row was still on its way, and that row's failure came too late (seen as a
    rare flake of the dead-letter test above, when the failing row's task ran last)."""
    from itertools import combinations

    import numpy as np

    from xorack.spark.join_ops import LookupJoin
    from xorack.spark.ops import Select

    lineage = "_ft_src long, _ft_rec long, _ft_ev long, _ft_keep boolean"
    rows = [("a b c d", 3, 1, 101, 0, True), ("e", 1, 2, 202, 0, True), ("", 5, 3, 303, 7, True)]
    df = spark.createDataFrame(rows, f"line string, k int, {lineage}")
    if how == "lookup":
        lookup = spark.createDataFrame([(3, "x"), (3, "y"), (3, "z"), (1, "w")], "k int, v string")
        out = LookupJoin(lookup, ("k",), "left", "j").apply(df, True)
    else:
        gen = getattr(F, how)(F.split(F.col("line"), " "))
        gen = gen.alias("pos", "word") if how.startswith("pos") else gen.alias("word")
        out = Select(("k", gen), "g").apply(df, True)
    got = out.select("_ft_src", "_ft_rec", "_ft_ev", "_ft_keep").collect()
    births = {1: 101, 2: 202, 3: 303}
    pending = {3: 7}  # record 3's parent row still owes this event
    for src, birth in births.items():
        mine = [(int(r[1]), int(r[2])) for r in got if r[0] == src and r[3]]
        owed = [int(r[2]) for r in got if r[0] == src and not r[3]]  # ghosts: their ack
        base = np.int64(birth) ^ np.int64(pending.get(src, 0))
        for e in owed:
            base ^= np.int64(e)
        done = base
        for rec, ev in mine:
            done ^= np.int64(rec) ^ np.int64(ev)  # a child processed: its event and its ack
        assert done == np.int64(pending.get(src, 0)) ^ np.int64(pending.get(src, 0)), (src, mine)
        for size in range(len(mine)):  # every proper subset of the children processed
            for some in combinations(mine, size):
                value = base
                for rec, ev in some:
                    value ^= np.int64(rec) ^ np.int64(ev)
                assert value != 0, (how, src, len(mine), some)
