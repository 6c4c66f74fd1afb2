"""Storage: both implementations pass one suite (persist, delete, renew, fetch, recovery
listing, dead letters), plus SQLite's own behaviour (durability, blob lifetime, errors)."""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xorack import StorageError
from xorack.storage import (
    MemoryStorage,
    RecordMeta,
    SQLiteStorage,
    Storage,
    open_storage,
    storage_path,
)


def u64(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.uint64)


@pytest.fixture(params=["memory", "sqlite"])
def storage(request, tmp_path) -> Storage:
    s = MemoryStorage() if request.param == "memory" else SQLiteStorage(tmp_path / "ft.db")
    yield s
    s.close()


def meta_for(ids: np.ndarray, source: int = 0) -> RecordMeta:
    n = len(ids)
    return RecordMeta.new(
        ids,
        key_hash=np.arange(n, dtype=np.int32) * 7 - 3,
        source=source,
        partition=np.arange(n, dtype=np.int32) % 2,
    )


def test_persist_fetch_in_requested_order(storage):
    storage.persist(pa.record_batch({"x": [10, 20, 30]}), meta_for(u64(1, 2, 3)))
    storage.persist(pa.record_batch({"x": [40]}), meta_for(u64(4)))
    payload, meta = storage.fetch(u64(4, 2, 99, 1))  # 99 unknown: skipped
    assert payload.column("x").to_pylist() == [40, 20, 10]
    assert meta.src.tolist() == [4, 2, 1]
    assert meta.key_hash.tolist() == [-3, 4, -3]
    assert meta.partition.tolist() == [0, 1, 0]
    assert meta.attempt.tolist() == [1, 1, 1]
    assert meta.origin.tolist() == [4, 2, 1]
    assert len(storage) == 4


def test_large_ids_round_trip(storage):
    big = u64(2**64 - 1, 2**63, 2**63 - 1)
    storage.persist(pa.record_batch({"x": [1, 2, 3]}), meta_for(big))
    assert storage.lookup(big).src.tolist() == big.tolist()
    assert storage.delete(big) == 3


def test_delete_counts_only_stored(storage):
    storage.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(5, 6)))
    assert storage.delete(u64(6, 7)) == 1
    assert storage.delete(u64(6)) == 0
    assert len(storage) == 1
    assert storage.lookup(u64(5, 6)).src.tolist() == [5]


def test_renew_keeps_payload_and_counts_attempts(storage):
    storage.persist(pa.record_batch({"x": ["a", "b"]}), meta_for(u64(1, 2), source=3))
    storage.renew(u64(2), u64(20))
    storage.renew(u64(20), u64(200))
    payload, meta = storage.fetch(u64(200, 2, 20))
    assert payload.column("x").to_pylist() == ["b"]
    assert (meta.src.tolist(), meta.attempt.tolist()) == ([200], [3])
    assert (meta.origin.tolist(), meta.source.tolist()) == ([2], [3])
    assert len(storage) == 2


def test_renew_of_unknown_id_changes_nothing(storage):
    storage.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(1, 2)))
    with pytest.raises(ValueError, match="not stored"):
        storage.renew(u64(1, 3), u64(10, 30))
    assert sorted(storage.lookup(u64(1, 2, 10)).src.tolist()) == [1, 2]
    assert storage.lookup(u64(1)).attempt.tolist() == [1]


def test_iter_pending_lists_every_record(storage):
    for k in range(5):
        ids = np.arange(1, 101, dtype=np.uint64) + np.uint64(1000 * k)
        storage.persist(pa.record_batch({"x": np.arange(100)}), meta_for(ids))
    storage.delete(np.arange(1, 51, dtype=np.uint64))
    seen = np.concatenate([m.src for m in storage.iter_pending(chunk_size=64)])
    assert len(seen) == 450 == len(set(seen.tolist())) == len(storage)


