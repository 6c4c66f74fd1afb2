"""Adversarial FT layer + storage scenarios: random record trees through the whole FT layer
(events shuffled, split, duplicated, lost), the accounting invariant, schema differences between
persisted batches, storage equivalence, SQLite ownership, and replay routing vs Spark hashing.
Time is a ManualClock; nothing sleeps."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xorack import FTLayer, ManualClock, StorageError
from xorack.hashing import murmur3_hash, route_keys, spark_partition_ids
from xorack.replay import (
    BroadcastReplayPartitioner,
    HashReplayPartitioner,
    replay_partitioner_from_spec,
)
from xorack.storage import MemoryStorage, PayloadSchemaConflict, RecordMeta, SQLiteStorage

U64 = np.uint64
SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def accounted(ft: FTLayer) -> None:
    """Every source record is completed, dead-lettered or still pending: nothing vanishes."""
    s = ft.stats()
    assert s.persisted + s.recovered == s.completed + s.dead_lettered + s.pending, s
    assert s.pending == ft.pending


def tree_events(rng: random.Random, src: int, birth: int, depth: int) -> list[tuple[int, int]]:
    """The XOR events of one record tree: each record anchors 0..3 children, leaves are acked."""
    events, frontier = [], [birth]
    for _ in range(depth):
        nxt = []
        for rec in frontier:
            kids = [rng.getrandbits(64) | 1 for _ in range(rng.randint(0, 3))]
            value = rec
            for k in kids:
                value ^= k
            events.append((src, value))  # the stage's combined event for this input
            nxt += kids
        frontier = nxt
    events += [(src, rec) for rec in frontier]  # the sink acks what it consumes
    return events


def run_tree(ft: FTLayer, src: int, birth: int, seed: int) -> None:
    rng = random.Random(seed)
    ev = tree_events(rng, src, birth, 2)
    done = ft.xor([s for s, _ in ev], [v for _, v in ev])
    assert done.tolist() == [src]


@pytest.fixture(params=["memory", "sqlite"])
def spec(request, tmp_path) -> str:
    return "memory" if request.param == "memory" else f"sqlite:///{tmp_path}/ft.db"


@SETTINGS
@given(
    n=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    births_given=st.booleans(),
    max_attempts=st.integers(1, 3),
    chunks=st.integers(1, 8),
)
def test_random_trees_complete_on_their_last_event_and_damaged_ones_replay(
    tmp_path_factory, backend, n, seed, births_given, max_attempts, chunks
):
    rng = random.Random(seed)
    path = tmp_path_factory.mktemp("ft") / "ft.db"
    spec = "memory" if seed % 2 else f"sqlite:///{path}"
    ft = FTLayer(
        spec, backend=backend, clock=ManualClock(), max_attempts=max_attempts, default_partitions=3
    )
    try:
        payload = pa.record_batch({"k": list(range(n)), "s": [f"row{i}" for i in range(n)]})
        births = [rng.getrandbits(64) | 1 for _ in range(n)]
        src = ft.persist(payload, key_hash=list(range(n)), births=births if births_given else None)
        events, real, damaged = [], {}, set()
        for i, s in enumerate(src.tolist()):
            ev = tree_events(rng, s, births[i], rng.randint(0, 3))
            if not births_given:
                ev.insert(0, (s, births[i]))  # the birth arrives as an event
            real[s] = len(ev)
            # A duplicated event can only be harmless when the birth was registered first: with
            # births=None the record sits at 0 and a duplicated pair brings it back there
            # (DESIGN: "with the birth registered first"), so births=None gets losses only.
            fate = rng.choice(["ok", "ok", "lost", "dup"] if births_given else ["ok", "lost"])
            tagged = [(s, v, True) for s, v in ev]
            if fate == "lost":
                tagged.pop(rng.randrange(len(tagged)))
                damaged.add(s)
            elif fate == "dup":
                tagged.append((s, tagged[rng.randrange(len(tagged))][1], False))
                damaged.add(s)
            events += tagged
        rng.shuffle(events)
        cuts = sorted(rng.sample(range(1, len(events)), max(0, min(chunks, len(events)) - 1)))
        value = {s: (births[i] if births_given else 0) for i, s in enumerate(src.tolist())}
        seen_real = dict.fromkeys(value, 0)
        copies: dict = {}  # equal events are interchangeable: the first ones to arrive are real
        for s_, v_, is_real_ in events:
            copies[(s_, v_)] = copies.get((s_, v_), 0) + is_real_
        expected, done_at = {}, {}
        for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True):
            part = events[a:b]
            for s, v, _ in part:  # the model: XOR semantics, registered ids complete at 0
                if s in value and s not in expected:
                    value[s] ^= v
                    if copies[(s, v)] > 0:
                        copies[(s, v)] -= 1
                        seen_real[s] += 1
            for s in {s for s, _, _ in part}:
                if s in value and s not in expected and value[s] == 0:
                    expected[s] = b
                    assert seen_real[s] == real[s], "the model completed a record early"
            for d in ft.xor([s for s, _, _ in part], [v for _, v, _ in part]).tolist():
                assert d not in done_at, "completed twice"
                done_at[d] = b
        assert done_at == expected  # exactly when its last real event arrived, never earlier
        assert set(src.tolist()) - damaged <= set(done_at)
        assert not (set(done_at) & {s for s in damaged if seen_real[s] < real[s]})
        damaged -= set(done_at)  # a duplicate arriving after completion is only an orphan
        accounted(ft)
        assert ft.pending == len(damaged)

        ft.expire_all()  # end of round: the damaged ones time out
        s1 = ft.stats()
        assert s1.timed_out == len(damaged)
        accounted(ft)
        if max_attempts == 1:
            dl = ft.dead_letters()
            assert sorted(dl.column("_ft_origin").to_pylist()) == sorted(damaged)
            assert set(dl.column("_ft_reason").to_pylist()) <= {"timeout"}
            assert set(dl.column("_ft_attempts").to_pylist()) <= {1}
            index = {int(x): i for i, x in enumerate(src.tolist())}
            for row in dl.to_pylist():
                assert row["k"] == index[row["_ft_origin"]]
                assert row["s"] == f"row{row['k']}"
            assert ft.pending == 0
            return
        reps = ft.take_replays()
        got = pa.concat_tables(reps.values()) if reps else None
        assert (0 if got is None else got.num_rows) == len(damaged)
        if got is not None:
            for p, t in reps.items():  # hash routing over the stored key hash
                assert (np.mod(t.column("_ft_key_hash").to_numpy(), 3) == p).all()
            assert set(got.column("_ft_origin").to_pylist()) == damaged
            assert set(got.column("_ft_attempt").to_pylist()) == {2}
            for row in got.to_pylist():
                run_tree(ft, row["_ft_src"], row["_ft_rec"], row["k"])
        assert ft.pending == 0
        assert ft.stats().completed == n
        accounted(ft)
    finally:
        ft.close()


def test_completion_happens_in_the_call_with_the_last_event(spec, backend):
    rng = random.Random(7)
    with FTLayer(spec, backend=backend, clock=ManualClock()) as ft:
        (src,) = ft.persist(pa.record_batch({"x": [1]}), births=[12345])
        ev = tree_events(rng, int(src), 12345, 3)
        for s, v in ev[:-1]:
            assert ft.xor([s], [v]).size == 0
        assert ft.xor([ev[-1][0]], [ev[-1][1]]).tolist() == [src]
        assert ft.stats().completed == 1


# ---------------------------------------------------------------- replays of replays, dead letters


def test_replays_of_replays_keep_origin_and_count_attempts(spec, backend):
    with FTLayer(
        spec, backend=backend, clock=ManualClock(), max_attempts=3, default_partitions=5
    ) as ft:
        (src,) = ft.persist(pa.record_batch({"x": [42], "y": ["a"]}), key_hash=[-7])
        cur = src
        for attempt in (2, 3):
            (cur,) = ft.fail([cur, cur], reason=f"r{attempt}")  # same id twice: one failure
            ((p, t),) = ft.take_replays().items()
            assert p == (-7) % 5
            row = t.to_pylist()[0]
            assert (row["_ft_src"], row["_ft_origin"], row["_ft_attempt"]) == (cur, src, attempt)
            assert (row["x"], row["y"], row["_ft_key_hash"]) == (42, "a", -7)
        assert ft.fail([cur], reason="last").size == 0
        dl = ft.dead_letters().to_pylist()
        assert dl == [
            {
                "x": 42,
                "y": "a",
                "_ft_origin": src,
                "_ft_source": 0,
                "_ft_attempts": 3,
                "_ft_reason": "last",
            }
        ]
        s = ft.stats()
        assert (s.failed, s.replayed, s.dead_lettered, s.pending) == (3, 2, 1, 0)
        assert ft.fail([cur, 999]).size == 0  # dead-lettered / unknown: counted no-ops
        assert ft.stats().unknown_failures == 2
        accounted(ft)


def test_unknown_touch_and_fail_do_not_disturb_anything(spec, backend):
    with FTLayer(spec, backend=backend, clock=ManualClock(), num_buckets=2) as ft:
        (src,) = ft.persist(pa.record_batch({"x": [1]}), births=[5])
        ft.touch([77, 78])
        assert ft.fail([77]).size == 0
        assert ft.rotate().size == 0
        ft.touch([src])
        assert ft.rotate().size == 0  # touched after rotation 1: expires at 3
        assert len(ft.rotate()) == 1
        s = ft.stats()
        assert (s.timed_out, s.unknown_failures, s.orphans) == (1, 1, 0)
        accounted(ft)


# ---------------------------------------------------------------- payload schema differences


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_batches_with_incompatible_schemas_are_never_lost(spec, backend, max_attempts):
    """Two persisted batches of one source whose payload schemas do not unify (x int64 / x
    string): the replays of each schema are handed out (over successive calls) and the dead
    letters are kept, instead of an Arrow error that dropped them."""
    with FTLayer(spec, backend=backend, clock=ManualClock(), max_attempts=max_attempts) as ft:
        a = ft.persist(pa.record_batch({"x": [1, 2]}), births=[1, 2])
        b = ft.persist(pa.record_batch({"x": ["s"]}), births=[3])
        c = ft.persist(pa.record_batch({"x": pa.array([3], pa.int32())}), births=[4])
        new = ft.fail(np.concatenate([a, b, c]))
        if max_attempts == 1:
            assert new.size == 0
            with pytest.raises(PayloadSchemaConflict, match=r"dead_letters\(source="):
                ft.dead_letters()
            assert ft.pending == 0
            assert ft.stats().dead_lettered == 4
            return
        assert len(new) == 4
        seen = []
        while reps := ft.take_replays():
            (t,) = reps.values()
            seen.append(sorted(map(str, t.column("x").to_pylist())))
        assert sorted(seen) == [["1", "2", "3"], ["s"]]  # int32 + int64 unify, string apart
        assert ft.take_replays() == {}
        assert ft.stats().replays_waiting == 0
        accounted(ft)


def test_dead_letters_of_two_sources_with_conflicting_schemas(spec, backend):
    with FTLayer(spec, backend=backend, max_attempts=1) as ft:
        a = ft.persist(pa.record_batch({"value": [1]}), source=0)
        b = ft.persist(pa.record_batch({"value": ["one"]}), source=1)
        ft.fail(np.concatenate([a, b]), reason="poison")  # one call, both sources
        assert ft.dead_letters(source=0).column("value").to_pylist() == [1]
        assert ft.dead_letters(source=1).column("value").to_pylist() == ["one"]
        assert ft.dead_letters(source=2).num_rows == 0
        assert ft.pending == 0


def test_take_replays_by_partition_leaves_the_rest(spec, backend):
    with FTLayer(spec, backend=backend, replay_partitioners={0: "hash:4", 1: "broadcast:3"}) as ft:
        a = ft.persist(pa.record_batch({"x": [0, 1, 2, 3, 4]}), key_hash=[0, 1, 2, 3, 4])
        b = ft.persist(pa.record_batch({"y": ["b"]}), source=1)
        ft.fail(np.concatenate([a, b]))
        assert set(ft.take_replays(0, partition=0)[0].column("x").to_pylist()) == {0, 4}
        assert ft.take_replays(0, partition=0) == {}
        assert ft.take_replays(1, partition=2)[2].column("y").to_pylist() == ["b"]
        rest = ft.take_replays(0)
        assert {p: t.column("x").to_pylist() for p, t in rest.items()} == {1: [1], 2: [2], 3: [3]}
        rest1 = ft.take_replays(1)
        assert sorted(rest1) == [0, 1]
        srcs = {t.column("_ft_src")[0].as_py() for t in rest1.values()}
        assert len(srcs) == 1  # a broadcast replay: one source id, a copy per partition
        assert ft.stats().replays_waiting == 0


# ---------------------------------------------------------------- storage failures


def test_fail_after_a_failed_delete_does_not_replay_a_completed_record(backend):
    class FlakyStorage(MemoryStorage):
        fail_next = False

        def delete(self, src_ids):
            if self.fail_next:
                self.fail_next = False
                raise StorageError("simulated: disk unavailable")
            return super().delete(src_ids)

    storage = FlakyStorage()
    ft = FTLayer(storage, backend=backend)
    (src,) = ft.persist(pa.record_batch({"x": [1]}), births=[1])
    storage.fail_next = True
    assert ft.xor([src], [1]).tolist() == [src]  # completed (reported); its delete failed
    assert ft.fail([src]).size == 0  # completed: a no-op, not a replay
    assert ft.take_replays() == {}
    s = ft.stats()
    assert (s.completed, s.replayed, s.pending, s.unknown_failures) == (1, 0, 0, 1)
    assert len(storage) == 0
    accounted(ft)


def test_take_replays_error_hands_out_nothing_and_loses_nothing(backend):
    class FlakyFetch(MemoryStorage):
        fail_next = False

        def fetch(self, src_ids):
            if self.fail_next:
                self.fail_next = False
                raise StorageError("simulated: read error")
            return super().fetch(src_ids)

    storage = FlakyFetch()
    ft = FTLayer(storage, backend=backend, replay_partitioners={0: "single"})
    ft.fail(ft.persist(pa.record_batch({"x": [1, 2]})))
    storage.fail_next = True
    with pytest.raises(StorageError):
        ft.take_replays()
    assert ft.stats().replays_waiting == 2
    assert ft.take_replays()[0].column("x").to_pylist() == [1, 2]


# ---------------------------------------------------------------- SQLite ownership and paths


def test_a_second_ft_layer_on_a_used_sqlite_file_is_a_clear_error(tmp_path, backend):
    """Two FT layers on one file would each replay the other's pending records as recovered."""
    path = tmp_path / "ft.db"
    with FTLayer(f"sqlite:///{path}", backend=backend) as first:
        src = first.persist(pa.record_batch({"x": [1]}), births=[1])
        with pytest.raises(StorageError, match="in use by another FT layer"):
            FTLayer(SQLiteStorage(path, busy_timeout=0.05), backend=backend)
        assert first.xor(src, [1]).tolist() == src.tolist()
    with FTLayer(f"sqlite:///{path}", backend=backend) as again:  # released by close()
        assert again.stats().recovered == 0


