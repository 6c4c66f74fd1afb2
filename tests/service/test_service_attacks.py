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

from helpers.acker import FAST_RETRY, words
from xorack import FTLayer, ServiceError
from xorack.service import (
    XOR_SCHEMA,
    AckerClient,
    AckerService,
    RequestIdReused,
    RequestLog,
)

U64 = np.uint64
PYTHONPATH = str(Path(__file__).resolve().parents[2] / "python")


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
        _raw_put(service.location, {"op": "persist", "req": req}, words(3))
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
        "persist", {"req": "one-id"}, words(1).append_column("_ft_rec", pa.array([5], pa.uint64()))
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
    assert done.returncode == 2  # an option error, before the service starts
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "acker.db" in done.stderr


# ---- defect 2: bounded requests ------------------------------------------------------------------


def test_an_oversized_request_is_refused_and_a_chunked_one_accepted(ft, monkeypatch):
    import xorack.client as client_module

    with AckerService.embedded(ft, max_request_bytes=1 << 20) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        big = pa.record_batch({"v": np.zeros(200_000, np.int64)})  # 1.6 MB
        with pytest.raises(ServiceError, match=r"says it is \d+ bytes, more than .* 1048576"):
            c.persist(big)
        # a sender that does not say its size is refused once the total passes the cap
        part = pa.record_batch({"v": np.zeros(50_000, np.int64)})  # 400 KB a message
        with pytest.raises(flight.FlightServerError, match="sent at least"):
            _raw_stream(svc.location, part, 10)
        assert ft.pending == 0
        assert svc.stats()["service"]["rejected"] == 2
        # under the cap, a persist goes in many messages and is applied once, as a whole
        monkeypatch.setattr(client_module, "CHUNK_BYTES", 64 << 10)
        ok = pa.record_batch({"v": np.arange(50_000, dtype=np.int64)})  # + births: 800 KB
        src = c.persist(ok, births=np.arange(1, 50_001, dtype=U64))  # 13 messages
        assert len(src) == 50_000
        assert ft.pending == 50_000
        assert ft.storage.fetch(src[-3:])[0].column("v").to_pylist() == [49_997, 49_998, 49_999]
        c.close()


def _raw_stream(location: str, part: pa.RecordBatch, count: int) -> None:
    """A persist of ``count`` messages ``part`` that does not say its size."""
    raw = flight.FlightClient(location)
    descriptor = flight.FlightDescriptor.for_command(json.dumps({"op": "persist"}).encode())
    try:
        writer, reader = raw.do_put(descriptor, part.schema)
        try:
            for _ in range(count):
                writer.write_batch(part)
            writer.done_writing()
            reader.read()
        finally:
            writer.close()
    finally:
        raw.close()


class _OutOfMemoryOnce(FTLayer):
    def persist(self, *args, **kwargs):
        if not getattr(self, "failed_once", False):
            self.failed_once = True
            raise MemoryError("simulated: cannot allocate")
        return super().persist(*args, **kwargs)


def test_running_out_of_memory_refuses_the_request_and_the_service_stays_up():
    with _OutOfMemoryOnce() as ft, AckerService.embedded(ft) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        with pytest.raises(ServiceError, match="ran out of memory on persist and refused it"):
            c.persist(words(3))
        assert ft.pending == 0
        assert c.persist(words(3)).size == 3  # the same call again: applied now
        assert c.ping()
        c.close()


def test_a_table_of_several_chunks_is_persisted_all_or_nothing():
    from xorack import StorageError
    from xorack.storage import MemoryStorage

    class FullAfterOne(MemoryStorage):
        calls = 0

        def persist(self, batch, meta):
            self.calls += 1
            if self.calls == 2:
                raise StorageError("simulated: disk full")
            super().persist(batch, meta)

    table = pa.Table.from_batches([words(3), words(4, 3), words(2, 7)])
    storage = FullAfterOne()
    with FTLayer(storage) as ft:
        with pytest.raises(StorageError, match="disk full"):
            ft.persist(table)
        assert (len(storage), ft.pending) == (0, 0)  # the first chunk was taken back
        src = ft.persist(table)  # chunk by chunk, never combined into one
        assert (len(storage), ft.pending, storage.calls) == (9, 9, 5)
        assert ft.storage.fetch(src)[0].column("n").to_pylist() == list(range(9))


_SERVE_UNDER_LIMIT = """
import resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from xorack.cli import main
sys.exit(main(["serve", "--port", "0", "--rotate-interval", "0", "--max-request-mb", "32"]))
"""


