"""Replays without the driver: the executors fetch the replays of their partition straight from
the acker.

In a batch run's replay round the driver only asks the acker to *prepare* a source's replays
(``AckerClient.prepare_replays``: the acker routes each one to the partition the source's own
partitioning picks and gives it its first attempt's id) and gets back the rows per partition.
The round's frame is then ``spark.range(0, n, 1, n)`` — one row per partition, row ``i`` in
partition ``i`` — mapped by :class:`ReplayFetcher`, which yields in partition ``i`` the replays
the acker routed to ``i`` (one Flight ``do_get`` per partition). No replay row passes through
the driver, and no shuffle places them: they are born on their partition.

>>> ReplayFetcher("grpc://127.0.0.1:1", source=0, tag="p0-r1", columns=("word",)).tag
'p0-r1'
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ServiceError
from .ids import client_of, i64
from .lineage import REC, SRC

__all__ = ["ReplayFetcher", "replay_partitioning", "replays_frame"]

log = logging.getLogger(__name__)
_NOT_PREPARED = "no replays of source"  # FTLayer.fetch_replays: the tag is not the round's


def replay_partitioning(keys: tuple[str, ...], partitions: int) -> str:
    """The acker's routing for a source's replays: ``hash:n`` over the stored key hash when the
    source is hash-partitioned by keys (Spark's ``repartition(n, *keys)``), else ``forward:n``
    (the partition the record was first read on).

    >>> replay_partitioning(("k",), 4), replay_partitioning((), 3)
    ('hash:4', 'forward:3')
    """
    return f"hash:{partitions}" if keys else f"forward:{partitions}"


@dataclass(frozen=True)
class ReplayFetcher:
    """``mapInArrow`` function over ``spark.range(0, n, 1, n)``: for each partition number it
    reads (row ``i`` of partition ``i``), the replays the acker prepared for it under ``tag``,
    as the payload ``columns`` (cast to ``schema`` when given) followed by ``_ft_src``,
    ``_ft_rec`` (``bigint``). A retried task fetches the same rows again."""

    location: str
    source: int
    tag: str
    columns: tuple[str, ...]
    schema: pa.Schema | None = None  # the payload's Arrow types as mapInArrow declares them
    token: str | None = None
    tls_root_certs: bytes | None = None
    job: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = client_of(self.location, self.token, self.tls_root_certs, self.job)
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                try:
                    table = client.fetch_replays(self.source, self.tag, int(partition))
                except ServiceError as exc:
                    if _NOT_PREPARED not in str(exc):
                        raise
                    # the acker no longer has the round (restarted from its storage): it
                    # replays every unfinished record itself, these ones included, in a later
                    # round; and a prepared replay nobody fetched times out and is replayed
                    log.warning(
                        "xorack: replays of source %d for partition %s are gone from the acker "
                        "(%s); they are replayed in a later round",
                        self.source,
                        partition,
                        exc,
                    )
                    continue
                if table.num_rows:
                    yield from self._rows(table).to_batches()

    def _rows(self, table: pa.Table) -> pa.Table:
        payload = table.select(list(self.columns))
        if self.schema is not None and payload.schema != self.schema:
            payload = payload.cast(self.schema)
        src = table.column(SRC).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        rec = table.column(REC).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        return payload.append_column(SRC, pa.array(i64(src), pa.int64())).append_column(
            REC, pa.array(i64(rec), pa.int64())
        )


def replays_frame(spark: Any, partitions: int, fetcher: ReplayFetcher, schema: Any) -> Any:
    """The DataFrame of the replays ``fetcher`` reads: ``partitions`` partitions, partition
    ``i`` holding the replays routed to ``i`` (``schema``: the payload + lineage columns)."""
    return spark.range(0, partitions, 1, partitions).mapInArrow(fetcher, schema)
