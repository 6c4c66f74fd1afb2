"""Regression tests of issue 11 (the acker service, the FT layer and SQLite storage under attack):
each test here failed before its fix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from xorack import FTLayer, ServiceError
from xorack.service import (
    XOR_SCHEMA,
    AckerClient,
    AckerService,
    RequestIdReused,
    RequestLog,
    RetryPolicy,
)

U64 = np.uint64
PYTHONPATH = str(Path(__file__).resolve().parents[1] / "python")
FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02, call_timeout=5.0)


@pytest.fixture
def ft():
    layer = FTLayer(storage="memory", num_buckets=3, max_attempts=3)
    yield layer
    layer.close()


@pytest.fixture
def service(ft):
    with AckerService.embedded(ft) as svc:
        yield svc


@pytest.fixture
def client(service):
    c = AckerClient(service.location, retry=FAST_RETRY)
    yield c
    c.close()


def _words(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {"word": [f"w{i}" for i in range(start, start + n)], "n": np.arange(start, start + n)}
    )


def _raw_put(location: str, command: dict, batch: pa.RecordBatch) -> None:
    raw = flight.FlightClient(location)
    try:
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())
        writer, reader = raw.do_put(descriptor, batch.schema)
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    finally:
        raw.close()


# ---- defect 3: a request id that is not a string ---------------------------------------------


@pytest.mark.parametrize("req", [12345, ["a"], {"a": 1}, "", "x" * 129, "tab\there", "é"])
def test_a_bad_request_id_is_refused_before_anything_is_applied(service, client, ft, req):
    with pytest.raises(flight.FlightServerError, match="request id"):
        _raw_put(service.location, {"op": "persist", "req": req}, _words(3))
    assert ft.pending == 0  # nothing applied (before the fix: persisted, reported "rejected")
    assert service.requests.running == 0  # no in-flight entry left behind
    assert client.ping()


def test_request_log_releases_its_entry_on_every_path_and_bounds_waiters():
    log = RequestLog(max_waiters=1)
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(5)
        return "first"

    results = []
    owner = threading.Thread(target=lambda: results.append(log.run("r", slow, op="xor")))
    owner.start()
    started.wait(5)
    waiter = threading.Thread(target=lambda: results.append(log.run("r", slow, op="xor")))
    waiter.start()
    for _ in range(500):  # until the waiter waits
        if log._waiters:
            break
        threading.Event().wait(0.01)
    with pytest.raises(flight.FlightUnavailableError, match="retry later"):
        log.run("r", slow, op="xor")  # a third thread is not parked
    release.set()
    owner.join(5)
    waiter.join(5)
    assert results == ["first", "first"]
    assert log.running == 0
    assert log._waiters == 0


# ---- defect 4: dedupe keyed by (operation, request id) ------------------------------------------


def test_a_request_id_reused_by_another_op_is_refused(client, ft):
    src = client._put(
        "persist", {"req": "one-id"}, _words(1).append_column("_ft_rec", pa.array([5], pa.uint64()))
    )
    assert src.size == 1
    events = pa.RecordBatch.from_arrays(
        [pa.array(src), pa.array([5], pa.uint64())], schema=XOR_SCHEMA
    )
    with pytest.raises(ServiceError, match="already used for 'persist'"):
        client._put("xor", {"req": "one-id"}, events)  # before: the persist's answer, not applied
    with pytest.raises(ServiceError, match="already used for 'persist'"):
        client._action("rotate", {"req": "one-id"})  # before: the persist's ids as "replayed"
    assert ft.pending == 1
    assert ft.stats().rotations == 0
    assert client._put("xor", {"req": "another-id"}, events).tolist() == src.tolist()


def test_request_log_keys_by_op():
    log = RequestLog()
    assert log.run("r", lambda: "persisted", op="persist") == "persisted"
    with pytest.raises(RequestIdReused):
        log.run("r", lambda: "xored", op="xor")
    assert log.run("r", lambda: "again", op="persist") == "persisted"


# ---- defect 8: a zero-column batch with rows ----------------------------------------------------


def test_a_zero_column_batch_is_refused_at_every_entry_point(service, client, ft, tmp_path):
    from xorack.storage import MemoryStorage, RecordMeta, SQLiteStorage

    no_columns = pa.record_batch({"x": [1, 2, 3]}).select([])
    assert no_columns.num_rows == 3
    with pytest.raises(ValueError, match="no columns"):
        ft.persist(no_columns)  # before: accepted, then take_replays raised ArrowInvalid forever
    with pytest.raises(ValueError, match="no columns"):
        client.persist(no_columns)
    with pytest.raises(flight.FlightServerError, match="no payload columns"):
        _raw_put(service.location, {"op": "persist"}, no_columns)
    meta = RecordMeta.new(np.array([1, 2, 3], dtype=U64))
    with SQLiteStorage(tmp_path / "ft.db") as sqlite:
        for storage in (MemoryStorage(), sqlite):
            with pytest.raises(ValueError, match="no columns"):
                storage.persist(no_columns, meta)
            assert len(storage) == 0
    assert ft.pending == 0


# ---- defect 9: tokens no client can send ---------------------------------------------------------


def _serve_once(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``xorack serve`` expecting it to exit at once (killed after 30 s if it serves)."""
    full_env = {k: v for k, v in os.environ.items() if k != "XORACK_TOKEN"}
    full_env.update(PYTHONPATH=PYTHONPATH, **(env or {}))
    try:
        return subprocess.run(
            [sys.executable, "-m", "xorack", "serve", "--port", "0", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"xorack serve {args} started serving: {exc.stdout!r}") from None


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("tab\there", r"'\\t' at position 3"),
        ("new\nline", r"'\\n' at position 3"),
        ("caf\u00e9", "non-ASCII"),
        ("with space", "' ' at position 4"),
        ("x" * 16385, "16385 characters long"),
    ],
)
@pytest.mark.parametrize("via", ["option", "environment"])
def test_serve_refuses_a_token_no_client_can_send(token, message, via):
    if via == "option":
        done = _serve_once("--token", token)
    else:
        done = _serve_once(env={"XORACK_TOKEN": token})
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
    assert done.stderr.startswith("xorack serve: error: ")
    assert re.search(message, done.stderr), done.stderr
    assert token not in done.stderr  # the secret is not echoed