def test_sqlite_relative_path_and_missing_directory(tmp_path, monkeypatch, backend):
    monkeypatch.chdir(tmp_path)
    with FTLayer("sqlite:///rel.db", backend=backend) as ft:
        ft.persist(pa.record_batch({"x": [1]}))
    assert (tmp_path / "rel.db").exists()
    with FTLayer("sqlite:///rel.db", backend=backend) as ft:
        assert ft.stats().recovered == 1
    with pytest.raises(StorageError, match="cannot open SQLite storage"):
        FTLayer("sqlite:///no/such/dir/ft.db", backend=backend)


# ---------------------------------------------------------------- storage equivalence


def _random_ops(seed: int, storage) -> list:
    rng = random.Random(seed)
    live: list[int] = []
    out = []
    next_id = 1
    for _ in range(40):
        op = rng.choice(["persist", "persist", "delete", "renew", "fetch", "dead", "lookup"])
        if op == "persist":
            k = rng.randint(0, 4)
            ids = np.arange(next_id, next_id + k, dtype=U64) * U64(0x9E3779B97F4A7C15)
            next_id += k
            meta = RecordMeta.new(
                ids, np.array([rng.randint(-9, 9) for _ in ids], np.int32), source=rng.randint(0, 1)
            )
            storage.persist(pa.record_batch({"v": [rng.randint(0, 99) for _ in ids]}), meta)
            live += ids.tolist()
            out.append(("persist", len(storage)))
            continue
        pick = np.array([*rng.sample(live, min(len(live), rng.randint(0, 3))), 12345], U64)
        if op == "delete":
            out.append(("delete", storage.delete(pick)))
            live = [x for x in live if x not in pick.tolist()]
        elif op == "renew" and len(pick) > 1:
            old = pick[:-1]
            new = old ^ U64(0xFFFF)
            storage.renew(old, new)
            live = [x for x in live if x not in old.tolist()] + new.tolist()
            out.append(("renew", len(storage)))
        elif op == "fetch":
            payload, meta = storage.fetch(pick)
            out.append(
                (
                    "fetch",
                    payload.to_pylist(),
                    meta.src.tolist(),
                    meta.attempt.tolist(),
                    meta.key_hash.tolist(),
                    meta.origin.tolist(),
                )
            )
        elif op == "dead":
            storage.dead_letter(pick, f"r{len(out)}")
            live = [x for x in live if x not in pick.tolist()]
            out.append(("dead", storage.dead_letters().to_pylist()))
        elif op == "lookup":
            m = storage.lookup(pick)
            out.append(("lookup", m.src.tolist(), m.source.tolist(), m.partition.tolist()))
    out.append(
        ("end", len(storage), sorted(x for m in storage.iter_pending(3) for x in m.src.tolist()))
    )
    return out


