"""The sharded acker: ids owned by shards, the routing client, shard processes (real processes on
loopback): the same FT-layer results with 1 and N shards, a shard killed with SIGKILL and
restarted on its SQLite storage losing nothing, and no shard process outliving its owner."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers.acker import FAST_RETRY, PYTHONPATH
from helpers.processes import alive, wait_gone
from xorack import FTLayer
from xorack.errors import ServiceError
from xorack.service import AckerClient, AckerService
from xorack.sharding import (
    Shard,
    draw_ids,
    mix54,
    shard_of,
    shard_storage,
    split_locations,
    unmix54,
)
from xorack.shards import ShardedAcker, ShardedAckerClient, merge_stats

SHARD_ARGS = ["--max-attempts", "3", "--rotate-interval", "0"]


# ---- ids and names ---------------------------------------------------------------------------


def test_mixer_is_a_bijection_and_splits_any_blocks_evenly():
    rng = np.random.default_rng(1)
    blocks = rng.integers(1, 2**54, 10_000, dtype=np.uint64)
    assert (unmix54(mix54(blocks)) == blocks).all()
    assert (mix54(blocks) < 2**54).all()
    seq = np.arange(1, 40_001, dtype=np.uint64)
    for ids in (seq << 10, seq << 30):  # sequential blocks; blocks with low bits in common
        counts = np.bincount(shard_of(ids, 4), minlength=4)
        assert counts.min() > 0.9 * 10_000, counts  # `block % 4` would put every seq << 30 on 0


def test_a_chunk_of_ids_lives_on_one_shard():
    ids = draw_ids(3000)
    block = (ids >> np.uint64(10)) << np.uint64(10)
    for offset in (0, 1, 511, 1023):  # every id of an aligned 1024-block: the same shard
        assert (shard_of(block | np.uint64(offset), 3) == shard_of(block, 3)).all()


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_a_shard_draws_only_ids_it_owns(count):
    for k in range(count):
        ids = draw_ids(5000, Shard(k, count))
        assert ids.all()
        assert (shard_of(ids, count) == k).all()
        assert len(np.unique(ids)) == len(ids)


def test_an_ft_layer_shard_replays_under_its_own_ids_and_refuses_foreign_ones():
    shard = Shard(1, 3)
    with FTLayer(shard=shard, max_attempts=5) as ft:
        src = ft.persist(pa.record_batch({"x": list(range(50))}))
        assert shard.owns(src).all()
        assert shard.owns(ft.fail(src)).all()
        foreign = draw_ids(3, Shard(0, 3))
        with pytest.raises(ValueError, match="belong to another shard"):
            ft.persist(pa.record_batch({"x": [1, 2, 3]}), src_ids=foreign)
        assert ft.stats().persisted == 50


def test_names_of_shard_storages_and_locations():
    two = Shard(1, 2)
    assert shard_storage("sqlite:////var/ft.db", two) == "sqlite:////var/ft.shard1of2.db"
    assert shard_storage("/var/ft.sqlite", two) == "/var/ft.shard1of2.sqlite"
    assert shard_storage("./data/ft", two) == "./data/ft.shard1of2"
    assert shard_storage("sqlite:///ft.db", Shard(0, 1)) == "sqlite:///ft.db"
    assert shard_storage("memory", two) == "memory"
    assert split_locations("grpc://a:1") == ["grpc://a:1"]
    with pytest.raises(ValueError, match="one per shard joined by commas"):
        split_locations("grpc://a:1,,grpc://a:2")
    for bad in ("3/3", "x/2", "1/0"):
        with pytest.raises(ValueError):
            Shard.parse(bad)


def test_stats_merge_keeps_the_smallest_event_time_of_the_shards_that_have_one():
    assert merge_stats([{"min_event_time": 9}, {"min_event_time": None}]) == {"min_event_time": 9}
    assert merge_stats([{"min_event_time": 9}, {"min_event_time": -4}])["min_event_time"] == -4
    assert merge_stats([{"min_event_time": None}] * 2) == {"min_event_time": None}


def test_stats_merge_sums_counters_and_keeps_the_worst_latency():
    a = {"completed": 3, "latency_p99": 0.5, "service": {"calls": {"xor": 2}, "job": "j"}}
    b = {"completed": 4, "latency_p99": 0.7, "service": {"calls": {"xor": 1, "fail": 1}}}
    assert merge_stats([a, b]) == {
        "completed": 7,
        "latency_p99": 0.7,
        "service": {"calls": {"xor": 3, "fail": 1}, "job": "j"},
    }


# ---- the same results with 1 and N shards ----------------------------------------------------


def scenario(client) -> dict:
    """A fixed script of persists, acks, fails, timeouts and replays, decided by payload value
    only (never by id), so any acker must end in the same state."""
    n = 400
    x = np.arange(n)
    rec = draw_ids(n)
    src = client.persist(
        pa.record_batch({"x": x}), key_hash=x.astype(np.int32), births=rec, partition=0
    )
    of_src = dict(zip(src.tolist(), x.tolist(), strict=True))
    done = set(client.xor(src[x % 4 == 0], rec[x % 4 == 0]).tolist())
    new = client.fail(src[x % 4 == 1], reason="boom")
    client.xor(src[x % 4 == 2], rec[x % 4 == 2] ^ np.uint64(1))  # a wrong ack: no completion
    replayed_to: dict[int, set[int]] = {}
    for attempt in range(4):
        new = np.concatenate([new, client.expire_all()])
        for partition, t in client.take_replays(source=0).items():
            xs = t.column("x").to_numpy()
            replayed_to.setdefault(partition, set()).update(xs.tolist())
            rs, rr = t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy()
            of_src.update(zip(rs.tolist(), xs.tolist(), strict=True))
            ack = (xs % 8 < 4) if attempt == 0 else np.zeros(len(xs), bool)
            done.update(client.xor(rs[ack], rr[ack]).tolist())
    stats = client.stats()
    letters = client.dead_letters()
    counters = {
        k: stats[k]
        for k in (
            "persisted",
            "completed",
            "failed",
            "timed_out",
            "replayed",
            "dead_lettered",
            "pending",
        )
    }
    assert stats["persisted"] == stats["completed"] + stats["dead_lettered"] + stats["pending"]
    return {
        "counters": counters,
        "by_source": stats["replayed_by_source"],
        "completed": sorted(of_src[s] for s in done),
        "dead": sorted(letters.column("x").to_pylist()),
        "reasons": sorted(set(letters.column("_ft_reason").to_pylist())),
        "replayed_to": replayed_to,
        "ended": len(client.take_ended()),
    }


@pytest.fixture(scope="module")
def single_result():
    with (
        FTLayer(max_attempts=3) as ft,
        AckerService.embedded(ft) as svc,
        AckerClient(svc.location, retry=FAST_RETRY) as client,
    ):
        return scenario(client)


@pytest.mark.parametrize("count", [2, 3])
def test_n_shards_give_the_results_of_one(single_result, count):
    with ShardedAcker(count, serve_args=SHARD_ARGS) as acker:
        client = AckerClient.get(acker.location)
        assert isinstance(client, ShardedAckerClient)
        client.check_shards()
        result = scenario(client)
        per_shard = [s["persisted"] for s in client.broadcast("stats")]
        client.close()
    assert result == single_result
    assert single_result["counters"]["dead_lettered"] > 0
    assert single_result["counters"]["completed"] > 0
    assert min(per_shard) > 0.5 * 400 / count  # every shard took its part


def test_a_location_in_the_wrong_order_is_refused():
    with ShardedAcker(2, serve_args=SHARD_ARGS) as acker:
        swapped = ",".join(reversed(split_locations(acker.location)))
        client = AckerClient.get(swapped)
        with pytest.raises(ServiceError, match="in shard order"):
            client.check_shards()
        with pytest.raises(ServiceError, match="belong to another shard"):
            client.persist(pa.record_batch({"x": [1, 2, 3, 4, 5, 6, 7, 8]}))
        client.close()


# ---- a shard killed and restarted ------------------------------------------------------------


def test_a_restart_is_counted_once_its_process_is_there(monkeypatch):
    # the restart count is what callers wait on: when it moves, pids and location are the new
    # process's (a slow start is made slower here, so a count moved first would be seen)
    import xorack.shards as shards

    spawn = shards._ShardProcess.spawn

    def slow_spawn(self):
        time.sleep(0.5)
        spawn(self)

    with ShardedAcker(2, serve_args=SHARD_ARGS) as acker:
        monkeypatch.setattr(shards._ShardProcess, "spawn", slow_spawn)
        _kill_and_wait_for_restart(acker, 1)
        assert AckerClient.get(acker.location).ping()


def _kill_and_wait_for_restart(acker: ShardedAcker, k: int) -> None:
    """SIGKILL shard ``k``; wait until the supervisor has restarted it (a new process)."""
    killed = acker.pids[k]
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while acker.restarts[k] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert acker.restarts[k] == 1
    assert sum(acker.restarts) == 1
    assert acker.pids[k] != killed


def test_a_killed_shard_restarts_on_its_storage_and_replays_its_unfinished_records(tmp_path):
    storage = f"sqlite:///{tmp_path / 'ft.db'}"
    with ShardedAcker(2, storage=storage, serve_args=SHARD_ARGS) as acker:
        files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".db"))
        assert files == ["ft.shard0of2.db", "ft.shard1of2.db"]
        client = AckerClient.get(acker.location)
        x = np.arange(300)
        rec = draw_ids(len(x))
        src = client.persist(pa.record_batch({"x": x}), births=rec, partition=0)
        acked = x % 3 == 0
        client.xor(src[acked], rec[acked])
        on_1 = shard_of(src, 2) == 1
        unfinished_1 = set(x[on_1 & ~acked].tolist())
        _kill_and_wait_for_restart(acker, 1)
        stats = client.stats()  # retried until the restarted shard answers
        assert stats["recovered"] == len(unfinished_1)
        replays = client.take_replays(source=0)  # recovered records are replayed at once
        got = set(np.concatenate([t.column("x").to_numpy() for t in replays.values()]).tolist())
        assert got == unfinished_1
        # the other shard's unfinished records time out; then every record is acked
        client.expire_all()
        for t in client.take_replays(source=0).values():
            client.xor(t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy())
        for t in replays.values():
            client.xor(t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy())
        stats = client.stats()
        client.close()
    assert stats["pending"] == 0
    assert stats["dead_lettered"] == 0
    assert not wait_gone(acker.pids)


def test_a_persist_retried_against_a_restarted_shard_and_the_recovered_copy_are_one_record(
    tmp_path,
):
    """A shard stores a task's persist and is killed before the task sees the answer: the
    task's client retries the persist against the restarted shard. The restart kept the
    records under their ids (persisted idempotently, in their first attempt), so the retried
    persist finds them pending and the task's acks complete each once: nothing is replayed."""
    storage = f"sqlite:///{tmp_path / 'ft.db'}"
    with ShardedAcker(2, storage=storage, serve_args=SHARD_ARGS) as acker:
        client = AckerClient.get(acker.location)
        x = np.arange(300)
        src, rec = draw_ids(len(x)), draw_ids(len(x))
        batch = pa.record_batch({"x": x})
        client.persist(batch, births=rec, src_ids=src, partition=0, idempotent=True)
        _kill_and_wait_for_restart(acker, 1)
        again = client.persist(batch, births=rec, src_ids=src, partition=0, idempotent=True)
        assert again.tolist() == src.tolist()  # the same records: the task's rows go on
        client.xor(again, rec)
        stats = client.stats()
        replays = client.take_replays(source=0)
        client.close()
    assert (stats["completed"], stats["pending"], stats["replayed"]) == (300, 0, 0)
    assert sum(t.num_rows for t in replays.values()) == 0  # no second copy waits
    on_1 = int((shard_of(src, 2) == 1).sum())
    assert (stats["recovered"], stats["kept_at_restart"]) == (on_1, on_1)
    assert not wait_gone(acker.pids)


