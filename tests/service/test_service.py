"""The acker service (Arrow Flight, the seed's FTLayerVertex) and its client: a real server on
loopback, a real client, a real FT layer (memory storage; SQLite for the kill/restart test)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from helpers.acker import FAST_RETRY, start_serve, words
from xorack import NO_EVENT_TIME, FTLayer, ServiceError
from xorack.service import (
    XOR_SCHEMA,
    AckerClient,
    AckerService,
    RequestLog,
    RetryPolicy,
    is_loopback,
)

U64 = np.uint64
PYTHONPATH = str(Path(__file__).resolve().parents[2] / "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- round trips ----------------------------------------------------------------------------


def test_persist_and_xor_complete_only_on_the_last_event(client, ft):
    births = np.array([11, 12, 13], dtype=U64)
    src = client.persist(words(3), births=births)
    assert src.dtype == U64
    assert len(set(src.tolist())) == 3
    assert 0 not in src
    assert ft.pending == 3
    # Each record: born with its first rec id, the stage XORs (rec ^ child), the sink acks child.
    assert client.xor(src, births ^ np.array([100, 200, 300], dtype=U64)).size == 0
    done = client.xor(src[:2], np.array([100, 200], dtype=U64))
    assert sorted(done.tolist()) == sorted(src[:2].tolist())
    assert ft.pending == 1
    assert client.xor(src[2:], np.array([300], dtype=U64)).tolist() == [src[2]]
    assert ft.pending == 0


def test_fail_then_take_replays_hands_each_replay_out_once(client):
    batch = words(4)
    key_hash = np.array([7, -3, 7, 12], dtype=np.int32)
    src = client.persist(batch, key_hash=key_hash, source=0, partition=1, births=[1, 2, 3, 4])
    new = client.fail(src[[1, 3]], reason="bad row")
    assert new.size == 2
    assert not set(new.tolist()) & set(src.tolist())
    replays = client.take_replays(source=0)
    rows = pa.concat_tables(replays.values())
    assert sorted(rows.column("_ft_src").to_pylist()) == sorted(new.tolist())
    assert sorted(rows.column("word").to_pylist()) == ["w1", "w3"]
    assert sorted(rows.column("_ft_key_hash").to_pylist()) == [-3, 12]
    assert set(rows.column("_ft_attempt").to_pylist()) == {2}
    assert sorted(rows.column("_ft_origin").to_pylist()) == sorted(src[[1, 3]].tolist())
    for p, table in replays.items():
        assert set(table.column("_ft_partition").to_pylist()) == {p}
    assert client.take_replays(source=0) == {}


def test_replays_come_back_grouped_by_the_partition_the_ft_layer_chose():
    with (
        FTLayer(replay_partitioners={0: "forward"}) as layer,
        AckerService.embedded(layer) as svc,
        AckerClient(svc.location, retry=FAST_RETRY) as c,
    ):
        n = 40
        parts = np.arange(n, dtype=np.int32) % 4
        src = c.persist(words(n), partition=parts, births=np.arange(1, n + 1, dtype=U64))
        assert c.fail(src).size == n
        replays = c.take_replays(source=0)
        assert sorted(replays) == [0, 1, 2, 3]
        for p, table in replays.items():  # forward: each replay goes back where it came from
            assert sorted(table.column("n").to_pylist()) == list(range(p, n, 4))
            assert set(table.column("_ft_partition").to_pylist()) == {p}
        assert c.take_replays(source=0) == {}


def test_take_replays_of_one_partition_leaves_the_others(client, ft):
    src = client.persist(words(6), key_hash=np.arange(6, dtype=np.int32), births=np.arange(1, 7))
    client.fail(src)
    everything = ft.take_replays(source=0)  # see where the FT layer put them, then re-fail
    assert sum(t.num_rows for t in everything.values()) == 6
    client.fail(np.concatenate([t.column("_ft_src").to_numpy() for t in everything.values()]))
    first = min(everything)
    mine = client.take_replays(source=0, partition=first)
    assert list(mine) == [first]
    rest = client.take_replays(source=0)
    assert first not in rest
    assert sum(t.num_rows for t in mine.values()) + sum(t.num_rows for t in rest.values()) == 6


def test_expire_all_collateral_uses_no_attempt(client, ft):
    client.persist(words(2), births=[8, 9])
    assert client.expire_all(collateral=True).size == 2
    stats = client.stats()
    assert (stats["collateral"], stats["timed_out"]) == (2, 0)  # replayed, no attempt used up


def test_touch_rotate_expire_all_stats_dead_letters_ping(client, ft):
    assert client.ping() is True
    src = client.persist(words(3), births=[1, 2, 3])
    client.touch(src)
    assert client.rotate().dtype == U64
    expired = client.expire_all()
    assert expired.size == 3  # every pending record timed out and was replayed
    stats = client.stats()
    assert stats["persisted"] >= 3
    assert stats["timed_out"] >= 3
    assert stats["service"]["calls"]["persist"] == 1
    assert stats["replayed_by_source"] == {0: 3}
    assert stats["service"]["calls"]["expire_all"] == 1
    # Exhaust the attempts: the records end in the dead-letter table, with their payload.
    for _ in range(5):
        replays = client.take_replays()
        if not replays:
            break
        ids = np.concatenate([t.column("_ft_src").to_numpy() for t in replays.values()])
        client.fail(ids, reason="poison")
    assert client.stats()["service"]["calls"]["replays"] >= 1
    dead = client.dead_letters()
    assert isinstance(dead, pa.Table)
    assert sorted(dead.column("word").to_pylist()) == ["w0", "w1", "w2"]
    assert client.stats()["dead_lettered"] == 3


def test_empty_calls_do_not_reach_the_service(client):
    assert client.xor([], []).size == 0
    assert client.fail([]).size == 0
    client.touch([])
    assert client.persist(words(0)).size == 0


def test_persist_accepts_a_table(client):
    table = pa.Table.from_batches([words(2), words(3, start=2)])
    assert client.persist(table, births=np.arange(1, 6)).size == 5


# ---- bad input ------------------------------------------------------------------------------


def test_client_rejects_bad_arguments_before_sending(client):
    with pytest.raises(TypeError, match="src_ids must be uint64, got float64"):
        client.xor(np.array([1.0]), np.array([1], dtype=U64))
    with pytest.raises(ValueError, match="id 0"):
        client.xor(np.array([0], dtype=U64), np.array([1], dtype=U64))
    with pytest.raises(ValueError, match="length mismatch"):
        client.xor(np.array([1, 2], dtype=U64), np.array([1], dtype=U64))
    with pytest.raises(ValueError, match="reserved column"):
        client.persist(pa.record_batch({"_ft_src": np.array([1], dtype=U64)}))
    with pytest.raises(TypeError, match="key_hash must be int32"):
        client.persist(words(2), key_hash=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="key_hash must fit int32"):
        client.persist(words(2), key_hash=np.array([1, 2**31], dtype=np.int64))
    with pytest.raises(ValueError, match="partition must fit int32"):
        client.persist(words(2), partition=np.array([0, 2**32], dtype=np.int64))
    with pytest.raises(ValueError, match="length mismatch"):
        client.persist(words(2), births=[1, 2, 3])
    with pytest.raises(ValueError, match="event_time has 3 values but the batch has 2 rows"):
        client.persist(words(2), event_time=[1, 2, 3])
    with pytest.raises(TypeError, match=r"event_time must be int64 .*got float64"):
        client.persist(words(2), event_time=np.array([1.0, 2.0]))


def _raw_put(location: str, command: dict | bytes, batch: pa.RecordBatch):
    raw = flight.FlightClient(location)
    cmd = command if isinstance(command, bytes) else json.dumps(command).encode()
    try:
        writer, reader = raw.do_put(flight.FlightDescriptor.for_command(cmd), batch.schema)
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("command", "batch", "message"),
    [
        (
            {"op": "xor"},
            pa.record_batch({"a": pa.array([1], pa.int64()), "b": pa.array([2], pa.int64())}),
            r"expected \(_ft_src: uint64, _ft_xor: uint64\)",
        ),
        (
            {"op": "xor"},
            pa.record_batch({"_ft_src": pa.array([1], pa.uint64())}),
            r"expected \(_ft_src: uint64, _ft_xor: uint64\)",
        ),
        ({"op": "fail"}, pa.record_batch({"x": [1]}), r"expected \(_ft_src: uint64\)"),
        (
            {"op": "persist"},
            pa.record_batch({"w": ["a"], "_ft_key_hash": pa.array([1], pa.int64())}),
            "_ft_key_hash must be int32, got int64",
        ),
        (
            {"op": "persist"},
            pa.record_batch({"w": ["a"], "_ft_bogus": [1]}),
            "unexpected control column '_ft_bogus'",
        ),
        ({"op": "persist"}, pa.record_batch({"_ft_rec": pa.array([1], pa.uint64())}), "no payload"),
        (
            {"op": "persist"},
            pa.record_batch({"w": ["a"], "_ft_event_time": pa.array([1], pa.int32())}),
            "_ft_event_time must be int64, got int32",
        ),
        (
            {"op": "persist"},
            pa.record_batch({"w": ["a", "b"], "_ft_event_time": pa.array([1, None], pa.int64())}),
            "column _ft_event_time must not contain nulls",
        ),
        ({"op": "persist", "source": "zero"}, words(1), "'source' must be an integer"),
        ({"op": "drop_table"}, words(1), "unknown put op 'drop_table'"),
        (b"\x00not json", words(1), "expected a JSON object with an 'op' key"),
        (
            {"op": "xor"},
            pa.RecordBatch.from_arrays(
                [pa.array([1, None], pa.uint64()), pa.array([1, 2], pa.uint64())],
                schema=XOR_SCHEMA.set(0, pa.field("_ft_src", pa.uint64())),
            ),
            "must not contain nulls",
        ),
    ],
)
def test_foreign_requests_rejected_with_a_clear_message(service, client, command, batch, message):
    with pytest.raises(flight.FlightServerError, match=message) as info:
        _raw_put(service.location, command, batch)
    assert "Traceback" not in str(info.value)
    assert client.ping()  # the service is still up and serving


def test_unknown_action_and_ticket_rejected(service, client):
    raw = flight.FlightClient(service.location)
    try:
        with pytest.raises(flight.FlightServerError, match="unknown action 'shutdown'"):
            list(raw.do_action(flight.Action("shutdown", b"")))
        with pytest.raises(flight.FlightServerError, match="unknown ticket op 'all_rows'"):
            raw.do_get(flight.Ticket(b'{"op": "all_rows"}')).read_all()
        assert {a.type for a in raw.list_actions()} >= {"ping", "stats", "rotate", "expire_all"}
    finally:
        raw.close()
    assert client.ping()


def test_ft_layer_errors_reach_the_client_as_service_errors(client):
    # Only the acker knows which ids are pending: its refusal reaches the client with the reason.
    ids = np.array([12345], dtype=U64)
    client.persist(words(1), src_ids=ids)
    with pytest.raises(ServiceError, match=r"rejected persist: .*already pending"):
        client.persist(words(1), src_ids=ids)
    assert client.ping()
    # a retried task's persist (idempotent) is kept once
    before = client.stats()["repeats"]
    assert client.persist(words(1), src_ids=ids, idempotent=True).tolist() == ids.tolist()
    assert client.stats()["repeats"] == before + 1
    with pytest.raises(ValueError, match="idempotent: give the src_ids"):
        client.persist(words(1), idempotent=True)
    # What the client can check itself (the FT layer's own argument checks) never goes out.
    with pytest.raises(ValueError, match="source must be in"):
        client.persist(words(1), source=-1)


# ---- retries and idempotency ----------------------------------------------------------------


def test_unreachable_service_raises_service_error_after_bounded_retries():
    location = f"grpc://127.0.0.1:{_free_port()}"
    c = AckerClient(location, retry=FAST_RETRY)
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match=r"unreachable after 3 attempts \(xor\)") as info:
        c.xor([1], [2])
    assert location in str(info.value)
    assert time.monotonic() - t0 < 5.0
    c.close()


def test_retry_policy_budget_and_validation():
    assert RetryPolicy().total_backoff() == pytest.approx(0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1 + 1)
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryPolicy(attempts=0)


class _SlowFirstXor:
    """Wraps an FT layer; the first xor takes longer than the client's call timeout."""

    def __init__(self, ft, delay: float) -> None:
        self._ft, self._delay, self.xor_calls = ft, delay, 0

    def xor(self, src, values):
        self.xor_calls += 1
        if self.xor_calls == 1:
            time.sleep(self._delay)
        return self._ft.xor(src, values)

    def __getattr__(self, name):
        return getattr(self._ft, name)


