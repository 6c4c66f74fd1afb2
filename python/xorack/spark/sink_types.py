"""Column types through a SQLite sink: Spark's common types in, the same pandas types out.

SQLite stores integers, reals, text and blobs. Each sink column gets a *kind* that says how its
values are stored and how :meth:`SQLiteSink.read` turns them back into what Spark hands pandas:

==============  =========================================  ====================================
kind            Spark types                                stored as → read back as
==============  =========================================  ====================================
``integer``     byte, short, int, long                     INTEGER → int64 (Int64 with nulls)
``real``        float, double                              REAL → float64
``text``        string, char, varchar                      TEXT → str
``boolean``     boolean                                    INTEGER 0/1 → bool (boolean w/ nulls)
``timestamp``   timestamp (session-local), timestamp_ntz   ISO-8601 TEXT → datetime64[ns]
``timestamptz`` (a tz-aware pandas column)                 ISO-8601 UTC TEXT → datetime64[ns, UTC]
``date``        date                                       ISO TEXT → ``datetime.date``
``decimal``     decimal(p, s)                              exact TEXT → ``decimal.Decimal``
``binary``      binary                                     BLOB → ``bytes``
``json``        array<…>, struct<…>                        JSON TEXT → lists / dicts
``map``         map<…, …>                                  JSON TEXT → dict
==============  =========================================  ====================================

Inside JSON, dates, timestamps and decimals are written as text and come back as text. Other
Spark types (intervals, variant, geometry, user-defined types, …) are rejected by
:func:`check_sink_schema` when the pipeline is built, with the cast to use instead.

>>> import pandas as pd, datetime
>>> frame = pd.DataFrame({"t": pd.to_datetime(["2024-01-02 03:04:05.000006"]), "ok": [True]})
>>> kinds = {c: infer_kind(frame[c]) for c in frame}
>>> kinds
{'t': 'timestamp', 'ok': 'boolean'}
>>> stored = {c: encode_column(frame[c], kinds[c]) for c in frame}
>>> stored
{'t': ['2024-01-02 03:04:05.000006'], 'ok': [1]}
>>> decode_frame(pd.DataFrame(stored), kinds).dtypes.astype(str).tolist()
['datetime64[ns]', 'bool']
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "KINDS",
    "UnsupportedSinkType",
    "check_sink_schema",
    "decode_frame",
    "encode_column",
    "infer_kind",
    "kind_of_spark_type",
    "sql_type",
]

#: kind → the declared SQLite column type (decimal stays TEXT: NUMERIC would round it to REAL).
KINDS: dict[str, str] = {
    "integer": "INTEGER",
    "real": "REAL",
    "text": "TEXT",
    "boolean": "INTEGER",
    "timestamp": "TEXT",
    "timestamptz": "TEXT",
    "date": "TEXT",
    "decimal": "TEXT",
    "binary": "BLOB",
    "json": "TEXT",
    "map": "TEXT",
}


class UnsupportedSinkType(TypeError):
    """A sink column whose Spark type the sink cannot store and read back."""


def sql_type(kind: str) -> str:
    """The SQLite column type of a kind.

    >>> sql_type("decimal")
    'TEXT'
    """
    return KINDS[kind]


# ---- Spark types → kinds (checked when the pipeline is built) --------------------------------

_ATOMIC = {
    "ByteType": "integer",
    "ShortType": "integer",
    "IntegerType": "integer",
    "LongType": "integer",
    "FloatType": "real",
    "DoubleType": "real",
    "StringType": "text",
    "CharType": "text",
    "VarcharType": "text",
    "BooleanType": "boolean",
    "TimestampType": "timestamp",
    "TimestampNTZType": "timestamp",
    "DateType": "date",
    "DecimalType": "decimal",
    "BinaryType": "binary",
}
_HINT = "cast it to a supported type first (e.g. .cast('string') or .cast('long'))"


def kind_of_spark_type(data_type: Any, column: str = "?") -> str:
    """The kind a Spark ``DataType`` is stored as; :class:`UnsupportedSinkType` names the column
    otherwise. Nested types are checked all the way down.

    >>> from pyspark.sql.types import ArrayType, DecimalType
    >>> kind_of_spark_type(DecimalType(20, 2)), kind_of_spark_type(ArrayType(DecimalType(5, 1)))
    ('decimal', 'json')
    """
    name = type(data_type).__name__
    if name in _ATOMIC:
        return _ATOMIC[name]
    if name == "ArrayType":
        _nested(data_type.elementType, column)
        return "json"
    if name == "StructType":
        for field in data_type.fields:
            _nested(field.dataType, f"{column}.{field.name}")
        return "json"
    if name == "MapType":
        _nested(data_type.keyType, column)
        _nested(data_type.valueType, column)
        return "map"
    shown = data_type.simpleString() if hasattr(data_type, "simpleString") else name
    raise UnsupportedSinkType(
        f"sink column {column!r} has the Spark type {shown}, which the SQLite sink cannot store "
        f"and read back; {_HINT}"
    )


def _nested(data_type: Any, column: str) -> None:
    kind_of_spark_type(data_type, column)


def check_sink_schema(struct_type: Any) -> dict[str, str]:
    """The kind of every column of a payload ``StructType``; raises
    :class:`UnsupportedSinkType` at once (when the pipeline is built) for a type the SQLite sink
    cannot store, naming the column and the type.

    >>> from pyspark.sql.types import StructType, StructField, DateType, DayTimeIntervalType
    >>> check_sink_schema(StructType([StructField("d", DateType())]))
    {'d': 'date'}
    >>> check_sink_schema(StructType([StructField("gap", DayTimeIntervalType())]))
    Traceback (most recent call last):
    ...
    xorack.spark.sink_types.UnsupportedSinkType: sink column 'gap' has the Spark type interval day to second, which the SQLite sink cannot store and read back; cast it to a supported type first (e.g. .cast('string') or .cast('long'))
    """  # noqa: E501
    fields = getattr(struct_type, "fields", None)
    if fields is None:
        raise TypeError(f"expected a pyspark StructType, got {type(struct_type).__name__}")
    return {f.name: kind_of_spark_type(f.dataType, f.name) for f in fields}


# ---- pandas columns → kinds (when no schema was given) ---------------------------------------


def infer_kind(series: pd.Series) -> str:
    """The kind of a pandas column from its dtype, or from its first non-null value for object
    columns (what Spark hands pandas for dates, decimals, binary and nested types).

    >>> import decimal
    >>> infer_kind(pd.Series([decimal.Decimal("1.5")])), infer_kind(pd.Series([[1, 2]]))
    ('decimal', 'json')
    """
    dtype = series.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        return "timestamptz"
    if pd.api.types.is_datetime64_dtype(dtype):
        return "timestamp"
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_integer_dtype(dtype):
        return "integer"
    if pd.api.types.is_float_dtype(dtype):
        return "real"
    values = series.dropna()
    first = values.iloc[0] if len(values) else None
    if first is None or isinstance(first, str):
        return "text"
    if isinstance(first, (bool, np.bool_)):
        return "boolean"
    if isinstance(first, (int, np.integer)):
        return "integer"
    if isinstance(first, (float, np.floating)):
        return "real"
    if isinstance(first, pd.Timestamp | dt.datetime):
        return "timestamptz" if first.tzinfo is not None else "timestamp"
    if isinstance(first, dt.date):
        return "date"
    if isinstance(first, decimal.Decimal):
        return "decimal"
    if isinstance(first, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(first, Mapping):
        return "map"
    return "json"  # lists, numpy arrays, tuples, Rows


# ---- encoding: pandas column → SQLite values ------------------------------------------------


def encode_column(series: pd.Series, kind: str) -> list[Any]:
    """The values of ``series`` as SQLite can bind them (None for nulls), stored as ``kind``.

    >>> encode_column(pd.Series([True, None], dtype=object), "boolean")
    [1, None]
    """
    if kind == "integer":  # a Spark int column with nulls reaches pandas as float64
        return [None if _isnull(v) else int(v) for v in series.tolist()]
    if kind in ("real", "text"):
        return [None if _isnull(v) else v for v in series.tolist()]
    if kind == "boolean":
        return [None if _isnull(v) else int(bool(v)) for v in series.tolist()]
    if kind in ("timestamp", "timestamptz"):
        stamps = pd.to_datetime(series)
        if kind == "timestamptz":
            stamps = stamps.dt.tz_convert("UTC") if stamps.dt.tz is not None else stamps
            fmt = "%Y-%m-%d %H:%M:%S.%f+00:00"
        else:
            if stamps.dt.tz is not None:  # a naive kind fed aware values: their UTC wall time
                stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
            fmt = "%Y-%m-%d %H:%M:%S.%f"
        text = stamps.dt.strftime(fmt)
        return [None if _isnull(v) else v for v in text.tolist()]
    if kind == "date":
        return [None if _isnull(v) else _date_text(v) for v in series.tolist()]
    if kind == "decimal":
        return [None if _isnull(v) else str(decimal.Decimal(v)) for v in series.tolist()]
    if kind == "binary":
        return [None if _isnull(v) else bytes(v) for v in series.tolist()]
    if kind == "json":
        return [None if _isnull(v) else _json(v) for v in series.tolist()]
    if kind == "map":
        return [None if _isnull(v) else _json_map(v) for v in series.tolist()]
    raise ValueError(f"unknown sink column kind {kind!r}: expected one of {sorted(KINDS)}")


def _isnull(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, (list, tuple, dict, np.ndarray, bytes, bytearray, str)):
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _date_text(v: Any) -> str:
    if isinstance(v, dt.datetime | pd.Timestamp):
        v = v.date()
    if isinstance(v, np.datetime64):
        v = pd.Timestamp(v).date()
    return v.isoformat() if isinstance(v, dt.date) else str(v)


def _plain(v: Any) -> Any:
    """A JSON-ready value: containers become lists and dicts, scalars Python scalars."""
    if isinstance(v, np.ndarray | list | tuple) and not hasattr(v, "asDict"):
        return [_plain(x) for x in v]
    if hasattr(v, "asDict"):  # pyspark Row
        return {k: _plain(x) for k, x in v.asDict(recursive=False).items()}
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dt.datetime | dt.date | pd.Timestamp):
        return v.isoformat()
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, float) and v != v:
        return None
    return v


def _json(v: Any) -> str:
    return json.dumps(_plain(v), ensure_ascii=False, separators=(",", ":"))


def _json_map(v: Any) -> str:
    """A JSON object when every key is a string, else a list of [key, value] pairs (so that
    integer keys come back as integers)."""
    items = list(v.items()) if isinstance(v, Mapping) else [tuple(p) for p in v]
    if all(isinstance(k, str) for k, _ in items):
        return _json(dict(items))
    return _json([[k, x] for k, x in items])


# ---- decoding: stored frame → the pandas types Spark gives ------------------------------------


def decode_frame(frame: pd.DataFrame, kinds: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` as read from SQLite with each column of a known kind turned back into its
    pandas type; columns without a kind are left as read.

    >>> decode_frame(pd.DataFrame({"d": ["2024-02-29"]}), {"d": "date"})["d"][0]
    datetime.date(2024, 2, 29)
    """
    out = {}
    for column in frame.columns:
        kind = kinds.get(column)
        out[column] = frame[column] if kind is None else _decode(frame[column], kind)
    return pd.DataFrame(out, index=frame.index)


