"""Acker service benchmarks: XOR events and persisted records through Arrow Flight.

    PYTHONPATH=python python -m pytest benchmarks/bench_service.py --benchmark-enable \
        -p no:cacheprovider

The service runs embedded (a thread of the benchmark process, loopback, like in the Spark driver)
over a memory-storage FT layer. Figures (also in each benchmark's ``extra_info``, printed under
"xorack figures"):

- xor events/s from one client, batches of 64 K pre-reduced events (steady state: the events hit
  ``XORACK_BENCH_SVC_PENDING`` registered records, default 2^20, and never complete them);
- xor events/s from ``XORACK_BENCH_SVC_PROCS`` client processes at once (default 2), each
  sending ``XORACK_BENCH_SVC_BATCHES`` batches of 64 K per round (default 8);
- the round trip of a small call (64 events; ping): the per-call overhead;
- persist records/s through the service vs ``FTLayer.persist`` called directly (the overhead
  of the wire), batches of 64 K records (int64, float64, short string + key hash + births).

Run ``python benchmarks/bench_service.py --worker ...`` only through this module (it is the
client process of the multi-process benchmark).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

BATCH = 1 << 16
PENDING = int(float(os.environ.get("XORACK_BENCH_SVC_PENDING", str(16 * BATCH))))
PROCS = int(os.environ.get("XORACK_BENCH_SVC_PROCS", "2"))
BATCHES = int(os.environ.get("XORACK_BENCH_SVC_BATCHES", "8"))


def make_payload(n: int, start: int = 0) -> pa.RecordBatch:
    """A source batch: an int64, a float64 and a short string per record."""
    ids = np.arange(start, start + n)
    return pa.record_batch(
        {"id": ids, "amount": ids * 0.25, "country": pa.array(ids % 200).cast(pa.string())}
    )


def persist_pending(client, n: int, seed: int) -> np.ndarray:
    """Persist ``n`` records in batches of 64 K; their source ids."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, n, BATCH):
        m = min(BATCH, n - start)
        births = rng.integers(1, 2**63, m, dtype=np.uint64)
        key_hash = rng.integers(-(2**31), 2**31, m, dtype=np.int64).astype(np.int32)
        out.append(client.persist(make_payload(m, start), key_hash=key_hash, births=births))
    return np.concatenate(out) if out else np.empty(0, np.uint64)


