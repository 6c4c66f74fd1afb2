"""Deferred XOR events (``xor_deferred`` / ``flush``): a client of N shards coalesces the events
bound for one shard into large requests, and keeps every guarantee of a plain ``xor``: each
event sent once, before any other call of the client, by the time ``flush`` returns."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.acker import FAST_RETRY
from xorack.event_buffer import EventBuffer
from xorack.service import AckerClient
from xorack.sharding import draw_ids, shard_of
from xorack.shards import ShardedAcker, ShardedAckerClient

SHARD_ARGS = ["--max-attempts", "3", "--rotate-interval", "0"]


# ---- the buffer on its own -------------------------------------------------------------------


class Recorder:
    """A buffer's ``send``: remembers each request (shard, src, values, kind)."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, list[int], list[int], tuple[bool, int]]] = []

    def __call__(self, parts, kind):
        for k, src, val in parts:
            self.requests.append((k, src.tolist(), val.tolist(), kind))
        return np.empty(0, np.uint64)


@settings(max_examples=60, deadline=None)
@given(
    background=st.booleans(),
    shards=st.integers(1, 4),
    limit=st.integers(1, 40),
    calls=st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2**64 - 1)), max_size=30),
            st.sampled_from([(False, 0), (True, 0), (True, 10)]),
        ),
        max_size=12,
    ),
)
def test_every_deferred_event_is_sent_once_to_its_shard_in_kind_order(
    background, shards, limit, calls
):
    send = Recorder()
    buf = EventBuffer(shards, send, rows=limit, max_delay=1e9, background=background)
    added = []
    for events, kind in calls:
        parts = []
        for k in range(shards):
            mine = [v for sh, v in events if sh % shards == k]
            if mine:
                src = np.array(mine, np.uint64)
                parts.append((k, src, src ^ np.uint64(7)))
                added += [(k, v, kind) for v in mine]
        buf.add(parts, kind)
        buf.settle()  # (a background send may still be on its way)
        assert buf.rows == len(added) - sum(len(r[1]) for r in send.requests)
    buf.flush()
    assert not buf.waiting()
    buf.close()
    assert buf.rows == 0
    sent = [(k, s, kind) for k, src, _val, kind in send.requests for s in src]
    assert sorted(sent) == sorted(added)  # each once, on its shard, with its kind
    for _k, src, val, _kind in send.requests:
        assert [s ^ 7 for s in src] == val  # values stay with their ids
    # a kind's events are never sent after a later kind's
    kinds = [kind for events, kind in calls if events]
    order = [kind for *_rest, kind in send.requests]
    runs = [kinds[0]] if kinds else []
    for kind in kinds[1:]:
        if kind != runs[-1]:
            runs.append(kind)
    squeezed = [order[0]] if order else []
    for kind in order[1:]:
        if kind != squeezed[-1]:
            squeezed.append(kind)
    assert squeezed == runs


@settings(max_examples=60, deadline=None)
@given(
    background=st.booleans(),
    shards=st.integers(1, 5),
    limit=st.integers(1, 50),
    batches=st.lists(
        st.lists(st.one_of(st.integers(1, 3000), st.integers(1, 2**64 - 1)), max_size=80),
        max_size=10,
    ),
    chunk_bits=st.sampled_from([0, 3]),
)
def test_events_scattered_by_shard_go_each_once_to_its_shard_in_order(
    background, shards, limit, batches, chunk_bits
):
    send = Recorder()
    buf = EventBuffer(shards, send, rows=limit, max_delay=1e9, background=background)
    expected: list[list[tuple[int, int]]] = [[] for _ in range(shards)]
    for batch in batches:
        src = np.array(batch, np.uint64)
        val = src ^ np.uint64(99)
        with np.errstate(over="ignore"):
            owner = shard_of(src << np.uint64(chunk_bits), shards)
        for k, s_, v in zip(owner.tolist(), batch, val.tolist(), strict=True):
            expected[k].append((s_, v))
        buf.add_split(src, val, chunk_bits, (False, chunk_bits))
        src[:] = 1  # the caller reuses its arrays: the buffer has its own copy
        val[:] = 0
    buf.flush()
    assert buf.rows == 0
    got: list[list[tuple[int, int]]] = [[] for _ in range(shards)]
    for k, src_, val_, _kind in send.requests:
        got[k] += list(zip(src_, val_, strict=True))
    assert got == expected  # each event once, on its shard, in order, with its value
    buf.close()


