"""Property tests: native == fallback for every acker kernel, and random record trees complete
exactly when their last event arrives — never earlier, whatever the order and batching."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import NATIVE_MISSING
from xorack import kernels
from xorack.acker import AckTable, TimeoutWheel, anchor, derive_ids, parent_index, xor_reduce

needs_native = pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
SETTINGS = settings(max_examples=100, deadline=None)
# Every available backend: the tree tests loop over them inside one example.
ALL_BACKENDS = ["native", "python"] if kernels.native_available() else ["python"]

# Small id pools make collisions, duplicates within a call, and early events frequent.
small_ids = st.integers(1, 12)
values = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))


def pairs(max_size: int = 12):
    return st.lists(st.tuples(small_ids, values), max_size=max_size)


def unzip(ps: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    k = np.array([p[0] for p in ps], dtype=np.uint64)
    v = np.array([p[1] for p in ps], dtype=np.uint64)
    return k, v


table_ops = st.lists(
    st.one_of(
        st.tuples(st.just("register"), pairs()),
        st.tuples(st.just("xor"), pairs()),
        st.tuples(st.just("fail"), st.lists(small_ids, max_size=5)),
        st.tuples(st.just("expire_unregistered"), st.just([])),
    ),
    max_size=25,
)


@needs_native
@SETTINGS
@given(table_ops)
def test_ack_table_native_equals_fallback(ops):
    tables = {b: AckTable(backend=b) for b in ("native", "python")}
    for op, arg in ops:
        out = {}
        for b, t in tables.items():
            if op == "fail":
                out[b] = t.fail(np.array(arg, dtype=np.uint64)).tolist()
            elif op == "expire_unregistered":
                out[b] = t.expire_unregistered()
            else:
                out[b] = getattr(t, op)(*unzip(arg)).tolist()
        assert out["native"] == out["python"], (op, arg)
        snaps = [[a.tolist() for a in t.snapshot()] for t in tables.values()]
        assert snaps[0] == snaps[1]
        assert len(tables["native"]) == len(tables["python"])
    for k in range(1, 13):
        assert tables["native"].value(k) == tables["python"].value(k)
        assert (k in tables["native"]) == (k in tables["python"])
    every = np.arange(1, 13, dtype=np.uint64)
    gathered = [t.gather(every).tolist() for t in tables.values()]
    assert gathered[0] == gathered[1]
    assert gathered[0] == [tables["python"].value(k) or 0 for k in range(1, 13)]


wheel_ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "touch", "discard"]), st.lists(small_ids, max_size=6)),
        st.tuples(st.just("rotate"), st.just([])),
    ),
    max_size=40,
)


@needs_native
@SETTINGS
@given(st.integers(1, 4), wheel_ops)
def test_timeout_wheel_native_equals_fallback(num_buckets, ops):
    wheels = {b: TimeoutWheel(num_buckets, backend=b) for b in ("native", "python")}
    for op, arg in ops:
        out = {}
        for b, w in wheels.items():
            r = getattr(w, op)(*([] if op == "rotate" else [arg]))
            out[b] = None if r is None else sorted(r.tolist())  # expiry order is unspecified
        assert out["native"] == out["python"], (op, arg)
        assert len(wheels["native"]) == len(wheels["python"])
    assert [k in wheels["native"] for k in range(13)] == [k in wheels["python"] for k in range(13)]


@given(st.integers(1, 4), wheel_ops)
@SETTINGS
def test_timeout_wheel_matches_its_definition(num_buckets, ops):
    # Model: deadline = rotation at the last add/touch (while present) + num_buckets.
    w = TimeoutWheel(num_buckets, backend="python" if not kernels.native_available() else None)
    deadline: dict[int, int] = {}
    rotation = 0
    for op, arg in ops:
        if op == "rotate":
            rotation += 1
            expected = sorted(k for k, d in deadline.items() if d == rotation)
            for k in expected:
                del deadline[k]
            assert sorted(w.rotate().tolist()) == expected
            continue
        getattr(w, op)(arg)
        for k in arg:
            if op == "add" or (op == "touch" and k in deadline):
                deadline[k] = rotation + num_buckets
            elif op == "discard":
                deadline.pop(k, None)
        assert len(w) == len(deadline)


@needs_native
@SETTINGS
@given(st.data())
def test_lineage_kernels_native_equal_fallback(data):
    n_in = data.draw(st.integers(0, 30))
    in_src = np.array(data.draw(st.lists(small_ids, min_size=n_in, max_size=n_in)), np.uint64)
    in_rec = np.array(
        data.draw(st.lists(st.integers(1, 2**64 - 1), min_size=n_in, max_size=n_in, unique=True)),
        dtype=np.uint64,
    )
    n_out = data.draw(st.integers(0, 40)) if n_in else 0
    pi = np.array(
        data.draw(st.lists(st.integers(0, max(n_in - 1, 0)), min_size=n_out, max_size=n_out)),
        dtype=np.int64,
    )
    out_rec = np.array(
        data.draw(st.lists(st.integers(1, 2**64 - 1), min_size=n_out, max_size=n_out)),
        dtype=np.uint64,
    )
    a = [x.tolist() for x in anchor(in_src, in_rec, pi, out_rec, backend="native")]
    b = [x.tolist() for x in anchor(in_src, in_rec, pi, out_rec, backend="python")]
    assert a == b
    vals = np.array(data.draw(st.lists(values, min_size=n_in, max_size=n_in)), dtype=np.uint64)
    ra = [x.tolist() for x in xor_reduce(in_src, vals, backend="native")]
    assert ra == [x.tolist() for x in xor_reduce(in_src, vals, backend="python")]
    if n_in:
        lineage = in_rec[pi]
        assert (parent_index(in_rec, lineage, backend="native") == pi).all()
        assert (parent_index(in_rec, lineage, backend="python") == pi).all()
    ordinal = np.arange(n_in, dtype=np.uint64)
    salt = data.draw(st.integers(-(2**63), 2**64 - 1))
    da = derive_ids(in_rec, in_rec[::-1].copy(), ordinal, salt, backend="native")
    assert (
        da.tolist()
        == derive_ids(in_rec, in_rec[::-1].copy(), ordinal, salt, backend="python").tolist()
    )


# --- record trees ---------------------------------------------------------------------------------


def make_tree_events(rng: np.random.Generator, src: int, stages: int, max_fanout: int):
    """Events of one source record's tree: its birth, and one event per record (its id XOR its
    children's ids); the last stage's records are acked by the sink (no children)."""
    root = int(rng.integers(1, 2**64, dtype=np.uint64))
    birth = root
    events = []
    level = [root]
    for stage in range(stages + 1):
        nxt = []
        for rec in level:
            kids = (
                [
                    int(x)
                    for x in rng.integers(
                        1, 2**64, size=int(rng.integers(0, max_fanout + 1)), dtype=np.uint64
                    )
                ]
                if stage < stages
                else []
            )
            ev = rec
            for k in kids:
                ev ^= k
            events.append((src, ev))
            nxt.extend(kids)
        level = nxt
    return birth, events


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    n_sources=st.integers(1, 12),
    stages=st.integers(1, 3),
    max_fanout=st.integers(0, 3),
    n_batches=st.integers(1, 8),
    register_anywhere=st.booleans(),
)
def test_record_trees_complete_exactly_at_their_last_event(
    seed, n_sources, stages, max_fanout, n_batches, register_anywhere
):
    rng = np.random.default_rng(seed)
    items = []  # ("reg" | "ev", src, value)
    for s in range(1, n_sources + 1):
        birth, events = make_tree_events(rng, s, stages, max_fanout)
        items.append(("reg", s, birth))
        items.extend(("ev", src, v) for src, v in events)
    order = rng.permutation(len(items))
    if not register_anywhere:  # the contract's normal case: registers come first
        order = np.concatenate(
            [[i for i in order if items[i][0] == "reg"], [i for i in order if items[i][0] == "ev"]]
        ).astype(int)
    cuts = np.sort(rng.integers(0, len(items) + 1, size=n_batches - 1))
    batches = np.split(order, cuts)
    last_batch = {}
    for b, idx in enumerate(batches):
        for i in idx:
            last_batch[items[i][1]] = b
    for backend in ALL_BACKENDS:
        t = AckTable(backend=backend)
        completed_at = {}
        for b, idx in enumerate(batches):
            regs = [items[i] for i in idx if items[i][0] == "reg"]
            evs = [items[i] for i in idx if items[i][0] == "ev"]
            # Within a batch, events first and registers after: the worst case for early events.
            done = t.xor([e[1] for e in evs], [e[2] for e in evs]).tolist()
            done += t.register([r[1] for r in regs], [r[2] for r in regs]).tolist()
            for s in done:
                assert s not in completed_at, "completed twice"
                completed_at[s] = b
        assert completed_at == last_batch, backend
        assert len(t) == 0


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), dup=st.booleans())
def test_a_lost_or_duplicated_event_never_completes_a_tree_early(seed, dup):
    rng = np.random.default_rng(seed)
    birth, events = make_tree_events(rng, 1, stages=2, max_fanout=2)
    m = len(events)
    j = int(rng.integers(0, m))
    # Position p of `sent` carries original event origin[p]; a duplicate repeats event j.
    sent, origin = (
        ([*events, events[j]], [*range(m), j])
        if dup
        else (events[:j] + events[j + 1 :], [p for p in range(m) if p != j])
    )
    for backend in ALL_BACKENDS:
        t = AckTable(backend=backend)
        t.register([1], [birth])
        seen: set[int] = set()
        completions = 0
        perm = rng.permutation(len(sent))
        for p in perm:
            seen.add(origin[p])
            if t.xor([1], [sent[p][1]]).tolist():
                completions += 1
                assert len(seen) == m, "completed before every event of the tree arrived"
        # A lost event: never complete (a timeout will replay the record). A duplicate: complete
        # only when one of the two copies comes last (every event seen once, the copy after).
        assert completions == int(dup and origin[perm[-1]] == j)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), stages=st.integers(1, 3))
def test_anchored_pipeline_completes_at_the_sink(seed, stages):
    # Source rows -> `stages` anchored stages (random fan-out) -> sink acks every row.
    rng = np.random.default_rng(seed)
    for backend in ALL_BACKENDS:
        n = int(rng.integers(1, 20))
        src = np.arange(1, n + 1, dtype=np.uint64)
        rec = rng.integers(1, 2**64, size=n, dtype=np.uint64)
        t = AckTable(backend=backend)
        assert t.register(src, rec).tolist() == []
        for _ in range(stages):
            parents = rng.integers(0, len(src), size=int(rng.integers(0, 2 * len(src) + 1)))
            out_src, out_rec, ev_src, ev_xor = anchor(src, rec, parents, backend=backend)
            done = t.xor(ev_src, ev_xor)
            # A source completes at a stage exactly when none of its rows had outputs.
            assert set(done.tolist()) == set(src.tolist()) - set(out_src.tolist())
            src, rec = out_src, out_rec
            if len(src) == 0:
                break
        if len(src):
            s, x = xor_reduce(src, rec, backend=backend)
            assert sorted(t.xor(s, x).tolist()) == sorted(s.tolist())
        assert len(t) == 0


# --- register: a call is its pairs as separate calls ------------------------------------------


@SETTINGS
@given(pairs(max_size=30), st.lists(st.integers(0, 30), max_size=6), table_ops)
def test_splitting_a_register_call_changes_nothing(ps, cuts, before):
    # Issue 11, defect 11: one register call must equal the same pairs in several calls (any
    # split), from any prior state: the same completions in the same order, the same table.
    keys, births = unzip(ps)
    bounds = sorted({0, len(ps), *(c for c in cuts if c <= len(ps))})
    for b in ALL_BACKENDS:
        whole, split = AckTable(backend=b), AckTable(backend=b)
        for t in (whole, split):
            _apply(t, before)
        done_whole = whole.register(keys, births).tolist()
        done_split = []
        for lo, hi in itertools.pairwise(bounds):
            done_split += split.register(keys[lo:hi], births[lo:hi]).tolist()
        assert done_whole == done_split, b
        assert [a.tolist() for a in whole.snapshot()] == [a.tolist() for a in split.snapshot()]


def _apply(t: AckTable, ops) -> None:
    for op, arg in ops:
        if op == "fail":
            t.fail(np.array(arg, dtype=np.uint64))
        elif op == "expire_unregistered":
            t.expire_unregistered()
        else:
            getattr(t, op)(*unzip(arg))


# --- at scale: growth, shrinking and long runs, native == fallback ----------------------------
# The small-pool tests above never grow a native table past 16 slots. These draw ids from the
# whole uint64 range and sizes that make the native tables grow, shrink back, and (the wheel)
# sweep probe runs longer than 64 slots; debug_counters() proves those paths ran.

SCALE = settings(max_examples=8, deadline=None)


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.tolist() == b.tolist(), what


@needs_native
@SCALE
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(20_000, 60_000),
    batch=st.sampled_from([1_000, 4_096, 16_384]),
    dup=st.floats(0.0, 0.2),
)
def test_ack_table_at_scale_native_equals_fallback(seed, n, batch, dup):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 2**64, size=n, dtype=np.uint64)
    births = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    tables = {b: AckTable(backend=b) for b in ("native", "python")}

    def both(op, *args):
        out = [getattr(t, op)(*args) for t in tables.values()]
        _same(out[0], out[1], op)
        return out[0]

    # Grow: register in batches, some with repeated keys and with early events before them.
    for lo in range(0, n, batch):
        k, b = ids[lo : lo + batch], births[lo : lo + batch]
        early = rng.random(k.size) < 0.05
        both("xor", k[early], b[early] ^ np.uint64(1))
        rep = rng.random(k.size) < dup
        both("register", np.concatenate([k, k[rep]]), np.concatenate([b, b[rep]]))
    # Complete most of them (the table shrinks), some events duplicated within a call.
    snap = tables["python"].snapshot()
    keys, values, registered = snap
    pick = rng.permutation(np.flatnonzero(registered))[: int(0.9 * registered.sum())]
    for lo in range(0, pick.size, batch):
        p = pick[lo : lo + batch]
        k, v = keys[p], values[p]
        rep = rng.random(k.size) < dup
        both("xor", np.concatenate([k, k[rep], k[rep]]), np.concatenate([v, v[rep], v[rep]]))
    both("fail", ids[rng.integers(0, n, size=500)])
    assert tables["native"].expire_unregistered() == tables["python"].expire_unregistered()
    assert tables["native"].expire_unregistered() == tables["python"].expire_unregistered()
    snaps = [[a.tolist() for a in t.snapshot()] for t in tables.values()]
    assert snaps[0] == snaps[1]
    probe = np.concatenate(
        [ids[rng.integers(0, n, size=2_000)], rng.integers(1, 2**64, 50, np.uint64)]
    )
    both("gather", probe)
    c = tables["native"]._impl.debug_counters()
    assert c["grows"] > 0, c
    assert c["shrinks"] > 0, c


@needs_native
@SCALE
@given(
    seed=st.integers(0, 2**32 - 1),
    num_buckets=st.integers(1, 4),
    batch=st.sampled_from([2_000, 8_192, 30_000]),
)
def test_timeout_wheel_at_scale_native_equals_fallback(seed, num_buckets, batch):
    rng = np.random.default_rng(seed)
    wheels = {b: TimeoutWheel(num_buckets, backend=b) for b in ("native", "python")}
    native = wheels["native"]._impl

    def both(op, *args):
        out = [getattr(w, op)(*args) for w in wheels.values()]
        if op == "rotate":
            _same(np.sort(out[0]), np.sort(out[1]), op)
        assert len(wheels["native"]) == len(wheels["python"])
        return out[1]

    live: list[np.ndarray] = []
    # Fill to a high load (between growths) so that the sweep meets runs over 64 slots.
    while True:
        ids = rng.integers(1, 2**64, size=batch, dtype=np.uint64)
        both("add", ids)
        live.append(ids)
        c = native.debug_counters()
        if c["size"] >= 60_000 and c["size"] >= 0.78 * c["capacity"]:
            break
    everything = np.concatenate(live)
    for _ in range(3 * num_buckets + 2):
        some = everything[rng.integers(0, everything.size, size=batch)]
        both(rng.choice(["touch", "discard", "add"]), some)
        both("add", rng.integers(1, 2**64, size=batch // 4, dtype=np.uint64))
        both("rotate")
    while len(wheels["python"]):  # drain: everything left expires, the table shrinks
        both("rotate")
    c = native.debug_counters()
    assert c["long_runs"] > 0, c  # the sweep met runs longer than 64 slots
    assert c["grows"] > 0, c
    assert c["shrinks"] > 0, c


@needs_native
def test_runs_reaching_the_spare_slots_grow_the_table_native_equals_fallback():
    """A probe run that reaches the spare slots after the last home slot (runs never wrap around)
    grows the native table whatever its load: rare, so small tables are filled, one after the
    other, until one takes that path (``tail_grows``); every step matches the fallback."""
    rng = np.random.default_rng(11)
    for _ in range(3000):
        tables = {b: AckTable(backend=b) for b in ("native", "python")}
        wheels = {b: TimeoutWheel(2, backend=b) for b in ("native", "python")}
        ids = rng.integers(1, 2**64, size=600, dtype=np.uint64)
        births = rng.integers(1, 2**64, size=600, dtype=np.uint64)
        for lo in range(0, ids.size, 5):
            k, b = ids[lo : lo + 5], births[lo : lo + 5]
            _same(*(t.register(k, b) for t in tables.values()), "register")
            for w in wheels.values():
                w.add(k)
        _same(*(t.xor(ids[::-1], births[::-1]) for t in tables.values()), "xor")
        assert len(tables["native"]) == len(tables["python"]) == 0
        for _ in range(2):
            _same(*(np.sort(w.rotate()) for w in wheels.values()), "rotate")
        grown = [
            x._impl.debug_counters()["tail_grows"] for x in (tables["native"], wheels["native"])
        ]
        if all(grown):
            return
    pytest.fail(f"no table reached its spare slots in 3000 tries (last counters: {grown})")


# The native wheel queues big adds once its table has outgrown the cache and merges the queue into
# the table at the next rotate (or at the next touch, discard, len or contains): these sequences
# keep the queue busy (large id ranges, repeats within a batch and across rotations, discards
# and touches right after an add, len and contains in between), at sizes that make the native
# table grow and shrink, native == fallback at every step.
wheel_queue_ops = st.lists(
    st.sampled_from(
        ["add_new", "re_add", "add_twice", "discard_new", "touch", "rotate", "len", "contains"]
    ),
    min_size=4,
    max_size=16,
)


@needs_native
@SCALE
@given(
    seed=st.integers(0, 2**32 - 1),
    num_buckets=st.integers(1, 4),
    batch=st.sampled_from([3_000, 12_000, 40_000]),
    ops=wheel_queue_ops,
)
def test_timeout_wheel_queue_native_equals_fallback(seed, num_buckets, batch, ops):
    rng = np.random.default_rng(seed)
    wheels = {b: TimeoutWheel(num_buckets, backend=b) for b in ("native", "python")}
    native = wheels["native"]._impl
    added: list[np.ndarray] = []

    def both(op, *args):
        out = [getattr(w, op)(*args) for w in wheels.values()]
        if op == "rotate":
            _same(np.sort(out[0]), np.sort(out[1]), op)
        return out[1]

    def fresh(n: int) -> np.ndarray:
        ids = rng.integers(1, 2**64, size=n, dtype=np.uint64)
        added.append(ids)
        return ids

    def some_added(n: int) -> np.ndarray:
        everything = np.concatenate(added)
        return everything[rng.integers(0, everything.size, size=n)]

    while len(wheels["python"]) < 70_000:  # past the size from which the native wheel queues
        both("add", fresh(batch))
    both("add", fresh(batch))  # queued
    for op in ops:
        if op == "add_new":
            both("add", fresh(batch))
        elif op == "re_add":  # ids present, expired or discarded, some twice
            both("add", np.concatenate([some_added(batch // 2), fresh(batch // 2)]))
        elif op == "add_twice":  # the same ids twice in one batch, then again in the next
            ids = fresh(batch // 2)
            both("add", np.concatenate([ids, ids[::-1]]))
            both("add", ids[: batch // 4])
        elif op == "discard_new":  # discarded in the rotation they were added in
            ids = fresh(batch)
            both("add", ids)
            both("discard", np.concatenate([ids[::3], some_added(batch // 8)]))
        elif op == "touch":
            both("add", fresh(batch))
            both("touch", np.concatenate([some_added(batch // 4), fresh(16)]))
        elif op == "rotate":
            both("rotate")
        elif op == "len":
            assert len(wheels["native"]) == len(wheels["python"])
        else:
            probe = np.concatenate([some_added(200), rng.integers(1, 2**64, 20, np.uint64)])
            assert [int(k) in wheels["native"] for k in probe] == [
                int(k) in wheels["python"] for k in probe
            ]
    both("add", fresh(batch))
    for _ in range(num_buckets + 1):  # everything expires; the table shrinks back
        both("rotate")
        assert len(wheels["native"]) == len(wheels["python"])
    assert len(wheels["python"]) == 0
    c = native.debug_counters()
    assert c["queued"] > 0, c
    assert c["grows"] > 0, c
    assert c["shrinks"] > 0, c


@needs_native
@pytest.mark.parametrize("num_buckets", [2, 3, 5])
def test_timeout_wheel_runs_native_equal_fallback(num_buckets):
    """Rotations with only adds in between turn the native queue into sorted runs, which expire
    without ever entering the table; an id re-added in a later rotation is in two runs (and in
    the table) and must expire once, at its last deadline; then a discard moves every run into
    the table. Each step against the fallback."""
    rng = np.random.default_rng(num_buckets)
    wheels = {b: TimeoutWheel(num_buckets, backend=b) for b in ("native", "python")}
    ids = rng.integers(1, 2**64, size=400_000, dtype=np.uint64)
    first = ids[:80_000]
    for w in wheels.values():
        w.add(first)
    for r in range(3 * num_buckets + 4):
        fresh = ids[80_000 + r * 20_000 : 100_000 + r * 20_000]
        again = np.concatenate([fresh[::7], first[r::13], ids[80_000 : 80_000 + r * 20_000 : 11]])
        for w in wheels.values():
            w.add(fresh)
            w.add(again)  # repeats within the rotation, of older runs and of table entries
        _same(*(np.sort(w.rotate()) for w in wheels.values()), "rotate")
    native = wheels["native"]._impl
    assert native.rotation == wheels["python"]._impl.rotation
    gone = ids[::5]
    for w in wheels.values():
        w.add(ids[300_000:330_000])
        w.discard(gone)
    assert len(wheels["native"]) == len(wheels["python"])
    while len(wheels["python"]):
        _same(*(np.sort(w.rotate()) for w in wheels.values()), "rotate")
    assert len(wheels["native"]) == 0
    c = native.debug_counters()
    assert c["runs"] > 0, c
    assert c["merges"] > 0, c
