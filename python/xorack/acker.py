"""The acker kernels' public, checked API: ``AckTable``, ``TimeoutWheel``, ``new_ids``,
``anchor`` and the lineage helpers ``parent_index``, ``xor_reduce``, ``derive_ids``.

Every name validates its input (lists are converted; wrong dtypes, id 0, length mismatches raise
``TypeError``/``ValueError`` naming the argument) and delegates to the raw kernels of the chosen
backend: ``"native"`` (C++), ``"python"`` (numpy), ``None`` = ``xorack.backend``. Both backends
give the same results bit for bit (except the random ``new_ids``).

>>> import xorack
>>> t = xorack.AckTable()
>>> t.register([1, 2], [10, 20]).tolist()
[]
>>> t.xor([2, 1, 2], [20, 3, 0]).tolist()
[2]
>>> t.value(1)
9
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import kernels
from ._checks import as_index, as_u64, exact_ints, positive_int, same_length
from .errors import LineageError

__all__ = [
    "AckTable",
    "TimeoutWheel",
    "anchor",
    "derive_ids",
    "new_ids",
    "parent_index",
    "xor_reduce",
]

_U64_MAX = (1 << 64) - 1
_MAX_BUCKETS = (1 << 15) - 1  # deadlines are kept modulo 2**16 (10-byte slots)


def _u64(x: Any, name: str, *, nonzero: bool = False) -> np.ndarray:
    """``as_u64`` that also takes lists of ids >= 2**63 exactly."""
    return as_u64(exact_ints(x, name), name, nonzero=nonzero)


def _id_arg(x: Any, name: str) -> int:
    """A single id as a Python int in [1, 2**64)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int id, got {type(x).__name__}")
    v = int(x)
    if not 0 < v <= _U64_MAX:
        raise ValueError(f"{name} must be in [1, 2**64), got {v}")
    return v


