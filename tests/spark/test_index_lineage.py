"""Lineage without bookkeeping: a pandas stage whose function builds a new frame (no ``_ft_rec``
column) has its output rows matched to their input rows by the pandas index; an Arrow stage's
function may say where each row comes from in an ``_ft_row`` column. The mechanics against the
``_ft_rec``-carrying form of the same function (no Spark: the same ids and events), the refusal
of a renumbered output (never taken for other rows), and on real local Spark the MovieLens parse
every ``mapInPandas`` example writes, with injected failures and poison rows, against plain
Spark's ``mapInPandas`` running the same functions."""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import xorack
from xorack.errors import LineageError
from xorack.spark.arrow_stage import ArrowStageRunner
from xorack.spark.lineage import REC, SRC
from xorack.spark.stages import StageRunner, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
import pyspark
from pyspark import cloudpickle

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RATINGS = os.path.join(
    os.path.dirname(pyspark.__file__), "data", "mllib", "als", "sample_movielens_ratings.txt"
)
PARSED = ("userId", "movieId", "rating", "timestamp")


class _Client:
    """Records what a runner sends to the acker."""

    def __init__(self) -> None:
        self.events: list[tuple[list[int], list[int]]] = []
        self.failed: list[tuple[list[int], str]] = []

    def xor(self, src, values) -> None:
        self.events.append((np.asarray(src).tolist(), np.asarray(values).tolist()))

    def fail(self, src, reason: str) -> None:
        self.failed.append((np.asarray(src).tolist(), reason))


def _ratings_batch(n: int = 40) -> pd.DataFrame:
    """n MovieLens lines as a stage's input: ``value`` and the lineage columns (20 records)."""
    with open(RATINGS) as f:
        lines = [next(f).rstrip("\n") for _ in range(n)]
    rng = np.random.default_rng(3)
    return pd.DataFrame(
        {
            "value": lines,
            SRC: rng.integers(1, 2**62, 20)[np.arange(n) % 20],
            REC: rng.integers(1, 2**62, n),
        }
    )


def _parse(pdf: pd.DataFrame) -> pd.DataFrame:
    """The parse every ``mapInPandas`` example writes: a new frame from the input's Series."""
    parts = pdf["value"].str.split("::")
    return pd.DataFrame(
        {
            "userId": parts.str[0].astype("int64"),
            "movieId": parts.str[1].astype("int64"),
            "rating": parts.str[2].astype("int64"),
            "timestamp": parts.str[3].astype("int64"),
        }
    )


def _high_scores(pdf: pd.DataFrame) -> pd.DataFrame:
    """A filter, then a new frame from the kept rows' Series (1 -> 0/1)."""
    kept = pdf[pdf["rating"] >= 2]
    return pd.DataFrame(
        {"userId": kept["userId"], "rating": kept["rating"], "score": kept["rating"] * 1.5}
    )


def _stars(pdf: pd.DataFrame) -> pd.DataFrame:
    """One row per star of a rating (1 -> n; a 0 rating gives none), as a new frame."""
    stars = pdf["rating"].map(lambda r: list(range(int(r))))
    out = pdf.assign(star=stars).explode("star")
    out = out[out["star"].notna()]
    return pd.DataFrame({"userId": out["userId"], "star": out["star"].astype("int64")})


def _carrying(fn):
    """The same function in the ``_ft_rec``-carrying form (today's contract)."""

    def carry(pdf: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
        return out.assign(**{REC: pdf[REC].loc[out.index].to_numpy()})

    def carried(pdf: pd.DataFrame):
        out = fn(pdf)
        if isinstance(out, pd.DataFrame):
            return carry(pdf, out)
        return [carry(pdf, o) for o in out]

    return carried


def _runner(fn, columns, **kw) -> StageRunner:
    return StageRunner("parse", fn, tuple(columns), location="unused", **kw)


def _run_both(fn, columns, pdf):
    """(output, events, failures) of ``fn`` and of its ``_ft_rec``-carrying form."""
    results = []
    for f in (fn, _carrying(fn)):
        c = _Client()
        out = _runner(f, columns).process(pdf.copy(), c)
        results.append((out, c.events, c.failed))
    return results


# ---- mechanics, no Spark --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "columns"),
    [
        (_parse, PARSED),
        (lambda pdf: _high_scores(_parse(pdf)), ("userId", "rating", "score")),
        (lambda pdf: _stars(_parse(pdf)), ("userId", "star")),
    ],
    ids=["new-frame", "filter-new-frame", "explode"],
)
def test_a_new_frame_is_anchored_as_the_rec_carrying_form(fn, columns):
    pdf = _ratings_batch()
    (out, events, failed), (want, want_events, _) = _run_both(fn, columns, pdf)
    assert out is not None
    assert len(out) > 0
    pd.testing.assert_frame_equal(out, want)  # payload, _ft_src and (deterministic) _ft_rec
    assert events == want_events
    assert failed == []
    # and the payload is what the function computes on the plain frame (mapInPandas's)
    plain = fn(pdf[["value"]]).reset_index(drop=True)
    pd.testing.assert_frame_equal(out[list(columns)], plain[list(columns)])


