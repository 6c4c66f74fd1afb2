"""Acker service scenarios: concurrent clients on one batch, accounting through the service
equal to a direct FT layer, malformed requests, dead letters per source, bounded dedupe memory."""

from __future__ import annotations

import json
import random
import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from xorack import FTLayer, ServiceError
from xorack.service import AckerClient, AckerService, RequestLog, RetryPolicy

U64 = np.uint64
FAST_RETRY = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02, call_timeout=5.0)


@pytest.fixture
def ft():
    layer = FTLayer(storage="memory", num_buckets=2, max_attempts=2, default_partitions=3)
    yield layer
    layer.close()


@pytest.fixture
def service(ft):
    with AckerService.embedded(ft) as svc:
        yield svc


def _client(service) -> AckerClient:
    return AckerClient(service.location, retry=FAST_RETRY)


def test_two_clients_acking_one_batch_concurrently_complete_each_record_once(service, ft):
    n = 200
    rng = random.Random(3)
    births = np.array([rng.getrandbits(64) | 1 for _ in range(n)], U64)
    kids = np.array([rng.getrandbits(64) | 1 for _ in range(n)], U64)
    c0, c1 = _client(service), _client(service)
    src = c0.persist(pa.record_batch({"i": np.arange(n)}), births=births)
    # each record: the stage event (birth ^ kid) from one worker, the sink ack (kid) from the other
    jobs = [(src, births ^ kids, c0), (src, kids, c1)]
    done: list[list[int]] = [[], []]

    def send(k: int) -> None:
        s, v, c = jobs[k]
        for a in range(0, n, 7):
            done[k] += c.xor(s[a : a + 7], v[a : a + 7]).tolist()

    threads = [threading.Thread(target=send, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done[0] + done[1]) == sorted(src.tolist())  # each exactly once
    s = c1.stats()
    assert (s["completed"], s["pending"], s["orphans"]) == (n, 0, 0)
    c0.close()
    c1.close()


def test_accounting_through_the_service_equals_a_direct_ft_layer(service, ft):
    direct = FTLayer(storage="memory", num_buckets=2, max_attempts=2, default_partitions=3)
    c = _client(service)
    try:
        for layer in (c, direct):
            src = layer.persist(pa.record_batch({"x": [1, 2, 3, 4]}), births=[1, 2, 3, 4])
            layer.xor(src[:1], [1])
            layer.fail(np.array([src[1], src[1], 999], U64), reason="bad")
            layer.touch(src[2:3])
            layer.rotate()
            layer.rotate()  # src[3] times out, src[2] touched after rotation 0 too
            layer.expire_all()
            layer.take_replays()
            layer.expire_all()  # the handed-out replays time out again: dead-lettered
        via, own = c.stats(), direct.stats().as_dict()
        keys = [k for k in own if not k.startswith("latency")]
        assert {k: via[k] for k in keys} == {k: own[k] for k in keys}
        assert via["persisted"] == via["completed"] + via["dead_lettered"] + via["pending"]
        assert c.dead_letters().num_rows == direct.dead_letters().num_rows == 3
    finally:
        c.close()
        direct.close()


def test_dead_letters_per_source_through_the_service(service, ft):
    c = _client(service)
    a = c.persist(pa.record_batch({"value": [1]}), source=0)
    b = c.persist(pa.record_batch({"value": ["one"]}), source=1)
    ft.max_attempts = 1
    c.fail(np.concatenate([a, b]), reason="poison")
    assert c.dead_letters(source=0).column("value").to_pylist() == [1]
    assert c.dead_letters(source=1).column("value").to_pylist() == ["one"]
    with pytest.raises(ServiceError, match="source"):
        c.dead_letters()  # one table cannot hold both: a clear error naming the way out
    assert ft.pending == 0
    c.close()


def _put_raw(raw: flight.FlightClient, descriptor, batch: pa.RecordBatch) -> None:
    writer, _ = raw.do_put(descriptor, batch.schema)
    writer.write_batch(batch)
    writer.close()


@pytest.mark.parametrize(
    ("command", "batch", "message"),
    [
        (  # right names, wrong dtypes
            {"op": "xor"},
            pa.record_batch({"_ft_src": pa.array([1], pa.int64()), "_ft_xor": pa.array([1])}),
            "unexpected schema",
        ),
        (  # an extra column
            {"op": "xor"},
            pa.record_batch(
                {
                    "_ft_src": pa.array([1], pa.uint64()),
                    "_ft_xor": pa.array([1], pa.uint64()),
                    "extra": [1],
                }
            ),
            "unexpected schema",
        ),
        (
            {"op": "persist"},
            pa.record_batch({"x": [1], "_ft_key_hash": pa.array([1], pa.int64())}),
            "_ft_key_hash must be int32",
        ),
        ({"op": "persist"}, pa.record_batch({"x": [1], "_ft_other": [1]}), "control column"),
        (
            {"op": "persist"},
            pa.record_batch({"x": [1], "_ft_src": pa.array([0], pa.uint64())}),
            "src_ids",
        ),
        (
            {"op": "fail", "reason": 5},
            pa.record_batch({"_ft_src": pa.array([1], pa.uint64())}),
            "reason",
        ),
    ],
)
def test_malformed_puts_are_rejected_and_nothing_is_applied(service, ft, command, batch, message):
    raw = flight.FlightClient(service.location)
    descriptor = flight.FlightDescriptor.for_command(json.dumps(command))
    with pytest.raises(flight.FlightError, match=message):
        _put_raw(raw, descriptor, batch)
    raw.close()
    s = ft.stats()
    assert (s.persisted, s.pending, s.completed, s.failed) == (0, 0, 0, 0)


def test_empty_streams_are_harmless(service, ft):
    raw = flight.FlightClient(service.location)
    for command, schema in (
        ({"op": "xor"}, pa.schema([("_ft_src", pa.uint64()), ("_ft_xor", pa.uint64())])),
        ({"op": "persist"}, pa.schema([("x", pa.int64())])),
        ({"op": "fail"}, pa.schema([("_ft_src", pa.uint64())])),
    ):
        writer, _ = raw.do_put(flight.FlightDescriptor.for_command(json.dumps(command)), schema)
        writer.close()  # a schema, no batch
    raw.close()
    assert ft.stats().persisted == 0
    c = _client(service)
    assert c.ping()
    c.close()


def test_request_log_memory_is_bounded_for_empty_results():
    """Most xor replies are empty arrays: each remembered request must still count, or the log
    grows without bound for ``ttl`` seconds (about 1.6 KB per request before the fix)."""
    log = RequestLog(ttl=3600, max_bytes=100 * RequestLog.ENTRY_BYTES)
    for i in range(5000):
        log.run(f"req-{i}", lambda: np.empty(0, U64))
    assert len(log) <= 100
    assert log.nbytes <= 100 * RequestLog.ENTRY_BYTES
    assert log.evicted_early >= 4900
    calls = []
    assert log.run("req-4999", lambda: calls.append(1)).size == 0  # the newest is remembered
    assert calls == []


def test_client_persist_takes_what_ft_layer_persist_takes():
    """Lists / int64 key hashes and partitions that fit int32, as FTLayer.persist accepts."""
    with (
        FTLayer(replay_partitioners={0: "forward"}) as ft,
        AckerService.embedded(ft) as svc,
        _client(svc) as c,
    ):
        src = c.persist(pa.record_batch({"x": [1, 2]}), key_hash=[-5, 7], partition=[2, 0])
        assert len(src) == 2
        c.fail(src)
        reps = c.take_replays()
        assert {p: t.column("_ft_key_hash").to_pylist() for p, t in reps.items()} == {
            0: [7],
            2: [-5],
        }
