"""Stage mechanics that need no Spark: deterministic source ids and batch bisection."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xorack
from xorack.spark.ids import ContentRanks, content_ids, ordinals, with_lineage
from xorack.spark.stages import call_bisecting


def _ids(batch: pa.RecordBatch, ranks: ContentRanks | None = None) -> np.ndarray:
    return content_ids(batch, ranks or ContentRanks(), 0, 0, 3, salt=11)


def test_source_ids_follow_content_not_position():
    # a Spark task retry may read the rows of a partition in another order (shuffle fetch
    # order): each row must get its id back, or an idempotent sink would absorb a different row
    words = ["alpha", "beta", "gamma", "delta", "beta"]
    batch = pa.record_batch({"w": words, "n": [1, 2, 3, 4, 2]})
    perm = np.array([4, 2, 0, 3, 1])
    shuffled = batch.take(pa.array(perm))
    a, b = _ids(batch), _ids(shuffled)
    by_content_a = sorted(zip(words, [1, 2, 3, 4, 2], a.tolist(), strict=True))
    by_content_b = sorted(
        zip(np.array(words)[perm], np.array([1, 2, 3, 4, 2])[perm], b.tolist(), strict=True)
    )
    assert by_content_a == by_content_b  # identical rows may swap ids: they are the same row
    assert len(set(a.tolist())) == len(words)  # the two identical rows still get two ids
    assert a.all()


def test_source_ids_differ_for_different_content_and_places():
    batch = pa.record_batch({"w": ["alpha", "beta"]})
    other = pa.record_batch({"w": ["beta", "alpha2"]})
    a, b = _ids(batch), _ids(other)
    assert a[1] == b[0]  # "beta": same content, same place -> same id, wherever it sits
    assert a[0] not in b  # different content -> different ids
    assert b[1] not in a
    ranks = ContentRanks()
    part3 = content_ids(batch, ranks, 0, 0, 3, salt=11)
    part4 = content_ids(batch, ContentRanks(), 0, 0, 4, salt=11)
    batch1 = content_ids(batch, ContentRanks(), 1, 0, 3, salt=11)
    assert not set(part3.tolist()) & set(part4.tolist())
    assert not set(part3.tolist()) & set(batch1.tolist())


def test_identical_rows_across_batches_of_a_task_get_distinct_ids():
    ranks = ContentRanks()
    row = pa.record_batch({"w": ["same"] * 3})
    first = content_ids(row, ranks, 0, 0, 0, salt=1)
    second = content_ids(row, ranks, 0, 0, 0, salt=1)
    assert len(set(first.tolist()) | set(second.tolist())) == 6
    # the same six rows split differently over batches get the same six ids
    again = ContentRanks()
    whole = content_ids(pa.record_batch({"w": ["same"] * 6}), again, 0, 0, 0, salt=1)
    assert set(whole.tolist()) == set(first.tolist()) | set(second.tolist())


def test_content_hash_takes_nested_types():
    batch = pa.record_batch({"xs": pa.array([[1, 2], [3], [1, 2]])})
    ids = _ids(batch)
    assert len(set(ids.tolist())) == 3


def test_fail_record_naming_one_row_per_call_does_not_recurse():
    # a validator that reports only the first bad row each time it is called: one FailRecord
    # per bad row, thousands of them in one batch
    pdf = pd.DataFrame({"v": np.arange(4000)})
    bad_rows = set(range(0, 4000, 2))

    def first_bad_only(df: pd.DataFrame) -> pd.DataFrame:
        bad = df["v"].isin(bad_rows).to_numpy()
        if bad.any():
            raise xorack.FailRecord("odd one out", rows=[int(np.flatnonzero(bad)[0])])
        return df

    outs, failed = call_bisecting(first_bad_only, pdf, "validate")
    kept = pd.concat(outs)["v"].tolist()
    failed_rows = sorted(int(r) for pos, _ in failed for r in pos)
    assert sorted(kept) == list(range(1, 4000, 2))
    assert failed_rows == sorted(bad_rows)


def test_plain_exception_is_bisected_to_the_failing_rows():
    pdf = pd.DataFrame({"v": np.arange(100)})

    def boom(df: pd.DataFrame) -> pd.DataFrame:
        if (df["v"] % 37 == 5).any():
            raise RuntimeError("bad value")
        return df

    outs, failed = call_bisecting(boom, pdf, "s")
    assert sorted(int(r) for pos, _ in failed for r in pos) == [5, 42, 79]
    assert len(pd.concat(outs)) == 97
    assert all(reason == "RuntimeError: bad value" for _, reason in failed)


@pytest.mark.parametrize("rows", [[True], [7], "abc"])
def test_bad_rows_value_names_the_stage(rows):
    pdf = pd.DataFrame({"v": [1, 2]})

    def fn(df):
        raise xorack.FailRecord("x", rows=rows)

    with pytest.raises(ValueError, match="stage 'named'"):
        call_bisecting(fn, pdf, "named")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.integers(1, 6), st.integers(1, 2**64 - 1)), max_size=40),
        max_size=6,
    )
)
def test_content_ranks_count_the_earlier_rows_of_the_same_hash(batches):
    """Every row's rank is the number of rows of the same hash before it in the task, whichever
    path a batch takes (all distinct and new, or with repeats)."""
    ranks, seen = ContentRanks(), Counter()
    for values in batches:
        h = np.array(values, dtype=np.uint64)
        want = []
        for v in values:
            want.append(seen[v])
            seen[v] += 1
        assert ranks(h).tolist() == want


@given(st.lists(st.integers(0, 6), max_size=40), st.sampled_from(["any", "sorted", "strict"]))
@settings(max_examples=300, deadline=None)
def test_output_ordinals_rank_siblings_in_output_order(parents, order):
    """Each output's rank among the outputs of its parent, whether the outputs come in input
    order (the one-pass path), one per parent at most and in order (a map, a filter: all
    zero at once) or in any order (the sorted path)."""
    if order == "strict":
        parents = sorted(set(parents))
    parent = np.array(sorted(parents) if order == "sorted" else parents, dtype=np.int64)
    seen: Counter = Counter()
    expected = []
    for p in parent.tolist():
        expected.append(seen[p])
        seen[p] += 1
    assert ordinals(parent).tolist() == expected
    assert ordinals(parent).dtype == np.uint64


def test_lineage_columns_are_added_without_touching_the_functions_frame():
    frame = pd.DataFrame(
        {"w": ["a", "b", "c"], "n": pd.array([1, None, 3], dtype="Int64"), "_ft_rec": [1, 2, 3]},
        index=[5, 5, 9],
    )
    before = frame.copy()
    src = np.array([7, 7, 8], dtype=np.uint64)
    rec = np.array([2**63 + 1, 4, 5], dtype=np.uint64)
    out = with_lineage(frame.iloc[[2, 0]], ["w", "n"], src[:2], rec[:2])
    assert list(out.columns) == ["w", "n", "_ft_src", "_ft_rec"]
    assert out.index.tolist() == [0, 1]
    assert out["w"].tolist() == ["c", "a"]
    assert out["n"].dtype == "Int64"
    assert out["_ft_rec"].to_numpy().view(np.uint64).tolist() == [2**63 + 1, 4]
    pd.testing.assert_frame_equal(frame, before)


@given(st.lists(st.lists(st.integers(1, 40), max_size=60), max_size=6))
def test_content_ranks_count_the_earlier_rows_of_each_hash_across_batches(batches):
    # a naive count per hash over the task's rows, batch after batch
    ranks, seen = ContentRanks(), Counter()
    for values in batches:
        h = np.array(values, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # spread out
        expected = []
        for v in h.tolist():
            expected.append(seen[v])
            seen[v] += 1
        assert ranks(h).tolist() == expected


def test_a_keyed_sources_ids_do_not_depend_on_its_partitions(service):
    """The tagger of a source hash-partitioned by its keys (a barrier's output is one) gives a
    row the same id in whichever partition it is read (its identical rows always share one),
    so a second run whose barrier output went on in fewer partitions re-creates the ids of
    the first; without keys, the partition is part of the id."""
    from xorack.spark.stages import PART
    from xorack.spark.tagging import SourceTagger

    rows = {"w": ["a", "b", "a"], "n": [1, 2, 1]}

    def ids(keys: tuple[str, ...], partition: int) -> list[int]:
        batch = pa.record_batch({**rows, PART: pa.array([partition] * 3, pa.int32())})
        tagger = SourceTagger("s", 0, keys, service.location)
        return [x for b in tagger(iter([batch])) for x in b.column("_ft_rec").to_pylist()]

    keyed = [ids(("w",), part) for part in (0, 3)]
    assert keyed[0] == keyed[1]
    assert len(set(keyed[0])) == 3  # the two identical rows are told apart by their rank
    plain = [ids((), part) for part in (0, 3)]
    assert not set(plain[0]) & set(plain[1])


@given(
    ids=st.lists(st.integers(1, 2**64 - 1), unique=True, max_size=50),
    shape=st.sampled_from(["same", "filter", "take", "renumbered"]),
    data=st.data(),
)
@settings(max_examples=300, deadline=None)
def test_parents_of_equals_the_parent_index_kernel(ids, shape, data):
    """The identity fast path (an output carrying the input's ids as they came) gives what the
    ``parent_index`` kernel gives on every backend, and any other output goes to the kernel:
    a filter, rows taken in any order and repeated, ids the input does not hold (an error)."""
    from xorack import acker
    from xorack.kernels import native_available
    from xorack.spark.ids import parents_of

    rec = np.array(ids, dtype=np.uint64)
    n = len(ids)
    if shape == "same":
        pos = list(range(n))
    elif shape == "filter":
        pos = sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else [])
    else:
        pos = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)) if n else []
    out = rec[np.array(pos, dtype=np.int64)] if pos else np.empty(0, np.uint64)
    if shape == "renumbered":  # an id no input holds (0 is never an id)
        out = np.append(out, np.uint64(0))
    backends = ["native", "python"] if native_available() else ["python"]
    for backend in backends:
        try:
            want = acker.parent_index(rec, out, backend=backend)
        except xorack.LineageError as exc:
            for fresh in (False, True):
                with pytest.raises(xorack.LineageError, match=str(exc)[:20]):
                    parents_of(rec, out, fresh)
            continue
        for fresh in (False, True):
            got = parents_of(rec, out, fresh)
            assert got.dtype == np.int64
            assert got.tolist() == want.tolist() == pos


def test_parents_of_keeps_the_repeated_input_check_unless_the_ids_are_fresh():
    """Input ids that repeat (an upstream that duplicated rows unseen) are an error even when
    the output carries them as they came; ids drawn for the batch itself skip the check."""
    from xorack.spark.ids import parents_of

    rec = np.array([7, 9, 7], dtype=np.uint64)
    with pytest.raises(ValueError, match="repeats an earlier one"):
        parents_of(rec, rec)
    assert parents_of(rec, rec, fresh=True).tolist() == [0, 1, 2]


def test_ordinals_of_uint64_positions_rank_as_int64():
    parent = np.array([3, 1, 3], dtype=np.uint64)
    assert ordinals(parent).tolist() == [0, 0, 1]