def test_bisection_and_failed_rows_keep_the_index_lineage():
    pdf = _ratings_batch()
    bad_movie = int(_parse(pdf)["movieId"].iloc[5])

    def poisoned(part: pd.DataFrame) -> pd.DataFrame:
        out = _parse(part)
        if (out["movieId"] == bad_movie).any():
            raise ValueError("poison")  # bisected down to the poison rows
        transient = (out["movieId"] % 7 == 1).to_numpy()
        if transient.any():
            raise xorack.FailRecord("movie % 7 == 1", rows=transient)
        return out

    (out, events, failed), (want, want_events, want_failed) = _run_both(poisoned, PARSED, pdf)
    assert out is not None
    assert 0 < len(out) < len(pdf)
    pd.testing.assert_frame_equal(out, want)
    assert events == want_events
    assert failed == want_failed
    assert {r for _, r in failed} == {
        "stage parse: ValueError: poison",
        "stage parse: movie % 7 == 1",
    }


def test_several_output_frames_are_each_matched_by_their_index():
    pdf = _ratings_batch()

    def in_pieces(part):
        parsed = _parse(part)
        yield parsed.iloc[::2]
        yield parsed.iloc[1::2]

    (out, events, _), (want, want_events, _) = _run_both(in_pieces, PARSED, pdf)
    pd.testing.assert_frame_equal(out, want)
    assert events == want_events


def test_a_frame_built_from_arrays_with_the_input_index_is_matched():
    def from_arrays(pdf):
        parts = pdf["value"].str.split("::").to_list()
        users = np.array([int(p[0]) for p in parts])
        return pd.DataFrame({"userId": users, "rating": [int(p[2]) for p in parts]}, pdf.index)

    (out, events, _), (want, want_events, _) = _run_both(
        from_arrays, ("userId", "rating"), _ratings_batch()
    )
    pd.testing.assert_frame_equal(out, want)
    assert events == want_events


def test_empty_outputs_need_no_index():
    def nothing(pdf):  # an empty frame whose index is of dtype object
        return pd.DataFrame({"userId": [], "rating": []}, index=[])

    c = _Client()
    assert _runner(nothing, ("userId", "rating")).process(_ratings_batch(), c) is None
    assert len(c.events) == 1  # every input acked as dropped


def _renumbered_after_filter(pdf):
    out = _parse(pdf)
    return out[out["rating"] >= 2].reset_index(drop=True)  # labels 0..m-1, m < n


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_renumbered_after_filter, r"its index was renumbered \(0, 1, 2, \.\.\.\)"),
        (lambda pdf: _parse(pdf).reset_index(drop=True), r"its index was renumbered"),
        (
            lambda pdf: _stars(_parse(pdf)).reset_index(drop=True),
            r"its index was renumbered",
        ),
        (  # a frame of arrays: a RangeIndex, as a merge or ignore_index=True give
            lambda pdf: pd.DataFrame({k: v.to_numpy() for k, v in _parse(pdf).items()}),
            r"its index was renumbered",
        ),
        (
            lambda pdf: _parse(pdf).merge(pd.DataFrame({"movieId": [2, 3]}), on="movieId"),
            r"its index was renumbered",
        ),
        (
            lambda pdf: _parse(pdf).set_index("timestamp", drop=False),
            r"40 of its 40 index labels are not labels of the input frame",
        ),
        (
            lambda pdf: _parse(pdf).set_index(["userId", "movieId"], drop=False),
            r"a MultiIndex",
        ),
        (
            lambda pdf: _parse(pdf).set_axis(np.arange(40) + 0.5),
            r"an index of dtype float64",
        ),
    ],
    ids=[
        "reset-after-filter",
        "reset",
        "reset-after-explode",
        "arrays",
        "merge",
        "own-labels",
        "multiindex",
        "float",
    ],
)
def test_an_output_whose_index_cannot_be_matched_is_refused_naming_the_stage(fn, message):
    with pytest.raises(LineageError, match=r"stage 'parse': the function's output has no "):
        _runner(fn, PARSED).process(_ratings_batch(), _Client())
    with pytest.raises(LineageError, match=message):
        _runner(fn, PARSED).process(_ratings_batch(), _Client())


