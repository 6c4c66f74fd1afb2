"""The acker's steady state ("churn"), measured the same way by ``xorack bench`` and by
``benchmarks/bench_acker.py``.

``pending`` source ids wait (1 M by default); each round completes the ``batch`` oldest ones
(their final acks: one ``xor`` call of ``batch`` events) and registers ``batch`` new ones (one
``register`` call), so the table stays at ``pending`` ids: half the events are registrations of
new ids, half final acks. A ``TimeoutWheel(3)`` follows the same churn (the new ids added, the
completed ones discarded; no rotation: a timeout spans many batches), timed apart. The yardstick
is the random 64-byte read rate over an array the size of the table, measured in the same run,
before and after the rounds (``xorack._native.random_read_rate``; the best of those is the
fairest figure on a shared machine).

>>> run = run_churn("python", pending=2_000, batch=500, rounds=2)
>>> run.rounds, run.events_per_round, len(run.table_seconds)
(2, 1000, 2)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from . import kernels
from .acker import AckTable, TimeoutWheel

__all__ = ["ChurnRun", "run_churn"]

READS = 1 << 22  # random reads per yardstick measurement


@dataclass
class ChurnRun:
    """One churn measurement of one backend."""

    backend: str
    pending: int
    batch: int
    rounds: int
    table_seconds: list[float]  # per round: xor (complete) + register (new), 2 * batch events
    wheel_seconds: list[float]  # per round: discard (completed) + add (new) on the wheel
    read_rates: list[float] = field(default_factory=list)  # random 64-byte reads/s, same run
    table_bytes: int = 0  # AckTable.nbytes after the rounds
    wheel_bytes: int = 0  # TimeoutWheel.nbytes after the rounds

    @property
    def events_per_round(self) -> int:
        """Events per round: ``batch`` final acks + ``batch`` registrations."""
        return 2 * self.batch

    def rates(self) -> list[float]:
        """AckTable events/s of each round."""
        return [self.events_per_round / s for s in self.table_seconds]

    def median_rate(self) -> float:
        """Median AckTable events/s over the rounds."""
        return statistics.median(self.rates())

    def read_rate(self) -> float | None:
        """The best random-read rate of the run (None without the native helper)."""
        return max(self.read_rates) if self.read_rates else None

    def bytes_per_pending(self) -> float:
        """Table + wheel bytes per pending id, in the churn's steady state."""
        return (self.table_bytes + self.wheel_bytes) / self.pending


def _read_rate(nbytes: int, seed: int) -> float | None:
    if not kernels.native_available():
        return None
    return float(kernels.get_impl("native").random_read_rate(nbytes, READS, seed))


def run_churn(
    backend: str,
    pending: int = 1_000_000,
    batch: int = 1 << 16,
    rounds: int = 20,
    seed: int = 0,
) -> ChurnRun:
    """Fills an AckTable (and a wheel) with ``pending`` ids, then times ``rounds`` churn rounds.

    Raises ``ValueError`` when ``batch`` exceeds ``pending`` (a round would complete ids that
    are not pending).
    """
    if not 0 < batch <= pending:
        raise ValueError(f"batch must be in [1, pending={pending}], got {batch}")
    rng = np.random.default_rng(seed)
    total = pending + rounds * batch
    ids = np.unique(rng.integers(1, 2**64, size=total + total // 50 + 16, dtype=np.uint64))
    ids = rng.permutation(ids)[:total]
    births = rng.integers(1, 2**64, size=total, dtype=np.uint64)
    table = AckTable(backend=backend)
    wheel = TimeoutWheel(3, backend=backend)
    for lo in range(0, pending, batch):  # grown the way a running acker grows
        table.register(ids[lo : min(lo + batch, pending)], births[lo : min(lo + batch, pending)])
        wheel.add(ids[lo : min(lo + batch, pending)])
    reads = [r for r in (_read_rate(table.nbytes, s) for s in (1, 2)) if r]
    table_s, wheel_s = [], []
    for r in range(rounds):
        done = slice(r * batch, (r + 1) * batch)
        new = slice(pending + r * batch, pending + (r + 1) * batch)
        t0 = time.perf_counter()
        completed = table.xor(ids[done], births[done])
        table.register(ids[new], births[new])
        t1 = time.perf_counter()
        wheel.discard(ids[done])
        wheel.add(ids[new])
        t2 = time.perf_counter()
        if len(completed) != batch:
            raise AssertionError(f"churn round {r}: {len(completed)} of {batch} ids completed")
        table_s.append(t1 - t0)
        wheel_s.append(t2 - t1)
    reads += [r for r in (_read_rate(table.nbytes, s) for s in (3, 4)) if r]
    if len(table) != pending or len(wheel) != pending:
        raise AssertionError(f"churn: {len(table)}/{len(wheel)} ids pending, expected {pending}")
    return ChurnRun(
        backend,
        pending,
        batch,
        rounds,
        table_s,
        wheel_s,
        reads,
        table.nbytes,
        wheel.nbytes,
    )