@pytest.mark.parametrize("seed", range(6))
def test_memory_and_sqlite_storages_agree(tmp_path, seed):
    mem = _random_ops(seed, MemoryStorage())
    with SQLiteStorage(tmp_path / "ft.db") as s:
        assert _random_ops(seed, s) == mem


# ---------------------------------------------------------------- routing vs Spark hashing


@pytest.mark.parametrize("n", [1, 2, 7, 200])
def test_hash_replay_partitioner_equals_spark_partition_ids(n, backend):
    rng = np.random.default_rng(n)
    keys = pa.array(rng.integers(-(2**62), 2**62, 2000), pa.int64())
    names = pa.array([f"k{i}é" for i in rng.integers(0, 10**6, 2000)])
    for cols in ([keys], [names], [keys, names]):
        kh = murmur3_hash(cols, backend=backend)
        assert (kh < 0).any()  # negative hashes must pmod, not truncate
        rows, parts = HashReplayPartitioner(n).assign(kh, np.full(len(kh), -1), backend=backend)
        assert rows.tolist() == list(range(len(kh)))
        assert parts.tolist() == spark_partition_ids(cols, n, backend=backend).tolist()
        assert parts.tolist() == np.mod(kh.astype(np.int64), n).tolist()


def test_route_keys_put_each_partition_on_itself(backend):
    for n in [*range(1, 60), 199, 200, 511, 1000]:
        keys = route_keys(n, backend=backend)
        assert keys.dtype == np.int32
        assert len(keys) == n
        parts = np.mod(murmur3_hash(pa.array(keys), backend=backend).astype(np.int64), n)
        assert parts.tolist() == list(range(n))
        # the smallest such key: no smaller non-negative int32 lands on that partition
        small = np.arange(int(keys.max()) + 1, dtype=np.int32)
        first = np.mod(murmur3_hash(pa.array(small), backend=backend).astype(np.int64), n)
        expect = [int(np.flatnonzero(first == p)[0]) for p in range(n)]
        assert keys.tolist() == expect


