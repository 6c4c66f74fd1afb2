"""Storage space follows the pending records: a batch half of whose records are gone is rewritten
with its live rows only (MemoryStorage at once, SQLiteStorage at its sweep or ``compact()``), so
a pending record never pins its whole persisted batch; and the records that moved are the same
records (payload, id, attempt, origin, key hash, partition)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xorack.storage import MemoryStorage, RecordMeta, SQLiteStorage

U64 = np.uint64


@pytest.fixture(params=["memory", "sqlite"])
def storage(request, tmp_path):
    s = MemoryStorage() if request.param == "memory" else SQLiteStorage(tmp_path / "ft.db")
    yield s
    s.close()


def _batch(start: int, n: int) -> pa.RecordBatch:
    # Arrow-owned buffers (not numpy views): the memory pool sees every byte
    return pa.record_batch(
        {
            "n": pa.array(list(range(start, start + n)), pa.int64()),
            "word": pa.array([f"word-{i:012d}" for i in range(start, start + n)]),
        }
    )


def _persist(storage, batches: int, rows: int) -> np.ndarray:
    src = np.arange(1, batches * rows + 1, dtype=U64)
    for b in range(batches):
        ids = src[b * rows : (b + 1) * rows]
        part = np.full(rows, b % 3, np.int32)
        meta = RecordMeta.new(ids, key_hash=(ids % 97).astype(np.int32), partition=part)
        storage.persist(_batch(b * rows, rows), meta)
    return src


def _arrow_payload_bytes(storage) -> int:
    if isinstance(storage, MemoryStorage):
        return sum(c.batch.nbytes for c in storage._chunks.values())
    (total,) = storage._db.execute(
        "SELECT coalesce(sum(length(payload)), 0) FROM batches"
    ).fetchone()
    return total


def _compacted(storage) -> int:
    """How many stored batches hold only some of their first rows."""
    if isinstance(storage, MemoryStorage):
        return sum(c.kept is not None for c in storage._chunks.values())
    nos = [no for (no,) in storage._db.execute("SELECT id FROM batches")]
    return sum(b.kept is not None for b in storage._batches(nos).values())


def _sweep(storage) -> None:
    if isinstance(storage, SQLiteStorage):
        storage.compact()


def test_a_pending_record_does_not_pin_its_whole_batch(storage):
    batches, rows = 20, 5000
    src = _persist(storage, batches, rows)
    full = _arrow_payload_bytes(storage)
    rng = np.random.default_rng(3)
    order = rng.permutation(len(src))
    kept = np.sort(src[order[: len(src) // 100]])  # 1 % pending, spread over every batch
    gone = src[order[len(src) // 100 :]]
    for at in range(0, len(gone), 7000):
        storage.delete(gone[at : at + 7000])
    _sweep(storage)
    payload, _ = storage.fetch(kept)
    pending_bytes = payload.select(["n", "word"]).combine_chunks().nbytes
    retained = _arrow_payload_bytes(storage)
    # before: every batch kept whole (~100x the pending rows); now 4 times at most, plus
    # a little per batch (IPC headers in SQLite)
    assert retained <= 4 * pending_bytes + batches * 1024, (retained, pending_bytes, full)
    assert retained < full / 20


def test_memory_storage_frees_the_arrow_memory_of_completed_rows():
    before = pa.total_allocated_bytes()
    s = MemoryStorage()
    src = _persist(s, 10, 4000)
    after_persist = pa.total_allocated_bytes() - before
    kept = src[::100]
    s.delete(np.setdiff1d(src, kept))
    retained = pa.total_allocated_bytes() - before
    assert retained < after_persist / 20, (retained, after_persist)
    assert len(s) == len(kept)


def test_moved_records_keep_their_payload_and_metadata(storage):
    src = _persist(storage, 6, 200)
    rng = np.random.default_rng(5)
    # renew some (a replay: new id, attempt + 1) before and after compaction
    renewed_old = src[rng.choice(len(src), 60, replace=False)]
    renewed_new = renewed_old + U64(1_000_000)
    storage.renew(renewed_old, renewed_new)
    current = {int(s): int(s) for s in src}  # current id -> original id
    for old, new in zip(renewed_old.tolist(), renewed_new.tolist(), strict=True):
        current[new] = current.pop(old)
    renewed = set(renewed_old.tolist())
    attempts = {orig: 2 if orig in renewed else 1 for orig in current.values()}  # 1 at persist
    for _ in range(6):
        ids = np.array(sorted(current), dtype=U64)
        drop = ids[rng.random(len(ids)) < 0.4]
        assert storage.delete(drop) == len(drop)
        for d in drop.tolist():
            del current[d]
        _sweep(storage)
        ids = np.array(sorted(current), dtype=U64)
        again = ids[rng.random(len(ids)) < 0.1]
        storage.renew(again, again + U64(10_000_000))
        for old in again.tolist():
            orig = current.pop(old)
            current[old + 10_000_000] = orig
            attempts[orig] += 1
        _check(storage, current, attempts)
    assert _compacted(storage) > 0  # the checks above did look through compacted batches
    # a dead letter after compaction carries the right payload
    victim = next(iter(current))
    storage.dead_letter(np.array([victim], dtype=U64), "poison")
    letters = storage.dead_letters()
    assert letters.column("n").to_pylist() == [current[victim] - 1]
    assert letters.column("_ft_origin").to_pylist() == [current[victim]]
    del current[victim]
    _check(storage, current, attempts)
    storage.delete(np.array(sorted(current), dtype=U64))
    assert len(storage) == 0


def _check(storage, current: dict[int, int], attempts: dict[int, int]) -> None:
    ids = np.array(sorted(current), dtype=U64)
    assert sorted(storage.stored_ids().tolist()) == ids.tolist()
    assert len(storage) == len(ids)
    payload, meta = storage.fetch(ids)
    assert meta.src.tolist() == ids.tolist()
    origins = [current[i] for i in ids.tolist()]
    assert meta.origin.tolist() == origins
    # record with original id k is row k - 1 of the input: n == k - 1
    assert payload.column("n").to_pylist() == [o - 1 for o in origins]
    assert payload.column("word").to_pylist() == [f"word-{o - 1:012d}" for o in origins]
    assert meta.key_hash.tolist() == [o % 97 for o in origins]
    assert meta.partition.tolist() == [((o - 1) // 200) % 3 for o in origins]
    assert meta.attempt.tolist() == [attempts[o] for o in origins]
    assert storage.lookup(ids).origin.tolist() == origins


def test_sqlite_compaction_survives_reopening(tmp_path):
    path = tmp_path / "ft.db"
    s = SQLiteStorage(path)
    src = _persist(s, 4, 1000)
    kept = src[::50]
    s.delete(np.setdiff1d(src, kept))
    s.close()
    s = SQLiteStorage(path)  # batch sizes unknown to this process: read back from the file
    try:
        s.compact()
        assert _arrow_payload_bytes(s) < 4 * 1000 * 30 / 10
        payload, meta = s.fetch(kept)
        assert payload.column("n").to_pylist() == (kept - U64(1)).tolist()
        assert meta.origin.tolist() == kept.tolist()
    finally:
        s.close()


def test_a_compacted_sqlite_file_reopens_without_quarantine(tmp_path):
    """The open-time corruption check knows compacted batches (a 5th metadata column, records
    pointing at their first row numbers): it keeps them and every record they hold."""
    path = tmp_path / "ft.db"
    s = SQLiteStorage(path)
    src = _persist(s, 4, 1000)
    kept = src[1::50]  # first rows 1, 51, ...: not where a compacted batch holds them
    s.delete(np.setdiff1d(src, kept))
    s.compact()
    assert _compacted(s) == 4
    s.close()
    s = SQLiteStorage(path)
    try:
        assert s.quarantine_notes == []
        assert len(s) == len(kept)
        assert _compacted(s) == 4
        payload, meta = s.fetch(kept)
        assert payload.column("n").to_pylist() == (kept - U64(1)).tolist()
        assert meta.origin.tolist() == kept.tolist()
    finally:
        s.close()


ROWS = 40  # per persisted batch: compaction starts once 30 of them are gone


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["persist", "delete", "renew", "dead_letter", "sweep"]),
            st.integers(0, 2**32 - 1),
        ),
        min_size=1,
        max_size=30,
    )
)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_compacting_storages_agree_with_a_model(kind, ops, tmp_path_factory):
    """Random persists, deletes, renewals, dead letters and sweeps: after each, the storage
    holds exactly the model's records, each with its own payload and metadata."""
    if kind == "memory":
        storage = MemoryStorage()
    else:
        storage = SQLiteStorage(tmp_path_factory.mktemp("model") / "ft.db")
    current: dict[int, int] = {}  # current id -> original id
    attempts: dict[int, int] = {}  # original id -> attempt
    dead: list[int] = []
    next_id, renewed_id = 1, 1 << 40
    try:
        for op, seed in ops:
            rng = np.random.default_rng(seed)
            ids = np.array(sorted(current), dtype=U64)
            if op == "persist":
                new = np.arange(next_id, next_id + ROWS, dtype=U64)
                part = np.full(ROWS, _model_partition(next_id), np.int32)
                meta = RecordMeta.new(new, key_hash=(new % 97).astype(np.int32), partition=part)
                storage.persist(_batch(next_id - 1, ROWS), meta)
                current.update((i, i) for i in new.tolist())
                attempts.update((i, 1) for i in new.tolist())
                next_id += ROWS
            elif op == "delete":
                drop = ids[rng.random(len(ids)) < rng.random()]
                assert storage.delete(drop) == len(drop)
                for i in drop.tolist():
                    del current[i]
                if seed % 2:
                    _sweep(storage)  # SQLite compacts at its sweep: often, to exercise it
            elif op == "renew":
                old = ids[rng.random(len(ids)) < 0.3]
                new = np.arange(renewed_id, renewed_id + len(old), dtype=U64)
                storage.renew(old, new)
                for o, n in zip(old.tolist(), new.tolist(), strict=True):
                    current[n] = current.pop(o)
                    attempts[current[n]] += 1
                renewed_id += len(old)
            elif op == "dead_letter" and len(ids):
                victims = rng.choice(ids, min(len(ids), 3), replace=False)
                storage.dead_letter(victims, "poison")
                dead.extend(current.pop(v) for v in victims.tolist())
            elif op == "sweep":
                _sweep(storage)
            _check_model(storage, current, attempts)
        letters = storage.dead_letters()
        origins = letters.column("_ft_origin").to_pylist() if letters.num_rows else []
        assert sorted(origins) == sorted(dead)
        if letters.num_rows:
            assert sorted(letters.column("n").to_pylist()) == sorted(o - 1 for o in dead)
    finally:
        storage.close()


