"""The barrier cascade: a dead-lettered row of an aggregate's output fails the input records
behind it, and every sink equals plain Spark over the input records that are not
dead-lettered — on real local Spark, plain Spark as the oracle."""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pytest

import xorack
from xorack.spark import ParquetSink, Pipeline, SQLiteSink
from xorack.spark.cascade import CascadeRefused

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LINES = [
    "to be or not to be",
    "that is the question",
    "the slings and arrows",
    "to be poison or not",  # its words reach 'to', 'be', 'or', 'not' too
    "or to take arms against",
    "poison and the sea",
    "a sea of troubles",
]
POISON = "poison"
#: the words whose rows fail after the aggregate, on every attempt, and why
BAD = {POISON: "poison word", "sea": "sea word"}


def _fail_poison(pdf: pd.DataFrame) -> pd.DataFrame:
    """After the aggregate: the rows of the words of ``BAD`` fail on every attempt, each with
    its own reason (one line, 'poison and the sea', is behind both)."""
    for word, reason in BAD.items():
        bad = pdf["word"] == word
        if bad.any():
            raise xorack.FailRecord(reason, rows=bad.to_numpy())
    return pdf


def _poisoned(lines: list[str]) -> list[str]:
    return [x for x in lines if set(x.split(" ")) & set(BAD)]


def _lines(spark):
    return spark.createDataFrame([(x,) for x in LINES], "line string").repartition(2)


def _counts(t):
    words = t.select(F.explode(F.split("line", " ")).alias("word"))
    return words.groupBy("word").agg(F.count("*").alias("n"))


def _oracle(spark) -> Counter:
    """Plain Spark over the lines that hold none of the bad words."""
    kept = _lines(spark).where(~F.arrays_overlap(F.split("line", " "), F.array(*map(F.lit, BAD))))
    return Counter(tuple(r) for r in _counts(kept).collect())


def _check_letters(p, report, poisoned: list[str]) -> None:
    letters = p.dead_letters().to_pandas()
    cascaded = letters[letters["_ft_reason"].str.startswith("cascade from ")]
    assert sorted(cascaded["line"]) == sorted(poisoned)  # each line once
    for line, reason in zip(cascaded["line"], cascaded["_ft_reason"], strict=True):
        assert any(BAD[w] in reason for w in set(line.split(" ")) & set(BAD))
    rows = letters[letters["word"].notna()] if "word" in letters else letters.iloc[:0]
    assert sorted(rows["word"]) == sorted(BAD)  # the aggregate's rows, with their own reasons
    assert report.cascaded == len(poisoned) == report.dead_lettered
    assert report.derived_dead_lettered == len(BAD)
    assert report.lost == 0
    assert report.source_records == len(LINES)
    assert report.completed == len(LINES) - len(poisoned)


@pytest.mark.parametrize("optimistic", [True, False])
def test_a_dead_aggregate_row_fails_the_lines_behind_it(spark, tmp_path, optimistic):
    """Wordcount whose stage after the groupBy fails the rows of two words: the lines holding
    them are dead-lettered with them (reason ``cascade from ...``; a line behind both, once),
    and the counts of every other word they reached are retracted — the sink equals plain
    Spark over the other lines, with optimistic rounds on (into a ParquetSink) and off (into
    a SQLiteSink; and the lines also go, as they are, into a SQLiteSink of their own: a
    branch point before the aggregate, written by the first pass, where the cascaded lines
    leave nothing either)."""
    p = Pipeline(spark, optimistic=optimistic, max_attempts=1)
    lines = p.source(_lines(spark), name="lines")
    raw = SQLiteSink(str(tmp_path / "lines.db"), "lines")
    counts = _counts(lines)
    checked = counts.map_in_pandas(_fail_poison, counts.schema, name="check")
    if optimistic:
        checked.sink(ParquetSink(str(tmp_path / "counts")), name="counts")
    else:
        lines.sink(raw, name="raw")
        db = SQLiteSink(str(tmp_path / "counts.db"), "counts")
        checked.sink(db, name="counts")
    report = p.run()
    if optimistic:
        got = Counter(tuple(r) for r in spark.read.parquet(str(tmp_path / "counts")).collect())
    else:
        got = Counter(tuple(r) for r in db.read()[["word", "n"]].itertuples(index=False))
    assert got == _oracle(spark)
    poisoned = _poisoned(LINES)
    if not optimistic:
        assert sorted(raw.read()["line"]) == sorted(x for x in LINES if x not in poisoned)
    _check_letters(p, report, poisoned)
    assert report.cascade_passes == 1


def _fail_five(pdf: pd.DataFrame) -> pd.DataFrame:
    """After the second aggregate: the row of the words seen five times fails, always."""
    bad = pdf["n"] == 5
    if bad.any():
        raise xorack.FailRecord("five times", rows=bad.to_numpy())
    return pdf


def test_a_dead_row_two_barriers_down_fails_the_lines_behind_it(spark, tmp_path):
    """Two barrier levels (how many words are seen n times): the failing row of the second
    aggregate (n == 5: the word 'z' alone) is behind the row of 'z' in the first, which is
    behind the lines holding 'z' — those are dead-lettered, the rest equals plain Spark."""
    lines = [f"z w{i} w{i + 1}" for i in range(5)] + ["a b", "b c", "w1 q"]
    df = spark.createDataFrame([(x,) for x in lines], "line string")

    def build(t):
        per_word = _counts(t)
        return per_word.groupBy("n").agg(F.count("*").alias("words"))

    p = Pipeline(spark, max_attempts=1)
    hist = build(p.source(df, name="lines"))
    hist.map_in_pandas(_fail_five, hist.schema, name="check").sink(
        ParquetSink(str(tmp_path / "hist")), name="hist"
    )
    report = p.run()
    kept = df.where(~F.array_contains(F.split("line", " "), "z"))
    want = Counter(tuple(r) for r in build(kept).collect())
    got = Counter(tuple(r) for r in spark.read.parquet(str(tmp_path / "hist")).collect())
    assert got == want
    letters = p.dead_letters().to_pandas()
    cascaded = letters[letters["_ft_reason"].str.startswith("cascade from ")]
    assert sorted(cascaded["line"]) == sorted(x for x in lines if "z" in x.split(" "))
    assert report.cascaded == 5
    assert report.lost == 0


def test_a_dead_row_of_a_tracked_join_is_refused(spark, tmp_path):
    """The input records behind a row of a join of two tracked frames are not traced: the run
    says so instead of counting the rest silently."""
    p = Pipeline(spark, max_attempts=1)
    words = p.source(_lines(spark), name="lines").select(
        F.explode(F.split("line", " ")).alias("word")
    )
    tags = p.source(spark.createDataFrame([(POISON, 1), ("sea", 2)], "word string, tag int"))
    joined = words.join(tags, "word")
    joined.map_in_pandas(_fail_poison, joined.schema, name="check").sink(
        ParquetSink(str(tmp_path / "joined")), name="joined"
    )
    with pytest.raises(CascadeRefused, match="join"):
        p.run()