@pytest.mark.parametrize(
    "spec",
    [
        "hash:1",
        "hash:200",
        "roundrobin:3",
        "forward",
        "forward:4",
        "single",
        "broadcast:2",
        "shuffle:5:9",
        "shuffle:5:0",
    ],
)
def test_partitioner_spec_round_trip(spec):
    p = replay_partitioner_from_spec(spec)
    assert replay_partitioner_from_spec(p.spec).spec == p.spec
    assert type(replay_partitioner_from_spec(p.spec)) is type(p)


@pytest.mark.parametrize(
    "bad",
    [
        "hash",
        "hash:0",
        "hash:-1",
        "hash:x",
        "nope:3",
        "broadcast",
        "shuffle:0",
        "single:2",
        "",
        "hash:3:4",
    ],
)
def test_bad_partitioner_specs_are_clear_errors(bad):
    with pytest.raises(ValueError, match=r"spec|num_partitions|must"):
        replay_partitioner_from_spec(bad)


def test_broadcast_replay_completes_only_when_every_copy_is_acked(spec, backend):
    with FTLayer(
        spec, backend=backend, replay_partitioners={0: BroadcastReplayPartitioner(3)}
    ) as ft:
        (src,) = ft.persist(pa.record_batch({"x": [1]}), births=[9])
        (new,) = ft.fail([src])
        reps = ft.take_replays()
        recs = [t.column("_ft_rec")[0].as_py() for _, t in sorted(reps.items())]
        assert ft.xor([new, new], recs[:2]).size == 0
        assert ft.xor([new], recs[2:]).tolist() == [new]
        accounted(ft)