def test_a_shard_is_sent_once_it_holds_the_limit_and_the_rest_waits_for_flush():
    send = Recorder()
    buf = EventBuffer(2, send, rows=4, max_delay=1e9)
    ids = np.arange(1, 4, dtype=np.uint64)
    buf.add([(0, ids, ids), (1, ids[:1], ids[:1])], (False, 0))
    assert send.requests == []
    buf.add([(0, ids[:1] + 10, ids[:1])], (False, 0))
    assert [(k, len(s)) for k, s, _v, _kind in send.requests] == [(0, 4)]
    buf.flush()
    assert [(k, len(s)) for k, s, _v, _kind in send.requests] == [(0, 4), (1, 1)]


def test_events_older_than_max_delay_are_sent_at_the_next_deferred_call():
    now = [0.0]
    send = Recorder()
    buf = EventBuffer(1, send, rows=1000, max_delay=0.5, clock=lambda: now[0])
    one = np.ones(1, np.uint64)
    buf.add([(0, one, one)], (False, 0))
    now[0] = 0.4
    buf.add([(0, one + 1, one)], (False, 0))
    assert send.requests == []
    now[0] = 0.6
    buf.add([(0, one + 2, one)], (False, 0))
    assert [s for _k, s, _v, _kind in send.requests] == [[1, 2, 3]]


def test_a_failed_send_raises_and_drops_its_events_once():
    calls = []

    def send(parts, kind):
        calls.append(sum(len(s) for _k, s, _v in parts))
        raise ConnectionError("acker down")

    buf = EventBuffer(1, send, rows=10, max_delay=1e9)
    ids = np.arange(1, 6, dtype=np.uint64)
    buf.add([(0, ids, ids)], (False, 0))
    with pytest.raises(ConnectionError):
        buf.flush()
    assert buf.rows == 0
    assert not buf.waiting()
    buf.flush()  # nothing is sent twice
    assert calls == [5]


class Gate:
    """A ``send`` that records its requests (and the thread it ran on) and, while ``held``,
    waits until released: a send in flight, for as long as a test needs it."""

    def __init__(self, fail: bool = False) -> None:
        self.requests: list[list[int]] = []
        self.threads: list[int] = []
        self.open = threading.Event()
        self.started = threading.Event()
        self.fail = fail

    def __call__(self, parts, kind):
        self.started.set()
        assert self.open.wait(10)
        self.threads.append(threading.get_ident())
        self.requests.append([int(s) for _k, src, _v in parts for s in src])
        if self.fail:
            raise ConnectionError("acker down")
        return np.array(self.requests[-1][:1], np.uint64)


