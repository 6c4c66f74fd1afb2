"""Repairing dead letters (``Pipeline.repair``): a stage with a bug that some rows reach on every
attempt, the run dead-letters them, the fixed stage runs only them and their rows and aggregate
contributions are merged into the sinks the run wrote — checked against plain Spark over the
whole input; twice is the same as once; records that still fail stay dead-lettered; a repair
cut short after some sinks were merged is finished once by the next one."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pandas as pd
import pytest
from pyspark.sql import functions as F

from xorack.spark import ParquetSink, Pipeline, SQLiteSink
from xorack.spark.repair import RepairRefused

LINES = [f"w{i % 7} v{i % 5} {'bad#' if i % 9 == 0 else 'ok'} x{i % 3}" for i in range(60)]


def _split(fixed: bool, still: str | None = None):
    """The stage: splits a line into words; the buggy one raises on lines with '#'; ``still``:
    lines containing it keep failing after the fix."""

    def split(pdf):
        if still is not None and pdf.line.str.contains(still).any():
            raise ValueError(f"still broken: {still}")
        if not fixed and pdf.line.str.contains("#").any():
            raise ValueError("unexpected '#'")
        words = pdf.assign(word=pdf.line.str.split()).explode("word", ignore_index=True)
        words = words[words.word.notna()]
        return words.assign(size=words.word.str.len().astype("int64"))

    return split


def _job(
    spark, tmp, fixed: bool, still: str | None = None, variant: str = ""
) -> tuple[Pipeline, dict]:
    """The job; ``variant``: a declaration that is not the run's (``extra_sink``: one more
    sink; ``other_key``: the counts grouped by another key)."""
    p = Pipeline(
        spark,
        storage=f"sqlite:///{tmp}/ft.db",
        workdir=f"{tmp}/work",
        resume=True,
        max_attempts=1,
    )
    lines = spark.createDataFrame([(s,) for s in LINES], "line string").repartition(2)
    words = p.source(lines, name="lines").map_in_pandas(
        _split(fixed, still), "line string, word string, size long", name="split"
    )
    sinks = {
        "rows": SQLiteSink(f"{tmp}/words.db", "words"),
        "counts": ParquetSink(f"{tmp}/counts"),
        "total": SQLiteSink(f"{tmp}/total.db", "total"),
        "raw": ParquetSink(f"{tmp}/raw"),
    }
    words.select("word").sink(sinks["rows"], name="rows")
    words.groupBy("size" if variant == "other_key" else "word").agg(
        F.count("*").alias("n"), F.sum("size").alias("chars"), F.max("size").alias("longest")
    ).sink(sinks["counts"], name="counts")
    words.agg(F.count("*").alias("n"), F.min("size").alias("shortest")).sink(
        sinks["total"], name="total"
    )
    words.select("word", "size").sink(sinks["raw"], name="raw")
    if variant == "extra_sink":
        sinks["extra"] = ParquetSink(f"{tmp}/extra")
        words.select("size").sink(sinks["extra"], name="extra")
    return p, sinks


def _oracle(spark, keep) -> dict:
    """Plain Spark over the lines ``keep`` accepts."""
    lines = spark.createDataFrame([(s,) for s in LINES if keep(s)], "line string")
    words = lines.select(F.explode(F.split("line", " ")).alias("word"))
    words = words.withColumn("size", F.length("word").cast("long"))
    counts = words.groupBy("word").agg(
        F.count("*").alias("n"), F.sum("size").alias("chars"), F.max("size").alias("longest")
    )
    total = words.agg(F.count("*").alias("n"), F.min("size").alias("shortest"))
    return {
        "rows": Counter(r.word for r in words.collect()),
        "counts": sorted(map(tuple, counts.collect())),
        "total": [tuple(r) for r in total.collect()],
        "raw": Counter(map(tuple, words.collect())),
    }


def _held(spark, sinks) -> dict:
    return {
        "rows": Counter(sinks["rows"].read()["word"]),
        "counts": sorted(map(tuple, spark.read.parquet(sinks["counts"].path).collect())),
        "total": [tuple(r) for r in sinks["total"].read().itertuples(index=False)],
        "raw": Counter(map(tuple, spark.read.parquet(sinks["raw"].path).collect())),
    }


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory):
    """The job run once with the buggy stage (its storage, workdir and sinks, in a directory
    each test copies)."""
    tmp = tmp_path_factory.mktemp("ran")
    p, _ = _job(spark, tmp, fixed=False)
    report = p.run()
    return tmp, report, p


def _copy(ran, tmp_path):
    shutil.copytree(ran[0], tmp_path, dirs_exist_ok=True)


@pytest.mark.spark
def test_a_fixed_stage_repairs_the_dead_letters_into_every_sink_exactly_once(spark, tmp_path, ran):
    bad = sum("#" in s for s in LINES)
    _copy(ran, tmp_path)
    p, sinks = _job(spark, tmp_path, fixed=False)
    report = ran[1]
    assert report.lost == 0
    assert report.dead_lettered == bad
    assert _held(spark, sinks) == _oracle(spark, lambda s: "#" not in s)
    view = p.dead_letters(view=True)
    assert len(view) == bad
    assert set(view.status) == {"dead"}
    assert set(view.stage) == {"split"}
    assert view.error.str.contains("unexpected").all()
    assert sorted(view.line) == sorted(s for s in LINES if "#" in s)

    fixed, sinks = _job(spark, tmp_path, fixed=True)
    done = fixed.repair()
    assert (done.repaired, done.failed_again, done.still_dead) == (bad, 0, 0)
    whole = _oracle(spark, lambda s: True)
    assert _held(spark, sinks) == whole
    assert done.sinks["rows"]["rows_added"] == sum(len(s.split()) for s in LINES if "#" in s)
    assert done.sinks["counts"]["groups_changed"] == len(
        {w for s in LINES if "#" in s for w in s.split()}
    )
    assert ["bad#"] in done.sinks["counts"]["groups"]
    view = fixed.dead_letters(view=True)
    assert set(view.status) == {"repaired"}
    assert set(view.repair) == {done.repair}
    assert view.repaired_at.notna().all()

    again = fixed.repair()  # nothing left to repair: nothing changes
    assert (again.repaired, again.failed_again, again.sinks) == (0, 0, {})
    assert _held(spark, sinks) == whole


@pytest.mark.spark
def test_records_that_still_fail_stay_dead_lettered_with_the_new_reason(spark, tmp_path, ran):
    _copy(ran, tmp_path)
    partly, sinks = _job(spark, tmp_path, fixed=True, still="w0")
    done = partly.repair()
    still = {s for s in LINES if "#" in s and "w0" in s}
    assert still
    assert (done.failed_again, done.still_dead) == (len(still), len(still))
    assert done.repaired == sum("#" in s for s in LINES) - len(still)
    assert _held(spark, sinks) == _oracle(spark, lambda s: s not in still)
    view = partly.dead_letters(view=True)
    dead = view[view.status == "dead"]
    assert set(dead.line) == still
    assert dead.error.str.contains("still broken").all()
    assert (view.status == "failed again").sum() == len(still)
    # fixed for good: the second repair takes only those
    fixed, sinks = _job(spark, tmp_path, fixed=True)
    last = fixed.repair()
    assert (last.repaired, last.failed_again, last.still_dead) == (len(still), 0, 0)
    assert _held(spark, sinks) == _oracle(spark, lambda s: True)


@pytest.mark.spark
def test_a_repair_cut_short_midway_is_finished_once(spark, tmp_path, monkeypatch, ran):
    from xorack.spark import repair as repair_module

    _copy(ran, tmp_path)
    fixed, sinks = _job(spark, tmp_path, fixed=True)
    real = repair_module.SinkMerger.merge
    merged: list[str] = []

    def crash_after_two(self, merge):
        if len(merged) == 2:
            raise KeyboardInterrupt("driver killed")
        merged.append(merge.node.name)
        return real(self, merge)

    monkeypatch.setattr(repair_module.SinkMerger, "merge", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        fixed.repair()
    monkeypatch.setattr(repair_module.SinkMerger, "merge", real)
    assert set(fixed.dead_letters(view=True).status) == {"dead"}  # not settled
    done = fixed.repair()
    assert done.resumed
    assert done.repaired == sum("#" in s for s in LINES)
    assert _held(spark, sinks) == _oracle(spark, lambda s: True)
    assert fixed.repair().repaired == 0
    assert _held(spark, sinks) == _oracle(spark, lambda s: True)


@pytest.mark.spark
def test_what_cannot_be_merged_is_refused_before_anything_is_written(spark, tmp_path):
    df = spark.createDataFrame([(1, 2.0)], "k long, v double")
    memory = Pipeline(spark)
    memory.source(df, name="s").sink(ParquetSink(str(tmp_path / "m")), name="m")
    with pytest.raises(RepairRefused, match="durable state"):
        memory.repair()

    def job(**kw) -> Pipeline:
        return Pipeline(
            spark, storage=f"sqlite:///{tmp_path}/ft.db", workdir=str(tmp_path / "w"), **kw
        )

    p = job(resume=True)
    p.source(df, name="s").groupBy("k").agg(F.percentile("v", 0.5).alias("m")).sink(
        ParquetSink(str(tmp_path / "pct")), name="pct"
    )
    with pytest.raises(RepairRefused, match="holistic"):
        p.repair()
    p = job(resume=True)
    p.source(df, name="s").groupBy("k").agg(F.avg("v").alias("m")).sink(
        ParquetSink(str(tmp_path / "avg")), name="avg"
    )
    with pytest.raises(RepairRefused, match=r"avg\(m\)"):
        p.repair()
    p = job(resume=True)
    left, right = p.source(df, name="a"), p.source(df, name="b")
    left.join(right.select("k"), on="k", how="left").sink(
        ParquetSink(str(tmp_path / "j")), name="j"
    )
    with pytest.raises(RepairRefused, match="inner joins"):
        p.repair()
    p = job(resume=True)
    p.source(df, name="s").sink(ParquetSink(str(tmp_path / "unrun")), name="unrun")
    with pytest.raises(RepairRefused, match="not finished"):
        p.repair()
    assert not os.path.exists(tmp_path / "unrun")
    assert isinstance(p.dead_letters(view=True), pd.DataFrame)


def test_merged_groups_combine_as_plain_aggregation_over_both_parts():
    from xorack.spark.repair import SinkMerge, merge_groups

    merge = SinkMerge(
        node=None,  # type: ignore[arg-type]
        keys=("k",),
        functions=(("n", "count"), ("s", "sum"), ("lo", "min"), ("hi", "max")),
    )
    old = [
        {"k": "a", "n": 2, "s": 5, "lo": 1, "hi": 4},
        {"k": None, "n": 1, "s": None, "lo": None, "hi": None},  # null is a group of its own
        {"k": "c", "n": 1, "s": 1, "lo": 1, "hi": 1},
    ]
    delta = [
        {"k": "a", "n": 1, "s": 7, "lo": 0, "hi": 3},
        {"k": None, "n": 1, "s": 2, "lo": 2, "hi": 2},
        {"k": "b", "n": 1, "s": None, "lo": None, "hi": None},
    ]
    changed, added = merge_groups(old, delta, merge)
    assert changed == [0, 1]
    assert added == [{"k": "b", "n": 1, "s": None, "lo": None, "hi": None}]
    assert old[0] == {"k": "a", "n": 3, "s": 12, "lo": 0, "hi": 4}
    assert old[1] == {"k": None, "n": 2, "s": 2, "lo": 2, "hi": 2}
    assert old[2] == {"k": "c", "n": 1, "s": 1, "lo": 1, "hi": 1}
    # a global aggregate's one row, and a delta that changes nothing
    total = SinkMerge(node=None, keys=(), functions=(("n", "count"), ("s", "sum")))  # type: ignore[arg-type]
    row = [{"n": 3, "s": 9}]
    assert merge_groups(row, [{"n": 0, "s": None}], total) == ([], [])
    assert row == [{"n": 3, "s": 9}]


@pytest.mark.spark
@pytest.mark.parametrize("variant", ["extra_sink", "other_key"])
def test_a_repair_declared_unlike_the_job_is_refused_before_anything_is_written(
    spark, tmp_path, ran, variant
):
    _copy(ran, tmp_path)
    other, sinks = _job(spark, tmp_path, fixed=True, variant=variant)
    before = _held(spark, sinks)
    with pytest.raises(RepairRefused, match="declaration is not the job's"):
        other.repair()
    assert _held(spark, sinks) == before == _oracle(spark, lambda s: "#" not in s)
    assert not os.path.exists(tmp_path / "extra")
    assert not os.path.exists(tmp_path / "work" / "repair")
    assert set(other.dead_letters(view=True).status) == {"dead"}
    fixed, sinks = _job(spark, tmp_path, fixed=True)  # the job's own declaration repairs
    assert fixed.repair().repaired == sum("#" in s for s in LINES)
    assert _held(spark, sinks) == _oracle(spark, lambda s: True)


# ---- joins: a repaired record meets the other side's rows that went through before ----------

#: the tracked side of the join: each word's rank; the buggy stage fails "w3" and "v1"
LEXICON = [
    (w, 10 * len(w) + i) for i, w in enumerate(sorted({w for s in LINES for w in s.split()}))
]
#: the untracked (lookup) side
TAGS = [(w, f"t{len(w)}") for w in sorted({w for s in LINES for w in s.split()}) if w != "ok"]


def _rank(fixed: bool):
    def rank(pdf):
        if not fixed and pdf.word.isin(["w3", "v1"]).any():
            raise ValueError("unexpected word")
        return pdf

    return rank


def _join_job(spark, tmp, fixed: bool) -> tuple[Pipeline, dict]:
    p = Pipeline(
        spark,
        storage=f"sqlite:///{tmp}/ft.db",
        workdir=f"{tmp}/work",
        resume=True,
        max_attempts=1,
    )
    lines = spark.createDataFrame([(s,) for s in LINES], "line string").repartition(2)
    words = p.source(lines, name="lines").map_in_pandas(
        _split(fixed), "line string, word string, size long", name="split"
    )
    lexicon = p.source(
        spark.createDataFrame(LEXICON, "word string, rank long"), name="lexicon"
    ).map_in_pandas(_rank(fixed), "word string, rank long", name="rank")
    tags = spark.createDataFrame(TAGS, "word string, tag string")
    sinks = {
        "pairs": ParquetSink(f"{tmp}/pairs"),
        "by_rank": SQLiteSink(f"{tmp}/by_rank.db", "by_rank"),
        "tagged": ParquetSink(f"{tmp}/tagged"),
    }
    joined = words.join(lexicon, "word")
    joined.select("word", "size", "rank").sink(sinks["pairs"], name="pairs")
    joined.groupBy("rank").agg(F.count("*").alias("n"), F.sum("size").alias("chars")).sink(
        sinks["by_rank"], name="by_rank"
    )
    words.join(tags, "word", "left").select("word", "tag").sink(sinks["tagged"], name="tagged")
    return p, sinks


def _join_oracle(spark, line_ok, word_ok) -> dict:
    """Plain Spark over the lines and lexicon words these accept."""
    lines = spark.createDataFrame([(s,) for s in LINES if line_ok(s)], "line string")
    words = lines.select(F.explode(F.split("line", " ")).alias("word"))
    words = words.withColumn("size", F.length("word").cast("long"))
    lexicon = spark.createDataFrame([r for r in LEXICON if word_ok(r[0])], "word string, rank long")
    joined = words.join(lexicon, "word")
    by_rank = joined.groupBy("rank").agg(F.count("*").alias("n"), F.sum("size").alias("chars"))
    tags = spark.createDataFrame(TAGS, "word string, tag string")
    return {
        "pairs": Counter(map(tuple, joined.select("word", "size", "rank").collect())),
        "by_rank": sorted(map(tuple, by_rank.collect())),
        "tagged": Counter(
            map(tuple, words.join(tags, "word", "left").select("word", "tag").collect())
        ),
    }


def _join_held(spark, sinks) -> dict:
    return {
        "pairs": Counter(map(tuple, spark.read.parquet(sinks["pairs"].path).collect())),
        "by_rank": sorted(map(tuple, sinks["by_rank"].read().itertuples(index=False))),
        "tagged": Counter(map(tuple, spark.read.parquet(sinks["tagged"].path).collect())),
    }


@pytest.mark.spark
def test_a_repair_joins_the_repaired_records_with_the_rows_that_went_through(spark, tmp_path):
    p, sinks = _join_job(spark, tmp_path, fixed=False)
    report = p.run()
    dead_words = {"w3", "v1"}
    bad = sum("#" in s for s in LINES)
    assert (report.lost, report.dead_lettered) == (0, bad + len(dead_words))
    assert _join_held(spark, sinks) == _join_oracle(
        spark, lambda s: "#" not in s, lambda w: w not in dead_words
    )
    # each part of the new pairs is there: repaired lines with completed lexicon words, completed
    # lines with repaired words, repaired lines with repaired words ("w3 v0 bad# x0")
    assert any("#" in s and "w3" in s for s in LINES)

    fixed, sinks = _join_job(spark, tmp_path, fixed=True)
    done = fixed.repair()
    assert (done.repaired, done.failed_again, done.still_dead) == (bad + len(dead_words), 0, 0)
    whole = _join_oracle(spark, lambda s: True, lambda w: True)
    assert _join_held(spark, sinks) == whole
    again = fixed.repair()
    assert (again.repaired, again.sinks) == (0, {})
    assert _join_held(spark, sinks) == whole
