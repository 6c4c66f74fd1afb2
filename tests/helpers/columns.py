"""Random Arrow columns of every type Spark-exact hashing supports, with edge values and nulls:
what both the kernel tests (``test_spark_hash.py``: native == fallback == the scalar reference)
and the Spark oracle (``test_spark_hash_oracle.py``) hash."""

from __future__ import annotations

import decimal
import random

import numpy as np
import pyarrow as pa

# Arrow types whose Spark counterpart exists (the oracle test creates Spark columns of them).
SPARK_KINDS = [
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "float32",
    "float64",
    "string",
    "large_string",
    "binary",
    "large_binary",
    "date32",
    "timestamp",
    "timestamp_tz",
    "decimal_small",
    "decimal_large",
    "null",
]
# Arrow types hashed as some Spark type they convert to (checked here against that type).
EXTRA_KINDS = [
    "uint8",
    "uint16",
    "uint32",
    "fixed_size_binary",
    "string_view",
    "dictionary",
    "timestamp_ms",
    "timestamp_ns",
    "decimal64",
]
ALL_KINDS = SPARK_KINDS + EXTRA_KINDS

_INT_TYPES = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
}
_CHARS = "abcXYZ019 _-é漢字😀\u00ff\x00"
_FLOAT_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.0, -1.0, 5e-324]


def _strings(r: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        length = (
            r.choice([0, 1, 2, 3, 4, 5, 7, 8, 13, 16, 31])
            if r.random() < 0.9
            else (r.randrange(100, 700))
        )
        out.append("".join(r.choice(_CHARS) for _ in range(length)))
    return out


def _unscaled(r: random.Random, digits: int, n: int) -> list[int]:
    top = 10**digits - 1
    special = [
        0,
        1,
        -1,
        127,
        128,
        -128,
        -129,
        255,
        256,
        -256,
        2**63 - 1,
        -(2**63),
        2**63,
        2**64,
        -(2**64) - 1,
        top,
        -top,
    ]
    vals = [v for v in special if -top <= v <= top]
    while len(vals) < n:
        d = r.randrange(1, digits + 1)
        vals.append(r.randrange(-(10**d) + 1, 10**d))
    r.shuffle(vals)
    return vals[:n]


def random_column(kind: str, n: int, seed: int, null_frac: float = 0.2) -> pa.Array:
    """A random Arrow column of ``kind`` with edge values and about ``null_frac`` nulls."""
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    mask = rng.random(n) < null_frac
    if kind in _INT_TYPES:
        t = _INT_TYPES[kind]
        info = np.iinfo(t.to_pandas_dtype())
        v = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np.int64)
        v[: min(n, 4)] = [info.min, info.max, 0, -1 if info.min < 0 else 1][: min(n, 4)]
        return pa.array(v.astype(t.to_pandas_dtype()), type=t, mask=mask)
    if kind == "bool":
        return pa.array(rng.random(n) < 0.5, mask=mask)
    if kind in ("float32", "float64"):
        dt = np.float32 if kind == "float32" else np.float64
        v = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dt)
        pick = rng.random(n) < 0.4
        v[pick] = rng.choice(_FLOAT_SPECIALS, size=int(pick.sum())).astype(dt)
        if n > 2:  # NaNs with other payloads and sign: Spark canonicalizes them
            bits = v.view(np.uint32 if dt == np.float32 else np.uint64)
            bits[0] = 0x7FC00001 if dt == np.float32 else 0x7FF0000000000001
            bits[1] = 0xFFC00000 if dt == np.float32 else 0xFFF8000000000000
        return pa.array(v, mask=mask)
    if kind in ("string", "large_string", "string_view", "dictionary"):
        vals = [None if m else s for s, m in zip(_strings(r, n), mask, strict=True)]
        if kind == "dictionary":
            return pa.array(vals).dictionary_encode()
        return pa.array(
            vals,
            type={
                "string": pa.string(),
                "large_string": pa.large_string(),
                "string_view": pa.string_view(),
            }[kind],
        )
    if kind in ("binary", "large_binary", "fixed_size_binary"):
        width = 5
        vals = [
            None
            if m
            else rng.integers(
                0,
                256,
                size=width if kind == "fixed_size_binary" else r.choice([0, 1, 3, 4, 9, 40, 300]),
                dtype=np.uint8,
            ).tobytes()
            for m in mask
        ]
        t = {
            "binary": pa.binary(),
            "large_binary": pa.large_binary(),
            "fixed_size_binary": pa.binary(width),
        }[kind]
        return pa.array(vals, type=t)
    if kind == "date32":
        return pa.array(rng.integers(-200_000, 200_000, n).astype(np.int32), pa.date32(), mask=mask)
    if kind in ("timestamp", "timestamp_tz"):
        v = rng.integers(-60_000_000_000_000_000, 250_000_000_000_000_000, n)
        tz = "Europe/Budapest" if kind == "timestamp_tz" else None
        return pa.array(v, pa.timestamp("us", tz=tz), mask=mask)
    if kind == "timestamp_ns":
        v = rng.integers(-(9 * 10**18), 9 * 10**18, n)
        return pa.array(v, pa.timestamp("ns"), mask=mask)
    if kind == "timestamp_ms":
        v = rng.integers(-60_000_000_000_000, 250_000_000_000_000, n)
        return pa.array(v, pa.timestamp("ms"), mask=mask)
    if kind in ("decimal_small", "decimal_large", "decimal64"):
        p, s = {"decimal_small": (18, 4), "decimal_large": (38, 6), "decimal64": (18, 4)}[kind]
        with decimal.localcontext(decimal.Context(prec=100)):
            vals = [
                None if m else decimal.Decimal(u).scaleb(-s)
                for u, m in zip(_unscaled(r, p, n), mask, strict=True)
            ]
        return pa.array(vals, pa.decimal64(p, s) if kind == "decimal64" else pa.decimal128(p, s))
    if kind == "null":
        return pa.nulls(n)
    raise AssertionError(kind)