# ---- no shard process outlives its owner ---------------------------------------------------


def test_closing_stops_every_shard_process():
    acker = ShardedAcker(2, serve_args=SHARD_ARGS)
    pids = acker.pids
    assert all(alive(p) for p in pids)
    acker.close()
    assert not wait_gone(pids, timeout=0.5)  # close() waits for them


def test_shards_end_when_their_owner_is_killed():
    code = (
        "import time\n"
        "from xorack.shards import ShardedAcker\n"
        "a = ShardedAcker(2, serve_args=['--rotate-interval', '0'])\n"
        "print(*a.pids, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = dict(os.environ, PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2
        assert all(alive(p) for p in pids)
        owner.kill()  # SIGKILL: no close(), no atexit
        owner.wait()
        assert not wait_gone(pids)  # each shard saw its lifeline close and shut down
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()


def test_a_shard_that_cannot_start_is_a_clear_error(tmp_path):
    with pytest.raises(ServiceError, match="did not start"):
        ShardedAcker(2, storage=f"sqlite:///{tmp_path / 'missing' / 'ft.db'}", start_timeout=30)


# ---- xorack serve --shards ------------------------------------------------------------------


def test_serve_shards_prints_one_location_and_stops_its_shards(tmp_path):
    from helpers.acker import start_serve

    storage = f"sqlite:///{tmp_path / 'acker.db'}"
    proc, location = start_serve("--shards", "2", "--storage", storage, "--rotate-interval", "0")
    try:
        assert len(split_locations(location)) == 2
        client = AckerClient.get(location, job="cli-shards")
        client.check_shards()
        src = client.persist(pa.record_batch({"x": list(range(64))}), births=list(range(1, 65)))
        assert len(set(shard_of(src, 2).tolist())) == 2
        assert client.stats()["pending"] == 64
        client.close()
        shard_pids = [
            int(p) for p in subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()
        ]
        assert len(shard_pids) == 2
        # a job's storage per shard: PATH.shardKof2.db.jobs/JOB.db
        jobs = sorted(p.name for p in tmp_path.glob("*.jobs"))
        assert jobs == ["acker.shard0of2.db.jobs", "acker.shard1of2.db.jobs"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "shutting down" in out
    assert not wait_gone(shard_pids, timeout=0.5)


# ---- per-partition replay ops: forwarded to every shard ----------------------------------


class _FakeShard:
    """A shard client with the per-partition replay ops (the routing client's view of them)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.calls: list[tuple] = []

    def prepare_replays(self, source, partitioner, tag, first_ids=False):
        self.calls.append(("prepare", source, partitioner, tag, first_ids))
        return {0: 1 + self.k, 2 + self.k: 5}

    def take_replays(self, source=0, partition=None, first_ids=False):
        self.calls.append(("take", source, partition, first_ids))
        return {self.k: pa.table({"w": [f"s{self.k}"]})}

    def fetch_replays(self, source, tag, partition):
        self.calls.append(("fetch", source, tag, partition))
        if self.k == 1:  # an empty answer has the acker's minimal schema
            return pa.table({"_ft_src": pa.array([], pa.uint64())})
        return pa.table({"w": [f"s{self.k}p{partition}"], "_ft_src": pa.array([7], pa.uint64())})

    def release_replays(self, source=None, tag=None):
        self.calls.append(("release", source, tag))

    def close(self) -> None:
        pass


def test_take_replays_asks_every_shard_for_first_ids():
    client = ShardedAckerClient("grpc://127.0.0.1:1,grpc://127.0.0.1:2")
    client.shards = [_FakeShard(k) for k in range(2)]
    assert {p: t.num_rows for p, t in client.take_replays(3, first_ids=True).items()} == {
        0: 1,
        1: 1,
    }
    assert [shard.calls for shard in client.shards] == [[("take", 3, None, True)]] * 2


def test_per_partition_replay_ops_go_to_every_shard():
    client = ShardedAckerClient("grpc://127.0.0.1:1,grpc://127.0.0.1:2,grpc://127.0.0.1:3")
    client.shards = [_FakeShard(k) for k in range(3)]
    assert client.prepare_replays(0, "hash:4", "r1", True) == {0: 6, 2: 5, 3: 5, 4: 5}
    table = client.fetch_replays(0, "r1", 2)
    assert table.column("w").to_pylist() == ["s0p2", "s2p2"]
    client.release_replays(0, "r1")
    for k, shard in enumerate(client.shards):
        assert shard.calls == [
            ("prepare", 0, "hash:4", "r1", True),
            ("fetch", 0, "r1", 2),
            ("release", 0, "r1"),
        ], k
    client.close()


def test_every_shard_serves_tls_and_checks_the_token(tls_files):
    from xorack.service import RetryPolicy

    cert, key = tls_files
    roots = Path(cert).read_bytes()
    with ShardedAcker(
        2, token="s3cret", tls_cert=cert, tls_key=key, serve_args=SHARD_ARGS
    ) as acker:
        assert all(loc.startswith("grpc+tls://") for loc in split_locations(acker.location))
        client = AckerClient.get(acker.location, token="s3cret", tls_root_certs=roots)
        client.check_shards()
        src = client.persist(pa.record_batch({"x": list(range(32))}), births=list(range(1, 33)))
        assert len(client.xor(src, list(range(1, 33)))) == 32
        client.close()
        wrong = ShardedAckerClient(
            acker.location, token="wrong", tls_root_certs=roots, retry=RetryPolicy(attempts=1)
        )
        for shard in wrong.shards:  # each shard checks the token itself
            with pytest.raises(ServiceError, match="unauthenticated"):
                shard.ping()
        wrong.close()


# ---- held completions and chunk events (a barrier's combined rows) --------------------------


def chunk_scenario(client) -> dict:
    """Chunks of 8 records (chunk_bits=3): chunk events, one chunk's event wrong (its records
    replayed as collateral), held completions, a release naming a tainted chunk."""
    bits, per = 3, 8
    rng = np.random.default_rng(5)
    chunks = rng.integers(1, 2**40, 12, dtype=np.uint64)
    src = ((chunks[:, None] << np.uint64(bits)) | np.arange(per, dtype=np.uint64)).ravel()
    x = np.arange(len(src))
    rec = rng.integers(1, 2**63, len(src), dtype=np.uint64)
    client.persist(pa.record_batch({"x": x}), births=rec, src_ids=src, partition=0)
    events = np.bitwise_xor.reduce(rec.reshape(-1, per), axis=1)
    events[0] ^= np.uint64(1)  # a lost row in chunk 0: its records are replayed as collateral
    held = client.xor(chunks, events, hold=True, chunk_bits=bits)
    collateral = client.release(chunks[1:2], chunk_bits=bits)  # chunk 1 tainted elsewhere
    stats = client.stats()
    return {
        "held": sorted(held.tolist()),
        "collateral": sorted(collateral.tolist()),
        "counters": {k: stats[k] for k in ("persisted", "completed", "replayed", "pending")},
        "replayed_x": sorted(
            x for t in client.take_replays(source=0).values() for x in t.column("x").to_pylist()
        ),
    }


def test_chunk_events_and_releases_on_shards_give_the_results_of_one():
    with (
        FTLayer(max_attempts=3) as ft,
        AckerService.embedded(ft) as svc,
        AckerClient(svc.location, retry=FAST_RETRY) as client,
    ):
        single = chunk_scenario(client)
    with ShardedAcker(3, serve_args=SHARD_ARGS) as acker:
        client = AckerClient.get(acker.location)
        sharded = chunk_scenario(client)
        with pytest.raises(ValueError, match="at most 10 bits"):
            client.xor([5], [1], chunk_bits=11)
        client.close()
    assert sharded == single
    assert single["replayed_x"] == list(range(16))  # chunks 0 and 1: collateral replays
    assert single["counters"]["completed"] == 80


def test_a_sharded_client_answers_the_smallest_event_time_of_every_shard():
    with contextlib.ExitStack() as stack:  # two shards in this process: embedded services
        layers = [stack.enter_context(FTLayer(shard=(k, 2))) for k in range(2)]
        locations = [stack.enter_context(AckerService.embedded(ft)).location for ft in layers]
        client = stack.enter_context(ShardedAckerClient(",".join(locations), retry=FAST_RETRY))
        client.check_shards()
        n = 64
        rec = draw_ids(n)
        times = np.arange(100, 100 + n) * 7 % 101  # a permutation: every value once
        src = client.persist(pa.record_batch({"x": np.arange(n)}), births=rec, event_time=times)
        owner = shard_of(src, 2)
        assert set(owner.tolist()) == {0, 1}
        own = [ft.stats().min_event_time for ft in layers]
        assert own == [int(times[owner == k].min()) for k in range(2)]
        assert client.stats()["min_event_time"] == int(times.min())
        order = np.argsort(times)
        for done, i in enumerate(order, start=1):  # smallest first: the minimum follows
            client.xor(src[i : i + 1], rec[i : i + 1])
            left = times[order[done:]]
            assert client.stats()["min_event_time"] == (int(left.min()) if len(left) else None)
        stats = client.stats()
        assert (stats["min_event_time"], stats["pending"]) == (None, 0)
