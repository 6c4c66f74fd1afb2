"""A row on which a native expression raises (Spark 4's ANSI mode: a malformed cast, a division
by zero; ``raise_error``) fails its own source record only, as a raising row of a Python stage
does: the run completes, exactly those records are dead-lettered with Spark's error condition
in the reason, and every sink equals plain Spark over the input minus them — before a sink and
before an aggregate, through an abandoned tracked round or an optimistic round that falls
back. An error that every row raises stops the run (the runaway guard), never loops."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from xorack.spark import ParquetSink, Pipeline, Reason, SQLiteSink
from xorack.spark.guard import RunawayFailure
from xorack.spark.row_errors import NativeRowError

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

N = 60
BAD = frozenset({5, 23, 41})
SCHEMA = "id long, k int, v string, a long, b long, flag boolean"


def _input(spark, bad=BAD, n: int = N, by_range: bool = False):
    """``id``, a group ``k``, and per kind of error the column that makes the bad rows raise:
    ``v`` malformed (a cast), ``b`` zero (a division), ``flag`` set (``raise_error``)."""

    def row(i: int) -> tuple:
        if i in bad:
            return (i, i % 4, f"x{i}", i + 1, 0, True)
        return (i, i % 4, str(i * 3), i + 1, i % 5 + 1, False)

    df = spark.createDataFrame([row(i) for i in range(n)], SCHEMA)
    return df.repartitionByRange(2, "id") if by_range else df.repartition(2)


# each kind of row error: the tracked (or plain) frame with a column `x` that raises on BAD
KINDS = {
    "CAST_INVALID_INPUT": lambda t: t.withColumn("x", F.col("v").cast("long")),
    "USER_RAISED_EXCEPTION": lambda t: t.withColumn(
        "x",
        F.when(
            F.col("flag"), F.raise_error(F.concat(F.lit("bad id "), F.col("id").cast("string")))
        ).otherwise(F.col("a") * 2),
    ),
    "DIVIDE_BY_ZERO": lambda t: t.select("id", "k", (F.col("a") / F.col("b")).alias("x")),
}


def _aggregate(t):
    return t.groupBy("k").agg(F.sum("x").alias("s"), F.count("*").alias("n"))


def _rows(df) -> Counter:
    def norm(v):
        return round(v, 9) if isinstance(v, float) else v

    return Counter(tuple(norm(v) for v in r) for r in df.collect())


def _assert_isolated(p, report, condition: str, bad=BAD) -> None:
    assert report.lost == 0
    assert (report.source_records, report.completed) == (N, N - len(bad))
    assert report.dead_lettered == len(bad)
    dead = p.dead_letters().to_pandas()
    assert sorted(dead["id"]) == sorted(bad)
    assert all(f"[{condition}]" in r for r in dead["_ft_reason"]), list(dead["_ft_reason"])


@pytest.mark.parametrize(
    ("condition", "native"),
    [("CAST_INVALID_INPUT", False), ("USER_RAISED_EXCEPTION", False), ("DIVIDE_BY_ZERO", True)],
)
def test_before_a_sink_and_an_aggregate(spark, tmp_path, condition, native):
    """The raising frame goes to a sink (written from Python, or a ParquetSink) and to an
    aggregate: a branch point. With a Python sink, tracked rounds: the first round fails and is
    abandoned (rows a Python sink wrote are absorbed again), the next ones fail the bad rows'
    records alone. With a ParquetSink the phase's optimistic round meets the error and falls
    back, and its tracked rounds isolate the raising rows from the first. The aggregate counts
    every other record once."""
    build = KINDS[condition]
    p = Pipeline(spark, max_attempts=2)
    out = build(p.source(_input(spark), name="in"))
    if native:
        sink = ParquetSink(str(tmp_path / "rows"))
    else:
        sink = SQLiteSink(os.path.join(tmp_path, "rows.db"), "rows")
    out.sink(sink, name="rows")
    counts = ParquetSink(str(tmp_path / "counts"))
    _aggregate(out).sink(counts, name="counts")
    report = p.run()
    _assert_isolated(p, report, condition)
    assert report.abandoned_rounds == (0 if native else 1)
    if native:
        assert report.phase_reasons[0] is Reason.NATIVE_ROW_ERROR
    plain = build(_input(spark).where(~F.col("id").isin(sorted(BAD))))
    if native:
        assert _rows(sink.read(spark)) == _rows(plain)
    else:
        rows = sink.read()[plain.columns].itertuples(index=False, name=None)
        assert _rows(spark.createDataFrame(list(rows), plain.schema)) == _rows(plain)
    assert _rows(counts.read(spark)) == _rows(_aggregate(plain))


def test_the_report_counts_what_a_python_sink_holds_after_an_abandoned_round(spark, tmp_path):
    """The bad rows all in the first of two partitions (by range): the abandoned round's job
    wrote the second partition's rows into the SQLite sink, and their count never came back
    from the failed job. ``sink_rows`` is what the run added to the sink."""
    bad = frozenset({5, 12})
    p = Pipeline(spark, max_attempts=2)
    sink = SQLiteSink(os.path.join(tmp_path, "rows.db"), "rows")
    KINDS["CAST_INVALID_INPUT"](p.source(_input(spark, bad, by_range=True), name="in")).sink(
        sink, name="rows"
    )
    report = p.run()
    _assert_isolated(p, report, "CAST_INVALID_INPUT", bad)
    assert report.abandoned_rounds == 1
    assert sink.count() == N - len(bad)
    assert report.sink_rows["rows"] == N - len(bad)
    # the same job again into the same table: its rows are there already (absorbed), and the
    # report counts what this run added, not what the table held before it
    again = Pipeline(spark, max_attempts=2)
    KINDS["CAST_INVALID_INPUT"](again.source(_input(spark, bad, by_range=True), name="in")).sink(
        sink, name="rows"
    )
    second = again.run()
    assert second.abandoned_rounds == 1
    assert sink.count() == N - len(bad)
    assert second.sink_rows["rows"] == 0


def test_an_optimistic_round_falls_back_then_isolates(spark, tmp_path):
    """Before an aggregate alone, the phase runs an optimistic round first: it falls back
    (leaving no trace) and the phase's tracked rounds are guarded from the first."""
    build = KINDS["DIVIDE_BY_ZERO"]
    p = Pipeline(spark, max_attempts=2)
    sink = ParquetSink(str(tmp_path / "out"))
    _aggregate(build(p.source(_input(spark), name="in"))).sink(sink, name="out")
    report = p.run()
    _assert_isolated(p, report, "DIVIDE_BY_ZERO")
    assert report.phase_reasons[0] is Reason.NATIVE_ROW_ERROR
    assert report.abandoned_rounds == 0
    plain = _aggregate(build(_input(spark).where(~F.col("id").isin(sorted(BAD)))))
    assert _rows(sink.read(spark)) == _rows(plain)


