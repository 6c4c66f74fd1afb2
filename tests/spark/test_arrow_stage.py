"""The Arrow tracked stage (``Tracked.map_in_arrow``): its mechanics against the pandas stage's
on the same input (no Spark), and on real local Spark a split-words stage written with
``pyarrow.compute`` with transient failures and poison rows, exactly-once in a Parquet and a
SQLite sink, compared with plain Spark and with the pandas stage."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import xorack
from xorack.errors import LineageError
from xorack.spark.arrow_stage import ARROW_ROWS, ArrowStageRunner, settle_batch
from xorack.spark.lineage import EV, KEEP, REC, SRC
from xorack.spark.stages import StageRunner, StageSchemaError, call_bisecting, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 120
POISON = frozenset(i for i in range(N) if i % 25 == 0)
FILTERED = frozenset(i for i in range(N) if i % 17 == 5)  # removed by a native filter


def _line(i: int) -> str:
    return " ".join(f"w{(i * 7 + j) % 13}" for j in range(1 + i % 4))


def _split_arrow(b: pa.RecordBatch) -> pa.RecordBatch:
    words = pc.split_pattern(b.column("line"), " ")
    return b.take(pc.list_parent_indices(words)).append_column("word", pc.list_flatten(words))


def _split_pandas(pdf: pd.DataFrame) -> pd.DataFrame:
    out = pdf.assign(word=pdf["line"].str.split()).explode("word", ignore_index=True)
    return out[out["word"].notna()]


class _Client:
    """Records what a runner sends to the acker."""

    def __init__(self) -> None:
        self.events: list[tuple[list[int], list[int]]] = []
        self.failed: list[tuple[list[int], str]] = []

    def xor(self, src, values) -> None:
        self.events.append((np.asarray(src).tolist(), np.asarray(values).tolist()))

    def fail(self, src, reason: str) -> None:
        self.failed.append((np.asarray(src).tolist(), reason))


def _tracked_batch(n: int = 12, pending: bool = True) -> pa.RecordBatch:
    """n input rows of 4 source records, with pending columns (row 5 a ghost)."""
    rng = np.random.default_rng(7)
    src = rng.integers(1, 2**62, 4)[np.arange(n) % 4]
    rec = rng.integers(1, 2**62, n)
    cols = {
        "id": pa.array(np.arange(n), pa.int64()),
        "line": pa.array([_line(i) for i in range(n)]),
        SRC: pa.array(src, pa.int64()),
        REC: pa.array(rec, pa.int64()),
    }
    if pending:
        ev = np.zeros(n, dtype=np.int64)
        ev[5] = rec[5]  # a native filter removed row 5: it owes its ack
        ev[2] = 12345  # a pending event of a live row
        keep = np.ones(n, dtype=bool)
        keep[5] = False
        cols[EV] = pa.array(ev, pa.int64())
        cols[KEEP] = pa.array(keep)
    return pa.record_batch(cols)


SCHEMA = pa.schema([("id", pa.int64()), ("word", pa.string())])


def _arrow_runner(fn, **kw) -> ArrowStageRunner:
    return ArrowStageRunner("split", fn, SCHEMA, location="unused", **kw)


def _pandas_runner(fn, **kw) -> StageRunner:
    return StageRunner("split", fn, ("id", "word"), location="unused", **kw)


# ---- mechanics, no Spark --------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [True, False])
def test_arrow_stage_anchors_exactly_as_the_pandas_stage(deterministic):
    batch = _tracked_batch()
    a, p = _Client(), _Client()
    out_a = _arrow_runner(_split_arrow, deterministic=deterministic).process(batch, a)
    out_p = _pandas_runner(_split_pandas, deterministic=deterministic).process(batch.to_pandas(), p)
    got = pa.Table.from_batches(out_a).to_pandas()
    assert got[["id", "word"]].equals(out_p[["id", "word"]])
    assert got[SRC].tolist() == out_p[SRC].tolist()
    if deterministic:  # random ids differ by construction; their events are checked below
        assert got[REC].tolist() == out_p[REC].tolist()
        assert a.events == p.events
    assert len(a.events) == len(p.events) == 2  # settle + one anchor call per batch
    assert 5 not in got["id"].tolist()  # the ghost row is dropped


def test_anchor_events_close_every_tree_when_the_outputs_are_acked():
    """The pending events, the anchor events and the acks of the outputs XOR to the births."""
    batch = _tracked_batch()
    c = _Client()
    out = pa.Table.from_batches(_arrow_runner(_split_arrow).process(batch, c))
    src, rec = batch.column(SRC).to_numpy(), batch.column(REC).to_numpy()
    keep = batch.column(KEEP).to_numpy(zero_copy_only=False)
    value: dict[int, int] = {}
    for s, r in zip(src.tolist(), rec.tolist(), strict=True):  # births: the input rows' ids
        value[s] = value.get(s, 0) ^ (r & (2**64 - 1))
    for srcs, vals in c.events:  # the pending events (settled) and the anchor events
        for s, v in zip(srcs, vals, strict=True):
            value[int(np.int64(np.uint64(s)))] ^= v
    for s, r in zip(out.column(SRC).to_pylist(), out.column(REC).to_pylist(), strict=True):
        value[s] ^= r & (2**64 - 1)  # the sink acks each output
    # row 2's pending event was never part of a tree: it stays; every other tree is closed
    assert {s: v for s, v in value.items() if v} == {int(src[2]): 12345}
    assert keep.tolist().count(False) == 1


def test_settle_batch_sends_pending_events_and_drops_ghosts_and_pending_columns():
    batch = _tracked_batch()
    c = _Client()
    out = settle_batch(batch, c, ack_kept=False)
    assert out.schema.names == ["id", "line", SRC, REC]
    assert out.column("id").to_pylist() == [i for i in range(12) if i != 5]
    src = batch.column(SRC).to_numpy().view(np.uint64)
    rec = batch.column(REC).to_numpy().view(np.uint64)
    assert sorted(zip(*c.events[0], strict=True)) == sorted(
        [(int(src[5]), int(rec[5])), (int(src[2]), 12345)]
    )
    no_pending = _tracked_batch(pending=False)
    assert settle_batch(no_pending, c, ack_kept=False) is no_pending


def _raises_on_3(b: pa.RecordBatch) -> pa.RecordBatch:
    if pc.any(pc.equal(b.column("id"), 3)).as_py():
        raise ValueError("three")
    return _split_arrow(b)


def test_a_plain_exception_bisects_the_batch_and_fails_only_its_rows():
    batch = _tracked_batch(pending=False)
    calls: list[int] = []

    def fn(b):
        calls.append(b.num_rows)
        return _raises_on_3(b)

    c = _Client()
    out = pa.Table.from_batches(_arrow_runner(fn).process(batch, c))
    src3 = int(batch.column(SRC).to_numpy().view(np.uint64)[3])
    assert c.failed == [([src3], "stage split: ValueError: three")]
    # rows of the failed source record (3, 7, 11) are dropped with it; the others went through
    assert sorted(set(out.column("id").to_pylist())) == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert calls[0] == 12
    assert len(calls) <= 2 * int(np.ceil(np.log2(12))) + 1


def test_call_bisecting_cuts_record_batches_like_frames():
    b = pa.record_batch({"x": [1, 2, 3, 4]})

    def f(part):
        if pc.any(pc.equal(part.column("x"), 3)).as_py():
            raise ValueError("three")
        return part

    outs, failed = call_bisecting(f, b, "demo", rows=ARROW_ROWS)
    assert sorted(pa.Table.from_batches(outs).column("x").to_pylist()) == [1, 2, 4]
    assert [(p.tolist(), r) for p, r in failed] == [([2], "ValueError: three")]


@pytest.mark.parametrize("as_mask", [True, False])
def test_fail_record_rows_as_arrow_mask_or_positions_fail_those_rows_and_rerun_the_others(
    as_mask,
):
    batch = _tracked_batch(pending=False)
    calls: list[list[int]] = []

    def fn(b):
        calls.append(b.column("id").to_pylist())
        bad = pc.equal(pc.bit_wise_and(b.column("id"), 1), 1)  # odd ids
        if pc.any(bad).as_py():
            rows = bad if as_mask else pa.array(np.flatnonzero(bad.to_numpy(False)))
            raise xorack.FailRecord("odd", rows=rows)
        return _split_arrow(b)

    c = _Client()
    _arrow_runner(fn).process(batch, c)
    assert calls == [list(range(12)), [0, 2, 4, 6, 8, 10]]  # once whole, once the rest
    src = batch.column(SRC).to_numpy().view(np.uint64)
    assert c.failed == [(sorted(set(src[1::2].tolist())), "stage split: odd")]


def test_fail_record_output_hands_over_the_other_rows_in_one_call():
    """``FailRecord(rows=..., output=...)``: one call per batch; the output given (here the
    whole batch's, the failing rows' words included) is taken for the other rows and the
    failing rows' outputs are dropped: the same rows, failures and events as the second call
    gives without ``output``. Its ``_ft_row`` positions are the call's, as a return's."""
    batch = _tracked_batch(pending=False)
    calls: list[int] = []

    def odd(b):
        return pc.equal(pc.bit_wise_and(b.column("id"), 1), 1)

    def rerun(b):
        calls.append(b.num_rows)
        if pc.any(odd(b)).as_py():
            raise xorack.FailRecord("odd", rows=odd(b))
        return _split_arrow(b)

    def handed(b):
        calls.append(b.num_rows)
        words = pc.split_pattern(b.column("line"), " ")
        rows = pc.list_parent_indices(words)
        out = b.select(["id"]).take(rows).append_column("word", pc.list_flatten(words))
        raise xorack.FailRecord("odd", rows=odd(b), output=out.append_column("_ft_row", rows))

    want, c1 = _arrow_runner(rerun).process(batch, c1 := _Client()), c1
    assert calls == [12, 6]
    calls.clear()
    got, c2 = _arrow_runner(handed).process(batch, c2 := _Client()), c2
    assert calls == [12]  # one call
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(want))
    assert (c2.failed, c2.events) == (c1.failed, c1.events)


def test_fail_record_output_needs_rows_and_a_group_fails_whole():
    pdf = pd.DataFrame({"x": [1, 2, 3]})

    def no_rows(df):
        raise xorack.FailRecord("which?", output=df)

    with pytest.raises(StageSchemaError, match=r"FailRecord\(output=\.\.\.\) without rows"):
        call_bisecting(no_rows, pdf, "s")

    def one_bad(df):
        raise xorack.FailRecord("two", rows=(df.x == 2).to_numpy(), output=df[df.x != 2])

    outs, failed = call_bisecting(one_bad, pdf, "s", bisect=False)  # a group: one unit
    assert outs == []
    assert [(p.tolist(), r) for p, r in failed] == [([0, 1, 2], "two")]
    import pickle

    e = pickle.loads(pickle.dumps(xorack.FailRecord("why", rows=[1], output=[5])))
    assert (str(e), e.rows, e.output) == ("why", [1], [5])


def test_fail_record_output_from_a_generator_or_as_an_iterator_is_refused():
    """A generator that yields batches and then raises ``FailRecord(output=...)`` would lose
    what it yielded; an iterator as ``output`` would run user code whose errors pass for the
    rows': both are a ``StageSchemaError`` naming the stage, in both runners."""
    pdf = pd.DataFrame({"x": [1, 2, 3, 4]})

    def yields_then_fails(df):
        yield df.iloc[:2]
        raise xorack.FailRecord("three", rows=[1], output=df.iloc[3:])

    def iterator_output(df):
        raise xorack.FailRecord("two", rows=(df.x == 2).to_numpy(), output=iter([df]))

    with pytest.raises(StageSchemaError, match="raised by a generator"):
        call_bisecting(yields_then_fails, pdf, "s")
    with pytest.raises(StageSchemaError, match="got an iterator"):
        call_bisecting(iterator_output, pdf, "s")

    def yields_then_fails_arrow(b):
        yield _split_arrow(b.slice(0, 2))
        raise xorack.FailRecord("odd", rows=[3], output=_split_arrow(b.slice(3)))

    def iterator_output_arrow(b):
        raise xorack.FailRecord("odd", rows=[1], output=iter([_split_arrow(b)]))

    batch = _tracked_batch(pending=False)
    with pytest.raises(StageSchemaError, match=r"stage 'split'.*raised by a generator"):
        _arrow_runner(yields_then_fails_arrow).process(batch, _Client())
    with pytest.raises(StageSchemaError, match=r"stage 'split'.*got an iterator"):
        _arrow_runner(iterator_output_arrow).process(batch, _Client())