def test_a_timed_out_xor_retried_is_applied_once(ft):
    slow = _SlowFirstXor(ft, delay=0.6)
    policy = RetryPolicy(attempts=10, initial_backoff=0.01, max_backoff=0.05, call_timeout=0.25)
    with AckerService.embedded(slow) as svc:
        c = AckerClient(svc.location, retry=policy)
        src = c.persist(words(1), births=[5])
        # The first attempt times out on the client but is applied by the service; the retries
        # carry the same request id: they wait for it and get its result, never re-apply it.
        assert c.xor(src, [3]).size == 0
        assert slow.xor_calls == 1
        assert svc.stats()["service"]["retries_deduplicated"] >= 1
        # Applied once: 5 ^ 3 = 6 remains, so XOR-ing 6 completes the record.
        assert c.xor(src, [6]).tolist() == src.tolist()
        c.close()


class _SlowFirstTake:
    """Wraps an FT layer; the first take_replays takes longer than the client's call timeout."""

    def __init__(self, ft, delay: float) -> None:
        self._ft, self._delay, self.take_calls = ft, delay, 0

    def take_replays(self, source=0, partition=None):
        self.take_calls += 1
        out = self._ft.take_replays(source=source, partition=partition)
        if self.take_calls == 1:
            time.sleep(self._delay)  # the replays are taken; the reply comes too late
        return out

    def __getattr__(self, name):
        return getattr(self._ft, name)