def test_the_input_labels_are_never_positions():
    # the silent-wrong case: a renumbered output whose labels 0..m-1 would all be valid
    # positions of the input must never be taken for them
    seen = []

    def look(pdf):
        seen.append(pdf.index.to_numpy().copy())
        return pdf

    _runner(look, ("value",)).process(_ratings_batch(), _Client())
    labels = seen[0]
    assert len(labels) == 40
    assert 0 not in labels
    assert (labels == _ratings_batch()[REC].to_numpy()).all()


def test_a_grouped_stage_matches_a_new_frame_by_its_index():
    pdf = _ratings_batch()
    one_record = pdf[pdf[SRC] == pdf[SRC].iloc[0]].reset_index(drop=True)
    outs = []
    for f in (_parse, _carrying(_parse)):
        runner = _runner(f, PARSED, bisect=False, single_record_groups=True)
        outs.append(runner.process(one_record.copy(), _Client()))
    pd.testing.assert_frame_equal(outs[0], outs[1])


# ---- the Arrow stage: _ft_row -------------------------------------------------------------------

WORDS = pa.schema([("id", pa.int64()), ("word", pa.string())])


def _lines_batch(n: int = 12) -> pa.RecordBatch:
    rng = np.random.default_rng(5)
    return pa.record_batch(
        {
            "id": pa.array(np.arange(n), pa.int64()),
            "line": [" ".join(f"w{(i * 7 + j) % 13}" for j in range(i % 4)) for i in range(n)],
            SRC: pa.array(rng.integers(1, 2**62, 4)[np.arange(n) % 4], pa.int64()),
            REC: pa.array(rng.integers(1, 2**62, n), pa.int64()),
        }
    )


def _words_anew(b: pa.RecordBatch) -> pa.RecordBatch:
    """A batch built anew: the words and, in _ft_row, the position of their line."""
    if pc.any(pc.equal(b.column("id"), 7)).as_py():
        raise ValueError("poison line")  # bisected: _ft_row is a position in the part
    words = pc.split_pattern(b.column("line"), " ")
    rows = pc.list_parent_indices(words)
    return pa.record_batch(
        {"id": b.column("id").take(rows), "word": pc.list_flatten(words), "_ft_row": rows}
    )


def _words_carrying(b: pa.RecordBatch) -> pa.RecordBatch:
    out = _words_anew(b)
    rec = b.column(REC).take(out.column("_ft_row"))
    return out.drop_columns(["_ft_row"]).append_column(REC, rec)


def test_an_arrow_batch_built_anew_with_row_positions_is_anchored_as_with_rec():
    results = []
    for fn in (_words_anew, _words_carrying):
        c = _Client()
        out = ArrowStageRunner("split", fn, WORDS, location="unused").process(_lines_batch(), c)
        results.append((pa.Table.from_batches(out), c.events, c.failed))
    (got, events, failed), (want, want_events, want_failed) = results
    assert got.equals(want)
    assert got.num_rows > 10
    assert events == want_events
    assert failed == want_failed
    assert len(failed) == 1


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (pa.array([0, 99], pa.int64()), r"'_ft_row' has 1 position\(s\) outside \[0, 12\)"),
        (pa.array([0, None], pa.int64()), r"'_ft_row' has 1 null"),
        (pa.array(["0", "1"]), r"'_ft_row' has type string"),
    ],
)
def test_bad_row_positions_are_a_clear_error_naming_the_stage(rows, message):
    def bad(b):
        return pa.record_batch({"id": [1, 2], "word": ["a", "b"], "_ft_row": rows})

    runner = ArrowStageRunner("split", bad, WORDS, location="unused")
    with pytest.raises(
        LineageError, match=r"stage 'split': the function's output column " + message
    ):
        runner.process(_lines_batch(), _Client())


# ---- on Spark: the MovieLens parse against plain Spark ------------------------------------------

N = 150
SCORES = "userId long, rating long, score double"
STARS = "userId long, star long"


def _poison_movie(movie: int) -> bool:
    return movie % 23 == 7


def _flaky_parse(pdf: pd.DataFrame) -> pd.DataFrame:
    """_parse, with a poison movie (every attempt) and a transient failure (first round)."""
    out = _parse(pdf)
    if out["movieId"].map(_poison_movie).any():
        raise ValueError("poison movie")
    transient = (out["timestamp"] % 5 == 2).to_numpy() & (out["userId"] % 7 == 1).to_numpy()
    if current_round() == 0 and transient.any():
        raise xorack.FailRecord("injected", rows=transient)
    return out