def test_dead_letter_moves_records(storage):
    storage.persist(pa.record_batch({"x": [1, 2, 3]}), meta_for(u64(1, 2, 3), source=4))
    storage.renew(u64(2), u64(22))
    storage.dead_letter(u64(22, 3), "boom")
    dl = storage.dead_letters()
    assert sorted(dl.column("x").to_pylist()) == [2, 3]
    assert sorted(dl.column("_ft_origin").to_pylist()) == [2, 3]
    assert sorted(dl.column("_ft_attempts").to_pylist()) == [1, 2]
    assert set(dl.column("_ft_source").to_pylist()) == {4}
    assert set(dl.column("_ft_reason").to_pylist()) == {"boom"}
    assert len(storage) == 1
    assert storage.lookup(u64(22, 3)).src.size == 0


def test_dead_letters_of_different_schemas_are_combined(storage):
    storage.persist(pa.record_batch({"x": [1]}), meta_for(u64(1)))
    storage.persist(pa.record_batch({"y": ["s"]}), meta_for(u64(2), source=1))
    storage.dead_letter(u64(1), "a")
    storage.dead_letter(u64(2), "b")
    dl = storage.dead_letters()
    assert dl.num_rows == 2
    assert {"x", "y", "_ft_reason"} <= set(dl.column_names)


def test_empty_dead_letters_have_the_columns(storage):
    assert storage.dead_letters().column_names == [
        "_ft_origin",
        "_ft_source",
        "_ft_attempts",
        "_ft_reason",
    ]


def test_row_count_mismatch_is_rejected(storage):
    with pytest.raises(ValueError, match="rows"):
        storage.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(1)))
    assert len(storage) == 0


# ---------------------------------------------------------------- SQLite specifics


def test_sqlite_survives_reopen(tmp_path):
    path = tmp_path / "ft.db"
    with SQLiteStorage(path) as s:
        s.persist(pa.record_batch({"x": [1, 2, 3]}), meta_for(u64(1, 2, 3)))
        s.delete(u64(2))
        s.renew(u64(3), u64(33))
    with SQLiteStorage(path) as s:
        payload, meta = s.fetch(u64(1, 33))
        assert payload.column("x").to_pylist() == [1, 3]
        assert meta.attempt.tolist() == [1, 2]
        assert len(s) == 2


def test_sqlite_drops_a_blob_when_no_record_refers_to_it(tmp_path):
    import sqlite3

    path = tmp_path / "ft.db"

    def batches() -> int:
        db = sqlite3.connect(path)
        try:
            return db.execute("SELECT count(*) FROM batches").fetchone()[0]
        finally:
            db.close()

    with SQLiteStorage(path) as s:
        s.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(1, 2)))
        s.persist(pa.record_batch({"x": [3]}), meta_for(u64(3)))
        s.delete(u64(1))
        s.dead_letter(u64(3), "r")
        s.compact()
        assert batches() == 1
        s.delete(u64(2))
        s.compact()
        assert batches() == 0
        assert s.dead_letters().column("x").to_pylist() == [3]


def test_sqlite_compacts_on_its_own_after_many_deletes(tmp_path):
    path = tmp_path / "ft.db"
    with SQLiteStorage(path) as s:
        for k in range(3):
            ids = np.arange(1, 40_001, dtype=np.uint64) + np.uint64(100_000 * k)
            s.persist(pa.record_batch({"x": np.arange(40_000)}), meta_for(ids))
            s.delete(ids)
        import sqlite3

        db = sqlite3.connect(path)
        assert db.execute("SELECT count(*) FROM batches").fetchone()[0] < 3
        db.close()


def test_sqlite_quota_full_raises_storage_error_and_keeps_earlier_records(tmp_path):
    path = tmp_path / "ft.db"
    s = SQLiteStorage(path, max_bytes=256 * 1024)
    s.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(1, 2)))
    big = pa.record_batch({"x": pa.array([b"z" * 1024] * 1024)})  # 1 MB > quota
    with pytest.raises(StorageError, match="full"):
        s.persist(big, meta_for(np.arange(10, 10 + 1024, dtype=np.uint64)))
    assert len(s) == 2
    s.persist(pa.record_batch({"x": [3]}), meta_for(u64(3)))  # still usable
    s.close()
    with SQLiteStorage(path) as again:
        assert sorted(again.lookup(u64(1, 2, 3, 10)).src.tolist()) == [1, 2, 3]


