"""TPC-H queries and PageRank as xorack pipelines, against plain Spark (``xorack bench --tpch``).

Each query is written once with the DataFrame API over a :class:`Tables` and runs three ways,
interleaved in one session so that drift on a noisy machine hits them alike:

* ``plain``: the query over plain DataFrames, written with ``df.write.parquet``;
* ``ft off``: the same function through ``Pipeline(ft=False)`` (sources ``lineitem`` and, where
  the query reads it, ``orders``; the dimension tables stay plain DataFrames: lookup joins);
* ``ft on``: ``Pipeline(ft=True)`` into a ``ParquetSink``: nothing fails, so each phase should
  complete in one optimistic round.

The order of the three rotates from round to round, so that none always runs first (on files
not yet in the page cache) or always right after another variant read the same files.

Queries: TPC-H Q1, Q3, Q5, Q6, Q10, Q12, Q14, Q21 with the specification's validation parameters
(a sink keeps no order: ``ORDER BY`` is left out where there is no ``LIMIT``, and the rows are
compared sorted; a top-n breaks ties by its key). ``lineitem ⋈ orders`` is a tracked join (a
barrier); the dimensions join by column names. The data comes from ``tpchgen-cli`` (PyPI, in
the ``bench`` extra) as Parquet, generated once per scale factor into a cache directory.

PageRank: 5 iterations over a generated graph, each a lookup join of the tracked ranks with the
links (``src``, ``dst``, ``weight = 1 / out-degree``) and a sum per destination (an aggregate:
one phase per iteration), as Spark's ``pagerank.py`` (nodes without in-links drop out).

Every variant's result must equal plain Spark's (exactly for TPC-H, whose amounts are decimals;
within 1e-9 relative for PageRank's doubles): :class:`ResultMismatch` otherwise.

>>> sorted(QUERIES)
['pagerank', 'q1', 'q10', 'q12', 'q14', 'q21', 'q3', 'q5', 'q6']
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

#: the tables the queries read (``partsupp`` is not needed)
TABLES = ("lineitem", "orders", "customer", "nation", "region", "supplier", "part")
VARIANTS = ("plain", "ft off", "ft on")
PAGERANK_ITERATIONS = 5
PAGERANK_NODES_PER_SCALE = 200_000  # 20,000 nodes at scale factor 0.1


class ResultMismatch(AssertionError):
    """A variant's result differs from plain Spark's."""


class DataUnavailable(RuntimeError):
    """The TPC-H data cannot be generated (``tpchgen-cli`` missing or failing)."""


class Tables:
    """The inputs of one query run, by table name (``t.lineitem``): the tracked sources (or
    plain DataFrames) and the dimension tables (always plain DataFrames). Each is read on first
    use, so a query reads only its own tables, as it would in plain Spark.

    >>> Tables(lambda name: name.upper()).orders
    'ORDERS'
    """

    def __init__(self, read: Callable[[str], Any]) -> None:
        self._read = read
        self._frames: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name not in TABLES:
            raise AttributeError(f"no table {name!r}; the tables are {', '.join(TABLES)}")
        if name not in self._frames:
            self._frames[name] = self._read(name)
        return self._frames[name]


def _revenue() -> Any:
    from pyspark.sql import functions as F

    return F.col("l_extendedprice") * (1 - F.col("l_discount"))


def _in_range(col: str, start: date, end: date) -> Any:
    from pyspark.sql import functions as F

    return (F.col(col) >= F.lit(start)) & (F.col(col) < F.lit(end))


def _keyed(df: Any, renames: dict[str, str]) -> Any:
    """A dimension table with its key columns renamed to the fact's (a join by names)."""
    return df.withColumnsRenamed(renames)


def q1(t: Tables) -> Any:
    """Pricing summary report (the ``ORDER BY`` left to the reader)."""
    from pyspark.sql import functions as F

    rev = _revenue()
    return (
        t.lineitem.where(F.col("l_shipdate") <= F.lit(date(1998, 9, 2)))
        .groupBy("l_returnflag", "l_linestatus")
        .agg(
            F.sum("l_quantity").alias("sum_qty"),
            F.sum("l_extendedprice").alias("sum_base_price"),
            F.sum(rev).alias("sum_disc_price"),
            F.sum(rev * (1 + F.col("l_tax"))).alias("sum_charge"),
            F.avg("l_quantity").alias("avg_qty"),
            F.avg("l_extendedprice").alias("avg_price"),
            F.avg("l_discount").alias("avg_disc"),
            F.count("*").alias("count_order"),
        )
    )


