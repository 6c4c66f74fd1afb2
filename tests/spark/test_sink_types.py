"""Spark's common column types through ``SQLiteSink``: pandas in → SQLite → ``read()`` back with
the same values and dtypes; unsupported types rejected when the sink is created (pipeline build),
not record by record; and a real Spark pipeline writing them."""

from __future__ import annotations

import datetime as dt
import decimal
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle
from pyspark.sql import types as T

from xorack.spark import SQLiteSink
from xorack.spark.schema import parse_ddl_schema
from xorack.spark.sink_types import UnsupportedSinkType, check_sink_schema

cloudpickle.register_pickle_by_value(sys.modules[__name__])

D = decimal.Decimal

SCHEMA = T.StructType(
    [
        T.StructField("n", T.LongType()),
        T.StructField("x", T.DoubleType()),
        T.StructField("s", T.StringType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("day", T.DateType()),
        T.StructField("price", T.DecimalType(38, 18)),
        T.StructField("blob", T.BinaryType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("counts", T.MapType(T.StringType(), T.LongType())),
        T.StructField("by_id", T.MapType(T.IntegerType(), T.StringType())),
        T.StructField("point", T.StructType([T.StructField("a", T.LongType())])),
    ]
)


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "n": np.array([1, -(2**62)], dtype=np.int64),
            "x": [0.5, float("-inf")],
            "s": ["ü", ""],
            "ok": [True, False],
            "ts": pd.to_datetime(["2024-01-02 03:04:05.123456", "1970-01-01 00:00:00.000000"]),
            "day": [dt.date(2024, 2, 29), dt.date(1, 1, 1)],
            "price": [D("12345678901234567890.123456789012345678"), D("-0.000000000000000001")],
            "blob": [b"\x00\xff", b""],
            "tags": [np.array(["a", "b"], dtype=object), np.array([], dtype=object)],
            "counts": [{"a": 1}, {}],
            "by_id": [{1: "one", 2: "two"}, {}],
            "point": [{"a": 3}, {"a": None}],
        }
    )