def test_forward_partition_out_of_range_is_rejected_at_persist(spec, backend):
    """Not accepted and then dead-lettered at the first replay for want of a route."""
    with FTLayer(spec, backend=backend, replay_partitioners={0: "forward:4"}) as ft:
        with pytest.raises(ValueError, match=r"partition must be in \[0, 4\)"):
            ft.persist(pa.record_batch({"x": [1, 2]}), partition=[1, 4])
        assert ft.pending == 0
        (src,) = ft.persist(pa.record_batch({"x": [1]}), partition=3)
        ft.fail([src])
        assert list(ft.take_replays()) == [3]


# ---------------------------------------------------------------- FT layer on both storages


class _Driver:
    """Drives one FT layer by payload value (ids differ between layers: they are random)."""

    def __init__(self, ft: FTLayer) -> None:
        self.ft = ft
        self.live: dict[int, tuple[int, int]] = {}  # payload value -> (src id, value to complete)
        self.completed: list[int] = []

    def persist(self, values: list[int]) -> None:
        births = [v * 7919 + 1 for v in values]
        src = self.ft.persist(pa.record_batch({"v": values}), key_hash=values, births=births)
        self.live.update(zip(values, zip(src.tolist(), births, strict=True), strict=True))

    def _ids(self, values: list[int]) -> list[int]:
        return [self.live[v][0] for v in values if v in self.live]

    def complete(self, values: list[int]) -> None:
        pairs = [self.live[v] for v in values if v in self.live]
        if pairs:
            done = set(self.ft.xor([s for s, _ in pairs], [b for _, b in pairs]).tolist())
            for v in values:
                if v in self.live and self.live[v][0] in done:
                    self.completed.append(v)
                    del self.live[v]

    def fail(self, values: list[int]) -> None:
        ids = self._ids(values)
        self.ft.fail([*ids, *ids[:1]], reason="f")  # a repeated id too
        for v in values:
            self.live.pop(v, None)  # the replays come back through take_replays

    def take(self) -> None:
        for t in self.ft.take_replays().values():
            for row in t.to_pylist():
                self.live[row["v"]] = (row["_ft_src"], row["_ft_rec"])

    def touch(self, values: list[int]) -> None:
        self.ft.touch([*self._ids(values), 424242])

    def view(self) -> tuple:
        s = self.ft.stats().as_dict()
        for k in ("latency_p50", "latency_p90", "latency_p99"):
            del s[k]
        dead = self.ft.dead_letters().to_pydict()
        rows = sorted(zip(dead.get("v", []), dead["_ft_attempts"], dead["_ft_reason"], strict=True))
        return s, sorted(self.live), sorted(self.completed), rows