def q3(t: Tables) -> Any:
    """Shipping priority: the 10 unshipped orders of the BUILDING segment with most revenue."""
    from pyspark.sql import functions as F

    day = date(1995, 3, 15)
    customers = _keyed(
        t.customer.where(F.col("c_mktsegment") == "BUILDING"), {"c_custkey": "o_custkey"}
    )
    orders = t.orders.where(F.col("o_orderdate") < F.lit(day)).join(
        customers.select("o_custkey"), "o_custkey"
    )
    items = t.lineitem.where(F.col("l_shipdate") > F.lit(day))
    return (
        items.join(orders, items["l_orderkey"] == orders["o_orderkey"])
        .groupBy("l_orderkey", "o_orderdate", "o_shippriority")
        .agg(F.sum(_revenue()).alias("revenue"))
        .orderBy(F.col("revenue").desc(), "o_orderdate", "l_orderkey")
        .limit(10)
    )


def q5(t: Tables) -> Any:
    """Local supplier volume: revenue per nation of ASIA from local suppliers, 1994."""
    from pyspark.sql import functions as F

    customers = _keyed(t.customer, {"c_custkey": "o_custkey"}).select("o_custkey", "c_nationkey")
    orders = t.orders.where(_in_range("o_orderdate", date(1994, 1, 1), date(1995, 1, 1)))
    orders = orders.join(customers, "o_custkey")
    suppliers = _keyed(t.supplier, {"s_suppkey": "l_suppkey", "s_nationkey": "c_nationkey"})
    nations = _keyed(t.nation, {"n_nationkey": "c_nationkey"}).join(
        _keyed(t.region.where(F.col("r_name") == "ASIA"), {"r_regionkey": "n_regionkey"}),
        "n_regionkey",
    )
    items = t.lineitem
    return (
        items.join(orders, items["l_orderkey"] == orders["o_orderkey"])
        .join(suppliers.select("l_suppkey", "c_nationkey"), ["l_suppkey", "c_nationkey"])
        .join(nations.select("c_nationkey", "n_name"), "c_nationkey")
        .groupBy("n_name")
        .agg(F.sum(_revenue()).alias("revenue"))
    )


def q6(t: Tables) -> Any:
    """Forecasting revenue change: a global aggregate over a filter."""
    from pyspark.sql import functions as F

    return t.lineitem.where(
        _in_range("l_shipdate", date(1994, 1, 1), date(1995, 1, 1))
        & F.col("l_discount").between(0.05, 0.07)
        & (F.col("l_quantity") < 24)
    ).agg(F.sum(F.col("l_extendedprice") * F.col("l_discount")).alias("revenue"))


def q10(t: Tables) -> Any:
    """Returned item reporting: the 20 customers with most revenue lost to returns."""
    from pyspark.sql import functions as F

    customers = _keyed(t.customer, {"c_custkey": "o_custkey"}).join(
        _keyed(t.nation, {"n_nationkey": "c_nationkey"}).select("c_nationkey", "n_name"),
        "c_nationkey",
    )
    orders = t.orders.where(_in_range("o_orderdate", date(1993, 10, 1), date(1994, 1, 1)))
    orders = orders.join(customers, "o_custkey")
    items = t.lineitem.where(F.col("l_returnflag") == "R")
    return (
        items.join(orders, items["l_orderkey"] == orders["o_orderkey"])
        .groupBy("o_custkey", "c_name", "c_acctbal", "c_phone", "n_name", "c_address", "c_comment")
        .agg(F.sum(_revenue()).alias("revenue"))
        .orderBy(F.col("revenue").desc(), "o_custkey")
        .limit(20)
    )


def q12(t: Tables) -> Any:
    """Shipping modes and order priority: high and low priority lines per ship mode, 1994."""
    from pyspark.sql import functions as F

    items = t.lineitem.where(
        F.col("l_shipmode").isin("MAIL", "SHIP")
        & (F.col("l_commitdate") < F.col("l_receiptdate"))
        & (F.col("l_shipdate") < F.col("l_commitdate"))
        & _in_range("l_receiptdate", date(1994, 1, 1), date(1995, 1, 1))
    )
    high = F.col("o_orderpriority").isin("1-URGENT", "2-HIGH")
    return (
        items.join(t.orders, items["l_orderkey"] == t.orders["o_orderkey"])
        .groupBy("l_shipmode")
        .agg(
            F.sum(F.when(high, 1).otherwise(0)).alias("high_line_count"),
            F.sum(F.when(high, 0).otherwise(1)).alias("low_line_count"),
        )
    )


