"""Replay partitioners: where the FT layer sends a replayed record, mirroring the partitioning
the record's source used (the seed's ReplayPartitioner family and ReplayPartitionerFactory).

The FT layer never re-parses a persisted record; it only knows what it stored with it: the
Spark key hash (int32, ``murmur3_hash`` of the key columns) and the partition the record first
went to. Each partitioner turns those into (rows, partitions) for a whole batch at once:

- ``hash:N`` (HashReplayPartitioner): pmod(key_hash, N), the partition Spark's
  ``repartition(N, *keys)`` picks;
- ``roundrobin:N`` (RoundRobinReplayPartitioner): successive partitions, continuing across calls;
- ``forward`` (ForwardReplayPartitioner): the record's original partition;
- ``single`` (SingleReplayPartitioner): partition 0;
- ``broadcast:N`` (BroadcastReplayPartitioner): every partition 0 .. N-1;
- ``shuffle:N:SEED`` (ShuffleReplayPartitioner): seeded pseudo-random, reproducible.

>>> import numpy as np
>>> from xorack.replay import replay_partitioner_from_spec
>>> p = replay_partitioner_from_spec("hash:4")
>>> rows, parts = p.assign(np.array([7, -3], np.int32), np.array([-1, -1], np.int32))
>>> rows.tolist(), parts.tolist()
([0, 1], [3, 1])
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from . import kernels
from ._checks import as_i32, positive_int, same_length

__all__ = [
    "BroadcastReplayPartitioner",
    "ForwardReplayPartitioner",
    "HashReplayPartitioner",
    "PreparedReplays",
    "ReplayPartitioner",
    "RoundRobinReplayPartitioner",
    "ShuffleReplayPartitioner",
    "SingleReplayPartitioner",
    "replay_partitioner_from_spec",
]

_INT32_MAX = 2**31 - 1
_U64_MASK = 2**64 - 1
UNKNOWN_PARTITION = -1  # the stored original partition of a record that never reached one


def _partition_count(n: Any) -> int:
    n = positive_int(n, "num_partitions")
    if n > _INT32_MAX:
        raise ValueError(f"num_partitions must be <= {_INT32_MAX}, got {n}")
    return n


# The base of every replay partitioner: input checks + (rows, parts) contract.
class ReplayPartitioner:
    """Decides the partitions that replayed records go to, for a whole batch at once.

    ``assign(key_hash, partition)`` takes per record its stored Spark key hash (int32) and the
    partition it originally went to (int32, -1 = unknown) and returns ``(rows, parts)``: the
    replay of record ``rows[i]`` goes to partition ``parts[i]``. Every row appears exactly once,
    except with broadcast (once per partition). Thread-safe.

    >>> import numpy as np
    >>> from xorack.replay import SingleReplayPartitioner
    >>> SingleReplayPartitioner().assign(np.array([5], np.int32), np.array([2], np.int32))[1]
    array([0], dtype=int32)
    """

    num_partitions: int | None = None
    spec: str = ""

    def assign(
        self, key_hash: Any, partition: Any, backend: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64, parts int32) for the records with these key hashes and original
        partitions; ``backend`` picks the kernels ("native", "python", None = active)."""
        kh = as_i32(key_hash, "key_hash")
        part = as_i32(partition, "partition", minimum=UNKNOWN_PARTITION)
        same_length(key_hash=kh, partition=part)
        return self._assign(kh, part, kernels.get_impl(backend))

    # Subclasses: the assignment for checked, equally long int32 arrays.
    def _assign(
        self, key_hash: np.ndarray, partition: np.ndarray, impl: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"replay_partitioner_from_spec({self.spec!r})"


def _all_rows(count: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64)


# Spark's HashPartitioning over the stored key hash.
class HashReplayPartitioner(ReplayPartitioner):
    """pmod(key_hash, n): the partition Spark's ``repartition(n, *keys)`` picks for the record
    (the key hash being ``murmur3_hash`` of the same key columns).

    >>> import numpy as np
    >>> from xorack.replay import HashReplayPartitioner
    >>> HashReplayPartitioner(4).assign(np.array([-3, 8], np.int32), np.array([-1, -1]))[1]
    array([1, 0], dtype=int32)
    """

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = _partition_count(num_partitions)
        self.spec = f"hash:{self.num_partitions}"

    def _assign(self, key_hash, partition, impl):
        return _all_rows(len(key_hash)), impl.pmod_partition(key_hash, self.num_partitions)


# Spark's RoundRobinPartitioning: successive partitions, continuing where the last call ended.
class RoundRobinReplayPartitioner(ReplayPartitioner):
    """Successive partitions start, start + 1, ... (mod n); the position carries over between
    calls (and threads), so replays spread evenly.

    >>> import numpy as np
    >>> from xorack.replay import RoundRobinReplayPartitioner
    >>> p = RoundRobinReplayPartitioner(3)
    >>> p.assign(np.zeros(2, np.int32), np.zeros(2, np.int32))[1].tolist()
    [0, 1]
    >>> p.assign(np.zeros(2, np.int32), np.zeros(2, np.int32))[1].tolist()
    [2, 0]
    """

    num_partitions: int  # always set (the base class allows None for forward)

    def __init__(self, num_partitions: int, start: int = 0) -> None:
        self.num_partitions = _partition_count(num_partitions)
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
            raise TypeError(f"start must be an int, got {type(start).__name__}")
        if not 0 <= start < self.num_partitions:
            raise ValueError(f"start must be in [0, {self.num_partitions}), got {start}")
        self.spec = f"roundrobin:{self.num_partitions}"
        self._next = int(start)
        self._lock = threading.Lock()

    def _assign(self, key_hash, partition, impl):
        count = len(key_hash)
        with self._lock:  # reserve this batch's positions; compute outside the lock
            start = self._next
            self._next = (start + count) % self.num_partitions
        return _all_rows(count), impl.round_robin_partition(count, self.num_partitions, start)


# Spark's forward (narrow) dependency: the partition the record originally went to.
class ForwardReplayPartitioner(ReplayPartitioner):
    """The record's original partition; ValueError naming the first record whose partition is
    unknown (-1) or, when ``num_partitions`` is given, out of range.

    >>> import numpy as np
    >>> from xorack.replay import ForwardReplayPartitioner
    >>> ForwardReplayPartitioner().assign(np.array([9, 9], np.int32), np.array([3, 1]))[1]
    array([3, 1], dtype=int32)
    """

    def __init__(self, num_partitions: int | None = None) -> None:
        self.num_partitions = None if num_partitions is None else _partition_count(num_partitions)
        self.spec = "forward" if self.num_partitions is None else f"forward:{self.num_partitions}"

    def _assign(self, key_hash, partition, impl):
        bad = partition < 0
        if self.num_partitions is not None:
            bad |= partition >= self.num_partitions
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            expected = (
                "known (>= 0)"
                if self.num_partitions is None
                else (f"in [0, {self.num_partitions})")
            )
            raise ValueError(
                f"forward replay needs each record's original partition: record {row} has "
                f"partition {int(partition[row])}, expected {expected}"
            )
        return _all_rows(len(partition)), partition.copy()


# Spark's SinglePartition.
class SingleReplayPartitioner(ReplayPartitioner):
    """Every replay goes to partition 0.

    >>> import numpy as np
    >>> from xorack.replay import SingleReplayPartitioner
    >>> SingleReplayPartitioner().spec
    'single'
    """

    num_partitions = 1
    spec = "single"

    def _assign(self, key_hash, partition, impl):
        count = len(key_hash)
        return _all_rows(count), np.zeros(count, dtype=np.int32)


# Spark's broadcast: a copy of the record to every partition.
class BroadcastReplayPartitioner(ReplayPartitioner):
    """Every record to every partition 0 .. n-1 (rows record-major: each row n times).

    >>> import numpy as np
    >>> from xorack.replay import BroadcastReplayPartitioner
    >>> rows, parts = BroadcastReplayPartitioner(2).assign(np.zeros(2, np.int32), [-1, -1])
    >>> rows.tolist(), parts.tolist()
    ([0, 0, 1, 1], [0, 1, 0, 1])
    """

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = _partition_count(num_partitions)
        self.spec = f"broadcast:{self.num_partitions}"

    def _assign(self, key_hash, partition, impl):
        return impl.broadcast_partition(len(key_hash), self.num_partitions)


# A seeded random spread (Flink's ShufflePartitioner): reproducible for a seed and call sequence.
class ShuffleReplayPartitioner(ReplayPartitioner):
    """Pseudo-random partitions from a 64-bit mixer of (seed, position); the position carries
    over between calls, so the same seed and the same sequence of batch sizes give the same
    partitions.

    >>> import numpy as np
    >>> from xorack.replay import ShuffleReplayPartitioner
    >>> a = ShuffleReplayPartitioner(4, seed=7).assign(np.zeros(5, np.int32), [-1] * 5)[1]
    >>> b = ShuffleReplayPartitioner(4, seed=7).assign(np.zeros(5, np.int32), [-1] * 5)[1]
    >>> bool((a == b).all()) and bool(((a >= 0) & (a < 4)).all())
    True
    """

    def __init__(self, num_partitions: int, seed: int = 0) -> None:
        self.num_partitions = _partition_count(num_partitions)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not 0 <= seed <= _U64_MASK:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self.seed = int(seed)
        self.spec = f"shuffle:{self.num_partitions}:{self.seed}"
        self._counter = 0
        self._lock = threading.Lock()

    def _assign(self, key_hash, partition, impl):
        count = len(key_hash)
        with self._lock:  # reserve this batch's stream positions
            counter = self._counter
            self._counter = (counter + count) & _U64_MASK
        parts = impl.shuffle_partition(count, self.num_partitions, self.seed, counter)
        return _all_rows(count), parts


_SPECS = {
    "hash": (HashReplayPartitioner, 1, 1),
    "roundrobin": (RoundRobinReplayPartitioner, 1, 2),
    "forward": (ForwardReplayPartitioner, 0, 1),
    "single": (SingleReplayPartitioner, 0, 0),
    "broadcast": (BroadcastReplayPartitioner, 1, 1),
    "shuffle": (ShuffleReplayPartitioner, 1, 2),
}


# The seed's ReplayPartitionerFactory: a partitioner from its spec string.
def replay_partitioner_from_spec(spec: str) -> ReplayPartitioner:
    """The replay partitioner a spec string names: ``"hash:N"``, ``"roundrobin:N"``,
    ``"forward"``, ``"single"``, ``"broadcast:N"``, ``"shuffle:N:SEED"`` (``p.spec`` gives it
    back).

    >>> from xorack.replay import replay_partitioner_from_spec
    >>> replay_partitioner_from_spec("shuffle:4:7").spec
    'shuffle:4:7'
    """
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str, got {type(spec).__name__}")
    kind, *args = spec.strip().split(":")
    known = ", ".join(f"{k!r}" for k in _SPECS)
    if kind not in _SPECS:
        raise ValueError(
            f"unknown replay partitioner spec {spec!r}: the kind must be one of {known}"
        )
    cls, lo, hi = _SPECS[kind]
    if not lo <= len(args) <= hi:
        forms = {
            "hash": "hash:N",
            "roundrobin": "roundrobin:N[:START]",
            "forward": "forward[:N]",
            "single": "single",
            "broadcast": "broadcast:N",
            "shuffle": "shuffle:N[:SEED]",
        }
        raise ValueError(f"bad replay partitioner spec {spec!r}: expected {forms[kind]!r}")
    values = []
    for a in args:
        try:
            values.append(int(a))
        except ValueError:
            raise ValueError(
                f"bad replay partitioner spec {spec!r}: {a!r} is not an integer"
            ) from None
    return cls(*values)


# --------------------------------------------------------------------------------------------
# Replays prepared for a round: routed rows kept on disk until the round is over.


class PreparedReplays:
    """The replays of one source prepared for a round (``FTLayer.prepare_replays``): their
    rows, routed to partitions, kept in a spill file until :meth:`close` (the next round's
    prepare, an explicit release or the FT layer's close), so that a retried Spark task can
    fetch its partition again. Rows go in as Arrow tables, one IPC stream segment per
    (written piece, partition); a fetch reads the segments of one partition back. Memory held:
    the segment index only. Thread-safe.

    >>> import numpy as np, pyarrow as pa
    >>> p = PreparedReplays("r1")
    >>> p.add(pa.table({"v": [1, 2, 3]}), np.array([0, 1, 0], np.int32))
    >>> p.counts(), p.fetch(0).column("v").to_pylist(), p.fetch(5).num_rows
    ({0: 2, 1: 1}, [1, 3], 0)
    >>> p.close()
    """

    def __init__(self, tag: str, directory: str | None = None) -> None:
        import tempfile

        self.tag = tag
        fd, self.path = tempfile.mkstemp(prefix="xorack-replays-", suffix=".arrows", dir=directory)
        self._file: Any = os.fdopen(fd, "w+b")
        # an FT layer dropped without close() still closes the file (no ResourceWarning)
        self._closer = weakref.finalize(self, self._file.close)
        with contextlib.suppress(OSError):  # the open file stays readable; nothing is left behind
            os.unlink(self.path)  # if the process dies (POSIX)
        self._segments: dict[int, list[tuple[int, int]]] = {}  # partition -> (offset, length)
        self._counts: dict[int, int] = {}
        self._schema: pa.Schema | None = None
        self._uniform = True  # every segment has _schema
        self._lock = threading.Lock()

    def add(self, table: pa.Table, partition: np.ndarray) -> None:
        """Append ``table``'s rows, row i routed to ``partition[i]``."""
        if not table.num_rows:
            return
        partition = np.asarray(partition, np.int32)
        order = np.argsort(partition, kind="stable")
        parts, starts = np.unique(partition[order], return_index=True)
        stops = np.r_[starts[1:], len(order)]
        table = table.take(pa.array(order))
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"the replays prepared under {self.tag!r} were released")
            if self._schema is None:
                self._schema = table.schema
            elif table.schema != self._schema:
                self._uniform = False
            for p, a, b in zip(parts.tolist(), starts.tolist(), stops.tolist(), strict=True):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table.slice(a, b - a))
                data = sink.getvalue()
                offset = self._file.seek(0, os.SEEK_END)
                self._file.write(data)
                self._segments.setdefault(p, []).append((offset, data.size))
                self._counts[p] = self._counts.get(p, 0) + (b - a)

    def counts(self) -> dict[int, int]:
        """Rows per partition (partitions with none left out)."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def fetch(self, partition: int) -> pa.Table:
        """The rows routed to ``partition`` (empty when none), as often as asked."""
        return self.reader(partition).read_all()

    def reader(self, partition: int) -> pa.RecordBatchReader:
        """The rows routed to ``partition`` as a stream read a segment at a time (what one
        piece of the prepare wrote: the memory of a fetch follows a segment, not the
        partition); one table unified from the segments when their schemas differ."""
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"the replays prepared under {self.tag!r} were released")
            self._file.flush()
            segments = list(self._segments.get(int(partition), ()))
            schema = self._schema or pa.schema([])
            uniform = self._uniform
        if not uniform:
            tables = [self._read(off, n) for off, n in segments]
            table = pa.concat_tables(tables, promote_options="permissive")
            return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())

        def batches() -> Iterator[pa.RecordBatch]:
            for off, n in segments:
                yield from self._read(off, n).to_batches()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def _read(self, offset: int, length: int) -> pa.Table:
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"the replays prepared under {self.tag!r} were released")
            data = os.pread(self._file.fileno(), length, offset)
        return pa.ipc.open_stream(data).read_all()

    def close(self) -> None:
        """Free the rows (idempotent)."""
        with self._lock:
            f, self._file = self._file, None
        if f is not None:
            self._closer()
            with contextlib.suppress(OSError):  # where an open file cannot be unlinked
                os.unlink(self.path)