def event_batches(src: np.ndarray, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of 64 K events on distinct registered ids, random nonzero values (so no
    record completes: the table stays at its size)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = src[rng.choice(len(src), size=min(BATCH, len(src)), replace=False)]
        values = rng.integers(1, 2**63, len(ids), dtype=np.uint64)
        out.append((ids, values))
    return out


# ---- the client process of the multi-process benchmark ------------------------------------


def _worker(location: str, records: int, batches: int, seed: int, send: str = "direct") -> None:
    """Persist ``records``, then on each "xor" line send ``batches`` batches and report.

    ``send``: ``direct`` = one ``xor`` call per batch (a sharded client splits each into one
    request per shard); ``coalesced`` = ``xor_deferred`` per batch and a ``flush`` at the end
    of the round (each shard's events go as requests of up to ``deferred.limit`` events), as a
    Spark task defers its events and flushes before it ends, each request sent while the
    client waits; ``split`` = the same, each batch split by shard and then copied into the
    shards' buffers (two passes, where ``coalesced`` scatters it straight into them);
    ``background`` = ``coalesced``, each request sent by the buffer's thread while the client
    goes on with its next batches (``client.deferred.background``)."""
    import xorack
    from xorack.service import AckerClient

    if send not in ("direct", "split", "coalesced", "background"):
        raise SystemExit(
            f"--worker: send must be direct, split, coalesced or background, got {send!r}"
        )
    import xorack.client

    xorack.client.SCATTER_EVENTS = send != "split"
    client = AckerClient.get(location)
    # coalesced: each full shard's request sent while the client waits; background: sent by
    # the buffer's thread while the client goes on (client.deferred.background, off by default)
    client.deferred.background = send == "background"
    t0 = time.perf_counter()
    src = persist_pending(client, records, seed)
    persist_s = time.perf_counter() - t0
    events = event_batches(src, batches, seed + 1)
    ready = {"ready": True, "persist_s": persist_s, "records": len(src)}
    ready |= {"backend": xorack.backend, "xorack": str(Path(xorack.__file__).resolve().parent)}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() != "xor":
            break
        t0 = time.perf_counter()
        sent0 = client.deferred.requests
        if send == "direct":
            for ids, values in events:
                client.xor(ids, values)
        else:
            for ids, values in events:
                client.xor_deferred(ids, values)
            client.flush()
        elapsed = time.perf_counter() - t0
        n = sum(len(ids) for ids, _ in events)
        report = {"xor_s": elapsed, "events": n, "cpu_s": time.process_time()}
        report["coalesced_requests"] = client.deferred.requests - sent0
        print(json.dumps(report), flush=True)


# ---- benchmarks -----------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    from native_only import child_env
    from xorack import FTLayer
    from xorack.service import AckerClient, AckerService

    @pytest.fixture(scope="module")
    def acker():
        with FTLayer(storage="memory") as ft, AckerService.embedded(ft) as svc:
            client = AckerClient(svc.location)
            src = persist_pending(client, PENDING, seed=1)
            yield ft, svc, client, src
            client.close()

    def _rate(benchmark, items: int, unit: str) -> tuple[float, float]:
        stats = benchmark.stats.stats
        median, best = items / stats.median, items / stats.min
        benchmark.extra_info[f"{unit}_per_s"] = median
        benchmark.extra_info[f"{unit}_per_s_best"] = best
        return median, best

    def test_xor_one_client(benchmark, acker, bench_report):
        """XOR events/s, one client, 64 K events per call."""
        _ft, _svc, client, src = acker
        batches = event_batches(src, 4, seed=2)
        it = iter(range(1 << 30))

        def one_call():
            ids, values = batches[next(it) % len(batches)]
            return client.xor(ids, values)

        benchmark.pedantic(one_call, rounds=24, iterations=1, warmup_rounds=2)
        median, best = _rate(benchmark, BATCH, "events")
        bench_report.append(
            f"service xor, 1 client, 64K events/call: {median / 1e6:.2f} M events/s "
            f"(best {best / 1e6:.2f} M; {benchmark.stats.stats.median * 1e3:.2f} ms/call)"
        )

    def test_small_call_round_trip(benchmark, acker, bench_report):
        """The per-call overhead: a 64-event xor."""
        _ft, _svc, client, src = acker
        ids = src[:64]
        values = np.arange(1, 65, dtype=np.uint64)
        benchmark.pedantic(client.xor, args=(ids, values), rounds=400, iterations=1)
        t0 = time.perf_counter()
        for _ in range(400):
            client.ping()
        ping_us = (time.perf_counter() - t0) / 400 * 1e6
        call_us = benchmark.stats.stats.median * 1e6
        benchmark.extra_info["xor64_us"] = call_us
        benchmark.extra_info["ping_us"] = ping_us
        bench_report.append(
            f"service round trip: xor of 64 events {call_us:.0f} us (median), "
            f"ping {ping_us:.0f} us (mean)"
        )

    def test_persist_one_client(benchmark, acker, bench_report):
        """Records/s through the service's persist, vs FTLayer.persist in-process."""
        ft, _svc, client, _src = acker
        rng = np.random.default_rng(3)
        payload = make_payload(BATCH)
        key_hash = rng.integers(-(2**31), 2**31, BATCH, dtype=np.int64).astype(np.int32)
        births = rng.integers(1, 2**63, BATCH, dtype=np.uint64)
        persisted: list[np.ndarray] = []

        def one_call():
            persisted.append(client.persist(payload, key_hash=key_hash, births=births))

        benchmark.pedantic(one_call, rounds=8, iterations=1, warmup_rounds=1)
        median, best = _rate(benchmark, BATCH, "records")
        direct = []
        for _ in range(8):
            t0 = time.perf_counter()
            persisted.append(ft.persist(payload, key_hash=key_hash, births=births))
            direct.append(time.perf_counter() - t0)
        direct_rate = BATCH / float(np.median(direct))
        benchmark.extra_info["direct_records_per_s"] = direct_rate
        for ids in persisted:  # leave the table as it was
            ft.xor(ids, births)
        bench_report.append(
            f"service persist, 64K records/call: {median / 1e3:.0f} K records/s "
            f"(best {best / 1e3:.0f} K); FTLayer.persist in-process {direct_rate / 1e3:.0f} K/s "
            f"(service/direct = {median / direct_rate:.2f})"
        )

    def test_xor_several_client_processes(benchmark, acker, bench_report):
        """XOR events/s with PROCS client processes sending at once (each its own connection)."""
        _ft, svc, _client, _src = acker
        env = child_env()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    svc.location,
                    str(4 * BATCH),
                    str(BATCHES),
                    str(100 + k),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
            for k in range(PROCS)
        ]
        try:
            ready = [json.loads(p.stdout.readline()) for p in procs]
            persist_rate = sum(r["records"] for r in ready) / max(r["persist_s"] for r in ready)
            per_round = []

            def one_round():
                for p in procs:
                    p.stdin.write("xor\n")
                    p.stdin.flush()
                per_round.append([json.loads(p.stdout.readline()) for p in procs])

            benchmark.pedantic(one_round, rounds=4, iterations=1, warmup_rounds=1)
        finally:
            for p in procs:
                p.stdin.close()
                p.wait(timeout=60)
                p.stdout.close()
        events = PROCS * BATCHES * BATCH
        median, best = _rate(benchmark, events, "events")
        benchmark.extra_info["persist_records_per_s_concurrent"] = persist_rate
        bench_report.append(
            f"service xor, {PROCS} client processes x {BATCHES} x 64K events: "
            f"{median / 1e6:.2f} M events/s (best {best / 1e6:.2f} M); concurrent persist "
            f"{persist_rate / 1e3:.0f} K records/s"
        )


if __name__ == "__main__":
    if len(sys.argv) in (6, 7) and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:])
    else:
        sys.exit(f"usage: run with pytest (see the module docstring); got {sys.argv[1:]}")