@SETTINGS
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["persist", "complete", "fail", "take", "rotate", "touch", "expire"]),
            st.lists(st.integers(0, 30), max_size=5, unique=True),
        ),
        max_size=25,
    )
)
def test_memory_and_sqlite_ft_layers_behave_the_same(tmp_path_factory, backend, ops):
    path = tmp_path_factory.mktemp("eq") / "ft.db"
    kw = {"backend": backend, "clock": ManualClock(), "num_buckets": 2, "max_attempts": 3}
    with FTLayer("memory", **kw) as a, FTLayer(f"sqlite:///{path}", **kw) as b:
        da, db = _Driver(a), _Driver(b)
        used: set[int] = set()
        for op, values in ops:
            if op == "persist":
                values = [v for v in values if v not in used]
                used.update(values)
            for d in (da, db):
                if op in ("persist", "complete", "fail", "touch"):
                    getattr(d, op)(values)
                elif op == "take":
                    d.take()
                elif op == "rotate":
                    d.ft.rotate()
                else:
                    d.ft.expire_all()
            assert da.view() == db.view()
            accounted(a)
        for d in (da, db):  # drain: everything ends completed or dead-lettered
            for _ in range(10):
                d.take()
                d.complete(list(d.live))
                d.ft.expire_all()
            assert d.ft.pending == 0
            s = d.ft.stats()
            assert s.completed + s.dead_lettered == s.persisted == len(used)
            dead = set(d.ft.dead_letters().column("v").to_pylist()) if s.dead_lettered else set()
            assert sorted([*d.completed, *dead]) == sorted(used)  # each exactly once


