"""Helper of test_crash_recovery.py: runs an FT layer on a SQLite file until it is killed.

    python ft_crash_worker.py PATH BACKEND

Loops forever over batches of 64 source records: persist, complete half of them, fail one in
eight. After each call returns it prints (flushed) what the caller now knows:
``P src:n,...`` (persisted; ``n`` is the payload's row number), ``X src,...`` (an xor is about to
be sent: those ids may or may not complete if the process dies now), ``C src,...`` (completed),
``Y src,...`` (a fail is about to be sent), ``F src,...`` (failed and replayed).
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from xorack import FTLayer

BATCH = 64


def main() -> None:
    path, backend = sys.argv[1], sys.argv[2]
    ft = FTLayer(f"sqlite:///{path}", backend=backend, num_buckets=1000)
    rng = np.random.default_rng(7)
    start = 0
    print("READY", flush=True)
    while True:
        seq = np.arange(start, start + BATCH)
        start += BATCH
        births = rng.integers(1, 2**63, BATCH, dtype=np.uint64)
        payload = pa.record_batch({"n": seq, "text": [f"row {i}" for i in seq]})
        src = ft.persist(payload, key_hash=seq.astype(np.int32), births=births)
        print(
            "P " + ",".join(f"{s}:{n}" for s, n in zip(src.tolist(), seq.tolist(), strict=True)),
            flush=True,
        )
        print("X " + ",".join(map(str, src[::2].tolist())), flush=True)
        done = ft.xor(src[::2], births[::2])
        print("C " + ",".join(map(str, done.tolist())), flush=True)
        print("Y " + ",".join(map(str, src[1::8].tolist())), flush=True)
        ft.fail(src[1::8], reason="worker")
        print("F " + ",".join(map(str, src[1::8].tolist())), flush=True)


if __name__ == "__main__":
    main()
