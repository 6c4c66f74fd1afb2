"""Sharded acker scaling: XOR events/s and persisted records/s from several client processes
against 1, 2 and 4 acker shard processes on loopback (a script: one table, ratios from one run).

    python benchmarks/bench_shards.py [--clients 2,4] [--shards 1,2,4]
        [--records 131072] [--batches 4] [--rounds 3] [--allow-fallback]

Run it where xorack is installed with its C++ extension (``pip install .``); from a checkout
without an in-place build (``PYTHONPATH=python``) the kernels are the pure-Python fallback, and
the script refuses to measure them unless told ``--allow-fallback`` (the table then says so).

Every acker is ``xorack serve --shard k/N`` processes started by ``ShardedAcker`` (1 shard = one
acker process, the same code path as a standalone ``xorack serve``), memory storage. Each client
process (``bench_service.py --worker``) persists ``--records`` records in 64 K batches, then, on
each round, sends ``--batches`` batches of 64 K pre-reduced XOR events on its own pending ids
(random values: nothing completes, the tables keep their size). A round's rate is all clients'
events over the wall time from the start signal to the last client's answer; the table gives the
median of ``--rounds`` rounds and the speed-up over 1 shard with the same clients.

What the figures can show depends on the cores: N shards can only apply events N times as fast
when N cores are free for them besides the clients' own. On a 2-core machine with 2-4 client
processes, shards compete with the clients for the same two cores: the table then shows the cost
of the routing (a client splits each batch by shard and calls every shard) more than the gain.
So the table also gives the acker side's CPU time per 1 000 events (all shards together, from
``/proc``) and its *capacity*: the events of the timed rounds over the busiest shard's CPU
seconds, i.e. the rate the shards would sustain with a core each. That figure is what scales
with N on a machine with the cores; the wall-clock rate shows it only there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("bench_service.py")
BATCH = 1 << 16


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(shards: int, clients: int, records: int, batches: int, rounds: int) -> dict:
    """One (shards, clients) cell: persist and xor rates."""
    sys.path.insert(0, str(ROOT / "python"))
    from xorack.shards import ShardedAcker

    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    with ShardedAcker(shards, serve_args=["--rotate-interval", "0"]) as acker:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    "--worker",
                    acker.location,
                    str(records),
                    str(batches),
                    str(100 + k),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
            for k in range(clients)
        ]
        try:
            ready = [json.loads(p.stdout.readline()) for p in procs]
            persist_rate = sum(r["records"] for r in ready) / max(r["persist_s"] for r in ready)
            rates = []
            cpu0: list[float] = []
            events = 0
            for r in range(rounds + 1):  # the first round warms up
                if r == 1:
                    cpu0 = [cpu_seconds(pid) for pid in acker.pids]
                t0 = time.perf_counter()
                for p in procs:
                    p.stdin.write("xor\n")
                    p.stdin.flush()
                answers = [json.loads(p.stdout.readline()) for p in procs]
                wall = time.perf_counter() - t0
                rates.append(sum(a["events"] for a in answers) / wall)
                events += sum(a["events"] for a in answers) if r else 0
            cpu = [cpu_seconds(pid) - c for pid, c in zip(acker.pids, cpu0, strict=True)]
        finally:
            for p in procs:
                p.stdin.close()
                p.wait(timeout=60)
                p.stdout.close()
    return {
        "shards": shards,
        "clients": clients,
        "persist_records_per_s": persist_rate,
        "xor_events_per_s": statistics.median(rates[1:]),
        "xor_events_per_s_best": max(rates[1:]),
        # what the acker side could take if each shard had a core of its own: the events over
        # the busiest shard's CPU time (persist and xor rounds alike are measured per shard)
        "capacity_events_per_s": events / max(max(cpu), 1e-9),
        "acker_cpu_us_per_1k_events": sum(cpu) / events * 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=_ints, default=[2, 4], help="client process counts")
    ap.add_argument("--shards", type=_ints, default=[1, 2, 4], help="shard counts")
    ap.add_argument("--records", type=int, default=2 * BATCH, help="records per client")
    ap.add_argument("--batches", type=int, default=4, help="64 K xor batches per client/round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per cell")
    ap.add_argument("--json", action="store_true", help="print the cells as JSON lines too")
    ap.add_argument(
        "--allow-fallback",
        action="store_true",
        help="measure even when the kernels are the pure-Python fallback",
    )
    args = ap.parse_args(argv)
    import xorack

    backend = xorack.backend  # the shard and client processes inherit this environment
    if backend != "native" and not args.allow_fallback:
        print(
            f"bench_shards: the kernels here are the {backend!r} backend (no C++ extension: "
            f"xorack from {Path(xorack.__file__).parent}); install xorack with it "
            "(pip install .), or pass --allow-fallback to measure the fallback",
            file=sys.stderr,
        )
        return 2
    load0 = os.getloadavg()[0]
    cells = []
    for clients in args.clients:
        for shards in args.shards:
            cell = measure(shards, clients, args.records, args.batches, args.rounds)
            cells.append(cell)
            if args.json:
                print(json.dumps(cell), flush=True)
    print(
        f"sharded acker on loopback, {backend} kernels: {os.cpu_count()} cores, load average "
        f"{load0:.1f} -> {os.getloadavg()[0]:.1f}; {args.records:,} records and "
        f"{args.batches} x 64K xor events per client per round, median of {args.rounds} rounds"
    )
    print(
        "| clients | shards | xor M events/s (best) | vs 1 shard | persist K records/s "
        "| acker CPU us / 1K events | capacity M events/s (vs 1 shard) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cell in cells:
        base = next(
            (c for c in cells if c["clients"] == cell["clients"] and c["shards"] == 1), None
        )
        ratio = cell["xor_events_per_s"] / base["xor_events_per_s"] if base else float("nan")
        cap = cell["capacity_events_per_s"]
        cap_ratio = cap / base["capacity_events_per_s"] if base else float("nan")
        print(
            f"| {cell['clients']} | {cell['shards']} | {cell['xor_events_per_s'] / 1e6:.2f} "
            f"({cell['xor_events_per_s_best'] / 1e6:.2f}) | {ratio:.2f} | "
            f"{cell['persist_records_per_s'] / 1e3:.0f} | "
            f"{cell['acker_cpu_us_per_1k_events']:.0f} | {cap / 1e6:.1f} ({cap_ratio:.2f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
