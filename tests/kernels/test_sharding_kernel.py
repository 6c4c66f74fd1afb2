"""``split_by_shard`` (the client's grouping of XOR events by acker shard): native == fallback,
and both agree with ``shard_of``, the map every shard and client shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import NATIVE_MISSING
from xorack import kernels
from xorack.sharding import shard_of, split_by_shard

needs_native = pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
ALL_BACKENDS = ["native", "python"] if kernels.native_available() else ["python"]

ids = st.lists(st.one_of(st.integers(1, 5000), st.integers(1, 2**64 - 1)), max_size=200).map(
    lambda xs: np.array(xs, dtype=np.uint64)
)


@settings(max_examples=150, deadline=None)
@given(ids=ids, count=st.integers(1, 17), chunk_bits=st.integers(0, 10))
def test_events_are_grouped_by_their_shard_in_their_order(ids, count, chunk_bits):
    values = ids ^ np.uint64(0x5A5A)
    with np.errstate(over="ignore"):
        owner = shard_of(ids << np.uint64(chunk_bits), count)
    for backend in ALL_BACKENDS:
        s, v, off = split_by_shard(ids, values, count, chunk_bits, backend=backend)
        assert off.tolist()[0] == 0
        assert off.tolist()[-1] == len(ids)
        assert len(off) == count + 1
        for k in range(count):
            assert s[off[k] : off[k + 1]].tolist() == ids[owner == k].tolist()
            assert v[off[k] : off[k + 1]].tolist() == values[owner == k].tolist()


@needs_native
@settings(max_examples=100, deadline=None)
@given(ids=ids, count=st.integers(1, 1024), chunk_bits=st.integers(0, 10))
def test_native_and_fallback_split_alike(ids, count, chunk_bits):
    values = ids[::-1].copy()
    native = split_by_shard(ids, values, count, chunk_bits, backend="native")
    python = split_by_shard(ids, values, count, chunk_bits, backend="python")
    for a, b in zip(native, python, strict=True):
        assert a.tolist() == b.tolist()
        assert a.dtype == b.dtype


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_split_arguments_are_clear_errors(backend):
    with pytest.raises(TypeError, match="ids must be uint64"):
        split_by_shard(np.array([1.5]), [1], 2, backend=backend)
    with pytest.raises(ValueError, match="length"):
        split_by_shard([1, 2], [1], 2, backend=backend)
    with pytest.raises(ValueError, match="shard count"):
        split_by_shard([1], [1], 0, backend=backend)
    with pytest.raises(ValueError, match="chunk_bits"):
        split_by_shard([1], [1], 2, chunk_bits=11, backend=backend)
