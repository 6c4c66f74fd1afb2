"""The demo's generated input: sentences of a fixed vocabulary, and the deterministic draws
that pick which sentences fail, are poisoned or lose words (the same answer for an id, a seed
and a draw's stream number everywhere: on the driver, in a Spark task, in a replay).

Shared by ``xorack demo`` (:mod:`xorack.demo`) and ``xorack demo --stream``
(:mod:`xorack.demo_stream`).

>>> make_sentences([3], seed=7) == make_sentences([3], seed=7)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "that",
        "the",
        "to",
        "was",
        "were",
        "with",
    ]
)
_CONTENT = [
    "acker",
    "anchor",
    "apache",
    "arrow",
    "batch",
    "bucket",
    "checksum",
    "cluster",
    "column",
    "driver",
    "event",
    "executor",
    "failure",
    "flight",
    "frame",
    "hash",
    "join",
    "key",
    "lineage",
    "memory",
    "node",
    "offset",
    "pandas",
    "partition",
    "persist",
    "pipeline",
    "python",
    "record",
    "replay",
    "rotate",
    "shuffle",
    "sink",
    "source",
    "spark",
    "stage",
    "storage",
    "stream",
    "task",
    "tensor",
    "timeout",
    "topology",
    "tuple",
    "vertex",
    "window",
    "worker",
    "xor",
]
VOCABULARY = tuple(sorted(STOP_WORDS)) + tuple(_CONTENT) + tuple(f"term{i}" for i in range(150))

_MAX_WORDS = 12
_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, vectorized (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def _draw(ids: Any, seed: int, stream: int) -> np.ndarray:
    """A deterministic uniform uint64 per id for (seed, stream)."""
    ids = np.asarray(ids, dtype=np.int64).view(_U64)
    with np.errstate(over="ignore"):
        return _mix(ids ^ _mix(np.full(len(ids), (seed << 8) + stream, dtype=_U64)))


def chosen(ids: Any, rate: float, seed: int, stream: int) -> np.ndarray:
    """True for the share ``rate`` of ids picked by (seed, stream); the same answer everywhere.

    >>> int(chosen(np.arange(10_000), 0.1, seed=1, stream=1).sum()) in range(900, 1100)
    True
    """
    if rate <= 0:
        return np.zeros(len(ids), dtype=bool)
    u = (_draw(ids, seed, stream) >> _U64(11)).astype(np.float64) / float(1 << 53)
    return u < rate


def make_sentences(ids: Any, seed: int) -> list[str]:
    """The sentence of each id: 3 to 12 words drawn from :data:`VOCABULARY` (deterministic).

    >>> make_sentences([0], 1) == make_sentences([0], 1)
    True
    """
    ids = np.asarray(ids, dtype=np.int64)
    n_words = 3 + (_draw(ids, seed, 0) % _U64(_MAX_WORDS - 2)).astype(np.int64)
    vocab = np.array(VOCABULARY, dtype=object)
    cols = [
        vocab[(_draw(ids, seed, 10 + j) % _U64(len(VOCABULARY))).astype(np.int64)]
        for j in range(_MAX_WORDS)
    ]
    words = np.stack(cols, axis=1) if len(ids) else np.empty((0, _MAX_WORDS), dtype=object)
    return [" ".join(row[:k]) for row, k in zip(words, n_words.tolist(), strict=True)]


#: the stream numbers of the failure draws (:func:`chosen`): first attempt fails, poisoned,
#: words lost in transit
FAIL, POISON, DROP = 1, 2, 3
