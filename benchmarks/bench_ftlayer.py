"""FT layer benchmarks: persist + XOR to completion per storage, and timeout rotations.

    PYTHONPATH=python python -m pytest benchmarks/bench_ftlayer.py --benchmark-enable \
        -p no:cacheprovider

Targets (DESIGN.md): persist + xor to completion in batches of 64 K, >= 1 M source records/s
with MemoryStorage and >= 150 K/s with SQLiteStorage; one timeout rotation over 1 M pending
records < 100 ms. Each figure is also in ``extra_info`` (``records_per_s``, ``ms``).
Sizes: ``XORACK_BENCH_FT_RECORDS`` (default 1,048,576) and ``XORACK_BENCH_FT_SQLITE_RECORDS``
(default 262,144) records; the payload is an int64, a float64 and a short string per record.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from xorack import FTLayer

BATCH = 65536
RECORDS = int(float(os.environ.get("XORACK_BENCH_FT_RECORDS", str(16 * BATCH))))
SQLITE_RECORDS = int(float(os.environ.get("XORACK_BENCH_FT_SQLITE_RECORDS", str(4 * BATCH))))


def make_batches(n: int, seed: int = 0) -> list[tuple[pa.RecordBatch, np.ndarray, np.ndarray]]:
    """(payload, key_hash, births) per batch of 64 K records."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, n, BATCH):
        ids = np.arange(start, min(n, start + BATCH))
        payload = pa.record_batch(
            {
                "id": ids,
                "amount": ids * 0.25,
                "country": pa.array(ids % 200).cast(pa.string()),
            }
        )
        key_hash = rng.integers(-(2**31), 2**31, len(ids), dtype=np.int64).astype(np.int32)
        births = rng.integers(1, 2**63, len(ids), dtype=np.uint64)
        out.append((payload, key_hash, births))
    return out


def persist_and_complete(ft: FTLayer, batches, lag: int) -> int:
    """Persist every batch; complete each one ``lag`` batches later (``lag`` x 64 K pending)."""
    done = 0
    in_flight = []
    for payload, key_hash, births in batches:
        in_flight.append((ft.persist(payload, key_hash=key_hash, births=births), births))
        if len(in_flight) > lag:
            src, b = in_flight.pop(0)
            done += len(ft.xor(src, b))
    for src, b in in_flight:
        done += len(ft.xor(src, b))
    return done


@pytest.mark.parametrize("lag", [0, 4], ids=["no-backlog", "backlog-256K"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_persist_xor_to_completion(benchmark, tmp_path, kind, lag):
    """Source records/s through persist + xor (each record completes) + storage delete, with
    each batch completed at once or 4 batches later (256 K records pending meanwhile)."""
    n = RECORDS if kind == "memory" else SQLITE_RECORDS
    batches = make_batches(n)
    layers: list[FTLayer] = []
    counter = iter(range(1000))

    def setup():
        spec = "memory" if kind == "memory" else f"sqlite:///{tmp_path}/ft{next(counter)}.db"
        layers.append(FTLayer(spec))
        return (layers[-1], batches, lag), {}

    done = benchmark.pedantic(persist_and_complete, setup=setup, rounds=3, iterations=1)
    for ft in layers:
        assert ft.pending == 0
        ft.close()
    assert done == n
    rate = n / benchmark.stats.stats.median
    benchmark.extra_info.update(
        records=n, records_per_s=rate, target=1e6 if kind == "memory" else 1.5e5
    )


@pytest.fixture(scope="module")
def million_pending():
    """An FT layer (MemoryStorage) holding RECORDS pending records that do not time out."""
    ft = FTLayer("memory", num_buckets=10_000)  # nothing expires during the rounds
    for payload, key_hash, births in make_batches(RECORDS, seed=1):
        ft.persist(payload, key_hash=key_hash, births=births)
    yield ft
    ft.close()


def test_rotation_over_pending_records(benchmark, million_pending):
    """One timeout rotation with RECORDS pending records (the steady-state tick)."""
    ft = million_pending
    expired = benchmark.pedantic(ft.rotate, rounds=20, iterations=1)
    assert expired.size == 0
    assert ft.pending == RECORDS
    benchmark.extra_info.update(
        pending=RECORDS, ms=benchmark.stats.stats.median * 1e3, target_ms=100
    )


def test_rotation_with_new_orphans(benchmark, million_pending):
    """A rotation that must find new orphan entries among RECORDS pending (full table scan)."""
    ft = million_pending
    orphan = iter(range(1, 10**6))

    def setup():
        ft.xor(np.array([next(orphan) << 20], np.uint64), np.array([7], np.uint64))
        return (), {}

    benchmark.pedantic(ft.rotate, setup=setup, rounds=5, iterations=1)
    benchmark.extra_info.update(pending=RECORDS, ms=benchmark.stats.stats.median * 1e3)


def test_rotation_expiring_everything(benchmark):
    """A rotation at which all RECORDS pending records time out: replays/s created (routing,
    new ids, births registered, storage re-keyed), then handed out by take_replays."""
    layers: list[FTLayer] = []
    batches = make_batches(RECORDS, seed=2)

    def setup():
        ft = FTLayer("memory", num_buckets=1, default_partitions=200)
        for payload, key_hash, births in batches:
            ft.persist(payload, key_hash=key_hash, births=births)
        layers.append(ft)
        return (ft,), {}

    def expire_and_take(ft: FTLayer) -> int:
        ft.rotate()
        return sum(t.num_rows for t in ft.take_replays().values())

    replayed = benchmark.pedantic(expire_and_take, setup=setup, rounds=2, iterations=1)
    assert replayed == RECORDS
    for ft in layers:
        ft.close()
    benchmark.extra_info.update(
        records=RECORDS, replays_per_s=RECORDS / benchmark.stats.stats.median
    )