def _ids(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


def test_a_background_send_runs_while_the_caller_goes_on_one_at_a_time():
    gate = Gate()
    buf = EventBuffer(1, gate, rows=2, max_delay=1e9, background=True)
    buf.add([(0, _ids(1, 2), _ids(1, 2))], (False, 0))  # full: sent in the background
    assert gate.started.wait(10)
    assert gate.requests == []  # in flight, the caller went on
    assert buf.waiting()
    releaser = threading.Timer(0.2, gate.open.set)
    releaser.start()
    buf.add([(0, _ids(3), _ids(3))], (False, 0))  # the next call waits for the send first
    assert gate.requests == [[1, 2]]
    buf.add([(0, _ids(4), _ids(4))], (False, 0))  # full again: sent in the background
    done = buf.flush()
    assert gate.requests == [[1, 2], [3, 4]]  # in order, each once
    assert sorted(done.tolist()) == [1, 3]  # what both sends completed
    assert threading.get_ident() not in gate.threads  # both full sends: the buffer's thread
    assert not buf.waiting()
    assert buf.requests == 2
    buf.close()


def test_a_failed_background_send_raises_before_the_next_add_takes_its_events():
    gate = Gate(fail=True)
    buf = EventBuffer(1, gate, rows=2, max_delay=1e9, background=True)
    buf.add([(0, _ids(1, 2), _ids(1, 2))], (False, 0))
    assert gate.started.wait(10)
    threading.Timer(0.2, gate.open.set).start()  # the send fails while the next add waits
    with pytest.raises(ConnectionError):
        buf.add([(0, _ids(3), _ids(3))], (False, 0))
    assert buf.rows == 0  # the add that raised took none of its events
    gate.fail = False
    buf.flush()
    assert gate.requests == [[1, 2]]  # nothing of the call that raised is ever sent
    buf.close()


def test_a_flush_that_raises_a_background_error_leaves_nothing_buffered():
    gate = Gate(fail=True)
    buf = EventBuffer(2, gate, rows=2, max_delay=1e9, background=True)
    buf.add([(0, _ids(1, 2), _ids(1, 2)), (1, _ids(9), _ids(9))], (False, 0))
    assert gate.started.wait(10)
    threading.Timer(0.2, gate.open.set).start()
    with pytest.raises(ConnectionError):
        buf.flush()
    assert buf.rows == 0  # shard 1's event dropped with the failed flush, as a failed send's
    assert not buf.waiting()
    gate.fail = False
    buf.flush()
    assert gate.requests == [[1, 2]]
    buf.close()


def test_a_failed_background_send_raises_at_the_next_call_and_drops_only_its_events():
    gate = Gate(fail=True)
    gate.open.set()
    buf = EventBuffer(1, gate, rows=2, max_delay=1e9, background=True)
    buf.add([(0, _ids(1, 2), _ids(1, 2))], (False, 0))
    assert gate.started.wait(10)
    with pytest.raises(ConnectionError):
        buf.settle()  # (or the first add that finds it ended, or flush)
    buf.add([(0, _ids(3), _ids(3))], (False, 0))
    gate.fail = False
    buf.flush()
    assert gate.requests == [[1, 2], [3]]  # the failed events once, the later ones kept
    buf.settle()  # the error was raised once
    buf.close()


def test_a_call_from_inside_a_background_send_does_not_flush_again():
    seen = []

    def send(parts, kind):  # a client's send calls the client, which flushes first
        seen.append((buf.waiting(), len(buf.flush())))
        buf.settle()
        return np.empty(0, np.uint64)

    buf = EventBuffer(1, send, rows=1, max_delay=1e9, background=True)
    buf.add([(0, _ids(1), _ids(1))], (False, 0))
    buf.flush()
    assert seen == [(True, 0)]  # returned at once (a flush there would wait for itself)
    buf.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_does_not_wait_for_its_parents_send_in_flight():
    gate = Gate()
    buf = EventBuffer(1, gate, rows=2, max_delay=1e9, background=True)
    buf.add([(0, _ids(1, 2), _ids(1, 2))], (False, 0))
    assert gate.started.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: its own buffer, no send in flight, no send thread
        code = 1
        try:
            gate.open.set()  # (the child's copy of the gate: the child's sends pass)
            buf.discard()
            buf.add([(0, _ids(7), _ids(7))], (False, 0))
            buf.flush()
            code = 0 if gate.requests == [[7]] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    gate.open.set()
    buf.flush()
    assert os.waitstatus_to_exitcode(status) == 0
    assert gate.requests == [[1, 2]]  # the parent's send, once
    buf.close()


def test_bad_buffer_settings_are_refused():
    with pytest.raises(ValueError, match="rows must be an int >= 1"):
        EventBuffer(1, Recorder(), rows=0)
    with pytest.raises(ValueError, match="max_delay"):
        EventBuffer(1, Recorder(), max_delay=-1)
    with pytest.raises(TypeError, match="background must be True or False"):
        EventBuffer(1, Recorder(), background="yes")


# ---- through the clients, against real ackers ------------------------------------------------


@pytest.fixture(scope="module")
def two_shards():
    with ShardedAcker(2, serve_args=SHARD_ARGS) as acker:
        yield acker


def _persisted(client, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rec = draw_ids(n)
    x = np.arange(start, start + n)
    src = client.persist(pa.record_batch({"x": x}), births=rec)
    return src, rec


def _xor_calls(client) -> int:
    stats = client.stats()["service"]
    return sum(s["calls"].get("xor", 0) for s in stats.get("shards") or [stats])


@pytest.fixture(params=["one acker", "two shards"])
def any_client(request, service):
    if request.param == "one acker":
        client = AckerClient(service.location, retry=FAST_RETRY)
    else:
        client = ShardedAckerClient(request.getfixturevalue("two_shards").location)
    yield client
    client.close()


def test_deferred_acks_complete_their_records_once_flushed(any_client):
    client = any_client
    src, rec = _persisted(client, 300)
    completed0 = client.stats()["completed"]
    for k in range(0, 300, 30):  # ten small batches, as a task's Arrow batches
        client.xor_deferred(src[k : k + 30], rec[k : k + 30])
    assert client.deferred.rows == 300  # nothing sent yet: far below a request's size
    done = client.flush()
    assert sorted(done.tolist()) == sorted(src.tolist())
    assert client.stats()["completed"] - completed0 == 300
    assert len(client.flush()) == 0  # each completion reported once


def test_the_deferred_events_of_a_shard_go_as_one_request(two_shards):
    client = ShardedAckerClient(two_shards.location)
    try:
        src, rec = _persisted(client, 2000)
        before = _xor_calls(client)
        for k in range(0, 2000, 100):
            client.xor(src[k : k + 100], rec[k : k + 100] ^ np.uint64(1))
        direct = _xor_calls(client) - before
        for k in range(0, 2000, 100):
            client.xor_deferred(src[k : k + 100], np.ones(100, np.uint64))
        client.flush()
        coalesced = _xor_calls(client) - before - direct
        assert direct == 2 * 20  # a plain xor: one request per shard per call
        assert coalesced == 2  # deferred: one per shard
        assert client.stats()["completed"] >= 2000  # both halves of each ack arrived
    finally:
        client.close()


def test_any_other_call_sends_the_deferred_events_first(any_client):
    client = any_client
    src, rec = _persisted(client, 40)
    client.xor_deferred(src, rec)  # acks every record ...
    replays = client.fail(src)  # ... before this fail reaches the acker: nothing to fail
    assert len(replays) == 0
    assert client.deferred.rows == 0
    src2, rec2 = _persisted(client, 10, start=40)
    client.xor_deferred(src2, rec2)
    assert client.stats()["pending"] == 0  # a driver call flushes too


def test_a_deferred_xor_keeps_its_own_copy_of_the_arrays(any_client):
    client = any_client
    src, rec = _persisted(client, 20)
    ids, values = src.copy(), rec.copy()
    client.xor_deferred(ids, values)
    ids[:] = 1  # the caller reuses its arrays
    values[:] = 0
    assert sorted(client.flush().tolist()) == sorted(src.tolist())


def test_closing_a_client_sends_its_deferred_events(two_shards):
    client = ShardedAckerClient(two_shards.location)
    src, rec = _persisted(client, 25)
    client.xor_deferred(src, rec)
    client.close()
    other = ShardedAckerClient(two_shards.location)
    try:
        assert len(other.fail(src)) == 0  # all completed: nothing left to fail and replay
    finally:
        other.close()


def test_bad_deferred_events_are_refused_at_the_call(any_client):
    client = any_client
    with pytest.raises(TypeError, match="src_ids must be uint64"):
        client.xor_deferred(np.array([1.5]), [1])
    with pytest.raises(ValueError, match="id 0"):
        client.xor_deferred([0], [1])
    with pytest.raises(ValueError, match="length"):
        client.xor_deferred([1, 2], [1])
    with pytest.raises(ValueError, match="chunk_bits"):
        client.xor_deferred([1], [1], chunk_bits=99)
    with pytest.raises(TypeError, match="hold"):
        client.xor_deferred([1], [1], hold="yes")
    assert client.deferred.rows == 0
