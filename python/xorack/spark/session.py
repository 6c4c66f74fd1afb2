"""A local Spark session set up the way xorack needs it."""

from __future__ import annotations

import os
import sys
from typing import Any


def get_or_create_session(
    master: str = "local[2]",
    app_name: str = "xorack",
    shuffle_partitions: int = 4,
    extra_conf: dict[str, Any] | None = None,
):
    """A SparkSession whose Python workers run this interpreter (PYSPARK_PYTHON), UI off.

    >>> spark = get_or_create_session()  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
