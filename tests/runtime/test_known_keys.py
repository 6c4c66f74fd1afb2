"""Record identity that survives re-execution: the FT layer knows every source id a job
persisted idempotently (per epoch), so a row persisted again after its record left the pending
set — completed, dead-lettered, replayed under a new id — is recognized and counts nowhere; a
durable storage keeps the ids across restarts, and a restart keeps such a record's id until it
times out (a retried persist and the recovered copy are one record)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xorack import FTLayer, ManualClock
from xorack.known_keys import KnownKeys

IDS = np.array([11, 12, 13, 14], np.uint64)
BIRTHS = np.array([101, 102, 103, 104], np.uint64)


def _batch() -> pa.RecordBatch:
    return pa.record_batch({"x": [1, 2, 3, 4]})


def _persist(ft: FTLayer, **kw) -> np.ndarray:
    return ft.persist(_batch(), births=BIRTHS, src_ids=IDS, idempotent=True, **kw)


def test_a_record_persisted_again_after_it_settled_counts_nowhere():
    ft = FTLayer(max_attempts=2)
    _persist(ft)
    ft.xor(IDS[:1], BIRTHS[:1])  # 11 completes
    ft.fail(IDS[1:2])  # 12 is replayed under a new id
    ft.fail(IDS[2:3])
    ft.fail(ft.take_replays()[0].column("_ft_src").to_numpy()[1:])  # 13: dead-lettered
    assert ft.stats().dead_lettered == 1
    pending = ft.pending

    again = _persist(ft)  # Spark ran the source task again
    assert again.tolist() == [0, 0, 0, 14]  # only 14 is still pending under its id
    stats = ft.stats()
    assert (stats.persisted, stats.repeats, stats.repeats_settled) == (4, 4, 3)
    assert ft.pending == pending
    assert stats.known_keys == 4


def test_known_ids_survive_a_restart_on_a_durable_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'ft.db'}"
    with FTLayer(url) as ft:
        _persist(ft)
        ft.xor(IDS, BIRTHS)
        assert ft.pending == 0
    with FTLayer(url) as ft:
        assert ft.stats().known_keys == 4
        assert _persist(ft).tolist() == [0, 0, 0, 0]
        assert (ft.pending, ft.stats().persisted) == (0, 0)


def test_forgotten_epochs_are_not_recognized_any_more(tmp_path):
    url = f"sqlite:///{tmp_path / 'ft.db'}"
    with FTLayer(url) as ft:
        _persist(ft, epoch=3)
        ft.persist(_batch(), births=BIRTHS, src_ids=IDS + 100, idempotent=True, epoch=4)
        ft.xor(np.concatenate([IDS, IDS + 100]), np.concatenate([BIRTHS, BIRTHS]))
        assert _persist(ft, epoch=3).tolist() == [0, 0, 0, 0]  # recognized
        assert ft.forget_known(3) == 4
        assert ft.stats().known_keys == 4
    with FTLayer(url) as ft:  # the forgetting is durable too
        assert ft.stats().known_keys == 4
        assert _persist(ft, epoch=3).tolist() == IDS.tolist()  # forgotten: a new record
        with pytest.raises(ValueError, match="epoch must be an int >= 0"):
            _persist(ft, epoch=-1)


def test_a_restart_keeps_an_idempotent_records_id_so_a_retried_persist_is_the_same_record(
    tmp_path,
):
    """The acker stored a persist and died before answering: the task retries the persist
    against the restarted acker, and its rows complete the one record — nothing is replayed,
    nothing counted twice."""
    url = f"sqlite:///{tmp_path / 'ft.db'}"
    ft = FTLayer(url)
    _persist(ft)
    ft.storage.close()  # killed: no close() of the layer
    with FTLayer(url) as ft:
        stats = ft.stats()
        assert (stats.recovered, stats.kept_at_restart, stats.replays_waiting) == (4, 4, 0)
        again = _persist(ft)  # the retried persist
        assert again.tolist() == IDS.tolist()
        assert ft.xor(again, BIRTHS).tolist() == IDS.tolist()  # the retried task's rows
        stats = ft.stats()
        assert (stats.completed, stats.pending, stats.replayed) == (4, 0, 0)
        assert ft.take_replays() == {}


def test_a_kept_record_that_never_completes_is_replayed_without_using_an_attempt(tmp_path):
    url = f"sqlite:///{tmp_path / 'ft.db'}"
    ft = FTLayer(url, max_attempts=1)
    _persist(ft)
    ft.storage.close()
    with FTLayer(url, max_attempts=1, num_buckets=1, clock=ManualClock()) as ft:
        ft.rotate()
        replays = ft.take_replays()[0]
        assert sorted(replays.column("_ft_origin").to_pylist()) == IDS.tolist()
        assert replays.column("_ft_attempt").to_pylist() == [1, 1, 1, 1]  # no attempt used
        assert ft.stats().dead_lettered == 0
        assert _persist(ft).tolist() == [0, 0, 0, 0]  # replayed under new ids: settled


def test_a_persist_without_idempotent_is_not_kept_at_a_restart(tmp_path):
    url = f"sqlite:///{tmp_path / 'ft.db'}"
    ft = FTLayer(url)
    ft.persist(_batch(), births=BIRTHS, src_ids=IDS)
    ft.storage.close()
    with FTLayer(url) as ft:
        assert (ft.stats().kept_at_restart, ft.stats().replays_waiting) == (0, 4)


def test_known_keys_take_8_bytes_per_id():
    keys = KnownKeys()
    rng = np.random.default_rng(1)
    for epoch in range(3):
        for _ in range(50):
            keys.add(epoch, rng.integers(1, 2**63, 1000, dtype=np.uint64))
    assert len(keys) == 150_000
    assert keys.nbytes == 8 * len(keys)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(1, 60), max_size=12)), max_size=12),
    st.integers(-1, 3),
    st.lists(st.integers(1, 60), max_size=20),
)
def test_known_keys_equal_a_set_per_epoch(adds, forget, probe):
    keys, model = KnownKeys(), {}
    for epoch, ids in adds:
        keys.add(epoch, np.array(ids, np.uint64))
        model.setdefault(epoch, set()).update(ids)
    dropped = keys.forget(forget)
    assert dropped == sum(len(v) for e, v in model.items() if e <= forget)
    model = {e: v for e, v in model.items() if e > forget}
    known = set().union(*model.values()) if model else set()
    assert keys.contains(np.array(probe, np.uint64)).tolist() == [p in known for p in probe]
    assert len(keys) == sum(len(v) for v in model.values())
    for e, v in model.items():
        assert keys.keys(e).tolist() == sorted(v)


# ---- a record that kills the acker on every try ----------------------------------------------

_POISONED_ACKER = """
import json, os, sys
import numpy as np, pyarrow as pa
from xorack import FTLayer