def test_sqlite_corrupt_file_raises_storage_error(tmp_path):
    path = tmp_path / "ft.db"
    path.write_bytes(b"this is not a database file" * 200)
    with pytest.raises(StorageError, match="cannot open SQLite storage"):
        SQLiteStorage(path)


def test_sqlite_closed_storage_raises(tmp_path):
    s = SQLiteStorage(tmp_path / "ft.db")
    s.close()
    with pytest.raises(StorageError, match="closed"):
        s.delete(u64(1))


def test_sqlite_bad_synchronous():
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStorage(":memory:", synchronous="sometimes")


# ---------------------------------------------------------------- open_storage


def test_open_storage_specs(tmp_path):
    assert isinstance(open_storage("memory"), MemoryStorage)
    s = open_storage(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(s, SQLiteStorage)
    assert s.path == f"{tmp_path}/a.db"
    s.close()
    m = MemoryStorage()
    assert open_storage(m) is m


@pytest.mark.parametrize("spec", ["redis://x", "sqlite://", "sqlite:///", "Memory", ""])
def test_open_storage_rejects_unknown_specs(spec):
    with pytest.raises(ValueError, match="storage spec"):
        open_storage(spec)


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ("sqlite:///ft.db", "ft.db"),  # SQLAlchemy: three slashes, a relative path
        ("sqlite:///data/ft.db", "data/ft.db"),
        ("sqlite:////var/lib/ft.db", "/var/lib/ft.db"),  # four slashes, an absolute path
        ("/var/lib/ft.db", "/var/lib/ft.db"),  # plain paths
        ("./acker", "./acker"),
        ("ft.sqlite3", "ft.sqlite3"),
        ("memory", None),
    ],
)
def test_storage_path_follows_sqlalchemy_and_accepts_plain_paths(spec, path):
    assert storage_path(spec) == path


@pytest.mark.parametrize("spec", ["sqlite:///data/", "memroy", "/tmp/dir/", "file:ft.db"])
def test_storage_path_rejects_what_is_not_a_file(spec):
    with pytest.raises(ValueError, match=re.escape("sqlite:////absolute/ft.db")):
        storage_path(spec)


def test_open_storage_plain_and_url_paths_reach_the_same_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    for spec in (
        "sqlite:///d/ft.db",
        f"sqlite:///{tmp_path}/d/ft.db",
        "d/ft.db",
        tmp_path / "d/ft.db",
    ):
        with open_storage(spec) as s:
            assert os.path.samefile(s.path, tmp_path / "d" / "ft.db")


def test_relative_url_meant_as_absolute_gets_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./tmp here, but /tmp exists
    with pytest.raises(StorageError, match=r"write 'sqlite:////tmp/x/ft.db' \(four slashes\)"):
        open_storage("sqlite:///tmp/x/ft.db")