def q14(t: Tables) -> Any:
    """Promotion effect: the share of revenue from promoted parts, September 1995."""
    from pyspark.sql import functions as F

    parts = _keyed(t.part, {"p_partkey": "l_partkey"}).select("l_partkey", "p_type")
    items = t.lineitem.where(_in_range("l_shipdate", date(1995, 9, 1), date(1995, 10, 1)))
    promo = F.when(F.col("p_type").startswith("PROMO"), _revenue()).otherwise(0)
    return items.join(parts, "l_partkey").agg(
        (100.00 * F.sum(promo) / F.sum(_revenue())).alias("promo_revenue")
    )


def q21(t: Tables) -> Any:
    """Suppliers who kept orders waiting (SAUDI ARABIA): ``lineitem`` read twice — the late
    lines ``l1`` and the other suppliers' lines ``l2`` of the same order, a branch point.
    ``exists`` (another supplier) and ``not exists`` (another supplier late too) as one join:
    a late line is kept when it meets another supplier's line and none of them is late."""
    from pyspark.sql import functions as F

    late = F.col("l_receiptdate") > F.col("l_commitdate")
    nation = t.nation.where(F.col("n_name") == "SAUDI ARABIA").select(
        F.col("n_nationkey").alias("s_nationkey")
    )
    suppliers = _keyed(t.supplier, {"s_suppkey": "l_suppkey"}).join(nation, "s_nationkey")
    orders = t.orders.where(F.col("o_orderstatus") == "F").select(
        F.col("o_orderkey").alias("l_orderkey")
    )
    l1 = (
        t.lineitem.where(late)
        .join(orders, "l_orderkey", "left_semi")
        .join(suppliers.select("l_suppkey", "s_name"), "l_suppkey")
        .select("l_orderkey", "l_linenumber", "l_suppkey", "s_name")
        .alias("l1")
    )
    l2 = t.lineitem.select(
        F.col("l_orderkey").alias("l2_orderkey"),
        F.col("l_suppkey").alias("l2_suppkey"),
        F.when(late, 1).otherwise(0).alias("l2_late"),
    ).alias("l2")
    cond = (F.col("l1.l_orderkey") == F.col("l2.l2_orderkey")) & (
        F.col("l1.l_suppkey") != F.col("l2.l2_suppkey")
    )
    pairs = l1.join(l2, cond).select("l_orderkey", "l_linenumber", "s_name", "l2_late")
    waiting = (
        pairs.groupBy("l_orderkey", "l_linenumber", "s_name")
        .agg(F.max("l2_late").alias("others_late"))
        .where(F.col("others_late") == 0)
    )
    return (
        waiting.groupBy("s_name")
        .agg(F.count("*").alias("numwait"))
        .orderBy(F.col("numwait").desc(), "s_name")
        .limit(100)
    )


def pagerank(ranks: Any, links: Any, iterations: int = PAGERANK_ITERATIONS) -> Any:
    """``iterations`` of PageRank: each a join of the ranks with the links (``id``, ``dst``,
    ``weight``) and a sum of the contributions per destination."""
    from pyspark.sql import functions as F

    for _ in range(iterations):
        contributions = ranks.join(links, "id").select(
            F.col("dst").alias("id"), (F.col("rank") * F.col("weight")).alias("contribution")
        )
        ranks = (
            contributions.groupBy("id")
            .agg(F.sum("contribution").alias("total"))
            .select("id", (0.15 + 0.85 * F.col("total")).alias("rank"))
        )
    return ranks


