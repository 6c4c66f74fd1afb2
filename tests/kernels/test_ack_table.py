"""AckTable: the XOR acker table (the seed's AckerTable and FTLayerTest sequences, table level)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import NATIVE_MISSING
from xorack import kernels
from xorack.acker import AckTable


def u64(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.uint64)


# --- FTLayerTest sequences ------------------------------------------------------------------------


def test_acked_on_the_last_xor_only(backend):
    # Source 100 is born with record 1; record 1 makes 2 and 3; 2 makes 4; then all are acked.
    t = AckTable(backend=backend)
    assert t.register([100], [1]).tolist() == []
    steps = [1 ^ 2 ^ 3, 2 ^ 4, 3, 4]
    for i, ev in enumerate(steps):
        done = t.xor([100], [ev]).tolist()
        assert done == ([100] if i == len(steps) - 1 else []), i
    assert 100 not in t
    assert len(t) == 0


def test_records_of_several_sources_interleaved(backend):
    t = AckTable(backend=backend)
    t.register([1, 2, 3], [11, 22, 33])
    assert t.xor([1, 2], [11 ^ 5, 22]).tolist() == [2]
    assert t.xor([3, 1], [0, 6]).tolist() == []
    assert t.value(1) == 5 ^ 6
    assert t.xor([1, 3], [5 ^ 6, 33]).tolist() == [1, 3]


def test_early_events_wait_for_register(backend):
    t = AckTable(backend=backend)
    assert t.xor([7], [3]).tolist() == []  # the event overtook the register
    assert 7 in t
    assert t.value(7) == 3
    assert t.register([7], [3 ^ 9]).tolist() == []
    assert t.value(7) == 9
    assert t.xor([7], [9]).tolist() == [7]


def test_register_completes_at_once_when_early_events_cancel_the_birth(backend):
    t = AckTable(backend=backend)
    t.xor([7, 8], [3, 4])
    assert t.register([8, 7], [4, 3]).tolist() == [8, 7]
    assert len(t) == 0


def test_fresh_birth_zero_waits_for_an_event(backend):
    t = AckTable(backend=backend)
    assert t.register([5], [0]).tolist() == []
    assert t.value(5) == 0
    assert t.xor([5], [0]).tolist() == [5]


def test_register_of_a_registered_id_xors_the_birth_in(backend):
    t = AckTable(backend=backend)
    t.register([5], [12])
    assert t.register([5], [3]).tolist() == []
    assert t.value(5) == 12 ^ 3
    assert t.register([5], [12 ^ 3]).tolist() == [5]


def test_unregistered_entry_back_at_zero_is_dropped_silently(backend):
    t = AckTable(backend=backend)
    assert t.xor([9], [4]).tolist() == []
    assert t.xor([9], [4]).tolist() == []  # a duplicated pair of events: never reported
    assert 9 not in t
    assert t.xor([9, 9], [6, 6]).tolist() == []  # the same within one call
    assert len(t) == 0


def test_events_of_a_key_are_combined_within_a_call(backend):
    t = AckTable(backend=backend)
    t.register([1], [10])
    # 1 passes through 0 mid-call but ends at 3: not complete, not removed.
    assert t.xor([1, 1], [10, 3]).tolist() == []
    assert t.value(1) == 3


def test_register_takes_its_pairs_one_after_the_other(backend):
    # Issue 11, defect 11: one call register([5, 5], [3, 3]) completed nothing while two calls
    # completed 5. A register call is its pairs as separate calls, in order.
    one, two = AckTable(backend=backend), AckTable(backend=backend)
    assert one.register([5, 5], [3, 3]).tolist() == [5]
    assert two.register([5], [3]).tolist() == []
    assert two.register([5], [3]).tolist() == [5]
    assert len(one) == len(two) == 0
    # A third pair registers 5 afresh (it completed at the second), like a third call would.
    t = AckTable(backend=backend)
    assert t.register([5, 4, 5, 5], [3, 1, 3, 7]).tolist() == [5]
    assert (t.value(5), t.value(4)) == (7, 1)
    # Early events then two registers: the first completes, the second is a fresh record.
    t = AckTable(backend=backend)
    t.xor([9], [6])
    assert t.register([9, 9], [6, 2]).tolist() == [9]
    assert t.value(9) == 2
    # Births that cancel: the second register completes it, whatever its birth value.
    t = AckTable(backend=backend)
    assert t.register([4, 4], [0, 0]).tolist() == [4]


def test_completed_ids_come_in_order_of_last_occurrence(backend):
    t = AckTable(backend=backend)
    t.register([1, 2, 3], [5, 6, 7])
    # 1 reaches 0 at its second event (position 2), after 2 did: it completes there.
    assert t.xor([1, 2, 1, 3], [1, 6, 4, 7]).tolist() == [2, 1, 3]
    # 2 passes through 0 (completed, then back): only its last occurrence counts.
    t.register([2], [6])
    assert t.xor([2, 2, 2], [6, 1, 1]).tolist() == [2]
    t.register([2, 3], [6, 7])
    assert t.xor([2, 3, 2, 2], [6, 7, 1, 0]).tolist() == [3]
    assert t.value(2) == 1
    # A 0 event after its completion moves the completion to that later occurrence.
    t.register([5, 6], [0, 0])
    assert t.xor([5, 6, 5], [0, 0, 0]).tolist() == [6, 5]
    t.register([4, 5], [8, 9])
    assert t.xor([5, 4], [9, 8]).tolist() == [5, 4]


def test_values_may_be_zero(backend):
    t = AckTable(backend=backend)
    t.register([3], [6])
    assert t.xor([3], [0]).tolist() == []
    assert t.value(3) == 6


# --- fail, lookups, snapshot ----------------------------------------------------------------------


def test_fail_reports_presence_and_removes(backend):
    t = AckTable(backend=backend)
    t.register([1, 2], [3, 4])
    t.xor([9], [1])  # early entry
    present = t.fail([2, 5, 9, 2])
    assert present.dtype == np.bool_
    assert present.tolist() == [True, False, True, True]
    assert len(t) == 1
    assert 2 not in t
    assert 9 not in t
    assert t.value(1) == 3


def test_lookups(backend):
    t = AckTable(backend=backend)
    t.register([2**64 - 1], [2**63])
    assert (2**64 - 1) in t
    assert t.value(2**64 - 1) == 2**63
    assert t.value(17) is None
    assert 0 not in t
    assert -1 not in t
    assert "x" not in t
    assert 2**64 not in t
    with pytest.raises(ValueError, match="src"):
        t.value(0)
    with pytest.raises(TypeError, match="src"):
        t.value(1.5)


def test_snapshot_restore_round_trip(backend):
    t = AckTable(backend=backend)
    t.register([30, 10, 20], [1, 0, 3])
    t.xor([40], [7])
    keys, values, registered = t.snapshot()
    assert keys.tolist() == [10, 20, 30, 40]
    assert values.tolist() == [0, 3, 1, 7]
    assert registered.tolist() == [True, True, True, False]
    t2 = AckTable.restore(keys, values, registered, backend=backend)
    assert len(t2) == 4
    assert t2.register([40], [7]).tolist() == [40]  # still unregistered before
    assert t2.xor([30, 10], [1, 0]).tolist() == [30, 10]


def test_restore_rejects_inconsistent_snapshots(backend):
    with pytest.raises(ValueError, match="unique"):
        AckTable.restore([1, 1], [2, 3], [True, True], backend=backend)
    with pytest.raises(ValueError, match="id 0"):
        AckTable.restore([0], [2], [True], backend=backend)
    with pytest.raises(ValueError, match="unregistered"):
        AckTable.restore([1], [0], [False], backend=backend)
    with pytest.raises(TypeError, match="registered must be bool"):
        AckTable.restore([1], [2], [1], backend=backend)
    with pytest.raises(ValueError, match="length mismatch"):
        AckTable.restore([1, 2], [2], [True, True], backend=backend)


def test_grows_and_shrinks_with_its_content(backend):
    n = 200_000 if backend == "native" else 5_000
    t = AckTable(backend=backend)
    empty = t.nbytes
    ids = np.arange(1, n + 1, dtype=np.uint64)
    births = ids * np.uint64(3)
    t.register(ids, births)
    full = t.nbytes
    assert len(t) == n
    assert full > empty
    done = t.xor(ids[::-1], births[::-1])
    assert done.tolist() == ids[::-1].tolist()
    assert len(t) == 0
    assert t.nbytes < full / 4


def test_random_churn_matches_a_dict_model(backend):
    rng = np.random.default_rng(7)
    t = AckTable(backend=backend)
    model: dict[int, int] = {}
    for _ in range(30):
        new = rng.integers(1, 2**63, size=300, dtype=np.uint64)
        births = rng.integers(0, 2**63, size=300, dtype=np.uint64)
        t.register(new, births)
        model.update(zip(new.tolist(), births.tolist(), strict=True))
        keys = np.array(list(model), dtype=np.uint64)
        pick = keys[rng.integers(0, keys.size, size=400)]
        vals = np.array([model[k] for k in pick.tolist()], dtype=np.uint64)
        vals[rng.random(400) < 0.5] = 1  # some events do not finish their source
        done = t.xor(pick, vals).tolist()
        expected = []
        acc: dict[int, int] = {}
        for k, v in zip(pick.tolist(), vals.tolist(), strict=True):
            acc[k] = acc.get(k, 0) ^ v
        for k in list(dict.fromkeys(pick.tolist()[::-1]))[::-1]:  # by last occurrence
            model[k] ^= acc[k]
            if model[k] == 0:
                del model[k]
                expected.append(k)
        assert done == expected
        assert len(t) == len(model)


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_a_clear_error(backend):
    t = AckTable(backend=backend)
    with pytest.raises(ValueError, match="src_ids contains id 0 at position 1"):
        t.register([1, 0], [1, 2])
    with pytest.raises(ValueError, match="src_ids contains id 0"):
        t.xor([0], [1])
    with pytest.raises(ValueError, match="src_ids contains id 0"):
        t.fail([0])
    with pytest.raises(TypeError, match="src_ids must be uint64, got float64"):
        t.xor(np.array([1.0]), [1])
    with pytest.raises(TypeError, match="values must be uint64"):
        t.xor([1], ["a"])
    with pytest.raises(ValueError, match="length mismatch"):
        t.xor([1, 2], [1])
    with pytest.raises(ValueError, match="births must be non-negative"):
        t.register([1], [-1])
    with pytest.raises(ValueError, match="1-D"):
        t.xor(np.ones((2, 2), dtype=np.uint64), [1, 2])
    assert len(t) == 0  # nothing half-applied


def test_lists_and_non_contiguous_arrays_are_accepted(backend):
    t = AckTable(backend=backend)
    ids = np.arange(1, 21, dtype=np.uint64)[::2]
    t.register(ids, ids)
    assert sorted(t.xor(list(ids.tolist()), ids).tolist()) == ids.tolist()
    assert t.register(np.array([], dtype=np.uint64), []).tolist() == []
    assert t.xor([], []).dtype == np.uint64


@pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
def test_raw_native_table_defends_itself():
    raw = kernels.get_impl("native").AckTable()
    with pytest.raises(TypeError, match="src_ids must be uint64, got int64"):
        raw.xor(np.array([1]), np.array([1], dtype=np.uint64))
    with pytest.raises(ValueError, match="C-contiguous"):
        raw.xor(np.arange(1, 5, dtype=np.uint64)[::2], np.zeros(2, dtype=np.uint64))
    with pytest.raises(ValueError, match="id 0"):
        raw.register(np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.uint64))
    with pytest.raises(ValueError, match="length mismatch"):
        raw.xor(np.ones(2, dtype=np.uint64), np.ones(1, dtype=np.uint64))
    with pytest.raises(TypeError):
        raw.xor([1], [1])
    assert len(raw) == 0


def test_raw_module_refuses_id_0_everywhere(backend):
    # Issue 11, defect 10: the raw native table said contains(0) on an empty table, and fail([0])
    # reported True and lowered len. Both backends' raw modules refuse id 0 before any change.
    raw = kernels.get_impl(backend).AckTable()
    zero = np.zeros(1, dtype=np.uint64)
    raw.register(u64(7), u64(1))
    for call in (
        lambda: raw.contains(0),
        lambda: raw.get(0),
        lambda: raw.fail(u64(7, 0)),
        lambda: raw.xor(zero, zero),
        lambda: raw.register(u64(8, 0), u64(1, 1)),
    ):
        with pytest.raises(ValueError, match=r"id 0|nonzero id"):
            call()
    assert len(raw) == 1
    assert raw.get(7) == 1
    assert not raw.contains(8)


def test_lists_of_large_ids_are_exact(backend):
    # np.asarray([1, 2**64 - 1]) is float64: lists must still be taken exactly.
    t = AckTable(backend=backend)
    big = [1, 2**64 - 1, 2**63 + 12345]
    t.register(big, [2**64 - 2, 5, 2**63])
    assert t.value(2**64 - 1) == 5
    assert t.xor(big, [2**64 - 2, 5, 2**63]).tolist() == big
    with pytest.raises(ValueError, match="non-negative"):
        t.xor([-1, 2**63], [1, 1])
    with pytest.raises(ValueError, match="< 2\\*\\*64"):
        t.xor([1, 2**64], [1, 1])


def test_concurrent_threads_share_a_table_safely(backend):
    # Native batch calls run without the GIL: calls on one table from several threads must be
    # serialized (no crash, no lost update). Each thread owns its ids; all must complete.
    import threading

    t = AckTable(backend=backend)
    n_threads, per = 4, 2_000
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            ids = np.arange(1, per + 1, dtype=np.uint64) + np.uint64(k * per)
            t.register(ids, ids)
            half = ids[: per // 2]
            for _ in range(3):
                t.xor(half, half)  # completes them, then a duplicated pair (dropped)
            t.xor(ids[per // 2 :], ids[per // 2 :])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(t) == 0


def test_expire_unregistered_bounds_the_life_of_early_entries(backend):
    t = AckTable(backend=backend)
    t.register([1], [5])
    t.xor([7, 8], [3, 4])  # early (or duplicated-after-completion) events
    assert t.expire_unregistered() == 0  # they are young: aged, not dropped
    assert t.value(7) == 3
    t.xor([9, 7], [6, 1])  # 9 is new (young); 7 stays old, updated in place
    assert t.value(7) == 2
    assert t.register([8], [4]).tolist() == [8]  # an old entry still meets its register
    assert t.expire_unregistered() == 1  # 7 dropped; 9 ages
    assert 7 not in t
    assert t.value(9) == 6
    assert t.value(1) == 5  # registered ids never expire here
    assert t.fail([9]).tolist() == [True]
    assert t.expire_unregistered() == 0
    assert len(t) == 1
    t.xor([12], [2])
    t.expire_unregistered()
    keys, _, registered = t.snapshot()  # old entries are in snapshots too
    assert keys.tolist() == [1, 12]
    assert registered.tolist() == [True, False]
    assert t.xor([12], [2]).tolist() == []  # back at 0: dropped silently
    assert len(t) == 1


@pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
def test_a_batch_bigger_than_the_table_makes_room_once():
    """The native table probes a batch in hash order; grown step by step inside one big batch,
    its first hashes would pack into one long run (a quadratic register). It makes room for the
    batch first: one growth, whatever the batch size (the wheel alike; early events too, which
    the property tests compare with the fallback)."""
    from xorack.acker import TimeoutWheel

    ids = np.arange(1, 200_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    table, wheel, early = (
        AckTable(backend="native"),
        TimeoutWheel(3, backend="native"),
        AckTable(backend="native"),
    )
    table.register(ids, ids)
    wheel.add(ids)
    early.xor(ids, ids)  # all unknown: early events
    for t in (table, wheel, early):
        assert t._impl.debug_counters()["grows"] <= 1, t._impl.debug_counters()


@pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
def test_table_and_wheel_hold_32_bytes_per_pending_id_at_every_size():
    """Memory per pending source record (AckTable + TimeoutWheel, both grown in 64 K batches as
    a running acker grows them) stays within the 32-byte target at every size from 512 K to
    1.4 M ids, not only where one benchmark stops: right after each resize the loads are their
    targets, the worst point of the growth cycle. (Smaller tables also pay their spare slots,
    at most 1024 each: 0.4 B per id at 64 K.) Memory is deterministic, so this is a test, not a
    benchmark."""
    from xorack.acker import TimeoutWheel

    rng = np.random.default_rng(5)
    ids = rng.integers(1, 2**64, size=1_400_000, dtype=np.uint64)
    table, wheel = AckTable(backend="native"), TimeoutWheel(3, backend="native")
    worst = (0.0, 0)
    for lo in range(0, ids.size, 1 << 16):
        batch = ids[lo : lo + (1 << 16)]
        table.register(batch, batch)
        wheel.add(batch)
        n = lo + batch.size
        if n >= 1 << 19:
            worst = max(worst, ((table.nbytes + wheel.nbytes) / n, n))
    assert worst[0] <= 32.0, f"{worst[0]:.2f} bytes per pending id at {worst[1]:,} ids"
