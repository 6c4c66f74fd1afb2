"""Space a storage keeps for its pending records: persist 1 M records in batches, complete all
but 1 % of them (spread over every batch, deleted in random order), and report what stays:
Arrow bytes for MemoryStorage (the memory pool's allocation), used pages for SQLiteStorage.
The ideal is the pending rows' own bytes: a pending record must not pin its whole batch.

    python benchmarks/storage_memory.py [--records 1000000] [--pending 0.01]

(A measure of space, not of time: it runs in a few seconds and prints one JSON object.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute

from xorack.storage import MemoryStorage, RecordMeta, SQLiteStorage

BATCH_ROWS = 10_000
DELETE_CALL = 65_536


def _batch(start: int, n: int) -> pa.RecordBatch:
    ids = pa.compute.add(pa.array(np.arange(start, start + n, dtype=np.int64)), 0)  # Arrow-owned
    words = pa.array([f"word-{i:012d}" for i in range(start, start + n)])  # 17 bytes each
    return pa.record_batch({"id": ids, "word": words})


def _fill_and_drain(storage, records: int, pending: float, seed: int = 1) -> np.ndarray:
    """Persist ``records`` records, delete all but ``pending`` of them; the kept ids."""
    rng = np.random.default_rng(seed)
    src = np.arange(1, records + 1, dtype=np.uint64)
    for start in range(0, records, BATCH_ROWS):
        n = min(BATCH_ROWS, records - start)
        storage.persist(_batch(start, n), RecordMeta.new(src[start : start + n], source=0))
    order = rng.permutation(records)
    keep = int(records * pending)
    gone = src[order[keep:]]
    for at in range(0, len(gone), DELETE_CALL):
        storage.delete(gone[at : at + DELETE_CALL])
    return src[order[:keep]]


def _pending_bytes(storage, kept: np.ndarray) -> int:
    table, _ = storage.fetch(kept)
    return int(table.select(["id", "word"]).combine_chunks().nbytes)


def measure_memory(records: int, pending: float) -> dict:
    gc.collect()
    base = pa.total_allocated_bytes()
    s = MemoryStorage()
    kept = _fill_and_drain(s, records, pending)
    gc.collect()
    retained = pa.total_allocated_bytes() - base
    ideal = _pending_bytes(s, kept)
    return {"arrow_bytes_retained": retained, "pending_rows_bytes": ideal, "pending": len(kept)}


def measure_sqlite(records: int, pending: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ft.db")
        s = SQLiteStorage(path)
        try:
            kept = _fill_and_drain(s, records, pending)
            s.compact()
            db = s._db
            page = db.execute("PRAGMA page_size").fetchone()[0]
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            payload = db.execute("SELECT coalesce(sum(length(payload)), 0) FROM batches").fetchone()
            ideal = _pending_bytes(s, kept)
        finally:
            s.close()
    return {
        "used_bytes": (pages - free) * page,
        "payload_blob_bytes": payload[0],
        "pending_rows_bytes": ideal,
        "pending": len(kept),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--pending", type=float, default=0.01)
    args = ap.parse_args()
    out = {
        "records": args.records,
        "pending_share": args.pending,
        "batch_rows": BATCH_ROWS,
        "memory": measure_memory(args.records, args.pending),
        "sqlite": measure_sqlite(args.records, args.pending),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