def _decode(s: pd.Series, kind: str) -> pd.Series:
    present = s.notna()
    if kind == "integer":
        if present.all():
            return s.astype("int64")
        return s.astype("Int64")
    if kind == "real":
        return s.astype("float64")
    if kind == "text":
        return s.astype(object)
    if kind == "boolean":
        if present.all():
            return s.astype(bool)
        return s.map(lambda v: None if _isnull(v) else bool(v)).astype("boolean")
    if kind == "timestamp":
        return pd.to_datetime(s, format="ISO8601").astype("datetime64[ns]")
    if kind == "timestamptz":
        return pd.to_datetime(s, format="ISO8601", utc=True).astype("datetime64[ns, UTC]")
    if kind == "date":
        return s.map(lambda v: None if _isnull(v) else dt.date.fromisoformat(v)).astype(object)
    if kind == "decimal":
        return s.map(lambda v: None if _isnull(v) else decimal.Decimal(v)).astype(object)
    if kind == "binary":
        return s.map(lambda v: None if _isnull(v) else bytes(v)).astype(object)
    if kind == "json":
        return s.map(lambda v: None if _isnull(v) else json.loads(v)).astype(object)
    if kind == "map":
        return s.map(_load_map).astype(object)
    raise ValueError(f"unknown sink column kind {kind!r}: expected one of {sorted(KINDS)}")


def _load_map(v: Any) -> Any:
    if _isnull(v):
        return None
    loaded = json.loads(v)
    if isinstance(loaded, list):  # [key, value] pairs: keys that are not strings
        return {(tuple(k) if isinstance(k, list) else k): x for k, x in loaded}
    return loaded