def _model_partition(origin: int) -> int:
    return ((origin - 1) // ROWS) % 3


def _check_model(storage, current: dict[int, int], attempts: dict[int, int]) -> None:
    ids = np.array(sorted(current), dtype=U64)
    assert sorted(storage.stored_ids().tolist()) == ids.tolist()
    if not len(ids):
        return
    payload, meta = storage.fetch(ids)
    origins = [current[i] for i in ids.tolist()]
    assert meta.src.tolist() == ids.tolist()
    assert meta.origin.tolist() == origins
    assert payload.column("n").to_pylist() == [o - 1 for o in origins]
    assert payload.column("word").to_pylist() == [f"word-{o - 1:012d}" for o in origins]
    assert meta.key_hash.tolist() == [o % 97 for o in origins]
    assert meta.partition.tolist() == [_model_partition(o) for o in origins]
    assert meta.attempt.tolist() == [attempts[o] for o in origins]


def test_a_file_of_batches_without_first_ids_is_read_and_compacted(tmp_path):
    path = tmp_path / "ft.db"
    s = SQLiteStorage(path)
    src = _persist(s, 2, 100)
    s.close()
    with closing(sqlite3.connect(path)) as db:  # as ft-2 wrote it: no origin_rec column
        for no, blob in db.execute("SELECT id, meta FROM batches").fetchall():
            meta = pa.ipc.open_stream(blob).read_all().drop_columns(["origin_rec"])
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, meta.schema) as w:
                w.write_table(meta)
            db.execute(
                "UPDATE batches SET meta = ? WHERE id = ?", (sink.getvalue().to_pybytes(), no)
            )
        db.execute("UPDATE xorack_meta SET value = 'xorack-ft-2' WHERE key = 'format'")
        db.commit()
    s = SQLiteStorage(path)
    try:
        assert s.quarantined == 0
        _, meta = s.fetch(src[:10])
        assert meta.origin_rec.tolist() == [0] * 10  # unknown
        s.delete(src[10:])
        s.compact()  # rewritten in the current layout
        payload, meta = s.fetch(src[:10])
        assert payload.column("n").to_pylist() == list(range(10))
        assert meta.origin_rec.tolist() == [0] * 10
        assert _compacted(s) == 1
    finally:
        s.close()
    s = SQLiteStorage(path)
    try:
        assert s.quarantined == 0
        assert len(s.fetch(src[:10])[1]) == 10
    finally:
        s.close()


def test_an_older_sqlite_file_is_read_and_marked_for_compacted_batches(tmp_path):
    path = tmp_path / "ft.db"
    s = SQLiteStorage(path)
    src = _persist(s, 2, 100)
    s.close()
    with closing(sqlite3.connect(path)) as db:  # as the code before compaction wrote it
        db.execute("UPDATE xorack_meta SET value = 'xorack-ft-1' WHERE key = 'format'")
        db.commit()
    s = SQLiteStorage(path)
    try:
        s.delete(src[10:])
        s.compact()
        payload, _ = s.fetch(src[:10])
        assert payload.column("n").to_pylist() == list(range(10))
        assert _compacted(s) == 1
    finally:
        s.close()
    with closing(sqlite3.connect(path)) as db:  # code that knows only ft-1 now refuses the file
        (fmt,) = db.execute("SELECT value FROM xorack_meta WHERE key = 'format'").fetchone()
    assert fmt == "xorack-ft-4"
