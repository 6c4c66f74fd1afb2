"""The benchmark baselines agree with xorack.AckTable: the Storm/Heron rotating-bucket acker in
C++ (``xorack._baselines.RotatingAcker``) and the plain ``dict`` acker, on small random workloads
(fast: a few thousand record trees)."""

from __future__ import annotations

import numpy as np
import pytest

import xorack
from xorack._dict_acker import DictAcker
from xorack._workload import generate_workload, run_acker

try:
    from xorack._baselines import RotatingAcker
except ImportError:  # pure-Python install: the C++ baseline is not built
    RotatingAcker = None

needs_baseline = pytest.mark.skipif(RotatingAcker is None, reason="xorack._baselines not built")


def _ackers(backend: str) -> dict[str, object]:
    out: dict[str, object] = {"AckTable": xorack.AckTable(backend=backend), "dict": DictAcker()}
    if RotatingAcker is not None:
        out["rotating"] = RotatingAcker(3)
    return out


def _calls(
    seed: int, sources: int, batch: int, early: bool
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """A protocol workload as a list of calls; with ``early``, births are interleaved at random
    among the event batches, so that some events overtake their birth."""
    w = generate_workload(sources, seed=seed)
    births = [("register", s, b) for s, b in w.birth_batches(batch)]
    events = [("xor", s, v) for s, v in w.event_batches(batch)]
    if not early:
        return births + events
    rng = np.random.default_rng(seed)
    calls = births + events
    return [calls[i] for i in rng.permutation(len(calls))]


@pytest.mark.parametrize("early", [False, True], ids=["births-first", "events-early"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_completions_call_by_call(backend: str, seed: int, early: bool) -> None:
    ackers = _ackers(backend)
    w_sources = 1500
    total = dict.fromkeys(ackers, 0)
    for kind, src, values in _calls(seed, w_sources, batch=257, early=early):
        results = {
            name: sorted(getattr(a, kind)(src, values).tolist()) for name, a in ackers.items()
        }
        reference = results.pop("AckTable")
        for name, got in results.items():
            assert got == reference, f"{name} differs from AckTable on a {kind} call"
        for name in ackers:
            total[name] += len(reference)
    assert all(t == w_sources for t in total.values())
    assert all(len(a) == 0 for a in ackers.values())


def test_completes_only_on_the_last_event() -> None:
    """No subset of a tree's events completes it: each source completes in the call holding the
    last of its birth and events (checked on the dict acker and the C++ baseline)."""
    w = generate_workload(800, seed=7)
    src = np.concatenate([w.src_ids, w.event_src])
    val = np.concatenate([w.births, w.event_xor])
    last_call = {}
    batch = 101
    for i, s in enumerate(src.tolist()):
        last_call[s] = i // batch
    for acker in [DictAcker()] + ([RotatingAcker(3)] if RotatingAcker else []):
        for k, lo in enumerate(range(0, len(src), batch)):
            s, v = src[lo : lo + batch], val[lo : lo + batch]
            fn = acker.register if lo < w.num_sources and lo + batch <= w.num_sources else None
            done = fn(s, v) if fn else _mixed(acker, s, v, lo, w.num_sources)
            assert all(last_call[x] == k for x in done.tolist())
        assert len(acker) == 0


def _mixed(acker, s: np.ndarray, v: np.ndarray, lo: int, births: int) -> np.ndarray:
    """A call straddling the births/events boundary: register the births part, xor the rest."""
    cut = max(0, min(len(s), births - lo))
    return np.concatenate([acker.register(s[:cut], v[:cut]), acker.xor(s[cut:], v[cut:])])


@pytest.mark.parametrize("make", [DictAcker, RotatingAcker], ids=["dict", "rotating"])
def test_duplicated_unregistered_events_are_dropped_silently(make) -> None:
    if make is None:
        pytest.skip("xorack._baselines not built")
    a = make()
    ids = np.array([5], dtype=np.uint64)
    ev = np.array([3], dtype=np.uint64)
    assert a.xor(ids, ev).tolist() == []
    assert a.xor(ids, ev).tolist() == []
    assert len(a) == 0
    assert a.register(ids, ev).tolist() == []  # no early value left: a plain birth
    assert a.xor(ids, ev).tolist() == [5]


@needs_baseline
def test_rotating_acker_expires_after_num_buckets_rotations() -> None:
    a = RotatingAcker(3)
    first = np.array([1, 2, 3], dtype=np.uint64)
    a.register(first, first)
    assert a.xor(np.array([2], np.uint64), np.array([2], np.uint64)).tolist() == [2]
    assert a.rotate().tolist() == []
    later = np.array([4], dtype=np.uint64)
    a.register(later, later)
    assert a.rotate().tolist() == []
    assert sorted(a.rotate().tolist()) == [1, 3]  # the completed id 2 never expires
    assert a.rotate().tolist() == [4]
    assert len(a) == 0


@needs_baseline
def test_rotating_acker_counts_its_memory() -> None:
    a = RotatingAcker(3)
    empty = a.nbytes
    ids = np.arange(1, 10_001, dtype=np.uint64)
    a.register(ids, ids)
    assert a.allocations >= 10_000
    # a node is 24 bytes (next, key, value): at least a 32-byte glibc chunk, plus bucket arrays
    assert 32 <= (a.nbytes - empty) / 10_000 < 80
    a.xor(ids, ids)
    assert len(a) == 0
    assert a.nbytes - empty < 10_000 * 16  # nodes freed (bucket arrays stay)


@needs_baseline
def test_rotating_acker_rejects_bad_input() -> None:
    a = RotatingAcker(3)
    with pytest.raises(TypeError, match="src_ids must be uint64"):
        a.xor(np.array([1.0]), np.array([1], np.uint64))
    with pytest.raises(ValueError, match="same length"):
        a.xor(np.array([1, 2], np.uint64), np.array([1], np.uint64))
    with pytest.raises(ValueError, match="num_buckets"):
        RotatingAcker(0)
    assert a.register([7], [5]).tolist() == []  # lists are converted
    assert a.xor([7], [5]).tolist() == [7]


def test_run_acker_completes_every_source() -> None:
    w = generate_workload(3000, seed=11)
    assert run_acker(DictAcker(), w, batch=512) == 3000
    if RotatingAcker is not None:
        assert run_acker(RotatingAcker(3), w, batch=512) == 3000
