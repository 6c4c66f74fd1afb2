"""The acker's steady state ("churn"), measured the same way by ``xorack bench`` and by
``benchmarks/bench_acker.py``.

``pending`` source ids wait (1 M by default); each round completes the ``batch`` oldest ones
(their final acks: one ``xor`` call of ``batch`` events) and registers ``batch`` new ones (one
``register`` call), so the table stays at ``pending`` ids: half the events are registrations of
new ids, half final acks. A ``TimeoutWheel(3)`` follows the same churn (the new ids added, the
completed ones discarded; no rotation: a timeout spans many batches), timed apart. Then a
second ``TimeoutWheel(3)`` runs the wheel's own steady state, add + rotate: ``pending`` ids at the
peak, each rotation adding ``pending / 3`` new ids (``batch`` per call) and expiring as many. The
yardstick is the random 64-byte read rate over an array the size of the table, measured in the
same run, before and after the rounds (``xorack._native.random_read_rate``; the best of those is
the fairest figure on a shared machine).

``python -m xorack._churn`` measures every target of the acker's steady state in one run (both
backends, the yardstick, the wheel, memory), ``--repeat`` times, and prints medians with their
spread.

>>> run = run_churn("python", pending=2_000, batch=500, rounds=2, wheel_rounds=2)
>>> run.rounds, run.events_per_round, len(run.table_seconds), run.wheel_rotation_ids
(2, 1000, 2, 666)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from . import kernels
from .acker import AckTable, TimeoutWheel

__all__ = ["ChurnRun", "main", "run_churn"]

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
    wheel_rotate_seconds: list[float] = field(default_factory=list)  # per rotation: adds + rotate
    wheel_rotation_ids: int = 0  # ids added (and expired) per rotation
    # The same timings in the thread's CPU time (time.thread_time; the native calls run in the
    # calling thread): on a shared machine they leave out the time other processes ran.
    table_cpu_seconds: list[float] = field(default_factory=list)
    read_rates_cpu: list[float] = field(default_factory=list)
    wheel_rotate_cpu_seconds: list[float] = field(default_factory=list)

    @property
    def events_per_round(self) -> int:
        """Events per round: ``batch`` final acks + ``batch`` registrations."""
        return 2 * self.batch

    def rates(self, cpu: bool = False) -> list[float]:
        """AckTable events/s of each round (wall time, or CPU time with ``cpu``)."""
        seconds = self.table_cpu_seconds if cpu else self.table_seconds
        return [self.events_per_round / s for s in seconds]

    def median_rate(self, cpu: bool = False) -> float:
        """Median AckTable events/s over the rounds."""
        return statistics.median(self.rates(cpu))

    def read_rate(self, cpu: bool = False) -> float | None:
        """The best random-read rate of the run (None without the native helper)."""
        rates = self.read_rates_cpu if cpu else self.read_rates
        return max(rates) if rates else None

    def wheel_rotate_rates(self, cpu: bool = False) -> list[float]:
        """TimeoutWheel add + rotate ids/s of each rotation."""
        seconds = self.wheel_rotate_cpu_seconds if cpu else self.wheel_rotate_seconds
        return [self.wheel_rotation_ids / s for s in seconds]

    def bytes_per_pending(self) -> float:
        """Table + wheel bytes per pending id, in the churn's steady state."""
        return (self.table_bytes + self.wheel_bytes) / self.pending


def _read_rate(nbytes: int, seed: int, cpu: bool = False) -> float | None:
    if not kernels.native_available():
        return None
    return float(kernels.get_impl("native").random_read_rate(nbytes, READS, seed, cpu))


def _read_rates(nbytes: int, seeds: tuple[int, int]) -> tuple[list[float], list[float]]:
    """Wall-time and CPU-time read rates, one of each per seed."""
    wall = [r for r in (_read_rate(nbytes, s) for s in seeds) if r]
    cpu = [r for r in (_read_rate(nbytes, s, cpu=True) for s in seeds) if r]
    return wall, cpu


