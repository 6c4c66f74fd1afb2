"""xorack: record-level fault tolerance for PySpark with an XOR acker.

Every source record gets a random 64-bit id; every derived record a new one; each stage reports
one XOR event per input row; a source record is done when its checksum returns to zero. Failed or
timed-out records are replayed alone, to the partition Spark's own partitioning would pick.

>>> import xorack
>>> t = xorack.AckTable()
>>> t.register([7], [5]).tolist()          # source 7 is born; its first record id is 5
[]
>>> t.xor([7], [5]).tolist()               # the record with id 5 is acked: 7 is complete
[7]
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import FailRecord, LineageError, ServiceError, StorageError, XorackError
from .kernels import backend

__version__ = "0.1.0"

# Public names, imported on first use (keeps `import xorack` light: no SQLite, no Flight, no Spark).
_LAZY = {
    "AckTable": "acker",
    "TimeoutWheel": "acker",
    "new_ids": "acker",
    "anchor": "acker",
    "parent_index": "acker",
    "xor_reduce": "acker",
    "derive_ids": "acker",
    "murmur3_hash": "hashing",
    "spark_partition_ids": "hashing",
    "route_keys": "hashing",
    "ReplayPartitioner": "replay",
    "HashReplayPartitioner": "replay",
    "RoundRobinReplayPartitioner": "replay",
    "ForwardReplayPartitioner": "replay",
    "SingleReplayPartitioner": "replay",
    "BroadcastReplayPartitioner": "replay",
    "ShuffleReplayPartitioner": "replay",
    "Storage": "storage",
    "MemoryStorage": "storage",
    "SQLiteStorage": "storage",
    "open_storage": "storage",
    "FTLayer": "ftlayer",
    "FTStats": "ftlayer",
    "NO_EVENT_TIME": "protocol",
    "ManualClock": "clock",
    "MonotonicClock": "clock",
}

__all__ = [
    "FailRecord",
    "LineageError",
    "ServiceError",
    "StorageError",
    "XorackError",
    "__version__",
    "backend",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xorack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
