"""``lineage.select_expr``: ``selectExpr`` with the expressions sent to the JVM as one string
(a few py4j round trips instead of one per expression). Plain ``selectExpr`` is the oracle:
the same columns, types, rows and errors."""

from __future__ import annotations

import pytest

from xorack.spark.lineage import select_expr

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

pytestmark = pytest.mark.spark


def _frame(spark):
    return spark.createDataFrame(
        [(1, "a", 2.5, None), (2, "b`c", -1.0, "x")], "id long, `s.t` string, v double, w string"
    )


@pytest.mark.parametrize(
    "exprs",
    [
        ["id", "`s.t`", "v", "w"],  # by name, a dotted name quoted
        ["id * 2 AS d", "upper(`s.t`) AS `u p`", "v", "coalesce(w, 'none') AS w", "1L AS one"],
        ["id", "v"],  # short: PySpark's own call
        ["id", "'a\u0001b' AS sep", "v", "w"],  # the separator in an expression: PySpark's own
        ["*", "id + 1 AS n", "v", "w AS w2"],
    ],
)
def test_select_expr_equals_select_expr(spark, exprs):
    df = _frame(spark)
    got, want = select_expr(df, exprs), df.selectExpr(*exprs)
    assert got.schema == want.schema
    assert got.collect() == want.collect()


def test_select_expr_raises_spark_s_own_error(spark):
    from pyspark.errors import AnalysisException

    df = _frame(spark)
    with pytest.raises(AnalysisException, match="UNRESOLVED_COLUMN"):
        select_expr(df, ["id", "v", "w", "nope"])


def test_select_kept_equals_select_on_every_frame_it_is_reused_for(spark):
    """The column list built for the first frame selects the same as ``df.select`` from later
    frames of the same columns and other rows (each select resolves the Columns anew)."""
    from pyspark.sql import functions as F

    from xorack.spark.lineage import select_kept

    built = []

    def columns():
        built.append(1)
        return ["id", F.upper(F.col("`s.t`")).alias("u"), (F.col("v") * 2).alias("v2"), "w"]

    cache: dict = {}
    first = _frame(spark)
    later = spark.createDataFrame(
        [(7, "z", 0.5, "y"), (8, None, None, None)], "id long, `s.t` string, v double, w string"
    )
    for df in (first, later, later.where("id = 8")):
        got, want = select_kept(df, cache, "k", columns), df.select(*columns())
        assert got.schema == want.schema
        assert got.collect() == want.collect()
    assert len(built) == 4  # once for the cache, and once per frame for the oracle above


def test_with_pending_adds_the_pending_columns_as_with_columns_did(spark):
    """``with_pending`` (one kept select) against ``withColumns``, the call it replaces: the
    same names, order, types, nullability and values, on two frames in turn."""
    from pyspark.sql import functions as F

    from xorack.spark.lineage import EV, KEEP, REC, SRC
    from xorack.spark.rows import with_pending

    for rows in ([(1, "a", 5, 6)], [(2, None, 7, 8), (3, "c", 9, 10)]):
        df = spark.createDataFrame(rows, f"id long, `s.t` string, {SRC} long, {REC} long")
        got = with_pending(df)
        want = df.withColumns({EV: F.lit(0).cast("long"), KEEP: F.lit(True)})
        assert got.schema == want.schema
        assert got.collect() == want.collect()


class _RoundTrips:
    """Counts the py4j round trips made inside the ``with`` block (every command sent)."""

    def __enter__(self):
        from py4j import clientserver, java_gateway

        self.n = 0
        self._patched = []
        for cls in (clientserver.ClientServerConnection, java_gateway.GatewayConnection):
            orig = cls.send_command

            def counted(conn, command, *a, _orig=orig, **k):
                self.n += 1
                return _orig(conn, command, *a, **k)

            cls.send_command = counted
            self._patched.append((cls, orig))
        return self

    def __exit__(self, *exc):
        for cls, orig in self._patched:
            cls.send_command = orig


def test_a_tracked_select_with_a_generator_sends_its_columns_once(spark):
    """A stream builds each operation's tracked translation every micro-batch: after the
    first, a select with ``explode`` costs a handful of py4j round trips (its kept column
    list, two SQL projections, the frame's schema), not one per column and expression (127
    before they were kept; 9 after), and selects the same rows."""
    from pyspark.sql import functions as F

    from xorack.spark.lineage import EV, KEEP, REC, SRC
    from xorack.spark.ops import Select

    op = Select((F.col("id"), F.explode(F.split("line", " ")).alias("word")), "split")
    schema = f"id long, line string, {SRC} long, {REC} long, {EV} long, {KEEP} boolean"
    first = spark.createDataFrame([(1, "a b", 11, 12, 0, True)], schema)
    later = spark.createDataFrame(
        [(2, "c d e", 21, 22, 0, True), (3, "f", 31, 32, 0, False)], schema
    )
    want = {r.word for r in op.apply(first, True).collect() if r[KEEP]}
    assert want == {"a", "b"}
    assert later.columns[:2] == ["id", "line"]  # its schema asked first, as a round has it
    with _RoundTrips() as trips:
        out = op.apply(later, True)
    assert trips.n <= 12, trips.n
    # the ghost's (record 3) row stays a ghost; the live record's three words are children
    rows = out.collect()
    assert sorted(r.word for r in rows if r[KEEP]) == ["c", "d", "e"]
    assert [r[KEEP] for r in rows if r.id == 3 or r.word is None] == [False]


