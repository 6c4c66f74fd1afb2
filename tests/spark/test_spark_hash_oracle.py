"""Real local Spark is the oracle: ``murmur3_hash`` against ``F.hash``, ``spark_partition_ids``
against ``spark_partition_id()`` after ``repartition(n, *cols)``, and ``route_keys`` placement,
on random data of every supported type (checks batched into few Spark jobs)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import xorack
from helpers.columns import EXTRA_KINDS, SPARK_KINDS, random_column
from xorack import hashing

pytestmark = pytest.mark.spark

N_ROWS = 700

# The Arrow type Spark gets for the kinds PySpark cannot take as they are (we hash the original).
_SPARK_SIDE_CAST = {
    "uint8": pa.int16(),
    "uint16": pa.int32(),
    "uint32": pa.int64(),
    "fixed_size_binary": pa.binary(),
    "string_view": pa.string(),
    "dictionary": pa.string(),
    "timestamp_ms": pa.timestamp("us"),
    "decimal64": pa.decimal128(18, 4),
    "large_string": pa.string(),
    "large_binary": pa.binary(),
}


def _spark_type(arrow_type: pa.DataType):
    from pyspark.sql import types as T

    if pa.types.is_timestamp(arrow_type):
        return T.TimestampType() if arrow_type.tz else T.TimestampNTZType()
    if pa.types.is_decimal(arrow_type):
        return T.DecimalType(arrow_type.precision, arrow_type.scale)
    simple = {
        pa.int8(): T.ByteType(),
        pa.int16(): T.ShortType(),
        pa.int32(): T.IntegerType(),
        pa.int64(): T.LongType(),
        pa.bool_(): T.BooleanType(),
        pa.float32(): T.FloatType(),
        pa.float64(): T.DoubleType(),
        pa.string(): T.StringType(),
        pa.binary(): T.BinaryType(),
        pa.date32(): T.DateType(),
        pa.null(): T.NullType(),
    }
    return simple[arrow_type]


@pytest.fixture(scope="module")
def data(spark):
    """(our Arrow columns by kind, the Spark DataFrame with the same values + a row id)."""
    from pyspark.sql import types as T

    ours = {
        k: random_column(k, N_ROWS, seed=1000 + i) for i, k in enumerate(SPARK_KINDS + EXTRA_KINDS)
    }
    spark_cols = {
        k: (c.cast(_SPARK_SIDE_CAST[k]) if k in _SPARK_SIDE_CAST else c) for k, c in ours.items()
    }
    table = pa.table({"row": pa.array(np.arange(N_ROWS), pa.int64()), **spark_cols})
    schema = T.StructType(
        [T.StructField("row", T.LongType())]
        + [T.StructField(k, _spark_type(c.type)) for k, c in spark_cols.items()]
    )
    df = spark.createDataFrame(table, schema=schema)
    assert [f.dataType for f in df.schema.fields] == [f.dataType for f in schema.fields]
    return ours, df


MULTI_KEYS = [
    ("int32", "string"),
    ("decimal_large", "timestamp_tz", "float32", "null", "binary"),
    ("int8", "bool", "date32", "decimal_small", "float64", "timestamp", "large_string"),
    tuple(SPARK_KINDS),
]


def test_spark_hash_design_vectors(spark):
    from pyspark.sql import functions as F

    row = (
        spark.range(1)
        .select(
            F.hash(F.lit(5).cast("long")),
            F.hash(F.lit(5).cast("int")),
            F.hash(F.lit(0).cast("int")),
            F.hash(F.lit(None)),
            F.hash(F.lit("Spark")),
            F.hash(F.lit(0.0)),
            F.hash(F.lit(-0.0)),
        )
        .collect()[0]
    )
    assert list(row) == [1607884268, 1023896466, 933211791, 42, 228093765, -1670924195, -1670924195]


def test_murmur3_hash_equals_spark_hash(data):
    from pyspark.sql import functions as F

    ours, df = data
    exprs = [F.hash(k).alias(k) for k in ours]
    exprs += [F.hash(*keys).alias(f"multi{i}") for i, keys in enumerate(MULTI_KEYS)]
    got = df.select("row", *exprs).toArrow().sort_by("row")
    for k, col in ours.items():
        for backend in ("native", "python") if xorack.kernels.native_available() else ("python",):
            np.testing.assert_array_equal(
                xorack.murmur3_hash(col, backend=backend), got[k].to_numpy(), err_msg=k
            )
    for i, keys in enumerate(MULTI_KEYS):
        np.testing.assert_array_equal(
            xorack.murmur3_hash([ours[k] for k in keys]),
            got[f"multi{i}"].to_numpy(),
            err_msg=str(keys),
        )


PARTITION_CASES = [
    (("int64",), 16),
    (("string",), 7),
    (("decimal_large",), 5),
    (("float32", "timestamp_tz"), 3),
    (("uint32", "dictionary", "decimal64", "timestamp_ms", "timestamp_ns"), 200),
    (MULTI_KEYS[2], 11),
    (MULTI_KEYS[3], 1),
]


@pytest.mark.parametrize(("keys", "n"), PARTITION_CASES, ids=lambda x: str(x)[:40])
def test_spark_partition_ids_equal_spark_repartition(data, keys, n):
    from pyspark.sql import functions as F

    ours, df = data
    got = (
        df.repartition(n, *keys)
        .select("row", F.spark_partition_id().alias("pid"))
        .toArrow()
        .sort_by("row")
    )
    assert len(got) == N_ROWS
    np.testing.assert_array_equal(
        xorack.spark_partition_ids([ours[k] for k in keys], n), got["pid"].to_numpy()
    )


@pytest.mark.parametrize("n", [13, 64])
def test_route_keys_place_rows_on_their_target(spark, n):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    rng = np.random.default_rng(n)
    target = rng.integers(0, n, 500).astype(np.int32)
    route = hashing.route_keys(n)[target]
    table = pa.table({"target": target, "_ft_route": route})
    schema = T.StructType(
        [T.StructField("target", T.IntegerType()), T.StructField("_ft_route", T.IntegerType())]
    )
    got = (
        spark.createDataFrame(table, schema=schema)
        .repartition(n, F.col("_ft_route"))
        .select("target", F.spark_partition_id().alias("pid"))
        .toArrow()
    )
    assert len(got) == 500
    np.testing.assert_array_equal(got["target"].to_numpy(), got["pid"].to_numpy())


def test_pandas_input_hashes_as_spark_create_data_frame(spark):
    """A pandas DataFrame hashes as Spark hashes ``spark.createDataFrame`` of it (float NaN
    becomes null there, and so here)."""
    pd = pytest.importorskip("pandas")
    from pyspark.sql import functions as F

    pdf = pd.DataFrame(
        {
            "f": [np.nan, 1.5, -0.0, 2.0],
            "i": [1, 2, 3, -(2**40)],
            "s": ["a", None, "é", ""],
            "b": [True, False, True, None],
        }
    )
    rows = (
        spark.createDataFrame(pdf)
        .select(F.monotonically_increasing_id().alias("order"), F.hash("f"), F.hash(*pdf.columns))
        .orderBy("order")
        .collect()
    )
    assert [r[1] for r in rows] == xorack.murmur3_hash(pdf["f"]).tolist()
    assert [r[2] for r in rows] == xorack.murmur3_hash(pdf).tolist()