def test_a_filter_and_a_generator_after_a_python_stage(spark, tmp_path):
    """A raising filter condition and a raising generator argument (on another row, with
    another error) after a Python stage, whose events reached the acker before the round
    failed: the collateral replays start afresh, with no attempt used up."""
    seven = F.when(F.col("id") == 7, F.raise_error(F.lit("seven"))).otherwise(F.col("a"))

    def build(t):
        t = t.where(F.col("a") / F.col("b") > 0)
        return t.select("id", F.explode(F.array(F.col("k"), seven)).alias("e"))

    p = Pipeline(spark, max_attempts=1)  # an attempt used up by the abandoned round would show
    src = p.source(_input(spark), name="in")
    staged = src.map_in_pandas(lambda it: it, src.schema, name="same")
    sink = SQLiteSink(os.path.join(tmp_path, "out.db"), "out")
    build(staged).sink(sink, name="out")
    report = p.run()
    assert (report.lost, report.completed, report.dead_lettered) == (0, N - 4, 4)
    dead = p.dead_letters().to_pandas().set_index("id")["_ft_reason"]
    assert sorted(dead.index) == sorted({*BAD, 7})
    assert all("[DIVIDE_BY_ZERO]" in dead[i] for i in BAD)
    assert dead[7].startswith("native 'select': [USER_RAISED_EXCEPTION] seven")
    plain = build(_input(spark).where(~F.col("id").isin(sorted({*BAD, 7}))))
    got = Counter(tuple(r) for r in sink.read()[["id", "e"]].itertuples(index=False, name=None))
    assert got == _rows(plain)


def test_every_row_raising_stops_the_run(spark, tmp_path):
    """A systematic error (every row malformed) stops the run with the runaway guard's error,
    naming the operation and Spark's condition, after two guarded rounds."""
    n = 24  # the guard counts from 20 failed records
    p = Pipeline(spark, max_attempts=3, optimistic=False)
    t = KINDS["CAST_INVALID_INPUT"](p.source(_input(spark, frozenset(range(n)), n), name="in"))
    _aggregate(t).sink(ParquetSink(str(tmp_path / "out")), name="out")
    with pytest.raises(RunawayFailure, match=r"native 'withColumns'.*CAST_INVALID_INPUT"):
        p.run()