def _as_bool(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if arr.size == 0:
            return np.empty(0, dtype=np.bool_)
        raise TypeError(f"{name} must be bool, got {arr.dtype}")
    return np.ascontiguousarray(arr)


# The XOR acker table: source id -> 64-bit ack value (+ registered flag). A registered id is
# complete exactly when its value returns to 0; events that arrive before `register` wait.
class AckTable:
    """Source id → XOR checksum. Batched, with Storm's init rule (only registered ids complete).

    ``register`` takes its ``(id, birth)`` pairs one after the other, exactly as if each were a
    call of its own (splitting a register call never changes what completes): it creates an
    entry with the birth value, or XORs the birth into events that arrived early (complete at
    once if that gives 0); registering an already registered id XORs the birth in again (and
    completes it if that gives 0). A fresh entry with birth 0 waits for its events. Its completed
    ids come back in completion order. ``xor`` combines the events of an id within the call
    first, then completes registered ids whose value is 0 after the call (a value passing
    through 0 mid-call does not complete); an unregistered entry back at 0 is dropped silently.
    Its completed ids come back in order of their last occurrence in the input (where each
    completes). Completed ids are removed. Id 0 is never valid (``ValueError``).

    >>> t = AckTable()
    >>> t.xor([5], [7]).tolist()         # an early event: 5 is not registered yet
    []
    >>> t.register([5], [7]).tolist()    # the birth cancels it: complete at once
    [5]
    >>> len(t)
    0
    """

    __slots__ = ("_impl", "backend")

    def __init__(self, backend: str | None = None) -> None:
        self.backend: str = backend or kernels.backend
        self._impl = kernels.get_impl(self.backend).AckTable()

    def register(self, src_ids: Any, births: Any) -> np.ndarray:
        """Registers source ids with their birth values; returns the ids completed (uint64)."""
        s = _u64(src_ids, "src_ids", nonzero=True)
        b = _u64(births, "births")
        same_length(src_ids=s, births=b)
        return self._impl.register(s, b)

    def xor(self, src_ids: Any, values: Any) -> np.ndarray:
        """XORs events into their source ids; returns the registered ids now at 0 (removed)."""
        s = _u64(src_ids, "src_ids", nonzero=True)
        v = _u64(values, "values")
        same_length(src_ids=s, values=v)
        return self._impl.xor(s, v)

    def fail(self, src_ids: Any) -> np.ndarray:
        """Removes the ids; returns a bool per input, True where the id was present."""
        return self._impl.fail(_u64(src_ids, "src_ids", nonzero=True))

    def expire_unregistered(self) -> int:
        """Drops the unregistered entries that were already there at the previous call and
        returns how many. Call it once per timeout rotation: an entry whose register never comes
        (events duplicated after their source completed, e.g. by a Spark task retry) would
        otherwise stay forever. Such drops are silent, never completions.

        >>> t = AckTable(); _ = t.xor([8], [1])   # 8 completed long ago; a late duplicate
        >>> t.expire_unregistered(), 8 in t
        (0, True)
        >>> t.expire_unregistered(), 8 in t
        (1, False)
        """
        return int(self._impl.expire_unregistered())

    def value(self, src: Any) -> int | None:
        """The current ack value of ``src``, or None when it has no entry."""
        return self._impl.get(_id_arg(src, "src"))

    def gather(self, src_ids: Any) -> np.ndarray:
        """The current ack value of each id (uint64), 0 where it has no entry.

        >>> t = AckTable(); _ = t.register([3, 4], [9, 5])
        >>> t.gather([4, 7, 3]).tolist()
        [5, 0, 9]
        """
        return self._impl.gather(_u64(src_ids, "src_ids", nonzero=True))

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys uint64, values uint64, registered bool), sorted by key: input of ``restore``."""
        return self._impl.snapshot()

    @classmethod
    def restore(
        cls, keys: Any, values: Any, registered: Any, backend: str | None = None
    ) -> AckTable:
        """A table with exactly the entries of a ``snapshot``.

        >>> t = AckTable(); _ = t.register([3], [9])
        >>> AckTable.restore(*t.snapshot()).value(3)
        9
        """
        k = _u64(keys, "keys", nonzero=True)
        v = _u64(values, "values")
        r = _as_bool(registered, "registered")
        same_length(keys=k, values=v, registered=r)
        if k.size > 1:
            s = np.sort(k)
            if (s[1:] == s[:-1]).any():
                raise ValueError("keys must be unique: a snapshot holds one entry per source id")
        bad = np.flatnonzero(~r & (v == 0))
        if bad.size:
            raise ValueError(
                f"values[{int(bad[0])}] is 0 for an unregistered key: such entries do not exist"
            )
        t = cls.__new__(cls)
        t.backend = backend or kernels.backend
        t._impl = kernels.get_impl(t.backend).AckTable.restore(k, v, r)
        return t

    @property
    def nbytes(self) -> int:
        """Memory held by the table, in bytes."""
        return int(self._impl.nbytes())

    def __len__(self) -> int:
        return len(self._impl)

    def __contains__(self, src: object) -> bool:
        if isinstance(src, bool) or not isinstance(src, (int, np.integer)):
            return False
        v = int(src)
        return 0 < v <= _U64_MAX and bool(self._impl.contains(v))

    def __repr__(self) -> str:
        return f"AckTable(len={len(self)}, backend={self.backend!r})"


# The rotating timeout buckets (Storm's RotatingMap): rotate() returns the ids whose timeout
# ran out; adding or touching an id restarts its timeout, discarding it cancels it.
class TimeoutWheel:
    """Timeouts counted in rotations: an id added or touched while the rotation counter is ``r``
    expires at rotation ``r + num_buckets``; a discarded id never expires.

    >>> w = TimeoutWheel(num_buckets=2)
    >>> w.add([1, 2])
    >>> w.rotate().tolist()
    []
    >>> w.touch([2]); w.discard([9])
    >>> w.rotate().tolist()          # 1 reached rotation 0 + 2; 2 was touched at rotation 1
    [1]
    >>> w.rotate().tolist()
    [2]
    """

    __slots__ = ("_impl", "backend", "num_buckets")

    def __init__(self, num_buckets: int = 3, backend: str | None = None) -> None:
        nb = positive_int(num_buckets, "num_buckets")
        if nb > _MAX_BUCKETS:
            raise ValueError(f"num_buckets must be < 2**15, got {nb}")
        self.num_buckets: int = nb
        self.backend: str = backend or kernels.backend
        self._impl = kernels.get_impl(self.backend).TimeoutWheel(nb)

    def add(self, ids: Any) -> None:
        """Starts the timeout of each id (restarts it when the id is already waiting)."""
        self._impl.add(_u64(ids, "ids", nonzero=True))

    def touch(self, ids: Any) -> None:
        """Restarts the timeout of the ids that are waiting; others are ignored."""
        self._impl.touch(_u64(ids, "ids", nonzero=True))

    def discard(self, ids: Any) -> None:
        """Cancels the timeout of the ids; absent ids are ignored."""
        self._impl.discard(_u64(ids, "ids", nonzero=True))

    def rotate(self) -> np.ndarray:
        """Advances one rotation; returns the expired ids (uint64, in no particular order)."""
        return self._impl.rotate()

    @property
    def nbytes(self) -> int:
        """Memory held by the wheel, in bytes."""
        return int(self._impl.nbytes())

    def __len__(self) -> int:
        return len(self._impl)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            return False
        v = int(key)
        return 0 < v <= _U64_MAX and bool(self._impl.contains(v))

    def __repr__(self) -> str:
        return (
            f"TimeoutWheel(num_buckets={self.num_buckets}, len={len(self)}, "
            f"backend={self.backend!r})"
        )


def new_ids(n: int, backend: str | None = None) -> np.ndarray:
    """``n`` random nonzero uint64 ids, practically never repeating (also across forked workers).

    >>> ids = new_ids(3)
    >>> ids.dtype.name, len(ids), bool(ids.all())
    ('uint64', 3, True)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return kernels.get_impl(backend).new_ids(int(n))


