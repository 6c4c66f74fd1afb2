"""TimeoutWheel: the rotating timeout buckets (the intent of the seed's RotatingHashMapTest)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import NATIVE_MISSING
from xorack import kernels
from xorack.acker import TimeoutWheel


def rotations_until_expiry(w: TimeoutWheel, key: int, limit: int = 50) -> int | None:
    for r in range(1, limit + 1):
        if key in w.rotate().tolist():
            return r
    return None


@pytest.mark.parametrize("num_buckets", [1, 2, 3, 7])
def test_expires_exactly_after_num_buckets_rotations(backend, num_buckets):
    w = TimeoutWheel(num_buckets, backend=backend)
    w.add([11, 12, 13])
    for _ in range(num_buckets - 1):
        assert w.rotate().tolist() == []
    assert sorted(w.rotate().tolist()) == [11, 12, 13]
    assert len(w) == 0
    assert w.rotate().tolist() == []


def test_ids_added_at_different_rotations_expire_in_turn(backend):
    w = TimeoutWheel(3, backend=backend)
    w.add([5])
    w.rotate()
    w.add([4, 6])
    w.rotate()
    w.add([1])
    assert w.rotate().tolist() == [5]
    assert sorted(w.rotate().tolist()) == [4, 6]
    assert w.rotate().tolist() == [1]


def test_removed_ids_never_expire(backend):
    w = TimeoutWheel(2, backend=backend)
    w.add([1, 2, 3])
    w.discard([2, 99])  # absent ids are ignored
    assert 2 not in w
    w.rotate()
    assert sorted(w.rotate().tolist()) == [1, 3]
    for _ in range(5):
        assert w.rotate().tolist() == []


def test_touch_restarts_the_timeout(backend):
    w = TimeoutWheel(3, backend=backend)
    w.add([1, 2])
    w.rotate()
    w.rotate()
    w.touch([2, 42])  # 42 is absent: ignored, never added
    assert 42 not in w
    assert w.rotate().tolist() == [1]
    assert w.rotate().tolist() == []
    assert w.rotate().tolist() == [2]  # touched at rotation 2: expires at 2 + 3


def test_adding_a_present_id_restarts_it_like_touch(backend):
    w = TimeoutWheel(2, backend=backend)
    w.add([8])
    w.rotate()
    w.add([8, 8])
    assert len(w) == 1
    assert rotations_until_expiry(w, 8) == 2


def test_touch_many_times_within_one_rotation(backend):
    w = TimeoutWheel(2, backend=backend)
    w.add([3])
    for _ in range(5):
        w.touch([3, 3])
    assert rotations_until_expiry(w, 3) == 2
    assert len(w) == 0


def test_len_contains_and_memory(backend):
    n = 100_000 if backend == "native" else 5_000
    w = TimeoutWheel(3, backend=backend)
    empty = w.nbytes
    ids = np.arange(1, n + 1, dtype=np.uint64)
    w.add(ids)
    assert len(w) == n
    assert 1 in w
    assert (n + 1) not in w
    assert 0 not in w
    assert "a" not in w
    full = w.nbytes
    assert full > empty
    w.discard(ids[: n - 10])
    assert len(w) == 10
    assert w.nbytes < full / 4
    for _ in range(2):
        assert w.rotate().size == 0
    assert sorted(w.rotate().tolist()) == ids[n - 10 :].tolist()


def test_bad_input_is_a_clear_error(backend):
    with pytest.raises(ValueError, match="num_buckets must be > 0"):
        TimeoutWheel(0, backend=backend)
    with pytest.raises(ValueError, match="num_buckets"):
        TimeoutWheel(-3, backend=backend)
    with pytest.raises(TypeError, match="num_buckets must be an int"):
        TimeoutWheel(2.5, backend=backend)
    with pytest.raises(TypeError, match="num_buckets must be an int"):
        TimeoutWheel(True, backend=backend)
    with pytest.raises(ValueError, match="2\\*\\*15"):
        TimeoutWheel(2**15, backend=backend)
    assert TimeoutWheel(2**15 - 1, backend=backend).num_buckets == 2**15 - 1
    w = TimeoutWheel(backend=backend)
    assert w.num_buckets == 3
    with pytest.raises(ValueError, match="ids contains id 0"):
        w.add([1, 0])
    with pytest.raises(TypeError, match="ids must be uint64"):
        w.touch([1.5])
    with pytest.raises(ValueError, match="non-negative"):
        w.discard([-4])
    assert len(w) == 0


@pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
def test_raw_native_wheel_defends_itself():
    raw = kernels.get_impl("native")
    with pytest.raises(ValueError, match="num_buckets"):
        raw.TimeoutWheel(0)
    w = raw.TimeoutWheel(2)
    with pytest.raises(TypeError, match="ids must be uint64"):
        w.add(np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="id 0"):
        w.add(np.zeros(3, dtype=np.uint64))
    assert len(w) == 0


def test_raw_module_refuses_id_0_everywhere(backend):
    # Issue 11, defect 10: discard([0]) on the raw native wheel lowered len while every id
    # still expired. Both backends' raw modules refuse id 0 before any change.
    raw = kernels.get_impl(backend).TimeoutWheel(2)
    raw.add(np.array([3, 4], dtype=np.uint64))
    for op in ("add", "touch", "discard"):
        with pytest.raises(ValueError, match="id 0"):
            getattr(raw, op)(np.array([3, 0], dtype=np.uint64))
    with pytest.raises(ValueError, match="nonzero id"):
        raw.contains(0)
    assert len(raw) == 2
    raw.rotate()
    assert sorted(raw.rotate().tolist()) == [3, 4]
    assert len(raw) == 0


def test_random_churn_matches_a_dict_model(backend):
    # Large enough for long probe runs and wrap-around in the native table's bulk expiry.
    rng = np.random.default_rng(11)
    n = 20_000 if backend == "native" else 3_000
    w = TimeoutWheel(4, backend=backend)
    deadline: dict[int, int] = {}
    pool = rng.integers(1, 2**64, size=n, dtype=np.uint64)
    for rotation in range(1, 26):  # the counter reached by this iteration's rotate()
        add = pool[rng.integers(0, n, size=n // 4)]
        w.add(add)
        deadline.update(dict.fromkeys(add.tolist(), rotation - 1 + 4))
        touch = pool[rng.integers(0, n, size=n // 8)]
        w.touch(touch)
        for k in touch.tolist():
            if k in deadline:
                deadline[k] = rotation - 1 + 4
        gone = pool[rng.integers(0, n, size=n // 8)]
        w.discard(gone)
        for k in gone.tolist():
            deadline.pop(k, None)
        expected = sorted(k for k, d in deadline.items() if d == rotation)
        for k in expected:
            del deadline[k]
        assert sorted(w.rotate().tolist()) == expected
        assert len(w) == len(deadline)
    assert all(k in w for k in list(deadline)[:100])


def test_re_adding_present_ids_does_not_inflate_memory(backend):
    w = TimeoutWheel(3, backend=backend)
    ids = np.arange(1, 20_001, dtype=np.uint64)
    w.add(ids)
    first = w.nbytes
    for _ in range(5):
        w.add(ids)  # restarts, no new entries
    assert len(w) == ids.size
    assert w.nbytes <= first


def test_deadlines_wrap_around_the_16_bit_counter(backend):
    # Deadlines are kept modulo 2**16: expiry stays exact across the wrap, and with the largest
    # num_buckets.
    w = TimeoutWheel(3, backend=backend)
    for _ in range(2**16 - 2):
        w.rotate()
    w.add([5])
    w.rotate()
    w.add([6])
    assert w.rotate().tolist() == []  # counter at 2**16: deadlines 1 and 2 (mod 2**16) ahead
    assert w.rotate().tolist() == [5]
    assert w.rotate().tolist() == [6]
    big = TimeoutWheel(2**15 - 1, backend=backend)
    big.add([9])
    for _ in range(2**15 - 2):
        assert big.rotate().size == 0
    assert big.rotate().tolist() == [9]


def test_touched_many_times_then_discarded_never_expires(backend):
    w = TimeoutWheel(3, backend=backend)
    w.add([1, 2])
    for _ in range(4):  # touches across and within rotations
        w.touch([1, 1, 2])
        w.touch([1])
        assert w.rotate().size == 0
    w.discard([1])
    assert 1 not in w
    assert len(w) == 1
    expired = [w.rotate().tolist() for _ in range(5)]
    assert expired == [[], [2], [], [], []]  # last touched at rotation 3: expires at 3 + 3


def test_re_adding_an_expired_id_starts_a_new_timeout(backend):
    w = TimeoutWheel(2, backend=backend)
    w.add([7, 8])
    w.rotate()
    assert sorted(w.rotate().tolist()) == [7, 8]
    assert 7 not in w
    w.touch([7])  # expired ids are absent: touch ignores them
    assert 7 not in w
    w.add([7])
    assert len(w) == 1
    assert w.rotate().size == 0
    assert w.rotate().tolist() == [7]
    assert len(w) == 0


def test_bulk_expiry_keeps_every_survivor_reachable(backend):
    # The native rotate compacts every probe run at once (long runs included at its 0.8-0.9
    # load); each survivor must stay findable and expire exactly on time afterwards.
    n = 150_000 if backend == "native" else 6_000
    rng = np.random.default_rng(12)
    ids = np.unique(rng.integers(1, 2**64, size=n, dtype=np.uint64))
    w = TimeoutWheel(3, backend=backend)
    thirds = np.array_split(ids, 3)
    for part in thirds:
        w.add(part)
        w.rotate()
    # Now thirds[0] expired at the third rotate; thirds[1] and thirds[2] wait.
    kept = np.concatenate(thirds[1:])
    assert len(w) == kept.size
    assert all(int(k) in w for k in kept)
    assert not any(int(k) in w for k in thirds[0][:1000])
    w.touch(thirds[2][::2])
    assert np.array_equal(np.sort(w.rotate()), np.sort(thirds[1]))
    assert all(int(k) in w for k in thirds[2])
    assert np.array_equal(np.sort(w.rotate()), np.sort(thirds[2][1::2]))
    assert np.array_equal(np.sort(w.rotate()), np.sort(thirds[2][::2]))
    assert len(w) == 0
