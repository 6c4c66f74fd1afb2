"""``split_by_shard`` (the client's grouping of XOR events by acker shard): native == fallback,
and both agree with ``shard_of``, the map every shard and client shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import NATIVE_MISSING
from xorack import kernels
from xorack.sharding import scatter_by_shard, shard_of, split_by_shard

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


# ---- scatter_by_shard: a batch appended to per-shard buffers (a coalescing client's) --------


def _buffers(count: int, fill: list[int], room: list[int]):
    """Per-shard buffers holding ``fill[k]`` old rows (k * 1000 + row) and ``room[k]`` free."""
    out = [
        np.array([k * 1000 + j for j in range(fill[k])] + [0] * room[k], np.uint64)
        for k in range(count)
    ]
    vals = [o ^ np.uint64(3) for o in out]
    return out, vals, np.array(fill, np.int64)


@settings(max_examples=150, deadline=None)
@given(
    ids=ids,
    count=st.integers(1, 9),
    chunk_bits=st.integers(0, 10),
    data=st.data(),
)
def test_scatter_appends_each_shards_events_in_order_or_nothing(ids, count, chunk_bits, data):
    fill = data.draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
    room = data.draw(st.lists(st.integers(0, 60), min_size=count, max_size=count))
    values = ids ^ np.uint64(0xA5)
    with np.errstate(over="ignore"):
        owner = shard_of(ids << np.uint64(chunk_bits), count)
    fits = all(int((owner == k).sum()) <= room[k] for k in range(count))
    results = []
    for backend in ALL_BACKENDS:
        out, vals, f = _buffers(count, fill, room)
        before, before_vals = [o.copy() for o in out], [v.copy() for v in vals]
        got = scatter_by_shard(ids, values, out, vals, f, chunk_bits, backend=backend)
        assert got == fits
        for k in range(count):
            mine = owner == k if fits else np.zeros(len(ids), bool)  # refused: nothing moves
            assert int(f[k]) == fill[k] + int(mine.sum())
            assert out[k].tolist()[: f[k]] == before[k].tolist()[: fill[k]] + ids[mine].tolist()
            assert vals[k].tolist()[: f[k]] == (
                before_vals[k].tolist()[: fill[k]] + values[mine].tolist()
            )
            assert out[k].tolist()[f[k] :] == before[k].tolist()[f[k] :]  # nothing past fill
        results.append(([o.tolist() for o in out], [v.tolist() for v in vals], f.tolist()))
    assert all(r == results[0] for r in results)  # native == fallback


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_scatter_arguments_are_clear_errors(backend):
    out, vals, fill = _buffers(2, [0, 0], [4, 4])
    with pytest.raises(TypeError, match="ids must be uint64"):
        scatter_by_shard(np.array([1.5]), [1], out, vals, fill, backend=backend)
    with pytest.raises(ValueError, match="length"):
        scatter_by_shard([1, 2], [1], out, vals, fill, backend=backend)
    with pytest.raises(ValueError, match="shard count"):
        scatter_by_shard([1], [1], [], [], np.zeros(0, np.int64), backend=backend)
    with pytest.raises(ValueError, match="as many buffers"):
        scatter_by_shard([1], [1], out, vals[:1], fill, backend=backend)
    with pytest.raises(TypeError, match="fill must be a writeable contiguous int64"):
        scatter_by_shard([1], [1], out, vals, np.zeros(2, np.int32), backend=backend)
    with pytest.raises(TypeError, match="out_ids must hold uint64 arrays"):
        scatter_by_shard([1], [1], [out[0], out[1].astype(np.int64)], vals, fill, backend=backend)
    read_only = out[1].copy()
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match="writeable contiguous 1-d"):
        scatter_by_shard([1], [1], [out[0], read_only], vals, fill, backend=backend)
    with pytest.raises(ValueError, match="same length per shard"):
        scatter_by_shard([1], [1], out, [vals[0], vals[1][:2]], fill, backend=backend)
    with pytest.raises(ValueError, match="fill must be in"):
        scatter_by_shard([1], [1], out, vals, np.array([0, 9], np.int64), backend=backend)
    with pytest.raises(ValueError, match="chunk_bits"):
        scatter_by_shard([1], [1], out, vals, fill, chunk_bits=11, backend=backend)
    with pytest.raises(TypeError, match="lists"):
        scatter_by_shard([1], [1], tuple(out), vals, fill, backend=backend)
    with pytest.raises(ValueError, match="must not share memory"):  # one buffer, two shards
        scatter_by_shard([1], [1], [out[0], out[0]], vals, fill, backend=backend)
    with pytest.raises(ValueError, match="must not share memory"):  # ids and values alike
        scatter_by_shard([1], [1], [out[0], vals[1]], vals, fill, backend=backend)
    with pytest.raises(ValueError, match="must not share memory"):  # the fill inside a buffer
        scatter_by_shard([1], [1], out, vals, out[1][:2].view(np.int64), backend=backend)
    with pytest.raises(ValueError, match="ids and values must not share memory"):
        scatter_by_shard(out[0][:1], [1], out, vals, fill, backend=backend)
    assert fill.tolist() == [0, 0]  # none of these wrote anything