def test_a_generator_raising_fail_record_rows_without_output_is_called_again_on_the_rest():
    calls = []

    def gen(df):
        calls.append(df.x.tolist())
        yield df.iloc[:1]
        if (df.x == 1).any():
            raise xorack.FailRecord("x", rows=[0])

    outs, failed = call_bisecting(gen, pd.DataFrame({"x": [1, 2, 3, 4]}), "s")
    assert calls == [[1, 2, 3, 4], [2, 3, 4]]  # what it yielded before is not kept: called again
    assert [(p.tolist(), r) for p, r in failed] == [([0], "x")]
    assert pd.concat(outs).x.tolist() == [2]


def _no_rec(b):
    return _split_arrow(b).drop_columns([REC])


def _rec_as_string(b):
    out = _split_arrow(b)
    i = out.schema.get_field_index(REC)
    return out.set_column(i, REC, pc.cast(out.column(REC), pa.string()))


def _word_as_list(b):
    words = pc.split_pattern(b.column("line"), " ")
    return b.append_column("word", words)


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        (_no_rec, LineageError, r"stage 'split': the function's output has no '_ft_rec'"),
        (_rec_as_string, LineageError, r"stage 'split': .*'_ft_rec' has type string"),
        (_word_as_list, StageSchemaError, r"stage 'split': output column 'word' has type list"),
        (lambda b: b, StageSchemaError, r"stage 'split': .*lacks declared column\(s\) \['word'\]"),
        (lambda b: b.to_pandas(), StageSchemaError, r"stage 'split': .*RecordBatches.*DataFrame"),
    ],
)
def test_bad_output_is_a_clear_error_naming_the_stage(fn, error, message):
    with pytest.raises(error, match=message):
        _arrow_runner(fn).process(_tracked_batch(), _Client())