def _expected_back(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["tags"] = [list(v) for v in frame["tags"]]  # JSON arrays come back as lists
    return out


@pytest.mark.parametrize("declared", ["schema", "inferred"])
def test_common_types_round_trip_with_their_dtypes(tmp_path, declared):
    sink = SQLiteSink(
        str(tmp_path / "out.db"), "t", schema=SCHEMA if declared == "schema" else None
    )
    frame = _frame()
    sink.create(list(frame.columns))
    w = sink.open_writer(0)
    assert w.write(frame, np.array([1, 2], dtype=np.uint64)) == 0
    assert w.write(frame.iloc[:1], np.array([1], dtype=np.uint64)) == 1  # still idempotent
    w.close()
    back = sink.read()
    pd.testing.assert_frame_equal(back, _expected_back(frame))
    assert back["ts"].dtype == "datetime64[ns]"
    assert back["ok"].dtype == bool
    assert isinstance(back["day"][0], dt.date)
    assert isinstance(back["price"][0], decimal.Decimal)
    assert back["by_id"][0] == {1: "one", 2: "two"}  # integer map keys stay integers


def test_nulls_round_trip_as_nullable_types(tmp_path):
    sink = SQLiteSink(str(tmp_path / "out.db"), "t", schema=SCHEMA)
    frame = _frame()
    frame = frame.astype(object)
    frame.iloc[1] = [None] * frame.shape[1]
    sink.create(list(frame.columns))
    w = sink.open_writer(0)
    w.write(frame, np.array([1, 2], dtype=np.uint64))
    w.close()
    back = sink.read()
    assert back["n"].dtype == "Int64"
    assert back["ok"].dtype == "boolean"
    assert back.iloc[1].isna().all()
    assert back["price"][0] == _frame()["price"][0]
    assert back["ts"][0] == _frame()["ts"][0]


def test_timezone_aware_timestamps_come_back_in_utc(tmp_path):
    sink = SQLiteSink(str(tmp_path / "out.db"), "t")
    stamps = pd.to_datetime(["2024-06-01 12:00:00"]).tz_localize("Europe/Paris")
    sink.create(["at"])
    w = sink.open_writer(0)
    w.write(pd.DataFrame({"at": stamps}), np.array([1], dtype=np.uint64))
    w.close()
    back = sink.read()["at"]
    assert str(back.dtype) == "datetime64[ns, UTC]"
    assert back[0] == stamps[0]


@pytest.mark.parametrize(
    ("data_type", "shown"),
    [
        (T.DayTimeIntervalType(), "interval day to second"),
        (T.CalendarIntervalType(), "interval"),
        (T.ArrayType(T.YearMonthIntervalType()), "interval year to month"),
        (T.VariantType(), "variant"),
    ],
)
def test_unsupported_types_are_rejected_when_the_sink_is_created(tmp_path, data_type, shown):
    schema = T.StructType([T.StructField("ok", T.LongType()), T.StructField("bad", data_type)])
    with pytest.raises(UnsupportedSinkType, match=f"'bad' has the Spark type {shown}.*cast"):
        check_sink_schema(schema)
    sink = SQLiteSink(str(tmp_path / "out.db"), "t")
    with pytest.raises(UnsupportedSinkType):
        sink.create(["ok", "bad"], schema=schema)
    assert not (tmp_path / "out.db").exists()


def test_create_with_columns_only_still_works(tmp_path):
    sink = SQLiteSink(str(tmp_path / "out.db"), "t")
    sink.create(["word"])
    w = sink.open_writer(0)
    w.write(pd.DataFrame({"word": ["a"]}), None)
    w.close()
    assert sink.read()["word"].tolist() == ["a"]


# ---- with Spark ---------------------------------------------------------------------------


@pytest.mark.spark
def test_parse_ddl_schema_uses_public_api(spark):
    st = parse_ddl_schema(spark, "sid long, price decimal(10,2), tags array<string>")
    assert isinstance(st, T.StructType)
    assert st.fieldNames() == ["sid", "price", "tags"]
    assert st["price"].dataType == T.DecimalType(10, 2)
    with pytest.raises(ValueError, match="must describe columns"):
        parse_ddl_schema(spark, "int")
    with pytest.raises(ValueError, match="cannot parse the schema"):
        parse_ddl_schema(spark, "a long,, b")


def _identity(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf


@pytest.mark.spark
@pytest.mark.parametrize("ft", [True, False])
def test_a_spark_pipeline_stores_common_types_and_reads_them_back(spark, tmp_path, ft):
    from xorack.spark import Pipeline

    ddl = (
        "id long, ok boolean, ts timestamp, day date, price decimal(20,4), blob binary, "
        "tags array<string>, counts map<string,long>, point struct<a:long,b:string>"
    )
    rows = [
        (
            i,
            i % 2 == 0,
            dt.datetime(2024, 1, 1, 0, 0, i, 1000 * i),
            dt.date(2024, 1, 1 + i),
            D(f"{i}.0{i}00"),
            bytes([i, 255]),
            [f"t{i}", "x"],
            {"k": i},
            (i, f"p{i}"),
        )
        for i in range(6)
    ]
    df = spark.createDataFrame(rows, ddl).repartition(2)
    sink = SQLiteSink(str(tmp_path / "types.db"), "t", schema=parse_ddl_schema(spark, ddl))
    p = Pipeline(spark, ft=ft)
    p.source(df, name="rows").map_in_pandas(_identity, ddl, name="same").sink(sink, name="out")
    report = p.run()
    assert report.lost in (0, None)
    back = sink.read().sort_values("id", ignore_index=True)
    spark_own = df.toPandas().sort_values("id", ignore_index=True)  # what Spark itself gives
    assert back["ts"].dtype == spark_own["ts"].dtype
    assert back["ok"].dtype == spark_own["ok"].dtype
    for c in ("id", "ok", "ts", "day", "price", "blob"):
        assert [bytes(v) if isinstance(v, bytearray) else v for v in spark_own[c]] == list(
            back[c]
        ), c
    assert back["tags"].tolist() == [list(v) for v in spark_own["tags"]]
    assert back["counts"].tolist() == spark_own["counts"].tolist()
    assert back["point"].tolist() == [dict(r) for r in spark_own["point"]]


def test_upsert_replaces_a_row_by_its_key_nulls_and_structs_equal(tmp_path):
    """``upsert`` (a stream's update mode): the row of each key of the given rows is replaced
    (a null key and a struct key match themselves), the other rows stay; one transaction."""
    sink = SQLiteSink(str(tmp_path / "u.db"), "u")
    sink.create(["w", "k", "n"])
    w0 = {"start": dt.datetime(2026, 1, 1), "end": dt.datetime(2026, 1, 1, 0, 0, 10)}
    w1 = {"start": dt.datetime(2026, 1, 1, 0, 0, 10), "end": dt.datetime(2026, 1, 1, 0, 0, 20)}
    first = pd.DataFrame({"w": [w0, w0, w1], "k": ["a", None, "a"], "n": [1, 2, 3]})
    assert sink.upsert(first, ["w", "k"]) == 3
    assert sink.upsert(pd.DataFrame({"w": [w0, w1], "k": [None, "b"], "n": [5, 7]}), ["w", "k"])
    got = sorted(
        (pd.Timestamp(r.w["start"]).second, r.k or "-", int(r.n))
        for r in sink.read().itertuples(index=False)
    )
    assert got == [(0, "-", 5), (0, "a", 1), (10, "a", 3), (10, "b", 7)]
    with pytest.raises(ValueError, match="keys"):
        sink.upsert(first, ["nope"])
