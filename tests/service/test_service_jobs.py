"""Jobs on one acker (issue 11, defect 1): each job — one pipeline run — has its own sources,
rounds, replays, dead letters, stats and ended attempts; a client of one job cannot take, ack
or fail another job's records; a job may have a credential of its own."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from helpers.acker import FAST_RETRY, start_serve
from xorack import FTLayer, ServiceError
from xorack.service import AckerClient, AckerService, check_job

U64 = np.uint64
PYTHONPATH = str(Path(__file__).resolve().parents[2] / "python")


def _rows(tag: str, n: int) -> pa.RecordBatch:
    return pa.record_batch({"tag": [tag] * n, "n": np.arange(n)})


@pytest.fixture
def acker():
    """A standalone-style acker: a job's FT layer is made on its first call."""
    with AckerService(
        None, ft_factory=lambda job: FTLayer(max_attempts=3, default_partitions=1)
    ) as svc:
        svc.start()
        yield svc


def _client(svc: AckerService, job: str | None, token: str | None = None) -> AckerClient:
    return AckerClient(svc.location, token=token, retry=FAST_RETRY, job=job)


def _replayed(client: AckerClient) -> pa.Table | None:
    parts = client.take_replays(source=0)
    return pa.concat_tables(parts.values()) if parts else None


def test_two_jobs_interleaving_on_one_acker_stay_exact(acker):
    a, b = _client(acker, "job-a"), _client(acker, "job-b")
    births_a = np.arange(1, 101, dtype=U64)
    births_b = np.arange(1001, 1051, dtype=U64)
    src_a = a.persist(_rows("a", 100), births=births_a)  # both jobs number their source 0
    src_b = b.persist(_rows("b", 50), births=births_b)
    a.fail(src_a[:10], reason="a's bad rows")

    # job B ends its round: only B's records time out (before: A's in-flight records too)
    assert sorted(b.expire_all().tolist()) != []
    assert a.stats()["timed_out"] == 0
    assert b.stats()["timed_out"] == 50

    rep_a = _replayed(a)  # only A's replays (before: B's payload rows came along)
    assert rep_a.column("tag").to_pylist() == ["a"] * 10
    assert sorted(rep_a.column("_ft_origin").to_pylist()) == sorted(src_a[:10].tolist())
    rep_b = _replayed(b)
    assert rep_b.column("tag").to_pylist() == ["b"] * 50
    assert _replayed(a) is None

    # A acks all its records (originals and replays); B's stay pending
    done = a.xor(src_a[10:], births_a[10:])
    done_r = a.xor(rep_a.column("_ft_src").to_numpy(), rep_a.column("_ft_rec").to_numpy())
    assert len(done) + len(done_r) == 100
    sa, sb = a.stats(), b.stats()
    assert (sa["persisted"], sa["completed"], sa["pending"], sa["failed"]) == (100, 100, 0, 10)
    assert (sb["persisted"], sb["completed"], sb["pending"], sb["failed"]) == (50, 0, 50, 0)
    assert sa["service"]["job"] == "job-a"

    # ended attempts and dead letters are per job too
    assert sorted(a.take_ended().tolist()) == sorted(src_a[:10].tolist())
    assert sorted(b.take_ended().tolist()) == sorted(src_b.tolist())
    b.expire_all()
    b.take_replays()
    b.expire_all()
    assert b.dead_letters().num_rows == 50
    assert a.dead_letters().num_rows == 0
    assert set(acker.jobs) == {"job-a", "job-b"}


def test_a_client_of_one_job_cannot_touch_another_jobs_records(acker):
    a, b = _client(acker, "job-a"), _client(acker, "job-b")
    births = np.arange(1, 21, dtype=U64)
    src_b = b.persist(_rows("b", 20), births=births)
    assert a.xor(src_b, births).size == 0  # not A's: acks nothing of B
    assert a.fail(src_b).size == 0  # a counted no-op in A
    a.touch(src_b)
    assert a.expire_all().size == 0
    assert a.take_replays(source=0) == {}
    assert a.take_ended().size == 0
    sb = b.stats()
    assert (sb["pending"], sb["completed"], sb["failed"], sb["timed_out"]) == (20, 0, 0, 0)
    assert a.stats()["unknown_failures"] == 20
    assert sorted(b.xor(src_b, births).tolist()) == sorted(src_b.tolist())  # still B's to ack


def test_request_ids_are_each_jobs_own(acker):
    a, b = _client(acker, "job-a"), _client(acker, "job-b")
    wire = _rows("x", 3).append_column("_ft_rec", pa.array([1, 2, 3], pa.uint64()))
    ids_a = a._put("persist", {"req": "same-id"}, wire)
    ids_b = b._put("persist", {"req": "same-id"}, wire)  # before: answered with A's ids
    assert not set(ids_a.tolist()) & set(ids_b.tolist())
    assert a.stats()["persisted"] == b.stats()["persisted"] == 3


def test_no_job_is_the_default_job(acker):
    plain = AckerClient(acker.location, retry=FAST_RETRY)
    named = _client(acker, "default")
    src = plain.persist(_rows("d", 2), births=[1, 2])
    assert sorted(named.xor(src, [1, 2]).tolist()) == sorted(src.tolist())
    assert AckerClient.get(acker.location) is AckerClient.get(acker.location, job=None)
    assert AckerClient.get(acker.location, job="x") is not AckerClient.get(acker.location)