def test_an_iterable_of_batches_is_one_output():
    def in_pieces(b):
        out = _split_arrow(b)
        yield out.slice(0, 5)
        yield pa.Table.from_batches([out.slice(5)])  # a Table counts as its batches

    whole = _arrow_runner(_split_arrow).process(_tracked_batch(), _Client())
    pieces = _arrow_runner(in_pieces).process(_tracked_batch(), _Client())
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches(whole))


def test_a_safe_type_difference_is_cast_to_the_declared_type():
    def fn(b):
        out = _split_arrow(b)
        return out.set_column(0, "id", pc.cast(out.column("id"), pa.int32()))

    out = _arrow_runner(fn).process(_tracked_batch(), _Client())
    assert out[0].schema.field("id").type == pa.int64()


# ---- on Spark ----------------------------------------------------------------------------------


def _lines(spark, n: int = N):
    return spark.createDataFrame([(i, _line(i)) for i in range(n)], "id long, line string")


def _flaky_poisoned_split(b: pa.RecordBatch) -> pa.RecordBatch:
    ids = b.column("id")
    if pc.any(pc.equal(pc.remainder(ids, 25), 0)).as_py():
        raise ValueError("poison record")  # bisected down to the poison rows
    transient = pc.equal(pc.remainder(ids, 10), 3)
    if current_round() == 0 and pc.any(transient).as_py():
        raise xorack.FailRecord("injected: id % 10 == 3", rows=transient)
    return _split_arrow(b)