@pytest.mark.parametrize(
    ("where", "says"),
    [("transform", "raised again with the phase's row operations guarded"), ("input", "p.source")],
)
def test_an_error_outside_the_guarded_expressions_stops_the_run(spark, tmp_path, where, says):
    """A row error that guarding cannot reach (an untracked transform's, or the source's own
    input DataFrame's) stops the run with NativeRowError naming it, once: it never loops."""
    p = Pipeline(spark, max_attempts=3)
    cast = KINDS["CAST_INVALID_INPUT"]
    if where == "transform":
        t = p.source(_input(spark), name="in").transform(cast)
    else:
        t = p.source(cast(_input(spark)), name="in")
    t.sink(SQLiteSink(os.path.join(tmp_path, "out.db"), "out"), name="out")
    with pytest.raises(NativeRowError, match=rf"CAST_INVALID_INPUT.*{says}"):
        p.run()


def _raises_alone(spark, build, i: int) -> bool:
    """Whether plain Spark raises running ``build`` over the input's row ``i`` alone."""
    try:
        build(_input(spark).where(F.col("id") == i)).collect()
    except Exception:
        return True
    return False


def _cast():
    return F.col("v").cast("long")


PUSHED = {
    # a later filter over a column the cast leaves as it is: Spark evaluates it first
    "column of t": lambda t: t.withColumn("x", _cast()).where(t["id"] != 5),
    "SQL, two columns": lambda t: t.withColumn("x", _cast()).where("id != 5 AND k != 3"),
    "through a withColumn": lambda t: (
        t.withColumn("x", _cast()).withColumn("y", F.col("a") * 2).where(F.col("id") != 5)
    ),
    "select": lambda t: t.select("id", "k", _cast().alias("x")).where(F.col("id") != 5),
    "filters, id first": lambda t: (
        t.withColumn("x", _cast()).where(F.col("id") != 5).where(F.col("x") > 0)
    ),
    # the filter reads the cast's column (inlined, it casts first), or follows one that does
    "reads x": lambda t: t.withColumn("x", _cast()).where(F.col("x") > 0),
    "filters, x first": lambda t: (
        t.withColumn("x", _cast()).where(F.col("x") > 0).where(F.col("id") != 5)
    ),
    # the conservative side: a filter giving null (Spark's generated code skips the row, its
    # interpreted AND goes on to the next conjunct), a rename in between (Spark pushes it)
    "null verdict": lambda t: t.withColumn("x", _cast()).where(F.when(F.col("id") != 5, True)),
    "after a rename": lambda t: (
        t.withColumn("x", _cast()).withColumnRenamed("k", "kk").where(F.col("id") != 5)
    ),
}


@pytest.mark.parametrize("case", sorted(PUSHED))
def test_a_later_filter_spark_pushes_down_drops_the_row_instead(spark, tmp_path, case):
    """Once guarded, a row operation's raising row fails its record unless a later filter,
    which plain Spark's optimizer evaluates before the operation, drops it: plain Spark never
    evaluates the cast on row 5 when ``id != 5`` comes after it. Plain Spark is the oracle,
    row by row: the records dead-lettered are exactly those of the bad rows on which plain
    Spark raises alone (but on the conservative side: a filter giving null, a rename in
    between), and the sink
    equals plain Spark over the input without them."""
    build = PUSHED[case]
    raising = {i for i in sorted(BAD) if _raises_alone(spark, build, i)}
    expected = raising | ({5} if case in ("after a rename", "null verdict") else set())
    p = Pipeline(spark, max_attempts=2)
    sink = ParquetSink(str(tmp_path / "out"))
    build(p.source(_input(spark), name="in")).sink(sink, name="out")
    report = p.run()
    assert report.lost == 0
    dead = sorted(p.dead_letters().to_pandas()["id"])
    assert dead == sorted(expected), (case, raising)
    assert (report.completed, report.dead_lettered) == (N - len(expected), len(expected))
    plain = build(_input(spark).where(~F.col("id").isin(sorted(expected))))
    assert _rows(sink.read(spark)) == _rows(plain)
    # the oracle itself: where a filter over the input's columns drops row 5, plain Spark
    # never casts it
    assert (5 in raising) == (case in ("reads x", "filters, x first"))