def test_embedded_service_serves_its_own_job_only():
    with FTLayer() as ft, AckerService.embedded(ft, job="run-17") as svc:
        mine = AckerClient(svc.location, retry=FAST_RETRY, job="run-17")
        assert mine.persist(_rows("r", 1)).size == 1
        assert ft.pending == 1
        with pytest.raises(ServiceError, match="serves job 'run-17' only"):
            AckerClient(svc.location, retry=FAST_RETRY).stats()
        with pytest.raises(ServiceError, match="serves job 'run-17' only"):
            AckerClient(svc.location, retry=FAST_RETRY, job="other").xor([5], [5])


def test_a_job_with_its_own_token():
    with AckerService(
        None,
        token="service-token",
        job_tokens={"secret-job": "job-token"},
        ft_factory=lambda job: FTLayer(),
    ) as svc:
        svc.start()
        assert _client(svc, "secret-job", "job-token").ping()
        assert _client(svc, "open-job", "service-token").ping()
        for job, token in [
            ("secret-job", "service-token"),  # the service's token does not open it
            ("open-job", "job-token"),  # nor does a job's token open other jobs
            ("secret-job", None),
        ]:
            with pytest.raises(ServiceError, match="unauthenticated"):
                _client(svc, job, token).ping()


@pytest.mark.parametrize("job", ["", "a/b", "x" * 65, "sp ace", "é", 5])
def test_bad_job_names_are_refused(acker, job):
    with pytest.raises(ValueError, match="job must be"):
        check_job(job)
    with pytest.raises(ValueError, match="job must be"):
        AckerClient(acker.location, job=job)
    if isinstance(job, str) and job.isascii():
        raw = flight.FlightClient(acker.location)
        options = flight.FlightCallOptions(headers=[(b"x-xorack-job", job.encode())])
        with pytest.raises(flight.FlightError, match="job must be"):
            list(raw.do_action(flight.Action("ping", b"{}"), options=options))
        raw.close()


def test_max_jobs_bounds_the_jobs_an_acker_serves():
    with AckerService(None, ft_factory=lambda job: FTLayer(), max_jobs=2) as svc:
        svc.start()
        assert _client(svc, "one").ping()
        assert _client(svc, "two").ping()
        with pytest.raises(ServiceError, match="max_jobs"):
            _client(svc, "three").ping()


def test_serve_keeps_each_jobs_records_across_a_crash(tmp_path):
    storage = f"sqlite:///{tmp_path / 'acker.db'}"
    proc, location = start_serve("--rotate-interval", "0", "--storage", storage)
    try:
        a = AckerClient(location, retry=FAST_RETRY, job="job-a")
        b = AckerClient(location, retry=FAST_RETRY, job="job-b")
        src_a = a.persist(_rows("a", 30), births=np.arange(1, 31, dtype=U64))
        b.persist(_rows("b", 5), births=np.arange(1, 6, dtype=U64))
        a.xor(src_a[:10], np.arange(1, 11, dtype=U64))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    assert (tmp_path / "acker.db.jobs" / "job-a.db").exists()

    proc, location = start_serve("--rotate-interval", "0", "--storage", storage)
    try:
        a = AckerClient(location, retry=FAST_RETRY, job="job-a")
        b = AckerClient(location, retry=FAST_RETRY, job="job-b")
        rep_a = _replayed(a)
        assert sorted(rep_a.column("n").to_pylist()) == list(range(10, 30))
        assert set(rep_a.column("tag").to_pylist()) == {"a"}
        assert _replayed(b).column("tag").to_pylist() == ["b"] * 5
        assert _replayed(AckerClient(location, retry=FAST_RETRY)) is None  # the default job
        assert a.stats()["recovered"] == 20
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_idle_finished_jobs_make_room_for_new_ones():
    made = []

    def make(job):
        made.append(job)
        return FTLayer()

    with AckerService(None, ft_factory=make, max_jobs=2, job_idle_seconds=0) as svc:
        svc.start()
        done, busy = _client(svc, "done"), _client(svc, "busy")
        src = done.persist(_rows("d", 1), births=[4])
        done.xor(src, [4])  # finished: nothing pending
        busy.persist(_rows("b", 1), births=[4])  # one record still pending
        assert _client(svc, "new").ping()  # "done" was closed to make room
        assert set(svc.jobs) == {"busy", "new"}
        assert busy.stats()["pending"] == 1  # a job with records pending is never closed
        assert _client(svc, "newer").ping()  # "new" (idle, nothing pending) made room
        assert svc.stats("busy")["service"]["jobs_retired"] == 2
        busy.persist(_rows("b", 1), births=[4])
        newer = _client(svc, "newer")
        src = newer.persist(_rows("n", 1), births=[4])
        with pytest.raises(ServiceError, match="max_jobs"):  # both have records pending
            _client(svc, "one-too-many").ping()
        newer.xor(src, [4])
        assert done.stats()["persisted"] == 0  # back: a fresh namespace (memory storage)
        assert made == ["done", "busy", "new", "newer", "done"]
