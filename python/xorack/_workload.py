"""The acker workload shared by ``xorack bench`` and ``benchmarks/``: record trees as the
real protocol produces them, their events shuffled across batches.

Each source record is born with one root record (its birth value is the root's id). Three
stages follow, as in the demo pipeline:

1. a fan-out stage (sentence -> words): the root gets 1..``max_fanout`` children and sends one
   combined event (root id XOR all children's ids);
2. a filter/map stage: each child is dropped with probability ``drop_rate`` (event = its id) or
   replaced by one new record (event = its id XOR the new id);
3. a sink that acks every record it consumes (event = its id).

The births come first (a source registers before it emits, so no event can overtake its birth);
the events are then shuffled over the whole run and cut into batches, so a batch mixes events of
many sources and a source's events are spread over many batches.

>>> w = generate_workload(1000, seed=1)
>>> w.num_sources, 6.0 < w.events_per_source < 7.0
(1000, True)
>>> from xorack._dict_acker import DictAcker
>>> a = DictAcker()
>>> _ = a.register(w.src_ids, w.births)
>>> done = sum(len(a.xor(s, v)) for s, v in w.event_batches(65536))
>>> done == w.num_sources and len(a) == 0
True
>>> run_acker(DictAcker(), w)
1000
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_BATCH = 65_536
"""Events per acker call (DESIGN.md: batches of 64 K events)."""


@dataclass(frozen=True)
class Workload:
    """Births and shuffled events of ``num_sources`` record trees (all ``uint64``)."""

    src_ids: np.ndarray
    births: np.ndarray
    event_src: np.ndarray
    event_xor: np.ndarray
    seed: int

    @property
    def num_sources(self) -> int:
        """Number of source records."""
        return len(self.src_ids)

    @property
    def num_events(self) -> int:
        """Number of events after the births (one per input row per stage)."""
        return len(self.event_src)

    @property
    def events_per_source(self) -> float:
        """Births + events, per source record."""
        return (self.num_sources + self.num_events) / max(1, self.num_sources)

    @property
    def nbytes(self) -> int:
        """Memory held by the workload arrays."""
        return sum(a.nbytes for a in (self.src_ids, self.births, self.event_src, self.event_xor))

    def birth_batches(self, batch: int = DEFAULT_BATCH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(src_ids, births) slices of at most ``batch`` rows (views, no copies)."""
        for lo in range(0, self.num_sources, batch):
            yield self.src_ids[lo : lo + batch], self.births[lo : lo + batch]

    def event_batches(self, batch: int = DEFAULT_BATCH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(src_ids, values) slices of at most ``batch`` shuffled events (views, no copies)."""
        for lo in range(0, self.num_events, batch):
            yield self.event_src[lo : lo + batch], self.event_xor[lo : lo + batch]


def _random_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random nonzero uint64 ids (0 is never a valid id)."""
    ids = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    ids[ids == 0] = 1
    return ids


def generate_workload(
    num_sources: int,
    *,
    max_fanout: int = 4,
    drop_rate: float = 0.2,
    seed: int = 0,
) -> Workload:
    """Generates ``num_sources`` record trees and their shuffled events (about 6 per source).

    Vectorized: ~1 s per 10 M source records. Memory: ~16 bytes per event + 16 per source.
    """
    if num_sources < 1:
        raise ValueError(f"num_sources must be >= 1, got {num_sources}")
    if max_fanout < 1:
        raise ValueError(f"max_fanout must be >= 1, got {max_fanout}")
    rng = np.random.default_rng(seed)
    src = _random_ids(rng, num_sources)
    root = _random_ids(rng, num_sources)

    # Stage 1, fan-out: one combined event per root = root ^ XOR(children).
    fanout = rng.integers(1, max_fanout + 1, size=num_sources)
    offsets = np.zeros(num_sources, dtype=np.int64)
    np.cumsum(fanout[:-1], out=offsets[1:])
    parent = np.repeat(np.arange(num_sources), fanout)
    child = _random_ids(rng, len(parent))
    ev1 = root ^ np.bitwise_xor.reduceat(child, offsets)

    # Stage 2, filter/map: a dropped child is acked alone, a kept one is anchored to its successor.
    keep = rng.random(len(child)) >= drop_rate
    successor = _random_ids(rng, len(child))
    ev2 = child ^ np.where(keep, successor, np.uint64(0))

    # Stage 3, sink: acks what it consumes.
    ev3 = successor[keep]

    event_src = np.concatenate([src, src[parent], src[parent[keep]]])
    event_xor = np.concatenate([ev1, ev2, ev3])
    order = rng.permutation(len(event_src))
    return Workload(
        src_ids=src,
        births=root,
        event_src=event_src[order],
        event_xor=event_xor[order],
        seed=seed,
    )


def run_acker(acker: Any, w: Workload, batch: int = DEFAULT_BATCH) -> int:
    """Feeds the whole workload to ``acker`` (births first, then the shuffled events, in calls
    of ``batch``); returns the number of completions it reported."""
    done = 0
    for src, births in w.birth_batches(batch):
        done += len(acker.register(src, births))
    for src, values in w.event_batches(batch):
        done += len(acker.xor(src, values))
    return done
