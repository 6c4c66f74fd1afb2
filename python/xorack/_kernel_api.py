"""The raw kernel API that both backends implement: the C++ extension ``xorack._native`` (typed by
``_native.pyi``) and the numpy fallback ``xorack._fallback``.

It is checked twice: by mypy (the ``TYPE_CHECKING`` block below assigns both modules to
:class:`KernelBackend`), and at run time by ``tests/kernels/test_kernel_api.py``, which
compares the names and parameter counts of the real extension, the fallback and this protocol.
A kernel added to one backend goes here, into ``_native.pyi`` and into the other backend.

Parameters are positional-only: the extension's are unnamed (``arg0``, ...).

>>> from xorack import kernels
>>> sorted(KERNEL_FUNCTIONS) == sorted(
...     n for n in dir(kernels.get_impl("python")) if n in KERNEL_FUNCTIONS
... )
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

__all__ = ["KERNEL_CLASSES", "KERNEL_FUNCTIONS", "AckTableAPI", "KernelBackend", "TimeoutWheelAPI"]


class AckTableAPI(Protocol):
    """The XOR acker table (``cpp/ack_table.hpp``, ``_fallback/ack_table.py``)."""

    def register(self, keys: np.ndarray, births: np.ndarray, /) -> np.ndarray: ...
    def xor(self, keys: np.ndarray, values: np.ndarray, /) -> np.ndarray: ...
    def fail(self, keys: np.ndarray, /) -> np.ndarray: ...
    def expire_unregistered(self) -> int: ...
    def contains(self, key: int, /) -> bool: ...
    def get(self, key: int, /) -> int | None: ...
    def gather(self, keys: np.ndarray, /) -> np.ndarray: ...
    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...


class AckTableClass(Protocol):
    """The class itself: a constructor and ``restore``."""

    def __call__(self) -> AckTableAPI: ...
    def restore(
        self, keys: np.ndarray, values: np.ndarray, registered: np.ndarray, /
    ) -> AckTableAPI: ...


class TimeoutWheelAPI(Protocol):
    """The rotating timeout buckets (``cpp/timeout_wheel.hpp``, ``_fallback/timeout_wheel.py``)."""

    @property
    def rotation(self) -> int: ...
    def add(self, ids: np.ndarray, /) -> None: ...
    def touch(self, ids: np.ndarray, /) -> None: ...
    def discard(self, ids: np.ndarray, /) -> None: ...
    def rotate(self) -> np.ndarray: ...
    def contains(self, key: int, /) -> bool: ...
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...


class TimeoutWheelClass(Protocol):
    def __call__(self, num_buckets: int, /) -> TimeoutWheelAPI: ...


class KernelBackend(Protocol):
    """A kernel module: what :func:`xorack.kernels.get_impl` returns."""

    @property
    def AckTable(self) -> AckTableClass: ...
    @property
    def TimeoutWheel(self) -> TimeoutWheelClass: ...

    # lineage (cpp/lineage.hpp)
    def new_ids(self, n: int, /) -> np.ndarray: ...
    def xor_reduce(
        self, src: np.ndarray, values: np.ndarray, /
    ) -> tuple[np.ndarray, np.ndarray]: ...
    def anchor(
        self,
        in_src: np.ndarray,
        in_rec: np.ndarray,
        parent_index: np.ndarray,
        out_rec: np.ndarray | None,
        /,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
    def parent_index(self, in_rec: np.ndarray, out_lineage: np.ndarray, /) -> np.ndarray: ...
    def derive_ids(
        self, origin: np.ndarray, parent: np.ndarray, ordinal: np.ndarray, salt: int, /
    ) -> np.ndarray: ...

    # the client's side of a sharded acker (cpp/sharding.hpp)
    def split_by_shard(
        self, ids: np.ndarray, values: np.ndarray, count: int, shift: int, /
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def scatter_by_shard(
        self,
        ids: np.ndarray,
        values: np.ndarray,
        shift: int,
        out_ids: list[np.ndarray],
        out_values: list[np.ndarray],
        fill: np.ndarray,
        /,
    ) -> bool: ...

    # partitioners (cpp/partitioners.hpp)
    def pmod_partition(self, hashes: np.ndarray, n: int, inplace: bool = ..., /) -> np.ndarray: ...
    def round_robin_partition(self, count: int, n: int, start: int, /) -> np.ndarray: ...
    def shuffle_partition(self, count: int, n: int, seed: int, counter: int, /) -> np.ndarray: ...
    def broadcast_partition(self, count: int, n: int, /) -> tuple[np.ndarray, np.ndarray]: ...

    # Spark's Murmur3 (cpp/spark_hash.hpp): hash one column into ``hashes`` in place
    def hash_int32(
        self, values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray, /
    ) -> None: ...
    def hash_int64(
        self, values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray, /
    ) -> None: ...
    def hash_float32(
        self, values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray, /
    ) -> None: ...
    def hash_float64(
        self, values: np.ndarray, valid: Any, valid_offset: int, hashes: np.ndarray, /
    ) -> None: ...
    def hash_bytes(
        self,
        offsets: np.ndarray,
        data: np.ndarray,
        valid: Any,
        valid_offset: int,
        hashes: np.ndarray,
        /,
    ) -> None: ...
    def hash_decimal128(
        self,
        words: np.ndarray,
        valid: Any,
        valid_offset: int,
        hashes: np.ndarray,
        as_long: bool,
        /,
    ) -> None: ...


#: The module-level kernels every backend has, with their positional parameter counts
#: (required, total); the run-time check compares the real modules against these.
KERNEL_FUNCTIONS: dict[str, tuple[int, int]] = {
    "new_ids": (1, 1),
    "xor_reduce": (2, 2),
    "anchor": (4, 4),
    "parent_index": (2, 2),
    "derive_ids": (4, 4),
    "split_by_shard": (4, 4),
    "scatter_by_shard": (6, 6),
    "pmod_partition": (2, 3),
    "round_robin_partition": (3, 3),
    "shuffle_partition": (4, 4),
    "broadcast_partition": (2, 2),
    "hash_int32": (4, 4),
    "hash_int64": (4, 4),
    "hash_float32": (4, 4),
    "hash_float64": (4, 4),
    "hash_bytes": (5, 5),
    "hash_decimal128": (5, 5),
}

#: The kernel classes and their public methods (with positional parameter counts, self excluded).
KERNEL_CLASSES: dict[str, dict[str, int]] = {
    "AckTable": {
        "register": 2,
        "xor": 2,
        "fail": 1,
        "expire_unregistered": 0,
        "contains": 1,
        "get": 1,
        "snapshot": 0,
        "nbytes": 0,
        "restore": 3,
    },
    "TimeoutWheel": {
        "add": 1,
        "touch": 1,
        "discard": 1,
        "rotate": 0,
        "contains": 1,
        "nbytes": 0,
    },
}

#: Names only the extension has (measurement helpers of the benchmarks, not kernels).
NATIVE_ONLY = frozenset({"random_read_rate"})


if TYPE_CHECKING:  # mypy: both backends satisfy the protocol
    from . import _fallback, _native

    _python_backend: KernelBackend = _fallback
    _native_backend: KernelBackend = _native