def test_reopen_accounts_for_every_origin_exactly_once(tmp_path, backend):
    path = f"sqlite:///{tmp_path}/ft.db"
    kw = {"backend": backend, "clock": ManualClock(), "max_attempts": 3, "default_partitions": 2}
    values = list(range(10))
    with FTLayer(path, **kw) as ft:
        src = ft.persist(pa.record_batch({"v": values}), key_hash=values, births=[9] * 10)
        origin_of = dict(zip(src.tolist(), values, strict=True))
        ft.xor(src[:3], [9, 9, 9])  # 0, 1, 2 complete
        ft.fail(src[3:5])  # 3, 4 wait as replays (attempt 2) ...
        ft.take_replays(partition=1)  # ... 3 is handed out, 4 still waits
        ft.touch(src[5:6])
        accounted(ft)
    with FTLayer(path, **kw) as ft:
        s = ft.stats()
        assert (s.recovered, s.replayed, s.pending, s.dead_lettered) == (7, 7, 7, 0)
        reps = pa.concat_tables(ft.take_replays().values())
        assert sorted(origin_of[o] for o in reps.column("_ft_origin").to_pylist()) == values[3:]
        assert all(r["v"] == origin_of[r["_ft_origin"]] for r in reps.to_pylist())
        attempts = {origin_of[r["_ft_origin"]]: r["_ft_attempt"] for r in reps.to_pylist()}
        assert attempts == {3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1}  # a restart: none
        done = ft.xor(reps.column("_ft_src"), reps.column("_ft_rec").to_numpy())
        assert len(done) == 7
        assert ft.pending == 0
        accounted(ft)


def test_threads_hammering_one_layer_lose_nothing(spec, backend):
    import threading

    # a replay in flight between one thread's take_replays and its xor times out when the
    # others rotate three times meanwhile, and is replayed again on its next attempt: attempts
    # enough that thread scheduling cannot dead-letter a record (4 did, once, on the fallback)
    with FTLayer(spec, backend=backend, clock=ManualClock(), max_attempts=64) as ft:
        errors: list[BaseException] = []
        origins: list[set[int]] = [set() for _ in range(4)]

        def worker(k: int) -> None:
            rng = random.Random(k)
            try:
                for _ in range(30):
                    births = [rng.getrandbits(63) | 1 for _ in range(5)]
                    src = ft.persist(pa.record_batch({"k": [k] * 5}), births=births)
                    origins[k].update(src.tolist())
                    ft.xor(src[:2], births[:2])
                    ft.fail(src[2:3])
                    ft.touch(src[3:])
                    if rng.random() < 0.3:
                        ft.rotate()
                    for t in ft.take_replays().values():
                        ft.xor(t.column("_ft_src"), t.column("_ft_rec").to_numpy())
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        for _ in range(6):  # drain: what is left times out and is replayed, then acked
            ft.expire_all()
            for t in ft.take_replays().values():
                ft.xor(t.column("_ft_src"), t.column("_ft_rec").to_numpy())
        s = ft.stats()
        assert s.pending == 0
        assert s.persisted == 4 * 30 * 5
        assert s.completed + s.dead_lettered == s.persisted
        assert s.dead_lettered == 0
        assert len(set().union(*origins)) == s.persisted


def test_a_forked_child_does_not_keep_the_sqlite_file_locked(tmp_path, backend):
    import os

    path = tmp_path / "ft.db"
    ft = FTLayer(f"sqlite:///{path}", backend=backend)
    ft.persist(pa.record_batch({"x": [1]}))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a long-lived child (a multiprocessing worker, say) that never closes the layer
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        ft.close()
        with FTLayer(SQLiteStorage(path, busy_timeout=0.5), backend=backend) as again:
            assert again.stats().recovered == 1
    finally:
        os.close(w)  # let the child go
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status)