def anchor(
    in_src: Any,
    in_rec: Any,
    parent_index: Any,
    out_rec: Any = None,
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Anchors a batch's outputs to their input rows (Storm's anchoring, vectorized).

    Output ``j`` came from input row ``parent_index[j]``: it inherits that row's source id and
    gets a fresh record id (``out_rec``, drawn with ``new_ids`` unless given). Each input row
    yields one event, its own record id XOR its children's ids (a row without outputs is just
    acked), reduced per source id in order of first appearance (entries XORing to 0 are kept).
    Returns ``(out_src, out_rec, ev_src, ev_xor)``.

    >>> out_src, out_rec, ev_src, ev_xor = anchor([7, 7, 8], [1, 2, 3], [0, 0, 2], [4, 5, 6])
    >>> out_src.tolist(), ev_src.tolist(), ev_xor.tolist()   # 7: 1^4^5 ^ 2, 8: 3^6
    ([7, 7, 8], [7, 8], [2, 5])
    """
    src = _u64(in_src, "in_src", nonzero=True)
    rec = _u64(in_rec, "in_rec", nonzero=True)
    same_length(in_src=src, in_rec=rec)
    pi = as_index(parent_index, "parent_index", upper=len(src))
    if out_rec is not None:
        out = _u64(out_rec, "out_rec", nonzero=True)
        same_length(parent_index=pi, out_rec=out)
    else:
        out = None
    return kernels.get_impl(backend).anchor(src, rec, pi, out)


def parent_index(in_rec: Any, out_lineage: Any, backend: str | None = None) -> np.ndarray:
    """The position (int64) in ``in_rec`` of each output's lineage id.

    Raises ``LineageError`` naming the first output whose lineage id is 0 or not among
    ``in_rec``; ``ValueError`` when ``in_rec`` repeats an id.

    >>> parent_index([10, 20, 30], [30, 10, 10]).tolist()
    [2, 0, 0]
    """
    rec = _u64(in_rec, "in_rec", nonzero=True)
    lin = _u64(out_lineage, "out_lineage")
    idx = kernels.get_impl(backend).parent_index(rec, lin)
    bad = np.flatnonzero(idx < 0)
    if bad.size:
        j = int(bad[0])
        raise LineageError(
            f"output row {j} has lineage id {int(lin[j])}, which is not the _ft_rec of any "
            "input row of this batch (keep the _ft_rec column on every output row)"
        )
    return idx


def xor_reduce(src: Any, values: Any, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One event per distinct source id: ``(src_unique, xor)`` in order of first appearance.

    >>> s, x = xor_reduce([4, 9, 4], [1, 2, 3])
    >>> s.tolist(), x.tolist()
    ([4, 9], [2, 2])
    """
    s = _u64(src, "src", nonzero=True)
    v = _u64(values, "values")
    same_length(src=s, values=v)
    return kernels.get_impl(backend).xor_reduce(s, v)


def derive_ids(
    origin: Any, parent: Any, ordinal: Any, salt: int, backend: str | None = None
) -> np.ndarray:
    """Deterministic nonzero ids from (origin id, parent id, output ordinal, stage salt).

    The same inputs give the same ids in every process and backend (no per-process seed), so a
    replayed record's outputs get the ids they had the first time (idempotent sinks). ``salt``
    is any int in [-2**63, 2**64), taken modulo 2**64.

    >>> a = derive_ids([1, 1], [2, 2], [0, 1], salt=42)
    >>> bool(a.all()), a[0] != a[1], (a == derive_ids([1, 1], [2, 2], [0, 1], 42)).all()
    (True, np.True_, np.True_)
    """
    o = _u64(origin, "origin", nonzero=True)
    p = _u64(parent, "parent", nonzero=True)
    k = _u64(ordinal, "ordinal")
    same_length(origin=o, parent=p, ordinal=k)
    if isinstance(salt, bool) or not isinstance(salt, (int, np.integer)):
        raise TypeError(f"salt must be an int, got {type(salt).__name__}")
    s = int(salt)
    if not -(1 << 63) <= s <= _U64_MAX:
        raise ValueError(f"salt must be in [-2**63, 2**64), got {s}")
    return kernels.get_impl(backend).derive_ids(o, p, k, s & _U64_MAX)