def _expected(spark, exclude: frozenset[int]) -> Counter:
    """Plain Spark: the (id, word) pairs of the lines minus ``exclude``, without 'w0'."""
    from pyspark.sql import functions as F

    df = _lines(spark).where(~F.col("id").isin(sorted(exclude)))
    df = df.select("id", F.explode(F.split("line", " ")).alias("word")).where("word != 'w0'")
    return Counter(map(tuple, df.collect()))


def _pairs(rows) -> Counter:
    return Counter((int(r[0]), str(r[1])) for r in rows)


def _word_pipeline(spark, tmp_path, split, stage="arrow", ft=True, tag="", **kw):
    from pyspark.sql import functions as F

    from xorack.spark import ParquetSink, Pipeline, SQLiteSink

    p = Pipeline(spark, ft=ft, **kw)
    lines = p.source(_lines(spark), name="lines", keys=["id"], partitions=2)
    lines = lines.filter(F.col("id") % 17 != 5)  # ghosts reach the stage: acked, not timed out
    if stage == "arrow":
        words = lines.map_in_arrow(split, "id long, word string", name="split")
    else:
        words = lines.map_in_pandas(split, "id long, word string", name="split")
    words = words.filter(F.col("word") != "w0")
    sqlite = SQLiteSink(str(tmp_path / f"words{tag}.db"), "words")
    parquet = ParquetSink(str(tmp_path / f"words{tag}.parquet"))
    words.sink(sqlite, name="sqlite")
    words.sink(parquet, name="parquet")
    return p, sqlite, parquet


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
@pytest.mark.spark
def test_arrow_split_with_failures_and_poison_is_exactly_once_in_parquet_and_sqlite(
    spark, tmp_path
):
    p, sqlite, parquet = _word_pipeline(spark, tmp_path, _flaky_poisoned_split, max_attempts=3)
    report = p.run()
    assert report.lost == 0
    assert report.source_records == N
    assert report.dead_lettered == len(POISON)
    assert report.completed == N - len(POISON)
    assert report.timed_out == 0  # the filtered rows were acked as dropped
    transient = sum(1 for i in range(N) if i % 10 == 3 and i not in FILTERED | POISON)
    assert report.failed >= transient + len(POISON)
    assert sorted(p.dead_letters().column("id").to_pylist()) == sorted(POISON)

    want = _expected(spark, POISON | FILTERED)
    assert sum(want.values()) > 100
    assert _pairs(sqlite.read()[["id", "word"]].itertuples(index=False)) == want
    assert _pairs(parquet.read(spark).select("id", "word").collect()) == want


