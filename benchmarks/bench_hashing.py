"""Benchmarks of Spark-exact hashing and the replay partitioners, native vs fallback.

    PYTHONPATH=python python -m pytest benchmarks/bench_hashing.py --benchmark-enable \
        -p no:cacheprovider [--benchmark-json=hashing.json]

Throughputs are in each benchmark's ``extra_info``, from the median round and (``*_best``) from
the fastest one, which is the fairer figure on a shared machine: ``keys_per_s`` for
int64 keys (target >= 300 M/s native), ``bytes_per_s`` for short strings (target >= 1 GB/s
native), ``records_per_s`` for the replay partitioners. Sizes: ``XORACK_BENCH_HASH_KEYS`` int64
keys (default 4,000,000) and ``XORACK_BENCH_HASH_STRINGS`` strings of 8-16 bytes (1,000,000).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

import xorack
from xorack import kernels
from xorack.replay import replay_partitioner_from_spec

KEYS = int(float(os.environ.get("XORACK_BENCH_HASH_KEYS", "4e6")))
STRINGS = int(float(os.environ.get("XORACK_BENCH_HASH_STRINGS", "1e6")))
PARTITIONS = 200

BACKENDS = [
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            not kernels.native_available(), reason="native extension not built: nothing to time"
        ),
    ),
    "python",
]


@pytest.fixture(scope="module")
def int64_keys() -> pa.Array:
    rng = np.random.default_rng(0)
    return pa.array(rng.integers(-(2**63), 2**63 - 1, KEYS, dtype=np.int64))


@pytest.fixture(scope="module")
def short_strings() -> pa.Array:
    """STRINGS random ASCII strings of 8-16 bytes, built straight from Arrow buffers."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(8, 17, STRINGS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    return pa.Array.from_buffers(
        pa.string(), STRINGS, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


# Record ``amount`` per second of the median and of the fastest round in extra_info.
def _throughput(benchmark, name: str, amount: int) -> None:
    benchmark.extra_info[name] = amount / benchmark.stats.stats.median
    benchmark.extra_info[f"{name}_best"] = amount / benchmark.stats.stats.min


def _rounds(backend: str) -> int:
    return 10 if backend == "native" else 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_partition_ids_int64(benchmark, backend: str, int64_keys: pa.Array) -> None:
    """spark_partition_ids over int64 keys: keys/s."""
    out = benchmark.pedantic(
        xorack.spark_partition_ids,
        args=(int64_keys, PARTITIONS),
        kwargs={"backend": backend},
        rounds=_rounds(backend),
        iterations=1,
    )
    assert len(out) == KEYS
    benchmark.extra_info["keys"] = KEYS
    _throughput(benchmark, "keys_per_s", KEYS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_partition_ids_short_strings(benchmark, backend: str, short_strings: pa.Array) -> None:
    """spark_partition_ids over 8-16 byte strings: bytes/s of string data (and keys/s)."""
    out = benchmark.pedantic(
        xorack.spark_partition_ids,
        args=(short_strings, PARTITIONS),
        kwargs={"backend": backend},
        rounds=_rounds(backend),
        iterations=1,
    )
    assert len(out) == STRINGS
    nbytes = int(short_strings.buffers()[2].size)
    benchmark.extra_info["bytes"] = nbytes
    _throughput(benchmark, "bytes_per_s", nbytes)
    _throughput(benchmark, "keys_per_s", STRINGS)


REPLAY_SPECS = ["hash:200", "roundrobin:200", "shuffle:200:7", "forward", "single", "broadcast:4"]


@pytest.mark.parametrize("spec", REPLAY_SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_partitioner(benchmark, backend: str, spec: str) -> None:
    """ReplayPartitioner.assign over KEYS stored records (broadcast: KEYS / 4): records/s."""
    count = KEYS // 4 if spec.startswith("broadcast") else KEYS
    rng = np.random.default_rng(2)
    key_hash = rng.integers(-(2**31), 2**31, count, dtype=np.int64).astype(np.int32)
    partition = rng.integers(0, PARTITIONS, count).astype(np.int32)
    partitioner = replay_partitioner_from_spec(spec)
    rows, _parts = benchmark.pedantic(
        partitioner.assign,
        args=(key_hash, partition),
        kwargs={"backend": backend},
        rounds=_rounds(backend),
        iterations=1,
    )
    assert len(rows) == count * (4 if spec.startswith("broadcast") else 1)
    benchmark.extra_info["records"] = count
    _throughput(benchmark, "records_per_s", count)