#: query name -> (the function of a Tables, the tracked sources it reads)
TPCH_QUERIES: dict[str, tuple[Callable[[Tables], Any], tuple[str, ...]]] = {
    "q1": (q1, ("lineitem",)),
    "q3": (q3, ("lineitem", "orders")),
    "q5": (q5, ("lineitem", "orders")),
    "q6": (q6, ("lineitem",)),
    "q10": (q10, ("lineitem", "orders")),
    "q12": (q12, ("lineitem", "orders")),
    "q14": (q14, ("lineitem",)),
    "q21": (q21, ("lineitem",)),
}
QUERIES = (*TPCH_QUERIES, "pagerank")


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xorack/tpch`` (``~/.cache/xorack/tpch``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xorack" / "tpch"


def tpchgen_executable() -> str:
    """The ``tpchgen-cli`` executable: on ``PATH``, or next to this Python (a venv not
    activated)."""
    found = shutil.which("tpchgen-cli")
    if found:
        return found
    beside = Path(sys.executable).parent / "tpchgen-cli"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise DataUnavailable(
        "tpchgen-cli not found: install it with `pip install xorack[bench]` "
        "(or `pip install tpchgen-cli`)"
    )


def _scale_name(scale: float) -> str:
    return f"sf{scale:g}"


def tpch_data(scale: float, cache_dir: Path | None = None) -> Path:
    """The directory holding ``<table>.parquet`` for every table of :data:`TABLES` at ``scale``,
    generated by ``tpchgen-cli`` on first use (into a temporary directory, then renamed: an
    interrupted generation leaves nothing that looks complete)."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / _scale_name(scale)
    if all((target / f"{t}.parquet").is_file() for t in TABLES):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    try:
        cmd = [tpchgen_executable(), "parquet", "-s", f"{scale:g}", "--output-dir", str(work)]
        cmd += ["--tables", ",".join(TABLES), "--quiet"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DataUnavailable(f"tpchgen-cli failed ({done.returncode}): {done.stderr[-500:]}")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def pagerank_data(path: Path, nodes: int, seed: int = 11) -> tuple[str, str]:
    """A graph of ``nodes`` nodes, each linking to 1-8 others (some nodes get many links), as
    Parquet at ``path``: ``links`` (``id``, ``dst``, ``weight`` = 1 / out-degree of ``id``) and
    ``ranks`` (``id``, ``rank`` = 1.0). Returns their two paths."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if nodes < 2:
        raise ValueError(f"pagerank needs at least 2 nodes, got {nodes}")
    links_path, ranks_path = str(path / "links.parquet"), str(path / "ranks.parquet")
    if os.path.isfile(links_path) and os.path.isfile(ranks_path):
        return links_path, ranks_path
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    degree = rng.integers(1, 9, size=nodes)
    src = np.repeat(np.arange(nodes, dtype=np.int64), degree)
    dst = (rng.zipf(1.5, size=len(src)) * 7919 + rng.integers(0, nodes, size=len(src))) % nodes
    keep = dst != src  # no self-links; a node may lose some links, its weights follow
    src, dst = src[keep], dst[keep].astype(np.int64)
    out_degree = np.bincount(src, minlength=nodes)
    links = pa.table({"id": src, "dst": dst, "weight": 1.0 / out_degree[src]})
    ranks = pa.table({"id": np.arange(nodes, dtype=np.int64), "rank": np.ones(nodes)})
    pq.write_table(links, links_path + ".tmp")
    pq.write_table(ranks, ranks_path + ".tmp")
    os.replace(links_path + ".tmp", links_path)
    os.replace(ranks_path + ".tmp", ranks_path)
    return links_path, ranks_path


# ----------------------------------------------------------------------------------------------
# Running a query
# ----------------------------------------------------------------------------------------------


def _read(spark: Any, data: Path, table: str) -> Any:
    return spark.read.parquet(str(data / f"{table}.parquet"))


def plain_tables(spark: Any, data: Path) -> Tables:
    """Every table as a plain DataFrame."""
    return Tables(lambda t: _read(spark, data, t))


def tracked_tables(
    pipeline: Any,
    spark: Any,
    data: Path,
    sources: Sequence[str],
    around_lineitem: Callable[[Any], Any] | None = None,
) -> Tables:
    """``sources`` as tracked sources of ``pipeline`` (``lineitem`` passed through
    ``around_lineitem`` when given), the other tables plain."""

    def read(table: str) -> Any:
        frame = _read(spark, data, table)
        if table not in sources:
            return frame
        tracked = pipeline.source(frame, name=table)
        return around_lineitem(tracked) if around_lineitem and table == "lineitem" else tracked

    return Tables(read)


def run_plain(spark: Any, data: Path, query: str, out: str) -> None:
    """``query`` in plain Spark, written as Parquet to ``out``."""
    if query == "pagerank":
        links, ranks = data / "links.parquet", data / "ranks.parquet"
        result = pagerank(spark.read.parquet(str(ranks)), spark.read.parquet(str(links)))
    else:
        result = TPCH_QUERIES[query][0](plain_tables(spark, data))
    result.write.mode("overwrite").parquet(out)


def run_pipeline(
    spark: Any,
    data: Path,
    query: str,
    out: str,
    ft: bool,
    around_lineitem: Callable[[Any], Any] | None = None,
    **pipeline_options: Any,
) -> dict[str, Any]:
    """``query`` as an xorack pipeline into a ``ParquetSink`` at ``out``; its run report.
    ``around_lineitem`` (tests: a stage that fails rows) wraps the tracked ``lineitem`` (the
    ``ranks`` for PageRank) before the query reads it."""
    from .spark import ParquetSink, Pipeline

    p = Pipeline(spark, ft=ft, **pipeline_options)
    if query == "pagerank":
        links = spark.read.parquet(str(data / "links.parquet"))
        ranks = p.source(spark.read.parquet(str(data / "ranks.parquet")), name="ranks")
        result = pagerank(around_lineitem(ranks) if around_lineitem else ranks, links)
    else:
        fn, sources = TPCH_QUERIES[query]
        result = fn(tracked_tables(p, spark, data, sources, around_lineitem))
    result.sink(ParquetSink(out), name=query)
    report = p.run()
    if ft and (report.lost or report.dead_lettered):
        raise ResultMismatch(
            f"{query}: {report.lost} records lost, {report.dead_lettered} dead-lettered"
        )
    return report.as_dict()


def _rows(spark: Any, path: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    df = spark.read.parquet(path)
    return list(df.columns), sorted(tuple(r) for r in df.collect())


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def compare(spark: Any, query: str, expected: str, got: str) -> str | None:
    """None when the Parquet output at ``got`` equals the one at ``expected`` (same columns,
    same rows in any order; doubles within 1e-9 relative), else what differs."""
    cols_e, rows_e = _rows(spark, expected)
    cols_g, rows_g = _rows(spark, got)
    if cols_e != cols_g:
        return f"{query}: columns {cols_g} != plain Spark's {cols_e}"
    if len(rows_e) != len(rows_g):
        return f"{query}: {len(rows_g)} rows != plain Spark's {len(rows_e)}"
    if query == "pagerank":  # doubles summed in another order
        rows_e.sort(key=lambda r: r[0])
        rows_g.sort(key=lambda r: r[0])
    for e, g in zip(rows_e, rows_g, strict=True):
        if len(e) != len(g) or not all(_close(x, y) for x, y in zip(e, g, strict=True)):
            return f"{query}: row {g} != plain Spark's {e}"
    return None


def _slug(text: str) -> str:
    return text.replace(" ", "-").replace(",", "")


def run_queries(
    spark: Any,
    data: Path,
    queries: Sequence[str] = QUERIES,
    repeat: int = 3,
    warmup: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Each query's three variants, ``repeat`` times after ``warmup`` untimed rounds, interleaved
    (the three variants of each query in turn, in an order that rotates by round); medians,
    spreads, ratios, and whether each variant's result equals plain Spark's. ``data`` holds the
    TPC-H tables and the PageRank graph. Raises :class:`ResultMismatch` (after measuring) when
    a result differs."""
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        raise ValueError(f"unknown queries {unknown}; the queries are {', '.join(QUERIES)}")
    work = tempfile.mkdtemp(prefix="xorack-tpch-")
    seconds: dict[str, dict[str, list[float]]] = {q: {v: [] for v in VARIANTS} for q in queries}
    optimistic: dict[str, list[str]] = {q: [] for q in queries}
    try:
        for i in range(warmup + repeat):
            if progress:
                progress(
                    f"round {i + 1} of {warmup + repeat}" + (" (warm-up)" if i < warmup else "")
                )
            # each round starts with another variant: none is always first (cold caches)
            # or always right after another one that read the same files
            order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
            for q in queries:
                for v in order:
                    out = f"{work}/{q}-{_slug(v)}"
                    t0 = time.perf_counter()
                    if v == "plain":
                        run_plain(spark, data, q, out)
                    else:
                        report = run_pipeline(spark, data, q, out, ft=v == "ft on")
                        if v == "ft on":
                            optimistic[q] = list(report["tracked_phases"]) + list(
                                report["optimistic_fallbacks"]
                            )
                    if i >= warmup:
                        seconds[q][v].append(time.perf_counter() - t0)
        mismatches = {}
        for q in queries:
            for v in VARIANTS[1:]:
                diff = compare(spark, q, f"{work}/{q}-plain", f"{work}/{q}-{_slug(v)}")
                if diff is not None:
                    mismatches[f"{q} ({v})"] = diff
        per_query: dict[str, Any] = {}
        for q in queries:
            medians = {v: statistics.median(s) for v, s in seconds[q].items()}
            per_query[q] = {
                "seconds": seconds[q],
                "median": medians,
                "ft_on_over_plain": medians["ft on"] / medians["plain"],
                "ft_off_over_plain": medians["ft off"] / medians["plain"],
                "not_optimistic": optimistic[q],
                "matches": not any(k.startswith(f"{q} (") for k in mismatches),
            }
        return {"repeat": repeat, "warmup": warmup, "queries": per_query, "mismatches": mismatches}
    finally:
        shutil.rmtree(work, ignore_errors=True)
