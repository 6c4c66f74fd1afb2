"""Sharded acker scaling: XOR events/s and persisted records/s from several client processes
against 1, 2, 4 and 8 acker shard processes on loopback (a script: one table, ratios from one
run).

    python benchmarks/bench_shards.py [--clients 8] [--shards 1,2,4,8]
        [--send direct,coalesced (or split, background)] [--records 131072] [--batches 8]
        [--rounds 3] [--out results.json] [--allow-fallback]

Run it where xorack is installed with its C++ extension (``pip install .``, then run from the
checkout *without* ``PYTHONPATH=python``, or an editable install). The script, its client
processes and its shards all use the xorack it imported (``native_only.child_env``); it prints
which kernels the clients and every shard ran, and refuses to measure the pure-Python fallback
unless told ``--allow-fallback`` (the table then says so).

Every acker is ``xorack serve --shard k/N`` processes started by ``ShardedAcker`` (1 shard = one
acker process, the same code path as a standalone ``xorack serve``), memory storage. Each client
process (``bench_service.py --worker``) persists ``--records`` records in 64 K batches, then, on
each round, sends ``--batches`` batches of 64 K pre-reduced XOR events on its own pending ids
(random values: nothing completes, the tables keep their size), in one of four ways (``--send``,
cells interleaved shard count by shard count):

- ``direct``: one ``xor`` call per batch: a client of N shards sends every batch as N requests
  of 64K/N events (the behaviour before coalescing);
- ``split``: ``xor_deferred`` per batch and ``flush`` at the end of the round (what a Spark
  task does): each shard's events go as requests of 64 K (``EventBuffer``), whatever N, each
  sent while the client waits for its answer; each batch is split by shard, then copied into
  the shards' buffers (``client.SCATTER_EVENTS = False``: two passes);
- ``coalesced``: the same, each batch scattered by shard straight into the buffers (one pass,
  ``scatter_by_shard``; the default);
- ``background``: the same, each request sent by the buffer's own thread while the client goes
  on with its next batches (at most one send in flight; ``client.deferred.background``, off
  by default).

A round's rate is all clients' events over the wall time from the start signal to the last
client's answer; the table gives the median of ``--rounds`` rounds and the speed-up over 1
shard with the same clients and sending. The acker side's CPU time per 1 000 events (all shards
together: each shard's process CPU time, read through its ``stats`` before and after the timed
rounds) is what must stay flat as N grows; its *capacity* is the events over the busiest shard's
CPU seconds, i.e. the rate the shards would sustain with a core each. On a 2-core machine the
shards compete with the clients for the two cores, so the wall-clock rate cannot grow with N;
on a machine with the cores it is the figure that must.
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

from native_only import child_env, fallback_refusal, package_dir

WORKER = Path(__file__).with_name("bench_service.py")
BATCH = 1 << 16
#: How the clients send their events (see the module docstring).
SENDS = ("direct", "split", "coalesced", "background")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def shard_stats(client) -> list[dict]:
    """Each shard's service stats (backend, process CPU seconds), in shard order."""
    stats = client.stats()["service"]
    return stats.get("shards") or [stats]


def measure(shards: int, clients: int, records: int, batches: int, rounds: int, send: str) -> dict:
    """One (shards, clients, send) cell: persist and xor rates, the acker's CPU per event."""
    from xorack.service import AckerClient
    from xorack.shards import ShardedAcker

    env = child_env()
    with ShardedAcker(shards, serve_args=["--rotate-interval", "0"], env=env) as acker:
        probe = AckerClient.get(acker.location)
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
                    send,
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
            client_cpu = 0.0
            events = requests = 0
            for r in range(rounds + 1):  # the first round warms up
                if r == 1:
                    before = shard_stats(probe)
                    cpu0 = [s["cpu_s"] for s in before]
                t0 = time.perf_counter()
                for p in procs:
                    p.stdin.write("xor\n")
                    p.stdin.flush()
                answers = [json.loads(p.stdout.readline()) for p in procs]
                wall = time.perf_counter() - t0
                rates.append(sum(a["events"] for a in answers) / wall)
                if r == 0:
                    client_cpu = -sum(a["cpu_s"] for a in answers)
                else:
                    events += sum(a["events"] for a in answers)
                    requests += sum(a["coalesced_requests"] for a in answers)
            client_cpu += sum(a["cpu_s"] for a in answers)
            after = shard_stats(probe)
            cpu = [s["cpu_s"] - c for s, c in zip(after, cpu0, strict=True)]
        finally:
            for p in procs:
                p.stdin.close()
                p.wait(timeout=60)
                p.stdout.close()
            probe.close()
    return {
        "shards": shards,
        "clients": clients,
        "send": send,
        "client_backends": sorted({r["backend"] for r in ready}),
        "shard_backends": sorted({s.get("backend") or "?" for s in after}),
        "xorack": sorted({r["xorack"] for r in ready}),
        "persist_records_per_s": persist_rate,
        "xor_events_per_s": statistics.median(rates[1:]),
        "xor_events_per_s_best": max(rates[1:]),
        # what the acker side could take if each shard had a core of its own: the events over
        # the busiest shard's CPU time in the timed rounds
        "capacity_events_per_s": events / max(max(cpu), 1e-9),
        "acker_cpu_us_per_1k_events": sum(cpu) / events * 1e9,
        "client_cpu_us_per_1k_events": client_cpu / events * 1e9,
        "events_per_request": events / requests if requests else BATCH / shards,
    }


