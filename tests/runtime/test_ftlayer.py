"""FTLayer: the seed's FTLayerTest scenarios and the runtime's contract, on both storages and
both kernel backends. Time is a ManualClock; timeouts advance by calling rotate()."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from xorack import FTLayer, FTStats, ManualClock, StorageError
from xorack.protocol import REPLAY_COLUMNS
from xorack.replay import (
    BroadcastReplayPartitioner,
    ShuffleReplayPartitioner,
)
from xorack.storage import MemoryStorage, SQLiteStorage

FT_COLUMNS = list(REPLAY_COLUMNS)  # _ft_src, _ft_rec, ..., _ft_origin_rec, ..., _ft_partition


@pytest.fixture(params=["memory", "sqlite"])
def storage_spec(request, tmp_path) -> str:
    return "memory" if request.param == "memory" else f"sqlite:///{tmp_path}/ft.db"


@pytest.fixture
def make_ft(storage_spec, backend):
    made: list[FTLayer] = []

    def make(**kw) -> FTLayer:
        kw.setdefault("clock", ManualClock())
        kw.setdefault("default_partitions", 4)
        ft = FTLayer(kw.pop("storage", storage_spec), backend=backend, **kw)
        made.append(ft)
        return ft

    yield make
    for ft in made:
        ft.close()


def batch(*values) -> pa.RecordBatch:
    return pa.record_batch({"v": list(values), "s": [f"r{v}" for v in values]})


def replays(ft: FTLayer, source: int = 0) -> pa.Table:
    """All waiting replays of a source, as one table (partitions concatenated)."""
    tables = list(ft.take_replays(source).values())
    return pa.concat_tables(tables) if tables else None


# ---------------------------------------------------------------- the seed's FTLayerTest


def test_seed_without_fail_acked_on_last_xor_only(make_ft):
    ft = make_ft()
    (src,) = ft.persist(batch(1))  # births come as events (Storm's spout emit)
    r1, r2 = 0x1111, 0x2222
    assert ft.xor([src], [r1]).size == 0  # the source emits record r1
    assert ft.xor([src], [r2]).size == 0  # a task emits child r2 of r1 ...
    assert ft.xor([src], [r1]).size == 0  # ... and acks r1
    assert ft.xor([src], [r2]).tolist() == [src]  # the sink acks r2: processed
    s = ft.stats()
    assert (s.persisted, s.completed, s.pending, s.replayed) == (1, 1, 0, 0)
    assert len(ft.storage) == 0


def test_seed_with_fail_replays_same_bytes_key_hash_and_source(make_ft):
    ft = make_ft()
    (src,) = ft.persist(batch(7), key_hash=[12345], source=1, births=[0xAB])
    (new,) = ft.fail([src], reason="user function failed")
    assert new != src
    rep = replays(ft, source=1)
    assert rep.num_rows == 1
    row = rep.to_pylist()[0]
    assert (row["v"], row["s"]) == (7, "r7")  # the same payload
    assert row["_ft_src"] == new
    assert row["_ft_key_hash"] == 12345
    assert row["_ft_origin"] == src
    assert row["_ft_attempt"] == 2
    assert (row["_ft_origin_rec"], row["_ft_origin_partition"]) == (0xAB, -1)
    assert rep.column_names == ["v", "s", *FT_COLUMNS]
    s = ft.stats()
    assert s.replayed_by_source == {1: 1}
    assert (s.failed, s.replayed, s.pending) == (1, 1, 1)
    # late events of the failed id complete nothing; the replay completes with its own birth
    assert ft.xor([src], [0xAB]).size == 0
    assert ft.xor([new], [row["_ft_rec"]]).tolist() == [new]
    assert ft.pending == 0
    assert len(ft.storage) == 0


def test_persist_with_births_completes_when_each_birth_is_acked(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1, 2, 3), births=[11, 12, 13])
    assert ft.xor(src[[0, 2]], [11, 99]).tolist() == [src[0]]
    assert ft.xor(src[[2, 1]], [99 ^ 13, 12]).tolist() == [src[2], src[1]]
    assert ft.pending == 0


def test_persist_accepts_a_multi_chunk_table(make_ft):
    ft = make_ft()
    table = pa.concat_tables([pa.table(batch(1, 2)), pa.table(batch(3))])
    src = ft.persist(table, births=[1, 2, 3])
    ft.fail(src)
    assert sorted(replays(ft).column("v").to_pylist()) == [1, 2, 3]


# ---------------------------------------------------------------- timeouts


def test_timeout_after_num_buckets_rotations(make_ft):
    ft = make_ft(num_buckets=3)
    (src,) = ft.persist(batch(1), births=[5])
    assert ft.rotate().size == 0
    assert ft.rotate().size == 0
    (new,) = ft.rotate()
    assert ft.stats().timed_out == 1
    rep = replays(ft)
    assert rep.column("_ft_src").to_pylist() == [new]
    assert rep.column("_ft_origin").to_pylist() == [src]


def test_touch_resets_the_timeout(make_ft):
    ft = make_ft(num_buckets=3)
    src = ft.persist(batch(1), births=[5])
    ft.rotate()
    ft.touch(src)
    assert [ft.rotate().size for _ in range(2)] == [0, 0]
    assert ft.rotate().size == 1


def test_replay_timeout_starts_when_handed_out(make_ft):
    ft = make_ft(num_buckets=2)
    ft.persist(batch(1), births=[5])
    ft.rotate()
    assert ft.rotate().size == 1
    for _ in range(5):  # waiting replays do not time out
        assert ft.rotate().size == 0
    (_new,) = replays(ft).column("_ft_src").to_pylist()
    ft.rotate()
    assert ft.rotate().size == 1
    assert ft.stats().timed_out == 2


def test_max_attempts_then_dead_letter(make_ft):
    ft = make_ft(max_attempts=2)
    (src,) = ft.persist(batch(9), source=2, births=[1])
    (new,) = ft.fail([src], reason="first")
    replays(ft, source=2)
    assert ft.fail([new], reason="second").size == 0  # attempt 2 of 2 failed: dead letter
    dl = ft.dead_letters()
    assert dl.num_rows == 1
    row = dl.to_pylist()[0]
    assert (row["v"], row["s"]) == (9, "r9")
    assert row["_ft_origin"] == src
    assert row["_ft_source"] == 2
    assert (row["_ft_attempts"], row["_ft_reason"]) == (2, "second")
    s = ft.stats()
    assert (s.dead_lettered, s.pending, s.replays_waiting) == (1, 0, 0)
    assert ft.take_replays(2) == {}


def test_timeouts_use_up_attempts(make_ft):
    ft = make_ft(num_buckets=1, max_attempts=3)
    ft.persist(batch(1, 2), births=[1, 2])
    for _ in range(3):
        ft.rotate()
        ft.take_replays()
    dl = ft.dead_letters()
    assert sorted(dl.column("v").to_pylist()) == [1, 2]
    assert set(dl.column("_ft_reason").to_pylist()) == {"timeout"}
    assert ft.stats().timed_out == 6
    assert ft.pending == 0


def test_fail_unknown_or_completed_is_a_counted_noop(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1), births=[3])
    ft.xor(src, [3])
    assert ft.fail(np.r_[src, np.uint64(424242)], reason="x").size == 0
    s = ft.stats()
    assert (s.unknown_failures, s.failed, s.replayed) == (2, 0, 0)


def test_fail_twice_in_one_call_replays_once(make_ft):
    ft = make_ft()
    (src,) = ft.persist(batch(1), births=[3])
    assert len(ft.fail([src, src])) == 1


def test_failing_a_waiting_replay_supersedes_it(make_ft):
    ft = make_ft()
    (src,) = ft.persist(batch(1), births=[3])
    (a,) = ft.fail([src])
    (b,) = ft.fail([a])
    rep = replays(ft)
    assert rep.column("_ft_src").to_pylist() == [b]
    assert rep.column("_ft_attempt").to_pylist() == [3]


def test_expire_all_fails_every_pending_record(make_ft):
    ft = make_ft(num_buckets=3)
    ft.persist(batch(1, 2, 3), births=[1, 2, 3])
    ft.rotate()
    src = ft.persist(batch(4, 5), births=[4, 5])
    ft.xor(src[:1], [4])  # completed: not expired
    new = ft.expire_all()
    assert len(new) == 4
    assert ft.stats().timed_out == 4
    assert ft.expire_all().size == 0  # replays not handed out yet are left alone
    assert sorted(replays(ft).column("v").to_pylist()) == [1, 2, 3, 5]
    assert len(ft.expire_all()) == 4


def test_expire_all_collateral_uses_no_attempt(make_ft):
    ft = make_ft(max_attempts=1)  # a timeout would dead-letter at once
    src = ft.persist(batch(1, 2), births=[1, 2])
    ft.xor(src[:1], [7])  # a partial event of an abandoned round: the replay starts afresh
    assert len(ft.expire_all(collateral=True)) == 2
    s = ft.stats()
    assert (s.collateral, s.timed_out, s.dead_lettered, s.pending) == (2, 0, 0, 2)
    assert sorted(ft.take_ended().tolist()) == sorted(src.tolist())
    rep = replays(ft)
    assert rep.column("_ft_attempt").to_pylist() == [1, 1]
    ft.xor(rep.column("_ft_src").to_numpy(), rep.column("_ft_rec").to_numpy())
    assert ft.stats().completed == 2  # the fresh checksums know nothing of the old event


# ---------------------------------------------------------------- orphans, early events


def test_orphan_events_time_out_silently(make_ft):
    ft = make_ft(num_buckets=2)
    ft.xor([777, 778], [5, 6])  # ids never persisted
    ft.xor([779, 779], [5, 5])  # a duplicated pair: back to 0, dropped at once
    for _ in range(3):
        assert ft.rotate().size == 0
    s = ft.stats()
    assert (s.orphans, s.timed_out, s.replayed, s.pending) == (2, 0, 0, 0)
    assert ft.take_replays() == {}


def test_late_events_of_a_completed_record_are_orphans(make_ft):
    ft = make_ft(num_buckets=1)
    src = ft.persist(batch(1), births=[3])
    ft.xor(src, [3])
    ft.xor(src, [3])  # a duplicated ack after completion
    ft.rotate()
    ft.rotate()
    s = ft.stats()
    assert (s.completed, s.orphans, s.replayed) == (1, 1, 0)


def test_events_before_persist(make_ft):
    ft = make_ft(num_buckets=2)
    ft.xor([1001], [5])  # the whole tree acked before the record is persisted
    assert ft.persist(batch(1), src_ids=[1001], births=[5]).tolist() == [1001]
    assert ft.stats().completed == 1
    assert ft.pending == 0

    ft.xor([1002], [5])  # only part of the tree before persist; a rotation in between
    ft.rotate()
    ft.persist(batch(2), src_ids=[1002], births=[6])
    ft.rotate()  # not an orphan, and its timeout started at persist
    assert ft.stats().orphans == 0
    assert ft.pending == 1
    assert ft.xor([1002], [5 ^ 6]).tolist() == [1002]


def test_caller_src_ids_must_be_distinct(make_ft):
    ft = make_ft()
    with pytest.raises(ValueError, match="distinct"):
        ft.persist(batch(1, 2), src_ids=[5, 5])
    with pytest.raises(ValueError, match="0 is never a valid id"):
        ft.persist(batch(1), src_ids=[0])
    ft.persist(batch(1), src_ids=[7], births=[1])
    with pytest.raises(ValueError, match="already pending"):
        ft.persist(batch(2, 3), src_ids=[8, 7])
    assert ft.pending == 1
    assert ft.xor([7], [1]).tolist() == [7]


def test_an_idempotent_persist_keeps_a_pending_record_once(make_ft):
    # a retried Spark task persists its rows again under the same (derived) source ids
    ft = make_ft()
    assert ft.persist(batch(1, 2, 3), src_ids=[11, 12, 13], births=[5, 6, 7]).tolist() == [
        11,
        12,
        13,
    ]
    again = ft.persist(batch(2, 3, 4), src_ids=[12, 13, 14], births=[6, 7, 8], idempotent=True)
    assert again.tolist() == [12, 13, 14]  # every row's id, the kept ones too
    s = ft.stats()
    assert (s.persisted, s.repeats, ft.pending) == (4, 2, 4)
    assert ft.persist(batch(2), src_ids=[12], births=[6], idempotent=True).tolist() == [12]
    assert ft.stats().repeats == 3
    with pytest.raises(ValueError, match="already pending"):  # without the flag: refused
        ft.persist(batch(4), src_ids=[14], births=[8])
    with pytest.raises(ValueError, match="idempotent: give the src_ids"):
        ft.persist(batch(4), births=[8], idempotent=True)
    # each record completes once, with its one birth
    assert sorted(ft.xor([11, 12, 13, 14], [5, 6, 7, 8]).tolist()) == [11, 12, 13, 14]
    assert ft.pending == 0
    assert ft.stats().completed == 4


# ---------------------------------------------------------------- replay routing

KEY_HASHES = np.array([0, 1, -1, 7, 2**31 - 1, -(2**31), 123456789, -987654321], np.int32)
ORIGINAL = np.array([3, 0, 2, 1, 3, 2, 0, 1], np.int32)


def route(ft: FTLayer, source: int = 0) -> dict[int, list[int]]:
    """Persist KEY_HASHES rows (payload = row number), fail them all, map partition -> rows."""
    src = ft.persist(
        pa.record_batch({"row": np.arange(len(KEY_HASHES))}),
        key_hash=KEY_HASHES,
        partition=ORIGINAL,
        source=source,
        births=np.arange(1, len(KEY_HASHES) + 1, dtype=np.uint64),
    )
    ft.fail(src)
    out = {}
    for part, t in ft.take_replays(source).items():
        assert set(t.column("_ft_partition").to_pylist()) == {part}
        assert t.column("_ft_key_hash").to_pylist() == KEY_HASHES[t.column("row")].tolist()
        out[part] = sorted(t.column("row").to_pylist())
    return out


def by_partition(parts) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for row, p in enumerate(parts):
        out.setdefault(int(p), []).append(row)
    return out


def test_default_routing_is_hash_of_the_key_hash(make_ft):
    assert route(make_ft(default_partitions=4)) == by_partition(np.mod(KEY_HASHES, 4))


def test_default_partitions_is_sparks_shuffle_default(storage_spec, backend):
    with FTLayer(storage_spec, backend=backend) as ft:
        assert ft.replay_partitioner(0).spec == "hash:200"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("hash:5", by_partition(np.mod(KEY_HASHES, 5))),
        ("forward", by_partition(ORIGINAL)),
        ("single", {0: list(range(8))}),
        ("roundrobin:3", by_partition(np.arange(8) % 3)),
    ],
)
def test_routing_per_partitioner(make_ft, spec, expected):
    ft = make_ft(replay_partitioners={2: spec})
    assert route(ft, source=2) == expected
    assert route(ft, source=0) == by_partition(np.mod(KEY_HASHES, 4))  # other sources: default


def test_routing_shuffle_is_the_partitioners_own(make_ft):
    ft = make_ft(replay_partitioners={0: ShuffleReplayPartitioner(4, seed=7)})
    _, parts = ShuffleReplayPartitioner(4, seed=7).assign(KEY_HASHES, ORIGINAL)
    assert route(ft) == by_partition(parts)


def test_broadcast_replay_goes_everywhere_and_completes_with_every_copy(make_ft):
    ft = make_ft(replay_partitioners={0: BroadcastReplayPartitioner(3)})
    (src,) = ft.persist(batch(1), births=[9])
    (new,) = ft.fail([src])
    reps = ft.take_replays()
    assert sorted(reps) == [0, 1, 2]
    recs = np.array([t.column("_ft_rec")[0].as_py() for t in reps.values()], np.uint64)
    assert {t.column("_ft_src").to_pylist()[0] for t in reps.values()} == {new}
    assert len(set(recs)) == 3
    assert ft.xor(np.r_[new, new], recs[:2]).size == 0  # two copies acked: not yet
    assert ft.xor([new], recs[2:]).tolist() == [new]


def test_take_replays_of_one_partition_keeps_the_others(make_ft):
    ft = make_ft(replay_partitioners={0: "forward"})
    src = ft.persist(batch(1, 2, 3), partition=[0, 1, 1], births=[1, 2, 3])
    ft.fail(src)
    one = ft.take_replays(0, partition=1)
    assert list(one) == [1]
    assert one[1].column("v").to_pylist() == [2, 3]
    assert ft.take_replays(0, partition=1) == {}
    rest = ft.take_replays(0)
    assert list(rest) == [0]
    assert rest[0].column("v").to_pylist() == [1]


def test_forward_needs_the_original_partition(make_ft):
    ft = make_ft(replay_partitioners={0: "forward"})
    with pytest.raises(ValueError, match="original partition"):
        ft.persist(batch(1))
    assert ft.pending == 0


def test_scalar_partition_applies_to_every_row(make_ft):
    ft = make_ft(replay_partitioners={0: "forward"})
    ft.fail(ft.persist(batch(1, 2), partition=3))
    assert list(ft.take_replays()) == [3]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch": {"v": [1]}}, TypeError, "batch must be"),
        ({"batch": pa.record_batch({"_ft_src": [1]})}, ValueError, "reserved column"),
        ({"key_hash": [1, 2]}, ValueError, "key_hash has 2 values"),
        ({"key_hash": [1.5]}, TypeError, "key_hash must be int32"),
        ({"key_hash": [2**40]}, ValueError, "key_hash must fit int32"),
        ({"partition": [-2]}, ValueError, "partition must .*>= -1"),
        ({"births": [1.0]}, TypeError, "births must be uint64"),
        ({"births": [1, 2]}, ValueError, "length mismatch"),
        ({"source": -1}, ValueError, "source must be in"),
        ({"source": "a"}, TypeError, "source must be an int"),
    ],
)
def test_persist_rejects_bad_input_and_keeps_what_was_accepted(make_ft, kwargs, error, match):
    ft = make_ft()
    ft.persist(batch(1), births=[1])
    args = {"batch": batch(2), **kwargs}
    with pytest.raises(error, match=match):
        ft.persist(args.pop("batch"), **args)
    assert ft.pending == 1
    assert len(ft.storage) == 1


def test_xor_and_fail_reject_bad_ids(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1), births=[1])
    with pytest.raises(ValueError, match="0 is never a valid id"):
        ft.xor([0], [1])
    with pytest.raises(TypeError, match="values must be uint64"):
        ft.xor(src, [1.0])
    with pytest.raises(ValueError, match="length mismatch"):
        ft.xor(src, [1, 2])
    with pytest.raises(TypeError, match="src_ids must be uint64"):
        ft.fail(["x"])
    assert ft.pending == 1
    assert ft.xor(src, [1]).tolist() == src.tolist()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_buckets": 0}, ValueError, "num_buckets"),
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"default_partitions": 1.5}, TypeError, "default_partitions"),
        ({"replay_partitioners": {0: "nope:3"}}, ValueError, "replay partitioner spec"),
        ({"replay_partitioners": {0: 3}}, TypeError, "replay_partitioners\\[0\\]"),
        ({"replay_partitioners": [1]}, TypeError, "replay_partitioners must be a dict"),
        ({"clock": 5}, TypeError, "clock"),
        ({"storage": "redis://x"}, ValueError, "unknown storage spec"),
    ],
)
def test_bad_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        FTLayer(**kwargs)


def test_closed_layer_refuses_calls(make_ft):
    ft = make_ft()
    ft.close()
    ft.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        ft.persist(batch(1))


# ---------------------------------------------------------------- stats, threads


def test_stats_latency_from_the_clock(make_ft):
    clock = ManualClock()
    ft = make_ft(clock=clock)
    births = np.arange(1, 2001, dtype=np.uint64)
    src = ft.persist(pa.record_batch({"v": np.arange(2000)}), births=births)
    clock.advance(2.5)
    assert len(ft.xor(src, births)) == 2000
    s = ft.stats()
    assert isinstance(s, FTStats)
    assert s.latency_p50 == s.latency_p99 == pytest.approx(2.5)
    d = s.as_dict()
    assert d["completed"] == 2000
    assert d["latency_p90"] == pytest.approx(2.5)


def test_stats_latency_of_a_single_record(make_ft):
    clock = ManualClock()
    ft = make_ft(clock=clock)
    src = ft.persist(batch(1), births=[1])
    clock.advance(4.0)
    ft.xor(src, [1])
    s = ft.stats()
    assert (s.latency_p50, s.latency_p99) == (4.0, 4.0)


def test_stats_before_any_completion(make_ft):
    s = make_ft().stats()
    assert s.latency_p50 is None
    assert s.pending == 0
    assert s.as_dict()["replayed_by_source"] == {}


def test_threads_persisting_and_xoring_keep_totals_consistent(make_ft):
    ft = make_ft(num_buckets=50)  # rotations run concurrently but nothing times out
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(15):
                births = rng.integers(1, 2**63, 50, dtype=np.uint64)
                src = ft.persist(pa.record_batch({"v": np.arange(50)}), births=births)
                ft.xor(src[:30], births[:30])  # complete 30
                ft.fail(src[30:35])  # fail 5, 15 stay pending
                ft.touch(src[35:])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def rotate() -> None:
        for _ in range(20):
            ft.rotate()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=rotate))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = ft.stats()
    assert s.persisted == 4 * 15 * 50
    assert s.completed == 4 * 15 * 30
    assert s.persisted == s.completed + s.dead_lettered + s.pending
    assert s.pending == len(ft.storage)
    assert s.replayed == s.failed + s.timed_out - s.dead_lettered


def wait_for(predicate, seconds: float = 5.0) -> bool:
    """Poll ``predicate`` until true (the rotation thread looks at the clock every 50 ms)."""
    event = threading.Event()
    for _ in range(int(seconds / 0.005)):
        if predicate():
            return True
        event.wait(0.005)
    return predicate()


def test_background_rotation_follows_the_clock(make_ft):
    clock = ManualClock()
    ft = make_ft(clock=clock, num_buckets=2)
    ft.persist(batch(1), births=[1])
    ft.start(10.0)
    with pytest.raises(RuntimeError, match="already running"):
        ft.start(1.0)
    clock.advance(10.0)
    assert wait_for(lambda: ft.stats().rotations == 1)
    clock.advance(25.0)  # two more intervals are due (at 20 and 30)
    assert wait_for(lambda: ft.stats().rotations == 3)
    assert ft.stats().timed_out == 1
    clock.advance(1000.0)  # a long pause: catch up with at most num_buckets rotations
    assert wait_for(lambda: ft.stats().rotations == 5)
    ft.stop()
    clock.advance(100.0)
    threading.Event().wait(0.2)  # the stopped thread would have looked at the clock by now
    assert ft.stats().rotations == 5
    with pytest.raises(ValueError, match="interval"):
        ft.start(0)


def test_background_rotation_with_the_real_clock(storage_spec, backend):
    with FTLayer(storage_spec, backend=backend, num_buckets=1) as ft:
        ft.persist(batch(1), births=[1])
        ft.start(0.01)
        assert wait_for(lambda: ft.stats().timed_out == 1)


# ---------------------------------------------------------------- storage failures, reopen


def test_storage_error_surfaces_and_earlier_records_stay(tmp_path, backend):
    path = tmp_path / "ft.db"
    ft = FTLayer(SQLiteStorage(path, max_bytes=256 * 1024), backend=backend, clock=ManualClock())
    src = ft.persist(batch(1, 2), births=[1, 2])
    big = pa.record_batch({"b": pa.array([b"z" * 1024] * 1024)})
    with pytest.raises(StorageError, match="full"):
        ft.persist(big)
    assert ft.pending == 2
    assert ft.stats().persisted == 2
    assert ft.xor(src[:1], [1]).tolist() == src[:1].tolist()  # the layer goes on
    ft.close()
    with FTLayer(f"sqlite:///{path}", backend=backend) as again:  # the other one is replayed
        assert again.stats().recovered == 1
        assert replays(again).column("v").to_pylist() == [2]


def test_a_record_keeps_its_first_id_and_partition_across_replays_and_a_restart(tmp_path, backend):
    path = tmp_path / "ft.db"
    ft = FTLayer(f"sqlite:///{path}", backend=backend, clock=ManualClock(), default_partitions=4)
    src = ft.persist(batch(1, 2), key_hash=[3, 4], partition=[2, 1], births=[0x51, 0x52])
    ft.fail(ft.fail(src))  # two replays: attempt 3
    ft.close()
    with FTLayer(f"sqlite:///{path}", backend=backend, clock=ManualClock()) as again:
        rep = replays(again).sort_by("v")
        assert rep.column("_ft_attempt").to_pylist() == [3, 3]
        assert rep.column("_ft_origin_rec").to_pylist() == [0x51, 0x52]
        assert rep.column("_ft_origin_partition").to_pylist() == [2, 1]
        assert rep.column("v").to_pylist() == [1, 2]  # the payload: no column of ours


def test_take_replays_with_first_ids_gives_each_record_its_first_id_once(make_ft):
    ft = make_ft(replay_partitioners={0: "single"})
    first = ft.persist(batch(1, 2), births=[0x61, 0x62])
    copy = ft.persist(batch(1), births=[0x61])  # a retried source task persisted row 1 again
    unknown = ft.persist(batch(3))  # births as events: no first id
    ft.fail(np.concatenate([first, copy, unknown]))
    (rep,) = ft.take_replays(0, first_ids=True).values()
    rec = rep.column("_ft_rec").to_numpy()
    firsts = sorted(rep.column("_ft_origin_rec").to_pylist())
    assert firsts == [0, 0x61, 0x61, 0x62]
    given = rec[np.isin(rec, [0x61, 0x62])]
    assert sorted(given.tolist()) == [0x61, 0x62]  # once each; the copy and the rest: fresh
    # each replay completes with the id it was handed: its checksum moved with it
    assert len(ft.xor(rep.column("_ft_src").to_numpy(), rec)) == 4
    assert ft.pending == 0


def test_take_replays_without_first_ids_hands_out_fresh_ids(make_ft):
    ft = make_ft(replay_partitioners={0: "single"})
    ft.fail(ft.persist(batch(1), births=[0x71]))
    with pytest.raises(TypeError, match="first_ids must be True or False"):
        ft.take_replays(0, first_ids="_xorack_det")
    (rep,) = ft.take_replays(0).values()
    assert rep.column("_ft_rec").to_pylist() != [0x71]
    assert rep.column("_ft_origin_rec").to_pylist() == [0x71]


def test_failed_delete_is_retried(backend):
    class FlakyStorage(MemoryStorage):
        fail_next = False

        def delete(self, src_ids):
            if self.fail_next:
                self.fail_next = False
                raise StorageError("simulated: disk unavailable")
            return super().delete(src_ids)

    storage = FlakyStorage()
    ft = FTLayer(storage, backend=backend)
    src = ft.persist(batch(1, 2), births=[1, 2])
    storage.fail_next = True
    # applied and recorded: reported as completed (an error would make the caller XOR again)
    assert ft.xor(src[:1], [1]).tolist() == src[:1].tolist()
    assert ft.stats().completed == 1
    assert len(storage) == 2
    ft.xor(src[1:], [2])  # the earlier delete is retried first
    assert len(storage) == 0
    assert ft.pending == 0


def test_reopen_replays_pending_records(tmp_path, backend):
    path = f"sqlite:///{tmp_path}/ft.db"
    with FTLayer(path, backend=backend, max_attempts=2) as ft:
        src = ft.persist(batch(1, 2, 3), key_hash=[5, 6, 7], births=[1, 2, 3])
        ft.xor(src[:1], [1])
        (_again,) = ft.fail(src[2:])  # attempt 2 (the last) waiting when the layer stops
    with FTLayer(path, backend=backend, max_attempts=2, default_partitions=4) as ft:
        s = ft.stats()
        assert (s.recovered, s.restarts, s.replayed, s.dead_lettered, s.pending) == (2, 1, 2, 0, 2)
        rep = replays(ft).sort_by("v")
        assert rep.column("v").to_pylist() == [2, 3]
        assert rep.column("_ft_origin").to_pylist() == [src[1], src[2]]
        assert rep.column("_ft_key_hash").to_pylist() == [6, 7]
        assert rep.column("_ft_attempt").to_pylist() == [1, 2]  # a restart is no attempt
        assert ft.dead_letters().num_rows == 0


def test_clean_reopens_are_not_attempts(tmp_path, backend):
    """Issue 11, defect 5: five clean restarts with max_attempts=5 dead-lettered records that
    were never processed. A restart replays them under the same attempt, counted apart."""
    path = f"sqlite:///{tmp_path}/ft.db"
    with FTLayer(path, backend=backend, max_attempts=5) as ft:
        src = ft.persist(batch(1, 2, 3), births=[1, 2, 3])
    for _ in range(7):  # a crash loop of the acker, or clean restarts
        with FTLayer(path, backend=backend, max_attempts=5) as ft:
            s = ft.stats()
            assert (s.recovered, s.restarts, s.dead_lettered, s.pending) == (3, 1, 0, 3)
    with FTLayer(path, backend=backend, max_attempts=5) as ft:
        rep = replays(ft)
        assert sorted(rep.column("_ft_origin").to_pylist()) == sorted(src.tolist())
        assert rep.column("_ft_attempt").to_pylist() == [1, 1, 1]
        assert ft.dead_letters().num_rows == 0
    with FTLayer("memory", backend=backend) as ft:
        assert ft.stats().restarts == 0


def test_timeout_retry_interrupted_by_storage_error_times_out_again(backend):
    class FlakyStorage(MemoryStorage):
        fail_next = False

        def renew(self, old_ids, new_ids):
            if self.fail_next:
                self.fail_next = False
                raise StorageError("simulated: disk unavailable")
            return super().renew(old_ids, new_ids)

    storage = FlakyStorage()
    ft = FTLayer(storage, num_buckets=1, backend=backend)
    (src,) = ft.persist(batch(1), births=[1])
    storage.fail_next = True
    with pytest.raises(StorageError, match="simulated"):
        ft.rotate()
    assert ft.pending == 1
    assert ft.stats().timed_out == 0
    assert ft.rotate().size == 1  # timed out again, replayed this time
    assert replays(ft).column("_ft_origin").to_pylist() == [src]
    assert ft.stats().timed_out == 1


@pytest.mark.parametrize("seed", range(3))
def test_random_runs_end_each_record_completed_or_dead_lettered_once(make_ft, seed):
    """A model check: random persists, partial acks, losses, fails, touches and rotations; then
    batch rounds until nothing is pending. Every record ends exactly once: completed or
    dead-lettered, never both, never twice, and its replays keep its payload."""
    rng = np.random.default_rng(seed)
    ft = make_ft(num_buckets=2, max_attempts=3)
    live: dict[int, tuple[int, int]] = {}  # src -> (origin, birth) of handed-out records
    origin_payload: dict[int, int] = {}
    completed: list[int] = []

    def handed_out(src: np.ndarray, births: np.ndarray, origins: np.ndarray) -> None:
        for s, b, o in zip(src.tolist(), births.tolist(), origins.tolist(), strict=True):
            live[s] = (o, live[s][1] ^ b if s in live else b)

    def ack(src: np.ndarray) -> None:
        if len(src):
            values = np.array([live[s][1] for s in src.tolist()], np.uint64)
            for s in ft.xor(src, values).tolist():
                completed.append(live.pop(s)[0])

    def take() -> None:
        for t in ft.take_replays().values():
            src = t.column("_ft_src").to_numpy()
            origins = t.column("_ft_origin").to_numpy()
            for o, v in zip(origins.tolist(), t.column("v").to_pylist(), strict=True):
                assert origin_payload[o] == v  # a replay carries its record's payload
            handed_out(src, t.column("_ft_rec").to_numpy(), origins)

    for step in range(60):
        op = rng.integers(6)
        known = np.array(list(live), np.uint64)
        pick = known[rng.random(len(known)) < 0.3] if len(known) else known
        if op == 0:
            n = int(rng.integers(1, 20))
            births = rng.integers(1, 2**63, n, dtype=np.uint64)
            values = np.arange(n) + 1000 * step
            src = ft.persist(pa.record_batch({"v": values}), births=births)
            origin_payload.update(zip(src.tolist(), values.tolist(), strict=True))
            handed_out(src, births, src)
        elif op == 1:
            ack(pick)
        elif op == 2:  # events lost: those records can only time out
            for s in pick.tolist():
                live.pop(s)
        elif op == 3:
            ft.fail(pick, reason="model")
            for s in pick.tolist():
                live.pop(s)
        elif op == 4:
            ft.touch(pick)
        else:  # timed-out records keep their stale ids in `live`: acking them makes orphans
            ft.rotate()
            take()

    for _ in range(10):  # batch rounds: ack what was handed out, expire the rest, replay
        ack(np.array(list(live), np.uint64))
        ft.expire_all()
        live.clear()
        take()
        if ft.pending == 0:
            break
    dead = ft.dead_letters().column("_ft_origin").to_pylist()
    assert ft.pending == 0
    assert len(completed) == len(set(completed))
    assert len(dead) == len(set(dead))
    assert not set(completed) & set(dead)
    assert set(completed) | set(dead) == set(origin_payload)
    s = ft.stats()
    assert (s.persisted, s.completed, s.dead_lettered) == (
        len(origin_payload),
        len(completed),
        len(dead),
    )


def test_unroutable_replays_are_dead_lettered_with_the_reason(tmp_path, backend):
    path = f"sqlite:///{tmp_path}/ft.db"
    with FTLayer(path, backend=backend) as ft:  # hash routing: no partition needed
        ft.persist(batch(1, 2), births=[1, 2])
        ft.persist(batch(3), source=1, births=[3])
    with FTLayer(path, backend=backend, replay_partitioners={0: "forward"}) as ft:
        s = ft.stats()
        assert (s.recovered, s.dead_lettered, s.replayed, s.pending) == (3, 2, 1, 1)
        dl = ft.dead_letters()
        assert sorted(dl.column("v").to_pylist()) == [1, 2]
        assert "replay routing failed" in dl.column("_ft_reason")[0].as_py()
        assert replays(ft, source=1).column("v").to_pylist() == [3]


def test_ids_as_python_lists_of_large_ints(make_ft):
    """``to_pylist()`` output (Python ints >= 2**63) is taken exactly, not as float64."""
    ft = make_ft()
    big = [2**64 - 5, 2**63 + 7]
    assert ft.persist(batch(1, 2), src_ids=big, births=[2**63 + 1, 3]).tolist() == big
    assert ft.xor([big[0], big[1]], [2**63 + 1, 2]).tolist() == big[:1]
    assert ft.fail(big[1:]).size == 1


def test_a_fail_that_raised_is_counted_once_when_retried(backend):
    """A fail whose storage call raised applied nothing: its retry must not count it twice."""

    class RenewFailsOnce(MemoryStorage):
        failed = False

        def renew(self, old_ids, new_ids, **kwargs):
            if not self.failed:
                self.failed = True
                raise StorageError("simulated: disk unavailable")
            return super().renew(old_ids, new_ids, **kwargs)

    ft = FTLayer(RenewFailsOnce(), backend=backend)
    src = ft.persist(batch(1, 2), births=[1, 2])
    with pytest.raises(StorageError, match="simulated"):
        ft.fail(src[:1])
    assert ft.fail(src[:1]).size == 1
    s = ft.stats()
    assert (s.failed, s.unknown_failures, s.replayed, s.pending) == (1, 0, 1, 2)


# ---- held completions and chunk events (combined aggregations) ------------------------------


def _chunk(prefix: int, n: int, bits: int) -> np.ndarray:
    return (np.uint64(prefix) << np.uint64(bits)) | np.arange(n, dtype=np.uint64)


def test_held_completions_wait_for_release_and_tainted_chunks_replay(make_ft):
    ft = make_ft(max_attempts=1)
    a, b = _chunk(3, 4, 2), _chunk(5, 4, 2)  # two chunks of 4 records
    ids = np.concatenate([a, b])
    ft.persist(batch(*range(8)), births=ids * np.uint64(7), src_ids=ids)
    assert ft.xor(a, a * np.uint64(7), hold=True).tolist() == a.tolist()
    assert ft.xor(b[1:], b[1:] * np.uint64(7), hold=True).tolist() == b[1:].tolist()
    ft.fail(b[:1])  # max_attempts=1: dead-lettered; its chunk (5) is tainted
    s = ft.stats()
    assert (s.held, s.completed, s.pending) == (7, 0, 7)
    ft.expire_all()  # held records are off the wheel: nothing times out
    assert ft.stats().timed_out == 0
    ended = ft.take_ended()
    assert ended.tolist() == b[:1].tolist()
    victims = ft.release(np.unique(ended >> np.uint64(2)), chunk_bits=2)
    assert sorted(victims.tolist()) == sorted(b[1:].tolist())
    s = ft.stats()
    assert (s.completed, s.collateral, s.dead_lettered, s.pending) == (4, 3, 1, 3)
    # collateral replays use no attempt: with max_attempts=1 they are replayed, not dead letters
    replays = pa.concat_tables(ft.take_replays().values())
    assert sorted(replays.column("v").to_pylist()) == [5, 6, 7]
    assert set(replays.column("_ft_attempt").to_pylist()) == {1}
    assert sorted(ft.take_ended().tolist()) == sorted(b[1:].tolist())


@pytest.mark.parametrize("lost", [False, True])
def test_a_chunk_event_holds_its_chunk_or_replays_it_when_it_does_not_cancel(make_ft, lost):
    ft = make_ft()
    ids = _chunk(9, 5, 3)
    births = ids * np.uint64(11)
    ft.persist(batch(*range(5)), births=births, src_ids=ids)
    ft.xor(ids[:2], np.uint64(3) * ids[:2])  # some events came one by one
    rest = np.bitwise_xor.reduce(births ^ np.where(np.arange(5) < 2, np.uint64(3) * ids, 0))
    event = rest ^ np.uint64(1) if lost else rest
    held = ft.xor([9], [event], chunk_bits=3)
    s = ft.stats()
    if lost:  # a row of the chunk never arrived: every record of the chunk is replayed
        assert (held.tolist(), s.collateral, s.held) == ([], 5, 0)
        assert (s.timed_out, s.replayed) == (0, 5)
    else:
        assert (sorted(held.tolist()), s.held) == (ids.tolist(), 5)
        ft.release([], chunk_bits=3)
        assert (ft.stats().completed, ft.pending) == (5, 0)


def test_chunk_arguments_are_checked(make_ft):
    ft = make_ft()
    with pytest.raises(ValueError, match="chunk_bits must be in"):
        ft.xor([1], [1], chunk_bits=17)
    with pytest.raises(TypeError, match="chunk_bits must be an int"):
        ft.release([], chunk_bits=1.5)
    with pytest.raises(ValueError, match="once"):
        ft.xor([4, 4], [1, 2], chunk_bits=2)
    with pytest.raises(ValueError, match="below 2"):
        ft.xor([2**62], [1], chunk_bits=4)
    with pytest.raises(ValueError, match="0"):
        ft.release([0], chunk_bits=2)