def test_a_timed_out_replay_fetch_retried_still_gets_the_replays(ft):
    slow = _SlowFirstTake(ft, delay=0.6)
    policy = RetryPolicy(attempts=10, initial_backoff=0.01, max_backoff=0.05, call_timeout=0.25)
    with AckerService.embedded(slow) as svc, AckerClient(svc.location, retry=policy) as c:
        new = c.fail(c.persist(words(3), births=[1, 2, 3]))
        replays = c.take_replays()
        ids = np.concatenate([t.column("_ft_src").to_numpy() for t in replays.values()])
        assert sorted(ids.tolist()) == sorted(new.tolist())  # handed out, not lost
        assert slow.take_calls == 1
        assert c.take_replays() == {}  # and only once


def test_concurrent_calls_from_threads_each_apply_once(client, ft):
    n_threads, calls, per_call = 4, 10, 50
    births = np.arange(1, n_threads * calls * per_call + 1, dtype=U64)
    src = client.persist(words(len(births)), births=births)
    done: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for c in range(calls):
                lo = (k * calls + c) * per_call
                done.append(client.xor(src[lo : lo + per_call], births[lo : lo + per_call]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(np.concatenate(done).tolist()) == sorted(src.tolist())
    assert ft.pending == 0


def test_same_request_id_applied_once_end_to_end(client, ft):
    src = client.persist(words(1), births=[5])
    batch = pa.RecordBatch.from_arrays(
        [pa.array(src), pa.array([3], pa.uint64())], schema=XOR_SCHEMA
    )
    for _ in range(3):  # what a retry after a lost reply sends
        assert client._put("xor", {"req": "fixed-request-id"}, batch).size == 0
    assert client.xor(src, [6]).tolist() == src.tolist()


def test_request_log_waits_for_a_running_duplicate_and_forgets_failures():
    log = RequestLog()
    started, release, calls = threading.Event(), threading.Event(), []

    def slow():
        calls.append(1)
        started.set()
        release.wait(5)
        return "first"

    results = []
    t = threading.Thread(target=lambda: results.append(log.run("r", slow)))
    t.start()
    started.wait(5)
    t2 = threading.Thread(target=lambda: results.append(log.run("r", lambda: "second")))
    t2.start()
    release.set()
    t.join(5)
    t2.join(5)
    assert results == ["first", "first"]
    assert len(calls) == 1

    def boom():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        log.run("x", boom)
    assert log.run("x", lambda: "ran") == "ran"  # a failed request applied nothing: run again


def test_request_log_expires_and_bounds_memory():
    log = RequestLog(ttl=0.0)
    log.run("a", lambda: 1)
    log.run("b", lambda: 2)
    assert len(log) <= 1
    small = RequestLog(max_bytes=1000)
    for i in range(10):
        small.run(str(i), lambda: np.zeros(100, dtype=U64))  # 800 bytes each
    assert len(small) == 1
    assert small.evicted_early == 9


# ---- authentication and binding ---------------------------------------------------------------


def test_is_loopback():
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("10.1.2.3")
    assert not is_loopback("acker.example.com")


def test_non_loopback_bind_requires_a_token(ft):
    with pytest.raises(ServiceError, match=r"non-loopback address '0\.0\.0\.0' without a token"):
        AckerService(ft, "0.0.0.0", 0)


def test_token_is_enforced_on_every_call(ft):
    with AckerService.embedded(ft, token="s3cret") as svc:
        anonymous = AckerClient(svc.location, retry=FAST_RETRY)
        wrong = AckerClient(svc.location, token="guess", retry=FAST_RETRY)
        right = AckerClient(svc.location, token="s3cret", retry=FAST_RETRY)
        for bad in (anonymous, wrong):
            with pytest.raises(ServiceError, match="unauthenticated"):
                bad.ping()
            with pytest.raises(ServiceError, match="unauthenticated"):
                bad.xor([1], [1])
            with pytest.raises(ServiceError, match="unauthenticated"):
                bad.take_replays()
        assert right.ping()
        assert right.persist(words(2), births=[1, 2]).size == 2
        assert ft.pending == 2  # nothing from the rejected calls was applied
        for c in (anonymous, wrong, right):
            c.close()


# ---- client cache per process ----------------------------------------------------------------


def test_client_cached_per_process_and_location(service):
    a = AckerClient.get(service.location)
    assert AckerClient.get(service.location) is a
    assert AckerClient.get(service.location, token="other") is not a
    a.close()
    assert AckerClient.get(service.location) is not a


def _fork_and_report(child_fn) -> dict:
    """Run ``child_fn()`` in a forked child; return the JSON it reports (bounded in time)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, never return into pytest
        code = 1
        try:
            os.write(write_fd, json.dumps(child_fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline, chunks = time.monotonic() + 20, []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 0.5)
        if ready:
            data = os.read(read_fd, 4096)
            if not data:
                break
            chunks.append(data)
    os.close(read_fd)
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


def test_client_inherited_through_fork_is_never_reused(service):
    parent = AckerClient.get(service.location)
    assert parent.ping()

    def child():
        out = {}
        for name, call in (("inherited", parent.ping), ("get", lambda: AckerClient.get("x://y"))):
            try:
                call()
                out[name] = "used"
            except ServiceError as exc:
                out[name] = str(exc)
        return out

    report = _fork_and_report(child)
    # gRPC was started in this (pytest) process: the child is told so at once, instead of hanging.
    assert "created in another process" in report["inherited"]
    assert "forked from process" in report["get"]
    assert "spawn" in report["get"]
    assert parent.ping()  # the parent's client is untouched by the child


FORKING_WORKER = """
import json, os, sys
from xorack.service import AckerClient
location = sys.argv[1]
pid = os.fork()  # like PySpark's daemon: fork first, then each worker opens its own client
if pid == 0:
    c = AckerClient.get(location)
    ok = c is AckerClient.get(location) and c.ping() and c.persist(
        __import__("pyarrow").record_batch({"w": ["a"]}), births=[3]).size == 1
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
mine = AckerClient.get(location)
sys.exit(os.waitstatus_to_exitcode(status) or (0 if mine.ping() else 1))
"""


def test_forked_workers_each_open_their_own_client(service, ft):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    proc = subprocess.run(
        [sys.executable, "-c", FORKING_WORKER, service.location],
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert ft.pending == 1


# ---- standalone `xorack serve` ----------------------------------------------------------------


def test_serve_killed_and_restarted_on_sqlite_replays_every_pending_record(tmp_path):
    storage = f"sqlite:///{tmp_path / 'acker.db'}"
    proc, location = start_serve("--storage", storage, "--rotate-interval", "0")
    try:
        c = AckerClient(location, retry=FAST_RETRY)
        n = 1000
        births = np.arange(1, n + 1, dtype=U64)
        src = c.persist(words(n), key_hash=np.arange(n, dtype=np.int32), births=births)
        done = c.xor(src[:400], births[:400])  # 400 complete, 600 stay pending
        assert done.size == 400
        c.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    proc, location = start_serve("--storage", storage, "--rotate-interval", "0")
    try:
        c = AckerClient(location, retry=FAST_RETRY)
        replays = c.take_replays(source=0)
        rows = pa.concat_tables(replays.values()) if replays else None
        assert rows is not None
        assert sorted(rows.column("n").to_pylist()) == list(range(400, n))  # none lost, none extra
        assert sorted(rows.column("_ft_origin").to_pylist()) == sorted(src[400:].tolist())
        assert c.stats()["pending"] == n - 400
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "shutting down" in out

    # A graceful stop (SIGTERM) closed the FT layer; the still unfinished records are all there.
    proc, location = start_serve("--storage", storage, "--rotate-interval", "0")
    try:
        with AckerClient(location, retry=FAST_RETRY) as c:
            assert c.stats()["recovered"] == n - 400
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


@pytest.mark.parametrize("via", ["option", "environment"])
def test_serve_with_token_rejects_anonymous_calls(via):
    env_token = "t0ken"
    if via == "option":
        proc, location = start_serve("--token", env_token, "--rotate-interval", "0")
    else:
        proc, location = start_serve("--rotate-interval", "0", token_env=env_token)
    try:
        with pytest.raises(ServiceError, match="unauthenticated"):
            AckerClient(location, retry=FAST_RETRY).ping()
        assert AckerClient(location, token=env_token, retry=FAST_RETRY).ping()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


# ---- the CLI --------------------------------------------------------------------------------


def test_cli_serve_non_loopback_without_token_is_a_clear_error(capsys, monkeypatch):
    from xorack import cli

    monkeypatch.delenv("XORACK_TOKEN", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--host", "0.0.0.0", "--port", "0"])
    assert info.value.code == 2
    assert "not a loopback address: pass --token" in capsys.readouterr().err


def test_cli_serve_on_a_busy_port_or_bad_storage_is_a_clear_error(capsys, tmp_path):
    from xorack import cli

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--port", str(port), "--rotate-interval", "0"]) == 1
    assert f"cannot listen on grpc://127.0.0.1:{port}" in capsys.readouterr().err
    bad = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'ft.db'}"
    for storage, message in [(bad, "does not exist"), ("postgres://x", "unknown storage spec")]:
        with pytest.raises(SystemExit) as info:
            cli.main(["serve", "--port", "0", "--storage", storage])
        assert info.value.code == 2  # an option error, before the service starts
        err = capsys.readouterr().err
        assert err.startswith("xorack serve: error: argument --storage:")
        assert message in err
        assert err.count("\n") == 1


def test_cli_help_documents_every_serve_option(capsys, monkeypatch):
    from xorack import cli

    monkeypatch.setenv("XORACK_TOKEN", "do-not-print-me")
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "do-not-print-me" not in out
    for option in (
        "--host",
        "--port",
        "--storage",
        "--num-buckets",
        "--max-attempts",
        "--rotate-interval",
        "--token",
        "--default-partitions",
        "--replay-partitioner",
    ):
        assert option in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "demo" in out
    assert "serve" in out
    assert "bench" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--colour", "red"], "unrecognized arguments: --colour"),
        (["serve", "--port", "99999"], "port must be in [0, 65535]"),
        (["serve", "--num-buckets", "0"], "argument --num-buckets: must be >= 1"),
        (["serve", "--replay-partitioner", "0=zigzag:3"], "unknown replay partitioner spec"),
        (["serve", "--replay-partitioner", "hash:3"], "expected SOURCE=SPEC"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required"),
    ],
)
def test_cli_bad_arguments_are_clear_errors(capsys, argv, message):
    from xorack import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_delegates_demo_and_bench_with_their_arguments(monkeypatch):
    import types

    from xorack import cli

    seen = {}
    for name in ("demo", "bench"):
        module = types.ModuleType(f"xorack.{name}")
        module.main = lambda argv, name=name: seen.setdefault(name, list(argv)) and 0
        monkeypatch.setitem(sys.modules, f"xorack.{name}", module)
    assert cli.main(["demo", "--records", "10", "--json"]) == 0
    assert cli.main(["bench", "--help"]) == 0
    assert seen == {"demo": ["--records", "10", "--json"], "bench": ["--help"]}


def test_cli_serve_does_not_import_spark():
    code = (
        "import sys, xorack.cli, xorack.service; "
        "sys.exit(1 if any(m.startswith('pyspark') for m in sys.modules) else 0)"
    )
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_held_completions_and_chunk_events_over_the_wire(client, ft):
    ids = (np.uint64(7) << np.uint64(4)) | np.arange(3, dtype=np.uint64)
    client.persist(pa.record_batch({"v": [1, 2, 3]}), births=ids, src_ids=ids)
    event = np.bitwise_xor.reduce(ids)
    assert sorted(client.xor([7], [event], chunk_bits=4).tolist()) == ids.tolist()
    assert client.stats()["held"] == 3
    assert client.release([], chunk_bits=4).tolist() == []
    assert client.stats()["completed"] == 3
    more = ids + np.uint64(16)
    client.persist(pa.record_batch({"v": [4, 5, 6]}), births=more, src_ids=more)
    assert sorted(client.xor(more, more, hold=True).tolist()) == more.tolist()
    assert sorted(client.release([8], chunk_bits=4).tolist()) == more.tolist()
    stats = client.stats()
    assert (stats["collateral"], stats["pending"]) == (3, 3)
    with pytest.raises(ServiceError, match="hold"):
        client._put(
            "xor",
            {"hold": "yes", "req": "r1"},
            pa.record_batch(
                [pa.array([1], pa.uint64()), pa.array([1], pa.uint64())], schema=XOR_SCHEMA
            ),
        )


def test_event_times_travel_with_a_persist_and_stats_answer_their_minimum(client, ft):
    assert client.stats()["min_event_time"] is None
    births = np.array([1, 2, 3], dtype=U64)
    src = client.persist(words(3), births=births, event_time=[30, 10, 20])
    assert ft.storage.lookup(src).event_time.tolist() == [30, 10, 20]
    assert client.stats()["min_event_time"] == 10
    (new,) = client.fail(src[1:2])
    assert client.stats()["min_event_time"] == 10  # its replay keeps it
    (table,) = client.take_replays(source=0).values()
    assert ft.storage.lookup(np.array([new], dtype=U64)).event_time.tolist() == [10]
    client.xor([new], table.column("_ft_rec").to_pylist())
    assert client.stats()["min_event_time"] == 20
    plain = client.persist(words(1), births=[4])  # no event time: no column on the wire
    assert ft.storage.lookup(plain).event_time.tolist() == [NO_EVENT_TIME]
    client.xor(src[[0, 2]], births[[0, 2]])
    stats = client.stats()
    assert (stats["min_event_time"], stats["pending"]) == (None, 1)


def test_a_persist_sends_event_times_as_an_int64_column_only_when_given(client, monkeypatch):
    sent = []
    put = client._put
    monkeypatch.setattr(
        client, "_put", lambda op, cmd, table: sent.append(table) or put(op, cmd, table)
    )
    client.persist(words(2), event_time=5)
    client.persist(words(2))
    assert sent[0].schema.field("_ft_event_time").type == pa.int64()
    assert sent[0].column("_ft_event_time").to_pylist() == [5, 5]
    assert "_ft_event_time" not in sent[1].schema.names