def run_churn(
    backend: str,
    pending: int = 1_000_000,
    batch: int = 1 << 16,
    rounds: int = 20,
    seed: int = 0,
    wheel_rounds: int = 6,
) -> ChurnRun:
    """Fills an AckTable (and a wheel) with ``pending`` ids, then times ``rounds`` churn rounds,
    then ``wheel_rounds`` rotations of a wheel in its add + rotate steady state.

    Raises ``ValueError`` when ``batch`` exceeds ``pending`` (a round would complete ids that
    are not pending).
    """
    if not 0 < batch <= pending:
        raise ValueError(f"batch must be in [1, pending={pending}], got {batch}")
    rng = np.random.default_rng(seed)
    per_rotation = pending // 3
    total = pending + rounds * batch + (2 + wheel_rounds) * per_rotation
    ids = np.unique(rng.integers(1, 2**64, size=total + total // 50 + 16, dtype=np.uint64))
    ids = rng.permutation(ids)[:total]
    births = rng.integers(1, 2**64, size=total, dtype=np.uint64)
    table = AckTable(backend=backend)
    wheel = TimeoutWheel(3, backend=backend)
    for lo in range(0, pending, batch):  # grown the way a running acker grows
        table.register(ids[lo : min(lo + batch, pending)], births[lo : min(lo + batch, pending)])
        wheel.add(ids[lo : min(lo + batch, pending)])
    reads, reads_cpu = _read_rates(table.nbytes, (1, 2))
    table_s, wheel_s, table_cpu = [], [], []
    for r in range(rounds):
        done = slice(r * batch, (r + 1) * batch)
        new = slice(pending + r * batch, pending + (r + 1) * batch)
        c0, t0 = time.thread_time(), time.perf_counter()
        completed = table.xor(ids[done], births[done])
        table.register(ids[new], births[new])
        t1, c1 = time.perf_counter(), time.thread_time()
        wheel.discard(ids[done])
        wheel.add(ids[new])
        t2 = time.perf_counter()
        if len(completed) != batch:
            raise AssertionError(f"churn round {r}: {len(completed)} of {batch} ids completed")
        table_s.append(t1 - t0)
        table_cpu.append(max(c1 - c0, 1e-9))
        wheel_s.append(t2 - t1)
    more, more_cpu = _read_rates(table.nbytes, (3, 4))
    reads += more
    reads_cpu += more_cpu
    if len(table) != pending or len(wheel) != pending:
        raise AssertionError(f"churn: {len(table)}/{len(wheel)} ids pending, expected {pending}")
    table_bytes, wheel_bytes = table.nbytes, wheel.nbytes
    del table, wheel
    rotate_s, rotate_cpu = _wheel_add_rotate(
        ids[pending + rounds * batch :], per_rotation, batch, wheel_rounds, backend
    )
    return ChurnRun(
        backend,
        pending,
        batch,
        rounds,
        table_s,
        wheel_s,
        reads,
        table_bytes,
        wheel_bytes,
        rotate_s,
        per_rotation,
        table_cpu,
        reads_cpu,
        rotate_cpu,
    )


def _wheel_add_rotate(
    fresh: np.ndarray, per_rotation: int, batch: int, rounds: int, backend: str
) -> tuple[list[float], list[float]]:
    """Seconds (wall, CPU) of each of ``rounds`` rotations of a TimeoutWheel(3) in its steady
    state: two generations of ``per_rotation`` ids waiting, each rotation adds ``per_rotation``
    new ones (``batch`` per call) and expires the generation added three rotations before."""
    wheel = TimeoutWheel(3, backend=backend)

    def add(lo: int) -> None:
        for i in range(lo, lo + per_rotation, batch):
            wheel.add(fresh[i : min(i + batch, lo + per_rotation)])

    for g in range(2):
        add(g * per_rotation)
        wheel.rotate()
    seconds, cpu = [], []
    for r in range(rounds):
        c0, t0 = time.thread_time(), time.perf_counter()
        add((2 + r) * per_rotation)
        expired = wheel.rotate().size
        seconds.append(time.perf_counter() - t0)
        cpu.append(max(time.thread_time() - c0, 1e-9))
        if expired != per_rotation:
            raise AssertionError(f"wheel rotation {r}: {expired} of {per_rotation} ids expired")
    return seconds, cpu


def _fmt(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    """Median (min..max) of values / scale."""
    v = [x / scale for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}..{max(v):.{digits}f})"


def main(argv: Sequence[str] | None = None) -> None:
    """Every target of the acker's steady state, measured in one run per repeat (native and
    fallback churn, the read-rate yardstick, wheel add + rotate, bytes per pending id); prints
    the median and the spread (min..max) over the repeats as a Markdown table."""
    ap = argparse.ArgumentParser(prog="python -m xorack._churn", description=main.__doc__)
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--repeat", type=int, default=3, help="whole runs (default 3)")
    ap.add_argument("--rounds", type=int, default=20, help="native churn rounds per run")
    args = ap.parse_args(argv)
    if not kernels.native_available():
        raise SystemExit("python -m xorack._churn needs the native extension (xorack._native)")
    rows: dict[str, dict[str, list[float]]] = {}
    for rep in range(args.repeat):
        nat = run_churn("native", args.pending, args.batch, args.rounds, seed=rep)
        py = run_churn("python", args.pending, args.batch, 3, seed=rep, wheel_rounds=2)
        for clock, cpu in (("wall", False), ("CPU", True)):
            read = nat.read_rate(cpu) or float("nan")
            churn = nat.median_rate(cpu)
            figures = {
                "native churn, M events/s": churn / 1e6,
                "random 64-byte reads, M/s (best of 4)": read / 1e6,
                "churn ÷ read rate (target >= 0.35)": churn / read,
                "fallback churn, M events/s": py.median_rate(cpu) / 1e6,
                "churn native ÷ fallback (target >= 10)": churn / py.median_rate(cpu),
                "TimeoutWheel add+rotate, M ids/s (target >= 50)": statistics.median(
                    nat.wheel_rotate_rates(cpu)
                )
                / 1e6,
                "bytes per pending id, table + wheel (target <= 32)": nat.bytes_per_pending(),
                "  AckTable bytes per pending id": nat.table_bytes / nat.pending,
                "  TimeoutWheel bytes per pending id": nat.wheel_bytes / nat.pending,
            }
            for k, v in figures.items():
                rows.setdefault(k, {}).setdefault(clock, []).append(v)
        print(f"run {rep + 1}/{args.repeat} done", flush=True)
    print(
        f"\n{args.pending:,} pending ids, batches of {args.batch:,}: median (min..max) of "
        f"{args.repeat} runs; ratios within each run; wall time, and the thread's CPU time\n"
    )
    print("| figure | wall time | CPU time |\n| --- | --- | --- |")
    for name, by_clock in rows.items():
        d = 2 if "÷" in name else 1
        wall_s, cpu_s = _fmt(by_clock["wall"], digits=d), _fmt(by_clock["CPU"], digits=d)
        print(f"| {name} | {wall_s} | {cpu_s} |")


if __name__ == "__main__":
    main()