@pytest.mark.spark
def test_ft_off_equals_ft_on_and_the_pandas_stage(spark, tmp_path):
    results = []
    for i, (stage, split, ft) in enumerate(
        [
            ("arrow", _split_arrow, True),
            ("arrow", _split_arrow, False),
            ("pandas", _split_pandas, True),
        ]
    ):
        p, sqlite, parquet = _word_pipeline(spark, tmp_path, split, stage=stage, ft=ft, tag=str(i))
        report = p.run()
        if ft:
            assert report.lost == 0
            assert report.completed == N
            assert report.rounds == 1
        results.append(
            (
                _pairs(sqlite.read()[["id", "word"]].itertuples(index=False)),
                _pairs(parquet.read(spark).select("id", "word").collect()),
            )
        )
    want = _expected(spark, FILTERED)
    assert all(r == (want, want) for r in results)


@pytest.mark.spark
def test_bad_output_on_spark_is_an_error_naming_the_stage(spark, tmp_path):
    p, _, _ = _word_pipeline(spark, tmp_path, _no_rec)
    with pytest.raises(Exception, match=r"stage 'split': the function's output has no '_ft_rec'"):
        p.run()


def test_map_in_arrow_checks_its_declaration(spark):
    from xorack.spark import Pipeline

    p = Pipeline(spark)
    lines = p.source(_lines(spark), name="lines")
    with pytest.raises(TypeError, match="map_in_arrow: fn must be callable"):
        lines.map_in_arrow("split", "word string")
    with pytest.raises(StageSchemaError, match="lineage columns added by xorack"):
        lines.map_in_arrow(_split_arrow, "word string, _ft_rec long")
    lines.map_in_arrow(_split_arrow, "id long, word string", name="split")
    with pytest.raises(StageSchemaError, match="name 'split' is already used"):
        lines.map_in_arrow(_split_arrow, "id long, word string", name="split")


def _typo(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.append_column("n", pc.utf8_length(b.column("lines")))  # 'lines': it is 'line'


@pytest.mark.spark
def test_a_systematic_error_in_an_arrow_stage_stops_the_run(spark, tmp_path):
    from xorack.spark import Pipeline, RunawayFailure, SQLiteSink

    p = Pipeline(spark)
    src = p.source(_lines(spark), name="lines")
    src.map_in_arrow(_typo, "id long, n int", name="count_chars").sink(
        SQLiteSink(str(tmp_path / "t.db"), "t")
    )
    with pytest.raises(RunawayFailure) as err:
        p.run()
    message = str(err.value)
    assert "stage 'count_chars'" in message
    assert "KeyError" in message
    assert f"{N} of {N}" in message