def test_service_and_client_refuse_a_token_no_client_can_send(ft):
    with pytest.raises(ServiceError, match="only visible ASCII"):
        AckerService(ft, token="bad\ttoken")
    with pytest.raises(ValueError, match="only visible ASCII"):
        AckerClient("grpc://127.0.0.1:1", token="bad\ntoken")


# ---- defect 7: a corrupt database behind `xorack serve` ------------------------------------------


def _serve_until_listening(*args: str) -> tuple[str, str]:
    """Start ``xorack serve``, wait for its first line, stop it; (stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "XORACK_TOKEN"}
    env["PYTHONPATH"] = PYTHONPATH
    proc = subprocess.Popen(
        [sys.executable, "-m", "xorack", "serve", "--port", "0", "--rotate-interval", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    return first + out, err


def test_serve_on_a_corrupt_database_quarantines_and_serves_the_healthy_records(tmp_path):
    import sqlite3

    from xorack.storage import RecordMeta, SQLiteStorage

    path = tmp_path / "acker.db"
    with SQLiteStorage(path) as s:
        s.persist(
            pa.record_batch({"x": np.arange(400)}), RecordMeta.new(np.arange(1, 401, dtype=U64))
        )
        s.persist(pa.record_batch({"x": [7]}), RecordMeta.new(np.array([999], dtype=U64)))
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE batches SET meta = ? WHERE id = 2", (b"\x01\x02garbage",))
    db.close()
    out, err = _serve_until_listening("--storage", f"sqlite:///{path}")
    assert "listening on" in out, err  # before: a traceback (ArrowInvalid), exit 1
    assert "pending=400" in out
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if "quarantined" in line]
    assert len(warnings) == 1
    assert "batch 2 (1 records)" in warnings[0]


def test_serve_on_an_unusable_database_is_one_line(tmp_path):
    path = tmp_path / "acker.db"
    path.write_bytes(b"not a database" * 500)
    done = _serve_once("--storage", f"sqlite:///{path}")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "acker.db" in done.stderr
