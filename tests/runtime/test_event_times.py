"""A record's event time in the FT layer: ``persist(..., event_time=)`` and
``stats().min_event_time``, the smallest event time of the pending records, on both storages and
both kernel backends, through completions, fails, timeouts, replays, held completions, dead
letters, idempotent re-persists and restarts. Time is a ManualClock; nothing sleeps."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xorack import NO_EVENT_TIME, FTLayer, ManualClock
from xorack.event_times import PendingEventTimes
from xorack.storage import MemoryStorage, RecordMeta, SQLiteStorage

U64 = np.uint64
NONE = NO_EVENT_TIME


@pytest.fixture(params=["memory", "sqlite"])
def storage_spec(request, tmp_path) -> str:
    return "memory" if request.param == "memory" else f"sqlite:///{tmp_path}/ft.db"


@pytest.fixture
def make_ft(storage_spec, backend):
    made: list[FTLayer] = []

    def make(**kw) -> FTLayer:
        kw.setdefault("clock", ManualClock())
        kw.setdefault("replay_partitioners", {0: "single"})
        ft = FTLayer(kw.pop("storage", storage_spec), backend=backend, **kw)
        made.append(ft)
        return ft

    yield make
    for ft in made:
        ft.close()


def batch(*values) -> pa.RecordBatch:
    return pa.record_batch({"v": list(values)})


def low(ft: FTLayer) -> int | None:
    return ft.stats().min_event_time


def replay_of(ft: FTLayer) -> pa.Table:
    (table,) = ft.take_replays(0).values()
    return table


# ---------------------------------------------------------------- the minimum over pending


def test_no_event_time_gives_none(make_ft):
    ft = make_ft()
    assert low(ft) is None
    ft.persist(batch(1, 2), births=[1, 2])
    assert low(ft) is None
    assert ft.stats().as_dict()["min_event_time"] is None


def test_the_minimum_moves_as_records_complete(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1, 2, 3), births=[1, 2, 3], event_time=[30, 10, 20])
    assert low(ft) == 10
    ft.xor(src[2:], [3])  # not the minimum: it stays
    assert low(ft) == 10
    ft.xor(src[1:2], [2])
    assert low(ft) == 30
    ft.xor(src[:1], [1])
    assert low(ft) is None
    assert ft.pending == 0


def test_records_without_an_event_time_are_ignored(make_ft):
    ft = make_ft()
    plain = ft.persist(batch(1), births=[1])  # no event time at all
    src = ft.persist(batch(2, 3), births=[2, 3], event_time=np.array([NONE, 50]))
    assert low(ft) == 50
    ft.xor(src[1:], [3])
    assert (low(ft), ft.pending) == (None, 2)  # two pending, neither with an event time
    ft.xor([plain[0], src[0]], [1, 2])
    assert (low(ft), ft.pending) == (None, 0)


def test_one_int_is_every_rows_event_time_and_negative_times_count(make_ft):
    ft = make_ft()
    ft.persist(batch(1, 2), event_time=7)
    assert low(ft) == 7
    ft.persist(batch(3), event_time=np.array([-5], np.int32))  # before the epoch; int32 widened
    assert low(ft) == -5


def test_a_failed_record_keeps_its_event_time_through_its_replay(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1, 2), births=[1, 2], event_time=[10, 20])
    (new,) = ft.fail(src[:1])
    assert low(ft) == 10  # waiting for its replay
    table = replay_of(ft)
    assert table.column("_ft_src").to_pylist() == [new]
    assert low(ft) == 10  # in flight again
    assert ft.storage.lookup(np.array([new], U64)).event_time.tolist() == [10]
    ft.xor([new], table.column("_ft_rec").to_pylist())
    assert low(ft) == 20


def test_a_timed_out_record_keeps_its_event_time(make_ft):
    ft = make_ft(num_buckets=2)
    src = ft.persist(batch(1, 2), births=[1, 2], event_time=[5, 9])
    ft.xor(src[1:], [2])
    ft.rotate()
    (new,) = ft.rotate()  # timed out: replayed under a new id
    assert ft.stats().timed_out == 1
    assert low(ft) == 5
    ft.xor([new], replay_of(ft).column("_ft_rec").to_pylist())
    assert low(ft) is None


def test_a_dead_lettered_record_drops_out(make_ft):
    ft = make_ft(max_attempts=2)
    src = ft.persist(batch(1, 2), births=[1, 2], event_time=[3, 8])
    (new,) = ft.fail(src[:1])
    assert low(ft) == 3
    assert ft.fail([new]).size == 0  # its last attempt: dead-lettered
    assert ft.stats().dead_lettered == 1
    assert low(ft) == 8


def test_expire_all_and_a_timeout_into_the_dead_letters(make_ft):
    ft = make_ft(max_attempts=1)
    ft.persist(batch(1, 2), births=[1, 2], event_time=[4, 6])
    assert ft.expire_all().size == 0
    assert (ft.stats().dead_lettered, low(ft)) == (2, None)


def test_held_records_are_pending_until_released(make_ft):
    ft = make_ft()
    src = ft.persist(batch(1, 2), births=[9, 5], src_ids=[8, 12], event_time=[40, 30])
    ft.xor(src, [9, 5], hold=True)
    assert (ft.stats().held, low(ft)) == (2, 30)
    ft.release([12 >> 2], chunk_bits=2)  # 12's chunk is tainted: replayed, 8 completes
    assert ft.stats().collateral == 1
    assert low(ft) == 30  # the collateral replay keeps its event time
    table = replay_of(ft)
    ft.xor(table.column("_ft_src").to_pylist(), table.column("_ft_rec").to_pylist())
    assert low(ft) is None


def test_an_idempotent_repersist_keeps_the_first_event_times(make_ft):
    ft = make_ft()
    ft.persist(batch(1, 2), births=[1, 2], src_ids=[101, 102], event_time=[50, 60])
    ids = ft.persist(
        batch(1, 2, 3),
        births=[1, 2, 3],
        src_ids=[101, 102, 103],
        event_time=[5, 6, 70],  # a retried task's copy: the pending records are left as they are
        idempotent=True,
    )
    assert ids.tolist() == [101, 102, 103]
    assert ft.stats().repeats == 2
    assert low(ft) == 50
    assert ft.storage.lookup(np.array([101, 103], U64)).event_time.tolist() == [50, 70]
    ft.xor([101, 102], [1, 2])
    assert low(ft) == 70


def test_an_id_persisted_again_after_its_record_completed_counts_again(make_ft):
    ft = make_ft()
    ft.persist(batch(1), births=[1], src_ids=[7], event_time=[10])
    ft.xor([7], [1])
    ft.persist(batch(1), births=[1], src_ids=[7], event_time=[20], idempotent=True)
    assert (ft.pending, low(ft)) == (1, 20)


def test_a_broadcast_replay_keeps_the_event_time_of_its_record(make_ft):
    ft = make_ft(replay_partitioners={0: "broadcast:3"})
    src = ft.persist(batch(1, 2), births=[1, 2], event_time=[11, 22])
    ft.fail(src[:1])
    copies = ft.take_replays(0)
    assert len(copies) == 3
    assert low(ft) == 11
    for table in copies.values():  # every copy acks its part: the record completes once
        ft.xor(table.column("_ft_src").to_pylist(), table.column("_ft_rec").to_pylist())
    assert low(ft) == 22


# ---------------------------------------------------------------- restarts and the storages


def test_recovered_records_keep_their_event_times(tmp_path, backend):
    path = f"sqlite:///{tmp_path}/ft.db"
    with FTLayer(path, backend=backend, replay_partitioners={0: "single"}) as ft:
        src = ft.persist(batch(1, 2, 3), births=[1, 2, 3], event_time=[30, 10, 20])
        ft.persist(batch(4), births=[4])  # none
        ft.xor(src[1:2], [2])
        ft.fail(src[2:])  # a replay waiting when the layer stops
        assert low(ft) == 20
    with FTLayer(path, backend=backend, replay_partitioners={0: "single"}) as ft:
        assert (ft.stats().recovered, low(ft)) == (3, 20)
        table = replay_of(ft).sort_by("v")
        assert table.column("v").to_pylist() == [1, 3, 4]
        meta = ft.storage.lookup(table.column("_ft_src").to_numpy())
        assert meta.event_time.tolist() == [30, 20, NONE]
        ft.xor(table.column("_ft_src").to_pylist()[1:2], table.column("_ft_rec").to_pylist()[1:2])
        assert low(ft) == 30


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_storages_keep_event_times_through_renew_and_compaction(tmp_path, kind):
    s = MemoryStorage() if kind == "memory" else SQLiteStorage(tmp_path / "ft.db")
    ids = np.arange(1, 101, dtype=U64)
    times = np.where(ids % 3 == 0, NONE, ids.astype(np.int64) * 10)
    s.persist(pa.record_batch({"n": np.arange(100)}), RecordMeta.new(ids, event_time=times))
    s.persist(pa.record_batch({"n": [0]}), RecordMeta.new(np.array([500], U64)))
    assert s.lookup(np.array([500, 3, 4], U64)).event_time.tolist() == [NONE, NONE, 40]
    s.renew(np.array([4], U64), np.array([1004], U64))
    assert s.lookup(np.array([1004], U64)).event_time.tolist() == [40]
    s.delete(ids[10:])  # a batch mostly gone: rewritten with its live rows
    if kind == "sqlite":
        s.compact()
    _, meta = s.fetch(np.r_[ids[:3], [1004, 500]].astype(U64))
    assert meta.event_time.tolist() == [10, 20, NONE, 40, NONE]
    s.close()
    if kind == "sqlite":
        with SQLiteStorage(tmp_path / "ft.db") as again:
            assert again.quarantined == 0
            assert again.lookup(np.array([2, 1004], U64)).event_time.tolist() == [20, 40]


def _meta_blobs(path) -> list[pa.Table]:
    with closing(sqlite3.connect(path)) as db:
        blobs = db.execute("SELECT meta FROM batches ORDER BY id").fetchall()
    return [pa.ipc.open_stream(b).read_all() for (b,) in blobs]


def test_a_batch_without_event_times_stores_no_column_for_them(tmp_path):
    path = tmp_path / "ft.db"
    with FTLayer(f"sqlite:///{path}") as ft:
        ft.persist(batch(1, 2))
        ft.persist(batch(3), event_time=[NONE])
        ft.persist(batch(4), event_time=[9])
    names = [t.schema.names for t in _meta_blobs(path)]
    assert ["event_time" in n for n in names] == [False, False, True]


def test_an_ft3_file_is_read_with_no_event_times_and_marked_ft4(tmp_path, backend):
    path = tmp_path / "ft.db"
    with FTLayer(f"sqlite:///{path}") as ft:
        ft.persist(batch(1, 2), births=[1, 2], event_time=[5, 6])
    with closing(sqlite3.connect(path)) as db:  # as ft-3 wrote it: no event_time column
        for no, blob in db.execute("SELECT id, meta FROM batches").fetchall():
            meta = pa.ipc.open_stream(blob).read_all().drop_columns(["event_time"])
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, meta.schema) as w:
                w.write_table(meta)
            db.execute(
                "UPDATE batches SET meta = ? WHERE id = ?", (sink.getvalue().to_pybytes(), no)
            )
        db.execute("UPDATE xorack_meta SET value = 'xorack-ft-3' WHERE key = 'format'")
        db.commit()
    with FTLayer(f"sqlite:///{path}", backend=backend) as ft:
        s = ft.stats()
        assert (s.recovered, s.quarantined, s.min_event_time) == (2, 0, None)
        ft.persist(batch(3), event_time=[7])  # a new batch of the file: with its event time
        assert low(ft) == 7
    with closing(sqlite3.connect(path)) as db:  # code that knows only ft-3 now refuses it
        (fmt,) = db.execute("SELECT value FROM xorack_meta WHERE key = 'format'").fetchone()
    assert fmt == "xorack-ft-4"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("event_time", "error", "match"),
    [
        ([1, 2], ValueError, "event_time has 2 values but the batch has 1 rows"),
        ([1.5], TypeError, "event_time must be int64 .*got float64"),
        ([True], TypeError, "event_time must be int64 .*got bool"),
        (["5"], TypeError, "event_time must be int64"),
        (1.0, TypeError, "event_time must be int64 .*got float"),
        (np.array(["2024-01-01"], "datetime64[us]"), TypeError, r"view\('int64'\)"),
        (pa.array([None], pa.int64()), ValueError, "must not contain nulls.*NO_EVENT_TIME"),
        (np.array([2**63], U64), ValueError, "event_time must fit int64"),
        (np.array([[1]]), ValueError, "event_time must be 1-D"),
    ],
)
def test_bad_event_times_are_refused_and_nothing_is_kept(make_ft, event_time, error, match):
    ft = make_ft()
    ft.persist(batch(1), births=[1], event_time=[3])
    with pytest.raises(error, match=match):
        ft.persist(batch(2), event_time=event_time)
    assert (ft.pending, len(ft.storage), low(ft)) == (1, 1, 3)


def test_event_times_given_as_an_arrow_array(make_ft):
    ft = make_ft()
    ft.persist(batch(1, 2), event_time=pa.chunked_array([[8], [4]], pa.int64()))
    assert low(ft) == 4


def test_the_callers_array_is_not_kept(make_ft):
    ft = make_ft()
    times = np.array([10, 20])
    ft.persist(batch(1, 2), event_time=times)
    times[:] = -1  # the caller reuses its buffer
    assert low(ft) == 10


# ---------------------------------------------------------------- cost


def test_a_job_without_event_times_keeps_nothing_for_them(make_ft):
    ft = make_ft(num_buckets=1)
    for k in range(5):
        src = ft.persist(batch(1, 2, 3), births=[1, 2, 3])
        ft.xor(src[:1], [1])
        ft.fail(src[1:2])
        ft.rotate()
        for table in ft.take_replays(0).values():
            ft.xor(table.column("_ft_src").to_pylist(), table.column("_ft_rec").to_pylist())
        assert low(ft) is None, k
    kept = ft._event_times
    assert (kept._runs, kept._left, kept._entries) == ([], [], 0)  # never a note of a leave


def test_a_minimum_held_by_a_straggler_is_read_without_a_pass(monkeypatch):
    t = PendingEventTimes()
    t.add(np.array([1, 2], U64), np.array([5, 50]))
    t.add(np.array([3, 4], U64), np.array([60, 5]))  # a tie: 1 is known to hold the minimum
    passes = []
    prune = t._prune
    monkeypatch.setattr(t, "_prune", lambda: passes.append(1) or prune())
    t.discard(np.array([2, 3], U64))
    assert (t.min(), passes) == (5, [])
    t.discard(np.array([1], U64))  # a holder left: a pass finds the other one
    assert (t.min(), passes) == (5, [1])
    t.discard(np.array([4], U64))
    assert (t.min(), passes) == (None, [1, 1])


# ---------------------------------------------------------------- models


class _Model:
    """The tracker's contract, spelled out: a dict of the pending ids with an event time."""

    def __init__(self) -> None:
        self.times: dict[int, int] = {}

    def add(self, ids, times) -> None:
        self.times.update((i, t) for i, t in zip(ids, times, strict=True) if t != NONE)

    def discard(self, ids) -> None:
        for i in ids:
            self.times.pop(i, None)

    def min(self) -> int | None:
        return min(self.times.values(), default=None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "discard", "min"]),
            st.lists(st.integers(1, 40), max_size=8, unique=True),  # few ids: many come back
            st.lists(st.sampled_from([NONE, -3, 0, 5, 9, 2**62]), min_size=8, max_size=8),
        ),
        max_size=60,
    ),
    st.integers(0, 8),
)
def test_pending_event_times_agree_with_a_dict(ops, prune_min):
    import xorack.event_times as et

    real, model = PendingEventTimes(), _Model()
    old, et._PRUNE_MIN = et._PRUNE_MIN, prune_min  # prune often, and at every other point
    try:
        for op, ids, times in ops:
            if op == "add":
                fresh = [i for i in ids if i not in model.times]  # an id is pending once
                t = times[: len(fresh)]
                real.add(np.array(fresh, U64), np.array(t, np.int64))
                model.add(fresh, t)
            elif op == "discard":
                real.discard(np.array(ids, U64))
                model.discard(ids)
            else:
                assert real.min() == model.min()
        assert real.min() == model.min()
        assert len(real) == len(model.times)
    finally:
        et._PRUNE_MIN = old


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["persist", "ack", "fail", "rotate", "replays", "expire_all"]),
            st.integers(0, 2**32),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_min_event_time_is_the_minimum_over_the_stored_records(backend, ops):
    """Random persists (with, without and partly without event times), acks, fails, timeouts
    and replays: the minimum always equals the one computed from the storage's own rows (the
    pending records), on both kernel backends."""
    births: dict[int, int] = {}  # current src id -> the value that completes it
    with FTLayer(
        backend=backend,
        num_buckets=2,
        max_attempts=3,
        clock=ManualClock(),
        replay_partitioners={0: "single"},
    ) as ft:
        for op, seed in ops:
            r = np.random.default_rng(seed)
            live = np.array(sorted(births), U64)
            if op == "persist":
                n = int(r.integers(1, 6))
                rec = r.integers(1, 2**63, n, dtype=np.uint64)
                kind = int(r.integers(0, 3))
                times = None if kind == 0 else r.integers(-100, 100, n)
                if kind == 2:
                    times[r.random(n) < 0.5] = NONE
                src = ft.persist(batch(*range(n)), births=rec, event_time=times)
                births.update(zip(src.tolist(), rec.tolist(), strict=True))
            elif op == "ack" and len(live):
                pick = live[r.random(len(live)) < 0.5]
                ft.xor(pick, [births.pop(int(s)) for s in pick])
            elif op == "fail" and len(live):
                pick = live[r.random(len(live)) < 0.3]
                for s in pick.tolist():
                    births.pop(s)
                ft.fail(pick)
            elif op in ("rotate", "expire_all"):
                getattr(ft, op)()
                births = {
                    s: b for s, b in births.items() if len(ft.storage.lookup(np.array([s], U64)))
                }
            elif op == "replays":
                for table in ft.take_replays(0).values():
                    births.update(
                        zip(
                            table.column("_ft_src").to_pylist(),
                            table.column("_ft_rec").to_pylist(),
                            strict=True,
                        )
                    )
            stored = ft.storage.lookup(ft.storage.stored_ids()).event_time
            stored = stored[stored != NONE]
            assert low(ft) == (int(stored.min()) if len(stored) else None)
            assert len(ft.storage) == ft.pending