def test_a_window_emission_keeps_its_lists_and_equals_plain_spark(spark):
    """``WindowSpec.emit`` (the windows ending in ``(lo, hi]``, rows at or behind their
    ``_ft_wm`` left out) equals plain Spark's aggregation of the same rows, and a second
    emission sends its conditions as SQL text and its column lists kept: a few py4j round
    trips (9; 256 when they were Column trees built every time)."""
    import datetime as dt

    from pyspark.sql import functions as F

    from xorack.spark.windows import WM, WindowSpec

    spec = WindowSpec(
        (F.window("ts", "10 seconds"), "word"),
        0,
        "window",
        "ts",
        (F.count("*").alias("n"), F.max("v").alias("top")),
        ("window", "word", "n", "top"),
    )
    t0 = dt.datetime(2026, 11, 29, 12, 0, 0)
    rows = [
        (t0 + dt.timedelta(seconds=s), w, v, t0 + dt.timedelta(seconds=late))
        for s, w, v, late in [
            (1, "a", 1, 0),
            (3, "a", 5, 0),
            (4, "b", 2, 0),
            (12, "a", 7, 0),
            (14, "b", 3, 20),  # staged behind its watermark: late, left out
            (25, "a", 9, 0),  # its window ends past hi
        ]
    ]
    df = spark.createDataFrame(rows, f"ts timestamp, word string, v long, {WM} timestamp")
    # the windows ending at 10 s and 20 s (t0 in microseconds as Spark reads it)
    lo = df.select(F.unix_micros(F.min("ts"))).first()[0] - 1_000_000
    hi = lo + 20_000_000
    plain = (
        df.where(F.col("ts") < t0 + dt.timedelta(seconds=20))
        .where(~((F.col("word") == "b") & (F.col("v") == 3)))
        .groupBy(F.window("ts", "10 seconds"), "word")
        .agg(F.count("*").alias("n"), F.max("v").alias("top"))
    )
    first = spec.emit(df, lo, hi)
    assert first.columns == ["window", "word", "n", "top"]
    assert sorted(first.collect()) == sorted(plain.collect())
    with _RoundTrips() as trips:
        again = spec.emit(df, lo, hi)
    assert trips.n <= 10, trips.n
    assert sorted(again.collect()) == sorted(plain.collect())


def test_map_in_arrow_kept_equals_map_in_arrow_on_every_frame_and_builds_once(spark):
    """A kept ``mapInArrow`` (the source tagger's, every round) gives plain ``mapInArrow``'s
    rows on each frame it is reused for; after the first it costs a few py4j round trips
    (PySpark's own call made 20 and more)."""
    from xorack.spark.lineage import map_in_arrow_kept

    class _Doubler:
        """A ``mapInArrow`` function equal to every other instance (a kept UDF is found by
        it); local, so that cloudpickle sends it by value to the Python workers."""

        def __eq__(self, other):
            return isinstance(other, _Doubler)

        def __hash__(self):
            return 7

        def __call__(self, batches):
            import pyarrow as pa
            import pyarrow.compute as pc

            for b in batches:
                yield pa.RecordBatch.from_arrays(
                    [pc.multiply(b.column("id"), 2), b.column("w")], names=["id", "w"]
                )

    schema = "id long, w string"
    cache: dict = {}
    first = _frame(spark).select("id", "w")
    later = spark.createDataFrame([(5, "e"), (6, None), (7, "g")], schema)
    for df in (first, later):
        want = df.mapInArrow(_Doubler(), schema).collect()
        assert sorted(want, key=str) == sorted(((r.id * 2, r.w) for r in df.collect()), key=str)
        if df is later:
            assert df.columns == ["id", "w"]  # its schema asked first, as a round has it
            with _RoundTrips() as trips:
                out = map_in_arrow_kept(df, cache, _Doubler(), schema)
            assert trips.n <= 4, trips.n
        else:
            out = map_in_arrow_kept(df, cache, _Doubler(), schema)
        assert out.columns == ["id", "w"]
        assert sorted(out.collect(), key=str) == sorted(want, key=str)
    assert len(cache) == 1
    with _RoundTrips() as trips:  # what PySpark's own call costs
        later.mapInArrow(_Doubler(), schema)
    assert trips.n >= 20, trips.n