def _flaky_stars(pdf: pd.DataFrame) -> pd.DataFrame:
    if current_round() == 0 and (pdf["userId"] % 7 == 4).any():
        raise RuntimeError("worker hiccup")  # bisected: only those rows fail, on round 0
    return _stars(pdf)


def _ratings(spark, exclude: frozenset[str] = frozenset()):
    with open(RATINGS) as f:
        lines = [line.rstrip("\n") for _, line in zip(range(N), f, strict=False)]
    rows = [(v,) for v in lines if v not in exclude]
    return spark.createDataFrame(rows, "value string").repartition(3)


def _each(fn):
    """``fn`` as plain ``mapInPandas`` takes it: over an iterator of frames."""

    def over(frames):
        for pdf in frames:
            yield fn(pdf)

    return over


def _rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.mark.spark
def test_new_frame_stages_under_failures_equal_plain_spark(spark, tmp_path):
    from xorack.spark import ParquetSink, Pipeline

    p = Pipeline(spark, max_attempts=2)
    parsed = p.source(_ratings(spark), name="ratings").map_in_pandas(
        _flaky_parse, ", ".join(f"{c} long" for c in PARSED), name="parse"
    )
    scores = parsed.map_in_pandas(_high_scores, SCORES, name="scores")
    stars = scores.map_in_pandas(_flaky_stars, STARS, name="stars")
    stars.sink(ParquetSink(str(tmp_path / "stars")), name="out")
    report = p.run()

    dead = p.dead_letters()
    poisoned = frozenset(dead.column("value").to_pylist())
    assert poisoned
    assert all(_poison_movie(int(v.split("::")[1])) for v in poisoned)
    assert report.lost == 0
    assert report.timed_out == 0
    assert report.dead_lettered == len(poisoned)
    assert report.completed == N - len(poisoned)
    assert report.failed > len(poisoned)  # the transient failures were replayed

    # plain Spark: the same functions in mapInPandas, over the input minus the dead letters
    plain = _ratings(spark, poisoned).mapInPandas(
        _each(_parse), ", ".join(f"{c} long" for c in PARSED)
    )
    plain = plain.mapInPandas(_each(_high_scores), SCORES).mapInPandas(_each(_stars), STARS)
    want = _rows(plain)
    assert sum(want.values()) > N
    assert _rows(spark.read.parquet(str(tmp_path / "stars"))) == want


@pytest.mark.spark
def test_a_renumbered_output_on_spark_is_refused_naming_the_stage(spark, tmp_path):
    from xorack.spark import Pipeline, SQLiteSink

    p = Pipeline(spark)
    parsed = p.source(_ratings(spark), name="ratings").map_in_pandas(
        _renumbered_after_filter, ", ".join(f"{c} long" for c in PARSED), name="parse"
    )
    parsed.sink(SQLiteSink(str(tmp_path / "out.db"), "ratings"), name="out")
    with pytest.raises(Exception, match=r"stage 'parse': .* its index was renumbered"):
        p.run()


def _flaky_words_anew(b: pa.RecordBatch) -> pa.RecordBatch:
    """_words_anew (id 7 is poison), with a transient failure of ids 3, 13, ... on round 0."""
    transient = pc.equal(pc.remainder(b.column("id"), 10), 3)
    if current_round() == 0 and pc.any(transient).as_py():
        raise xorack.FailRecord("injected", rows=transient)
    return _words_anew(b)


@pytest.mark.spark
def test_an_arrow_batch_built_anew_under_failures_equals_plain_spark(spark, tmp_path):
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline

    lines = _lines_batch(60).select(["id", "line"]).to_pandas()
    df = spark.createDataFrame(lines).repartition(2)
    p = Pipeline(spark, max_attempts=2)
    words = p.source(df, name="lines").map_in_arrow(
        _flaky_words_anew, "id long, word string", name="split"
    )
    words.sink(ParquetSink(str(tmp_path / "words")), name="out")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 1
    assert p.dead_letters().column("id").to_pylist() == [7]
    assert report.failed > 1  # the transient failures were replayed

    plain = df.where("id != 7").select("id", F.explode(F.split("line", " ")).alias("word"))
    want = _rows(plain)
    assert sum(want.values()) > 60
    assert _rows(spark.read.parquet(str(tmp_path / "words"))) == want
