"""The shared input helpers of ``xorack._checks`` against numpy's own answers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from xorack._checks import count_distinct, sorted_distinct

_IDS = st.lists(st.integers(0, 2**64 - 1), max_size=300)


@given(_IDS, st.integers(0, 6))
def test_count_distinct_is_numpys_unique_count(values, repeats):
    # values repeated and in runs, as ids drawn in sequential blocks come
    ids = np.array(values + values[:repeats] + sorted(values)[:repeats], dtype=np.uint64)
    assert count_distinct(ids) == len(np.unique(ids))
    assert count_distinct(ids.view(np.int64)) == len(np.unique(ids))
    assert sorted_distinct(ids).tolist() == np.unique(ids).tolist()
