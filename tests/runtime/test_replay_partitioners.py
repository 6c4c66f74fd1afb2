"""Replay partitioners: each assigns what its definition says, hash replay equals Spark's
partition ids (via spark_partition_ids), native == fallback, bad specs and inputs error clearly."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xorack
from xorack import kernels
from xorack.replay import (
    BroadcastReplayPartitioner,
    ForwardReplayPartitioner,
    HashReplayPartitioner,
    ReplayPartitioner,
    RoundRobinReplayPartitioner,
    ShuffleReplayPartitioner,
    SingleReplayPartitioner,
    replay_partitioner_from_spec,
)

NATIVE = pytest.mark.skipif(
    not kernels.native_available(),
    reason="native extension not built (pure-Python install): nothing to compare the fallback to",
)


def _batch(n: int, seed: int = 0, parts: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    key_hash = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    partition = rng.integers(0, parts, n).astype(np.int32)
    return key_hash, partition


def test_hash_is_spark_partition_of_the_stored_key_hash(backend):
    keys = pa.array(["a", "bb", None, "ccc", "é"] * 20)
    key_hash = xorack.murmur3_hash(keys, backend=backend)
    rows, parts = HashReplayPartitioner(7).assign(key_hash, np.full(100, -1), backend=backend)
    np.testing.assert_array_equal(rows, np.arange(100))
    assert rows.dtype == np.int64
    assert parts.dtype == np.int32
    np.testing.assert_array_equal(parts, xorack.spark_partition_ids(keys, 7, backend=backend))
    extremes = np.array([-(2**31), -1, 0, 2**31 - 1, -7, 7], np.int32)
    _, p = HashReplayPartitioner(7).assign(extremes, np.zeros(6, np.int32), backend=backend)
    assert p.tolist() == [int(h) % 7 for h in extremes]  # Python's % is Java's pmod for n > 0


def test_round_robin_continues_across_calls(backend):
    p = RoundRobinReplayPartitioner(3, start=1)
    kh, part = _batch(4)
    assert p.assign(kh, part, backend=backend)[1].tolist() == [1, 2, 0, 1]
    assert p.assign(kh[:2], part[:2], backend=backend)[1].tolist() == [2, 0]
    assert p.assign(kh[:0], part[:0], backend=backend)[1].tolist() == []
    assert p.assign(kh[:1], part[:1], backend=backend)[1].tolist() == [1]


def test_round_robin_is_thread_safe():
    p = RoundRobinReplayPartitioner(5)
    kh, part = _batch(7)
    results = []

    def worker():
        for _ in range(50):
            results.append(p.assign(kh, part)[1])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = np.bincount(np.concatenate(results), minlength=5)
    assert counts.tolist() == [4 * 50 * 7 // 5] * 5  # 1400 positions: exactly even


def test_forward_keeps_the_original_partition(backend):
    kh, part = _batch(50)
    rows, parts = ForwardReplayPartitioner().assign(kh, part, backend=backend)
    np.testing.assert_array_equal(rows, np.arange(50))
    np.testing.assert_array_equal(parts, part)
    part[17] = -1
    with pytest.raises(ValueError, match="record 17 has partition -1"):
        ForwardReplayPartitioner().assign(kh, part, backend=backend)
    part[17] = 4
    with pytest.raises(ValueError, match=r"record 17 has partition 4, expected in \[0, 4\)"):
        ForwardReplayPartitioner(4).assign(kh, part, backend=backend)


def test_single_and_broadcast(backend):
    kh, part = _batch(3)
    rows, parts = SingleReplayPartitioner().assign(kh, part, backend=backend)
    assert rows.tolist() == [0, 1, 2]
    assert parts.tolist() == [0, 0, 0]
    rows, parts = BroadcastReplayPartitioner(3).assign(kh, part, backend=backend)
    assert rows.dtype == np.int64
    assert parts.dtype == np.int32
    assert rows.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert parts.tolist() == [0, 1, 2] * 3


def test_shuffle_is_seeded_reproducible_and_spread(backend):
    kh, part = _batch(20_000)
    a = ShuffleReplayPartitioner(8, seed=7)
    first = a.assign(kh, part, backend=backend)[1]
    second = a.assign(kh, part, backend=backend)[1]
    assert not np.array_equal(first, second)  # the stream goes on
    b = ShuffleReplayPartitioner(8, seed=7)  # same seed, same call sizes: same partitions
    np.testing.assert_array_equal(b.assign(kh, part, backend=backend)[1], first)
    c = ShuffleReplayPartitioner(8, seed=7)  # ... however the batches are split
    split = np.concatenate(
        [
            c.assign(kh[:5], part[:5], backend=backend)[1],
            c.assign(kh[5:], part[5:], backend=backend)[1],
        ]
    )
    np.testing.assert_array_equal(split, first)
    other = ShuffleReplayPartitioner(8, seed=8).assign(kh, part, backend=backend)[1]
    assert np.mean(other == first) < 0.2
    counts = np.bincount(first, minlength=8)
    assert counts.min() > 2300  # 2500 expected per partition
    assert counts.max() < 2700


@NATIVE
@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(0, 300),
    n=st.integers(1, 2**31 - 1),
    seed=st.integers(0, 2**64 - 1),
    counter=st.integers(0, 2**64 - 1),
    start_frac=st.floats(0, 0.999),
)
def test_raw_partition_kernels_native_equals_fallback(count, n, seed, counter, start_frac):
    native, python = kernels.get_impl("native"), kernels.get_impl("python")
    rng = np.random.default_rng(seed % 2**32)
    h = rng.integers(-(2**31), 2**31, count, dtype=np.int64).astype(np.int32)
    np.testing.assert_array_equal(native.pmod_partition(h, n), python.pmod_partition(h, n))
    start = int(start_frac * n)
    np.testing.assert_array_equal(
        native.round_robin_partition(count, n, start), python.round_robin_partition(count, n, start)
    )
    np.testing.assert_array_equal(
        native.shuffle_partition(count, n, seed, counter),
        python.shuffle_partition(count, n, seed, counter),
    )
    small = n % 5 + 1
    for a, b in zip(
        native.broadcast_partition(count, small),
        python.broadcast_partition(count, small),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


def test_pmod_inplace_updates_the_given_array(backend):
    h = np.array([-1, 5, -(2**31)], np.int32)
    out = kernels.get_impl(backend).pmod_partition(h, 3, True)
    assert h.tolist() == [2, 2, 1]
    assert out.tolist() == [2, 2, 1]


@pytest.mark.parametrize(
    ("spec", "cls", "n"),
    [
        ("hash:4", HashReplayPartitioner, 4),
        ("roundrobin:4", RoundRobinReplayPartitioner, 4),
        ("forward", ForwardReplayPartitioner, None),
        ("forward:3", ForwardReplayPartitioner, 3),
        ("single", SingleReplayPartitioner, 1),
        ("broadcast:4", BroadcastReplayPartitioner, 4),
        ("shuffle:4:7", ShuffleReplayPartitioner, 4),
    ],
)
def test_spec_round_trip(spec, cls, n):
    p = replay_partitioner_from_spec(spec)
    assert isinstance(p, cls)
    assert isinstance(p, ReplayPartitioner)
    assert p.num_partitions == n
    assert p.spec == spec
    assert replay_partitioner_from_spec(p.spec).spec == spec
    assert spec in repr(p)


@pytest.mark.parametrize(
    ("spec", "exc", "match"),
    [
        ("fields:4", ValueError, "unknown replay partitioner spec 'fields:4'.*'hash'"),
        ("hash", ValueError, "expected 'hash:N'"),
        ("hash:4:5", ValueError, "expected 'hash:N'"),
        ("single:2", ValueError, "expected 'single'"),
        ("hash:four", ValueError, "'four' is not an integer"),
        ("hash:0", ValueError, "num_partitions must be > 0"),
        ("broadcast:-2", ValueError, "num_partitions must be > 0"),
        ("shuffle:4:-1", ValueError, "seed must be in"),
        ("roundrobin:4:9", ValueError, "start must be in"),
        (4, TypeError, "spec must be a str"),
    ],
)
def test_bad_specs(spec, exc, match):
    with pytest.raises(exc, match=match):
        replay_partitioner_from_spec(spec)


@pytest.mark.parametrize(
    ("key_hash", "partition", "exc", "match"),
    [
        (np.zeros(3, np.int32), np.zeros(2, np.int32), ValueError, "length mismatch"),
        (np.zeros(2, np.float64), np.zeros(2, np.int32), TypeError, "key_hash must be int32"),
        (np.array([2**31, 0]), np.zeros(2, np.int32), ValueError, "key_hash must be in"),
        (np.zeros(2, np.int32), np.array([0, -2]), ValueError, r"partition must be in \[-1"),
        (np.zeros((2, 2), np.int32), np.zeros(2, np.int32), ValueError, "key_hash must be 1-D"),
        (5, np.zeros(2, np.int32), TypeError, "key_hash must be a 1-D array"),
    ],
)
def test_bad_assign_inputs(backend, key_hash, partition, exc, match):
    with pytest.raises(exc, match=match):
        HashReplayPartitioner(4).assign(key_hash, partition, backend=backend)


def test_lists_and_other_int_dtypes_are_accepted(backend):
    _, parts = HashReplayPartitioner(4).assign([7, -3], [-1, 2], backend=backend)
    assert parts.tolist() == [3, 1]
    _, parts = HashReplayPartitioner(4).assign(
        np.array([7], np.int64), np.array([0], np.int8), backend=backend
    )
    assert parts.tolist() == [3]


def test_constructor_errors():
    with pytest.raises(TypeError, match="num_partitions must be an int"):
        HashReplayPartitioner(2.5)
    with pytest.raises(ValueError, match="num_partitions must be <="):
        BroadcastReplayPartitioner(2**31)
    with pytest.raises(TypeError, match="seed must be an int"):
        ShuffleReplayPartitioner(4, seed="x")
    with pytest.raises(ValueError, match="unknown backend"):
        SingleReplayPartitioner().assign([1], [0], backend="gpu")