ft = FTLayer("sqlite:///" + sys.argv[1], default_partitions=1, max_restarts=2)
if ft.stats().recovered == 0 and not ft.dead_letters().num_rows:  # the first run: the input
    ft.persist(pa.record_batch({"x": np.arange(20)}), births=np.arange(1, 21, dtype=np.uint64))
    ft.expire_all()  # every record to the replay queue: processed below
for table in ft.take_replays().values():  # the acker's own processing of its records
    x = table.column("x").to_numpy()
    src, rec = table.column("_ft_src").to_numpy(), table.column("_ft_rec").to_numpy()
    ft.xor(src[x != 7], rec[x != 7])
    if (x == 7).any():
        os._exit(9)  # record 7 kills the process, on every try
dead = ft.dead_letters().to_pydict()
print(json.dumps([ft.stats().completed, ft.pending, dead["x"], dead["_ft_reason"]]), flush=True)
ft.close()
"""


def test_a_record_that_kills_the_acker_on_every_try_is_dead_lettered_after_max_restarts(
    tmp_path,
):
    path = str(tmp_path / "ft.db")
    runs = []
    for _ in range(6):  # without per-record crash accounting it would crash forever
        done = subprocess.run(
            [sys.executable, "-c", _POISONED_ACKER, path], capture_output=True, text=True
        )
        runs.append(done.returncode)
        if done.returncode == 0:
            break
    assert runs == [9, 9, 0]  # max_restarts=2: the 2nd restart takes it for the cause
    completed, pending, dead, reasons = json.loads(done.stdout)
    assert (completed, pending, dead) == (0, 0, [7])  # the others completed in the 1st run
    assert reasons == [
        "crashed the acker: it stopped 2 times while the record was in process (max_restarts)"
    ]
