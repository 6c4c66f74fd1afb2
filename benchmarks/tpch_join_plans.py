"""The joins and exchanges of TPC-H queries' physical plans: plain Spark's and those of each
Parquet write of the optimistic rounds of ``Pipeline(ft=True)`` (session as ``xorack bench``:
adaptive execution off), with Spark's size estimates of each join's inputs
(``optimizedPlan().stats()``, against ``spark.sql.autoBroadcastJoinThreshold``). Each result is
checked equal to plain Spark's.

    python benchmarks/tpch_join_plans.py [--scale 0.1] [q3 q5 q10 q12]

(A look at plans, not a timing: each query runs once per variant.)
"""

from __future__ import annotations

import argparse
import re
import tempfile
from typing import Any

from pyspark.sql import readwriter

from xorack import bench, bench_tpch

#: the physical operators listed (joins, exchanges, windows)
OPERATOR = re.compile(r"(\w*Join \[.*?\], \[.*?\], \w+(, Build\w+)?|\w*Exchange \w+|Window \[)")


def _megabytes(size: Any) -> str:
    value = float(str(size))
    return f"{value / 1e6:.1f} MB" if value < 1e12 else f"{value:.2g} B"


def joins_and_exchanges(df: Any) -> list[str]:
    """The join, exchange and window operators of ``df``'s executed plan, top down, then each
    logical join's type and its inputs' estimated sizes."""
    qe = df._jdf.queryExecution()
    lines = []
    for line in qe.executedPlan().toString().splitlines():
        found = OPERATOR.search(line)
        if found:
            depth = len(line) - len(line.lstrip(" :+-|"))
            lines.append(f"{' ' * depth}{found.group(0).rstrip(' [')}")

    def walk(plan: Any) -> None:
        children = [plan.children().apply(i) for i in range(plan.children().size())]
        if plan.nodeName() == "Join":
            sizes = [f"{c.nodeName()} {_megabytes(c.stats().sizeInBytes())}" for c in children]
            lines.append(f"  estimate: {plan.joinType()} join of {' | '.join(sizes)}")
        for child in children:
            walk(child)

    walk(qe.optimizedPlan())
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries", nargs="*", default=["q3", "q5", "q10", "q12"])
    parser.add_argument("--scale", type=float, default=0.1)
    args = parser.parse_args()
    spark = bench.get_spark()
    data = bench_tpch.tpch_data(args.scale)
    print("autoBroadcastJoinThreshold:", spark.conf.get("spark.sql.autoBroadcastJoinThreshold"))
    write = readwriter.DataFrameWriter.parquet
    label = [""]

    def listed(self: Any, path: str, *a: Any, **k: Any) -> Any:
        print(f"\n{label[0]}: write of {path.rstrip('/').split('/')[-2:]}")
        print("\n".join(joins_and_exchanges(self._df)))
        return write(self, path, *a, **k)

    work = tempfile.mkdtemp(prefix="xorack-plans-")
    readwriter.DataFrameWriter.parquet = listed  # type: ignore[method-assign]
    try:
        for q in args.queries:
            label[0] = f"{q} plain"
            bench_tpch.run_plain(spark, data, q, f"{work}/{q}-plain")
            label[0] = f"{q} FT on"
            bench_tpch.run_pipeline(spark, data, q, f"{work}/{q}-ft", ft=True)
            readwriter.DataFrameWriter.parquet = write  # type: ignore[method-assign]
            diff = bench_tpch.compare(spark, q, f"{work}/{q}-plain", f"{work}/{q}-ft")
            readwriter.DataFrameWriter.parquet = listed  # type: ignore[method-assign]
            print(f"\n{q}: {'equal to plain Spark' if diff is None else diff}")
    finally:
        readwriter.DataFrameWriter.parquet = write  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