def _address_space(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_the_service_survives_oversized_requests_under_an_address_space_limit(tmp_path):
    """Issue 11, defect 2: a 384 MiB persist drove the acker to 1.9 GB and MemoryError, the next
    one segfaulted it. Under an address-space cap of what it uses idle + 600 MiB, oversized
    requests are refused and the service goes on serving."""
    env = {k: v for k, v in os.environ.items() if k != "XORACK_TOKEN"}
    env["PYTHONPATH"] = PYTHONPATH
    # the idle acker's address space, measured first (thread stacks and allocator arenas)
    probe = subprocess.Popen(
        [sys.executable, "-c", _SERVE_UNDER_LIMIT, str(1 << 40)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert "listening" in probe.stdout.readline()
        idle = _address_space(probe.pid)
    finally:
        probe.send_signal(signal.SIGTERM)
        probe.communicate(timeout=30)
    limit = idle + (600 << 20)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE_UNDER_LIMIT, str(limit)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "listening" in line, proc.stderr.read() if proc.poll() is not None else line
        location = line.split("listening on ")[1].split()[0]
        c = AckerClient(location, retry=FAST_RETRY)
        huge = pa.record_batch({"v": np.zeros(100 << 20, np.int64)})  # 800 MiB, untouched pages
        part = pa.record_batch({"v": np.zeros(1 << 20, np.int64)})  # 8 MiB a message
        for _ in range(3):
            with pytest.raises(ServiceError, match="more than this acker's limit"):
                c.persist(huge)  # says its size: refused before a byte of it is read
            with pytest.raises(flight.FlightError, match="more than this acker's limit"):
                _raw_stream(location, part, 100)  # does not (800 MiB): refused at the cap
            src = c.persist(words(1000), births=np.arange(1, 1001, dtype=U64))
            assert sorted(c.xor(src, np.arange(1, 1001, dtype=U64)).tolist()) == sorted(
                src.tolist()
            )
        assert c.ping()
        assert proc.poll() is None  # still running
        assert c.stats()["service"]["rejected"] == 6
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


# ---- issue 9 item 7: internal errors said so; the request log when a call applied partly ---------


def test_an_xor_applied_before_its_delete_failed_is_answered_once():
    """The completions of an xor were applied, then the storage's delete failed: the call used
    to fail, so the request log forgot it and a retry XORed the events twice."""
    from xorack import StorageError
    from xorack.storage import MemoryStorage

    class DeleteFailsOnce(MemoryStorage):
        failed = False

        def delete(self, src_ids):
            if not self.failed:
                self.failed = True
                raise StorageError("simulated: disk unavailable")
            return super().delete(src_ids)

    storage = DeleteFailsOnce()
    with FTLayer(storage) as ft, AckerService.embedded(ft) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        src = c.persist(words(1), births=[5])
        events = pa.RecordBatch.from_arrays(
            [pa.array(src), pa.array([5], pa.uint64())], schema=XOR_SCHEMA
        )
        for _ in range(2):  # the call and its retry: one completion, applied once
            assert c._put("xor", {"req": "xor-1"}, events).tolist() == src.tolist()
        stats = c.stats()
        assert (stats["completed"], stats["pending"], stats["orphans"]) == (1, 0, 0)
        assert len(storage) == 1  # its delete is retried by the next call ...
        c.rotate()
        assert len(storage) == 0  # ... here
        c.close()


class _Buggy(FTLayer):
    def xor(self, src_ids, values):
        raise KeyError("a bug of the acker")


def test_an_internal_error_is_reported_as_internal_not_as_a_rejection():
    with _Buggy() as ft, AckerService.embedded(ft) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        with pytest.raises(ServiceError, match=r"internal error, not a problem of the request"):
            c.xor([5], [5])
        service = c.stats()["service"]
        assert (service["rejected"], service["failed"]) == (0, 1)
        c.close()


def test_a_request_of_too_many_rows_is_refused(ft):
    """However small each row, a pending record costs the acker ~150-200 bytes: the rows of one
    request are bounded too."""
    with AckerService.embedded(ft, max_request_rows=1000) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        with pytest.raises(ServiceError, match=r"says it has 1001 rows, more than .* 1000 rows"):
            c.persist(pa.record_batch({"b": np.zeros(1001, np.bool_)}))
        part = pa.record_batch({"v": np.zeros(400, np.int64)})
        with pytest.raises(
            flight.FlightServerError, match=r"sent at least 1200 rows, more than .* 1000 rows"
        ):
            _raw_stream(svc.location, part, 3)
        assert c.persist(pa.record_batch({"b": np.zeros(1000, np.bool_)})).size == 1000
        c.close()


def test_an_event_call_beyond_the_row_cap_goes_as_several_requests(ft, monkeypatch):
    import xorack.client as client_module

    monkeypatch.setattr(client_module, "EVENT_CHUNK_ROWS", 100)
    with AckerService.embedded(ft, max_request_rows=100) as svc:
        c = AckerClient(svc.location, retry=FAST_RETRY)
        births = np.arange(1, 301, dtype=U64)
        src = np.concatenate(
            [c.persist(words(100, k), births=births[k : k + 100]) for k in (0, 100, 200)]
        )
        assert sorted(c.xor(src, births).tolist()) == sorted(src.tolist())  # 3 requests
        assert ft.pending == 0
        src = c.persist(words(100), births=births[:100])
        c.touch(np.concatenate([src, src, src]))
        assert c.fail(np.concatenate([src[:50], src[:50], src[50:]])).size == 100
        assert c.stats()["service"]["calls"]["xor"] == 3
        c.close()