def _words(text: str) -> list[str]:
    words = [x.strip() for x in text.split(",") if x.strip()]
    bad = [w for w in words if w not in SENDS]
    if bad:
        raise argparse.ArgumentTypeError(f"--send: expected {', '.join(SENDS)}, got {bad}")
    return words


def table(cells: list[dict]) -> list[str]:
    """The cells as a Markdown table, and the flatness of the acker's CPU per event."""
    lines = [
        "| clients | send | shards | M events/s (best) | vs 1 shard | events/request "
        "| acker CPU us/1K events | client CPU us/1K | capacity M events/s | persist K rec/s |",
        "| ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        base = next(
            (
                b
                for b in cells
                if (b["clients"], b["send"], b["shards"]) == (c["clients"], c["send"], 1)
            ),
            None,
        )
        ratio = c["xor_events_per_s"] / base["xor_events_per_s"] if base else float("nan")
        lines.append(
            f"| {c['clients']} | {c['send']} | {c['shards']} | "
            f"{c['xor_events_per_s'] / 1e6:.2f} ({c['xor_events_per_s_best'] / 1e6:.2f}) | "
            f"{ratio:.2f} | {c['events_per_request'] / 1024:.0f}K | "
            f"{c['acker_cpu_us_per_1k_events']:.0f} | {c['client_cpu_us_per_1k_events']:.0f} | "
            f"{c['capacity_events_per_s'] / 1e6:.1f} | {c['persist_records_per_s'] / 1e3:.0f} |"
        )
    for clients in sorted({c["clients"] for c in cells}):
        for send in SENDS:
            group = [c for c in cells if (c["clients"], c["send"]) == (clients, send)]
            if len(group) < 2:
                continue
            cpu = [c["acker_cpu_us_per_1k_events"] for c in group]
            rate = {c["shards"]: c["xor_events_per_s"] for c in group}
            most = max(rate)
            lines.append(
                f"{clients} clients, {send}: acker CPU per 1K events max/min over "
                f"{len(group)} shard counts = {max(cpu) / min(cpu):.2f} (target <= 1.25); "
                + (
                    f"{most} shards / 1 shard events/s = {rate[most] / rate[1]:.2f}"
                    if 1 in rate
                    else ""
                )
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=_ints, default=[8], help="client process counts")
    ap.add_argument("--shards", type=_ints, default=[1, 2, 4, 8], help="shard counts")
    ap.add_argument(
        "--send",
        type=_words,
        default=["direct", "coalesced"],
        help="of direct,split,coalesced,background (interleaved; default direct,coalesced)",
    )
    ap.add_argument("--records", type=int, default=2 * BATCH, help="records per client")
    ap.add_argument("--batches", type=int, default=8, help="64 K xor batches per client/round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per cell")
    ap.add_argument("--json", action="store_true", help="print the cells as JSON lines too")
    ap.add_argument("--out", help="write the cells and the table to this JSON file")
    ap.add_argument(
        "--allow-fallback",
        action="store_true",
        help="measure even when the kernels are the pure-Python fallback",
    )
    args = ap.parse_args(argv)
    import xorack

    backend = xorack.backend  # the shard and client processes import this same package
    refusal = fallback_refusal(backend, "bench_shards")
    if refusal and not args.allow_fallback:
        print(refusal, file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    cells = []
    for clients in args.clients:
        for shards in args.shards:
            for send in args.send:
                cell = measure(shards, clients, args.records, args.batches, args.rounds, send)
                cells.append(cell)
                if args.json:
                    print(json.dumps(cell), flush=True)
                ran = {*cell["client_backends"], *cell["shard_backends"]}
                if ran != {"native"} and not args.allow_fallback:
                    print(
                        f"bench_shards: a client or shard ran the {sorted(ran)} kernels, not "
                        f"native ({cell['xorack']}): stopped; the figures would not be the "
                        "native extension's",
                        file=sys.stderr,
                    )
                    return 2
    ran = sorted({b for c in cells for b in (*c["client_backends"], *c["shard_backends"])})
    head = (
        f"sharded acker on loopback, kernels: {'+'.join(ran)} (clients and every shard; "
        f"xorack from {package_dir()}); {os.cpu_count()} cores, load average {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}; {args.records:,} records and {args.batches} x 64K xor "
        f"events per client per round, median of {args.rounds} rounds"
    )
    lines = [head, *table(cells)]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"header": head, "cells": cells, "table": lines}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