@pytest.mark.parametrize("what", ["a directory", "not a database"])
def test_a_failed_open_leaves_no_lock_file(tmp_path, what):
    path = tmp_path / "ft.db"
    if what == "a directory":
        path.mkdir()
    else:
        path.write_bytes(b"this is not SQLite " * 100)
    with pytest.raises(StorageError, match="cannot open SQLite storage"):
        open_storage(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft.db"]


def test_a_failed_open_keeps_a_lock_file_it_did_not_create(tmp_path):
    path = tmp_path / "ft.db"
    path.write_bytes(b"this is not SQLite " * 100)
    (tmp_path / "ft.db.lock").touch()
    with pytest.raises(StorageError):
        open_storage(str(path))
    assert (tmp_path / "ft.db.lock").exists()


def test_open_storage_rejects_non_strings():
    with pytest.raises(TypeError, match="storage must be"):
        open_storage(42)  # type: ignore[arg-type]


def test_sqlite_locked_file_raises_storage_error(tmp_path):
    import sqlite3

    path = tmp_path / "ft.db"
    s = SQLiteStorage(path, busy_timeout=0.01)
    s.persist(pa.record_batch({"x": [1]}), meta_for(u64(1)))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the file
    try:
        with pytest.raises(StorageError, match="locked"):
            s.persist(pa.record_batch({"x": [2]}), meta_for(u64(2)))
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert len(s) == 1
    s.persist(pa.record_batch({"x": [2]}), meta_for(u64(2)))  # works again once released
    assert sorted(s.lookup(u64(1, 2)).src.tolist()) == [1, 2]
    s.close()


@pytest.mark.parametrize("link", ["file", "directory", "hard link"])
def test_sqlite_single_owner_lock_holds_through_a_symlink(tmp_path, link):
    """Issue 11, defect 6: a second FT layer opened the same database through a symlink and
    both recovered the same records. The lock is on the database's real path."""
    (tmp_path / "real").mkdir()
    path = tmp_path / "real" / "ft.db"
    if link == "file":
        other = tmp_path / "alias.db"
        other.symlink_to(path)
    elif link == "hard link":
        path.touch()
        (tmp_path / "elsewhere").mkdir()
        other = tmp_path / "elsewhere" / "same.db"
        other.hardlink_to(path)
    else:
        (tmp_path / "alias").symlink_to(tmp_path / "real")
        other = tmp_path / "alias" / "ft.db"
    with SQLiteStorage(path) as s:
        s.persist(pa.record_batch({"x": [1]}), meta_for(u64(1)))
        with pytest.raises(StorageError, match="in use by another FT layer"):
            SQLiteStorage(other, busy_timeout=0.05)
    with SQLiteStorage(other) as s:  # free again once the first one closed
        assert len(s) == 1


# ---- issue 11, defect 7: a corrupt database ----------------------------------------------------


def _store_two_batches(path) -> None:
    """400 healthy records in batch 1, 5 in batch 2."""
    with SQLiteStorage(path) as s:
        s.persist(
            pa.record_batch({"x": np.arange(400)}), meta_for(np.arange(1, 401, dtype=np.uint64))
        )
        s.persist(
            pa.record_batch({"x": np.arange(5)}), meta_for(np.arange(1001, 1006, dtype=np.uint64))
        )


def _corrupt(path, sql: str, *params) -> None:
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    db.execute(sql, params)
    db.close()


@pytest.mark.parametrize(
    ("sql", "params", "note"),
    [
        ("UPDATE batches SET payload = ? WHERE id = 2", (b"\xff" * 64,), "batch 2 (5 records)"),
        ("UPDATE batches SET meta = substr(meta, 1, 40) WHERE id = 2", (), "batch 2 (5 records)"),
        ("UPDATE batches SET meta = ? WHERE id = 2", (b"",), "batch 2 (5 records)"),
        ("UPDATE batches SET payload = 12345 WHERE id = 2", (), "batch 2 (5 records)"),
        ("UPDATE records SET loc = 'garbage' WHERE src > 1000", (), "5 records: record row"),
        ("UPDATE records SET loc = loc + 999 WHERE src > 1000", (), "past the end"),
        ("UPDATE records SET loc = 77 << 32 WHERE src > 1000", (), "missing batch"),
    ],
)
def test_sqlite_corrupt_records_are_quarantined_and_the_healthy_ones_recovered(
    tmp_path, sql, params, note
):
    """One corrupt blob made the whole store unopenable (IndexError, TypeError, ArrowInvalid),
    hiding 400 healthy records."""
    from xorack import FTLayer

    path = tmp_path / "ft.db"
    _store_two_batches(path)
    _corrupt(path, sql, *params)
    with SQLiteStorage(path) as s:
        assert len(s) == 400
        assert s.quarantined == 5
        assert any(note in n for n in s.quarantine_notes), s.quarantine_notes
        assert sorted(s.stored_ids().tolist()) == list(range(1, 401))
    with FTLayer(f"sqlite:///{path}", default_partitions=1) as ft:  # reopened: healthy now
        stats = ft.stats()
        assert (stats.recovered, stats.quarantined) == (400, 0)
        (rep,) = ft.take_replays().values()
        assert sorted(rep.column("x").to_pylist()) == list(range(400))
    import sqlite3

    db = sqlite3.connect(path)
    (kept,) = db.execute("SELECT count(*) FROM quarantine").fetchone()
    db.close()
    assert kept == 1  # set aside for a human, not deleted


@pytest.mark.parametrize(
    "damage",
    ["not a database", "truncated", "foreign tables", "directory"],
)
def test_sqlite_unopenable_file_is_a_storage_error_naming_the_file(tmp_path, damage):
    import sqlite3

    path = tmp_path / "ft.db"
    if damage == "not a database":
        path.write_bytes(b"this is not a database file" * 200)
    elif damage == "truncated":
        _store_two_batches(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "foreign tables":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE records (a, b)")
        db.close()
    else:
        path.mkdir()

    def open_and_read() -> None:
        with SQLiteStorage(path) as s:
            s.lookup(u64(1))  # a truncated file may open: its first read reports it

    with pytest.raises(StorageError, match=str(path.name)):
        open_and_read()


def test_sqlite_corrupt_dead_letters_are_quarantined_the_others_read(tmp_path):
    path = tmp_path / "ft.db"
    with SQLiteStorage(path) as s:
        s.persist(pa.record_batch({"x": [1, 2]}), meta_for(u64(1, 2)))
        s.dead_letter(u64(1), "first")
        s.dead_letter(u64(2), "second")
    _corrupt(path, "UPDATE dead_letters SET payload = ? WHERE id = 1", b"\x00" * 10)
    with SQLiteStorage(path) as s:
        assert s.dead_letters().column("_ft_reason").to_pylist() == ["second"]
        assert any("dead letters 1" in n for n in s.quarantine_notes)


def test_memory_storage_keeps_few_bytes_per_record():
    """Issue 11, defect 2: memory storage kept ~134 bytes of bookkeeping per record (a dict of
    Python ints); the index is 16 bytes a record now, the metadata ~16 (a memory measure,
    deterministic: not a timing)."""
    import gc
    import tracemalloc

    n, size = 200_000, 20_000
    data = [pa.record_batch({"v": np.arange(i, i + size)}) for i in range(0, n, size)]
    ids = np.random.default_rng(7).integers(1, 2**63, n, dtype=np.uint64)
    s = MemoryStorage()
    gc.collect()
    tracemalloc.start()
    try:
        for k, b in enumerate(data):
            s.persist(b, RecordMeta.new(ids[k * size : (k + 1) * size], source=3))
        gc.collect()
        per_record = tracemalloc.get_traced_memory()[0] / n
    finally:
        tracemalloc.stop()
    assert len(s) == n
    assert per_record <= 40, f"{per_record:.1f} bytes per record"
    half = ids[: n // 2]
    assert s.delete(half) == n // 2
    assert len(s) == n // 2
    assert sorted(s.stored_ids().tolist()) == sorted(ids[n // 2 :].tolist())
    assert s.lookup(half).src.size == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "pop", "get"]),
            st.lists(st.integers(1, 40), max_size=30),
        ),
        max_size=40,
    )
)
def test_id_index_behaves_like_a_dict(ops):
    from xorack.storage import _IdIndex

    index, model, next_loc = _IdIndex(), {}, 0
    index.compact_min = 2  # compact often
    for op, keys in ops:
        if op == "add":
            keys = sorted(set(keys) - model.keys())  # ids added are never live already
            locs = list(range(next_loc, next_loc + len(keys)))
            next_loc += len(keys)
            index.add(np.array(keys, np.uint64), np.array(locs, np.int64))
            model.update(zip(keys, locs, strict=True))
        elif op == "get":
            got = index.get(np.array(keys, np.uint64)).tolist()
            assert got == [model.get(k, -1) for k in keys]
        else:
            got = index.pop(np.array(keys, np.uint64)).tolist()
            assert got == [model.pop(k, -1) for k in keys]
        assert len(index) == len(model)
        assert sorted(index.keys().tolist()) == sorted(model)
